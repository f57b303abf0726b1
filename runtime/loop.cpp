// The loop: the tick, the ready queue and the lives of tasks. The loop's
// services live in files of their own: post_inbox, poll_pacing, stall_probe
// (stall_monitor.cpp), group_member, signals, watchers, timer_queue;
// descriptors.cpp, task_dump.cpp, metrics.cpp; descriptor I/O in io.cpp.

#include "group_member.hpp"
#include "loop_core.hpp"
#include "signals.hpp"
#include "stall_monitor.hpp"

#include <spindle/log.hpp>
#include <spindle/loop.hpp>
#include <spindle/park.hpp>
#include <spindle/timer.hpp>

#include <algorithm>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace spindle {

using detail::t_current_core;

namespace {

// Makes `core` the current loop for a scope: awaitables find their loop and
// task through it. Nested scopes (a loop driven from inside another's task) restore.
class current_scope {
public:
    explicit current_scope(detail::loop_core* core) noexcept : m_previous(t_current_core) { t_current_core = core; }
    ~current_scope() { t_current_core = m_previous; }
    current_scope(const current_scope&) = delete;
    current_scope& operator=(const current_scope&) = delete;

private:
    detail::loop_core* m_previous;
};

std::int64_t steady_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count();
}

// Falling back from io_uring is reported once per process, at info level: the
// reason (seccomp, kernel.io_uring_disabled, an old kernel) is the same for
// every loop, and a program with many loops should not repeat it.
// What a single-thread ring had to do without is reported the same way.
std::unique_ptr<reactor::backend> open_backend(const loop_options& options) {
    std::string fallback_reason;
    std::string notes;
    // A borrowed read's size travels in 32 bits.
    if (options.read_buffer_size == 0 || options.read_buffer_size > (std::size_t{1} << 30))
        throw std::invalid_argument("spindle: loop_options::read_buffer_size must be between 1 byte and 1 GiB");
    reactor::backend_options backend_options;
    backend_options.single_thread = options.single_thread;
    backend_options.read_buffer_size = options.read_buffer_size;
    backend_options.read_buffer_batch = options.read_buffer_batch;
    auto backend =
        reactor::make_backend(static_cast<reactor::backend_kind>(options.backend), backend_options, fallback_reason, notes);
    if (!fallback_reason.empty()) {
        static std::once_flag reported;
        std::call_once(reported, [&] { logger()->info("{}", fallback_reason); });
    }
    if (!notes.empty()) {
        static std::once_flag reported;
        std::call_once(reported, [&] { logger()->info("{}", notes); });
    }
    return backend;
}

}  // namespace

// --- the narrow interface awaiters use (detail/engine.hpp) --------------------

