// The offload pool: a queue per job kind under one mutex, threads started
// as jobs need them (up to max_threads) and ended after idle_timeout.
//
// A job's answer goes back to its loop as a post of the job itself (the job
// is a post_node: no allocation for the answer). It is posted under the
// pool's mutex, and only while a wait is attached: the wait detaches under
// the same mutex (cancel, or its frame destroyed before the loop goes), so
// a post never reaches a loop that is gone. A posted answer whose wait
// detached meanwhile is dropped by the loop; one the loop never runs (the
// loop destroyed first) is dropped by its destruction.

#include <spindle/offload.hpp>

#include <spindle/loop.hpp>

#include "loop_core.hpp"
#include "spin_gauge.hpp"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

namespace spindle {

namespace detail {

namespace {

// Loop thread: the loop no longer waits for this job's answer.
void end_answer(offload_job& job) noexcept {
    if (std::exchange(job.m_answer_due, false)) job.m_core->inbox().answer_ended();
}

struct job_list {
    offload_job* head = nullptr;
    offload_job* tail = nullptr;
    std::size_t size = 0;

    void push_back(offload_job& j) noexcept {
        j.m_queue_prev = tail;
        j.m_queue_next = nullptr;
        (tail ? tail->m_queue_next : head) = &j;
        tail = &j;
        ++size;
    }
    void remove(offload_job& j) noexcept {
        (j.m_queue_prev ? j.m_queue_prev->m_queue_next : head) = j.m_queue_next;
        (j.m_queue_next ? j.m_queue_next->m_queue_prev : tail) = j.m_queue_prev;
        j.m_queue_prev = j.m_queue_next = nullptr;
        --size;
    }
    offload_job* pop_front() noexcept {
        offload_job* j = head;
        if (j) remove(*j);
        return j;
    }
};

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

void name_this_thread() noexcept {
#if defined(__APPLE__)
    pthread_setname_np("spindle-offload");
#else
    pthread_setname_np(pthread_self(), "spindle-offload");
#endif
}

std::size_t bucket_of(std::chrono::nanoseconds d) noexcept {
    const auto us = static_cast<std::uint64_t>(std::max<std::int64_t>(d.count(), 0) / 1000);
    // Bucket i holds durations shorter than 2^i µs.
    const std::size_t b = static_cast<std::size_t>(std::bit_width(us));
    return std::min(b, run_time_buckets - 1);
}

}  // namespace

class pool_state : public std::enable_shared_from_this<pool_state> {
public:
    explicit pool_state(const offload_pool_options& options) : m_options(options) {
        if (m_options.max_threads == 0) m_options.max_threads = 64;
        const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
        // A core is left to the loops: with every core computing, a loop's
        // answer waited for a computing thread's slice (4-5 ms at p99).
        if (m_options.cpu_threads == 0) m_options.cpu_threads = std::max(1u, cores - 1);
        if (m_options.lookup_threads == 0) m_options.lookup_threads = (m_options.max_threads + 1) / 2;
        m_options.cpu_threads = std::min(m_options.cpu_threads, m_options.max_threads);
        m_options.lookup_threads = std::min(m_options.lookup_threads, m_options.max_threads);
        m_options.min_threads = std::min(m_options.min_threads, m_options.max_threads);
        if (m_options.max_queued == 0) m_options.max_queued = 1;
        m_limit[static_cast<std::size_t>(job_kind::cpu)] = m_options.cpu_threads;
        m_limit[static_cast<std::size_t>(job_kind::blocking)] = m_options.max_threads;
        m_limit[static_cast<std::size_t>(job_kind::lookup)] = m_options.lookup_threads;
        m_eager_threads = std::min(m_options.max_threads, std::max(4u, cores));
    }

    const offload_pool_options& options() const noexcept { return m_options; }

    void start_minimum() {
        std::lock_guard lock(m_mutex);
        while (m_threads < m_options.min_threads && start_thread()) {
        }
    }

