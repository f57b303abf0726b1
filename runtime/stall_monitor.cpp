// The stall monitor's thread (see stall_monitor.hpp). It samples each watched
// loop every quarter of the smallest threshold: a resume seen running with
// the same probe for a whole threshold is flagged, so any resume longer than
// 1.25 thresholds is caught, and none shorter than one threshold is.

#include "stall_monitor.hpp"

#include "loop_core.hpp"

#include <algorithm>
#include <csignal>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <pthread.h>
#include <thread>
#include <vector>

namespace spindle::detail {

namespace {

std::int64_t steady_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

class stall_monitor {
public:
    static stall_monitor& instance() {
        // Never destroyed: its thread outlives main's return, parked.
        static stall_monitor* monitor = new stall_monitor();
        return *monitor;
    }

    void watch(loop_core& core) {
        std::lock_guard lock(m_mutex);
        m_loops.push_back({&core, core.options().stall_threshold.count(), {}, 0, false});
        if (!m_thread_started) {
            // The monitor takes no signal: one meant for the process (SIGTERM
            // that a loop catches through signalfd, say) must not land here,
            // where it would take its default action. The thread starts with
            // every signal blocked, and this thread's mask is put back.
            ::sigset_t all;
            ::sigset_t previous;
            ::sigfillset(&all);
            ::pthread_sigmask(SIG_SETMASK, &all, &previous);
            try {
                std::thread([this] { run(); }).detach();
            } catch (...) {
                ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
                throw;
            }
            ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
            m_thread_started = true;
        }
        m_wake = true;
        m_cv.notify_one();
    }

    void unwatch(loop_core& core) noexcept {
        std::lock_guard lock(m_mutex);
        std::erase_if(m_loops, [&](const watched& w) { return w.core == &core; });
    }

    void wake() noexcept {
        std::lock_guard lock(m_mutex);
        m_wake = true;
        g_stall_monitor_parked.store(false, std::memory_order_relaxed);
        m_cv.notify_one();
    }

private:
    struct watched {
        loop_core* core;
        std::int64_t threshold_ns;
        resume_probe last;
        std::int64_t first_seen_ns;  // when `last` was first seen
        bool flagged;
        // The thread's scheduler totals when `last` was seen running a
        // second time: what it did from then until the flag says whether
        // the task computed, waited for a CPU or blocked.
        bool timed = false;
        std::int64_t timed_at_ns = 0;
        std::int64_t on_cpu_ns = 0;
        std::int64_t waiting_ns = 0;
    };

