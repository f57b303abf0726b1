// to_prometheus: the exact text of hand-built snapshots, one loop and a
// group's, checked line by line and by the format checker of
// prometheus_text.hpp; a real loop's snapshots before and after work; and
// the checker itself, on text it must refuse.

#include "catch.hpp"
#include "prometheus_text.hpp"

#include <spindle/spindle.hpp>

#include <algorithm>
#include <chrono>
#include <clocale>
#include <cstdint>
#include <limits>
#include <locale>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
namespace prom = spindle::test::prometheus;
using spindle::loop_metrics;

namespace {

std::size_t count(std::string_view text, std::string_view what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string_view::npos; at = text.find(what, at + what.size())) ++n;
    return n;
}

bool has_line(std::string_view text, std::string_view line) {
    return text.starts_with(std::string(line) + "\n") || text.find("\n" + std::string(line) + "\n") != std::string_view::npos;
}

/// A snapshot with a different value in every field, `base` apart.
loop_metrics sample_metrics(std::uint64_t base) {
    loop_metrics m;
    m.ticks = base + 1;
    m.busy_time = 1500ms + std::chrono::seconds(base);
    m.wait_time = 250ms;
    m.tasks_spawned = base + 2;
    m.tasks_finished = base + 3;
    m.tasks_failed = base + 4;
    m.resumes = base + 5;
    m.polls = base + 6;
    m.sleeps = base + 7;
    m.completions = base + 8;
    m.timers_fired = base + 9;
    m.posts = base + 10;
    m.remote_wakeups = base + 11;
    m.accept_backoffs = base + 12;
    m.stalls = base + 13;
    m.tasks_alive = base + 14;
    m.ready_depth = base + 15;
    m.ready_depth_max = base + 16;
    m.io_in_flight = {base + 20, base + 21, base + 22, base + 23, base + 24, base + 25};
    m.timers_pending = base + 17;
    m.read_buffers = base + 18;
    m.read_buffers_lent = base + 19;
    return m;
}

/// Checks the text and returns what it holds, failing the test if it is not valid.
prom::exposition checked(const std::string& text) {
    prom::parse_outcome parsed = prom::parse(text);
    INFO(parsed.error << "\n" << text);
    REQUIRE(parsed.ok());
    return std::move(parsed.text);
}

}  // namespace

