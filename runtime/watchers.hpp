#pragma once
// The loop's watcher service: watchers that are active (they keep the loop
// running) and watchers whose readiness came in the last poll, called back
// after it, once every event was collected.

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/watcher.hpp>

#include <cstddef>

namespace spindle::detail {

class loop_core;

class watcher_registry {
public:
    explicit watcher_registry(loop_core& core) noexcept : m_core(core) {}
    watcher_registry(const watcher_registry&) = delete;
    watcher_registry& operator=(const watcher_registry&) = delete;

    /// Starts `w`; a one-shot watch satisfied at once still calls back from the loop.
    void start(watcher& w);
    void stop(watcher& w) noexcept;
    /// Its operation completed (from the backend, during a poll).
    void fired(watcher& w) noexcept;
    /// Runs the callbacks of the watchers that fired.
    void dispatch();
    /// The loop is going away: watchers that outlive it become inert.
    void detach_all() noexcept;

    bool has_work() const noexcept { return m_active > 0 || !m_fired.empty(); }
    bool has_fired() const noexcept { return !m_fired.empty(); }

private:
    loop_core& m_core;
    intrusive_list<watcher> m_watchers;
    intrusive_list<watcher, ready_tag> m_fired;
    std::size_t m_active = 0;
};

}  // namespace spindle::detail
