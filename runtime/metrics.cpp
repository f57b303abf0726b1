// loop::metrics(): a snapshot of the counters and gauges the loop keeps as it
// runs (loop_metrics.hpp). Read from any thread, without stopping the loop:
// each value is exact as of some moment of the last few ticks, and counters
// never go back.

#include "loop_core.hpp"

#include <spindle/loop.hpp>
#include <spindle/loop_group.hpp>
#include <spindle/metrics.hpp>

#include <algorithm>

namespace spindle {

std::string_view to_string(io_kind kind) noexcept {
    switch (kind) {
        case io_kind::read: return "read";
        case io_kind::write: return "write";
        case io_kind::accept: return "accept";
        case io_kind::connect: return "connect";
        case io_kind::poll: return "poll";
        case io_kind::file: return "file";
    }
    return "unknown";
}

loop_metrics loop::metrics() const noexcept {
    const detail::loop_core& core = *m_core;
    const detail::loop_counters& c = core.counters();
    loop_metrics m;
    m.ticks = c.ticks;
    std::int64_t busy = c.busy_ns;
    // Asked from a task of this loop: the time awake so far counts too.
    if (detail::current_core_or_null() == &core) busy += detail::now_real_ns() - core.awake_since_ns();
    m.busy_time = std::chrono::nanoseconds(busy);
    m.wait_time = std::chrono::nanoseconds(c.wait_ns.load());
    m.tasks_alive = core.task_count();
    m.tasks_spawned = core.tasks_spawned();
    m.tasks_finished = c.tasks_finished;
    m.tasks_failed = c.tasks_failed;
    m.resumes = c.resumes;
    m.polls = c.polls;
    m.sleeps = c.sleeps;
    m.completions = c.completions;
    m.timers_fired = c.timers_fired;
    m.posts = core.posts_run();
    m.remote_wakeups = c.remote_wakeups.load(std::memory_order_relaxed);
    m.accept_backoffs = c.accept_backoffs;
    m.stalls = c.stalls;
    m.ready_depth = c.ready_depth;
    m.ready_depth_max = std::max(c.ready_depth_max.exchange(m.ready_depth), m.ready_depth);
    for (std::size_t k = 0; k < io_kind_count; ++k)
        m.io_in_flight[k] = static_cast<std::uint64_t>(std::max<std::int64_t>(0, c.io_in_flight[k]));
    m.timers_pending = core.timers().size();
    const reactor::read_buffer_counts buffers = core.backend().read_buffers();
    m.read_buffers = buffers.mapped;
    m.read_buffers_lent = buffers.lent;
    if (core.options().task_run_histogram) {
        m.has_run_times = true;
        for (std::size_t b = 0; b < run_time_buckets; ++b) m.run_times.counts[b] = c.run_counts[b];
        m.run_times.total = std::chrono::nanoseconds(c.run_total_ns.load());
        m.run_times.max = std::chrono::nanoseconds(c.run_max_ns.load());
    }
    return m;
}

std::vector<loop_metrics> loop_group::metrics() {
    std::vector<loop_metrics> all;
    all.reserve(size());
    for (std::size_t i = 0; i < size(); ++i) all.push_back(at(i).metrics());
    return all;
}

loop_metrics total(std::span<const loop_metrics> loops) noexcept {
    loop_metrics sum;
    for (const loop_metrics& m : loops) {
        sum.ticks += m.ticks;
        sum.busy_time += m.busy_time;
        sum.wait_time += m.wait_time;
        sum.tasks_spawned += m.tasks_spawned;
        sum.tasks_finished += m.tasks_finished;
        sum.tasks_failed += m.tasks_failed;
        sum.resumes += m.resumes;
        sum.polls += m.polls;
        sum.sleeps += m.sleeps;
        sum.completions += m.completions;
        sum.timers_fired += m.timers_fired;
        sum.posts += m.posts;
        sum.remote_wakeups += m.remote_wakeups;
        sum.accept_backoffs += m.accept_backoffs;
        sum.stalls += m.stalls;
        sum.tasks_alive += m.tasks_alive;
        sum.ready_depth += m.ready_depth;
        sum.ready_depth_max = std::max(sum.ready_depth_max, m.ready_depth_max);
        for (std::size_t k = 0; k < io_kind_count; ++k) sum.io_in_flight[k] += m.io_in_flight[k];
        sum.timers_pending += m.timers_pending;
        sum.read_buffers += m.read_buffers;
        sum.read_buffers_lent += m.read_buffers_lent;
        if (m.has_run_times) {
            sum.has_run_times = true;
            for (std::size_t b = 0; b < run_time_buckets; ++b) sum.run_times.counts[b] += m.run_times.counts[b];
            sum.run_times.total += m.run_times.total;
            sum.run_times.max = std::max(sum.run_times.max, m.run_times.max);
        }
    }
    return sum;
}

void count_accept_backoff() noexcept {
    if (detail::loop_core* core = detail::current_core_or_null()) ++core->counters().accept_backoffs;
}

}  // namespace spindle
