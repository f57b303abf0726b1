// The loop group: threads, their loops, the mesh of links between them, and
// the group's stop. The calls between the loops are cross_loop.cpp's.

#include "group_core.hpp"

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