    void run() {
        std::unique_lock lock(m_mutex);
        int quiet_rounds = 0;
        while (true) {
            if (m_loops.empty() || quiet_rounds >= 2) {
                // Every loop sleeps (or none is watched): so does the monitor,
                // until a loop starts resuming tasks again.
                g_stall_monitor_parked.store(true, std::memory_order_relaxed);
                m_cv.wait(lock, [&] { return m_wake; });
                quiet_rounds = 0;
            }
            m_wake = false;
            if (m_loops.empty()) continue;
            std::int64_t period = std::numeric_limits<std::int64_t>::max();
            for (const watched& w : m_loops) period = std::min(period, w.threshold_ns / 4);
            period = std::clamp<std::int64_t>(period, 1'000'000, 1'000'000'000);
            m_cv.wait_for(lock, std::chrono::nanoseconds(period), [&] { return m_wake; });
            const std::int64_t now = steady_ns();
            bool all_quiet = true;
            for (watched& w : m_loops) {
                const resume_probe p = w.core->probe();
                if (p != w.last) {
                    w.last = p;
                    w.first_seen_ns = now;
                    w.flagged = false;
                    w.timed = false;
                    all_quiet = false;
                    continue;
                }
                if (!p.running) continue;  // asleep or between resumes, unchanged: quiet
                all_quiet = false;
                if (w.flagged) continue;
                const int tid = w.core->stall().thread_id();
                if (!w.timed) {
                    // A resume long enough to be seen twice (rare): only now
                    // is the thread's time read, so short resumes cost nothing.
                    w.timed = tid != 0 && read_thread_time(tid, w.on_cpu_ns, w.waiting_ns);
                    w.timed_at_ns = now;
                }
                if (now - w.first_seen_ns >= w.threshold_ns) {
                    thread_time where;
                    std::int64_t on_cpu = 0;
                    std::int64_t waiting = 0;
                    if (w.timed && read_thread_time(tid, on_cpu, waiting) && now > w.timed_at_ns)
                        where = {now - w.timed_at_ns, on_cpu - w.on_cpu_ns, waiting - w.waiting_ns};
                    w.core->stall().flag(p, w.first_seen_ns, where);
                    w.flagged = true;
                }
            }
            quiet_rounds = all_quiet ? quiet_rounds + 1 : 0;
        }
    }

    std::mutex m_mutex;
    std::condition_variable m_cv;
    std::vector<watched> m_loops;
    bool m_wake = false;
    bool m_thread_started = false;
};

}  // namespace

void watch_for_stalls(loop_core& core) { stall_monitor::instance().watch(core); }
void unwatch_for_stalls(loop_core& core) noexcept { stall_monitor::instance().unwatch(core); }
void wake_stall_monitor() noexcept { stall_monitor::instance().wake(); }

}  // namespace spindle::detail

// --- the loop's side: the finding, named and logged on the loop's thread -----

#include <spindle/log.hpp>

#include <cstdio>
#include <fcntl.h>
#include <string>
#if defined(__linux__)
#include <sys/syscall.h>
#endif
#include <unistd.h>

namespace spindle::detail {

bool read_thread_time(int tid, std::int64_t& on_cpu_ns, std::int64_t& waiting_ns) noexcept {
#if defined(__linux__)
    // "cpu-time run-delay timeslices", in ns (Documentation/scheduler/sched-stats).
    char path[64];
    std::snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char text[128];
    const ssize_t n = ::read(fd, text, sizeof text - 1);
    ::close(fd);
    if (n <= 0) return false;
    text[n] = '\0';
    long long cpu = 0;
    long long delay = 0;
    if (std::sscanf(text, "%lld %lld", &cpu, &delay) != 2) return false;
    on_cpu_ns = cpu;
    waiting_ns = delay;
    return true;
#else
    (void)tid;
    (void)on_cpu_ns;
    (void)waiting_ns;
    return false;
#endif
}

int this_thread_tid() noexcept {
#if defined(__linux__)
    return static_cast<int>(::syscall(SYS_gettid));
#else
    return 0;
#endif
}

void stall_probe::flag(const resume_probe& probe, std::int64_t since_ns, const thread_time& where) noexcept {
    m_epoch.store(probe.epoch, std::memory_order_relaxed);
    m_countdown.store(probe.countdown, std::memory_order_relaxed);
    m_since_ns.store(since_ns, std::memory_order_relaxed);
    std::uint32_t packed = 0;
    if (where.span_ns > 0) {
        const std::int64_t span = where.span_ns;
        const std::int64_t waiting = std::clamp<std::int64_t>(where.waiting_ns, 0, span);
        const std::int64_t on_cpu = std::clamp<std::int64_t>(where.on_cpu_ns, 0, span - waiting);
        const auto pct = [span](std::int64_t ns) { return static_cast<std::uint32_t>(ns * 100 / span); };
        const auto ms = static_cast<std::uint32_t>(std::clamp<std::int64_t>(span / 1'000'000, 1, (1 << 18) - 1));
        packed = ms << 14 | pct(waiting) << 7 | pct(span - waiting - on_cpu);
    }
    m_where.store(packed, std::memory_order_relaxed);
    m_flag.store(true, std::memory_order_release);
    // The countdown is never zero while a resume runs: zero tells the loop,
    // when this resume returns, to look. If the resume has just ended, the
    // exchange fails, or the loop's own store of the next count replaces it
    // (it reads and writes the countdown without a locked instruction): the
    // flag is then found at the next clock check, and not pinned on a task.
    (void)m_pacing.cut_countdown(probe.countdown);
}

void stall_probe::take_flag(const task_header* t, unsigned countdown, bool finishing) noexcept {
    if (!m_flag.exchange(false, std::memory_order_acquire)) return;
    const std::int64_t since = m_since_ns.load(std::memory_order_relaxed);
    ++m_counters.stalls;
    // The resume that just returned (or is finishing its task) is the one
    // flagged when it ran in the flagged epoch with the flagged countdown, or
    // the monitor's zero reached it (in that epoch: a zero that landed late,
    // on the next span, must not name that span's task).
    const bool this_resume = m_epoch.load(std::memory_order_relaxed) == m_pacing.epoch() &&
                             (countdown == 0 || m_countdown.load(std::memory_order_relaxed) == countdown);
    if (!this_resume) {
        // The resume it names ended just as the monitor looked: its task is
        // no longer known here.
        report(nullptr, false, 0, since);
    } else if (finishing) {
        report(t, true, t->m_id, since);
    } else if (!t) {
        // The task finished in this resume, and its header may be gone.
        report(nullptr, true, m_finished_id, since);
    } else {
        report(t, false, t->m_id, since);
    }
}

std::string stall_probe::what_the_thread_did() const {
    // A resume that holds the loop is not always the task's doing: on a
    // machine with more runnable threads than cores, the loop's thread may
    // have spent the time waiting for a CPU; a task that made a blocking
    // call spent it off the CPU without waiting for one. Computing says
    // nothing more.
    const std::uint32_t where = m_where.load(std::memory_order_relaxed);
    const std::uint32_t span_ms = where >> 14;
    const std::uint32_t waiting_pct = where >> 7 & 127;
    const std::uint32_t blocked_pct = where & 127;
    if (span_ms == 0) return {};
    const std::string of = "% of the last " + std::to_string(span_ms) + " ms";
    if (waiting_pct * 3 >= 100)
        return "; its thread waited for a CPU " + std::to_string(waiting_pct) + of +
               " (more runnable threads than cores)";
    if (blocked_pct * 3 >= 100)
        return "; its thread was blocked in a system call " + std::to_string(blocked_pct) + of +
               " (a blocking call on the loop's thread?)";
    return {};
}

void stall_probe::report(const task_header* t, bool finished, std::uint64_t id, std::int64_t since_ns) noexcept {
    try {
        const std::int64_t ms = (now_real_ns() - since_ns) / 1'000'000;
        if (id == 0) {
            logger()->warn("stall: a task ran at least {} ms without suspending, holding up its loop{}", ms,
                           what_the_thread_did());
            return;
        }
        std::string who = "task " + std::to_string(id);
        std::string name;
        if (t) append_task_name(*t, name);
        if (!name.empty()) {
            who += " '";
            who += name;
            who += "'";
        }
        std::string then;
        if (finished) {
            then = "then finished";
        } else if (t && t->m_wait_info && !t->ready_hook().is_linked()) {
            then = "last suspended on ";
            t->m_wait_info->describe(t->m_wait, then);
        } else {
            then = "then yielded";
        }
        logger()->warn("stall: {} ran at least {} ms without suspending, holding up its loop; {}{}", who, ms, then,
                       what_the_thread_did());
    } catch (...) {
        // Logging must never take the loop down.
    }
}

}  // namespace spindle::detail