TEST_CASE("one loop's snapshot: a HELP and TYPE line per metric, then its sample, times in seconds") {
    const std::string text = spindle::to_prometheus(sample_metrics(0));
    INFO(text);
    CHECK(text.starts_with("# HELP spindle_loop_ticks_total Ticks the loop has run.\n"
                           "# TYPE spindle_loop_ticks_total counter\n"
                           "spindle_loop_ticks_total 1\n"
                           "# HELP spindle_loop_busy_seconds_total "));
    for (std::string_view line : {
             "# TYPE spindle_loop_busy_seconds_total counter",
             "spindle_loop_busy_seconds_total 1.5",
             "# TYPE spindle_loop_wait_seconds_total counter",
             "spindle_loop_wait_seconds_total 0.25",
             "spindle_loop_tasks_spawned_total 2",
             "spindle_loop_tasks_finished_total 3",
             "spindle_loop_tasks_failed_total 4",
             "spindle_loop_resumes_total 5",
             "spindle_loop_polls_total 6",
             "spindle_loop_sleeps_total 7",
             "spindle_loop_completions_total 8",
             "spindle_loop_timers_fired_total 9",
             "spindle_loop_posts_total 10",
             "spindle_loop_remote_wakeups_total 11",
             "spindle_loop_accept_backoffs_total 12",
             "spindle_loop_stalls_total 13",
             "# TYPE spindle_loop_tasks_alive gauge",
             "spindle_loop_tasks_alive 14",
             "# TYPE spindle_loop_ready_depth gauge",
             "spindle_loop_ready_depth 15",
             "# TYPE spindle_loop_ready_depth_max gauge",
             "spindle_loop_ready_depth_max 16",
             "# TYPE spindle_loop_timers_pending gauge",
             "spindle_loop_timers_pending 17",
             "# TYPE spindle_loop_read_buffers gauge",
             "spindle_loop_read_buffers 18",
             "# TYPE spindle_loop_read_buffers_lent gauge",
             "spindle_loop_read_buffers_lent 19",
             "# TYPE spindle_loop_io_in_flight gauge",
             "spindle_loop_io_in_flight{kind=\"read\"} 20",
             "spindle_loop_io_in_flight{kind=\"write\"} 21",
             "spindle_loop_io_in_flight{kind=\"accept\"} 22",
             "spindle_loop_io_in_flight{kind=\"connect\"} 23",
             "spindle_loop_io_in_flight{kind=\"poll\"} 24",
             "spindle_loop_io_in_flight{kind=\"file\"} 25",
         }) {
        INFO(line);
        CHECK(has_line(text, line));
    }
    // Without task_run_histogram there is no histogram, not an empty one.
    CHECK(text.find("resume_duration") == std::string::npos);
    CHECK(text.find("loop=") == std::string::npos);

    const prom::exposition e = checked(text);
    const std::map<std::string, std::string> types{
        {"spindle_loop_ticks_total", "counter"},           {"spindle_loop_busy_seconds_total", "counter"},
        {"spindle_loop_wait_seconds_total", "counter"},    {"spindle_loop_tasks_spawned_total", "counter"},
        {"spindle_loop_tasks_finished_total", "counter"},  {"spindle_loop_tasks_failed_total", "counter"},
        {"spindle_loop_resumes_total", "counter"},         {"spindle_loop_polls_total", "counter"},
        {"spindle_loop_sleeps_total", "counter"},          {"spindle_loop_completions_total", "counter"},
        {"spindle_loop_timers_fired_total", "counter"},    {"spindle_loop_posts_total", "counter"},
        {"spindle_loop_remote_wakeups_total", "counter"},  {"spindle_loop_accept_backoffs_total", "counter"},
        {"spindle_loop_stalls_total", "counter"},          {"spindle_loop_tasks_alive", "gauge"},
        {"spindle_loop_ready_depth", "gauge"},             {"spindle_loop_ready_depth_max", "gauge"},
        {"spindle_loop_io_in_flight", "gauge"},            {"spindle_loop_timers_pending", "gauge"},
        {"spindle_loop_read_buffers", "gauge"},            {"spindle_loop_read_buffers_lent", "gauge"},
    };
    CHECK(e.types == types);
    // One sample per family, one per kind for io_in_flight, and one HELP line each.
    CHECK(e.values.size() == types.size() + spindle::io_kind_count - 1);
    CHECK(count(text, "# HELP ") == types.size());
    CHECK(e.values.at("spindle_loop_busy_seconds_total") == 1.5);
    CHECK(e.values.at("spindle_loop_io_in_flight{kind=\"poll\"}") == 24);
}

TEST_CASE("the resume histogram: cumulative buckets in seconds, the last +Inf, then _sum and _count") {
    loop_metrics m = sample_metrics(0);
    m.has_run_times = true;
    m.run_times.counts = {3, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 1};
    m.run_times.total = 12345ns;
    const std::string text = spindle::to_prometheus(m);
    INFO(text);
    const std::string_view expected =
        "# HELP spindle_loop_resume_duration_seconds How long the loop's resumes of tasks took.\n"
        "# TYPE spindle_loop_resume_duration_seconds histogram\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"1e-06\"} 3\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"2e-06\"} 3\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"4e-06\"} 5\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"8e-06\"} 5\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"1.6e-05\"} 5\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"3.2e-05\"} 5\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"6.4e-05\"} 5\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"0.000128\"} 5\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"0.000256\"} 5\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"0.000512\"} 5\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"0.001024\"} 5\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"0.002048\"} 5\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"0.004096\"} 5\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"0.008192\"} 5\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"0.016384\"} 9\n"
        "spindle_loop_resume_duration_seconds_bucket{le=\"+Inf\"} 10\n"
        "spindle_loop_resume_duration_seconds_sum 1.2345e-05\n"
        "spindle_loop_resume_duration_seconds_count 10\n";
    CHECK(text.ends_with(expected));
    const prom::exposition e = checked(text);
    CHECK(e.types.at("spindle_loop_resume_duration_seconds") == "histogram");
    CHECK(e.values.at("spindle_loop_resume_duration_seconds_bucket{le=\"0.016384\"}") == 9);
}

