#include <spindle/io.hpp>
#include <spindle/log.hpp>
#include <spindle/loop.hpp>
#include <spindle/signal.hpp>
#include <spindle/sleep.hpp>
#include <spindle/watcher.hpp>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>
#include <cerrno>
#include <csignal>
#include <stdexcept>
#include <thread>
#include <unistd.h>

namespace spindle {

namespace {

thread_local loop* t_current = nullptr;

// Makes `l` the current loop for a scope: awaitables find their loop and task
// through it. Nested scopes (a loop driven from inside another's task) restore.
class current_scope {
public:
    explicit current_scope(loop* l) noexcept : m_previous(t_current) { t_current = l; }
    ~current_scope() { t_current = m_previous; }
    current_scope(const current_scope&) = delete;
    current_scope& operator=(const current_scope&) = delete;

private:
    loop* m_previous;
};

constexpr int max_signal = 64;

std::int64_t steady_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count();
}

// Loops alive in the process, so a descriptor that outlived its loop (a
// listener bound before the loop and destroyed after it) is closed plainly
// instead of through a dangling loop.
std::mutex g_live_mutex;
std::vector<const loop*> g_live_loops;

}  // namespace

struct loop::signal_slot {
    detail::intrusive_list<detail::signal_waiter> waiters;
    std::uint64_t pending = 0;
    bool caught = false;
};

// --- detail hooks used by tasks and awaitables ------------------------------

namespace detail {

task_header& current_task() {
    if (!t_current || !t_current->running_task())
        throw std::logic_error("spindle: this awaitable must be awaited inside a task run by a loop");
    return *t_current->running_task();
}

void schedule(task_header& task) noexcept { task.m_loop->schedule(task); }

void task_finished(task_header& task) noexcept { task.m_loop->task_finished(task); }

void release_task(task_header& task) noexcept {
    if (--task.m_refs == 0) task.m_delete(task);
}

void abort_task(task_header& task) { task.m_loop->abort_task(task); }

void cancel_task(task_header& task) noexcept { task.m_loop->cancel_task(task); }

std::int64_t recent_time(const task_header& task) noexcept { return task.m_loop->recent_ns(); }

void log_unobserved_failure(const task_header& task) noexcept {
    try {
        std::string what = "unknown exception";
        try {
            std::rethrow_exception(task.m_error);
        } catch (const std::exception& e) {
            what = e.what();
        } catch (...) {
        }
        if (task.m_name.empty())
            logger()->error("task {} failed: {}", task.m_id, what);
        else
            logger()->error("task {} '{}' failed: {}", task.m_id, task.m_name, what);
    } catch (...) {
        // Logging must never take the loop down.
    }
}

void log_post_failure() noexcept {
    try {
        try {
            throw;
        } catch (const std::exception& e) {
            logger()->error("posted callback failed: {}", e.what());
        } catch (...) {
            logger()->error("posted callback failed: unknown exception");
        }
    } catch (...) {
    }
}

void watcher_base::on_complete(reactor::operation& op) noexcept {
    auto& self = static_cast<watcher_base&>(op);
    if (!self.m_loop) return;
    if ((!self.persistent || !self.pending()) && self.watch_hook().is_linked()) {
        // Done (one-shot, or its descriptor was closed): it no longer keeps the
        // loop alive, even if it is already queued to call back.
        self.watch_hook().unlink();
        --self.m_loop->m_active_watchers;
    }
    if (!self.fired_hook().is_linked()) self.m_loop->m_fired.push_back(self);
}

}  // namespace detail

// --- construction and teardown ----------------------------------------------

namespace {

// Falling back from io_uring is reported once per process, at info level: the
// reason (seccomp, kernel.io_uring_disabled, an old kernel) is the same for
// every loop, and a program with many loops should not repeat it.
std::unique_ptr<reactor::backend> open_backend(reactor::backend_kind kind) {
    std::string fallback_reason;
    auto backend = reactor::make_backend(kind, fallback_reason);
    if (!fallback_reason.empty()) {
        static std::once_flag reported;
        std::call_once(reported, [&] { logger()->info("{}", fallback_reason); });
    }
    return backend;
}

}  // namespace

