// The dump of a loop's tasks: what every parked task waits on, and for how
// long. Costs nothing until asked for.

#include "loop_core.hpp"

#include <spindle/loop.hpp>
#include <spindle/sleep.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace spindle {

std::vector<task_info> loop::tasks() const {
    const detail::loop_core& core = *m_core;
    std::vector<task_info> out;
    out.reserve(core.task_count());
    const std::int64_t now = core.recent_ns();
    core.all_tasks().for_each([&](const detail::task_header& t) {
        task_info info;
        info.id = t.m_id;
        detail::append_task_name(t, info.name);
        info.frame_size = t.m_frame_size;
        if (const run_time_histogram* times = core.run_times_of(t)) {
            info.has_run_times = true;
            info.run_times = *times;
        }
        if (&t == core.running_task()) {
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

namespace {

std::string format_duration(std::chrono::nanoseconds d) {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
    if (us < 10'000) return std::to_string(us) + " us";
    return std::to_string(us / 1000) + " ms";
}

}  // namespace

std::string loop::dump_tasks() const {
    std::string text;
    std::vector<task_info> all = tasks();
    text += std::to_string(all.size()) + (all.size() == 1 ? " task\n" : " tasks\n");
    for (const task_info& t : all) {
        text += "  task " + std::to_string(t.id);
        if (!t.name.empty()) text += " '" + t.name + "'";
        switch (t.state) {
            case task_info::state_kind::running: text += ": running"; break;
            case task_info::state_kind::ready: text += ": ready"; break;
            case task_info::state_kind::parked: {
                const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.parked_for).count();
                text += ": waiting on " + t.waiting_on + " for " + std::to_string(ms) + " ms";
                break;
            }
        }
        // With run times on (for finding slow tasks): how often and how long
        // it ran, and what its frame holds.
        if (options().task_run_histogram) {
            std::uint64_t resumes = 0;
            for (auto c : t.run_times.counts) resumes += c;
            text += "; frame " + std::to_string(t.frame_size) + " B, resumed " + std::to_string(resumes) + " times, " +
                    format_duration(t.run_times.total) + " in all, at most " + format_duration(t.run_times.max);
        }
        text += '\n';
    }
    return text;
}

namespace detail {

void sleep_wait::describe(std::string& out) const {
    const std::int64_t left = waiting() ? m_deadline - recent_ns(core()) : 0;
    out += "sleep, due in ";
    out += std::to_string(std::max<std::int64_t>(0, left) / 1'000'000);
    out += " ms";
}

}  // namespace detail

}  // namespace spindle
