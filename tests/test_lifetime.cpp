// Lifetimes: what a loop's destruction does to parked tasks, releasing tasks,
// timers and watchers in the middle of a dispatch, and join_handle after abort.
#include "support.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using steady = spindle::clock;
using spindle::task;
using spindle::test::counted;
using spindle::test::error_of;

namespace {

using spindle::test::pipe_pair;
using spindle::test::socket_pair;

// --- tasks parked in every way a task can park ----------------------------------
// Each owns a counted local and one end of a socket pair (through unique_fd);
// `passed` is set only if its wait ever completes.

task<void> park_sleeping(int fd, bool& passed) {
    counted c;
    spindle::unique_fd own(fd);
    std::error_code ec = error_of(co_await spindle::sleep_for(1h));
    (void)ec;
    passed = true;
}

task<void> park_reading(int fd, bool& passed) {
    counted c;
    spindle::unique_fd own(fd);
    std::array<std::byte, 8> buf{};
    auto r = co_await spindle::read(own.get(), buf);  // nothing is ever sent
    (void)r;
    passed = true;
}

task<void> park_joining(int fd, int inner_fd, bool& passed, bool& inner_passed) {
    counted c;
    spindle::unique_fd own(fd);
    auto inner = spindle::loop::current().spawn(park_sleeping(inner_fd, inner_passed));
    co_await inner;
    passed = true;
}

task<void> park_idle(int fd, bool& passed) {
    counted c;
    spindle::unique_fd own(fd);
    // Idle waiters are woken whenever nothing else runs: keep coming back (bounded).
    for (int i = 0; i < 1'000'000; ++i) (void)co_await spindle::idle();
    passed = true;
}

task<void> park_signal(int fd, bool& passed) {
    counted c;
    spindle::unique_fd own(fd);
    auto r = co_await spindle::wait_signal(SIGUSR2);  // never raised
    (void)r;
    passed = true;
}

task<void> sleep_nested(bool& passed) {
    counted c;
    (void)co_await spindle::sleep_for(1h);
    passed = true;
}

task<void> park_nested(int fd, bool& passed, bool& inner_passed) {
    counted c;
    spindle::unique_fd own(fd);
    co_await sleep_nested(inner_passed);  // the inner frame is not a spawned task
    passed = true;
}

task<void> park_when_all(int fd, bool& passed, bool& child1, bool& child2) {
    counted c;
    spindle::unique_fd own(fd);
    auto t1 = sleep_nested(child1);
    auto t2 = sleep_nested(child2);
    co_await spindle::when_all(std::move(t1), std::move(t2));
    passed = true;
}

// --- release during dispatch ---------------------------------------------------

struct batch_abort {
    spindle::join_handle<void> victim;
    bool victim_passed = false;
    bool aborted = false;
    std::size_t timers_left_at_abort = 99;
};

task<void> aborter(steady::time_point when, batch_abort& s) {
    (void)co_await spindle::sleep_until(when);
    // Both timers fired in the phase that woke us: the victim is in this tick's batch.
    s.timers_left_at_abort = spindle::loop::current().timer_count();
    s.victim.abort();
    s.aborted = true;
}

task<void> batch_victim(steady::time_point when, bool& passed) {
    counted c;
    (void)co_await spindle::sleep_until(when);
    passed = true;
}

struct timer_kill {
    std::unique_ptr<spindle::timer> victim;
    int killer_calls = 0;
    int victim_calls = 0;
};
void kill_victim_timer(void* p) {
    auto& s = *static_cast<timer_kill*>(p);
    ++s.killer_calls;
    s.victim.reset();  // destroyed, not just stopped, in the middle of the phase
}
void victim_timer(void* p) { ++static_cast<timer_kill*>(p)->victim_calls; }

struct watcher_pair {
    std::unique_ptr<spindle::watcher> w1;
    std::unique_ptr<spindle::watcher> w2;
    int calls1 = 0;
    int calls2 = 0;
    bool destroy_self = true;
};
void on_w1(void* p) {
    auto& s = *static_cast<watcher_pair*>(p);
    ++s.calls1;
    if (s.destroy_self) s.w1.reset();
    s.w2.reset();
}
void on_w2(void* p) {
    auto& s = *static_cast<watcher_pair*>(p);
    ++s.calls2;
    if (s.destroy_self) s.w2.reset();
    s.w1.reset();
}

task<void> read_one(int fd, bool& passed) {
    counted c;
    std::array<std::byte, 4> buf{};
    auto r = co_await spindle::read(fd, buf);
    passed = r.has_value() && r.value() == 1;
}

// --- join handles ---------------------------------------------------------------

task<int> sleepy_int() {
    (void)co_await spindle::sleep_for(1h);
    co_return 1;
}

task<int> quick_int() { co_return 5; }

struct join_outcome {
    std::error_code code;
    bool other_exception = false;
    bool value_returned = false;
};

task<void> await_handle(spindle::join_handle<int>& h, join_outcome& out) {
    try {
        (void)co_await h;
        out.value_returned = true;
    } catch (const std::system_error& e) {
        out.code = e.code();
    } catch (...) {
        out.other_exception = true;
    }
}

struct self_abort {
    spindle::join_handle<int> me;
    bool threw_logic_error = false;
    bool went_on = false;
};

task<int> try_abort_self(self_abort& s) {
    co_await spindle::yield();  // s.me is set by now
    try {
        s.me.abort();
    } catch (const std::logic_error&) {
        s.threw_logic_error = true;
    }
    s.went_on = true;
    co_return 7;
}

task<int> take_result(spindle::join_handle<int>& h) { co_return co_await h; }

// --- a join handle dropped while a task awaits it --------------------------------

struct dropped_join {
    spindle::join_handle<std::string> handle;
    std::string got;
    bool waiter_done = false;
    bool dropped = false;
    bool dropped_while_waiting = false;
    std::vector<spindle::join_handle<std::string>> others;
};

// Longer than the small-string buffer: the result owns heap memory.
std::string long_text() { return std::string(64, 'r'); }

task<std::string> text_at(steady::time_point when) {
    (void)co_await spindle::sleep_until(when);
    co_return long_text();
}

task<void> join_text(dropped_join& s) {
    s.got = co_await s.handle;  // the handle is dropped by another task meanwhile
    s.waiter_done = true;
}

task<void> drop_text_handle(dropped_join& s) {
    co_await spindle::yield();  // the joiner is parked by now
    s.dropped_while_waiting = !s.waiter_done;
    s.handle = {};
    s.dropped = true;
}

task<std::string> other_text() { co_return "other"; }

task<std::string> take_text(spindle::join_handle<std::string>& h) { co_return co_await h; }

// Wakes in the same timer phase as the joined task, just after it: had the
// finished task's header been freed (the handle is gone), new tasks' headers
// and frames would take its memory before the joiner reads its result.
task<void> spawn_others(steady::time_point when, dropped_join& s) {
    (void)co_await spindle::sleep_until(when);
    for (int i = 0; i < 4; ++i) s.others.push_back(spindle::loop::current().spawn(other_text()));
}

// --- a when_all child that aborts the task awaiting the when_all -----------------

struct aborting_child {
    spindle::join_handle<int> parent;
    bool parent_aborted = false;
    bool killer_went_on = false;
    bool killer_finished = false;
    bool parent_passed = false;
    bool sleeper_passed = false;
};

task<int> abort_awaiting_parent(aborting_child& s) {
    co_await spindle::yield();  // the parent is parked in when_all by now
    s.parent.abort();           // destroys the when_all frame, this task's own join included
    s.parent_aborted = s.parent.done();
    s.killer_went_on = true;
    co_await spindle::yield();  // still a live, schedulable task
    s.killer_finished = true;
    co_return 7;  // its result has nowhere in the parent to go any more
}

task<int> sleep_then_int(bool& passed) {
    counted c;
    (void)co_await spindle::sleep_for(1h);
    passed = true;
    co_return 1;
}

task<int> gather_tuple(aborting_child& s) {
    counted c;
    auto [a, b] = co_await spindle::when_all(abort_awaiting_parent(s), sleep_then_int(s.sleeper_passed));
    s.parent_passed = true;
    co_return a + b;
}

task<int> gather_vector(aborting_child& s) {
    counted c;
    std::vector<task<int>> tasks;
    tasks.push_back(abort_awaiting_parent(s));
    tasks.push_back(sleep_then_int(s.sleeper_passed));
    auto values = co_await spindle::when_all(std::move(tasks));
    s.parent_passed = true;
    co_return values.at(0) + values.at(1);
}

}  // namespace

