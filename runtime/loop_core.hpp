#pragma once
// The engine behind spindle::loop: the tick, the ready queue and the lives of
// tasks, over the backend, with the loop's services beside it, each a type of
// its own: timers, the post inbox, the poll pacing, the stall probe, watchers,
// signals and a loop group's mail. Private to the runtime: applications see
// loop.hpp, awaiters detail/engine.hpp.

#include "loop_metrics.hpp"
#include "poll_pacing.hpp"
#include "post_inbox.hpp"
#include "relaxed.hpp"
#include "stall_probe.hpp"
#include "stop_links.hpp"
#include "task_turn.hpp"
#include "timer_queue.hpp"
#include "watchers.hpp"

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/loop.hpp>
#include <spindle/reactor/backend.hpp>
#include <spindle/sleep.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

namespace spindle::detail {

class signal_service;
class group_member;

class loop_core {
public:
    loop_core(loop& owner, loop_options options);
    ~loop_core();
    /// Destroys the frames of the tasks still parked, unrun posts, watchers,
    /// timers and signals; the backend stays until destruction. Once.
    void shutdown() noexcept;
    loop_core(const loop_core&) = delete;
    loop_core& operator=(const loop_core&) = delete;

    loop& owner() noexcept { return m_owner; }
    reactor::backend& backend() noexcept { return *m_backend; }
    const reactor::backend& backend() const noexcept { return *m_backend; }
    timer_queue& timers() noexcept { return m_timers; }
    const timer_queue& timers() const noexcept { return m_timers; }
    const loop_options& options() const noexcept { return m_options; }
    watcher_registry& watchers() noexcept { return m_watchers; }
    signal_service& signals();
    stop_links& stop_links_of() noexcept { return m_stop_links; }

    // --- tasks
    void register_task(task_header& t, std::coroutine_handle<> frame);
    void schedule(task_header& t) noexcept;
    void task_finished(task_header& t) noexcept;
    void abort_task(task_header& t);
    void cancel_task(task_header& t) noexcept;
    task_header* running_task() const noexcept { return m_running; }
    task_header* exchange_running(task_header* t) noexcept {
        task_header* previous = m_running;
        m_running = t;
        return previous;
    }
    /// The running task's turn: its budget and quantum (loop_options::task_budget, task_quantum).
    task_turn& turn() noexcept { return m_turn; }
    std::size_t task_count() const noexcept { return m_task_count; }
    std::uint64_t tasks_spawned() const noexcept { return m_next_task_id.load() - 1; }
    std::uint64_t posts_run() const noexcept { return m_inbox.posts_run(); }
    const intrusive_list<task_header, all_tag>& all_tasks() const noexcept { return m_all; }
    /// With loop_options::task_run_histogram: a task's resume durations, or null.
    const run_time_histogram* run_times_of(const task_header& t) const noexcept { return m_run_times.find(t); }
    void add_idle_waiter(idle_wait& w) noexcept { m_idle.push_back(w); }

    // --- running
    void run();
    void run_until_done(const task_header& t);
    bool run_once(std::chrono::nanoseconds max_wait);
    void stop() noexcept;
    bool has_work() const noexcept;
    std::optional<std::chrono::nanoseconds> time_to_next_deadline();

    // --- posts and holds (any thread)
    void post(post_node* node) noexcept { m_inbox.push(node); }
    post_inbox& inbox() noexcept { return m_inbox; }
    /// Wakes the loop if it sleeps in the OS, once until it wakes (any thread,
    /// after a seq_cst store of what it should find: the group's doorbell).
    void wake_if_sleeping() noexcept { m_inbox.wake_if_sleeping(); }

    // --- a loop_group's loop: its cross-loop mail (loop thread, before running)
    void attach_member(group_member* member) noexcept { m_member = member; }
    group_member* member() const noexcept { return m_member; }
    void hold_acquire() noexcept { m_inbox.hold_acquire(); }
    void hold_release() noexcept { m_inbox.hold_release(); }

