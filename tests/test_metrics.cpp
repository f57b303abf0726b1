// loop::metrics(): every counter and gauge moves as a scripted workload says
// (exact counts where they are exact: spawns, finishes, failures, resumes,
// timers fired, posts, operations in flight); the stall detector names a task
// that holds its loop and says nothing about a loop that never stalls; the
// opt-in run-time histogram and the dump's frame sizes.
#include "support.hpp"

#include <spindle/loop_group.hpp>
#include <spindle/loop_thread.hpp>
#include <spindle/net.hpp>

#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using spindle::io_kind;
using spindle::loop;
using spindle::loop_metrics;
using spindle::loop_options;
using spindle::task;
using spindle::test::log_capture;
using spindle::test::pipe_pair;
using spindle::test::run;
using spindle::test::run_until;

namespace {

volatile char g_sink = 0;

std::uint64_t in_flight(const loop_metrics& m, io_kind k) { return m.io_in_flight[static_cast<std::size_t>(k)]; }

task<void> finish_at_once() { co_return; }
task<void> fail_at_once() {
    throw std::runtime_error("on purpose");
    co_return;
}
task<void> sleep_long() { (void)co_await spindle::sleep_for(1h); }
task<void> yield_times(int n) {
    for (int i = 0; i < n; ++i) co_await spindle::yield();
}

/// Runs for `d` of wall time without suspending.
void spin_for(std::chrono::milliseconds d) {
    const auto until = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < until) {
    }
}

std::size_t lines_with(const log_capture& log, const std::string& needle) {
    std::size_t n = 0;
    for (const auto& line : log.lines()) n += line.find(needle) != std::string::npos;
    return n;
}

}  // namespace

TEST_CASE("metrics: tasks spawned, finished, failed and alive are exact", "[metrics]") {
    log_capture log;  // the failure is logged
    loop l;
    const loop_metrics before = l.metrics();
    CHECK(before.tasks_spawned == 0);
    CHECK(before.tasks_alive == 0);
    for (int i = 0; i < 10; ++i) l.spawn(finish_at_once()).detach();
    l.spawn(fail_at_once()).detach();
    auto sleeper = l.spawn(sleep_long());
    const loop_metrics spawned = l.metrics();
    CHECK(spawned.tasks_spawned == 12);
    CHECK(spawned.tasks_alive == 12);
    CHECK(spawned.tasks_finished == 0);
    REQUIRE(run_until(l, [&] { return l.task_count() == 1; }));
    const loop_metrics after = l.metrics();
    CHECK(after.tasks_finished == 11);
    CHECK(after.tasks_failed == 1);
    CHECK(after.tasks_alive == 1);
    sleeper.abort();
    const loop_metrics aborted = l.metrics();
    CHECK(aborted.tasks_finished == 12);
    CHECK(aborted.tasks_failed == 1);
    CHECK(aborted.tasks_alive == 0);
}

TEST_CASE("metrics: resumes and the ready queue's depth", "[metrics]") {
    loop l;
    // One task that yields 100 times: resumed once to start, once per yield.
    l.block_on(yield_times(100));
    const loop_metrics one = l.metrics();
    CHECK(one.resumes == 101);
    CHECK(one.ticks >= 101);
    CHECK(one.ready_depth_max == 1);

    // 50 tasks ready at once: the first tick resumes all of them.
    for (int i = 0; i < 50; ++i) l.spawn(yield_times(2)).detach();
    l.run_once(0ns);
    const loop_metrics fifty = l.metrics();
    CHECK(fifty.resumes == 151);
    CHECK(fifty.ready_depth == 50);
    CHECK(fifty.ready_depth_max == 50);
    l.run();
    CHECK(l.metrics().resumes == 251);
    // A snapshot resets the maximum to the depth now: the last tick's.
    const loop_metrics later = l.metrics();
    CHECK(later.ready_depth_max == later.ready_depth);
}

TEST_CASE("metrics: timers fired and pending", "[metrics]") {
    loop l;
    auto body = []() -> task<void> {
        for (int i = 0; i < 5; ++i) (void)co_await spindle::sleep_for(1ms);
    };
    l.block_on(body());
    CHECK(l.metrics().timers_fired == 5);
    CHECK(l.metrics().timers_pending == 0);
    std::vector<spindle::join_handle<void>> sleepers;
    for (int i = 0; i < 3; ++i) sleepers.push_back(l.spawn(sleep_long()));
    l.run_once(0ns);
    CHECK(l.metrics().timers_pending == 3);
    for (auto& s : sleepers) s.abort();
    CHECK(l.metrics().timers_pending == 0);
    CHECK(l.metrics().timers_fired == 5);
}