TEST_CASE("a group of three loops: one HELP and TYPE per metric, every sample labelled loop=\"i\"") {
    std::vector<loop_metrics> loops{sample_metrics(0), sample_metrics(100), sample_metrics(200)};
    // Only the middle loop times its resumes.
    loops[1].has_run_times = true;
    loops[1].run_times.counts[0] = 7;
    loops[1].run_times.total = 2us;
    const std::string text = spindle::to_prometheus(loops);
    INFO(text);
    CHECK(count(text, "# TYPE spindle_loop_ticks_total counter\n") == 1);
    CHECK(count(text, "# HELP spindle_loop_ticks_total ") == 1);
    CHECK(text.find("# TYPE spindle_loop_ticks_total counter\n"
                    "spindle_loop_ticks_total{loop=\"0\"} 1\n"
                    "spindle_loop_ticks_total{loop=\"1\"} 101\n"
                    "spindle_loop_ticks_total{loop=\"2\"} 201\n"
                    "# HELP ") != std::string::npos);
    for (std::string_view line : {
             "spindle_loop_busy_seconds_total{loop=\"0\"} 1.5",
             "spindle_loop_busy_seconds_total{loop=\"1\"} 101.5",
             "spindle_loop_busy_seconds_total{loop=\"2\"} 201.5",
             "spindle_loop_stalls_total{loop=\"2\"} 213",
             "spindle_loop_timers_pending{loop=\"1\"} 117",
             "spindle_loop_read_buffers_lent{loop=\"2\"} 219",
             "spindle_loop_io_in_flight{loop=\"0\",kind=\"read\"} 20",
             "spindle_loop_io_in_flight{loop=\"1\",kind=\"accept\"} 122",
             "spindle_loop_io_in_flight{loop=\"2\",kind=\"poll\"} 224",
             "spindle_loop_resume_duration_seconds_bucket{loop=\"1\",le=\"1e-06\"} 7",
             "spindle_loop_resume_duration_seconds_bucket{loop=\"1\",le=\"+Inf\"} 7",
             "spindle_loop_resume_duration_seconds_sum{loop=\"1\"} 2e-06",
             "spindle_loop_resume_duration_seconds_count{loop=\"1\"} 7",
         }) {
        INFO(line);
        CHECK(has_line(text, line));
    }
    CHECK(text.find("spindle_loop_resume_duration_seconds_count{loop=\"0\"}") == std::string::npos);
    CHECK(text.find("spindle_loop_resume_duration_seconds_count{loop=\"2\"}") == std::string::npos);

    const prom::exposition e = checked(text);
    CHECK(count(text, "# TYPE ") == e.types.size());
    // 21 plain families and a sample per kind of I/O for each of 3 loops,
    // and 16 buckets, a sum and a count for the one loop with a histogram.
    CHECK(e.values.size() == 3 * (21 + spindle::io_kind_count) + 18);
    CHECK(e.values.at("spindle_loop_io_in_flight{kind=\"connect\",loop=\"2\"}") == 223);
    // A span of one loop is still labelled: it is a group's.
    CHECK(spindle::to_prometheus(std::span(loops).first(1)).find("spindle_loop_ticks_total{loop=\"0\"} 1\n") != std::string::npos);
    // No loops: the families without samples, still valid.
    (void)checked(spindle::to_prometheus(std::span<const loop_metrics>()));
}

TEST_CASE("values parse as floats whatever their size and the process's locale") {
    loop_metrics m = sample_metrics(0);
    m.ticks = std::numeric_limits<std::uint64_t>::max();
    m.busy_time = std::chrono::nanoseconds(std::numeric_limits<std::int64_t>::max());
    m.wait_time = 1ns;

    // A C++ global locale with a decimal comma and digit grouping, and the C
    // locale of a country that writes one, where the system has it: neither
    // may reach the text.
    struct comma_numpunct : std::numpunct<char> {
        char do_decimal_point() const override { return ','; }
        char do_thousands_sep() const override { return '.'; }
        std::string do_grouping() const override { return "\3"; }
    };
    const std::locale previous = std::locale::global(std::locale(std::locale::classic(), new comma_numpunct));
    bool c_locale_set = false;
    for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8"})
        if (!c_locale_set && std::setlocale(LC_NUMERIC, name)) c_locale_set = true;
    const std::string text = spindle::to_prometheus(m);
    std::setlocale(LC_NUMERIC, "C");
    std::locale::global(previous);
    if (!c_locale_set) WARN("no de_DE or fr_FR locale here: checked with a C++ locale only");

    INFO(text);
    CHECK(has_line(text, "spindle_loop_ticks_total 18446744073709551615"));
    CHECK(has_line(text, "spindle_loop_busy_seconds_total 9223372036.854776"));
    CHECK(has_line(text, "spindle_loop_wait_seconds_total 1e-09"));
    const prom::exposition e = checked(text);
    CHECK(e.values.at("spindle_loop_ticks_total") == 18446744073709551615.0);
}

