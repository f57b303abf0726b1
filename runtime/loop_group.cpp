// The loop group: threads, their loops, the mesh of links between them, and
// the group's stop. The tick's side of cross-loop mail is group_member; the
// calls themselves are templates in detail/cross_loop.hpp.

#include "group_member.hpp"
#include "loop_core.hpp"

#include <spindle/log.hpp>
#include <spindle/loop_group.hpp>
#include <spindle/signal.hpp>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <csignal>
#include <ctime>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

namespace spindle {

namespace detail {

class group_core {
public:
    group_core(loop_group& owner, loop_group_options options);

    loop_group& owner() noexcept { return m_owner; }
    std::uint32_t size() const noexcept { return m_size; }
    const loop_group_options& options() const noexcept { return m_options; }
    link& between(std::uint32_t from, std::uint32_t to) noexcept { return *m_links[std::size_t{from} * m_size + to]; }
    group_member& member(std::uint32_t index) noexcept { return *m_members[index]; }
    bool closing() const noexcept { return m_closing.load(std::memory_order_acquire); }

    int run(const std::function<task<int>(std::stop_token)>& main);
    void stop() noexcept;
    loop& at(std::size_t index);

private:
    void run_loop(std::uint32_t index, const std::function<task<int>(std::stop_token)>& main);
    task<void> run_main(std::uint32_t index, std::function<task<int>(std::stop_token)> main);
    task<void> stop_on_signals();
    void main_finished(int status, std::exception_ptr error) noexcept;
    void pin(std::uint32_t index) const;

    loop_group& m_owner;
    loop_group_options m_options;
    std::uint32_t m_size;
    std::vector<std::unique_ptr<link>> m_links;
    std::vector<std::unique_ptr<group_member>> m_members;
    std::vector<loop*> m_loops;
    // Each requested on its own loop's thread only (stop() posts there).
    std::vector<std::stop_source> m_stops;