namespace detail {

static_assert(static_cast<int>(reactor::backend_kind::io_uring) == static_cast<int>(backend_kind::io_uring) &&
              static_cast<int>(reactor::backend_kind::epoll) == static_cast<int>(backend_kind::epoll) &&
              static_cast<int>(reactor::backend_kind::kqueue) == static_cast<int>(backend_kind::kqueue) &&
              static_cast<int>(reactor::backend_kind::automatic) == static_cast<int>(backend_kind::automatic));

loop_core* current_core_or_null() noexcept { return t_current_core; }
std::int64_t now_real_ns() noexcept { return steady_ns(); }

task_header* current_task_or_null() noexcept { return t_current_core ? t_current_core->running_task() : nullptr; }

task_header* exchange_running_task(task_header* t) noexcept { return t_current_core->exchange_running(t); }

void no_loop_running() { throw std::logic_error("spindle: no loop is running on this thread"); }

task_header& current_task() {
    task_header* t = t_current_core ? t_current_core->running_task() : nullptr;
    if (!t) throw std::logic_error("spindle: this awaitable must be awaited inside a task run by a loop");
    return *t;
}

loop_core& core_of(const task_header& task) noexcept { return *task.m_loop; }
loop_core& core_of(loop& l) noexcept { return *l.m_core; }
loop& loop_of(loop_core& core) noexcept { return core.owner(); }
task_header* running_task(const loop_core& core) noexcept { return core.running_task(); }

void schedule(task_header& task) noexcept { task.m_loop->schedule(task); }

void refill_budget() noexcept {
    if (t_current_core && t_current_core->running_task()) t_budget = t_current_core->turn().start(steady_ns());
}

bool next_stint() noexcept {
    loop_core* core = t_current_core;
    const task_header* t = core ? core->running_task() : nullptr;
    if (!t) {
        t_budget = std::numeric_limits<std::uint32_t>::max();  // outside a task there is no budget
        return true;
    }
    if (t->m_unbudgeted) {
        t_budget = core->turn().budget();
        return true;
    }
    t_budget = core->turn().next(steady_ns());
    return t_budget != 0;
}

void arm_timer(loop_core& core, timer_node& node, std::int64_t deadline_ns) {
    core.timers().insert(node, deadline_ns, core.recent_ns());
}
void disarm_timer(loop_core& core, timer_node& node) noexcept {
    if (node.armed()) core.timers().cancel(node);
}

std::int64_t now_ns() noexcept {
    if (const loop_core* l = t_current_core; l && l->virtual_time()) return l->virtual_ns();
    return steady_ns();
}
std::int64_t recent_ns(const loop_core& core) noexcept { return core.recent_ns(); }

std::int64_t loop_core::clock_ns() const noexcept { return m_options.virtual_time ? m_virtual_ns : steady_ns(); }

void register_task(loop_core& core, task_header& t, std::coroutine_handle<> frame) { core.register_task(t, frame); }
void run_until_done(loop_core& core, const task_header& t) { core.run_until_done(t); }
void post_to(loop_core& core, post_node* node) noexcept { core.post(node); }

void task_finished(task_header& task) noexcept { task.m_loop->task_finished(task); }

void release_task(task_header& task) noexcept {
    if (--task.m_refs == 0) task.m_ops->destroy(task);
}

void abort_task(task_header& task) { task.m_loop->abort_task(task); }

void cancel_task(task_header& task) noexcept { task.m_loop->cancel_task(task); }

void log_unobserved_failure(const task_header& task) noexcept {
    try {
        std::string what = "unknown exception";
        try {
            std::rethrow_exception(task.m_error);
        } catch (const std::exception& e) {
            what = e.what();
        } catch (...) {
        }
        std::string name;
        append_task_name(task, name);
        if (name.empty())
            logger()->error("task {} failed: {}", task.m_id, what);
        else
            logger()->error("task {} '{}' failed: {}", task.m_id, name, what);
    } catch (...) {
        // Logging must never take the loop down.
    }
}

void log_callback_failure(const char* what) noexcept {
    try {
        try {
            throw;
        } catch (const std::exception& e) {
            logger()->error("{} failed: {}", what, e.what());
        } catch (...) {
            logger()->error("{} failed: unknown exception", what);
        }
    } catch (...) {
        // Logging must never take the loop down.
    }
}

void log_post_failure() noexcept { log_callback_failure("posted callback"); }
void log_timer_failure() noexcept { log_callback_failure("timer callback"); }

void idle_wait::on_park() { core().add_idle_waiter(*this); }

// --- construction and teardown ----------------------------------------------

loop_core::loop_core(loop& owner, loop_options options)
    : m_owner(owner),
      m_options(options),
      m_backend(open_backend(options)),
      m_turn(options.task_budget, options.task_quantum.count()),
      m_pacing(options.poll_interval.count(), steady_ns()),
      m_inbox(*m_backend, m_counters),
      m_stall(m_pacing, m_counters),
      m_watchers(*this),
      m_run_times(m_counters) {
    if (m_options.idle_batch == 0) m_options.idle_batch = 1;
    m_inbox.set_answer_spin(std::max<std::int64_t>(0, m_options.answer_spin.count()));
    m_timers.set_slack(m_options.timer_slack.count(), m_options.scaled_timer_slack);
    // The virtual clock starts at the real one, so deadlines computed before
    // the loop existed still make sense.
    m_recent_ns = m_virtual_ns = m_awake_since_ns = steady_ns();
    if (m_options.stall_threshold > std::chrono::nanoseconds::zero()) {
        watch_for_stalls(*this);
        m_watched = true;
    }
}

loop_core::~loop_core() {
    if (m_watched) unwatch_for_stalls(*this);
    shutdown();
}

void loop_core::shutdown() noexcept {
    if (m_closing) return;
    m_inbox.wait_for_leavers();
    m_closing = true;
    current_scope scope(this);
    // Parked tasks first: their frames' destructors withdraw timers and
    // operations and close descriptors, which needs the backend alive.
    while (task_header* t = m_all.pop_front()) {
        t->ready_hook().unlink();
        t->m_status = task_status::aborted;
        --m_task_count;
        ++m_counters.tasks_finished;
        destroy_frame(*t);
        release_task(*t);
    }
    m_ready.clear();
    m_batch.clear();
    m_idle.clear();
    m_run_times.clear();
    m_inbox.discard_unrun();
    m_watchers.detach_all();
    m_timers.clear();
    m_signals.reset();  // withdraws its operation from the backend, still alive here
}

void loop_core::destroy_frame(task_header& t) noexcept {
    auto frame = std::exchange(t.m_frame, {});
    if (frame) frame.destroy();
}

signal_service& loop_core::signals() {
    if (!m_signals) m_signals = std::make_unique<signal_service>(*this);
    return *m_signals;
}

// --- tasks -------------------------------------------------------------------

void loop_core::register_task(task_header& t, std::coroutine_handle<> frame) {
    t.m_loop = this;
    const std::uint64_t id = m_next_task_id;
    t.m_id = id;
    m_next_task_id = id + 1;
    t.m_frame = frame;
    t.m_resume = frame;
    m_all.push_back(t);
    ++m_task_count;
    m_ready.push_back(t);
}

void loop_core::schedule(task_header& t) noexcept {
    if (m_closing || t.m_status != task_status::running) return;
    if (t.ready_hook().is_linked()) return;  // already due this tick or the next
    m_ready.push_back(t);
}

void loop_core::task_finished(task_header& t) noexcept {
    // Finished inside its own resume: the tick must not touch `t` after it,
    // which it learns from m_running (the stall monitor too: no resume runs).
    if (&t == m_running.load()) {
        m_stall.note_finished(t.m_id);
        if (m_stall.flagged()) [[unlikely]]
            m_stall.take_flag(&t, m_pacing.countdown(), true);
        m_running = nullptr;
    }
    waiter* joiner = std::exchange(t.m_joiner, nullptr);  // before finish, which may store an error in its place
    t.m_ops->finish(t);  // takes the result and destroys the frame
    t.all_hook().unlink();
    --m_task_count;
    ++m_counters.tasks_finished;
    if (t.m_status == task_status::failed) [[unlikely]]
        ++m_counters.tasks_failed;
    if (m_options.task_run_histogram) [[unlikely]]
        m_run_times.erase(t);
    if (t.m_status == task_status::failed && t.m_refs == 1) log_unobserved_failure(t);
    if (joiner) joiner->complete();
    release_task(t);
}

void loop_core::abort_task(task_header& t) {
    if (t.m_status != task_status::running) return;
    // A when_any branch is part of its task: it cannot abort that task either.
    for (const task_header* r = m_running; r; r = outer_of(*r))
        if (r == &t) throw std::logic_error("spindle: a task cannot abort itself");
    t.ready_hook().unlink();
    t.all_hook().unlink();
    waiter* joiner = std::exchange(t.m_joiner, nullptr);
    t.m_status = task_status::aborted;
    --m_task_count;
    ++m_counters.tasks_finished;
    if (m_options.task_run_histogram) [[unlikely]]
        m_run_times.erase(t);
    // Keep the header alive while the frame's destructors run.
    ++t.m_refs;
    destroy_frame(t);
    if (joiner) joiner->complete();
    release_task(t);  // the loop's reference
    release_task(t);  // the one taken above
}

void loop_core::cancel_task(task_header& t) noexcept {
    if (t.m_status != task_status::running) return;
    t.m_cancel_requested = true;
    // A task parked on a wait that can be cancelled is woken now; one that is
    // ready or running meets the request at its next wait.
    (void)cancel_parked_wait(t);
}

void loop_core::check_thread() const {
    if (m_options.single_thread && std::this_thread::get_id() != m_thread) [[unlikely]]
        throw std::logic_error("spindle: a loop with loop_options::single_thread runs on the thread that built it only");
}

void loop_core::run_until_done(const task_header& t) {
    check_thread();
    current_scope scope(this);
    const task_header* outer = std::exchange(m_awaited, &t);
    enter_loop();
    try {
        while (t.m_status == task_status::running && !m_stop.load(std::memory_order_acquire))
            tick(std::chrono::nanoseconds(-1));
        m_stop.store(false, std::memory_order_relaxed);
    } catch (...) {
        m_awaited = outer;
        leave_loop();
        throw;
    }
    m_awaited = outer;
    leave_loop();
}

void loop_core::enter_loop() noexcept {
    m_awake_since_ns = steady_ns();
    if (m_watched) m_stall.note_thread();
    wake_stall_monitor_if_parked();
}

void loop_core::leave_loop() noexcept {
    // Time outside run(), block_on() and run_once() is the host's, not busy.
    m_counters.busy_ns.add(steady_ns() - m_awake_since_ns);
}

// --- running -----------------------------------------------------------------

bool loop_core::has_work() const noexcept {
    return m_task_count > 0 || !m_timers.empty() || m_watchers.has_work() || m_inbox.held() || m_inbox.due() ||
           m_inbox.queued();
}

void loop_core::run() {
    check_thread();
    current_scope scope(this);
    enter_loop();
    while (!m_stop.load(std::memory_order_acquire) && has_work()) tick(std::chrono::nanoseconds(-1));
    m_stop.store(false, std::memory_order_relaxed);
    leave_loop();
}

void loop_core::stop() noexcept {
    m_stop.store(true, std::memory_order_release);
    m_counters.remote_wakeups.fetch_add(1, std::memory_order_relaxed);
    m_backend->wake();
}

bool loop_core::run_once(std::chrono::nanoseconds max_wait) {
    check_thread();
    current_scope scope(this);
    enter_loop();
    tick(max_wait);
    // Back to a host that may now block on native_handle(): what the tick
    // queued after its poll (a timer callback's watcher, say) must reach the
    // OS, and posters must wake it.
    m_backend->flush();
    m_inbox.announce_sleep();
    if (m_inbox.queued()) m_backend->wake();
    leave_loop();
    return has_work();
}

// Resumes the tasks of m_batch, each once. Timed (loop_options::
// task_run_histogram): two clock reads per resume, so it is an instance of
// its own, chosen once per tick.
template <bool Timed>
inline void loop_core::resume_batch() noexcept {
    std::uint64_t resumed = 0;
    [[maybe_unused]] std::int64_t start = Timed ? steady_ns() : 0;
    while (task_header* t = m_batch.pop_front()) {
        m_running = t;
        t_budget = m_turn.start(m_pacing.epoch());
        if constexpr (Timed) {
            run_time_histogram* own = m_run_times.of(*t);
            t->m_resume.resume();
            const std::int64_t end = steady_ns();
            // The task's own histogram went with its header if it finished
            // (task_finished clears m_running).
            m_run_times.record(m_running.load() ? own : nullptr, end - start);
            start = end;
        } else {
            t->m_resume.resume();  // `t` may be freed when this returns
        }
        ++resumed;
        // Zero: the stall monitor flagged this resume (flag_stall), which
        // costs nothing here: the countdown is read after every resume anyway.
        const unsigned countdown = m_pacing.countdown();
        if (countdown <= 1) [[unlikely]] {
            // The monitor's zero follows its finding (a release exchange).
            if (countdown == 0) std::atomic_thread_fence(std::memory_order_acquire);
            if (m_stall.flagged()) m_stall.take_flag(m_running.load() ? t : nullptr, countdown);
            m_pacing.set_countdown(0);
            m_running = nullptr;
            check_poll_interval();
            if constexpr (Timed) start = steady_ns();
        } else {
            m_pacing.set_countdown(countdown - 1);
        }
    }
    m_running = nullptr;
    m_counters.resumes.add(resumed);
    m_counters.ready_depth = resumed;
    if (resumed > m_counters.ready_depth_max.load()) m_counters.ready_depth_max = resumed;
}

// A tick, in order (docs/architecture.md, "A tick"):
//  1. resume each task that was ready when the tick began, exactly once;
//  2. run posted callbacks (immediate work, before any timer), then a loop
//     group's mail;
//  3. poll the OS (at least every poll_interval while tasks stay ready), dispatch watchers;
//  4. fire expired timers in (deadline, insertion) order;
//  5. wake a bounded batch of idle waiters if nothing else is ready.
void loop_core::tick(std::chrono::nanoseconds max_wait) {
    m_inbox.note_awake();  // inside a tick, posters need not wake the loop
    resume_ready();
    m_inbox.run_due();
    if (m_member) m_member->exchange_mail();
    if (!look_at_os(max_wait)) return;  // tasks are ready, the poll interval has not run out
    m_watchers.dispatch();
    if (!m_timers.empty()) m_counters.timers_fired.add(m_timers.fire_expired(clock_ns()));
    if (m_ready.empty() && !m_idle.empty() && !m_inbox.due()) wake_idle_waiters();
}

// Step 1. Swapping the queue out first is what keeps a task that yields in a
// loop from running twice in one tick and starving the others.
inline void loop_core::resume_ready() noexcept {
    m_batch.splice_back(m_ready);
    ++m_counters.ticks;
    if (m_batch.empty()) [[unlikely]] {
        m_counters.ready_depth = 0;
        return;
    }
    // A loop may be driven from inside another's task: keep that task's budget.
    const std::uint32_t outer_budget = t_budget;
    if (m_options.task_run_histogram) [[unlikely]]
        resume_batch<true>();
    else
        resume_batch<false>();
    t_budget = outer_budget;
}

// Step 3. While tasks are ready, the OS is looked at only when the poll
// interval ran out (then already, in the middle of step 1): a zero-timeout
// poll is a syscall, more than fifty yields cost. A host driving the loop
// with poll() ticks rarely: it reads the clock each time. False when the
// tick ends here.
inline bool loop_core::look_at_os(std::chrono::nanoseconds max_wait) {
    const bool busy = !m_ready.empty();
    const bool polled = m_pacing.take_polled_in_batch();
    if (busy && polled) return true;
    if (busy && (max_wait != std::chrono::nanoseconds::zero() || !m_pacing.due(steady_ns()))) return false;
    const std::chrono::nanoseconds timeout = poll_timeout(max_wait);
    if (m_options.virtual_time && timeout != std::chrono::nanoseconds::zero()) {
        // Instead of sleeping until the next deadline, look at the OS without
        // waiting and, if nothing is ready, move the clock to the deadline.
        if (poll_os(std::chrono::nanoseconds::zero()) == 0 && m_ready.empty() && !m_watchers.has_fired() &&
            !m_inbox.due())
            advance_virtual_time(max_wait);
    } else {
        poll_os(timeout);
    }
    return true;
}

std::chrono::nanoseconds loop_core::poll_timeout(std::chrono::nanoseconds max_wait) {
    using std::chrono::nanoseconds;
    if (max_wait == nanoseconds::zero() || !m_ready.empty() || !m_idle.empty() || m_watchers.has_fired() ||
        m_stop.load(std::memory_order_relaxed) || m_inbox.due())
        return nanoseconds::zero();
    // Whoever drives the loop is about to return: a last look at the OS, no wait.
    if (!has_work() || (m_awaited && m_awaited->m_status != task_status::running)) return nanoseconds::zero();
    // The timers' slack (the grid, and more for long ones) is the queue's.
    const std::int64_t deadline = m_timers.next_wake();
    if (deadline == timer_queue::no_deadline) return max_wait;  // negative: no limit
    nanoseconds until(std::max<std::int64_t>(0, deadline - clock_ns()));
    if (max_wait < nanoseconds::zero()) return until;
    return std::min(until, max_wait);
}

void loop_core::advance_virtual_time(std::chrono::nanoseconds max_wait) noexcept {
    const std::int64_t deadline = m_timers.next_deadline();
    if (deadline == timer_queue::no_deadline) {
        // Nothing waits on time: only the OS (or another thread) can make
        // progress, so wait for it for real, as long as the caller allows
        // (run_once's limit is real time: the virtual clock cannot move).
        poll_os(max_wait);
        return;
    }
    m_virtual_ns = std::max(m_virtual_ns, deadline);
    m_recent_ns = m_virtual_ns;
}

int loop_core::poll_os(std::chrono::nanoseconds timeout) {
    if (m_member) timeout = m_member->before_poll(timeout, m_inbox);
    if (timeout != std::chrono::nanoseconds::zero() && m_inbox.spin_for_answer(timeout))
        timeout = std::chrono::nanoseconds::zero();
    if (timeout != std::chrono::nanoseconds::zero()) {
        // Announce the sleep, then look at the post queue (and the group's
        // doorbell) once more: a poster either saw the flag (and wakes us) or
        // we see its node here.
        m_inbox.announce_sleep();
        if (m_inbox.queued() || (m_member && m_member->has_mail())) timeout = std::chrono::nanoseconds::zero();
    }
    // A poll that may block is timed, so busy and waiting time add up; one
    // that cannot costs no extra clock read.
    const bool may_block = timeout != std::chrono::nanoseconds::zero();
    const std::int64_t before = may_block ? steady_ns() : 0;
    const int completed = m_backend->poll(timeout);
    m_inbox.note_polled();
    // The one clock read a poll costs; parked tasks are stamped with it.
    const std::int64_t now = steady_ns();
    ++m_counters.polls;
    if (completed > 0) m_counters.completions.add(static_cast<std::uint64_t>(completed));
    if (may_block) {
        // Back from a sleep: the stall monitor may have gone to sleep too.
        wake_stall_monitor_if_parked();
        ++m_counters.sleeps;
        m_counters.busy_ns.add(before - m_awake_since_ns);
        m_counters.wait_ns.add(now - before);
        m_awake_since_ns = now;
    }
    m_recent_ns = m_options.virtual_time ? m_virtual_ns : now;
    m_pacing.polled(now);
    return completed;
}

void loop_core::check_poll_interval() {
    if (!m_pacing.interval_over(steady_ns())) return;
    // Send what the tick's tasks asked for and collect what completed: those
    // tasks join the next tick, which keeps each one resumed once per tick.
    // Watchers and timers follow in step 3, in their usual order.
    poll_os(std::chrono::nanoseconds::zero());
    m_pacing.note_polled_in_batch();
}

void loop_core::wake_idle_waiters() noexcept {
    for (unsigned i = 0; i < m_options.idle_batch; ++i) {
        idle_wait* w = m_idle.pop_front();
        if (!w) break;
        w->complete();
    }
}

std::optional<std::chrono::nanoseconds> loop_core::time_to_next_deadline() {
    using std::chrono::nanoseconds;
    if (!m_ready.empty() || !m_idle.empty() || m_watchers.has_fired() || m_inbox.due() || m_inbox.queued())
        return nanoseconds::zero();
    std::int64_t deadline = m_timers.next_deadline();
    if (deadline == timer_queue::no_deadline) return std::nullopt;
    // This loop's own clock: a host calls this between ticks, when no loop is
    // current and now_ns() would read the steady clock under virtual time.
    return nanoseconds(std::max<std::int64_t>(0, deadline - clock_ns()));
}

}  // namespace detail