    /// `w` null: a detached job, which nobody waits for.
    std::error_code submit(offload_job& job, waiter* w, loop_core* core) {
        const auto k = static_cast<std::size_t>(job.m_kind);
        bool wake = false;
        {
            std::lock_guard lock(m_mutex);
            if (m_closed) return make_error_code(errc::pool_closed);
            job.m_pool = shared_from_this();
            job.m_waiter = w;
            job.m_core = core;
            job.m_seq = ++m_seq;
            if (m_queued[k].size < m_options.max_queued) {
                job.m_status = offload_job::status::queued;
                m_queued[k].push_back(job);
                m_queued_hint.fetch_add(1, std::memory_order_release);
            } else {
                job.m_status = offload_job::status::waiting;
                m_waiting[k].push_back(job);
            }
            job.m_refs.fetch_add(1, std::memory_order_relaxed);  // the pool's
            const std::size_t runnable = runnable_jobs();
            // A thread looking for work finds the job without a wake-up; a
            // sleeping one is woken; with neither, a new thread starts,
            // unless one is starting already: it starts the next itself if
            // work is still left then (grow), so a burst of short jobs does
            // not make a thread each.
            wake = runnable > 0 && should_wake();
            if (wake) ++m_waking;
            bool watch = false;
            if (needs_thread(runnable) && (m_starting == 0 || m_threads == 0)) {
                if (!start_thread() && m_threads == 0) {
                    unlink(job);
                    job.m_status = offload_job::status::withdrawn;
                    job.m_refs.fetch_sub(1, std::memory_order_relaxed);
                    return std::make_error_code(std::errc::resource_unavailable_try_again);
                }
            } else if (starved()) {
                // Beyond the eager threads, more start only while the queue
                // makes no progress (blocked jobs): the watcher sees to it.
                if (!m_watching)
                    m_watching = start_thread(&pool_state::watch);
                else
                    watch = true;
            }
            if (watch) m_watch.notify_one();
        }
        if (wake) m_wake.notify_one();
        return {};
    }

    bool cancel(offload_job& job) noexcept {
        bool withdrawn = false;
        {
            std::lock_guard lock(m_mutex);
            switch (job.m_status) {
                case offload_job::status::waiting:
                case offload_job::status::queued:
                    unlink(job);
                    job.m_status = offload_job::status::withdrawn;
                    ++m_jobs_withdrawn;
                    withdrawn = true;
                    break;
                case offload_job::status::running:
                case offload_job::status::posted:
                    if (!job.m_detach_on_cancel) {
                        job.m_cancel_requested = true;
                        return false;
                    }
                    job.m_waiter = nullptr;
                    return true;
                default: return false;
            }
        }
        if (withdrawn) release_job(job);  // the pool's reference
        return true;
    }

    void abandon(offload_job& job) noexcept {
        bool withdrawn = false;
        bool posted = false;
        {
            std::unique_lock lock(m_mutex);
            if (job.m_hold_on_abandon && job.m_status == offload_job::status::running) {
                // It writes into the frame about to go: wait for its end.
                ++m_holding;
                m_job_ended.wait(lock, [&] { return job.m_status != offload_job::status::running; });
                --m_holding;
            }
            job.m_waiter = nullptr;
            if (job.m_status == offload_job::status::waiting || job.m_status == offload_job::status::queued) {
                unlink(job);
                job.m_status = offload_job::status::withdrawn;
                ++m_jobs_withdrawn;
                withdrawn = true;
            }
            posted = job.m_status == offload_job::status::posted;
        }
        if (withdrawn) release_job(job);
        // Its answer may be between push_begin and push_end: the loop, about
        // to go perhaps, must outlive the poster's wake-up.
        if (posted) job.m_core->inbox().wait_for_leavers();
    }

    /// The pool's handle is gone: queued jobs answer pool_closed, threads end
    /// when out of work.
    void close() noexcept {
        job_list dropped;
        {
            std::lock_guard lock(m_mutex);
            m_closed = true;
            for (std::size_t k = 0; k < job_kind_count; ++k) {
                for (job_list* list : {&m_waiting[k], &m_queued[k]}) {
                    while (offload_job* j = list->pop_front()) {
                        if (list == &m_queued[k]) m_queued_hint.fetch_sub(1, std::memory_order_relaxed);
                        j->m_error = make_error_code(errc::pool_closed);
                        loop_core* wake = nullptr;
                        if (answer(*j, wake))
                            wake->inbox().push_end();  // rare: under the mutex
                        else
                            dropped.push_back(*j);
                    }
                }
            }
        }
        m_wake.notify_all();
        m_watch.notify_all();
        while (offload_job* j = dropped.pop_front()) release_job(*j);
    }

    offload_stats stats() const {
        std::lock_guard lock(m_mutex);
        offload_stats s;
        s.threads = m_threads;
        s.busy = m_busy;
        for (std::size_t k = 0; k < job_kind_count; ++k) {
            s.queued[k] = m_queued[k].size;
            s.waiting[k] = m_waiting[k].size;
            s.running[k] = m_running[k];
        }
        s.jobs_run = m_jobs_run;
        s.jobs_withdrawn = m_jobs_withdrawn;
        s.has_job_times = m_options.job_time_histogram;
        s.job_times = m_job_times;
        return s;
    }

private:
    // --- under m_mutex

