// loop_metrics in the Prometheus text exposition format, version 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
// Every family is written once, its HELP and TYPE lines first and then the
// samples of every loop, because a scraper rejects a second TYPE line for a
// name and expects a family's samples together. Values go through
// std::to_chars: printf's %g would follow the C locale of the process, and a
// decimal comma does not parse as a float.

#include <spindle/metrics.hpp>
#include <spindle/offload.hpp>

#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace spindle {

namespace {

/// One sample's value: a count, written as an integer so that a large
/// counter keeps every digit, or a time, written in seconds.
struct sample_value {
    std::uint64_t count = 0;
    std::chrono::nanoseconds time{0};
    bool is_time = false;
};

constexpr sample_value count_of(std::uint64_t n) noexcept { return {n, {}, false}; }
constexpr sample_value time_of(std::chrono::nanoseconds t) noexcept { return {0, t, true}; }

/// A family with one sample per loop.
struct scalar_family {
    std::string_view name;
    std::string_view type;
    std::string_view help;
    sample_value (*read)(const loop_metrics&) noexcept;
};

// The help texts are one line each and hold no backslash; append_help still
// escapes, so that an edit here cannot produce a line a scraper refuses.
constexpr scalar_family scalar_families[] = {
    {"spindle_loop_ticks_total", "counter", "Ticks the loop has run.",
     [](const loop_metrics& m) noexcept { return count_of(m.ticks); }},
    {"spindle_loop_busy_seconds_total", "counter",
     "Time the loop was awake inside run(), block_on() or run_once(), resuming tasks and running callbacks.",
     [](const loop_metrics& m) noexcept { return time_of(m.busy_time); }},
    {"spindle_loop_wait_seconds_total", "counter", "Time the loop was blocked in the OS poller.",
     [](const loop_metrics& m) noexcept { return time_of(m.wait_time); }},
    {"spindle_loop_tasks_spawned_total", "counter", "Tasks spawned on the loop.",
     [](const loop_metrics& m) noexcept { return count_of(m.tasks_spawned); }},
    {"spindle_loop_tasks_finished_total", "counter", "Tasks that ended, whichever way (returned, threw or were aborted).",
     [](const loop_metrics& m) noexcept { return count_of(m.tasks_finished); }},
    {"spindle_loop_tasks_failed_total", "counter", "Tasks that ended with an exception.",
     [](const loop_metrics& m) noexcept { return count_of(m.tasks_failed); }},
    {"spindle_loop_resumes_total", "counter", "Times the loop resumed a task.",
     [](const loop_metrics& m) noexcept { return count_of(m.resumes); }},
    {"spindle_loop_polls_total", "counter", "Polls of the OS backend.",
     [](const loop_metrics& m) noexcept { return count_of(m.polls); }},
    {"spindle_loop_sleeps_total", "counter", "Polls that blocked until I/O, a timer or a wake-up.",
     [](const loop_metrics& m) noexcept { return count_of(m.sleeps); }},
    {"spindle_loop_completions_total", "counter", "Operations the OS completed, as the polls returned them.",
     [](const loop_metrics& m) noexcept { return count_of(m.completions); }},
    {"spindle_loop_timers_fired_total", "counter", "Timers that expired.",
     [](const loop_metrics& m) noexcept { return count_of(m.timers_fired); }},
    {"spindle_loop_posts_total", "counter", "Callbacks posted to the loop and run.",
     [](const loop_metrics& m) noexcept { return count_of(m.posts); }},
    {"spindle_loop_remote_wakeups_total", "counter", "Wake-ups another thread sent to the sleeping loop.",
     [](const loop_metrics& m) noexcept { return count_of(m.remote_wakeups); }},
    {"spindle_loop_accept_backoffs_total", "counter", "Accepts that met EMFILE, ENFILE, ENOBUFS or ENOMEM and backed off.",
     [](const loop_metrics& m) noexcept { return count_of(m.accept_backoffs); }},
    {"spindle_loop_stalls_total", "counter", "Resumes that ran longer than the loop's stall threshold.",
     [](const loop_metrics& m) noexcept { return count_of(m.stalls); }},
    {"spindle_loop_tasks_alive", "gauge", "Tasks alive on the loop.",
     [](const loop_metrics& m) noexcept { return count_of(m.tasks_alive); }},
    {"spindle_loop_ready_depth", "gauge", "Tasks the last tick resumed.",
     [](const loop_metrics& m) noexcept { return count_of(m.ready_depth); }},
    {"spindle_loop_ready_depth_max", "gauge", "The deepest ready queue since the previous snapshot.",
     [](const loop_metrics& m) noexcept { return count_of(m.ready_depth_max); }},
    {"spindle_loop_timers_pending", "gauge", "Timers armed.",
     [](const loop_metrics& m) noexcept { return count_of(m.timers_pending); }},
    {"spindle_loop_read_buffers", "gauge", "Buffers of borrowed reads the loop has mapped.",
     [](const loop_metrics& m) noexcept { return count_of(m.read_buffers); }},
    {"spindle_loop_read_buffers_lent", "gauge", "Buffers of borrowed reads lent now.",
     [](const loop_metrics& m) noexcept { return count_of(m.read_buffers_lent); }},
};

constexpr std::string_view io_in_flight_name = "spindle_loop_io_in_flight";
constexpr std::string_view resume_duration_name = "spindle_loop_resume_duration_seconds";

void append_count(std::string& out, std::uint64_t n) {
    char digits[24];
    // Cannot fail: 20 digits hold every 64-bit value.
    const auto end = std::to_chars(digits, digits + sizeof digits, n).ptr;
    out.append(digits, end);
}

/// Writes `digits` with the shortest text that reads back as the same double
/// (what Go's strconv.ParseFloat, and so Prometheus, reads), or +Inf, -Inf, NaN.
std::string_view format_double(double value, std::span<char, 32> digits) noexcept {
    if (std::isnan(value)) return "NaN";
    if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
    // Cannot fail: the shortest form of a double is at most 24 characters.
    const auto end = std::to_chars(digits.data(), digits.data() + digits.size(), value).ptr;
    return {digits.data(), static_cast<std::size_t>(end - digits.data())};
}

double seconds(std::chrono::nanoseconds t) noexcept { return static_cast<double>(t.count()) / 1e9; }

void append_value(std::string& out, const sample_value& v) {
    if (!v.is_time) {
        append_count(out, v.count);
        return;
    }
    char digits[32];
    out += format_double(seconds(v.time), digits);
}

/// HELP text escapes only backslash and line feed; a double quote stays as it is.
void append_help(std::string& out, std::string_view help) {
    for (const char c : help) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out += c;
        }
    }
}

