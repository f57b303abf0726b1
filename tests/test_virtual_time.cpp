// Virtual time (loop_options::virtual_time) and spindle::testing::run.
//
// Under virtual time the loop's clock stands still while any task can run and
// jumps to the next deadline when every task waits on time, so simulated hours
// pass in microseconds and every offset is exact: the checks below compare
// durations with ==, never with a tolerance. Real I/O still works: the OS is
// polled without blocking before each jump, and with no deadline at all the
// loop waits for I/O for real.
#define CATCH_CONFIG_ENABLE_PAIR_STRINGMAKER  // print the (what, when) pairs compared below
#include "support.hpp"

#include <spindle/channel.hpp>
#include <spindle/event.hpp>
#include <spindle/mutex.hpp>
#include <spindle/task_group.hpp>
#include <spindle/testing.hpp>
#include <spindle/race.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using spindle::loop;
using spindle::loop_options;
using spindle::task;
using spindle::with_timeout;
using spindle::test::pipe_pair;
using spindle::test::run;
namespace testing = spindle::testing;
using spindle::test::error_of;

namespace {

using offset = std::chrono::nanoseconds;

std::string how(std::error_code ec) {
    if (!ec) return "ok";
    if (ec == std::errc::operation_canceled) return "canceled";
    if (ec == std::errc::timed_out) return "timed out";
    return ec.message();
}

using spindle::test::socket_pair;

// --- the clock -------------------------------------------------------------------

task<std::pair<offset, std::string>> sleep_an_hour() {
    const auto start = loop::now();
    std::error_code ec = error_of(co_await spindle::sleep_for(1h));
    co_return std::pair(loop::now() - start, how(ec));
}

TEST_CASE("virtual time: a task sleeping a simulated hour completes in under 50 ms of wall time", "[virtual_time]") {
    loop l(loop_options{.virtual_time = true});
    const auto wall_start = std::chrono::steady_clock::now();
    auto [slept, result] = run(l, sleep_an_hour());
    const auto wall = std::chrono::steady_clock::now() - wall_start;
    CHECK(wall < 50ms);
    CHECK(slept == 1h);
    CHECK(result == "ok");
}

task<std::vector<offset>> measure_sleeps() {
    std::vector<offset> out;
    for (offset d : {offset(1ns), offset(1us), offset(1ms), offset(999ms), offset(37s), offset(1h), offset(24h), offset(0ns)}) {
        const auto before = loop::now();
        (void)co_await spindle::sleep_for(d);
        out.push_back(loop::now() - before);
    }
    // An absolute deadline lands exactly too.
    const auto before = loop::now();
    (void)co_await spindle::sleep_until(before + 5s + 3ns);
    out.push_back(loop::now() - before);
    // The clock stands still while the task can run: a thousand yields take no time.
    const auto still = loop::now();
    for (int i = 0; i < 1000; ++i) co_await spindle::yield();
    out.push_back(loop::now() - still);
    co_return out;
}

TEST_CASE("virtual time: loop::now() advances exactly by each sleep, and not at all while tasks run", "[virtual_time]") {
    loop l(loop_options{.virtual_time = true});
    const auto start = loop::now();  // outside the loop: the steady clock
    auto slept = run(l, measure_sleeps());
    const std::vector<offset> expected{1ns, 1us, 1ms, 999ms, 37s, 1h, 24h, 0ns, 5s + 3ns, 0ns};
    CHECK(slept == expected);
    // Outside any loop, now() is the steady clock again: a simulated day and
    // more did not pass for real.
    CHECK(loop::now() - start < 1h);
}

struct timeline {
    spindle::clock::time_point start;
    std::vector<std::pair<std::string, offset>> events;
    void mark(std::string what) { events.emplace_back(std::move(what), loop::now() - start); }
};

task<void> sleep_and_mark(timeline& t, std::string name, offset d) {
    (void)co_await spindle::sleep_for(d);
    t.mark(std::move(name));
}

task<void> late_joiner(timeline& t) {
    // Asks for the 3 s deadline half a second after the others did: it comes
    // after them, though it was spawned first.
    (void)co_await spindle::sleep_for(500ms);
    t.mark("late, at 0.5 s");
    (void)co_await spindle::sleep_until(t.start + 3s);
    t.mark("late");
}

task<void> ordering(timeline& t) {
    t.start = loop::now();
    spindle::task_group g;
    g.spawn(late_joiner(t));
    g.spawn(sleep_and_mark(t, "A", 3s));
    g.spawn(sleep_and_mark(t, "B", 1s));
    g.spawn(sleep_and_mark(t, "C", 2s));
    g.spawn(sleep_and_mark(t, "D", 1s));
    g.spawn(sleep_and_mark(t, "E", 3s));
    co_await g.join();
}

TEST_CASE("virtual time: timers fire in (deadline, insertion) order across jumps", "[virtual_time]") {
    loop l(loop_options{.virtual_time = true});
    timeline t;
    run(l, ordering(t));
    const std::vector<std::pair<std::string, offset>> expected{
        {"late, at 0.5 s", 500ms}, {"B", 1s}, {"D", 1s}, {"C", 2s}, {"A", 3s}, {"E", 3s}, {"late", 3s},
    };
    CHECK(t.events == expected);
}

task<std::vector<std::pair<std::string, offset>>> timeouts() {
    std::vector<std::pair<std::string, offset>> out;
    auto start = loop::now();
    std::error_code ec = error_of(co_await with_timeout(10s, spindle::sleep_for(20s)));
    out.emplace_back(how(ec), loop::now() - start);
    start = loop::now();
    ec = error_of(co_await with_timeout(20s, spindle::sleep_for(10s)));
    out.emplace_back(how(ec), loop::now() - start);
    co_return out;
}

TEST_CASE("virtual time: with_timeout(10s, sleep_for(20s)) times out at exactly +10 s", "[virtual_time][timeout]") {
    loop l(loop_options{.virtual_time = true});
    auto r = run(l, timeouts());
    const std::vector<std::pair<std::string, offset>> expected{{"timed out", 10s}, {"ok", 10s}};
    CHECK(r == expected);
}

task<std::pair<std::vector<offset>, std::uint64_t>> sixty_ticks() {
    const auto start = loop::now();
    spindle::interval iv(1s, start + 1s);
    std::vector<offset> at;
    std::uint64_t periods = 0;
    while (loop::now() - start < 60s) {
        auto r = co_await iv.tick();
        periods += *r;
        at.push_back(loop::now() - start);
    }
    co_return std::pair(at, periods);
}

TEST_CASE("virtual time: an interval of 1 s ticks 60 times over a simulated minute", "[virtual_time][interval]") {
    loop l(loop_options{.virtual_time = true});
    auto [at, periods] = run(l, sixty_ticks());
    std::vector<offset> expected;
    for (int i = 1; i <= 60; ++i) expected.push_back(std::chrono::seconds(i));
    CHECK(at == expected);
    CHECK(periods == 60);
}

task<std::vector<std::pair<std::uint64_t, offset>>> interval_after_a_jump() {
    (void)co_await spindle::sleep_for(1h);  // the virtual clock is an hour ahead of the steady one now
    const auto start = loop::now();
    spindle::interval iv(1s);  // first tick: now, on the loop's clock
    std::vector<std::pair<std::uint64_t, offset>> ticks;
    for (int i = 0; i < 3; ++i) {
        auto r = co_await iv.tick();
        ticks.emplace_back(*r, loop::now() - start);
    }
    co_return ticks;
}

TEST_CASE("virtual time: an interval started after a jump ticks from the loop's now, skipping nothing", "[virtual_time][interval]") {
    auto ticks = testing::run(interval_after_a_jump());
    const std::vector<std::pair<std::uint64_t, offset>> expected{{1, 0s}, {1, 1s}, {1, 2s}};
    CHECK(ticks == expected);
}

// --- real I/O under virtual time ----------------------------------------------------

task<void> write_after(int fd, offset d, char c) {
    (void)co_await spindle::sleep_for(d);
    const std::byte b{static_cast<unsigned char>(c)};
    (void)co_await spindle::send(fd, std::span(&b, 1));
}

task<std::pair<std::string, offset>> read_one(int fd) {
    const auto start = loop::now();
    std::byte b{};
    auto r = co_await spindle::recv(fd, std::span(&b, 1));
    if (!r) co_return std::pair(how(r.error()), loop::now() - start);
    co_return std::pair(std::string(1, static_cast<char>(b)), loop::now() - start);
}

task<std::pair<std::string, offset>> read_with_writer(int rfd, int wfd) {
    auto writer = loop::current().spawn(write_after(wfd, 5s, 'w'));
    auto r = co_await read_one(rfd);
    co_await writer;
    co_return r;
}

task<std::pair<std::string, offset>> read_with_deadline(int fd) {
    const auto start = loop::now();
    std::byte b{};
    auto r = co_await with_timeout(1h, spindle::recv(fd, std::span(&b, 1)));
    co_return std::pair(how(r.error()), loop::now() - start);
}

// A task waiting on a socket with no deadline anywhere in the loop: nothing
// can make the virtual clock move, so the loop blocks in the OS for real
// until the I/O arrives, and the virtual clock has not moved when it does.
// With a deadline pending, the loop looks at the OS without waiting and, if
// nothing is ready, jumps to the deadline.
TEST_CASE("virtual time: real I/O works; without a deadline the loop waits for it for real", "[virtual_time][io]") {
    socket_pair s;

    SECTION("another task writes after a simulated 5 s: the read completes at exactly +5 s") {
        auto r = testing::run(read_with_writer(s.a, s.b));
        CHECK(r == std::pair<std::string, offset>("w", 5s));
    }
    SECTION("another thread writes after 100 ms of real time: the loop blocked for real; no virtual time passed") {
        const auto wall_start = std::chrono::steady_clock::now();
        std::atomic<long> sent{0};
        std::thread writer([&] {
            std::this_thread::sleep_for(100ms);
            const char c = 't';
            sent = ::send(s.b, &c, 1, MSG_NOSIGNAL);
        });
        auto r = testing::run(read_one(s.a));
        const auto wall = std::chrono::steady_clock::now() - wall_start;
        writer.join();
        CHECK(sent.load() == 1);
        CHECK(r == std::pair<std::string, offset>("t", 0ns));
        CHECK(wall >= 100ms);
    }
    SECTION("a read nobody answers, with a deadline: time jumps to it") {
        auto r = testing::run(read_with_deadline(s.a));
        CHECK(r == std::pair<std::string, offset>("timed out", 1h));
    }
}

TEST_CASE("virtual time: run_once(max_wait) with only I/O pending waits at most max_wait", "[virtual_time][io]") {
    pipe_pair p;
    loop l(loop_options{.virtual_time = true});
    auto reader = l.spawn([](int fd) -> task<void> {
        std::byte b{};
        (void)co_await spindle::read(fd, std::span(&b, 1));
    }(p.r));
    l.run_once(0ns);  // the reader parks
    // If run_once blocked without limit, this thread would end it by writing
    // after 5 s; normally it is told to leave long before.
    std::mutex m;
    std::condition_variable cv;
    bool returned = false;
    std::atomic<bool> wrote{false};
    std::thread rescue([&] {
        std::unique_lock lock(m);
        if (cv.wait_for(lock, 5s, [&] { return returned; })) return;
        wrote = p.put();
    });
    l.run_once(20ms);
    {
        std::lock_guard lock(m);
        returned = true;
    }
    cv.notify_one();
    rescue.join();
    CHECK_FALSE(wrote.load());
    CHECK_FALSE(reader.done());
    REQUIRE(p.put());
    REQUIRE(run(l, [](spindle::join_handle<void>& h) -> task<bool> {
        co_await h;
        co_return true;
    }(reader)));
}

// --- determinism ------------------------------------------------------------------------

struct scenario_log {
    spindle::clock::time_point start;
    std::vector<std::string> lines;
    void add(const std::string& what) {
        const auto us = std::chrono::duration_cast<std::chrono::microseconds>(loop::now() - start).count();
        lines.push_back(std::to_string(us) + " us: " + what);
    }
};

task<void> worker(int id, spindle::mutex& m, spindle::channel<int>& ch, scenario_log& log) {
    for (int round = 0; round < 3; ++round) {
        (void)co_await spindle::sleep_for(std::chrono::milliseconds((id * 7 + round * 3) % 5 * 100 + 10));
        auto guard = co_await m.lock();
        log.add("worker " + std::to_string(id) + " holds the mutex, round " + std::to_string(round));
        (void)co_await spindle::sleep_for(50ms);
        guard->unlock();
        (void)co_await ch.send(id * 10 + round);
    }
}

task<int> consumer(spindle::channel<int>& ch, scenario_log& log) {
    int sum = 0;
    for (int i = 0; i < 15; ++i) {
        auto r = co_await with_timeout(2s, ch.receive());
        if (!r) {
            log.add("consumer: " + how(r.error()));
            co_return -1;
        }
        log.add("consumer got " + std::to_string(*r));
        sum += *r;
    }
    co_return sum;
}

task<int> racer(scenario_log& log) {
    auto r = co_await spindle::race(
        [](scenario_log& log) -> task<int> {
            (void)co_await spindle::sleep_for(333ms);
            log.add("racer: fast one done");
            co_return 1;
        }(log),
        [](scenario_log& log) -> task<int> {
            std::error_code ec = error_of(co_await spindle::sleep_for(10min));
            log.add("racer: slow one " + how(ec));
            co_return 2;
        }(log));
    co_return std::get<0>(r) + static_cast<int>(r.index());
}

task<std::vector<std::string>> scenario() {
    scenario_log log;
    log.start = loop::now();
    spindle::mutex m;
    spindle::channel<int> ch(2);
    spindle::task_group g;
    for (int id = 0; id < 5; ++id) g.spawn(worker(id, m, ch, log), "worker");
    auto sum = loop::current().spawn(consumer(ch, log), "consumer");
    auto race = loop::current().spawn(racer(log), "racer");
    co_await g.join();
    log.add("sum " + std::to_string(co_await sum));
    log.add("race " + std::to_string(co_await race));
    co_return log.lines;
}

TEST_CASE("virtual time: the same scenario gives the same event log on every run", "[virtual_time][determinism]") {
    auto first = testing::run(scenario());
    auto second = testing::run(scenario());
    loop l(loop_options{.virtual_time = true});
    auto third = run(l, scenario());
    CHECK(first == second);
    CHECK(first == third);
    // Worked out by hand from the sleeps: worker i sleeps ((7i + 3·round) mod 5)·100 + 10 ms,
    // holds the mutex 50 ms (FIFO hand-off), then sends; the channel holds 2.
    const std::vector<std::string> expected{
        "10000 us: worker 0 holds the mutex, round 0",
        "60000 us: consumer got 0",
        "110000 us: worker 3 holds the mutex, round 0",
        "160000 us: consumer got 30",
        "210000 us: worker 1 holds the mutex, round 0",
        "260000 us: consumer got 10",
        "270000 us: worker 1 holds the mutex, round 1",
        "320000 us: worker 4 holds the mutex, round 0",
        "320000 us: consumer got 11",
        "333000 us: racer: fast one done",
        "333000 us: racer: slow one canceled",
        "370000 us: worker 0 holds the mutex, round 1",
        "370000 us: consumer got 40",
        "420000 us: worker 2 holds the mutex, round 0",
        "420000 us: consumer got 1",
        "470000 us: consumer got 20",
        "480000 us: worker 4 holds the mutex, round 1",
        "530000 us: worker 0 holds the mutex, round 2",
        "530000 us: consumer got 41",
        "580000 us: worker 3 holds the mutex, round 1",
        "580000 us: consumer got 2",
        "630000 us: worker 1 holds the mutex, round 2",
        "630000 us: consumer got 31",
        "680000 us: worker 2 holds the mutex, round 1",
        "680000 us: consumer got 12",
        "730000 us: consumer got 21",
        "740000 us: worker 2 holds the mutex, round 2",
        "790000 us: consumer got 22",
        "840000 us: worker 3 holds the mutex, round 2",
        "890000 us: consumer got 32",
        "940000 us: worker 4 holds the mutex, round 2",
        "990000 us: consumer got 42",
        "990000 us: sum 315",
        "990000 us: race 1",
    };
    CHECK(first == expected);
}

// --- spindle::testing::run -----------------------------------------------------------------

task<int> answer_after_an_hour() {
    (void)co_await spindle::sleep_for(1h);
    co_return 42;
}

struct test_failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

task<int> fail_after_a_day() {
    (void)co_await spindle::sleep_for(24h);
    throw test_failure("gave up after a day");
}

task<void> sleep_void(bool& done) {
    (void)co_await spindle::sleep_for(10min);
    done = true;
}

task<void> fail_void() {
    co_await spindle::yield();
    throw test_failure("void failed");
}

TEST_CASE("testing::run: returns the task's value; works for task<void>", "[testing]") {
    CHECK(testing::run(answer_after_an_hour()) == 42);
    bool done = false;
    testing::run(sleep_void(done));
    CHECK(done);

    // In real time when asked.
    const auto wall_start = std::chrono::steady_clock::now();
    auto slept = testing::run(
        []() -> task<offset> {
            const auto start = loop::now();
            (void)co_await spindle::sleep_for(20ms);
            co_return loop::now() - start;
        }(),
        testing::run_options{.virtual_time = false});
    CHECK(slept >= 20ms);
    CHECK(std::chrono::steady_clock::now() - wall_start >= 20ms);
}

TEST_CASE("testing::run: rethrows the task's exception", "[testing]") {
    try {
        (void)testing::run(fail_after_a_day());
        FAIL("no exception");
    } catch (const test_failure& e) {
        CHECK(std::string(e.what()) == "gave up after a day");
    }
    try {
        testing::run(fail_void());
        FAIL("no exception");
    } catch (const test_failure& e) {
        CHECK(std::string(e.what()) == "void failed");
    }
}

task<void> sleep_long() { (void)co_await spindle::sleep_for(1h); }

task<int> detach_a_sleeper() {
    loop::current().spawn(sleep_long(), "leaker").detach();
    co_await spindle::yield();  // the sleeper parks
    co_return 1;
}

TEST_CASE("testing::run: a task left alive is reported as a leak, with the dump of the loop's tasks", "[testing]") {
    try {
        (void)testing::run(detach_a_sleeper());
        FAIL("no exception");
    } catch (const std::runtime_error& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find("left tasks alive") != std::string::npos);
        CHECK(what.find("1 task\n") != std::string::npos);
        CHECK(what.find("  task 2 'leaker': waiting on sleep, due in 3600000 ms for 0 ms\n") != std::string::npos);
    }
    // Without the check, the value comes back (and the loop aborts the sleeper).
    CHECK(testing::run(detach_a_sleeper(), testing::run_options{.check_leaks = false}) == 1);
}

task<int> read_forever(int fd) {
    std::byte b{};
    (void)co_await spindle::read(fd, std::span(&b, 1));
    co_return 0;
}

task<void> wait_forever(spindle::event& ev) { (void)co_await ev.wait(); }

TEST_CASE("testing::run: a task that hangs is reported after the watchdog's real time, naming its wait", "[testing]") {
    pipe_pair p;
    const auto wall_start = std::chrono::steady_clock::now();
    try {
        (void)testing::run(read_forever(p.r), testing::run_options{.watchdog = 200ms});
        FAIL("no exception");
    } catch (const std::runtime_error& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find("still running after 200 ms") != std::string::npos);
        CHECK(what.find("task 1 'block_on': waiting on read on fd " + std::to_string(p.r) + " for ") != std::string::npos);
    }
    CHECK(std::chrono::steady_clock::now() - wall_start >= 200ms);

    spindle::event ev;
    try {
        testing::run(wait_forever(ev), testing::run_options{.watchdog = 100ms});
        FAIL("no exception");
    } catch (const std::runtime_error& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find("still running after 100 ms") != std::string::npos);
        CHECK(what.find("task 1 'block_on': waiting on event for 0 ms") != std::string::npos);
    }
}

}  // namespace
