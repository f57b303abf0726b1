// task<T>, join_handle, block_on, when_all, and what happens to exceptions.
#include "support.hpp"

#include <sys/resource.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using spindle::task;
using spindle::test::counted;

namespace {

// --- small coroutines (free functions: a capturing lambda would die before its frame) ---

task<int> answer() { co_return 42; }

task<void> set_flag(bool& flag) {
    flag = true;
    co_return;
}

task<int&> ref_to(int& x) { co_return x; }

task<std::unique_ptr<int>> boxed(int v) { co_return std::make_unique<int>(v); }

task<int> mark_started(bool& started, int value) {
    started = true;
    co_return value;
}

task<int> hold_counted(counted c, int value) {
    (void)c;
    co_return value;
}

task<int> throws_runtime(const char* what) {
    throw std::runtime_error(what);
    co_return 0;  // unreachable; makes this a coroutine
}

task<int> middle(const char* what) {
    // Does not catch: the inner failure must travel through this frame.
    int v = co_await throws_runtime(what);
    co_return v + 1;
}

task<void> values_through_awaits(int& out_int, bool& out_void, int*& out_ref_addr, int& referee, int& out_boxed) {
    out_int = co_await answer();
    co_await set_flag(out_void);
    int& r = co_await ref_to(referee);
    out_ref_addr = &r;
    r = 7;  // writes through the reference into `referee`
    std::unique_ptr<int> p = co_await boxed(5);
    out_boxed = *p;
}

task<std::string> nested_failure_caught() {
    try {
        co_await middle("inner boom");
    } catch (const std::runtime_error& e) {
        co_return std::string("caught: ") + e.what();
    }
    co_return "not caught";
}

task<void> empty_task_awaiter(bool& threw_logic) {
    task<int> empty;
    try {
        co_await empty;
    } catch (const std::logic_error&) {
        threw_logic = true;
    }
}

// --- spawn / join -------------------------------------------------------------

task<int> sleepy_value(int v) {
    (void)co_await spindle::sleep_for(1ms);
    co_return v;
}

task<void> sleepy_throw() {
    (void)co_await spindle::sleep_for(1ms);
    throw std::runtime_error("joined boom");
}

struct join_results {
    int value = 0;
    std::string error;
};

task<void> join_children(join_results& out) {
    auto& l = spindle::loop::current();
    auto ok = l.spawn(sleepy_value(11));
    auto bad = l.spawn(sleepy_throw());
    out.value = co_await ok;
    try {
        co_await bad;
    } catch (const std::runtime_error& e) {
        out.error = e.what();
    }
}

task<void> detached_worker(int& steps, bool& finished) {
    for (int i = 0; i < 3; ++i) {
        (void)co_await spindle::sleep_for(1ms);
        ++steps;
    }
    finished = true;
}

// --- deep chains -------------------------------------------------------------

task<int> one() { co_return 1; }

task<long> sum_of_ones(int n) {
    long total = 0;
    for (int i = 0; i < n; ++i) total += co_await one();
    co_return total;
}

task<int> depth(int n) {
    if (n == 0) co_return 0;
    co_return 1 + co_await depth(n - 1);
}

// The same, with a counted local per frame to see every frame live at once and freed.
int g_alive_at_bottom = 0;
task<int> depth_counted(int n) {
    counted c;
    if (n == 0) {
        g_alive_at_bottom = counted::alive;
        co_return 0;
    }
    co_return 1 + co_await depth_counted(n - 1);
}

long peak_rss_kib() {
    ::rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

// --- when_all ----------------------------------------------------------------

task<int> int_after(std::chrono::milliseconds d, int v) {
    (void)co_await spindle::sleep_for(d);
    co_return v;
}

task<void> void_after(std::chrono::milliseconds d, bool& done) {
    (void)co_await spindle::sleep_for(d);
    done = true;
}

task<std::string> string_after(std::chrono::milliseconds d, std::string v) {
    (void)co_await spindle::sleep_for(d);
    co_return v;
}

task<void> logged_sleeper(std::vector<std::string>& events, int id) {
    events.push_back("start " + std::to_string(id));
    (void)co_await spindle::sleep_for(50ms);
    events.push_back("end " + std::to_string(id));
}

task<void> fail_after(std::chrono::milliseconds d, int which) {
    (void)co_await spindle::sleep_for(d);
    if (which == 1) throw std::runtime_error("first in argument order");
    throw std::logic_error("second in argument order");
}

struct when_all_failure {
    std::string caught;
    bool slow_child_done_at_catch = false;
    bool slow_child_done = false;
};

task<void> when_all_with_failures(when_all_failure& out) {
    try {
        // The logic_error child fails first in time; the runtime_error one is
        // first in argument order and must win.
        co_await spindle::when_all(fail_after(20ms, 1), fail_after(1ms, 2),
                                   void_after(40ms, out.slow_child_done));
        out.caught = "nothing";
    } catch (const std::runtime_error& e) {
        out.caught = e.what();
    } catch (const std::logic_error& e) {
        out.caught = std::string("wrong exception: ") + e.what();
    }
    out.slow_child_done_at_catch = out.slow_child_done;
}

task<void> parked_child(counted c, bool& resumed) {
    (void)c;
    (void)co_await spindle::sleep_for(10s);
    resumed = true;
}

task<void> awaits_children(bool& r1, bool& r2, bool& parent_resumed) {
    // Separate statements: a counted{} temporary in the co_await expression
    // would live in this frame until the await ends.
    auto a = parked_child(counted{}, r1);
    auto b = parked_child(counted{}, r2);
    co_await spindle::when_all(std::move(a), std::move(b));
    parent_resumed = true;
}

// --- failures reaching the log -------------------------------------------------

task<void> fails_later() {
    co_await spindle::yield();
    throw std::runtime_error("detached boom");
}

task<void> keeps_going(int& steps) {
    for (int i = 0; i < 20; ++i) {
        co_await spindle::yield();
        ++steps;
    }
}

}  // namespace

// -----------------------------------------------------------------------------

TEST_CASE("task<T>, task<void> and task<T&> deliver their results to the awaiter", "[task]") {
    spindle::loop l;
    int i = 0;
    bool v = false;
    int* addr = nullptr;
    int referee = 1;
    int b = 0;
    l.block_on(values_through_awaits(i, v, addr, referee, b));
    CHECK(i == 42);
    CHECK(v);
    // task<T&> must hand back the very object, not a copy.
    CHECK(addr == &referee);
    CHECK(referee == 7);
    CHECK(b == 5);
}

TEST_CASE("block_on returns the task's value, including references and move-only values", "[task]") {
    spindle::loop l;
    CHECK(l.block_on(answer()) == 42);
    int x = 3;
    int& r = l.block_on(ref_to(x));
    CHECK(&r == &x);
    std::unique_ptr<int> p = l.block_on(boxed(9));
    REQUIRE(p);
    CHECK(*p == 9);
    bool flag = false;
    l.block_on(set_flag(flag));
    CHECK(flag);
}

TEST_CASE("a task is lazy: it does not start until awaited or spawned and run", "[task]") {
    bool started = false;
    SECTION("created, not awaited") {
        {
            auto t = mark_started(started, 1);
            CHECK_FALSE(started);
        }
        // Destroyed without ever running.
        CHECK_FALSE(started);
    }
    SECTION("spawned: runs in a later tick, not inside spawn") {
        spindle::loop l;
        auto h = l.spawn(mark_started(started, 1));
        CHECK_FALSE(started);
        l.run_once(0ns);
        CHECK(started);
        CHECK(h.done());
    }
    SECTION("awaited via block_on") {
        spindle::loop l;
        auto t = mark_started(started, 5);
        CHECK_FALSE(started);
        CHECK(l.block_on(std::move(t)) == 5);
        CHECK(started);
    }
}

TEST_CASE("a task never run destroys its frame and parameters", "[task]") {
    counted::alive = 0;
    {
        auto t = hold_counted(counted{}, 1);
        CHECK(counted::alive == 1);  // the parameter copy lives in the frame
    }
    CHECK(counted::alive == 0);
}

TEST_CASE("task is move-only and a moved-from task is empty", "[task]") {
    CHECK_FALSE(std::is_copy_constructible_v<task<int>>);
    CHECK_FALSE(std::is_copy_assignable_v<task<int>>);
    CHECK(std::is_nothrow_move_constructible_v<task<int>>);
    CHECK(std::is_nothrow_move_assignable_v<task<void>>);
    CHECK_FALSE(std::is_copy_constructible_v<spindle::join_handle<int>>);

    spindle::loop l;
    auto a = answer();
    auto b = std::move(a);
    CHECK_FALSE(a.valid());
    REQUIRE(b.valid());
    CHECK(l.block_on(std::move(b)) == 42);

    // Move-assigning over a live task destroys the old frame.
    counted::alive = 0;
    auto c = hold_counted(counted{}, 1);
    CHECK(counted::alive == 1);
    c = answer();
    CHECK(counted::alive == 0);
    CHECK(l.block_on(std::move(c)) == 42);

    bool threw = false;
    l.block_on(empty_task_awaiter(threw));
    CHECK(threw);  // awaiting an empty task is a logic_error, not a crash
}

TEST_CASE("an exception thrown in a nested task propagates to the awaiter", "[task]") {
    spindle::loop l;
    CHECK(l.block_on(nested_failure_caught()) == "caught: inner boom");
    // ...and out of block_on.
    REQUIRE_THROWS_AS(l.block_on(middle("to the top")), std::runtime_error);
    try {
        l.block_on(middle("message kept"));
        FAIL("block_on did not rethrow");
    } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()) == "message kept");
    }
    // The loop is still usable after a failed block_on.
    CHECK(l.block_on(answer()) == 42);
    CHECK(l.task_count() == 0);
}

