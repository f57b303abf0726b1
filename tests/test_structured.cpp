// Structured concurrency: race (variadic and vector), task_group, and
// join_handle::cancel. Every race proves with counters that the losers had
// finished before race returned; every group that it waited for all its
// children before join() returned; and, with counted locals, that aborting or
// destroying the owner of children destroys their frames (no leak, no child
// running on against freed state).
#define CATCH_CONFIG_ENABLE_PAIR_STRINGMAKER  // print the (what, when) pairs compared below
#include "support.hpp"

#include <spindle/channel.hpp>
#include <spindle/event.hpp>
#include <spindle/mutex.hpp>
#include <spindle/task_group.hpp>
#include <spindle/race.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using spindle::join_handle;
using spindle::loop;
using spindle::race;
using spindle::result;
using spindle::task;
using spindle::task_group;
using spindle::with_timeout;
using spindle::test::counted;
using spindle::test::error_of;
using spindle::test::pipe_pair;
using spindle::test::run;
using spindle::test::run_leaving_tasks;
using spindle::test::run_until;
using spindle::test::settle;

namespace {

const std::error_code no_error{};

/// How a wait ended, by condition: I/O reports errno codes in the system
/// category, the runtime's own waits in the generic one.
std::string how(std::error_code ec) {
    if (!ec) return "ok";
    if (ec == std::errc::operation_canceled) return "canceled";
    if (ec == std::errc::timed_out) return "timed out";
    return ec.message();
}

/// A child's number and how its wait ended.
using wait_end = std::pair<int, std::string>;

/// What the children of a race or a group did: each records how its wait
/// ended, and `finished` counts the frames that are gone (returned, threw or
/// were destroyed), since the recorder is a local of each child.
struct journal {
    std::vector<wait_end> waits;
    int finished = 0;
};

struct finish_mark {
    journal& j;
    ~finish_mark() { ++j.finished; }
};

void throw_if_error(std::error_code ec) {
    if (ec) throw std::system_error(ec);
}

task<int> sleep_then(std::chrono::nanoseconds d, int id, journal& j) {
    finish_mark mark{j};
    std::error_code ec = error_of(co_await spindle::sleep_for(d));
    j.waits.emplace_back(id, how(ec));
    co_return id;
}

task<std::string> wait_event_then(spindle::event& ev, int id, journal& j) {
    finish_mark mark{j};
    std::error_code ec = error_of(co_await ev.wait());
    j.waits.emplace_back(id, how(ec));
    co_return "event " + std::to_string(id);
}

task<void> read_pipe_then(int fd, int id, journal& j) {
    finish_mark mark{j};
    std::byte b{};
    auto r = co_await spindle::read(fd, std::span(&b, 1));
    j.waits.emplace_back(id, how(r.error()));
}

task<std::error_code> sleep_code(std::chrono::nanoseconds d, int id, journal& j) {
    finish_mark mark{j};
    std::error_code ec = error_of(co_await spindle::sleep_for(d));
    j.waits.emplace_back(id, how(ec));
    co_return ec;
}

task<std::error_code> event_code(spindle::event& ev, int id, journal& j) {
    finish_mark mark{j};
    std::error_code ec = error_of(co_await ev.wait());
    j.waits.emplace_back(id, how(ec));
    co_return ec;
}

task<std::error_code> read_code(int fd, int id, journal& j) {
    finish_mark mark{j};
    std::byte b{};
    auto r = co_await spindle::read(fd, std::span(&b, 1));
    j.waits.emplace_back(id, how(r.error()));
    co_return r.error();
}

/// Sleeps, and throws when the sleep was cut off.
task<int> sleep_or_throw(std::chrono::nanoseconds d, int id, journal& j) {
    finish_mark mark{j};
    std::error_code ec = error_of(co_await spindle::sleep_for(d));
    j.waits.emplace_back(id, how(ec));
    throw_if_error(ec);
    co_return id;
}

task<int> fail_after(std::chrono::nanoseconds d, int id, journal& j) {
    finish_mark mark{j};
    std::error_code ec = error_of(co_await spindle::sleep_for(d));
    j.waits.emplace_back(id, how(ec));
    throw std::runtime_error("child " + std::to_string(id) + " failed");
}

task<int> value_now(int v) { co_return v; }

task<void> void_now() { co_return; }

task<void> counted_sleep(std::chrono::nanoseconds d) {
    counted c;
    (void)co_await spindle::sleep_for(d);
}

task<void> counted_read(int fd) {
    counted c;
    std::byte b{};
    (void)co_await spindle::read(fd, std::span(&b, 1));
}

task<void> counted_event(spindle::event& ev) {
    counted c;
    (void)co_await ev.wait();
}

// --- race ----------------------------------------------------------------------

struct race_report {
    std::size_t index = 99;
    int value = 0;
    int finished_at_return = -1;
    std::size_t tasks_at_return = 0;
};

task<race_report> race_three(spindle::event& ev, int fd, journal& j) {
    auto r = co_await race(sleep_then(10ms, 0, j), wait_event_then(ev, 1, j), read_pipe_then(fd, 2, j));
    race_report rep;
    rep.finished_at_return = j.finished;
    rep.tasks_at_return = loop::current().task_count();
    rep.index = r.index();
    if (r.index() == 0) rep.value = std::get<0>(r);
    co_return rep;
}

TEST_CASE("race: the first to finish wins; every loser is cancelled and finished before it returns", "[race]") {
    pipe_pair p;
    loop l;
    spindle::event ev;
    journal j;
    const auto start = spindle::clock::now();
    race_report rep = run(l, race_three(ev, p.r, j));
    CHECK(spindle::clock::now() - start < 5s);
    CHECK(rep.index == 0);
    CHECK(rep.value == 0);
    CHECK(rep.finished_at_return == 3);  // the two losers' frames were gone already
    CHECK(rep.tasks_at_return == 1);     // the racing task alone: no child left
    REQUIRE(j.waits.size() == 3);
    CHECK(j.waits[0] == wait_end{0, "ok"});
    // Each loser records how its wait ended (a read's cancellation may come
    // back a poll later than the event's, depending on the backend: sort).
    std::vector<wait_end> losers(j.waits.begin() + 1, j.waits.end());
    std::sort(losers.begin(), losers.end(), [](auto& a, auto& b) { return a.first < b.first; });
    CHECK(losers[0] == wait_end{1, "canceled"});
    CHECK(losers[1] == wait_end{2, "canceled"});
    // The cancelled read withdrew before it took anything.
    REQUIRE(p.put('q'));
    char c = 0;
    CHECK(::read(p.r, &c, 1) == 1);
    CHECK(c == 'q');
    CHECK(l.task_count() == 0);
}

task<std::pair<std::pair<std::size_t, int>, int>> race_vector(journal& j) {
    const std::chrono::milliseconds delays[] = {500ms, 20ms, 10s, 1h, 300ms};
    std::vector<task<int>> tasks;
    for (int id = 0; id < 5; ++id) tasks.push_back(sleep_then(delays[id], id, j));
    auto r = co_await race(std::move(tasks));
    co_return std::pair(r, j.finished);
}

TEST_CASE("race (vector): the index and value of the first to finish; the other four finished before it returned", "[race]") {
    loop l;
    journal j;
    auto [r, finished] = run(l, race_vector(j));
    CHECK(r.first == 1);
    CHECK(r.second == 1);
    CHECK(finished == 5);
    REQUIRE(j.waits.size() == 5);
    CHECK(j.waits[0] == wait_end{1, "ok"});
    // Cancelled in index order, resumed in that order.
    CHECK(j.waits[1] == wait_end{0, "canceled"});
    CHECK(j.waits[2] == wait_end{2, "canceled"});
    CHECK(j.waits[3] == wait_end{3, "canceled"});
    CHECK(j.waits[4] == wait_end{4, "canceled"});
}

TEST_CASE("race: tasks that finish in the same tick: the first in argument order wins", "[race]") {
    loop l;
    auto body = []() -> task<std::pair<std::size_t, int>> {
        auto r = co_await race(value_now(10), value_now(20), value_now(30));
        co_return std::pair(r.index(), std::visit([](int v) { return v; }, r));
    };
    auto [index, value] = run(l, body());
    CHECK(index == 0);
    CHECK(value == 10);

    auto body2 = []() -> task<std::pair<std::size_t, int>> {
        std::vector<task<int>> v;
        v.push_back(value_now(7));
        v.push_back(value_now(8));
        co_return co_await race(std::move(v));
    };
    CHECK(run(l, body2()) == std::pair<std::size_t, int>(0, 7));
}

task<int> race_with_thrower(journal& j, int& finished_when_caught) {
    try {
        (void)co_await race(sleep_then(1h, 0, j), fail_after(5ms, 1, j), sleep_then(1h, 2, j));
    } catch (const std::runtime_error& e) {
        finished_when_caught = j.finished;
        if (std::string(e.what()) == "child 1 failed") co_return 1;
        co_return -1;
    }
    co_return 0;
}

TEST_CASE("race: a winner that throws: its exception is rethrown once the losers finished", "[race]") {
    loop l;
    journal j;
    int finished_when_caught = -1;
    CHECK(run(l, race_with_thrower(j, finished_when_caught)) == 1);
    CHECK(finished_when_caught == 3);
    REQUIRE(j.waits.size() == 3);
    CHECK(j.waits[0] == wait_end{1, "ok"});
    CHECK(j.waits[1] == wait_end{0, "canceled"});
    CHECK(j.waits[2] == wait_end{2, "canceled"});

    // The vector form too; a loser that throws its own cancellation is dropped.
    auto body = [](journal& j) -> task<std::string> {
        std::vector<task<int>> v;
        v.push_back(sleep_or_throw(1h, 0, j));
        v.push_back(fail_after(1ms, 1, j));
        try {
            (void)co_await race(std::move(v));
        } catch (const std::exception& e) {
            co_return e.what();
        }
        co_return "no exception";
    };
    journal j2;
    CHECK(run(l, body(j2)) == "child 1 failed");
    CHECK(j2.finished == 2);
}

task<std::size_t> race_pipes(int a, int b, journal& j) {
    auto r = co_await race(read_code(a, 0, j), read_code(b, 1, j), sleep_code(20ms, 2, j));
    co_return r.index();
}

TEST_CASE("race: losers blocked on pipe reads are cancelled and take no bytes", "[race][io]") {
    pipe_pair a;
    pipe_pair b;
    loop l;
    journal j;
    CHECK(run(l, race_pipes(a.r, b.r, j)) == 2);
    CHECK(j.finished == 3);
    REQUIRE(j.waits.size() == 3);
    CHECK(j.waits[0] == wait_end{2, "ok"});
    std::vector<wait_end> losers(j.waits.begin() + 1, j.waits.end());
    std::sort(losers.begin(), losers.end(), [](auto& x, auto& y) { return x.first < y.first; });
    CHECK(losers[0] == wait_end{0, "canceled"});
    CHECK(losers[1] == wait_end{1, "canceled"});
    // Nothing is left armed on the descriptors: bytes written now stay in the pipes.
    REQUIRE(a.put('a'));
    REQUIRE(b.put('b'));
    settle(l);
    char c = 0;
    CHECK(::read(a.r, &c, 1) == 1);
    CHECK(c == 'a');
    CHECK(::read(b.r, &c, 1) == 1);
    CHECK(c == 'b');
}

// A deadline around race expires: the race's wait is cancelled, which
// cancels every child; the first child to finish (with its cancellation)
// decides the race, and race still waits for the others. race gives a
// plain variant, so with_timeout gives a result of it: timed_out, since the
// deadline cut the race short, whether the winner returned an error code
// (then dropped with the variant) or threw its cancellation. The children's
// own waits were cancelled by join_handle::cancel: operation_canceled.
TEST_CASE("race: a timeout around it cancels every child; the race ends once all have finished", "[race][timeout]") {
    pipe_pair p;
    loop l;
    spindle::event ev;

    SECTION("children returning error codes: each got operation_canceled; the race is timed_out") {
        journal j;
        auto body = [](spindle::event& ev, int fd, journal& j) -> task<std::pair<std::error_code, int>> {
            auto r = co_await with_timeout(30ms, race(sleep_code(1h, 0, j), event_code(ev, 1, j), read_code(fd, 2, j)));
            co_return std::pair(r.error(), j.finished);
        };
        const auto start = spindle::clock::now();
        auto [race_code, finished] = run(l, body(ev, p.r, j));
        CHECK(spindle::clock::now() - start >= 30ms);
        CHECK(how(race_code) == "timed out");
        CHECK(finished == 3);
        REQUIRE(j.waits.size() == 3);
        for (auto& w : j.waits) CHECK(w.second == "canceled");
    }
    SECTION("children that throw their cancellation: the caller gets timed_out, not an exception") {
        journal j;
        auto body = [](journal& j) -> task<std::error_code> {
            auto r = co_await with_timeout(30ms, race(sleep_or_throw(1h, 0, j), sleep_or_throw(2h, 1, j)));
            co_return r.error();
        };
        CHECK(how(run(l, body(j))) == "timed out");
        CHECK(j.finished == 2);
        REQUIRE(j.waits.size() == 2);
        CHECK(j.waits[0].second == "canceled");
        CHECK(j.waits[1].second == "canceled");
    }
    CHECK(l.task_count() == 0);
}

task<void> race_counted(spindle::event& ev, int fd) {
    (void)co_await race(counted_sleep(1h), counted_read(fd), counted_event(ev));
}

task<void> race_counted_vector(spindle::event& ev) {
    std::vector<task<void>> v;
    for (int i = 0; i < 4; ++i) v.push_back(counted_event(ev));
    v.push_back(counted_sleep(1h));
    (void)co_await race(std::move(v));
}

TEST_CASE("race: aborting the awaiting task aborts the children; their frames are destroyed at once", "[race][lifetime]") {
    pipe_pair p;
    loop l;
    spindle::event ev;
    counted::alive = 0;
    auto parent = l.spawn(race_counted(ev, p.r), "parent");
    auto parent2 = l.spawn(race_counted_vector(ev), "parent2");
    settle(l);
    CHECK(counted::alive == 8);
    CHECK(l.task_count() == 10);
    parent.abort();
    CHECK(counted::alive == 5);
    CHECK(l.task_count() == 6);
    parent2.abort();
    CHECK(counted::alive == 0);
    CHECK(l.task_count() == 0);
    CHECK(parent.done());
    CHECK_FALSE(l.has_work());
    // Nothing of theirs is left in the loop: the event and the pipe wake nobody.
    ev.set();
    REQUIRE(p.put());
    settle(l);
    auto observe = [](join_handle<void>& h) -> task<std::error_code> {
        try {
            co_await h;
        } catch (const std::system_error& e) {
            co_return e.code();
        }
        co_return no_error;
    };
    CHECK(how(l.block_on(observe(parent))) == "canceled");
}

TEST_CASE("race: destroying the loop while the race is parked destroys every frame", "[race][lifetime]") {
    pipe_pair p;
    counted::alive = 0;
    {
        loop l;
        spindle::event ev;
        auto parent = l.spawn(race_counted(ev, p.r));
        settle(l);
        CHECK(counted::alive == 3);
    }
    CHECK(counted::alive == 0);
}

task<void> abort_handle_then_finish(join_handle<void>*& target, journal& j) {
    finish_mark mark{j};
    co_await spindle::yield();
    target->abort();  // destroys the frame that awaits this very race or group
    *target = {};     // and frees its header
    co_await spindle::yield();
    j.waits.emplace_back(0, "ok");
}

task<void> race_aborted_by_child(join_handle<void>*& self, journal& j) {
    (void)co_await race(abort_handle_then_finish(self, j), sleep_then(1h, 1, j));
}

task<void> group_aborted_by_child(join_handle<void>*& self, journal& j) {
    task_group g;
    g.spawn(abort_handle_then_finish(self, j));
    g.spawn(sleep_then(1h, 1, j));
    co_await g.join();
}

// A child that aborts the task awaiting it: that child cannot be destroyed
// while it runs, so it runs on, and must not touch the race or the group that
// lived in the aborted frame (under AddressSanitizer, a use after free).
TEST_CASE("race and task_group: a child that aborts the awaiting task runs on without touching freed state",
          "[race][task_group][lifetime]") {
    loop l;
    journal j;
    join_handle<void>* self = nullptr;
    SECTION("race") {
        auto parent = l.spawn(race_aborted_by_child(self, j));
        self = &parent;
        REQUIRE(run_until(l, [&] { return l.task_count() == 0; }));
        CHECK_FALSE(parent.valid());
    }
    SECTION("task_group") {
        auto parent = l.spawn(group_aborted_by_child(self, j));
        self = &parent;
        REQUIRE(run_until(l, [&] { return l.task_count() == 0; }));
        CHECK_FALSE(parent.valid());
    }
    // The sleeper was aborted with the parent; the aborting child finished normally.
    CHECK(j.finished == 2);
    REQUIRE(j.waits.size() == 1);
    CHECK(j.waits[0] == wait_end{0, "ok"});
}

TEST_CASE("race of one task: its value at index 0; the vector form too; an empty vector is refused", "[race]") {
    loop l;
    auto one = []() -> task<int> {
        auto r = co_await race(value_now(5));
        static_assert(std::is_same_v<decltype(r), std::variant<int>>);
        co_return std::get<0>(r);
    };
    CHECK(run(l, one()) == 5);

    auto one_void = []() -> task<bool> {
        auto r = co_await race(void_now());
        static_assert(std::is_same_v<decltype(r), std::variant<std::monostate>>);
        co_return r.index() == 0;
    };
    CHECK(run(l, one_void()));

    auto one_vector = []() -> task<std::pair<std::size_t, int>> {
        std::vector<task<int>> v;
        v.push_back(value_now(6));
        co_return co_await race(std::move(v));
    };
    CHECK(run(l, one_vector()) == std::pair<std::size_t, int>(0, 6));

    auto none = []() -> task<bool> {
        try {
            (void)co_await race(std::vector<task<int>>{});
        } catch (const std::invalid_argument&) {
            co_return true;
        }
        co_return false;
    };
    CHECK(run(l, none()));
    CHECK(l.task_count() == 0);
}

// --- task_group -----------------------------------------------------------------

task<std::pair<int, std::size_t>> group_of_three(journal& j) {
    task_group g;
    g.spawn(sleep_then(30ms, 0, j), "a");
    g.spawn(sleep_then(10ms, 1, j), "b");
    g.spawn(sleep_then(20ms, 2, j), "c");
    const std::size_t before = g.size();
    co_await g.join();
    co_return std::pair(j.finished * 10 + static_cast<int>(g.size()), before);
}

TEST_CASE("task_group: join waits for every child", "[task_group]") {
    loop l;
    journal j;
    auto [finished_and_size, before] = run(l, group_of_three(j));
    CHECK(before == 3);
    CHECK(finished_and_size == 30);  // three finished, none running
    REQUIRE(j.waits.size() == 3);
    CHECK(j.waits[0] == wait_end{1, "ok"});
    CHECK(j.waits[1] == wait_end{2, "ok"});
    CHECK(j.waits[2] == wait_end{0, "ok"});

    // An empty group joins at once; a group can be joined again after more spawns.
    auto twice = [](journal& j) -> task<int> {
        task_group g;
        co_await g.join();
        g.spawn(sleep_then(1ms, 7, j));
        co_await g.join();
        g.spawn(sleep_then(1ms, 8, j));
        co_await g.join();
        co_return j.finished;
    };
    journal j2;
    CHECK(run(l, twice(j2)) == 2);
    CHECK(l.task_count() == 0);
}

struct failure_report {
    std::string what;
    int finished_when_caught = -1;
    std::chrono::nanoseconds took{};
};

task<failure_report> group_with_failure(spindle::event& ev, journal& j) {
    failure_report rep;
    const auto start = spindle::clock::now();
    task_group g;
    g.spawn(sleep_then(1h, 0, j), "long sleep");
    g.spawn(fail_after(10ms, 1, j), "fails");
    g.spawn(wait_event_then(ev, 2, j), "event");
    g.spawn(sleep_or_throw(2h, 3, j), "throws its cancellation");  // a later failure: not the one rethrown
    try {
        co_await g.join();
    } catch (const std::exception& e) {
        rep.what = e.what();
        rep.finished_when_caught = j.finished;
    }
    rep.took = spindle::clock::now() - start;
    co_return rep;
}

TEST_CASE("task_group: the first failure cancels the siblings; join rethrows it after all finished", "[task_group]") {
    loop l;
    spindle::event ev;
    journal j;
    failure_report rep = run(l, group_with_failure(ev, j));
    CHECK(rep.what == "child 1 failed");
    CHECK(rep.finished_when_caught == 4);
    CHECK(rep.took < 5s);  // the hour-long sleep was cut short
    REQUIRE(j.waits.size() == 4);
    CHECK(j.waits[0] == wait_end{1, "ok"});
    std::vector<wait_end> rest(j.waits.begin() + 1, j.waits.end());
    std::sort(rest.begin(), rest.end(), [](auto& a, auto& b) { return a.first < b.first; });
    CHECK(rest[0] == wait_end{0, "canceled"});
    CHECK(rest[1] == wait_end{2, "canceled"});
    CHECK(rest[2] == wait_end{3, "canceled"});
    CHECK(l.task_count() == 0);
}

task<std::vector<wait_end>> spawn_after_cancel(journal& j) {
    task_group g;
    g.spawn(sleep_then(1h, 0, j));
    g.cancel();
    g.spawn(sleep_then(1h, 1, j));  // the group is cancelled: so is a newcomer
    co_await g.join();
    // join() ends the cancelled state: the group runs children normally again.
    g.spawn(sleep_then(1ms, 2, j));
    co_await g.join();
    // A failure cancels newcomers too, until the join that reports it.
    g.spawn(fail_after(1ms, 3, j));
    (void)co_await spindle::sleep_for(20ms);
    g.spawn(sleep_then(1h, 4, j));
    try {
        co_await g.join();
    } catch (const std::runtime_error&) {
    }
    co_return j.waits;
}

TEST_CASE("task_group: a child spawned after cancel() or after a failure is cancelled too", "[task_group]") {
    loop l;
    journal j;
    auto waits = run(l, spawn_after_cancel(j));
    REQUIRE(waits.size() == 5);
    CHECK(waits[0] == wait_end{0, "canceled"});
    CHECK(waits[1] == wait_end{1, "canceled"});
    CHECK(waits[2] == wait_end{2, "ok"});
    CHECK(waits[3] == wait_end{3, "ok"});
    CHECK(waits[4] == wait_end{4, "canceled"});
    CHECK(j.finished == 5);
}

task<std::pair<int, std::size_t>> group_dropped(spindle::event& ev, int fd) {
    {
        task_group g;
        g.spawn(counted_sleep(1h));
        g.spawn(counted_read(fd));
        g.spawn(counted_event(ev));
        g.spawn(counted_sleep(0ns));  // not started yet when the group goes
        (void)co_await spindle::yield();
        (void)co_await spindle::yield();
    }
    co_return std::pair(counted::alive, loop::current().task_count());
}

TEST_CASE("task_group: destroying a group with running children aborts them; their frames are destroyed", "[task_group][lifetime]") {
    pipe_pair p;
    loop l;
    spindle::event ev;
    counted::alive = 0;
    counted::constructed = 0;
    auto [alive, tasks] = run(l, group_dropped(ev, p.r));
    CHECK(counted::constructed == 4);
    CHECK(alive == 0);
    CHECK(tasks == 1);  // the body alone
    ev.set();
    REQUIRE(p.put());
    settle(l);
    CHECK(l.task_count() == 0);
}

task<void> helper_sleep(std::chrono::milliseconds d, bool& done) {
    // A fresh task: not cancelled, so its sleep runs in full.
    (void)co_await spindle::sleep_for(d);
    done = true;
}

task<void> child_with_slow_cleanup(int id, journal& j, int& cleanups) {
    finish_mark mark{j};
    std::error_code ec = error_of(co_await spindle::sleep_for(1h));
    j.waits.emplace_back(id, how(ec));
    bool done = false;
    auto helper = loop::current().spawn(helper_sleep(30ms, done));
    co_await helper;  // a join cannot be cancelled
    if (done) ++cleanups;
}

task<int> join_children(journal& j, int& cleanups) {
    task_group g;
    for (int i = 0; i < 3; ++i) g.spawn(child_with_slow_cleanup(i, j, cleanups));
    co_await g.join();
    co_return j.finished * 10 + cleanups;
}

TEST_CASE("task_group: cancelling the task awaiting join cancels the children, and join still waits for them", "[task_group]") {
    loop l;
    journal j;
    int cleanups = 0;
    auto h = l.spawn(join_children(j, cleanups));
    settle(l);
    REQUIRE(l.task_count() == 4);
    h.cancel();
    REQUIRE(run_until(l, [&] { return h.done(); }));
    CHECK(l.block_on([](join_handle<int>& h) -> task<int> { co_return co_await h; }(h)) == 33);
    REQUIRE(j.waits.size() == 3);
    for (auto& w : j.waits) CHECK(w.second == "canceled");

    // Under a deadline the same: join returns once the children are done.
    journal j2;
    int cleanups2 = 0;
    auto timed = [](journal& j, int& cleanups) -> task<int> {
        task_group g;
        for (int i = 0; i < 2; ++i) g.spawn(child_with_slow_cleanup(i, j, cleanups));
        result<void> joined = co_await with_timeout(10ms, g.join());
        co_return (joined.error() == std::errc::timed_out ? 100 : 0) + j.finished * 10 + cleanups;
    };
    CHECK(run(l, timed(j2, cleanups2)) == 122);
}

task<void> count_after_event(spindle::event& ev, int& count) {
    std::error_code ec = error_of(co_await ev.wait());  // (not inside the if: g++ 12 miscompiles a co_await in a condition)
    if (!ec) ++count;
}

task<std::pair<int, std::size_t>> ten_thousand(int& count) {
    spindle::event ev;
    task_group g;
    for (int i = 0; i < 10'000; ++i) g.spawn(count_after_event(ev, count));
    (void)co_await spindle::yield();
    const std::size_t running = g.size();
    ev.set();
    co_await g.join();
    co_return std::pair(count, running);
}

TEST_CASE("task_group: 10,000 children", "[task_group][stress]") {
    loop l;
    int count = 0;
    auto [n, running] = run(l, ten_thousand(count), 60s);
    CHECK(running == 10'000);
    CHECK(n == 10'000);
    CHECK(l.task_count() == 0);

    // And 10,000 cancelled by one failure.
    auto cancelled = []() -> task<int> {
        journal j;
        task_group g;
        for (int i = 0; i < 10'000; ++i) g.spawn(sleep_then(1h, i, j));
        g.spawn(fail_after(1ms, -1, j));
        try {
            co_await g.join();
        } catch (const std::runtime_error&) {
        }
        int n = 0;
        for (auto& w : j.waits) n += w.second == "canceled";
        co_return n * 10 + (j.finished == 10'001);
    };
    CHECK(run(l, cancelled(), 60s) == 100'001);
}

task<void> join_group(task_group& g) { co_await g.join(); }

task<void> spawn_into(task_group& g, journal& j) {
    g.spawn(sleep_then(20ms, 0, j));
    g.spawn(sleep_then(30ms, 1, j));
    co_return;
}

// The task awaiting join() is aborted and its header freed while the group,
// which lives elsewhere, still has children: when they finish, the group must
// not wake the dead joiner.
TEST_CASE("task_group: a joiner aborted while the group outlives it is forgotten by the group", "[task_group][lifetime]") {
    loop l;
    task_group g;
    journal j;
    run_leaving_tasks(l, spawn_into(g, j));
    {
        auto joiner = l.spawn(join_group(g));
        settle(l);
        joiner.abort();
    }  // the joiner's header is freed here
    REQUIRE(run_until(l, [&] { return g.size() == 0; }));
    settle(l);
    CHECK(j.finished == 2);
    // The group goes on: a new joiner is woken as usual.
    run_leaving_tasks(l, spawn_into(g, j));
    run(l, join_group(g));
    CHECK(j.finished == 4);
    CHECK(g.size() == 0);
}

// --- join_handle::cancel ------------------------------------------------------------

task<std::error_code> park_sleep() { co_return error_of(co_await spindle::sleep_for(1h)); }

task<std::error_code> park_read(int fd) {
    std::byte b{};
    auto r = co_await spindle::read(fd, std::span(&b, 1));
    co_return r.error();
}

task<std::error_code> park_signal(int signo) {
    auto r = co_await spindle::wait_signal(signo);
    co_return r.error();
}

task<std::error_code> park_mutex(spindle::mutex& m) {
    auto g = co_await m.lock();
    co_return g.error();
}

task<std::error_code> park_receive(spindle::channel<int>& ch) {
    auto r = co_await ch.receive();
    co_return r.error();
}

task<std::error_code> park_send(spindle::channel<std::string>& ch, std::string& value) {
    co_return error_of(co_await ch.send(std::move(value)));
}

task<std::error_code> park_event(spindle::event& ev) { co_return error_of(co_await ev.wait()); }

template <class T>
task<T> await_handle(join_handle<T>& h) {
    co_return co_await h;
}

template <class T>
T finish(loop& l, join_handle<T>& h) {
    REQUIRE(run_until(l, [&] { return h.done(); }));
    return l.block_on(await_handle(h));
}

TEST_CASE("join_handle::cancel: the wait a task is parked on completes with operation_canceled", "[cancel]") {
    pipe_pair p;
    loop l;

    SECTION("a sleep") {
        auto h = l.spawn(park_sleep());
        settle(l);
        const auto start = spindle::clock::now();
        h.cancel();
        CHECK(how(finish(l, h)) == "canceled");
        CHECK(spindle::clock::now() - start < 5s);
    }
    SECTION("a pipe read, which takes nothing") {
        auto h = l.spawn(park_read(p.r));
        settle(l);
        h.cancel();
        CHECK(how(finish(l, h)) == "canceled");
        REQUIRE(p.put('z'));
        char c = 0;
        CHECK(::read(p.r, &c, 1) == 1);
        CHECK(c == 'z');
    }
    SECTION("a signal wait") {
        auto h = l.spawn(park_signal(SIGUSR1));
        settle(l);
        h.cancel();
        CHECK(how(finish(l, h)) == "canceled");
    }
    SECTION("a mutex lock; the holder keeps the mutex") {
        spindle::mutex m;
        REQUIRE(m.try_lock());
        auto h = l.spawn(park_mutex(m));
        settle(l);
        CHECK(m.has_waiters());
        h.cancel();
        CHECK(how(finish(l, h)) == "canceled");
        CHECK(m.is_locked());
        CHECK_FALSE(m.has_waiters());
        m.unlock();
        CHECK_FALSE(m.is_locked());
    }
    SECTION("a channel receive, and a send into a full channel (the value stays with the sender)") {
        spindle::channel<int> ch(1);
        auto r = l.spawn(park_receive(ch));
        spindle::channel<std::string> full(1);
        REQUIRE(!full.try_send(std::string("first")).error());
        std::string value = "second";
        auto s = l.spawn(park_send(full, value));
        settle(l);
        r.cancel();
        s.cancel();
        CHECK(how(finish(l, r)) == "canceled");
        CHECK(how(finish(l, s)) == "canceled");
        CHECK(value == "second");
        CHECK(full.size() == 1);
        // The channels work on: a later receive gets what a later send sends.
        REQUIRE(!ch.try_send(5).error());
        CHECK(*ch.try_receive() == 5);
    }
    SECTION("an event wait") {
        spindle::event ev;
        auto h = l.spawn(park_event(ev));
        settle(l);
        h.cancel();
        CHECK(how(finish(l, h)) == "canceled");
    }
    CHECK(l.task_count() == 0);
}

task<std::vector<std::string>> steps_then_sleep(spindle::event& ev) {
    std::vector<std::string> steps;
    steps.push_back("started");
    co_await spindle::yield();  // not a wait: a cancel does not end it
    steps.push_back("yielded");
    std::error_code e = error_of(co_await ev.wait());
    steps.push_back(e ? "event: " + how(e) : "event: set");
    std::error_code s = error_of(co_await spindle::sleep_for(1h));
    steps.push_back(s ? "sleep: " + how(s) : "sleep: done");
    co_return steps;
}

TEST_CASE("join_handle::cancel: a ready task meets the cancel at its next wait", "[cancel]") {
    loop l;

    SECTION("cancelled before it ever ran") {
        spindle::event ev;
        auto h = l.spawn(steps_then_sleep(ev));
        h.cancel();
        CHECK(finish(l, h) == std::vector<std::string>{"started", "yielded", "event: canceled", "sleep: canceled"});
    }
    SECTION("cancelled once woken, before it resumed: the completed wait keeps its success") {
        spindle::event ev;
        auto h = l.spawn(steps_then_sleep(ev));
        settle(l);
        ev.set();  // schedules it
        h.cancel();
        CHECK(finish(l, h) == std::vector<std::string>{"started", "yielded", "event: set", "sleep: canceled"});
    }
}

TEST_CASE("join_handle::cancel of a finished task is a no-op; its value stays", "[cancel]") {
    loop l;
    auto h = l.spawn(value_now(42));
    settle(l);
    REQUIRE(h.done());
    h.cancel();
    h.cancel();
    CHECK(l.block_on(await_handle(h)) == 42);
    h.cancel();  // after it was awaited, too
    join_handle<int> empty;
    empty.cancel();  // an empty handle: nothing to do
}

task<std::vector<std::string>> catch_and_wait_again(spindle::event& ev, int fd) {
    std::vector<std::string> seen;
    seen.push_back(how(error_of(co_await spindle::sleep_for(1h))));
    seen.push_back(how(error_of(co_await spindle::sleep_for(1h))));
    seen.push_back(how(error_of(co_await ev.wait())));
    std::byte b{};
    seen.push_back(how(error_of(co_await spindle::read(fd, std::span(&b, 1)))));
    try {
        throw_if_error(error_of(co_await spindle::sleep_for(1h)));
    } catch (const std::system_error& e) {
        seen.push_back(how(e.code()));
    }
    seen.push_back(how(error_of(co_await spindle::sleep_for(1h))));
    co_return seen;
}

TEST_CASE("join_handle::cancel: a task that handles the cancel and waits again is cancelled again", "[cancel]") {
    pipe_pair p;
    loop l;
    spindle::event ev;
    auto h = l.spawn(catch_and_wait_again(ev, p.r));
    settle(l);
    const auto start = spindle::clock::now();
    h.cancel();
    auto seen = finish(l, h);
    CHECK(spindle::clock::now() - start < 5s);
    CHECK(seen == std::vector<std::string>(6, "canceled"));
}

task<std::string> join_sleeper(join_handle<std::error_code>& other) {
    auto ec = co_await other;
    co_return "joined: " + how(ec);
}

TEST_CASE("join_handle::cancel: a join is not cancellable; cancelling the joined task ends both", "[cancel]") {
    loop l;
    auto sleeper = l.spawn(park_sleep(), "sleeper");
    auto joiner = l.spawn(join_sleeper(sleeper), "joiner");
    settle(l);
    joiner.cancel();
    settle(l);
    CHECK_FALSE(joiner.done());
    sleeper.cancel();
    CHECK(finish(l, joiner) == "joined: canceled");
}

}  // namespace

// =====================================================================================
// when_all can be timed out and cancelled: the children are cancelled, waited
// for, and the cancellation is reported.

namespace {

task<int> sleep_hour_counted(int& finished, std::error_code& saw) {
    saw = error_of(co_await spindle::sleep_for(1h));
    ++finished;
    co_return 1;
}

struct when_all_cancel_state {
    int finished = 0;
    std::error_code a, b;
    std::error_code outcome;
    std::chrono::steady_clock::duration took{};
};

task<void> timed_when_all(when_all_cancel_state& s) {
    const auto start = std::chrono::steady_clock::now();
    auto r = co_await with_timeout(50ms, spindle::when_all(sleep_hour_counted(s.finished, s.a), sleep_hour_counted(s.finished, s.b)));
    s.outcome = r.error();
    s.took = std::chrono::steady_clock::now() - start;
}

task<void> vector_when_all(when_all_cancel_state& s) {
    std::vector<task<int>> tasks;
    tasks.push_back(sleep_hour_counted(s.finished, s.a));
    tasks.push_back(sleep_hour_counted(s.finished, s.b));
    try {
        co_await spindle::when_all(std::move(tasks));
    } catch (const std::system_error& e) {
        s.outcome = e.code();
    }
}

}  // namespace

TEST_CASE("when_all: with_timeout cancels the children, waits for them and reports timed_out", "[structured][when_all]") {
    loop l;
    when_all_cancel_state s;
    run(l, timed_when_all(s), 5s);
    CHECK(s.outcome == std::errc::timed_out);
    CHECK(s.finished == 2);  // both children ran to their end before when_all returned
    CHECK(s.a == std::errc::operation_canceled);
    CHECK(s.b == std::errc::operation_canceled);
    CHECK(s.took < 5s);
    CHECK(l.task_count() == 0);  // no child outlived when_all
}

TEST_CASE("when_all: join_handle::cancel() of the awaiting task reaches the children", "[structured][when_all]") {
    loop l;
    when_all_cancel_state s;
    auto h = l.spawn(vector_when_all(s));
    for (int i = 0; i < 5; ++i) l.run_once(0ns);  // everyone parked
    REQUIRE_FALSE(h.done());
    h.cancel();
    const auto give_up = std::chrono::steady_clock::now() + 5s;
    while (!h.done() && std::chrono::steady_clock::now() < give_up) l.run_once(10ms);
    REQUIRE(h.done());
    CHECK(s.outcome == std::errc::operation_canceled);
    CHECK(s.finished == 2);
    CHECK(s.a == std::errc::operation_canceled);
    CHECK(s.b == std::errc::operation_canceled);
    CHECK(l.task_count() == 0);
}

namespace {

task<int&> ref_after(std::chrono::nanoseconds d, int& target) {
    (void)co_await spindle::sleep_for(d);
    co_return target;
}

}  // namespace

TEST_CASE("when_all and race of task<T&>: references arrive as std::reference_wrapper to the very object",
          "[structured][when_all][race]") {
    loop l;
    int a = 1;
    int b = 2;
    auto all = [&]() -> task<bool> {
        auto [ra, rb, v] = co_await spindle::when_all(ref_after(2ms, a), ref_after(1ms, b), value_now(3));
        static_assert(std::is_same_v<decltype(ra), std::reference_wrapper<int>>);
        ra.get() = 10;  // writes through to `a`
        co_return &ra.get() == &a && &rb.get() == &b && v == 3;
    };
    CHECK(run(l, all()));
    CHECK(a == 10);

    auto all_vector = [&]() -> task<bool> {
        std::vector<task<int&>> v;
        v.push_back(ref_after(1ms, b));
        v.push_back(ref_after(0ms, a));
        auto refs = co_await spindle::when_all(std::move(v));
        static_assert(std::is_same_v<decltype(refs), std::vector<std::reference_wrapper<int>>>);
        co_return refs.size() == 2 && &refs[0].get() == &b && &refs[1].get() == &a;
    };
    CHECK(run(l, all_vector()));

    auto any = [&]() -> task<bool> {
        auto r = co_await race(ref_after(1h, a), ref_after(1ms, b));
        static_assert(std::is_same_v<decltype(r), std::variant<std::reference_wrapper<int>, std::reference_wrapper<int>>>);
        co_return r.index() == 1 && &std::get<1>(r).get() == &b;
    };
    CHECK(run(l, any()));

    auto any_vector = [&]() -> task<bool> {
        std::vector<task<int&>> v;
        v.push_back(ref_after(1h, a));
        v.push_back(ref_after(1ms, b));
        auto [index, ref] = co_await race(std::move(v));
        co_return index == 1 && &ref.get() == &b;
    };
    CHECK(run(l, any_vector()));
    CHECK(l.task_count() == 0);
}