loop::loop(loop_options options) : m_options(options), m_backend(open_backend(options.backend)) {
    if (m_options.event_interval == 0) m_options.event_interval = 1;
    if (m_options.resume_budget == 0) m_options.resume_budget = 1;
    if (m_options.idle_batch == 0) m_options.idle_batch = 1;
    m_signal_op.m_owner = this;
    // The virtual clock starts at the real one, so deadlines computed before
    // the loop existed still make sense.
    m_recent_ns = m_virtual_ns = steady_ns();
    std::lock_guard lock(g_live_mutex);
    g_live_loops.push_back(this);
}

loop::~loop() {
    {
        std::lock_guard lock(g_live_mutex);
        std::erase(g_live_loops, this);
    }
    // Another thread may still be inside post() or ~hold(), past the point
    // where this loop could see its work: let it leave first (nanoseconds).
    while (m_in_flight.load(std::memory_order_acquire) != 0) std::this_thread::yield();
    m_closing = true;
    current_scope scope(this);
    // Parked tasks first: their frames' destructors withdraw timers and
    // operations and close descriptors, which needs the backend alive.
    while (detail::task_header* t = m_all.pop_front()) {
        t->ready_hook().unlink();
        t->m_status = detail::task_status::aborted;
        --m_task_count;
        destroy_frame(*t);
        detail::release_task(*t);
    }
    m_ready.clear();
    m_batch.clear();
    m_idle.clear();
    // Posts that never ran are destroyed unrun.
    while (detail::post_node* node = m_posts.pop()) node->m_call(node, false);
    // Watchers outlive us only by mistake; make their stop() harmless.
    while (detail::watcher_base* w = m_watchers.pop_front()) {
        m_backend->forget(*w);
        w->m_loop = nullptr;
    }
    while (detail::watcher_base* w = m_fired.pop_front()) w->m_loop = nullptr;
    m_timers.clear();
    if (m_signal_source) {
        m_backend->forget(m_signal_op);
        for (auto& slot : *m_signal_slots) slot.waiters.clear();
    }
}

void loop::destroy_frame(detail::task_header& t) noexcept {
    auto frame = std::exchange(t.m_frame, {});
    if (frame) frame.destroy();
}

loop& loop::current() {
    if (!t_current) throw std::logic_error("spindle: no loop is running on this thread");
    return *t_current;
}

loop* loop::current_or_null() noexcept { return t_current; }

// --- tasks -------------------------------------------------------------------

void loop::register_task(detail::task_header& t, std::coroutine_handle<> frame) {
    t.m_loop = this;
    t.m_id = m_next_task_id++;
    t.m_frame = frame;
    t.m_resume = frame;
    m_all.push_back(t);
    ++m_task_count;
    m_ready.push_back(t);
}

void loop::schedule(detail::task_header& t) noexcept {
    if (m_closing || t.m_status != detail::task_status::running) return;
    if (t.ready_hook().is_linked()) return;  // already due this tick or the next
    m_ready.push_back(t);
}

void loop::task_finished(detail::task_header& t) noexcept {
    t.m_finish(t);  // takes the result and destroys the frame
    t.all_hook().unlink();
    --m_task_count;
    if (t.m_status == detail::task_status::failed && t.m_refs == 1) detail::log_unobserved_failure(t);
    if (detail::task_header* joiner = std::exchange(t.m_joiner, nullptr)) schedule(*joiner);
    detail::release_task(t);
}

void loop::abort_task(detail::task_header& t) {
    if (t.m_status != detail::task_status::running) return;
    if (&t == m_running) throw std::logic_error("spindle: a task cannot abort itself");
    t.ready_hook().unlink();
    t.all_hook().unlink();
    t.m_status = detail::task_status::aborted;
    --m_task_count;
    // Keep the header alive while the frame's destructors run.
    ++t.m_refs;
    destroy_frame(t);
    if (detail::task_header* joiner = std::exchange(t.m_joiner, nullptr)) schedule(*joiner);
    detail::release_task(t);  // the loop's reference
    detail::release_task(t);  // the one taken above
}