// -----------------------------------------------------------------------------

TEST_CASE("destroying a loop destroys parked tasks' frames and closes their descriptors", "[lifetime]") {
    counted::alive = 0;
    socket_pair sleeping, reading, joining, joined, idling, signal, nested, gathering;
    bool p_sleep = false, p_read = false, p_join = false, p_joined = false, p_idle = false, p_signal = false;
    bool p_nested = false, p_nested_inner = false, p_all = false, p_child1 = false, p_child2 = false;
    // Handles declared before the loop outlive it: their headers must stay valid.
    std::vector<spindle::join_handle<void>> handles;
    {
        spindle::loop l;
        handles.push_back(l.spawn(park_sleeping(sleeping.give_a(), p_sleep)));
        handles.push_back(l.spawn(park_reading(reading.give_a(), p_read)));
        handles.push_back(l.spawn(park_joining(joining.give_a(), joined.give_a(), p_join, p_joined)));
        handles.push_back(l.spawn(park_idle(idling.give_a(), p_idle)));
        handles.push_back(l.spawn(park_signal(signal.give_a(), p_signal)));
        handles.push_back(l.spawn(park_nested(nested.give_a(), p_nested, p_nested_inner)));
        handles.push_back(l.spawn(park_when_all(gathering.give_a(), p_all, p_child1, p_child2)));
        for (int i = 0; i < 5; ++i) l.run_once(0ns);  // everything starts and parks
        // 7 spawned + the joined one + 2 when_all children.
        REQUIRE(l.task_count() == 10);
        // 8 spawned-task frames, the nested inner frame, the 2 when_all children.
        REQUIRE(counted::alive == 11);
        // While the loop lives the descriptors are open: the check below can fail.
        for (auto* sp : {&sleeping, &reading, &joining, &joined, &idling, &signal, &nested, &gathering})
            CHECK(sp->peek_b() == -EAGAIN);
    }
    CHECK(counted::alive == 0);
    int index = 0;
    for (auto* sp : {&sleeping, &reading, &joining, &joined, &idling, &signal, &nested, &gathering}) {
        INFO("socket pair " << index++);
        CHECK(sp->peek_b() == 0);  // end of stream: the task's end was closed
    }
    for (bool passed : {p_sleep, p_read, p_join, p_joined, p_idle, p_signal, p_nested, p_nested_inner, p_all,
                        p_child1, p_child2})
        CHECK_FALSE(passed);
    for (auto& h : handles) CHECK(h.done());
}