/// Label values escape backslash, double quote and line feed.
void append_label_value(std::string& out, std::string_view value) {
    for (const char c : value) {
        if (c == '\\' || c == '"') {
            out += '\\';
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out += c;
        }
    }
}

void append_family_header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
    out += "# HELP ";
    out += name;
    out += ' ';
    append_help(out, help);
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type;
    out += '\n';
}

/// The labels of one sample: loop="i" when the text covers several loops,
/// then at most one pair of the family's own (kind, le).
struct sample_labels {
    bool has_loop = false;
    std::size_t loop = 0;
    std::string_view name;
    std::string_view value;
};

void append_sample(std::string& out, std::string_view name, std::string_view suffix, const sample_labels& labels,
                   const sample_value& value) {
    out += name;
    out += suffix;
    if (labels.has_loop || !labels.name.empty()) {
        out += '{';
        if (labels.has_loop) {
            out += "loop=\"";
            append_count(out, labels.loop);
            out += '"';
            if (!labels.name.empty()) out += ',';
        }
        if (!labels.name.empty()) {
            out += labels.name;
            out += "=\"";
            append_label_value(out, labels.value);
            out += '"';
        }
        out += '}';
    }
    out += ' ';
    append_value(out, value);
    out += '\n';
}

/// The cumulative buckets, sum and count of one histogram of durations
/// (a loop's resumes, a pool's jobs). Bucket i holds durations shorter than
/// upper_bound(i); durations are whole nanoseconds, so "shorter than b" and
/// Prometheus's "at most b" differ only for a duration of exactly b, which is
/// as good as nothing at this resolution.
void append_histogram(std::string& out, std::string_view name, const run_time_histogram& h, bool has_loop,
                      std::size_t loop) {
    std::uint64_t cumulative = 0;
    char digits[32];
    for (std::size_t i = 0; i + 1 < run_time_buckets; ++i) {
        cumulative += h.counts[i];
        const sample_labels labels{has_loop, loop, "le", format_double(seconds(run_time_histogram::upper_bound(i)), digits)};
        append_sample(out, name, "_bucket", labels, count_of(cumulative));
    }
    cumulative += h.counts[run_time_buckets - 1];
    append_sample(out, name, "_bucket", {has_loop, loop, "le", "+Inf"}, count_of(cumulative));
    append_sample(out, name, "_sum", {has_loop, loop, {}, {}}, time_of(h.total));
    append_sample(out, name, "_count", {has_loop, loop, {}, {}}, count_of(cumulative));
}

