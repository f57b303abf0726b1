#pragma once
/// Readiness watchers with callbacks, as in classic event loops. A persistent
/// watcher calls back on every readiness edge until stopped (drain the
/// descriptor in the callback: the epoll backend is edge-triggered); a one-shot
/// watcher calls back once. Tasks use wait_readable/wait_writable instead.
///
/// Callbacks run after the loop's poll, once all its events were collected, so
/// a callback may stop or destroy any watcher, itself included.

#include <spindle/loop.hpp>
#include <spindle/reactor/operation.hpp>

#include <cstdint>

namespace spindle {

namespace detail {
struct watcher_base : list_hook<>, list_hook<ready_tag>, reactor::operation {
    loop* m_loop = nullptr;
    void (*m_callback)(void*) = nullptr;
    void* m_context = nullptr;
    static void on_complete(reactor::operation& op) noexcept;

    list_hook<>& watch_hook() noexcept { return *this; }
    list_hook<ready_tag>& fired_hook() noexcept { return *this; }
    const list_hook<ready_tag>& fired_hook() const noexcept { return *this; }
};
}  // namespace detail

class watcher : detail::watcher_base {
public:
    using callback = void (*)(void* context);
    enum class mode { persistent, one_shot };

    /// Starts watching `fd` for `events` (reactor::readable | reactor::writable).
    watcher(loop& owner, int fd, std::uint32_t events, callback fn, void* context, mode m = mode::persistent);
    watcher(const watcher&) = delete;
    watcher& operator=(const watcher&) = delete;
    /// Must be destroyed before its loop (the loop's destruction stops it).
    ~watcher() { stop(); }

    /// Stops watching; safe inside any callback, this watcher's own included.
    void stop() noexcept;
    bool active() const noexcept { return m_loop && (pending() || fired_hook().is_linked()); }
};

}  // namespace spindle
