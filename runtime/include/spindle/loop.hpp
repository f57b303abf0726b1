#pragma once
/// The event loop: runs tasks, timers, posted callbacks and I/O completions on
/// one thread. See docs/architecture.md for the phases of a tick.

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/post_queue.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/detail/timer_queue.hpp>
#include <spindle/join_handle.hpp>
#include <spindle/reactor/backend.hpp>
#include <spindle/reactor/signal_source.hpp>
#include <spindle/task.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <system_error>
#include <thread>
#include <type_traits>

namespace spindle {

using clock = std::chrono::steady_clock;
using reactor::backend_kind;
using reactor::signal_mechanism;

struct loop_options {
    backend_kind backend = backend_kind::automatic;
    signal_mechanism signals = signal_mechanism::automatic;
    /// While tasks are ready, the OS is polled (and timers checked) after at most
    /// this many ticks, so a yield costs no syscall yet I/O cannot starve.
    /// 61, like Tokio's event interval: prime, so it does not beat with periodic work.
    unsigned event_interval = 61;
    /// ... or after this many task resumptions, whichever comes first.
    unsigned resume_budget = 512;
    /// Idle waiters resumed per tick at most.
    unsigned idle_batch = 16;
    /// The loop wakes for timers on a grid of this step: timers due within one
    /// step fire together, at most one step late, never early. Fewer wake-ups
    /// when timers are dense; zero wakes for each deadline exactly. The default
    /// matches the timer slack Linux already applies to a normal thread's sleeps.
    std::chrono::nanoseconds timer_slack = std::chrono::microseconds(50);
    /// Virtual time, for tests: the loop's clock stands still while any task
    /// can run, and jumps straight to the next deadline when every task waits
    /// on time. I/O still works: the OS is polled without blocking first, and
    /// only when nothing is ready does time jump; with no deadline at all the
    /// loop waits for I/O for real. Read the time with loop::now().
    bool virtual_time = false;
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
};

namespace detail {
struct watcher_base;
struct signal_waiter;
struct idle_waiter;
}  // namespace detail

class loop {
public:
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

    /// Readable when the loop has something to do: fold it into a host's poller.
    /// -1 on a backend without such a descriptor (kqueue emulated by libkqueue).
    int native_handle() const noexcept { return m_backend->native_handle(); }
    /// Zero when work is ready, the time to the nearest deadline, or nullopt
    /// when only I/O (or nothing) can wake the loop.
    std::optional<std::chrono::nanoseconds> time_to_next_deadline();

    bool has_work() const noexcept;
    std::size_t task_count() const noexcept { return m_task_count; }
    backend_kind backend() const noexcept { return m_backend->kind(); }
    const loop_options& options() const noexcept { return m_options; }

    /// The time as the running loop sees it: the steady clock, or the loop's
    /// virtual clock under loop_options::virtual_time. Outside any loop, the
    /// steady clock.
    static clock::time_point now() noexcept { return clock::time_point(std::chrono::nanoseconds(now_ns())); }

    /// Every live task, parked ones with what they wait on and for how long:
    /// the way to see why a service hangs. Costs nothing until called.
    std::vector<task_info> tasks() const;
    /// The same as text, one task per line.
    std::string dump_tasks() const;

    /// Completes every pending operation on `fd` with operation_canceled, then
    /// closes it. Use it (or unique_fd) for descriptors the loop has seen.
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

    // For awaitables and watchers; not needed by applications.
    reactor::backend& io() noexcept { return *m_backend; }
    detail::timer_queue& timers() noexcept { return m_timers; }
    detail::task_header* running_task() const noexcept { return m_running; }
    void schedule(detail::task_header& t) noexcept;
    /// The current loop's time in ns (virtual under virtual_time), else the steady clock's.
    static std::int64_t now_ns() noexcept;
    /// This loop's time as of its last look at the clock.
    std::int64_t recent_ns() const noexcept { return m_recent_ns; }
    void cancel_task(detail::task_header& t) noexcept;
    void add_signal_waiter(detail::signal_waiter& w);
    void add_idle_waiter(detail::idle_waiter& w) noexcept;
    void add_watcher(detail::watcher_base& w) noexcept;
    void remove_watcher(detail::watcher_base& w) noexcept;
    /// Starts catching `signo` now: deliveries before the first wait are kept
    /// (see wait_signal). Signals are caught until the loop is destroyed.
    void catch_signal(int signo);
    bool take_pending_signal(int signo) noexcept;
    void abort_task(detail::task_header& t);
    void task_finished(detail::task_header& t) noexcept;

private:
    void tick(std::chrono::nanoseconds max_wait);
    void run_until_done(const detail::task_header& t);
    void run_posts();
    int poll_os(std::chrono::nanoseconds timeout);
    void advance_virtual_time(std::chrono::nanoseconds max_wait) noexcept;
    void dispatch_watchers();
    void wake_idle_waiters() noexcept;
    void register_task(detail::task_header& t, std::coroutine_handle<> frame);
    void destroy_frame(detail::task_header& t) noexcept;
    static void on_signal_ready(reactor::operation& op) noexcept;
    static void on_signal(void* self, int signo);
    struct signal_slot;
    signal_slot& slot_of(int signo);
    std::chrono::nanoseconds poll_timeout(std::chrono::nanoseconds max_wait);