    std::mutex m_mutex;  // the fields below
    bool m_started = false;
    bool m_stop_requested = false;
    bool m_ran = false;
    std::uint32_t m_mains_left = 0;
    int m_status = 0;
    std::exception_ptr m_error;
    std::exception_ptr m_build_error;
    std::atomic<bool> m_closing{false};
    std::barrier<>* m_built = nullptr;    // every loop is built
    std::barrier<>* m_stopped = nullptr;  // every loop stopped ticking
};

namespace {

// The CPUs this process may run on.
std::vector<int> allowed_cpus() {
    std::vector<int> cpus;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; ++c)
            if (CPU_ISSET(c, &set)) cpus.push_back(c);
    return cpus;
}

unsigned loop_count(const loop_group_options& options) {
    if (options.threads != 0) return options.threads;
    const std::size_t n = allowed_cpus().size();
    return n > 0 ? static_cast<unsigned>(n) : std::max(1u, std::thread::hardware_concurrency());
}

group_member* current_member() noexcept {
    loop_core* core = current_core_or_null();
    return core ? core->member() : nullptr;
}

// Blocks `signals` in the calling thread for a scope; threads started inside
// it inherit the mask, so only loop 0's signal wait ever takes them.
class blocked_signals {
public:
    explicit blocked_signals(const std::vector<int>& signals) : m_signals(signals) {
        sigset_t set;
        sigemptyset(&set);
        for (int s : signals) sigaddset(&set, s);
        ::pthread_sigmask(SIG_BLOCK, &set, &m_old);
    }
    ~blocked_signals() {
        // A delivery after the group stopped would take its default action
        // (often: end the process) the moment it is unblocked: take it first.
        sigset_t late;
        sigemptyset(&late);
        for (int s : m_signals)
            if (sigismember(&m_old, s) == 0) sigaddset(&late, s);
        const ::timespec now{};
        while (::sigtimedwait(&late, nullptr, &now) > 0) {
        }
        ::pthread_sigmask(SIG_SETMASK, &m_old, nullptr);
    }
    blocked_signals(const blocked_signals&) = delete;
    blocked_signals& operator=(const blocked_signals&) = delete;

private:
    std::vector<int> m_signals;
    sigset_t m_old;
};

}  // namespace

group_core::group_core(loop_group& owner, loop_group_options options)
    : m_owner(owner), m_options(std::move(options)), m_size(loop_count(m_options)) {
    const std::vector<int> allowed = allowed_cpus();
    for (int cpu : m_options.cpus)
        if (std::find(allowed.begin(), allowed.end(), cpu) == allowed.end())
            throw std::invalid_argument("spindle: loop_group: CPU " + std::to_string(cpu) + " is not one this process may run on");
    if (m_options.calls_in_flight == 0) m_options.calls_in_flight = 1;
    m_links.reserve(std::size_t{m_size} * m_size);
    for (std::uint32_t from = 0; from < m_size; ++from)
        for (std::uint32_t to = 0; to < m_size; ++to)
            m_links.push_back(std::make_unique<link>(from, to, m_options.calls_in_flight));
    for (std::uint32_t i = 0; i < m_size; ++i) {
        m_members.push_back(std::make_unique<group_member>(*this, i));
        m_members.back()->reserve_targets(m_size);
    }
    m_loops.assign(m_size, nullptr);
    m_stops.resize(m_size);
}

void group_core::pin(std::uint32_t index) const {
    if (m_options.cpus.empty()) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(m_options.cpus[index % m_options.cpus.size()], &set);
    if (const int r = ::pthread_setaffinity_np(::pthread_self(), sizeof set, &set); r != 0)
        logger()->warn("loop {}: cannot pin to CPU {}: {}", index, m_options.cpus[index % m_options.cpus.size()],
                       std::system_category().message(r));
}

int group_core::run(const std::function<task<int>(std::stop_token)>& main) {
    {
        std::lock_guard lock(m_mutex);
        if (m_ran) throw std::logic_error("spindle: loop_group::run runs once per group");
        m_ran = true;
        m_mains_left = m_size;
    }
    // Every loop is built before any main runs, so a call may go to any loop
    // from the start; every loop stops ticking before any is destroyed, so
    // no loop rings or posts to one that is gone.
    std::barrier built(static_cast<std::ptrdiff_t>(m_size));
    std::barrier stopped(static_cast<std::ptrdiff_t>(m_size));
    m_built = &built;
    m_stopped = &stopped;
    {
        blocked_signals blocked(m_options.stop_signals);
        std::vector<std::thread> threads;
        threads.reserve(m_size);
        for (std::uint32_t i = 0; i < m_size; ++i) threads.emplace_back([this, i, &main] { run_loop(i, main); });
        for (std::thread& t : threads) t.join();
    }
    {
        // The loops are gone: at() says so instead of giving a dangling one.
        std::lock_guard lock(m_mutex);
        m_started = false;
        std::fill(m_loops.begin(), m_loops.end(), nullptr);
    }
    if (m_build_error) std::rethrow_exception(m_build_error);
    if (m_error) std::rethrow_exception(m_error);
    return m_status;
}

void group_core::run_loop(std::uint32_t index, const std::function<task<int>(std::stop_token)>& main) {
    pin(index);
    loop_options options = m_options.loop;
    options.single_thread = true;
    std::optional<loop> l;
    try {
        l.emplace(options);
        core_of(*l).attach_member(&member(index));
        member(index).set_spin(std::max<std::int64_t>(0, m_options.idle_spin.count()));
        member(index).attach(&core_of(*l));
        m_loops[index] = &*l;
    } catch (...) {
        std::lock_guard lock(m_mutex);
        if (!m_build_error) m_build_error = std::current_exception();
    }
    m_built->arrive_and_wait();
    {
        std::lock_guard lock(m_mutex);
        m_started = !m_build_error;
    }
    if (l && !m_build_error) {
        {
            loop::hold keep(*l);
            l->spawn(run_main(index, main), "main").detach();
            if (index == 0 && !m_options.stop_signals.empty()) {
                for (int s : m_options.stop_signals) l->catch_signal(s);
                l->spawn(stop_on_signals(), "stop on signals").detach();
            }
            l->run();
        }
    }
    m_stopped->arrive_and_wait();
    // Only now may this loop go: nobody rings it or posts to it any more.
    // What is still in its rings is destroyed unrun (a capture, an outcome,
    // a handed-over socket), on its own thread.
    member(index).discard_mail();
    if (l) {
        for (std::uint32_t from = 0; from < m_size; ++from) between(from, index).m_running.clear();
        member(index).attach(nullptr);
        l.reset();
    }
}

task<void> group_core::run_main(std::uint32_t index, std::function<task<int>(std::stop_token)> main) {
    {
        std::lock_guard lock(m_mutex);
        if (m_stop_requested) m_stops[index].request_stop();
    }
    int status = 0;
    std::exception_ptr error;
    try {
        status = co_await main(m_stops[index].get_token());
    } catch (...) {
        error = std::current_exception();
    }
    main_finished(status, error);
}

task<void> group_core::stop_on_signals() {
    signal_set signals;
    for (int s : m_options.stop_signals) signals.add(s);
    result<int> got = co_await wait_signal(signals, m_stops[0].get_token());
    if (got) {
        logger()->info("signal {}: stopping {} loop{}", *got, m_size, m_size == 1 ? "" : "s");
        stop();
    }
}

void group_core::main_finished(int status, std::exception_ptr error) noexcept {
    bool last = false;
    bool failed = status != 0 || error;
    {
        std::lock_guard lock(m_mutex);
        if (error && !m_error) m_error = error;
        if (status != 0 && m_status == 0) m_status = status;
        last = --m_mains_left == 0;
        if (last) m_closing.store(true, std::memory_order_release);
    }
    if (last) {
        // Every main is done: nobody waits on a call any more. Each loop
        // returns from run() and waits for the others before it is destroyed.
        for (loop* l : m_loops) l->stop();
    } else if (failed) {
        stop();
    }
}

void group_core::stop() noexcept {
    std::lock_guard lock(m_mutex);
    m_stop_requested = true;
    if (!m_started || m_closing.load(std::memory_order_relaxed)) return;
    for (std::uint32_t i = 0; i < m_size; ++i) {
        try {
            m_loops[i]->post([this, i] { m_stops[i].request_stop(); });
        } catch (...) {
            // Out of memory for the post: that loop's main is not told.
            logger()->error("loop_group: cannot tell loop {} to stop", i);
        }
    }
}

loop& group_core::at(std::size_t index) {
    if (index >= m_size) throw std::out_of_range("spindle: loop_group::at: no loop " + std::to_string(index));
    std::lock_guard lock(m_mutex);
    if (!m_started || !m_loops[index]) throw std::logic_error("spindle: loop_group::at: the group's loops are not running");
    return *m_loops[index];
}

// --- links ---------------------------------------------------------------------

link::link(std::uint32_t from, std::uint32_t to, std::size_t calls)
    : m_from(from), m_to(to), m_requests(calls + 1), m_replies(calls + 1) {
    // A ring holds every call in flight, and one cell more: the cell its
    // consumer is handling, which is freed only after its handling may have
    // let the next call (or reply) in.
    m_calls.resize(calls);
    for (std::uint32_t i = 0; i < calls; ++i) m_calls[i].m_next_free = i + 1;
    m_free_head = 0;
    m_credits = static_cast<std::uint32_t>(calls);
    m_running.resize(calls);
}

void link::start(call_wait_base& call) noexcept {
    if (m_credits == 0 || !m_credit_waiters.empty()) {
        call.m_phase = call_wait_base::phase::queued;
        m_credit_waiters.push_back(call);
        return;
    }
    send(call);
}

void link::send(call_wait_base& call) noexcept {
    --m_credits;
    const std::uint32_t slot = m_free_head;
    call_slot& s = m_calls[slot];
    m_free_head = s.m_next_free;
    s.m_waiter = &call;
    ++s.m_generation;
    if (s.m_generation == 0) s.m_generation = 1;  // 0 means no call
    call.m_slot = slot;
    call.m_phase = call_wait_base::phase::in_flight;
    // A credit was free, so a cell is: at most one request per credit.
    ring_cell* cell = m_requests.reserve();
    ::new (cell->bytes) cell_header{nullptr, slot, s.m_generation};
    call.m_build(call, *cell);
    m_requests.commit();
    note_sent(m_to);
    current_member()->call_sent();
}

void link::withdraw(call_wait_base& call) noexcept {
    switch (call.m_phase) {
        case call_wait_base::phase::queued:
            static_cast<list_hook<credit_tag>&>(call).unlink();
            break;
        case call_wait_base::phase::in_flight: {
            // The reply still comes, and frees the credit; nobody takes it.
            call_slot& s = m_calls[call.m_slot];
            s.m_waiter = nullptr;
            post_remote_cancel(*this, call.m_slot, s.m_generation);
            break;
        }
        default: break;
    }
    call.m_phase = call_wait_base::phase::idle;
}

void link::release(std::uint32_t slot) noexcept {
    m_calls[slot].m_waiter = nullptr;
    m_calls[slot].m_next_free = m_free_head;
    m_free_head = slot;
    ++m_credits;
    current_member()->call_done();
    // The credit goes to the first caller queued for one, in order.
    if (call_wait_base* next = m_credit_waiters.pop_front()) send(*next);
}

link& link_to(std::size_t target) {
    group_member* me = current_member();
    if (!me) throw std::logic_error("spindle: submit_to outside a loop_group's loop (other threads: loop::post)");
    if (target >= me->group().size())
        throw std::out_of_range("spindle: submit_to: no loop " + std::to_string(target) + " in a group of " +
                                std::to_string(me->group().size()));
    return me->group().between(me->index(), static_cast<std::uint32_t>(target));
}

void note_sent(std::uint32_t to) noexcept {
    // Called on the sending loop's thread, inside its tick: it has a member.
    // note_sent allocates nothing: the dirty lists were sized for the group.
    current_member()->note_sent(to);
}

void post_remote_cancel(link& l, std::uint32_t slot, std::uint32_t generation) noexcept {
    group_member* me = current_member();
    if (!me || me->group().closing()) return;  // the group is going: nothing to cancel for
    loop_core* callee = me->group().member(l.m_to).core();
    if (!callee) return;
    try {
        loop_of(*callee).post([&l, slot, generation] {
            remote_slot& r = l.m_running[slot];
            if (r.m_generation == generation && r.m_task.valid())
                r.m_task.cancel();
            else
                r.m_cancel_generation = generation;  // its request is still on the way
        });
    } catch (...) {
        // Out of memory for the post: the callee's task runs to its end.
    }
}

void start_remote(link& l, std::uint32_t slot, std::uint32_t generation, task<void> t) noexcept {
    remote_slot& r = l.m_running[slot];
    try {
        r.m_generation = generation;
        r.m_task = loop::current().spawn(std::move(t), "call from " + std::to_string(l.m_from));
        if (r.m_cancel_generation == generation) r.m_task.cancel();
    } catch (...) {
        // Spawning failed (out of memory): the task, and so its reply, never
        // comes; the caller waits until it is cancelled.
        log_remote_failure();
    }
}

void log_remote_failure() noexcept { log_callback_failure("cross-loop call"); }

// --- the tick's side ---------------------------------------------------------------

void group_member::drain() {
    // Once per tick, at most a ring's capacity from each, so a sender that
    // keeps sending cannot keep this loop in its drain.
    for (std::uint32_t other = 0; other < m_group.size(); ++other) {
        link& in = m_group.between(other, m_index);
        for (std::size_t n = in.m_requests.capacity(); n > 0; --n) {
            ring_cell* cell = in.m_requests.front();
            if (!cell) break;
            header_of(*cell).m_handle(*cell, in, true);
            in.m_requests.pop();
        }
        link& out = m_group.between(m_index, other);
        for (std::size_t n = out.m_replies.capacity(); n > 0; --n) {
            ring_cell* cell = out.m_replies.front();
            if (!cell) break;
            header_of(*cell).m_handle(*cell, out, true);
            out.m_replies.pop();
        }
    }
}

void group_member::discard_mail() noexcept {
    for (std::uint32_t other = 0; other < m_group.size(); ++other) {
        for (spsc_ring* ring : {&m_group.between(other, m_index).m_requests, &m_group.between(m_index, other).m_replies}) {
            link& l = ring == &m_group.between(other, m_index).m_requests ? m_group.between(other, m_index)
                                                                         : m_group.between(m_index, other);
            while (ring_cell* cell = ring->front()) {
                header_of(*cell).m_handle(*cell, l, false);
                ring->pop();
            }
        }
    }
}

void group_member::ring_doorbells() noexcept {
    for (std::uint32_t to : m_dirty) {
        m_dirty_flag[to] = 0;
        group_member& target = m_group.member(to);
        target.ring();
        if (to != m_index && target.m_core) target.m_core->wake_if_sleeping();
    }
    m_dirty.clear();
}

}  // namespace detail

// --- the public face ---------------------------------------------------------------

loop_group::loop_group(loop_group_options options)
    : m_core(std::make_unique<detail::group_core>(*this, std::move(options))) {}

loop_group::~loop_group() = default;

std::size_t loop_group::size() const noexcept { return m_core->size(); }
const loop_group_options& loop_group::options() const noexcept { return m_core->options(); }
int loop_group::run_erased(std::function<task<int>(std::stop_token)> main) { return m_core->run(main); }
void loop_group::stop() noexcept { m_core->stop(); }
loop& loop_group::at(std::size_t index) { return m_core->at(index); }

loop_group* loop_group::current_or_null() noexcept {
    detail::group_member* me = detail::current_member();
    return me ? &me->group().owner() : nullptr;
}

loop_group& loop_group::current() {
    loop_group* g = current_or_null();
    if (!g) throw std::logic_error("spindle: no loop_group's loop runs on this thread");
    return *g;
}

std::size_t loop_group::current_index() {
    detail::group_member* me = detail::current_member();
    if (!me) throw std::logic_error("spindle: no loop_group's loop runs on this thread");
    return me->index();
}

}  // namespace spindle