// --- the public face ------------------------------------------------------------

loop::loop(loop_options options) : m_core(std::make_unique<detail::loop_core>(*this, options)) {
    detail::register_live_loop(*this);
}

loop::~loop() {
    detail::unregister_live_loop(*this);
    // While parked frames are destroyed, their descriptors close through this
    // loop: the engine must still be reachable from it.
    m_core->shutdown();
}

loop& loop::current() {
    if (!t_current_core) throw std::logic_error("spindle: no loop is running on this thread");
    return t_current_core->owner();
}

loop* loop::current_or_null() noexcept { return t_current_core ? &t_current_core->owner() : nullptr; }

void loop::run() { m_core->run(); }
void loop::stop() noexcept { m_core->stop(); }
bool loop::run_once(std::chrono::nanoseconds max_wait) { return m_core->run_once(max_wait); }
int loop::native_handle() const noexcept { return m_core->backend().native_handle(); }
std::optional<std::chrono::nanoseconds> loop::time_to_next_deadline() { return m_core->time_to_next_deadline(); }
bool loop::has_work() const noexcept { return m_core->has_work(); }
std::size_t loop::task_count() const noexcept { return m_core->task_count(); }
std::size_t loop::timer_count() const noexcept { return m_core->timers().size(); }
backend_kind loop::backend() const noexcept { return static_cast<backend_kind>(m_core->backend().kind()); }
const loop_options& loop::options() const noexcept { return m_core->options(); }
clock::time_point loop::now() noexcept { return clock::time_point(std::chrono::nanoseconds(detail::now_ns())); }

loop::hold::hold(loop& l) noexcept : m_loop(&l) { m_loop->m_core->hold_acquire(); }

loop::hold::~hold() {
    if (m_loop) m_loop->m_core->hold_release();
}

std::string_view to_string(backend_kind kind) noexcept { return reactor::to_string(static_cast<reactor::backend_kind>(kind)); }

std::optional<backend_kind> backend_from_string(std::string_view name) noexcept {
    if (auto k = reactor::backend_from_string(name)) return static_cast<backend_kind>(*k);
    return std::nullopt;
}

}  // namespace spindle
