#pragma once
/// Readiness watchers with callbacks, as in classic event loops. A persistent
/// watcher calls back on every readiness edge until stopped (drain the
/// descriptor in the callback: the epoll backend is edge-triggered); a one-shot
/// watcher calls back once. Tasks use wait_readable/wait_writable instead.
///
/// Callbacks run after the loop's poll, once all its events were collected, so
/// a callback may stop or destroy any watcher, itself included.

#include <spindle/detail/engine.hpp>
#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/io_op.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/readiness.hpp>

#include <cstdint>

namespace spindle {

namespace detail {
class watcher_registry;
}

class watcher : detail::list_hook<>, detail::list_hook<detail::ready_tag>, detail::io_op {
public:
    using callback = void (*)(void* context);
    enum class mode { persistent, one_shot };

    /// Starts watching `fd` for `events` (spindle::readable | spindle::writable).
    /// Throws std::system_error when the backend refuses the descriptor (epoll
    /// and a regular file: EPERM).
    watcher(loop& owner, int fd, std::uint32_t events, callback fn, void* context, mode m = mode::persistent);
    watcher(const watcher&) = delete;
    watcher& operator=(const watcher&) = delete;
    /// Must be destroyed before its loop (the loop's destruction stops it).
    ~watcher() { stop(); }

    /// Stops watching; safe inside any callback, this watcher's own included.
    void stop() noexcept;
    bool active() const noexcept;

private:
    friend class detail::watcher_registry;
    template <class, class>
    friend class detail::intrusive_list;
    static void on_complete(detail::io_op& op) noexcept;
    detail::list_hook<>& watch_hook() noexcept { return *this; }
    detail::list_hook<detail::ready_tag>& fired_hook() noexcept { return *this; }
    const detail::list_hook<detail::ready_tag>& fired_hook() const noexcept { return *this; }

    detail::loop_core* m_loop = nullptr;
    callback m_callback;
    void* m_context;
};

}  // namespace spindle
