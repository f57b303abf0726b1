#pragma once
/// What a loop has done and what it holds now: loop::metrics() takes a
/// snapshot, any thread, at any time. Counters only grow; gauges say how
/// things stand. docs/observability.md gives each one's meaning.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace spindle {

/// The kinds of descriptor operation a loop counts in flight.
enum class io_kind : std::uint8_t {
    read,   ///< read, readv, recv, recvmsg
    write,  ///< write, writev, send, sendmsg
    accept,
    connect,
    poll,  ///< readiness waits, watchers included
    file,  ///< file operations (spindle/file.hpp), on the ring or the offload pool
};
inline constexpr std::size_t io_kind_count = 6;
std::string_view to_string(io_kind kind) noexcept;

/// Resume durations in powers of two: bucket i counts resumes that took
/// less than 2^i microseconds (bucket 0: under 1 µs), the last one the rest.
inline constexpr std::size_t run_time_buckets = 16;
struct run_time_histogram {
    std::array<std::uint64_t, run_time_buckets> counts{};
    std::chrono::nanoseconds total{0};
    std::chrono::nanoseconds max{0};
    /// The upper bound of bucket i, exclusive (the last: none).
    static constexpr std::chrono::nanoseconds upper_bound(std::size_t i) noexcept {
        return std::chrono::microseconds(std::int64_t{1} << i);
    }
};

struct loop_metrics {
    // --- counters
    /// Ticks run.
    std::uint64_t ticks = 0;
    /// Time awake inside run(), block_on() or run_once(), resuming tasks and
    /// running callbacks; time spent blocked in the OS poller is wait_time.
    std::chrono::nanoseconds busy_time{0};
    std::chrono::nanoseconds wait_time{0};
    std::uint64_t tasks_spawned = 0;
    /// Tasks that ended, whichever way (returned, threw or were aborted).
    std::uint64_t tasks_finished = 0;
    /// Of those, tasks that ended with an exception.
    std::uint64_t tasks_failed = 0;
    /// Times a task was resumed by the loop.
    std::uint64_t resumes = 0;
    /// Looks at the OS (each a poll of the backend), and how many of those
    /// blocked (the loop slept until I/O, a timer or a wake-up).
    std::uint64_t polls = 0;
    std::uint64_t sleeps = 0;
    /// Operations the OS completed, as the polls returned them.
    std::uint64_t completions = 0;
    std::uint64_t timers_fired = 0;
    /// Callbacks posted to the loop (loop::post, from any thread) and run.
    std::uint64_t posts = 0;
    /// Wake-ups another thread sent to a sleeping loop (a post, stop(), the
    /// end of a hold, a loop group's call).
    std::uint64_t remote_wakeups = 0;
    /// Accepts that met EMFILE, ENFILE, ENOBUFS or ENOMEM and backed off.
    std::uint64_t accept_backoffs = 0;
    /// Resumes that ran longer than loop_options::stall_threshold.
    std::uint64_t stalls = 0;

    // --- gauges
    std::uint64_t tasks_alive = 0;
    /// Tasks the last tick resumed (the ready queue's depth when it began),
    /// and the deepest since the previous snapshot.
    std::uint64_t ready_depth = 0;
    std::uint64_t ready_depth_max = 0;
    /// Descriptor operations submitted and not completed yet, by io_kind.
    std::array<std::uint64_t, io_kind_count> io_in_flight{};
    std::uint64_t timers_pending = 0;
    /// Buffers of borrowed reads (loop_options::read_buffer_size each) the
    /// loop has mapped, and of those the ones lent now: to a read that
    /// completed, or to the task holding its borrowed_buffer. The loop keeps
    /// what it mapped, so read_buffers is the most ever lent at once,
    /// rounded up to the 16 a mapping makes.
    std::uint64_t read_buffers = 0;
    std::uint64_t read_buffers_lent = 0;

    /// With loop_options::task_run_histogram: every resume's duration.
    bool has_run_times = false;
    run_time_histogram run_times;

    /// busy / (busy + wait): 0 for a loop that only slept, 1 for one that never did.
    double utilisation() const noexcept {
        const auto all = busy_time + wait_time;
        return all.count() == 0 ? 0.0 : static_cast<double>(busy_time.count()) / static_cast<double>(all.count());
    }
};

/// Several loops' snapshots as one (a loop group's): counters, gauges and
/// histograms added up, ready_depth_max and the longest resume the largest.
loop_metrics total(std::span<const loop_metrics> loops) noexcept;

/// The snapshot in the Prometheus text exposition format (version 0.0.4):
/// a HELP and a TYPE line per metric, counters ending in `_total`, times in
/// seconds, names prefixed `spindle_`.
std::string to_prometheus(const loop_metrics& m);
/// Several loops' snapshots (a loop group's, loop i at index i), each
/// sample labelled loop="i", under one HELP and TYPE line per metric.
std::string to_prometheus(std::span<const loop_metrics> loops);

/// For an accept loop of your own (spindle::net's listeners do this): an
/// accept on the running loop met EMFILE, ENFILE, ENOBUFS or ENOMEM and backs
/// off. Counts in its loop_metrics::accept_backoffs; nothing outside a loop.
void count_accept_backoff() noexcept;

}  // namespace spindle
