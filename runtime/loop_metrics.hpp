#pragma once
// A loop's counters and gauges, as its own thread keeps them: each written by
// that thread only (remote_wakeups aside), so a scrape from any thread reads
// them without stopping the loop (loop::metrics, runtime/metrics.cpp).

#include "relaxed.hpp"

#include <spindle/metrics.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <unordered_map>

namespace spindle::detail {

struct loop_counters {
    relaxed<std::uint64_t> ticks;
    relaxed<std::int64_t> busy_ns;
    relaxed<std::int64_t> wait_ns;
    relaxed<std::uint64_t> tasks_finished;
    relaxed<std::uint64_t> tasks_failed;
    relaxed<std::uint64_t> resumes;
    relaxed<std::uint64_t> polls;
    relaxed<std::uint64_t> sleeps;
    relaxed<std::uint64_t> completions;
    relaxed<std::uint64_t> timers_fired;
    relaxed<std::uint64_t> accept_backoffs;
    relaxed<std::uint64_t> stalls;
    relaxed<std::uint64_t> ready_depth;
    mutable relaxed<std::uint64_t> ready_depth_max;  // a snapshot resets it
    /// Counted by the threads that send the wake-up.
    std::atomic<std::uint64_t> remote_wakeups{0};
    std::array<relaxed<std::int64_t>, io_kind_count> io_in_flight;
    // loop_options::task_run_histogram
    std::array<relaxed<std::uint64_t>, run_time_buckets> run_counts;
    relaxed<std::int64_t> run_total_ns;
    relaxed<std::int64_t> run_max_ns;
};

/// The histogram bucket of a resume that took `ns`.
inline std::size_t run_time_bucket(std::int64_t ns) noexcept {
    const auto us = static_cast<std::uint64_t>(ns < 0 ? 0 : ns) / 1000;
    const std::size_t b = us == 0 ? 0 : static_cast<std::size_t>(64 - __builtin_clzll(us));
    return b < run_time_buckets ? b : run_time_buckets - 1;
}

struct task_header;

/// loop_options::task_run_histogram: how long each resume took, for the loop
/// (in its counters) and for each live task, kept beside the tasks so that a
/// task header costs no more without it.
class run_time_table {
public:
    explicit run_time_table(loop_counters& counters) noexcept : m_counters(counters) {}

    /// The histogram of `t`, made if needed: found before a resume, since
    /// afterwards `t` (and its entry) may be gone.
    run_time_histogram* of(const task_header& t) { return &m_by_task[&t]; }
    const run_time_histogram* find(const task_header& t) const noexcept {
        auto it = m_by_task.find(&t);
        return it == m_by_task.end() ? nullptr : &it->second;
    }
    void erase(const task_header& t) noexcept { m_by_task.erase(&t); }
    void clear() noexcept { m_by_task.clear(); }

    /// A resume took `ran` ns; `own` is its task's histogram, or null when
    /// the task finished in that resume (its histogram went with it).
    void record(run_time_histogram* own, std::int64_t ran) noexcept {
        const std::size_t bucket = run_time_bucket(ran);
        ++m_counters.run_counts[bucket];
        m_counters.run_total_ns.add(ran);
        if (ran > m_counters.run_max_ns.load()) m_counters.run_max_ns = ran;
        if (own) {
            ++own->counts[bucket];
            own->total += std::chrono::nanoseconds(ran);
            own->max = std::max(own->max, std::chrono::nanoseconds(ran));
        }
    }

private:
    loop_counters& m_counters;
    std::unordered_map<const task_header*, run_time_histogram> m_by_task;
};

}  // namespace spindle::detail