TEST_CASE("metrics: posts from another thread, and the wake-ups they send", "[metrics]") {
    loop l;
    std::atomic<int> ran{0};
    {
        loop::hold keep(l);
        std::thread poster([&] {
            for (int i = 0; i < 7; ++i) {
                // Let the loop fall asleep first, so each post wakes it.
                std::this_thread::sleep_for(5ms);
                l.post([&] { ran.fetch_add(1); });
            }
        });
        REQUIRE(run_until(l, [&] { return ran.load() == 7; }));
        poster.join();
    }
    const loop_metrics m = l.metrics();
    CHECK(m.posts == 7);
    CHECK(m.remote_wakeups >= 1);
    CHECK(m.remote_wakeups <= 8);  // one per post at most, and the hold's end
    CHECK(m.sleeps >= 1);
}

TEST_CASE("metrics: operations in flight by kind, polls and completions", "[metrics]") {
    pipe_pair p;
    loop l;
    auto reader = [](int fd) -> task<long> {
        char c;
        auto r = co_await spindle::read(fd, std::as_writable_bytes(std::span(&c, 1)));
        co_return r ? static_cast<long>(*r) : -1;
    };
    auto poller = [](int fd) -> task<void> { (void)co_await spindle::wait_readable(fd); };
    auto r = l.spawn(reader(p.r));
    pipe_pair q;
    auto w = l.spawn(poller(q.r));
    l.run_once(0ns);
    l.run_once(0ns);
    const loop_metrics parked = l.metrics();
    CHECK(in_flight(parked, io_kind::read) == 1);
    CHECK(in_flight(parked, io_kind::poll) == 1);
    CHECK(in_flight(parked, io_kind::write) == 0);
    CHECK(in_flight(parked, io_kind::accept) == 0);
    REQUIRE(p.put());
    REQUIRE(q.put());
    REQUIRE(run_until(l, [&] { return r.done() && w.done(); }));
    const loop_metrics done = l.metrics();
    CHECK(in_flight(done, io_kind::read) == 0);
    CHECK(in_flight(done, io_kind::poll) == 0);
    CHECK(done.polls >= 1);
    CHECK(done.completions >= 1);

    // A parked accept, withdrawn when its task is aborted.
    auto lst = spindle::net::tcp_listener::bind(spindle::net::address::ipv4_loopback(0));
    REQUIRE(lst);
    auto accepter = [](spindle::net::tcp_listener& s) -> task<void> { (void)co_await s.accept(); };
    auto a = l.spawn(accepter(*lst));
    l.run_once(0ns);
    CHECK(in_flight(l.metrics(), io_kind::accept) == 1);
    a.abort();
    CHECK(in_flight(l.metrics(), io_kind::accept) == 0);
}

TEST_CASE("metrics: busy and waiting time add up to utilisation", "[metrics]") {
    loop l;
    auto sleeper = []() -> task<void> { (void)co_await spindle::sleep_for(50ms); };
    const auto start = std::chrono::steady_clock::now();
    l.block_on(sleeper());
    const auto elapsed = std::chrono::steady_clock::now() - start;
    const loop_metrics slept = l.metrics();
    // A timer never fires early: the loop waited in the poller for the sleep.
    CHECK(slept.wait_time >= 40ms);
    CHECK(slept.busy_time + slept.wait_time <= elapsed);
    CHECK(slept.utilisation() < 0.5);

    auto busy = []() -> task<void> {
        spin_for(30ms);
        co_return;
    };
    l.block_on(busy());
    const loop_metrics worked = l.metrics();
    CHECK(worked.busy_time - slept.busy_time >= 30ms);
    CHECK(worked.wait_time == slept.wait_time);  // it never slept meanwhile
}

TEST_CASE("metrics: readable from another thread while the loop runs", "[metrics][threads]") {
    spindle::loop_thread worker;
    std::atomic<bool> stop{false};
    worker.spawn([](std::atomic<bool>& stop) -> task<void> {
        while (!stop.load()) (void)co_await spindle::sleep_for(100us);
    }(stop));
    std::uint64_t last_resumes = 0;
    std::uint64_t last_fired = 0;
    for (int i = 0; i < 50; ++i) {
        const loop_metrics m = worker.get().metrics();
        CHECK(m.resumes >= last_resumes);
        CHECK(m.timers_fired >= last_fired);
        last_resumes = m.resumes;
        last_fired = m.timers_fired;
        std::this_thread::sleep_for(1ms);
    }
    stop = true;
    CHECK(last_resumes > 0);
}

// --- the stall detector ---------------------------------------------------------