void loop::run_until_done(const detail::task_header& t) {
    current_scope scope(this);
    const detail::task_header* outer = std::exchange(m_awaited, &t);
    try {
        while (t.m_status == detail::task_status::running && !m_stop.load(std::memory_order_acquire))
            tick(std::chrono::nanoseconds(-1));
        m_stop.store(false, std::memory_order_relaxed);
    } catch (...) {
        m_awaited = outer;
        throw;
    }
    m_awaited = outer;
}

// --- running -----------------------------------------------------------------

bool loop::has_work() const noexcept {
    return m_task_count > 0 || !m_timers.empty() || m_active_watchers > 0 || !m_fired.empty() ||
           m_holds.load(std::memory_order_acquire) > 0 ||
           m_posted.load(std::memory_order_acquire) != m_posts_run || !m_posts.empty();
}

void loop::run() {
    current_scope scope(this);
    while (!m_stop.load(std::memory_order_acquire) && has_work()) tick(std::chrono::nanoseconds(-1));
    m_stop.store(false, std::memory_order_relaxed);
}

void loop::stop() noexcept {
    m_stop.store(true, std::memory_order_release);
    m_backend->wake();
}

bool loop::run_once(std::chrono::nanoseconds max_wait) {
    current_scope scope(this);
    tick(max_wait);
    // Back to a host that may now block on native_handle(): posters must wake it.
    m_sleeping.store(true, std::memory_order_seq_cst);
    if (!m_posts.empty()) m_backend->wake();
    return has_work();
}

loop::hold::hold(loop& l) noexcept : m_loop(&l) { m_loop->m_holds.fetch_add(1, std::memory_order_acq_rel); }

loop::hold::~hold() {
    if (!m_loop) return;
    // Once the count drops, the loop may return from run() and be destroyed
    // before wake() is called: the in-flight count makes ~loop wait for us.
    m_loop->m_in_flight.fetch_add(1, std::memory_order_acq_rel);
    m_loop->m_holds.fetch_sub(1, std::memory_order_acq_rel);
    m_loop->m_backend->wake();  // let run() see that the work may be over
    m_loop->m_in_flight.fetch_sub(1, std::memory_order_release);
}

// A tick, in order (docs/architecture.md):
//  1. resume each task that was ready when the tick began, exactly once;
//  2. run posted callbacks (immediate work, before any timer);
//  3. poll the OS (at a bounded interval while tasks stay ready), dispatch watchers;
//  4. fire expired timers in (deadline, insertion) order;
//  5. wake a bounded batch of idle waiters if nothing else is ready.
void loop::tick(std::chrono::nanoseconds max_wait) {
    // Inside a tick the loop looks at its posts by itself: posters need not wake
    // it. (Load first: a store per tick would bounce the line between threads.)
    if (m_sleeping.load(std::memory_order_relaxed)) m_sleeping.store(false, std::memory_order_relaxed);
    // 1. Swapping the queue out first is what keeps a task that yields in a
    //    loop from running twice in one tick and starving the others.
    m_batch.splice_back(m_ready);
    while (detail::task_header* t = m_batch.pop_front()) {
        m_running = t;
        ++m_resumes_since_poll;
        t->m_resume.resume();  // `t` may be freed when this returns
    }
    m_running = nullptr;
    ++m_ticks_since_poll;

    // 2.
    run_posts();

    // 3. A zero-timeout poll is still a syscall; while tasks are ready, skip it
    //    unless the interval or the resume budget ran out, so I/O and timers
    //    are looked at a bounded number of task switches apart.
    const bool busy = !m_ready.empty();
    if (busy && m_ticks_since_poll < m_options.event_interval && m_resumes_since_poll < m_options.resume_budget)
        return;
    const std::chrono::nanoseconds timeout = poll_timeout(max_wait);
    if (m_options.virtual_time && timeout != std::chrono::nanoseconds::zero()) {
        // Instead of sleeping until the next deadline, look at the OS without
        // waiting and, if nothing is ready, move the clock to the deadline.
        if (poll_os(std::chrono::nanoseconds::zero()) == 0 && m_ready.empty() && m_fired.empty() &&
            m_posted.load(std::memory_order_acquire) == m_posts_run)
            advance_virtual_time(max_wait);
    } else {
        poll_os(timeout);
    }
    m_ticks_since_poll = 0;
    m_resumes_since_poll = 0;
    dispatch_watchers();

    // 4.
    if (!m_timers.empty()) m_timers.fire_expired(now_ns());

    // 5.
    if (m_ready.empty() && !m_idle.empty() && m_posted.load(std::memory_order_acquire) == m_posts_run)
        wake_idle_waiters();
}