    std::size_t runnable_jobs() const noexcept {
        std::size_t n = 0;
        for (std::size_t k = 0; k < job_kind_count; ++k)
            if (m_running[k] < m_limit[k]) n += std::min<std::size_t>(m_queued[k].size, m_limit[k] - m_running[k]);
        return n;
    }

    void unlink(offload_job& job) noexcept {
        const auto k = static_cast<std::size_t>(job.m_kind);
        if (job.m_status == offload_job::status::queued) {
            m_queued[k].remove(job);
            m_queued_hint.fetch_sub(1, std::memory_order_relaxed);
            admit(k);
        } else {
            m_waiting[k].remove(job);
        }
    }

    /// Room in kind k's queue: the first caller waiting beyond it moves in.
    void admit(std::size_t k) noexcept {
        while (m_queued[k].size < m_options.max_queued && m_waiting[k].head) {
            offload_job* j = m_waiting[k].pop_front();
            j->m_status = offload_job::status::queued;
            m_queued[k].push_back(*j);
            m_queued_hint.fetch_add(1, std::memory_order_release);
        }
    }

    /// The oldest job whose kind is under its limit.
    offload_job* pick() noexcept {
        offload_job* best = nullptr;
        for (std::size_t k = 0; k < job_kind_count; ++k) {
            offload_job* j = m_queued[k].head;
            if (j && m_running[k] < m_limit[k] && (!best || j->m_seq < best->m_seq)) best = j;
        }
        if (!best) return nullptr;
        const auto k = static_cast<std::size_t>(best->m_kind);
        m_queued[k].remove(*best);
        m_queued_hint.fetch_sub(1, std::memory_order_relaxed);
        admit(k);
        ++m_picked;
        best->m_status = offload_job::status::running;
        ++m_running[k];
        ++m_busy;
        return best;
    }

    /// Sends a finished (or closed) job's answer to its wait. False: nobody
    /// waits, and the caller drops the pool's reference after the lock.
    /// Under the mutex. The answer is in the loop's queue when this returns
    /// true, and `wake` is the loop to call push_end() on once the mutex is
    /// released: the wake-up's system call is made outside it.
    bool answer(offload_job& job, loop_core*& wake) noexcept {
        if (!job.m_waiter) {
            job.m_status = offload_job::status::dropped;
            return false;
        }
        job.m_status = offload_job::status::posted;
        job.m_call = &deliver;
        // The wait is attached, so its frame and loop are alive: the loop
        // destroys its frames (which detach under this mutex, and wait for
        // push_end in abandon) before it goes.
        // Once pushed, the job may be run and freed on its loop: read first.
        wake = job.m_core;
        wake->inbox().push_begin(&job);  // hands the pool's reference to the post
        return true;
    }

    /// On the loop's thread (run), or at its destruction (not run).
    static void deliver(post_node* node, bool run) noexcept {
        auto& job = static_cast<offload_job&>(*node);
        end_answer(job);
        if (run && job.m_waiter) {
            waiter* w = std::exchange(job.m_waiter, nullptr);
            if (job.m_cancel_requested)
                w->complete_cancelled();
            else
                w->complete();
        }
        release_job(job);
    }

    /// A sleeping thread should be woken for a job: none is looking for work
    /// (spinning), and none woken already is on its way. Waking one per job
    /// cost a burst of short jobs more than it gained: 16 empty jobs in
    /// flight took 9-12 us each against 2 us when one thread drained them.
    bool should_wake() const noexcept { return m_sleeping > 0 && m_spinning == 0 && m_waking == 0; }

    /// Starts a thread with every signal blocked (it inherits the mask): a
    /// worker, or the watcher.
    bool start_thread(void (pool_state::*body)() noexcept = &pool_state::work) noexcept {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        bool started = true;
        try {
            std::thread([self = shared_from_this(), body] { ((*self).*body)(); }).detach();
            if (body == &pool_state::work) {
                ++m_threads;
                ++m_starting;
            }
        } catch (...) {
            started = false;
        }
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
        return started;
    }

    /// More threads would run jobs now waiting for one: at once up to the
    /// eager threads (at least one per core).
    bool needs_thread(std::size_t runnable) const noexcept {
        return runnable > m_sleeping + m_spinning + m_starting && m_threads < m_eager_threads;
    }
    /// Jobs wait, no thread is free, and the pool may grow.
    bool starved() const noexcept {
        return runnable_jobs() > m_sleeping + m_spinning + m_starting && m_threads < m_options.max_threads;
    }