TEST_CASE("spawn returns a join_handle whose co_await gives the result or rethrows", "[task]") {
    spindle::loop l;
    spindle::test::log_capture log;
    join_results out;
    spindle::test::run(l, join_children(out));
    CHECK(out.value == 11);
    CHECK(out.error == "joined boom");
    // The failure was observed through the handle: nothing to log.
    CHECK_FALSE(log.contains("joined boom"));
}

TEST_CASE("dropping or detaching the join handle lets the task run on", "[task]") {
    spindle::loop l;
    int steps_a = 0, steps_b = 0;
    bool done_a = false, done_b = false;
    { auto dropped = l.spawn(detached_worker(steps_a, done_a)); }
    auto h = l.spawn(detached_worker(steps_b, done_b));
    h.detach();
    CHECK_FALSE(h.valid());
    CHECK(l.task_count() == 2);
    l.run();
    CHECK(done_a);
    CHECK(done_b);
    CHECK(steps_a == 3);
    CHECK(steps_b == 3);
    CHECK(l.task_count() == 0);
}

TEST_CASE("join_handle::done reports completion; id is nonzero and unique", "[task]") {
    spindle::loop l;
    auto a = l.spawn(sleepy_value(1));
    auto b = l.spawn(sleepy_value(2));
    CHECK(a.id() != 0);
    CHECK(a.id() != b.id());
    CHECK_FALSE(a.done());
    l.run();
    CHECK(a.done());
    CHECK(b.done());
}