std::chrono::nanoseconds loop::poll_timeout(std::chrono::nanoseconds max_wait) {
    using std::chrono::nanoseconds;
    if (max_wait == nanoseconds::zero() || !m_ready.empty() || !m_idle.empty() || !m_fired.empty() ||
        m_stop.load(std::memory_order_relaxed) || m_posted.load(std::memory_order_acquire) != m_posts_run)
        return nanoseconds::zero();
    // Whoever drives the loop is about to return: a last look at the OS, no wait.
    if (!has_work() || (m_awaited && m_awaited->m_status != detail::task_status::running))
        return nanoseconds::zero();
    std::int64_t deadline = m_timers.next_deadline();
    if (deadline == detail::timer_queue::no_deadline) return max_wait;  // negative: no limit
    if (const std::int64_t slack = m_options.timer_slack.count(); slack > 0 && deadline < detail::timer_queue::no_deadline - slack)
        deadline = (deadline + slack - 1) / slack * slack;  // up to the grid: late by < slack, never early
    nanoseconds until(std::max<std::int64_t>(0, deadline - now_ns()));
    if (max_wait < nanoseconds::zero()) return until;
    return std::min(until, max_wait);
}

void loop::advance_virtual_time(std::chrono::nanoseconds max_wait) noexcept {
    const std::int64_t deadline = m_timers.next_deadline();
    if (deadline == detail::timer_queue::no_deadline) {
        // Nothing waits on time: only the OS (or another thread) can make
        // progress, so wait for it for real, as long as the caller allows
        // (run_once's limit is real time: the virtual clock cannot move).
        poll_os(max_wait);
        return;
    }
    m_virtual_ns = std::max(m_virtual_ns, deadline);
    m_recent_ns = m_virtual_ns;
}

std::int64_t loop::now_ns() noexcept {
    if (const loop* l = t_current; l && l->m_options.virtual_time) return l->m_virtual_ns;
    return steady_ns();
}

void loop::cancel_task(detail::task_header& t) noexcept {
    if (t.m_status != detail::task_status::running) return;
    t.m_cancel_requested = true;
    // A task parked on a wait that can be cancelled is woken now; one that is
    // ready or running meets the request at its next wait.
    if (&t != m_running && t.m_wait_info && t.m_wait_info->cancel) t.m_wait_info->cancel(t.m_wait);
}

std::vector<task_info> loop::tasks() const {
    std::vector<task_info> out;
    out.reserve(m_task_count);
    const std::int64_t now = m_recent_ns;
    m_all.for_each([&](const detail::task_header& t) {
        task_info info;
        info.id = t.m_id;
        info.name = t.m_name;
        if (&t == m_running) {
            info.state = task_info::state_kind::running;
        } else if (t.m_wait_info && !t.ready_hook().is_linked()) {
            info.state = task_info::state_kind::parked;
            t.m_wait_info->describe(t.m_wait, info.waiting_on);
            info.parked_for = std::chrono::nanoseconds(std::max<std::int64_t>(0, now - t.m_parked_at));
        } else if (!t.ready_hook().is_linked()) {
            // Parked on a wait that does not say what it is.
            info.state = task_info::state_kind::parked;
            info.waiting_on = "an unnamed wait";
        }
        out.push_back(std::move(info));
    });
    return out;
}