/// `labelled`: several loops, each sample with loop="i" (also for a span of one).
std::string render(std::span<const loop_metrics> loops, bool labelled) {
    // Only loops that time their resumes (loop_options::task_run_histogram)
    // have a histogram; a family without samples is left out altogether.
    bool any_run_times = false;
    for (const loop_metrics& m : loops) any_run_times = any_run_times || m.has_run_times;

    // Measured with counters of ten digits: 2.5 KiB of HELP and TYPE lines,
    // 1.1 KiB of samples per loop, 1.3 KiB more per loop with a histogram.
    // With some room for longer values, one reservation holds the whole text.
    std::string out;
    out.reserve(2688 + loops.size() * (any_run_times ? 2816 : 1280));

    for (const scalar_family& family : scalar_families) {
        append_family_header(out, family.name, family.type, family.help);
        for (std::size_t i = 0; i < loops.size(); ++i)
            append_sample(out, family.name, {}, {labelled, i, {}, {}}, family.read(loops[i]));
    }

    append_family_header(out, io_in_flight_name, "gauge", "Descriptor operations submitted and not completed yet, by kind.");
    for (std::size_t i = 0; i < loops.size(); ++i) {
        for (std::size_t k = 0; k < io_kind_count; ++k) {
            const sample_labels labels{labelled, i, "kind", to_string(static_cast<io_kind>(k))};
            append_sample(out, io_in_flight_name, {}, labels, count_of(loops[i].io_in_flight[k]));
        }
    }

    if (any_run_times) {
        append_family_header(out, resume_duration_name, "histogram", "How long the loop's resumes of tasks took.");
        for (std::size_t i = 0; i < loops.size(); ++i)
            if (loops[i].has_run_times) append_histogram(out, resume_duration_name, loops[i].run_times, labelled, i);
    }
    return out;
}

/// A family of an offload pool, with one sample per job kind.
struct per_kind_family {
    std::string_view name;
    std::string_view help;
    const std::array<std::size_t, job_kind_count> offload_stats::*counts;
};

constexpr per_kind_family per_kind_families[] = {
    {"spindle_offload_queued_jobs", "Jobs in the pool's queue, by kind.", &offload_stats::queued},
    {"spindle_offload_waiting_jobs", "Callers waiting for room in a full queue, by kind.", &offload_stats::waiting},
    {"spindle_offload_running_jobs", "Jobs running now, by kind.", &offload_stats::running},
};

}  // namespace

std::string to_prometheus(const offload_stats& s) {
    std::string out;
    out.reserve(s.has_job_times ? 3072 : 1536);
    append_family_header(out, "spindle_offload_threads", "gauge", "Threads of the offload pool.");
    append_sample(out, "spindle_offload_threads", {}, {}, count_of(s.threads));
    append_family_header(out, "spindle_offload_busy_threads", "gauge", "Threads of the offload pool running a job.");
    append_sample(out, "spindle_offload_busy_threads", {}, {}, count_of(s.busy));
    for (const per_kind_family& family : per_kind_families) {
        append_family_header(out, family.name, "gauge", family.help);
        for (std::size_t k = 0; k < job_kind_count; ++k)
            append_sample(out, family.name, {}, {false, 0, "kind", to_string(static_cast<job_kind>(k))},
                          count_of((s.*family.counts)[k]));
    }
    append_family_header(out, "spindle_offload_jobs_run_total", "counter", "Jobs the pool ran to their end.");
    append_sample(out, "spindle_offload_jobs_run_total", {}, {}, count_of(s.jobs_run));
    append_family_header(out, "spindle_offload_jobs_withdrawn_total", "counter",
                         "Jobs withdrawn (cancelled) before they started.");
    append_sample(out, "spindle_offload_jobs_withdrawn_total", {}, {}, count_of(s.jobs_withdrawn));
    if (s.has_job_times) {
        constexpr std::string_view name = "spindle_offload_job_duration_seconds";
        append_family_header(out, name, "histogram", "How long the pool's jobs ran.");
        append_histogram(out, name, s.job_times, false, 0);
    }
    return out;
}

std::string to_prometheus(const loop_metrics& m) { return render(std::span(&m, 1), false); }

std::string to_prometheus(std::span<const loop_metrics> loops) { return render(loops, true); }

}  // namespace spindle