TEST_CASE("stall detector: a task that computes for 100 ms is named once", "[metrics][stall]") {
    log_capture log;
    loop l;
    auto hog = []() -> task<void> {
        (void)co_await spindle::sleep_for(1ms);
        spin_for(100ms);
        (void)co_await spindle::sleep_for(1ms);
        co_await spindle::yield();
    };
    auto h = l.spawn(hog(), "hog");
    const std::uint64_t id = l.tasks().at(0).id;
    l.run();
    CHECK(h.done());
    CHECK(l.metrics().stalls == 1);
    const std::string named = "stall: task " + std::to_string(id) + " 'hog' ran at least ";
    CHECK(lines_with(log, "stall:") == 1);
    CHECK(lines_with(log, named) == 1);
    // Where it suspended when the long run ended.
    CHECK(lines_with(log, "last suspended on sleep") == 1);
}

TEST_CASE("stall detector: a task that blocks and then finishes", "[metrics][stall]") {
    log_capture log;
    loop l;
    auto blocker = []() -> task<void> {
        co_await spindle::yield();
        std::this_thread::sleep_for(100ms);  // a blocking call: the loop stalls too
    };
    l.spawn(blocker(), "blocker").detach();
    l.run();
    CHECK(l.metrics().stalls == 1);
    CHECK(lines_with(log, "stall:") == 1);
    CHECK(lines_with(log, "'blocker' ran at least ") == 1);
    CHECK(lines_with(log, "then finished") == 1);
#if defined(__linux__)
    // Off the CPU without waiting for one: the warning says so.
    CHECK(lines_with(log, "its thread was blocked in a system call") == 1);
#endif
}

#if defined(__linux__)
TEST_CASE("stall detector: a loop's thread that waits for a CPU is said to", "[metrics][stall][threads]") {
    // The loop's thread and a thread that computes share one CPU: the task's
    // 150 ms resume is about half spent waiting for it, not the task's doing.
    const int cpu = ::sched_getcpu();
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    cpu_set_t before;
    REQUIRE(::sched_getaffinity(0, sizeof before, &before) == 0);
    if (cpu < 0 || ::sched_setaffinity(0, sizeof one, &one) != 0) {
        WARN("cannot pin this thread");
        return;
    }
    log_capture log;
    std::atomic<bool> stop{false};
    std::atomic<bool> started{false};
    std::thread rival([&] {
        ::sched_setaffinity(0, sizeof one, &one);
        started = true;
        while (!stop.load(std::memory_order_relaxed)) {
        }
    });
    while (!started) std::this_thread::yield();
    {
        loop l;
        auto computes = []() -> task<void> {
            co_await spindle::yield();
            spin_for(150ms);
        };
        l.spawn(computes(), "computes").detach();
        l.run();
        CHECK(l.metrics().stalls == 1);
    }
    stop = true;
    rival.join();
    ::sched_setaffinity(0, sizeof before, &before);
    CHECK(lines_with(log, "'computes' ran at least ") == 1);
    CHECK(lines_with(log, "its thread waited for a CPU") == 1);
}
#endif

TEST_CASE("stall detector: a task that computes is not said to wait or block", "[metrics][stall]") {
    log_capture log;
    loop l;
    l.block_on([]() -> task<void> {
        spin_for(100ms);
        co_return;
    }());
    CHECK(l.metrics().stalls == 1);
    CHECK(lines_with(log, "stall:") == 1);
    CHECK(lines_with(log, "its thread") == 0);
}

TEST_CASE("stall detector: a loop that never stalls logs nothing", "[metrics][stall]") {
    log_capture log;
    loop l;
    // 300 ms of short resumes: each well under the threshold.
    auto busy = []() -> task<void> {
        const auto until = std::chrono::steady_clock::now() + 300ms;
        while (std::chrono::steady_clock::now() < until) {
            spin_for(1ms);
            co_await spindle::yield();
        }
    };
    l.spawn(busy(), "busy").detach();
    l.spawn(busy(), "busy too").detach();
    l.run();
    CHECK(l.metrics().stalls == 0);
    CHECK(lines_with(log, "stall:") == 0);
}

TEST_CASE("stall detector: off with a zero threshold; a threshold of its own", "[metrics][stall]") {
    log_capture log;
    {
        loop l({.stall_threshold = 0ns});
        l.block_on([]() -> task<void> {
            spin_for(60ms);
            co_return;
        }());
        CHECK(l.metrics().stalls == 0);
    }
    {
        loop l({.stall_threshold = 200ms});
        l.block_on([]() -> task<void> {
            spin_for(60ms);
            co_return;
        }());
        CHECK(l.metrics().stalls == 0);
    }
    CHECK(lines_with(log, "stall:") == 0);
}