std::string loop::dump_tasks() const {
    std::string text;
    std::vector<task_info> all = tasks();
    text += std::to_string(all.size()) + (all.size() == 1 ? " task\n" : " tasks\n");
    for (const task_info& t : all) {
        text += "  task " + std::to_string(t.id);
        if (!t.name.empty()) text += " '" + t.name + "'";
        switch (t.state) {
            case task_info::state_kind::running: text += ": running\n"; break;
            case task_info::state_kind::ready: text += ": ready\n"; break;
            case task_info::state_kind::parked: {
                const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.parked_for).count();
                text += ": waiting on " + t.waiting_on + " for " + std::to_string(ms) + " ms\n";
                break;
            }
        }
    }
    return text;
}

int loop::poll_os(std::chrono::nanoseconds timeout) {
    if (timeout != std::chrono::nanoseconds::zero()) {
        // Announce the sleep, then look at the post queue once more: a poster
        // either saw the flag (and wakes us) or we see its node here.
        m_sleeping.store(true, std::memory_order_seq_cst);
        if (!m_posts.empty()) timeout = std::chrono::nanoseconds::zero();
    }
    const int completed = m_backend->poll(timeout);
    m_sleeping.store(false, std::memory_order_relaxed);
    m_wake_sent.store(false, std::memory_order_relaxed);
    // The one clock read a poll costs; parked tasks are stamped with it.
    m_recent_ns = m_options.virtual_time ? m_virtual_ns : steady_ns();
    return completed;
}

void loop::run_posts() {
    // Only what was posted before this point runs now; a callback that posts
    // again lands in the next tick, so posts cannot starve the loop either.
    const std::uint64_t target = m_posted.load(std::memory_order_acquire);
    while (m_posts_run < target) {
        detail::post_node* node = m_posts.pop();
        if (!node) break;  // a push is half done; it runs next tick
        ++m_posts_run;
        node->m_call(node, true);
    }
}

void loop::dispatch_watchers() {
    while (detail::watcher_base* w = m_fired.pop_front()) {
        try {
            w->m_callback(w->m_context);  // may stop or destroy any watcher
        } catch (const std::exception& e) {
            logger()->error("watcher callback failed: {}", e.what());
        } catch (...) {
            logger()->error("watcher callback failed: unknown exception");
        }
    }
}

void loop::add_idle_waiter(detail::idle_waiter& w) noexcept { m_idle.push_back(w); }

void loop::wake_idle_waiters() noexcept {
    for (unsigned i = 0; i < m_options.idle_batch; ++i) {
        detail::idle_waiter* w = m_idle.pop_front();
        if (!w) break;
        schedule(*w->m_task);
    }
}

std::optional<std::chrono::nanoseconds> loop::time_to_next_deadline() {
    using std::chrono::nanoseconds;
    if (!m_ready.empty() || !m_idle.empty() || !m_fired.empty() ||
        m_posted.load(std::memory_order_acquire) != m_posts_run || !m_posts.empty())
        return nanoseconds::zero();
    std::int64_t deadline = m_timers.next_deadline();
    if (deadline == detail::timer_queue::no_deadline) return std::nullopt;
    return nanoseconds(std::max<std::int64_t>(0, deadline - now_ns()));
}

void loop::close_fd(int fd) noexcept {
    if (fd < 0) return;
    m_backend->close_fd(fd);
    ::close(fd);
}

// --- watchers ----------------------------------------------------------------

void loop::add_watcher(detail::watcher_base& w) noexcept {
    m_watchers.push_back(w);
    ++m_active_watchers;
}

void loop::remove_watcher(detail::watcher_base& w) noexcept {
    if (w.watch_hook().is_linked()) {
        w.watch_hook().unlink();
        --m_active_watchers;
    }
    w.fired_hook().unlink();
    if (w.pending()) m_backend->forget(w);
}

// --- signals -----------------------------------------------------------------

loop::signal_slot& loop::slot_of(int signo) {
    if (signo <= 0 || signo > max_signal) throw std::invalid_argument("spindle: bad signal number");
    return (*m_signal_slots)[static_cast<std::size_t>(signo)];
}