TEST_CASE("a real loop's snapshots before and after some work: valid, and no counter goes back") {
    spindle::loop_options options;
    options.task_run_histogram = true;
    spindle::loop l(options);
    const prom::exposition before = checked(spindle::to_prometheus(l.metrics()));
    l.block_on([]() -> spindle::task<void> {
        for (int i = 0; i < 20; ++i) (void)co_await spindle::sleep_for(1ms);
        for (int i = 0; i < 100; ++i) co_await spindle::yield();
    }());
    const prom::exposition after = checked(spindle::to_prometheus(l.metrics()));
    const std::vector<std::string> wrong = prom::decreased_counters(before, after);
    INFO(wrong.size() << " went back; the first: " << (wrong.empty() ? "" : wrong.front()));
    CHECK(wrong.empty());
    CHECK(after.values.at("spindle_loop_resumes_total") >= before.values.at("spindle_loop_resumes_total") + 100);
    CHECK(after.values.at("spindle_loop_polls_total") > before.values.at("spindle_loop_polls_total"));
    CHECK(after.values.at("spindle_loop_timers_fired_total") >= 20);
    CHECK(after.values.at("spindle_loop_resume_duration_seconds_count") >= 100);
}

// --- the checker itself ----------------------------------------------------------------------

TEST_CASE("the format checker takes valid text of every kind and keys series by sorted labels") {
    const std::string text =
        "# A comment of no kind.\n"
        "# HELP requests_total Requests, with a \\\\ and a \\n in the help.\n"
        "# TYPE requests_total counter\n"
        "requests_total{path=\"/a\\\"b\\\\c\\nd\",method=\"GET\"} 12 1700000000000\n"
        "requests_total{method=\"POST\"} 3e2\n"
        "#\n"
        "# TYPE temperature gauge\n"
        "temperature -1.5\n"
        "# TYPE level:ratio gauge\n"
        "level:ratio\t+Inf\n"
        "# TYPE odd gauge\n"
        "odd{} NaN\n"
        "# TYPE latency histogram\n"
        "latency_bucket{le=\"0.5\"} 1\n"
        "latency_bucket{le=\"1\"} 4\n"
        "latency_bucket{le=\"+Inf\"} 4\n"
        "latency_sum 2.25\n"
        "latency_count 4\n"
        "# TYPE rpc summary\n"
        "rpc{quantile=\"0.5\"} 0.1\n"
        "rpc_sum 7\n"
        "rpc_count 70\n";
    const prom::parse_outcome parsed = prom::parse(text);
    INFO(parsed.error);
    REQUIRE(parsed.ok());
    const prom::exposition& e = parsed.text;
    CHECK(e.values.at("requests_total{method=\"GET\",path=\"/a\\\"b\\\\c\\nd\"}") == 12);
    CHECK(e.values.at("requests_total{method=\"POST\"}") == 300);
    CHECK(e.values.at("temperature") == -1.5);
    CHECK(e.values.at("level:ratio") == std::numeric_limits<double>::infinity());
    CHECK(e.values.count("odd") == 1);
    CHECK(e.family_of.at("latency_bucket{le=\"1\"}") == "latency");
    CHECK(e.types.at("rpc") == "summary");
    CHECK(prom::parse("").ok());
}