TEST_CASE("stall detector: loops on two threads, only the one that stalls", "[metrics][stall][threads]") {
    log_capture log;
    spindle::loop_thread quiet;
    spindle::loop_thread stalling;
    std::atomic<int> done{0};
    quiet.spawn([](std::atomic<int>& done) -> task<void> {
        for (int i = 0; i < 200; ++i) (void)co_await spindle::sleep_for(500us);
        ++done;
    }(done), "quiet");
    stalling.spawn([](std::atomic<int>& done) -> task<void> {
        co_await spindle::yield();
        spin_for(100ms);
        co_await spindle::yield();
        ++done;
    }(done), "stalling");
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (done.load() < 2 && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
    REQUIRE(done.load() == 2);
    CHECK(quiet.get().metrics().stalls == 0);
    CHECK(stalling.get().metrics().stalls == 1);
    CHECK(lines_with(log, "'stalling' ran at least ") == 1);
    CHECK(lines_with(log, "stall:") == 1);
}

// --- run times and frame sizes ----------------------------------------------------

TEST_CASE("run times: a histogram per task and per loop, and frame sizes in the dump", "[metrics][run_times]") {
    loop l({.task_run_histogram = true});
    auto big = []() -> task<void> {
        // Filled from a volatile, byte by byte, and read after the waits: no
        // optimizer can fold it away, so the frame must hold all of it.
        std::array<char, 4096> scratch;
        for (char& c : scratch) c = g_sink;
        co_await spindle::yield();
        spin_for(3ms);
        (void)co_await spindle::sleep_for(1h);
        int sum = 0;
        for (char c : scratch) sum += c;
        g_sink = static_cast<char>(sum);
    };
    auto h = l.spawn(big(), "big");
    auto small = l.spawn(yield_times(10), "small");
    REQUIRE(run_until(l, [&] { return small.done(); }));
    l.run_once(0ns);
    const std::vector<spindle::task_info> all = l.tasks();
    REQUIRE(all.size() == 1);
    const spindle::task_info& t = all[0];
    CHECK(t.name == "big");
    CHECK(t.frame_size >= 4096);
    REQUIRE(t.has_run_times);
    std::uint64_t n = 0;
    for (auto c : t.run_times.counts) n += c;
    CHECK(n == 2);
    CHECK(t.run_times.max >= 3ms);
    CHECK(t.run_times.total >= t.run_times.max);
    const std::string dump = l.dump_tasks();
    CHECK(dump.find("'big': waiting on sleep") != std::string::npos);
    CHECK(dump.find("; frame " + std::to_string(t.frame_size) + " B, resumed 2 times") != std::string::npos);

    const loop_metrics m = l.metrics();
    REQUIRE(m.has_run_times);
    std::uint64_t all_resumes = 0;
    for (auto c : m.run_times.counts) all_resumes += c;
    CHECK(all_resumes == m.resumes);
    CHECK(all_resumes == 2 + 11);
    CHECK(m.run_times.max >= 3ms);
    h.abort();

    // Off by default: no histogram, and the dump's lines as before.
    loop plain;
    auto p = plain.spawn(sleep_long(), "plain");
    plain.run_once(0ns);
    CHECK_FALSE(plain.metrics().has_run_times);
    CHECK_FALSE(plain.tasks().at(0).has_run_times);
    CHECK(plain.tasks().at(0).frame_size > 0);
    CHECK(plain.dump_tasks().find("frame") == std::string::npos);
    p.abort();
}

TEST_CASE("metrics: a loop group's snapshots, one per loop, and their total", "[metrics][threads]") {
    spindle::loop_group_options options;
    options.threads = 2;
    spindle::loop_group group(options);
    std::atomic<int> ready{0};
    std::vector<loop_metrics> seen;
    loop_metrics sum;
    const int status = group.run([&](std::stop_token) -> task<void> {
        for (int i = 0; i < 5; ++i) loop::current().spawn(finish_at_once()).detach();
        co_await spindle::yield();
        co_await spindle::yield();
        ++ready;
        while (ready.load() < 2) (void)co_await spindle::sleep_for(1ms);
        if (spindle::loop_group::current_index() == 0) {
            seen = spindle::loop_group::current().metrics();
            sum = spindle::total(seen);
        }
    });
    CHECK(status == 0);
    REQUIRE(seen.size() == 2);
    std::uint64_t spawned = 0;
    std::uint64_t resumes = 0;
    for (const loop_metrics& m : seen) {
        CHECK(m.tasks_finished >= 5);  // each loop's own five, at least
        spawned += m.tasks_spawned;
        resumes += m.resumes;
    }
    CHECK(sum.tasks_spawned == spawned);
    CHECK(sum.resumes == resumes);
    CHECK(sum.tasks_spawned >= 12);  // five and a main on each loop
    CHECK(sum.ready_depth_max == std::max(seen[0].ready_depth_max, seen[1].ready_depth_max));
}
