#pragma once
/// The event loop: runs tasks, timers, posted callbacks and I/O completions on
/// one thread. See docs/architecture.md for the phases of a tick.

#include <spindle/backend_kind.hpp>
#include <spindle/detail/engine.hpp>
#include <spindle/detail/post_node.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/join_handle.hpp>
#include <spindle/metrics.hpp>
#include <spindle/task.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace spindle {

using clock = std::chrono::steady_clock;

struct loop_options {
    backend_kind backend = backend_kind::automatic;
    signal_mechanism signals = signal_mechanism::automatic;
    /// While tasks stay ready, the loop still looks at the OS at least this
    /// often: it sends the requests tasks made (io_uring queues them until
    /// then), collects completions, dispatches watchers and fires due timers.
    /// The clock is read for it every 16 resumes, or after each resume once
    /// resumes run long, so the delay is this plus about one resume. Shorter:
    /// I/O waits less behind busy tasks; longer: fewer zero-timeout polls (a
    /// syscall each on epoll; on io_uring only when a request is queued). The
    /// default keeps that cost near 1% of a busy loop, and a 50-client chat
    /// fan-out's queues a fifth full where 1 ms let them overflow (docs/runtime.md).
    std::chrono::nanoseconds poll_interval = std::chrono::microseconds(100);
    /// A task's budget of operations that complete without waiting (a read
    /// that finds data, a channel value already there, a free mutex, a line
    /// already buffered): each spends one unit; with none left, the next such
    /// operation sends the task to the back of the ready queue, its result
    /// kept, and the budget is refilled when the task next runs. So a task
    /// whose operations are always ready cannot hold the loop. 0: no budget.
    unsigned task_budget = 128;
    /// A task's turn also ends once it has run this long, at its next
    /// operation that completes without waiting, as when its budget is spent:
    /// a task whose every operation moves 64 KiB holds the loop for about
    /// this, not for 128 copies. The clock is read once per up to 32 such
    /// operations, fewer when they run long, never on a turn of 4 or fewer;
    /// the turn counts from the loop's last clock reading before the resume
    /// (at most 16 short resumes earlier). Zero (the default, for now): the
    /// budget alone. Under a 64 KiB flood, 500 us cut the ping's median
    /// delay 2.7x and the bytes echoed by a fifth (docs/benchmarks.md).
    std::chrono::nanoseconds task_quantum = std::chrono::nanoseconds::zero();
    /// Idle waiters resumed per tick at most.
    unsigned idle_batch = 16;
    /// The loop wakes for timers on a grid of this step: timers due within one
    /// step fire together, at most one step late, never early. Fewer wake-ups
    /// when timers are dense; zero wakes for each deadline exactly. The default
    /// matches the timer slack Linux already applies to a normal thread's sleeps.
    std::chrono::nanoseconds timer_slack = std::chrono::microseconds(50);
    /// A timer armed more than 1024 grid steps ahead (51 ms by default) may
    /// also be late by up to 1/1024 of its delay (a 1 s sleep by up to 1 ms;
    /// never early), as Linux allows for poll and select timeouts: a crowd of
    /// long timers then shares wake-ups. false: only the grid's slack.
    bool scaled_timer_slack = true;
    /// Virtual time, for tests: the loop's clock stands still while any task
    /// can run, and jumps straight to the next deadline when every task waits
    /// on time. I/O still works: the OS is polled without blocking first, and
    /// only when nothing is ready does time jump; with no deadline at all the
    /// loop waits for I/O for real. Read the time with loop::now().
    bool virtual_time = false;
    /// The loop is built, run and destroyed on one thread, and other threads
    /// only post to it, stop it or release holds (as every loop of a
    /// loop_group). io_uring then ties its ring to that thread (single
    /// issuer, task work run only when the loop enters the kernel) and
    /// registers the ring's descriptor, where the kernel allows it
    /// (docs/multicore.md). Running such a loop on another thread throws
    /// std::logic_error, and native_handle() is not for a host's poller.
    bool single_thread = false;
    /// A resume that runs longer than this (a task that computes or blocks
    /// without suspending, holding up every other task of the loop) is logged
    /// once as a warning through the `spindle` logger, naming the task, and
    /// counted in loop_metrics::stalls. Zero: not watched. Watching costs no
    /// clock read per resume: a monitor thread looks at the loops' progress
    /// (docs/observability.md).
    std::chrono::nanoseconds stall_threshold = std::chrono::milliseconds(25);
    /// Times every resume (two clock reads each) into a histogram per task,
    /// shown by tasks() and dump_tasks(), and one per loop in metrics():
    /// for finding slow tasks. Off by default.
    bool task_run_histogram = false;
    /// Borrowed reads (recv_borrowed, a stream's read_borrowed) receive into
    /// buffers of this size, lent by the loop only once data has arrived;
    /// the loop maps them 16 at a time as they are needed and keeps them.
    std::size_t read_buffer_size = 16 * 1024;
    /// One look at the OS lends at most this many of them; reads beyond wait
    /// for the next, which serves them first. So a burst of readable
    /// connections (thousands after a quiet spell) takes a batch of buffers,
    /// not one each before any task could give one back. io_uring hands the
    /// kernel a ring of this many (rounded down to a power of two, at most
    /// 32768), from which it picks when data arrives; with all of them lent,
    /// a borrowed read waits for readiness and then takes one of the loop's
    /// other buffers: slower, never failing for want of one.
    std::uint32_t read_buffer_batch = 256;
    /// A loop about to sleep while an offload job it submitted less than
    /// this long ago has not answered looks for the answer until then,
    /// keeping its CPU (a computing thread given it would hold it for a
    /// whole time slice): a short job's answer then costs no wake-up (the
    /// pool's write to the loop's wake descriptor, the loop's return from
    /// the kernel). Counted from each job's submission, so a long job costs
    /// it once; spins that keep running out in vain stop for a while. Zero:
    /// sleep at once (docs/offload.md).
    std::chrono::nanoseconds answer_spin = std::chrono::microseconds(50);
};