TEST_CASE("a task aborted while in the same tick's ready batch is never resumed", "[lifetime][dispatch]") {
    counted::alive = 0;
    spindle::loop l;
    batch_abort s;
    const auto when = steady::now() + 5ms;
    // The aborter arms first, so its timer fires first in the same phase.
    auto a = l.spawn(aborter(when, s));
    s.victim = l.spawn(batch_victim(when, s.victim_passed));
    const auto give_up = steady::now() + 5s;
    while (!a.done() && steady::now() < give_up) l.run_once(10ms);
    REQUIRE(a.done());
    CHECK(s.timers_left_at_abort == 0);  // the victim had been woken too
    CHECK(s.aborted);
    CHECK(s.victim.done());
    CHECK(counted::alive == 0);  // its frame is gone
    for (int i = 0; i < 3; ++i) l.run_once(0ns);
    CHECK_FALSE(s.victim_passed);
    CHECK(l.task_count() == 0);
}

TEST_CASE("a timer callback destroying a timer due in the same phase: it never fires", "[lifetime][dispatch]") {
    spindle::loop l;
    timer_kill s;
    spindle::timer killer(l);
    s.victim = std::make_unique<spindle::timer>(l);
    killer.start(0ms, &kill_victim_timer, &s);
    s.victim->start(0ms, &victim_timer, &s);
    std::this_thread::sleep_for(1ms);  // both due before the tick
    l.run_once(0ns);
    CHECK(s.killer_calls == 1);
    CHECK(s.victim_calls == 0);
    CHECK_FALSE(s.victim);
    CHECK((l.timer_count() == 0));
}

TEST_CASE("a watcher callback destroying watchers whose events were collected in the same poll", "[lifetime][dispatch]") {
    pipe_pair p1, p2;
    spindle::loop l;
    watcher_pair s;
    SECTION("itself and the other one") { s.destroy_self = true; }
    SECTION("only the other one") { s.destroy_self = false; }
    s.w1 = std::make_unique<spindle::watcher>(l, p1.r, spindle::readable, &on_w1, &s);
    s.w2 = std::make_unique<spindle::watcher>(l, p2.r, spindle::readable, &on_w2, &s);
    // Both readable before the poll: one poll collects both events.
    REQUIRE(p1.put());
    REQUIRE(p2.put());
    l.run_once(0ns);
    INFO("calls: " << s.calls1 << " + " << s.calls2);
    // Whichever ran first destroyed the other, which must not be called.
    CHECK(s.calls1 + s.calls2 == 1);
    if (s.destroy_self) {
        CHECK_FALSE(s.w1);
        CHECK_FALSE(s.w2);
        CHECK_FALSE(l.has_work());  // nothing left watching
    } else {
        // The one that ran lives on; the other is gone.
        CHECK(static_cast<bool>(s.w1) == (s.calls1 == 1));
        CHECK(static_cast<bool>(s.w2) == (s.calls2 == 1));
    }
    l.run_once(0ns);
    CHECK(s.calls1 + s.calls2 == 1);
    s.w1.reset();
    s.w2.reset();
    CHECK_FALSE(l.has_work());
}