    loop_options m_options;
    std::unique_ptr<reactor::backend> m_backend;
    detail::timer_queue m_timers;
    detail::intrusive_list<detail::task_header, detail::ready_tag> m_ready;
    detail::intrusive_list<detail::task_header, detail::ready_tag> m_batch;
    detail::intrusive_list<detail::task_header, detail::all_tag> m_all;
    detail::task_header* m_running = nullptr;
    const detail::task_header* m_awaited = nullptr;  // block_on's task
    std::size_t m_task_count = 0;
    std::uint64_t m_next_task_id = 1;
    std::int64_t m_recent_ns = 0;   // the clock at the last poll
    std::int64_t m_virtual_ns = 0;  // virtual_time: the loop's clock
    unsigned m_ticks_since_poll = 0;
    unsigned m_resumes_since_poll = 0;
    bool m_closing = false;

    // Posts: pushed by any thread.
    detail::post_queue m_posts;
    std::atomic<std::uint64_t> m_posted{0};
    std::uint64_t m_posts_run = 0;
    std::atomic<bool> m_sleeping{true};  // nobody looks at posts until the first tick
    std::atomic<bool> m_wake_sent{false};
    std::atomic<bool> m_stop{false};
    std::atomic<std::size_t> m_holds{0};
    // Threads inside post() or ~hold(); written by them only, so on a line of its own.
    alignas(64) std::atomic<std::size_t> m_in_flight{0};

    // Watchers whose operation completed in the last poll, dispatched after it.
    detail::intrusive_list<detail::watcher_base> m_watchers;
    detail::intrusive_list<detail::watcher_base, detail::ready_tag> m_fired;
    std::size_t m_active_watchers = 0;

    detail::intrusive_list<detail::idle_waiter> m_idle;

    // Signals: one source per loop, created on the first wait.
    std::unique_ptr<reactor::signal_source> m_signal_source;
    std::unique_ptr<std::array<signal_slot, 65>> m_signal_slots;
    struct signal_op : reactor::operation {
        loop* m_owner = nullptr;
    } m_signal_op;
    friend struct detail::watcher_base;
};

// ---------------------------------------------------------------------------

template <class T>
join_handle<T> loop::spawn(task<T> t, std::string name) {
    if (!t.valid()) throw std::invalid_argument("spindle: spawn of an empty task");
    auto* header = new detail::spawned<T>();
    header->m_name = std::move(name);
    header->m_finish = &detail::finish_spawned<T>;
    header->m_delete = &detail::delete_spawned<T>;
    header->m_refs = 2;  // the loop, while it runs, and the join handle
    auto frame = t.release();
    frame.promise().m_root = header;
    register_task(*header, frame);
    return join_handle<T>(header);
}

template <class T>
T loop::block_on(task<T> t) {
    join_handle<T> handle = spawn(std::move(t), "block_on");
    run_until_done(handle.header());
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
void log_post_failure() noexcept;
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
    auto* node = new detail::post_item<std::decay_t<F>>(std::decay_t<F>(std::forward<F>(fn)));
    // Once the node is in, the loop may run it, finish and be destroyed while
    // this thread still has to look at the flags: ~loop waits for m_in_flight.
    m_in_flight.fetch_add(1, std::memory_order_acq_rel);
    m_posts.push(node);
    m_posted.fetch_add(1, std::memory_order_seq_cst);
    if (m_sleeping.load(std::memory_order_seq_cst) && !m_wake_sent.exchange(true, std::memory_order_acq_rel))
        m_backend->wake();
    m_in_flight.fetch_sub(1, std::memory_order_release);
}

}  // namespace spindle