TEST_CASE("the format checker refuses what a scraper would, and what spindle promises not to write") {
    const std::string counter = "# TYPE x_total counter\n";
    const std::string hist = "# TYPE h histogram\n";
    const std::pair<std::string, std::string_view> bad[] = {
        {"x 1\n", "no TYPE line"},
        {"# TYPE 1x gauge\n1x 1\n", "not a metric name"},
        {"# TYPE x-y gauge\nx-y 1\n", "not a metric name"},
        {"# TYPE x gauge\nx{1a=\"b\"} 1\n", "not a label name"},
        {"# TYPE x gauge\nx{__name=\"b\"} 1\n", "not a label name"},
        {"# TYPE x gauge\nx{a=b} 1\n", "badly quoted"},
        {"# TYPE x gauge\nx{a=\"b} 1\n", "badly quoted"},
        {"# TYPE x gauge\nx{a=\"\\q\"} 1\n", "badly quoted"},
        {"# TYPE x gauge\nx{a=\"b\" c=\"d\"} 1\n", "not separated"},
        {"# TYPE x gauge\nx{a=\"b\",} 1\n", "comma before"},
        {"# TYPE x gauge\nx{a=\"b\",a=\"c\"} 1\n", "twice"},
        {"# TYPE x gauge\nx{a=\"b\" 1\n", "not separated"},
        {"# TYPE x gauge\nx 1,5\n", "not a float"},
        {"# TYPE x gauge\nx one\n", "not a float"},
        {"# TYPE x gauge\nx\n", "no value"},
        {"# TYPE x gauge\nx 1 soon\n", "not a timestamp"},
        {"# TYPE x gauge\nx 1", "line feed"},
        {"# TYPE x gauge\n\nx 1\n", "empty line"},
        {"# TYPE x gauge\nx 1\nx 2\n", "twice"},
        {"# TYPE x gauge\n# TYPE x gauge\nx 1\n", "second TYPE"},
        {"# TYPE x gauge\n# HELP x a\n# HELP x b\nx 1\n", "second HELP"},
        {"# HELP x bad \\t escape\n# TYPE x gauge\nx 1\n", "bad escape"},
        {"# TYPE x meter\nx 1\n", "not a metric type"},
        {"# TYPE x gauge\nx{a=\"1\"} 1\n# TYPE x gauge\n", "second TYPE"},
        {"# TYPE x gauge\nx{a=\"1\"} 1\n# TYPE w gauge\nw 1\nx{a=\"2\"} 1\n", "not together"},
        {"# TYPE requests counter\nrequests 1\n", "does not end in _total"},
        {counter + "x_total{a=\"1\"} 1\nx_total{a=\"2\"} 2\n# TYPE x_total gauge\n", "second TYPE"},
        {hist + "h_bucket{le=\"1\"} 5\nh_bucket{le=\"2\"} 4\nh_bucket{le=\"+Inf\"} 5\nh_sum 1\nh_count 5\n", "not cumulative"},
        {hist + "h_bucket{le=\"1\"} 5\nh_sum 1\nh_count 5\n", "+Inf"},
        {hist + "h_bucket{le=\"1\"} 5\nh_bucket{le=\"+Inf\"} 6\nh_sum 1\nh_count 5\n", "_count differs"},
        {hist + "h_bucket{le=\"+Inf\"} 5\nh_sum 1\n", "no _count"},
        {hist + "h_bucket{le=\"+Inf\"} 5\nh_count 5\n", "no _sum"},
        {hist + "h_bucket 5\nh_count 5\nh_sum 1\n", "without le"},
        {hist + "h_bucket{le=\"soon\"} 5\n", "le is not a float"},
        {hist + "h 5\n", "neither"},
    };
    for (const auto& [text, why] : bad) {
        const prom::parse_outcome parsed = prom::parse(text);
        INFO("text:\n" << text << "error: " << parsed.error);
        CHECK(!parsed.ok());
        CHECK(parsed.error.find(why) != std::string::npos);
    }
}

TEST_CASE("decreased_counters finds a counter or bucket that went back or vanished, and ignores gauges") {
    const std::string before =
        "# TYPE a_total counter\na_total 5\n# TYPE b_total counter\nb_total 5\n# TYPE c_total counter\nc_total 5\n"
        "# TYPE g gauge\ng 9\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 3\nh_sum 1\nh_count 3\n";
    const std::string after =
        "# TYPE a_total counter\na_total 6\n# TYPE b_total counter\nb_total 4\n"
        "# TYPE g gauge\ng 1\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 2\n";
    const prom::parse_outcome b = prom::parse(before);
    const prom::parse_outcome a = prom::parse(after);
    REQUIRE(b.ok());
    REQUIRE(a.ok());
    const std::vector<std::string> wrong = prom::decreased_counters(b.text, a.text);
    CHECK(wrong.size() == 4);
    auto names = [&](std::string_view series) {
        return std::count_if(wrong.begin(), wrong.end(), [&](const std::string& w) { return w.starts_with(std::string(series) + " "); });
    };
    CHECK(names("b_total") == 1);
    CHECK(names("c_total") == 1);
    CHECK(names("h_bucket{le=\"+Inf\"}") == 1);
    CHECK(names("h_count") == 1);
    CHECK(prom::decreased_counters(a.text, a.text).empty());
}