/// One task, as the dump of a loop's tasks shows it.
struct task_info {
    std::uint64_t id = 0;
    std::string name;
    enum class state_kind { ready, parked, running } state = state_kind::ready;
    /// What a parked task waits on: "sleep, due in 12 ms", "recv on fd 7", ...
    std::string waiting_on;
    /// How long it has been parked (as of the loop's last look at the clock).
    std::chrono::nanoseconds parked_for{0};
    /// The size of the task's outermost coroutine frame, in bytes.
    std::size_t frame_size = 0;
    /// With loop_options::task_run_histogram: how long its resumes took.
    bool has_run_times = false;
    run_time_histogram run_times;
};

namespace detail {
class loop_core;
void register_task(loop_core& core, task_header& t, std::coroutine_handle<> frame);
void run_until_done(loop_core& core, const task_header& t);
void post_to(loop_core& core, post_node* node) noexcept;
void log_post_failure() noexcept;
}  // namespace detail

class loop {
public:
    /// Throws std::system_error when the backend cannot start here, and
    /// std::invalid_argument when SPINDLE_BACKEND names no backend.
    explicit loop(loop_options options = {});
    ~loop();
    loop(const loop&) = delete;
    loop& operator=(const loop&) = delete;

    /// The loop running a tick on this thread.
    static loop& current();
    static loop* current_or_null() noexcept;

    /// Starts `t` in a later tick. Drop the handle to detach it.
    template <class T>
    join_handle<T> spawn(task<T> t, std::string name = {});

    /// Runs the loop until `t` finishes; returns its value or rethrows.
    template <class T>
    T block_on(task<T> t);

    /// Runs until no task, timer, watcher, hold or pending post remains, or stop().
    void run();
    /// Makes run() return after the current tick, and block_on() throw
    /// std::system_error(operation_canceled) if its task has not finished. Any thread.
    void stop() noexcept;

    /// One tick, waiting at most `max_wait` for I/O or time (negative: no limit).
    /// Returns has_work().
    bool run_once(std::chrono::nanoseconds max_wait);
    /// One tick that never blocks: for a host's frame loop.
    bool poll() { return run_once(std::chrono::nanoseconds::zero()); }

    /// Runs `fn()` on the loop's thread in the next tick, before timers. Any thread;
    /// wakes the loop. Allocates one node per call.
    template <class F>
    void post(F&& fn);