TEST_CASE("a million synchronously completing awaits in a loop run in constant stack", "[task][deep]") {
    spindle::loop l;
    // Each child completes without suspending; without symmetric transfer
    // every await would nest a resume() and overflow the stack.
    CHECK(l.block_on(sum_of_ones(1'000'000)) == 1'000'000);
}

TEST_CASE("a recursive task of depth one million neither overflows the stack nor leaks", "[task][deep]") {
    spindle::loop l;
    const long before = peak_rss_kib();
    CHECK(l.block_on(depth(1'000'000)) == 1'000'000);
    const long grown_mib = (peak_rss_kib() - before) / 1024;
    INFO("peak RSS grew by " << grown_mib << " MiB for 1e6 live frames");
    // Frames are ~100 bytes each (a few times that with sanitizer redzones).
    CHECK(grown_mib < 2048);

    // Every frame is live at the bottom of the recursion and freed afterwards.
    counted::alive = 0;
    g_alive_at_bottom = 0;
    CHECK(l.block_on(depth_counted(1'000'000)) == 1'000'000);
    CHECK(g_alive_at_bottom == 1'000'001);
    CHECK(counted::alive == 0);
}

TEST_CASE("when_all gives results in argument order, task<void> as monostate", "[task][when_all]") {
    spindle::loop l;
    bool void_done = false;
    // The first argument finishes last: order must follow the arguments, not completion.
    auto [i, m, s] = l.block_on(
        spindle::when_all(int_after(30ms, 1), void_after(15ms, void_done), string_after(1ms, "three")));
    CHECK(i == 1);
    CHECK(std::is_same_v<decltype(m), std::monostate>);
    CHECK(void_done);
    CHECK(s == "three");
}

TEST_CASE("when_all over a vector gives results in the vector's order", "[task][when_all]") {
    spindle::loop l;
    std::vector<task<int>> tasks;
    for (int k = 0; k < 5; ++k) tasks.push_back(int_after(std::chrono::milliseconds(10 - 2 * k), k));
    auto out = l.block_on(spindle::when_all(std::move(tasks)));
    REQUIRE(out.size() == 5);
    for (int k = 0; k < 5; ++k) CHECK(out[static_cast<std::size_t>(k)] == k);

    auto none = l.block_on(spindle::when_all(std::vector<task<int>>{}));
    CHECK(none.empty());
}