    /// Past the eager threads, one thread more each grow_after while jobs
    /// wait and none was taken meanwhile: threads blocked in their calls (a
    /// slow disk) get company, while short jobs that drain the queue (reads
    /// from the page cache) keep the pool small, since 64 threads on two
    /// cores cost more in switches than they give.
    void watch() noexcept {
        name_this_thread();
        std::unique_lock lock(m_mutex);
        for (;;) {
            m_watch.wait(lock, [&] { return m_closed || starved(); });
            if (m_closed) break;
            const std::uint64_t picked = m_picked;
            m_watch.wait_for(lock, grow_after, [&] { return m_closed; });
            if (m_closed) break;
            if (starved() && m_picked == picked) start_thread();
        }
        m_watching = false;
    }

    void work() noexcept {
        name_this_thread();
        std::unique_lock lock(m_mutex);
        --m_starting;
        if (needs_thread(runnable_jobs())) start_thread();  // grow one thread at a time
        bool just_worked = false;
        spin_gauge gauge;  // jobs that come rarer than the spin lasts: sleep at once
        for (;;) {
            if (offload_job* job = pick()) {
                // More work: the next thread is woken now, by the one that
                // took a job (so a burst wakes threads one after another, as
                // fast as they find work, not one per job).
                const bool wake_next = runnable_jobs() > 0 && should_wake();
                if (wake_next) ++m_waking;
                lock.unlock();
                if (wake_next) m_wake.notify_one();
                run(*job);
                lock.lock();
                just_worked = true;
                continue;
            }
            if (m_closed) break;
            if (std::exchange(just_worked, false) && m_options.spin_before_sleep.count() > 0 &&
                m_spinning < m_max_spinning && gauge.should_spin()) {
                // Look for work a while before sleeping: a job that comes
                // meanwhile starts without a wake-up (a futex call each way).
                // Fewer spinners than cores: the loops need theirs.
                ++m_spinning;
                lock.unlock();
                const auto until = clock::now() + m_options.spin_before_sleep;
                for (unsigned i = 1;; ++i) {
                    if (m_queued_hint.load(std::memory_order_acquire) > 0) {
                        gauge.found();
                        break;
                    }
                    cpu_relax();
                    if (i % 64 == 0 && clock::now() >= until) {
                        gauge.ran_out();
                        break;
                    }
                }
                lock.lock();
                --m_spinning;
                continue;
            }
            ++m_sleeping;
            const bool woken = sleep(lock);
            --m_sleeping;
            if (!woken && m_threads > m_options.min_threads) break;
        }
        --m_threads;
    }

    /// Waits for work up to idle_timeout; false when none came. Every return
    /// from the wait takes one off m_waking: the notified thread's own, or
    /// (a spurious or timed-out return) one whose notify found no thread
    /// blocked. Either way that thread looks at the queue next, so no job
    /// is left behind a wake counted but never delivered.
    bool sleep(std::unique_lock<std::mutex>& lock) noexcept {
        const auto deadline = clock::now() + m_options.idle_timeout;
        for (;;) {
            if (m_closed || runnable_jobs() > 0) return true;
            const bool timed_out = m_wake.wait_until(lock, deadline) == std::cv_status::timeout;
            if (m_waking > 0) --m_waking;
            if (timed_out) return m_closed || runnable_jobs() > 0;
        }
    }

    void run(offload_job& job) noexcept {
        const bool timed = m_options.job_time_histogram;
        const auto start = timed ? clock::now() : clock::time_point{};
        job.m_run(job);
        const auto took = timed ? clock::now() - start : clock::duration{};
        bool dropped;
        loop_core* wake = nullptr;
        {
            std::lock_guard lock(m_mutex);
            const auto k = static_cast<std::size_t>(job.m_kind);
            --m_running[k];
            ++m_jobs_run;
            if (timed) {
                const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(took);
                ++m_job_times.counts[bucket_of(ns)];
                m_job_times.total += ns;
                m_job_times.max = std::max(m_job_times.max, ns);
            }
            dropped = !answer(job, wake);
            if (!dropped) --m_busy;
            if (m_holding > 0) m_job_ended.notify_all();
        }
        if (wake) wake->inbox().push_end();
        if (!dropped) return;
        // Nobody waits: the value (and what it owns) is destroyed here, and
        // the thread counts as busy until it is gone.
        release_job(job);
        std::lock_guard lock(m_mutex);
        --m_busy;
    }