void loop::catch_signal(int signo) {
    if (signo <= 0 || signo > max_signal) throw std::invalid_argument("spindle: bad signal number");
    if (!m_signal_source) {
        auto source = reactor::make_signal_source(m_options.signals);
        m_signal_slots = std::make_unique<std::array<signal_slot, max_signal + 1>>();
        m_signal_op.complete = &on_signal_ready;
        m_signal_op.fd = source->fd();
        m_signal_op.code = reactor::op_code::poll;
        m_signal_op.events = reactor::readable;
        m_signal_op.persistent = true;
        m_signal_source = std::move(source);
        m_backend->submit(m_signal_op);
    }
    signal_slot& slot = slot_of(signo);
    if (!slot.caught) {
        m_signal_source->add(signo);
        slot.caught = true;
    }
}

bool loop::take_pending_signal(int signo) noexcept {
    if (!m_signal_slots || signo <= 0 || signo > max_signal) return false;
    signal_slot& slot = (*m_signal_slots)[static_cast<std::size_t>(signo)];
    if (slot.pending == 0) return false;
    slot.pending = 0;
    return true;
}

void loop::add_signal_waiter(detail::signal_waiter& w) { slot_of(w.m_signo).waiters.push_back(w); }

void loop::on_signal_ready(reactor::operation& op) noexcept {
    loop* self = static_cast<signal_op&>(op).m_owner;
    try {
        self->m_signal_source->drain(&on_signal, self);
    } catch (const std::exception& e) {
        logger()->error("reading signals failed: {}", e.what());
    }
}

void loop::on_signal(void* ctx, int signo) {
    auto* self = static_cast<loop*>(ctx);
    if (signo <= 0 || signo > max_signal) return;
    signal_slot& slot = (*self->m_signal_slots)[static_cast<std::size_t>(signo)];
    if (slot.waiters.empty()) {
        ++slot.pending;
        return;
    }
    while (detail::signal_waiter* w = slot.waiters.pop_front()) self->schedule(*w->m_task);
}

// --- unique_fd, watcher -------------------------------------------------------

void unique_fd::reset() noexcept {
    int fd = std::exchange(m_fd, -1);
    if (fd < 0) return;
    if (m_loop && m_loop == t_current) {
        m_loop->close_fd(fd);
        return;
    }
    if (m_loop) {
        std::lock_guard lock(g_live_mutex);
        if (std::find(g_live_loops.begin(), g_live_loops.end(), m_loop) != g_live_loops.end()) {
            m_loop->close_fd(fd);
            return;
        }
    }
    ::close(fd);
}

watcher::watcher(loop& owner, int fd, std::uint32_t events, callback fn, void* context, mode m) {
    m_loop = &owner;
    m_callback = fn;
    m_context = context;
    this->fd = fd;
    this->code = reactor::op_code::poll;
    this->events = events;
    this->persistent = (m == mode::persistent);
    this->complete = &on_complete;
    // Submit before linking: if it throws (say, epoll refuses a regular file),
    // no list keeps a node that never finished constructing.
    const bool ready_now = owner.io().submit(*this);
    owner.add_watcher(*this);
    // A one-shot watch may be satisfied at once: it still calls back from the
    // loop, never from inside this constructor.
    if (ready_now) on_complete(*this);
}

void watcher::stop() noexcept {
    if (m_loop) m_loop->remove_watcher(*this);
}

namespace detail {

void io_awaiter_base::describe(std::string& out) const {
    static constexpr const char* names[] = {"read", "write", "readv", "writev", "recv", "send",
                                            "recvmsg", "sendmsg", "accept", "connect", "poll"};
    const auto code = static_cast<std::size_t>(this->code);
    out += code < std::size(names) ? names[code] : "I/O";
    out += " on fd ";
    out += std::to_string(fd);
}

void sleep_awaiter::describe(std::string& out) const {
    const std::int64_t left = m_loop ? m_deadline - m_loop->recent_ns() : 0;
    out += "sleep, due in ";
    out += std::to_string(std::max<std::int64_t>(0, left) / 1'000'000);
    out += " ms";
}

}  // namespace detail

}  // namespace spindle
