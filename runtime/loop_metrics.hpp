#pragma once
// A loop's counters and gauges, as its own thread keeps them: each written by
// that thread only (remote_wakeups aside), so a scrape from any thread reads
// them without stopping the loop (loop::metrics, runtime/metrics.cpp).

#include "relaxed.hpp"

#include <spindle/metrics.hpp>

#include <array>
#include <atomic>
#include <cstdint>

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

}  // namespace spindle::detail
