#pragma once
/// offload: runs a callable on a pool of threads, away from every loop, and
/// resumes the awaiting task on its own loop with what the callable gave.
///
///     auto hash = [&body] { return sha256(body); };
///     spindle::result<digest> d = co_await spindle::offload(hash, token);
///
/// The answer is a result<T>: T is what the callable returns (a callable
/// that returns result<U> answers result<U>, a void one result<void>). Its
/// error is operation_canceled for a cancelled wait, errc::pool_closed for a
/// pool destroyed before the job ran, or the OS error when no thread could
/// start. An exception thrown by the callable is thrown again by the await.
///
/// Jobs are of a kind (job_options::kind), each with its own limit of
/// threads, so that file reads never queue behind long hashes: cpu (at most
/// one thread per core but one), blocking (every thread) and lookup (name
/// resolution, at most half the threads, so slow DNS cannot starve files).
///
/// The rules, and why (docs/offload.md):
/// - Cancelling a job not started yet withdraws it at once. A started job
///   runs to its end, and the wait goes on until then: the callable may hold
///   references into the task's frame. With job_options::detach_on_cancel
///   (for a callable that owns what it uses) the wait ends at once instead.
///   Either way a value the job makes for a wait that gave up is destroyed
///   (a descriptor it owns is closed).
/// - Destroying a loop never waits for a job: the job's answer finds nobody
///   and is dropped, its value destroyed. A callable that a loop's
///   destruction may outlive must therefore own what it uses.
/// - The threads are detached and never joined, so a job stuck in a
///   blocking call does not hold the process's exit. They block every signal
///   (a SIGTERM goes to the loops' threads) and are named "spindle-offload".
/// - A kind's queue holds at most offload_pool_options::max_queued jobs;
///   beyond, callers wait their turn in order, parked like any wait.

#include <spindle/detail/post_node.hpp>
#include <spindle/errc.hpp>
#include <spindle/metrics.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

namespace spindle {

enum class job_kind : std::uint8_t {
    cpu,       ///< computing: hashing, compressing, parsing
    blocking,  ///< blocking calls: files, a C library's blocking API
    lookup,    ///< name resolution
};
inline constexpr std::size_t job_kind_count = 3;
std::string_view to_string(job_kind kind) noexcept;

struct offload_pool_options {
    /// Threads kept even when idle.
    unsigned min_threads = 0;
    /// Threads at most, all kinds together. 0: 64.
    unsigned max_threads = 0;
    /// Threads running cpu jobs at most. 0: one per core but one, so that a
    /// core stays for the loops (at least one, at most max_threads).
    unsigned cpu_threads = 0;
    /// Threads running lookups at most. 0: half of max_threads, rounded up.
    unsigned lookup_threads = 0;
    /// A thread idle this long ends (down to min_threads).
    std::chrono::nanoseconds idle_timeout = std::chrono::seconds(10);
    /// Jobs queued per kind at most; callers beyond wait in order.
    std::size_t max_queued = 1024;
    /// A thread out of work looks for more this long before it sleeps: a
    /// job that comes meanwhile starts without a wake-up. 0: sleeps at once.
    std::chrono::nanoseconds spin_before_sleep = std::chrono::microseconds(50);
    /// Times every job into offload_stats::job_times. Off by default.
    bool job_time_histogram = false;
};

/// A snapshot of a pool.
struct offload_stats {
    std::size_t threads = 0;
    /// Threads running a job now (or releasing the value nobody waits for).
    std::size_t busy = 0;
    /// Per kind: jobs in the queue, callers waiting beyond max_queued, and
    /// jobs running.
    std::array<std::size_t, job_kind_count> queued{};
    std::array<std::size_t, job_kind_count> waiting{};
    std::array<std::size_t, job_kind_count> running{};
    /// Jobs that ran to their end, and jobs withdrawn before they started.
    std::uint64_t jobs_run = 0;
    std::uint64_t jobs_withdrawn = 0;
    /// With offload_pool_options::job_time_histogram: how long jobs ran.
    bool has_job_times = false;
    run_time_histogram job_times;
};

/// The snapshot in the Prometheus text format, as to_prometheus of a loop's
/// metrics (names prefixed `spindle_offload_`).
std::string to_prometheus(const offload_stats& stats);

namespace detail {
class pool_state;
}

class offload_pool {
public:
    explicit offload_pool(offload_pool_options options = {});
    /// Does not wait for running jobs (their threads end after them); a job
    /// still queued answers errc::pool_closed.
    ~offload_pool();
    offload_pool(const offload_pool&) = delete;
    offload_pool& operator=(const offload_pool&) = delete;

    /// The process's pool, shared by every loop: started on first use and
    /// never destroyed (its threads may outlive main).
    static offload_pool& shared();
    /// Sets the shared pool's options; false (nothing changed) once it has
    /// started.
    static bool configure_shared(const offload_pool_options& options);

    offload_stats stats() const;
    /// The options, with the defaults filled in.
    const offload_pool_options& options() const noexcept;

private:
    friend detail::pool_state& pool_of(offload_pool*) noexcept;
    std::shared_ptr<detail::pool_state> m_state;
};

struct job_options {
    job_kind kind = job_kind::blocking;
    /// A cancelled wait ends at once even when the job has started; the job
    /// then runs on alone, so it must own what it uses.
    bool detach_on_cancel = false;
    /// nullptr: offload_pool::shared().
    offload_pool* pool = nullptr;
};

namespace detail {

class loop_core;

/// One job, shared by its wait (on the loop) and the pool; freed by
/// whichever lets go last. The pool's mutex guards the queue links, the
/// status and m_waiter until the answer is posted; from then on only the
/// loop's thread touches them.
struct offload_job : post_node {
    enum class status : std::uint8_t { waiting, queued, running, posted, withdrawn, dropped };