TEST_CASE("a task aborted while parked on a read is not resumed when data arrives", "[lifetime][dispatch]") {
    counted::alive = 0;
    pipe_pair p;
    spindle::loop l;
    bool passed = false;
    auto victim = l.spawn(read_one(p.r, passed));
    l.run_once(0ns);
    REQUIRE(counted::alive == 1);
    REQUIRE_FALSE(victim.done());
    victim.abort();
    CHECK(counted::alive == 0);
    REQUIRE(p.put());
    for (int i = 0; i < 3; ++i) l.run_once(5ms);
    CHECK_FALSE(passed);
    // The descriptor still works for a new reader: the old operation was withdrawn.
    bool second = false;
    auto reader = l.spawn(read_one(p.r, second));
    for (int i = 0; i < 20 && !reader.done(); ++i) l.run_once(10ms);
    CHECK(second);
    CHECK_FALSE(passed);
}

TEST_CASE("awaiting the handle of an aborted task throws operation_canceled", "[lifetime][join]") {
    spindle::loop l;
    join_outcome out;
    SECTION("aborted before the await") {
        auto victim = l.spawn(sleepy_int());
        l.run_once(0ns);
        victim.abort();
        CHECK(victim.done());
        spindle::test::run(l, await_handle(victim, out));
    }
    SECTION("aborted while a task awaits it") {
        auto victim = l.spawn(sleepy_int());
        auto joiner = l.spawn(await_handle(victim, out));
        l.run_once(0ns);
        l.run_once(0ns);
        REQUIRE_FALSE(joiner.done());
        victim.abort();
        // The joiner wakes with the error instead of waiting forever.
        for (int i = 0; i < 5 && !joiner.done(); ++i) l.run_once(0ns);
        CHECK(joiner.done());
    }
    CHECK(out.code == std::errc::operation_canceled);
    CHECK_FALSE(out.other_exception);
    CHECK_FALSE(out.value_returned);
}

TEST_CASE("aborting a finished task changes nothing", "[lifetime][join]") {
    spindle::loop l;
    auto h = l.spawn(quick_int());
    l.run_once(0ns);
    REQUIRE(h.done());
    h.abort();
    CHECK(l.block_on(take_result(h)) == 5);
}

TEST_CASE("a task cannot abort itself", "[lifetime][join]") {
    spindle::loop l;
    self_abort s;
    s.me = l.spawn(try_abort_self(s));
    const auto give_up = steady::now() + 5s;
    while (!s.me.done() && steady::now() < give_up) l.run_once(0ns);
    CHECK(s.threw_logic_error);
    CHECK(s.went_on);
    CHECK(l.block_on(take_result(s.me)) == 7);
}

TEST_CASE("a join handle dropped by another task while a task awaits it: the awaiter still gets the result", "[lifetime][join]") {
    spindle::loop l;
    dropped_join s;
    const auto when = steady::now() + 5ms;
    s.handle = l.spawn(text_at(when));       // armed first: wakes first
    auto others = l.spawn(spawn_others(when, s));
    auto waiter = l.spawn(join_text(s));
    auto dropper = l.spawn(drop_text_handle(s));
    const auto give_up = steady::now() + 5s;
    while (!waiter.done() && steady::now() < give_up) l.run_once(10ms);
    REQUIRE(waiter.done());
    CHECK(s.dropped);
    CHECK(s.dropped_while_waiting);
    CHECK(s.waiter_done);
    CHECK(s.got == long_text());
    CHECK(s.others.size() == 4u);
    for (int i = 0; i < 5 && l.has_work(); ++i) l.run_once(10ms);
    CHECK_FALSE(l.has_work());
    CHECK(l.task_count() == 0);
    for (auto& h : s.others) CHECK(l.block_on(take_text(h)) == "other");
}

TEST_CASE("a when_all child that aborts the task awaiting the when_all: no terminate and the loop goes on", "[lifetime][when_all]") {
    counted::alive = 0;
    spindle::loop l;
    aborting_child s;
    SECTION("when_all of a tuple") { s.parent = l.spawn(gather_tuple(s)); }
    SECTION("when_all of a vector") { s.parent = l.spawn(gather_vector(s)); }
    const auto give_up = steady::now() + 5s;
    while (l.has_work() && steady::now() < give_up) l.run_once(10ms);
    CHECK_FALSE(l.has_work());  // the sleeping child was aborted with its parent
    CHECK(s.parent_aborted);
    CHECK(s.killer_went_on);
    CHECK(s.killer_finished);
    CHECK_FALSE(s.parent_passed);
    CHECK_FALSE(s.sleeper_passed);
    CHECK(l.task_count() == 0);
    CHECK(counted::alive == 0);  // the parent's and the sleeper's frames are gone
    join_outcome out;
    spindle::test::run(l, await_handle(s.parent, out));
    CHECK(out.code == std::errc::operation_canceled);
    CHECK_FALSE(out.other_exception);
    CHECK_FALSE(out.value_returned);
}