TEST_CASE("when_all runs its tasks concurrently: all start before any finishes", "[task][when_all]") {
    spindle::loop l;
    std::vector<std::string> events;
    std::vector<task<void>> tasks;
    for (int k = 0; k < 3; ++k) tasks.push_back(logged_sleeper(events, k));
    l.block_on(spindle::when_all(std::move(tasks)));
    REQUIRE(events.size() == 6);
    // Run one after the other, the events would interleave start/end pairs.
    for (std::size_t k = 0; k < 3; ++k) {
        INFO("event " << k << " is " << events[k]);
        CHECK(events[k].rfind("start", 0) == 0);
    }
    for (std::size_t k = 3; k < 6; ++k) {
        INFO("event " << k << " is " << events[k]);
        CHECK(events[k].rfind("end", 0) == 0);
    }
}

TEST_CASE("when_all rethrows the first failure in argument order, after all finished", "[task][when_all]") {
    spindle::loop l;
    spindle::test::log_capture log;
    when_all_failure out;
    spindle::test::run(l, when_all_with_failures(out));
    CHECK(out.caught == "first in argument order");
    // The slow, successful child was waited for before the rethrow.
    CHECK(out.slow_child_done_at_catch);
    CHECK(l.task_count() == 0);
}

TEST_CASE("aborting the task awaiting when_all aborts its children", "[task][when_all]") {
    spindle::loop l;
    counted::alive = 0;
    bool r1 = false, r2 = false, parent_resumed = false;
    auto parent = l.spawn(awaits_children(r1, r2, parent_resumed));
    // Run until both children are parked in their sleeps (bounded).
    for (int i = 0; i < 20 && l.timer_count() < 2; ++i) l.run_once(0ns);
    REQUIRE(l.timer_count() == 2);
    REQUIRE(counted::alive == 2);
    REQUIRE(l.task_count() == 3);  // parent and two children

    parent.abort();
    CHECK(parent.done());
    // The children's frames (and their counted parameters) are gone...
    CHECK(counted::alive == 0);
    CHECK(l.task_count() == 0);
    // ...and nothing keeps the loop alive or resumes them later.
    CHECK_FALSE(l.has_work());
    for (int i = 0; i < 5; ++i) l.run_once(0ns);
    CHECK_FALSE(r1);
    CHECK_FALSE(r2);
    CHECK_FALSE(parent_resumed);
}

TEST_CASE("an exception in a detached task is logged with its id and name; the loop goes on", "[task][log]") {
    spindle::loop l;
    spindle::test::log_capture log;
    int steps = 0;
    auto bad = l.spawn(fails_later(), "bad-task");
    const auto bad_id = bad.id();
    bad.detach();
    auto good = l.spawn(keeps_going(steps));
    REQUIRE_NOTHROW(l.run());
    CHECK(steps == 20);
    CHECK(good.done());
    // One line names the task by id and name and carries the exception's message.
    bool found = false;
    for (const auto& line : log.lines()) {
        INFO("log: " << line);
        if (line.find("bad-task") != std::string::npos &&
            line.find("task " + std::to_string(bad_id) + " ") != std::string::npos &&
            line.find("detached boom") != std::string::npos)
            found = true;
    }
    CHECK(found);
}

TEST_CASE("a failure nobody observed is logged when its handle is dropped", "[task][log]") {
    spindle::loop l;
    spindle::test::log_capture log;
    {
        auto h = l.spawn(fails_later(), "unobserved");
        l.run();
        CHECK(h.done());
        // Still held: someone may yet await it, so nothing is logged yet.
        CHECK_FALSE(log.contains("unobserved"));
    }
    CHECK(log.contains("unobserved"));
    CHECK(log.contains("detached boom"));
}

TEST_CASE("an exception in a posted callback is logged and the loop goes on", "[task][log]") {
    spindle::loop l;
    spindle::test::log_capture log;
    bool later_ran = false;
    int steps = 0;
    l.post([] { throw std::runtime_error("post boom"); });
    l.post([&later_ran] { later_ran = true; });
    auto h = l.spawn(keeps_going(steps));
    REQUIRE_NOTHROW(l.run());
    CHECK(later_ran);
    CHECK(steps == 20);
    CHECK(log.contains("posted callback failed"));
    CHECK(log.contains("post boom"));
}