    using clock = std::chrono::steady_clock;

    offload_pool_options m_options;
    std::array<unsigned, job_kind_count> m_limit{};

    mutable std::mutex m_mutex;
    std::condition_variable m_wake;
    std::array<job_list, job_kind_count> m_queued;
    std::array<job_list, job_kind_count> m_waiting;
    std::array<unsigned, job_kind_count> m_running{};
    unsigned m_threads = 0;
    unsigned m_busy = 0;
    unsigned m_sleeping = 0;
    unsigned m_spinning = 0;
    unsigned m_waking = 0;    // threads notified that have not left their wait yet
    unsigned m_starting = 0;  // threads made that have not taken the lock yet
    unsigned m_eager_threads = 4;
    std::uint64_t m_picked = 0;  // jobs taken by a thread, ever
    bool m_watching = false;     // the watcher thread runs
    std::condition_variable m_watch;
    static constexpr auto grow_after = std::chrono::microseconds(500);
    unsigned m_max_spinning = std::max(2u, std::thread::hardware_concurrency()) - 1;
    std::uint64_t m_seq = 0;
    std::uint64_t m_jobs_run = 0;
    std::uint64_t m_jobs_withdrawn = 0;
    run_time_histogram m_job_times;
    bool m_closed = false;
    unsigned m_holding = 0;  // frames waiting for their running job to end
    std::condition_variable m_job_ended;
    // Jobs queued, for spinning threads to read without the mutex.
    std::atomic<std::size_t> m_queued_hint{0};
};

}  // namespace detail

detail::pool_state& pool_of(offload_pool* pool) noexcept { return *(pool ? pool : &offload_pool::shared())->m_state; }

namespace detail {

std::error_code submit_job(offload_pool* pool, offload_job& job, waiter& w, loop_core& core) {
    std::error_code ec = pool_of(pool).submit(job, &w, &core);
    // The answer is posted on this thread's loop, so it cannot run before
    // this: it is counted due first.
    if (!ec && core.inbox().spins_for_answers()) {
        job.m_answer_due = true;
        core.inbox().expect_answer(now_real_ns());
    }
    return ec;
}

bool submit_detached(offload_pool* pool, offload_job& job) noexcept {
    try {
        return !pool_of(pool).submit(job, nullptr, nullptr);
    } catch (...) {
        return false;  // the shared pool could not be made
    }
}

bool cancel_job(offload_job& job) noexcept {
    if (!job.m_pool || !job.m_pool->cancel(job)) return false;
    end_answer(job);  // withdrawn, or detached from: no answer comes
    return true;
}

void abandon_job(offload_job& job) noexcept {
    if (!job.m_pool) return;
    job.m_pool->abandon(job);
    end_answer(job);
}

}  // namespace detail

std::string_view to_string(job_kind kind) noexcept {
    switch (kind) {
        case job_kind::cpu: return "cpu";
        case job_kind::blocking: return "blocking";
        case job_kind::lookup: return "lookup";
    }
    return "unknown";
}

namespace {

struct shared_pool_setup {
    std::mutex mutex;
    offload_pool_options options;
    std::atomic<offload_pool*> pool{nullptr};
};

shared_pool_setup& shared_setup() {
    // Never destroyed: pool threads may still use the pool while the
    // process's statics go.
    static auto* setup = new shared_pool_setup;
    return *setup;
}

}  // namespace

offload_pool::offload_pool(offload_pool_options options) : m_state(std::make_shared<detail::pool_state>(options)) {
    m_state->start_minimum();
}

offload_pool::~offload_pool() { m_state->close(); }

offload_pool& offload_pool::shared() {
    static shared_pool_setup& s = shared_setup();
    if (offload_pool* p = s.pool.load(std::memory_order_acquire)) return *p;
    std::lock_guard lock(s.mutex);
    if (!s.pool.load(std::memory_order_relaxed))
        s.pool.store(new offload_pool(s.options), std::memory_order_release);  // never destroyed
    return *s.pool.load(std::memory_order_relaxed);
}

bool offload_pool::configure_shared(const offload_pool_options& options) {
    shared_pool_setup& s = shared_setup();
    std::lock_guard lock(s.mutex);
    if (s.pool.load(std::memory_order_relaxed)) return false;
    s.options = options;
    return true;
}

offload_stats offload_pool::stats() const { return m_state->stats(); }

const offload_pool_options& offload_pool::options() const noexcept { return m_state->options(); }

}  // namespace spindle