    // --- time
    std::int64_t recent_ns() const noexcept { return m_recent_ns; }
    bool virtual_time() const noexcept { return m_options.virtual_time; }
    std::int64_t virtual_ns() const noexcept { return m_virtual_ns; }
    /// This loop's clock now: virtual under virtual time, else the steady clock.
    std::int64_t clock_ns() const noexcept;

    void close_fd(int fd) noexcept;

    // --- metrics (runtime/metrics.cpp) and the stall monitor (stall_monitor.cpp)
    loop_counters& counters() noexcept { return m_counters; }
    const loop_counters& counters() const noexcept { return m_counters; }
    /// Time awake not yet added to busy_ns (the loop thread only).
    std::int64_t awake_since_ns() const noexcept { return m_awake_since_ns; }
    /// Which resume is running, for the stall monitor (any thread).
    resume_probe probe() const noexcept {
        return {m_running.load() != nullptr, m_pacing.epoch(), m_pacing.countdown()};
    }
    stall_probe& stall() noexcept { return m_stall; }

private:
    void tick(std::chrono::nanoseconds max_wait);
    [[gnu::always_inline]] void resume_ready() noexcept;
    [[gnu::always_inline]] bool look_at_os(std::chrono::nanoseconds max_wait);
    void check_thread() const;
    int poll_os(std::chrono::nanoseconds timeout);
    void check_poll_interval();
    void advance_virtual_time(std::chrono::nanoseconds max_wait) noexcept;
    void wake_idle_waiters() noexcept;
    void destroy_frame(task_header& t) noexcept;
    template <bool Timed>
    [[gnu::always_inline]] void resume_batch() noexcept;
    void enter_loop() noexcept;
    void leave_loop() noexcept;
    std::chrono::nanoseconds poll_timeout(std::chrono::nanoseconds max_wait);

    loop& m_owner;
    loop_options m_options;
    std::unique_ptr<reactor::backend> m_backend;
    stop_links m_stop_links;  // outlives every frame: shutdown() destroys them first
    timer_queue m_timers;
    intrusive_list<task_header, ready_tag> m_ready;
    intrusive_list<task_header, ready_tag> m_batch;
    intrusive_list<task_header, all_tag> m_all;
    relaxed<task_header*> m_running{nullptr};  // read by the stall monitor
    task_turn m_turn;
    poll_pacing m_pacing;                    // its countdown is read after every resume
    const task_header* m_awaited = nullptr;  // block_on's task
    relaxed<std::size_t> m_task_count{0};
    relaxed<std::uint64_t> m_next_task_id{1};
    std::int64_t m_recent_ns = 0;   // the clock at the last poll
    std::int64_t m_virtual_ns = 0;  // virtual_time: the loop's clock
    // loop_options::single_thread: the only thread that may run the loop.
    std::thread::id m_thread = std::this_thread::get_id();
    bool m_closing = false;
    std::atomic<bool> m_stop{false};

    loop_counters m_counters;
    std::int64_t m_awake_since_ns = 0;  // busy time starts here
    post_inbox m_inbox;
    stall_probe m_stall;
    bool m_watched = false;  // registered with the stall monitor
    watcher_registry m_watchers;
    intrusive_list<idle_wait> m_idle;
    std::unique_ptr<signal_service> m_signals;  // made on the first wait for a signal
    group_member* m_member = nullptr;           // in a loop_group: its mail

    run_time_table m_run_times;  // loop_options::task_run_histogram
};

/// Logs the exception in flight from a callback (a post, a timer, a watcher):
/// "<what> failed: <reason>"; the loop goes on.
void log_callback_failure(const char* what) noexcept;

/// The loop running a tick on this thread, or null.
loop_core* current_core_or_null() noexcept;
/// The steady clock (ns), whatever the loop's own clock.
std::int64_t now_real_ns() noexcept;

/// Loops alive in the process (runtime/descriptors.cpp), so a descriptor that
/// outlived its loop is closed plainly instead of through a dangling loop.
void register_live_loop(const loop& l);
void unregister_live_loop(const loop& l) noexcept;

}  // namespace spindle::detail