    /// A descriptor for a host's own poller: readable when I/O completes or
    /// another thread posts. A due timer does NOT make it readable: a host
    /// sleeps on it for at most time_to_next_deadline(), then calls run_once
    /// (or poll()); that is the whole embedding contract. -1 on a backend
    /// without such a descriptor (kqueue emulated by libkqueue).
    int native_handle() const noexcept;
    /// Zero when work is ready, the time to the nearest deadline, or nullopt
    /// when only I/O or a post (or nothing) can wake the loop: a host's timeout
    /// for sleeping on native_handle(). Round it up, never down.
    std::optional<std::chrono::nanoseconds> time_to_next_deadline();

    bool has_work() const noexcept;
    /// A snapshot of the loop's counters and gauges. Any thread, any time;
    /// resets ready_depth_max.
    [[nodiscard]] loop_metrics metrics() const noexcept;
    std::size_t task_count() const noexcept;
    /// Timers armed now (sleeps, deadlines, periodic timers).
    std::size_t timer_count() const noexcept;
    backend_kind backend() const noexcept;
    const loop_options& options() const noexcept;

    /// The time as the running loop sees it: the steady clock, or the loop's
    /// virtual clock under loop_options::virtual_time. Outside any loop, the
    /// steady clock.
    static clock::time_point now() noexcept;

    /// Every live task, parked ones with what they wait on and for how long:
    /// the way to see why a service hangs. Costs nothing until called.
    [[nodiscard]] std::vector<task_info> tasks() const;
    /// The same as text, a count line then one task per line, for the caller
    /// to print or log: it writes nothing itself.
    [[nodiscard]] std::string dump_tasks() const;

    /// Starts catching `signo` now: deliveries before the first wait are kept
    /// (see wait_signal). Signals are caught until the loop is destroyed.
    void catch_signal(int signo);

    /// Completes every pending operation on `fd` with operation_canceled (on
    /// every backend, even one the kernel had finished: an accepted connection
    /// is then closed), then closes it. Use it (or unique_fd) for descriptors
    /// the loop has seen.
    void close_fd(int fd) noexcept;

    /// Keeps run() going while held, for loops fed by other threads.
    class hold {
    public:
        explicit hold(loop& l) noexcept;
        hold(hold&& other) noexcept : m_loop(std::exchange(other.m_loop, nullptr)) {}
        hold(const hold&) = delete;
        hold& operator=(const hold&) = delete;
        hold& operator=(hold&&) = delete;
        ~hold();

    private:
        loop* m_loop;
    };

private:
    friend class detail::loop_core;
    friend detail::loop_core& detail::core_of(loop& l) noexcept;
    std::unique_ptr<detail::loop_core> m_core;
};

// ---------------------------------------------------------------------------

template <class T>
join_handle<T> loop::spawn(task<T> t, std::string name) {
    if (!t.valid()) throw std::invalid_argument("spindle: spawn of an empty task");
    auto* header = new detail::spawned<T>();
    if (!name.empty()) {
        try {
            detail::name_task(*header, name);
        } catch (...) {
            delete header;
            throw;
        }
    }
    header->m_ops = &detail::spawned_ops<T>;
    header->m_refs = 2;  // the loop, while it runs, and the join handle
    auto frame = t.release();
    header->m_frame_size = static_cast<std::uint32_t>(std::min<std::size_t>(frame.promise().frame_size(), 0x7fffffff));
    frame.promise().set_root(header);
    detail::register_task(*m_core, *header, frame);
    return join_handle<T>(header);
}

template <class T>
T loop::block_on(task<T> t) {
    join_handle<T> handle = spawn(std::move(t), "block_on");
    detail::run_until_done(*m_core, handle.header());
    if (!handle.done()) throw std::system_error(std::make_error_code(std::errc::operation_canceled), "spindle: block_on stopped");
    // The task is done, so awaiting its handle completes without suspending.
    auto awaiter = handle.operator co_await();
    return awaiter.await_resume();
}

namespace detail {
template <class F>
struct post_item final : post_node {
    F m_fn;
    explicit post_item(F&& fn) : m_fn(std::move(fn)) { m_call = &call; }
    static void call(post_node* node, bool run) noexcept;
};
template <class F>
void post_item<F>::call(post_node* node, bool run) noexcept {
    auto* self = static_cast<post_item*>(node);
    if (run) {
        try {
            self->m_fn();
        } catch (...) {
            log_post_failure();
        }
    }
    delete self;
}
}  // namespace detail

template <class F>
void loop::post(F&& fn) {
    detail::post_to(*m_core, new detail::post_item<std::decay_t<F>>(std::decay_t<F>(std::forward<F>(fn))));
}

}  // namespace spindle