    offload_job* m_queue_prev = nullptr;
    offload_job* m_queue_next = nullptr;
    std::shared_ptr<pool_state> m_pool;
    loop_core* m_core = nullptr;
    waiter* m_waiter = nullptr;
    std::error_code m_error;  // the pool's own failure (closed, no thread)
    std::uint64_t m_seq = 0;
    std::atomic<std::uint32_t> m_refs{1};
    status m_status = status::waiting;
    job_kind m_kind = job_kind::blocking;
    bool m_detach_on_cancel = false;
    bool m_cancel_requested = false;
    /// The loop counts this job's answer as due (loop_options::answer_spin);
    /// written on the loop's thread only.
    bool m_answer_due = false;
    /// The job writes into its wait's frame (a file read's buffer): a frame
    /// destroyed while it runs waits for it to end (abandon_job).
    bool m_hold_on_abandon = false;
    /// Runs the callable on a pool thread, keeps its outcome, destroys it.
    void (*m_run)(offload_job&) noexcept = nullptr;
    void (*m_delete)(offload_job&) noexcept = nullptr;
};

/// Loop thread: hands `job` to `pool` for `w`; an error when it cannot run.
std::error_code submit_job(offload_pool* pool, offload_job& job, waiter& w, loop_core& core);
/// Loop thread: the wait is cancelled. True: the wait ends now (the job was
/// withdrawn, or detached from); false: it ends with the job.
bool cancel_job(offload_job& job) noexcept;
/// Loop thread: the wait's frame goes. Returns at once, unless the job is
/// running and holds its frame (m_hold_on_abandon): then when it ends.
void abandon_job(offload_job& job) noexcept;
/// Any thread: runs `job` with nobody waiting for it (a close in the
/// background). False: the pool is closed or has no thread, and the caller
/// keeps the job.
bool submit_detached(offload_pool* pool, offload_job& job) noexcept;

inline void release_job(offload_job& job) noexcept {
    if (job.m_refs.fetch_sub(1, std::memory_order_acq_rel) == 1) job.m_delete(job);
}

template <class V>
struct offload_answer {
    using type = result<V>;
};
template <class U>
struct offload_answer<result<U>> {
    using type = result<U>;
};

template <class F>
struct job_of final : offload_job {
    using value_type = std::invoke_result_t<F&&>;
    static_assert(!std::is_reference_v<value_type>,
                  "spindle::offload: the callable must return a value, not a reference");
    using answer_type = typename offload_answer<value_type>::type;

    explicit job_of(F&& fn) : m_fn(std::move(fn)) {
        m_run = &run;
        m_delete = &destroy;
    }

    static void run(offload_job& job) noexcept {
        auto& self = static_cast<job_of&>(job);
        try {
            if constexpr (std::is_void_v<value_type>) {
                std::invoke(std::move(*self.m_fn));
                self.m_answer.emplace();
            } else {
                self.m_answer.emplace(std::invoke(std::move(*self.m_fn)));
            }
        } catch (...) {
            self.m_exception = std::current_exception();
        }
        self.m_fn.reset();
    }
    static void destroy(offload_job& job) noexcept { delete &static_cast<job_of&>(job); }

    std::optional<F> m_fn;
    std::optional<answer_type> m_answer;
    std::exception_ptr m_exception;
};

template <class F>
class offload_wait : public waiter {
public:
    using answer_type = typename job_of<F>::answer_type;

    offload_wait(F&& fn, const job_options& options) : m_job(new job_of<F>(std::move(fn))), m_pool(options.pool) {
        m_job->m_kind = options.kind;
        m_job->m_detach_on_cancel = options.detach_on_cancel;
    }
    offload_wait(const offload_wait&) = delete;
    ~offload_wait() { release_job(*m_job); }

    void on_park() {
        if (std::error_code ec = submit_job(m_pool, *m_job, *this, core())) {
            m_job->m_error = ec;
            complete();
        }
    }
    void on_cancel() noexcept {
        if (cancel_job(*m_job)) complete_cancelled();
    }
    void on_abandon() noexcept { abandon_job(*m_job); }
    void describe(std::string& out) const {
        out += "offload, ";
        out += to_string(m_job->m_kind);
        out += " job";
    }
    answer_type take() {
        // A value made for a cancelled wait is destroyed with the job.
        if (cancelled()) return cancelled_error();
        if (m_job->m_error) return m_job->m_error;
        if (m_job->m_exception) std::rethrow_exception(m_job->m_exception);
        return std::move(*m_job->m_answer);
    }

private:
    job_of<F>* m_job;
    offload_pool* m_pool;
};

}  // namespace detail

/// Runs `fn()` on a pool thread; answers result<T> on the task's own loop.
/// Cancellable through `token`, with_timeout and the task's cancellation.
template <class F>
[[nodiscard]] parked<detail::offload_wait<std::decay_t<F>>> offload(F&& fn, job_options options,
                                                                    std::stop_token token = {}) {
    return parked<detail::offload_wait<std::decay_t<F>>>(std::move(token), std::decay_t<F>(std::forward<F>(fn)),
                                                         options);
}

template <class F>
[[nodiscard]] parked<detail::offload_wait<std::decay_t<F>>> offload(F&& fn, std::stop_token token = {}) {
    return offload(std::forward<F>(fn), job_options{}, std::move(token));
}

}  // namespace spindle
