#pragma once
// The engine behind spindle::loop: the tick, the ready queue, timers, posts and
// the backend, with the loop's services (signals, watchers) beside it. Private
// to the runtime: applications see loop.hpp, awaiters detail/engine.hpp.

#include "loop_metrics.hpp"
#include "relaxed.hpp"
#include "timer_queue.hpp"
#include "watchers.hpp"

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/post_queue.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/loop.hpp>
#include <spindle/reactor/backend.hpp>
#include <spindle/sleep.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <unordered_map>
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
    /// A task's budget at the start of each turn (loop_options::task_budget).
    std::uint32_t full_budget() const noexcept { return m_full_budget; }
    std::size_t task_count() const noexcept { return m_task_count; }
    std::uint64_t tasks_spawned() const noexcept { return m_next_task_id.load() - 1; }
    std::uint64_t posts_run() const noexcept { return m_posts_run.load(); }
    const intrusive_list<task_header, all_tag>& all_tasks() const noexcept { return m_all; }
    /// With loop_options::task_run_histogram: a task's resume durations, or null.
    const run_time_histogram* run_times_of(const task_header& t) const noexcept {
        auto it = m_run_times.find(&t);
        return it == m_run_times.end() ? nullptr : &it->second;
    }
    void add_idle_waiter(idle_wait& w) noexcept { m_idle.push_back(w); }

    // --- running
    void run();
    void run_until_done(const task_header& t);
    bool run_once(std::chrono::nanoseconds max_wait);
    void stop() noexcept;
    bool has_work() const noexcept;
    std::optional<std::chrono::nanoseconds> time_to_next_deadline();

    // --- posts and holds (any thread)
    void post(post_node* node) noexcept;
    /// Wakes the loop if it sleeps in the OS, once until it wakes (any thread,
    /// after a seq_cst store of what it should find: the group's doorbell).
    void wake_if_sleeping() noexcept;

    // --- a loop_group's loop: its cross-loop mail (loop thread, before running)
    void attach_member(group_member* member) noexcept { m_member = member; }
    group_member* member() const noexcept { return m_member; }
    void hold_acquire() noexcept;
    void hold_release() noexcept;

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
    /// Which resume is running, for the stall monitor: the pair changes with
    /// every resume (the countdown falls within an epoch, and each clock
    /// check starts a new epoch), and `running` is false between resumes.
    struct resume_probe {
        bool running = false;
        std::int64_t epoch = 0;
        unsigned countdown = 0;
        bool operator==(const resume_probe&) const = default;
    };
    resume_probe probe() const noexcept {
        return {m_running.load() != nullptr, m_last_check_real_ns.load(), m_resumes_until_check.load()};
    }
    /// The monitor saw `probe`'s resume run since `since_ns` (any thread):
    /// leaves its finding, then sets the countdown to zero, which sends the
    /// loop to its rare path when that resume returns.
    void flag_stall(const resume_probe& probe, std::int64_t since_ns) noexcept;

private:
    void tick(std::chrono::nanoseconds max_wait);
    void check_thread() const;
    bool spin_for_mail(std::chrono::nanoseconds timeout) noexcept;
    void run_posts();
    int poll_os(std::chrono::nanoseconds timeout);
    void check_poll_interval();
    void plan_next_check(std::int64_t left_ns) noexcept;
    void advance_virtual_time(std::chrono::nanoseconds max_wait) noexcept;
    void wake_idle_waiters() noexcept;
    void destroy_frame(task_header& t) noexcept;
    template <bool Timed>
    [[gnu::always_inline]] void resume_batch() noexcept;
    void record_run_time(run_time_histogram* own, std::int64_t ran) noexcept;
    void on_stall_flag(task_header* t, unsigned countdown, bool finishing = false) noexcept;
    void report_stall(const task_header* t, bool finished, std::uint64_t id, std::int64_t since_ns) noexcept;
    void enter_loop() noexcept;
    void leave_loop() noexcept;
    std::chrono::nanoseconds poll_timeout(std::chrono::nanoseconds max_wait);

    loop& m_owner;
    loop_options m_options;
    std::unique_ptr<reactor::backend> m_backend;
    timer_queue m_timers;
    intrusive_list<task_header, ready_tag> m_ready;
    intrusive_list<task_header, ready_tag> m_batch;
    intrusive_list<task_header, all_tag> m_all;
    relaxed<task_header*> m_running{nullptr};  // read by the stall monitor
    std::uint32_t m_full_budget = 0;
    const task_header* m_awaited = nullptr;  // block_on's task
    relaxed<std::size_t> m_task_count{0};
    relaxed<std::uint64_t> m_next_task_id{1};
    std::int64_t m_recent_ns = 0;   // the clock at the last poll
    std::int64_t m_virtual_ns = 0;  // virtual_time: the loop's clock
    // The poll interval, on the real clock even under virtual time.
    std::int64_t m_poll_interval_ns = 0;
    std::int64_t m_last_poll_real_ns = 0;   // when the OS was last looked at
    relaxed<std::int64_t> m_last_check_real_ns{0};  // when the clock was last read for it
    std::int64_t m_resume_ns = 0;           // a resume's duration, smoothed
    relaxed<unsigned> m_resumes_until_check{1};
    unsigned m_check_span = 1;              // resumes between the last two clock reads
    bool m_polled_in_batch = false;
    // loop_options::single_thread: the only thread that may run the loop.
    std::thread::id m_thread = std::this_thread::get_id();
    bool m_closing = false;

    // Posts: pushed by any thread.
    post_queue m_posts;
    std::atomic<std::uint64_t> m_posted{0};
    relaxed<std::uint64_t> m_posts_run{0};
    std::atomic<bool> m_sleeping{true};  // nobody looks at posts until the first tick
    std::atomic<bool> m_wake_sent{false};
    std::atomic<bool> m_stop{false};
    std::atomic<std::size_t> m_holds{0};
    // Threads inside post() or ~hold(); written by them only, so on a line of its own.
    alignas(64) std::atomic<std::size_t> m_in_flight{0};

    watcher_registry m_watchers;
    intrusive_list<idle_wait> m_idle;
    std::unique_ptr<signal_service> m_signals;  // made on the first wait for a signal
    group_member* m_member = nullptr;           // in a loop_group: its mail

    loop_counters m_counters;
    std::int64_t m_awake_since_ns = 0;  // busy time starts here
    // The stall monitor's finding: which resume, since when; then the flag.
    std::atomic<bool> m_stall_flag{false};
    std::atomic<std::int64_t> m_stall_epoch{0};
    std::atomic<unsigned> m_stall_countdown{0};
    std::atomic<std::int64_t> m_stall_since_ns{0};
    // The task that last finished inside its own resume (which then clears
    // m_running): after that resume its header may be gone.
    std::uint64_t m_finished_id = 0;
    bool m_watched = false;  // registered with the stall monitor
    // loop_options::task_run_histogram: each live task's resume durations,
    // kept beside the tasks so a task header costs no more without it.
    std::unordered_map<const task_header*, run_time_histogram> m_run_times;
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
