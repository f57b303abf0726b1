// when_any over awaitables (spindle/when_any.hpp): waits, with_timeout of a
// wait, join handles and tasks as branches, in one task. The first to complete
// wins; the losers are given up at once, and one that completed in the same
// tick gives back what it was handed (a channel value, permits, a signal);
// cancellation reaches every branch; exceptions win and are rethrown; the
// awaiting task destroyed at every point leaves nothing behind (counted
// locals, the loop's work, AddressSanitizer).
#include "support.hpp"

#include <spindle/broadcast.hpp>
#include <spindle/channel.hpp>
#include <spindle/event.hpp>
#include <spindle/semaphore.hpp>
#include <spindle/signal.hpp>
#include <spindle/race.hpp>
#include <spindle/when_any.hpp>

#include <signal.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using spindle::channel;
using spindle::join_handle;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::when_any;
using spindle::with_timeout;
using spindle::test::counted;
using spindle::test::run;
using spindle::test::run_until;
using spindle::test::settle;

namespace {

const std::error_code no_error{};
const std::error_code canceled = std::make_error_code(std::errc::operation_canceled);
const std::error_code timed_out = std::make_error_code(std::errc::timed_out);

task<int> value_after(std::chrono::milliseconds d, int v) {
    counted c;
    (void)co_await spindle::sleep_for(d);
    co_return v;
}

task<int> throw_after(std::chrono::milliseconds d) {
    (void)co_await spindle::sleep_for(d);
    throw std::runtime_error("branch failed");
}

/// The line of the task named `name` in the task dump.
std::string waiting_on(const loop& l, const std::string& name) {
    for (const auto& t : l.tasks())
        if (t.name == name) return t.waiting_on;
    return "(no such task)";
}

/// How a race ended, for tasks the test spawns.
struct race_end {
    bool done = false;
    std::size_t index = 99;
    std::error_code error;
    int value = 0;
};

}  // namespace

// --- who wins ------------------------------------------------------------------------

TEST_CASE("when_any over awaitables: the first to complete wins; the others are withdrawn", "[when_any]") {
    loop l;
    channel<int> ch(4);
    spindle::event ev;
    auto body = [](channel<int>& ch, spindle::event& ev) -> task<race_end> {
        auto r = co_await when_any(ch.receive(), spindle::sleep_for(20ms), ev.wait());
        static_assert(std::is_same_v<decltype(r), std::variant<result<int>, result<void>, result<void>>>);
        race_end e;
        e.index = r.index();
        if (r.index() == 1) e.error = std::get<1>(r).error();
        co_return e;
    };
    const auto start = spindle::clock::now();
    race_end e = run(l, body(ch, ev));
    CHECK(spindle::clock::now() - start >= 20ms);
    CHECK(e.index == 1);
    CHECK(e.error == no_error);
    // The receive was withdrawn: a value sent now is buffered, not handed to it.
    REQUIRE(ch.try_send(1));
    CHECK(ch.size() == 1);
    ev.set();
    settle(l);
    CHECK_FALSE(l.has_work());  // nothing of the race is left in the loop
}

TEST_CASE("when_any over awaitables: a branch ready at the start wins at once; those after it never start", "[when_any]") {
    loop l;
    channel<int> ch(4);
    REQUIRE(ch.try_send(7));
    auto body = [](channel<int>& ch) -> task<std::pair<std::size_t, int>> {
        auto r = co_await when_any(ch.receive(), spindle::sleep_for(1h));
        co_return std::pair(r.index(), r.index() == 0 ? *std::get<0>(r) : -1);
    };
    CHECK(run(l, body(ch)) == std::pair<std::size_t, int>(0, 7));
    CHECK_FALSE(l.has_work());  // the sleep never armed a timer

    // A ready branch after a waiting one: the waiting one is withdrawn.
    REQUIRE(ch.try_send(8));
    auto body2 = [](channel<int>& ch) -> task<std::pair<std::size_t, int>> {
        auto r = co_await when_any(spindle::sleep_for(1h), ch.receive());
        co_return std::pair(r.index(), r.index() == 1 ? *std::get<1>(r) : -1);
    };
    CHECK(run(l, body2(ch)) == std::pair<std::size_t, int>(1, 8));
    CHECK_FALSE(l.has_work());
}

// Two semantics, two names: when_any withdraws waits, race cancels and joins
// tasks. A call that mixes them does not compile.
template <class... A>
concept when_any_accepts = requires(A&&... a) { spindle::when_any(std::forward<A>(a)...); };
template <class... A>
concept race_accepts = requires(A&&... a) { spindle::race(std::forward<A>(a)...); };

TEST_CASE("when_any takes no task and race nothing but tasks", "[when_any]") {
    using wait = decltype(spindle::sleep_for(1ms));
    STATIC_REQUIRE(when_any_accepts<wait, wait>);
    STATIC_REQUIRE_FALSE(when_any_accepts<task<int>, wait>);
    STATIC_REQUIRE_FALSE(when_any_accepts<wait, task<void>>);
    STATIC_REQUIRE_FALSE(when_any_accepts<task<int>, task<int>>);
    STATIC_REQUIRE(race_accepts<task<int>, task<void>>);
    STATIC_REQUIRE(race_accepts<std::vector<task<int>>>);
    STATIC_REQUIRE_FALSE(race_accepts<task<int>, wait>);
    STATIC_REQUIRE_FALSE(race_accepts<wait>);
}

TEST_CASE("when_any over awaitables: with_timeout of a wait and a join_handle as branches", "[when_any]") {
    loop l;
    channel<int> ch(4);
    SECTION("the deadline of a branch") {
        auto body = [](channel<int>& ch) -> task<std::error_code> {
            auto r = co_await when_any(with_timeout(10ms, ch.receive()), spindle::sleep_for(1h));
            co_return r.index() == 0 ? std::get<0>(r).error() : no_error;
        };
        CHECK(run(l, body(ch)) == timed_out);
        CHECK_FALSE(l.has_work());
    }
    SECTION("a branch with a deadline loses: its timer goes") {
        auto body = [](channel<int>& ch) -> task<std::size_t> {
            auto r = co_await when_any(with_timeout(1h, ch.receive()), spindle::sleep_for(10ms));
            co_return r.index();
        };
        CHECK(run(l, body(ch)) == 1);
        CHECK_FALSE(l.has_work());
    }
    SECTION("a join_handle wins with the task's value") {
        auto body = []() -> task<std::pair<std::size_t, int>> {
            auto h = loop::current().spawn(value_after(10ms, 9));
            auto r = co_await when_any(h, spindle::sleep_for(1h));
            co_return std::pair(r.index(), r.index() == 0 ? std::get<0>(r) : -1);
        };
        CHECK(run(l, body()) == std::pair<std::size_t, int>(0, 9));
    }
    SECTION("a join_handle loses: the task runs on and can be joined later") {
        auto body = []() -> task<std::pair<std::size_t, int>> {
            auto h = loop::current().spawn(value_after(30ms, 11));
            auto r = co_await when_any(h, spindle::sleep_for(5ms));
            const int later = co_await h;
            co_return std::pair(r.index(), later);
        };
        CHECK(run(l, body()) == std::pair<std::size_t, int>(1, 11));
    }
    CHECK(counted::alive == 0);
}

// --- losers completed in the same tick give back what they were handed ---------------

TEST_CASE("when_any over awaitables: a loser that completed in the winner's tick gives its value back", "[when_any][lifetime]") {
    loop l;
    spindle::event ev;
    SECTION("a channel value goes back to the front of its channel") {
        channel<int> ch(4);
        race_end e;
        auto h = l.spawn([](channel<int>& ch, spindle::event& ev, race_end& e) -> task<void> {
            auto r = co_await when_any(ch.receive(), ev.wait());
            e.index = r.index();
            e.done = true;
        }(ch, ev, e));
        settle(l);
        ev.set();                         // the event's branch is ready first,
        REQUIRE(ch.try_send(7));    // then the receive is handed 7
        REQUIRE(ch.try_send(8));    // (buffered behind it)
        CHECK(ch.size() == 1);
        settle(l);
        REQUIRE(e.done);
        CHECK(e.index == 1);
        auto a = ch.try_receive();
        auto b = ch.try_receive();
        REQUIRE(a);
        REQUIRE(b);
        CHECK(*a == 7);  // back in front, not lost
        CHECK(*b == 8);
    }
    SECTION("semaphore permits go back") {
        spindle::semaphore sem(0);
        race_end e;
        auto h = l.spawn([](spindle::semaphore& s, spindle::event& ev, race_end& e) -> task<void> {
            auto r = co_await when_any(ev.wait(), s.acquire(2));
            e.index = r.index();
            e.done = true;
        }(sem, ev, e));
        settle(l);
        ev.set();
        sem.release(2);  // granted to the parked acquire
        CHECK(sem.available() == 0);
        settle(l);
        REQUIRE(e.done);
        CHECK(e.index == 0);
        CHECK(sem.available() == 2);
    }
    SECTION("a broadcast receive had taken nothing") {
        spindle::broadcast_sender<int> tx(4);
        auto rx = tx.subscribe();
        race_end e;
        auto h = l.spawn([](spindle::broadcast_receiver<int>& rx, spindle::event& ev, race_end& e) -> task<void> {
            auto r = co_await when_any(ev.wait(), rx.receive());
            e.index = r.index();
            e.done = true;
        }(rx, ev, e));
        settle(l);
        ev.set();
        REQUIRE(tx.send(3));
        settle(l);
        REQUIRE(e.done);
        CHECK(e.index == 0);
        CHECK(*rx.try_receive() == 3);
    }
    SECTION("the winner completed second in time but was resumed first: the order of the ready queue decides") {
        channel<int> ch(4);
        race_end e;
        auto h = l.spawn([](channel<int>& ch, spindle::event& ev, race_end& e) -> task<void> {
            auto r = co_await when_any(ev.wait(), ch.receive());
            e.index = r.index();
            e.value = r.index() == 1 ? *std::get<1>(r) : -1;
            e.done = true;
        }(ch, ev, e));
        settle(l);
        REQUIRE(ch.try_send(4));  // the receive completes first
        ev.set();
        settle(l);
        REQUIRE(e.done);
        CHECK(e.index == 1);
        CHECK(e.value == 4);
        CHECK(ch.size() == 0);
    }
}

TEST_CASE("when_any over awaitables: a signal handed to a losing wait is kept again", "[when_any][signals][lifetime]") {
    for (const auto mechanism : {spindle::signal_mechanism::signalfd, spindle::signal_mechanism::self_pipe}) {
        INFO("mechanism " << static_cast<int>(mechanism));
        spindle::loop_options o;
        o.signals = mechanism;
        o.poll_interval = 0ns;  // the loop polls in every tick, ready tasks or not
        loop l(o);
        spindle::event ev;
        race_end e;
        auto h = l.spawn([](spindle::event& ev, race_end& e) -> task<void> {
            auto r = co_await when_any(spindle::wait_signal({SIGUSR1, SIGUSR2}), ev.wait());
            e.index = r.index();
            e.done = true;
        }(ev, e));
        // A plain waiter for the same signal shows when the loop has read it.
        int witness_got = 0;
        auto witness = l.spawn([](int& out) -> task<void> {
            auto r = co_await spindle::wait_signal(SIGUSR1);
            out = r ? *r : -1;
        }(witness_got), "witness");
        settle(l);
        // In one tick: the post sets the event (step 2), then the poll reads
        // the signal (step 3): both branches complete, the event's first.
        l.post([&ev] { ev.set(); });
        REQUIRE(::raise(SIGUSR1) == 0);
        l.run_once(0ns);
        bool witness_ready = false;
        for (const auto& t : l.tasks())
            if (t.name == "witness") witness_ready = t.state == spindle::task_info::state_kind::ready;
        REQUIRE(witness_ready);  // the signal was read in that tick
        settle(l);
        CHECK(witness_got == SIGUSR1);
        REQUIRE(e.done);
        CHECK(e.index == 1);
        int got = 0;
        auto next = l.spawn([](int& out) -> task<void> {
            auto r = co_await spindle::wait_signal(SIGUSR1);
            out = r ? *r : -1;
        }(got));
        settle(l);
        CHECK(got == SIGUSR1);  // kept again by the loser: returned at once
    }
}

// --- cancellation and exceptions -----------------------------------------------------

TEST_CASE("when_any over awaitables: cancelling the awaiting task cancels every branch; the first cancelled wins",
          "[when_any][cancel]") {
    loop l;
    channel<int> ch(4);
    spindle::event ev;
    SECTION("a deadline around it") {
        auto body = [](channel<int>& ch, spindle::event& ev) -> task<race_end> {
            auto r = co_await with_timeout(20ms, when_any(ch.receive(), ev.wait(), spindle::sleep_for(1h)));
            race_end e;
            e.done = true;
            if (!r) {
                e.error = r.error();
                co_return e;
            }
            e.index = r->index();
            co_return e;
        };
        race_end e = run(l, body(ch, ev));
        REQUIRE(e.done);
        // The deadline cut the race short: with_timeout's own result says so
        // (the variant, whose first branch saw operation_canceled, is dropped).
        CHECK(e.error == timed_out);
    }
    SECTION("join_handle::cancel") {
        race_end e;
        auto h = l.spawn([](channel<int>& ch, spindle::event& ev, race_end& e) -> task<void> {
            auto r = co_await when_any(ev.wait(), ch.receive());
            e.index = r.index();
            e.error = r.index() == 0 ? std::get<0>(r).error() : std::get<1>(r).error();
            e.done = true;
        }(ch, ev, e));
        settle(l);
        h.cancel();
        settle(l);
        REQUIRE(e.done);
        CHECK(e.index == 0);
        CHECK(e.error == canceled);
    }
    SECTION("a deadline that passed already: the branches are cancelled as they start, even a ready one") {
        REQUIRE(ch.try_send(1));
        race_end e;
        auto late = [](channel<int>& ch, race_end& e) -> task<void> {
            (void)co_await spindle::sleep_for(1h);  // ends when the deadline passes
            auto r = co_await when_any(spindle::sleep_for(1h), ch.receive());
            e.done = true;
            e.index = r.index();
            e.error = r.index() == 0 ? std::get<0>(r).error() : std::get<1>(r).error();
        };
        auto body = [&late](channel<int>& ch, race_end& e) -> task<std::error_code> {
            result<void> r = co_await with_timeout(5ms, late(ch, e));
            co_return r ? std::error_code{} : r.error();
        };
        CHECK(run(l, body(ch, e)) == timed_out);
        REQUIRE(e.done);
        CHECK(e.index == 0);
        CHECK(e.error == canceled);
        CHECK(ch.size() == 1);  // the ready value was not taken
    }
    CHECK_FALSE(l.has_work());
}

TEST_CASE("when_any over awaitables: an exception wins and is rethrown; the other branches are withdrawn", "[when_any]") {
    loop l;
    channel<int> ch(4);
    SECTION("the task of a join_handle branch throws") {
        auto body = []() -> task<std::string> {
            auto h = loop::current().spawn(throw_after(5ms));
            try {
                (void)co_await when_any(spindle::sleep_for(1h), h);
            } catch (const std::runtime_error& e) {
                co_return e.what();
            }
            co_return "no exception";
        };
        CHECK(run(l, body()) == "branch failed");
    }
    SECTION("a wait that cannot start") {
        spindle::broadcast_sender<int> tx(4);
        auto rx = tx.subscribe();
        auto body = [](spindle::broadcast_receiver<int>& rx) -> task<std::string> {
            auto busy = loop::current().spawn([](spindle::broadcast_receiver<int>& rx) -> task<void> {
                (void)co_await rx.receive();
            }(rx));
            co_await spindle::yield();  // busy now waits on rx
            std::string what = "no exception";
            try {
                (void)co_await when_any(spindle::sleep_for(1h), rx.receive());
            } catch (const std::logic_error& e) {
                what = e.what();
            }
            busy.abort();
            co_return what;
        };
        CHECK(run(l, body(rx)) == "spindle: a broadcast_receiver serves one receive at a time");
    }
    CHECK_FALSE(l.has_work());
}

// --- the awaiting task destroyed -------------------------------------------------------

TEST_CASE("when_any over awaitables: the awaiting task destroyed while the branches wait leaves nothing behind",
          "[when_any][lifetime]") {
    counted::alive = 0;
    SECTION("aborted") {
        loop l;
        channel<int> ch(4);
        spindle::event ev;
        auto h = l.spawn([](channel<int>& ch, spindle::event& ev) -> task<void> {
            (void)co_await when_any(ch.receive(), ev.wait(), spindle::sleep_for(1h),
                                    with_timeout(1h, spindle::sleep_for(2h)));
        }(ch, ev), "racer");
        settle(l);
        CHECK(l.timer_count() == 3);  // the sleeps and the deadline
        h.abort();
        CHECK_FALSE(l.has_work());  // no timer, no task left
        REQUIRE(ch.try_send(1));
        CHECK(ch.size() == 1);  // nobody was waiting any more
        ev.set();
        settle(l);
    }
    SECTION("aborted after the winner completed, before it ran: the winner's value goes back") {
        loop l;
        channel<int> ch(4);
        bool resumed = false;
        auto h = l.spawn([](channel<int>& ch, bool& resumed) -> task<void> {
            (void)co_await when_any(ch.receive(), spindle::sleep_for(1h));
            resumed = true;
        }(ch, resumed));
        settle(l);
        REQUIRE(ch.try_send(6));
        l.run_once(0ns);  // the branch resumes and wins; the task is ready, not run
        CHECK_FALSE(resumed);
        h.abort();
        auto r = ch.try_receive();
        REQUIRE(r);
        CHECK(*r == 6);
        CHECK_FALSE(l.has_work());
    }
    SECTION("the loop destroyed") {
        channel<int> ch(4);
        {
            loop l;
            auto h = l.spawn([](channel<int>& ch) -> task<void> {
                (void)co_await when_any(ch.receive(), spindle::sleep_for(1h), spindle::wait_signal(SIGUSR2));
            }(ch));
            settle(l);
            CHECK(l.timer_count() == 1);
        }
        REQUIRE(ch.try_send(1));
        CHECK(ch.size() == 1);
    }
}

// --- the dump, nesting, the budget -----------------------------------------------------

TEST_CASE("when_any over awaitables: the dump shows every branch's wait; when_any nests", "[when_any]") {
    loop l;
    channel<int> ch(4);
    spindle::event ev;
    auto h = l.spawn([](channel<int>& ch, spindle::event& ev) -> task<std::size_t> {
        auto r = co_await when_any(ch.receive(), when_any(ev.wait(), spindle::sleep_for(1h)), spindle::sleep_for(1h));
        co_return r.index() * 10 + (r.index() == 1 ? std::get<1>(r).index() : 9);
    }(ch, ev), "racer");
    settle(l);
    const std::string line = waiting_on(l, "racer");
    CHECK(line.rfind("when_any of 3: channel receive (empty) | when_any of 2: event | sleep, due in ", 0) == 0);
    CHECK(line.find(" | sleep, due in ", line.find("when_any of 2")) != std::string::npos);
    ev.set();
    REQUIRE(run_until(l, [&] { return h.done(); }));
    CHECK(l.block_on([](join_handle<std::size_t>& h) -> task<std::size_t> { co_return co_await h; }(h)) == 10);
    CHECK_FALSE(l.has_work());
}

TEST_CASE("when_any over awaitables: ready branches spend the budget; nothing is lost", "[when_any][budget]") {
    spindle::loop_options o;
    o.task_budget = 8;
    loop l(o);
    channel<int> ch(1000);
    for (int i = 0; i < 1000; ++i) REQUIRE(ch.try_send(i));
    ch.close();
    long turns = 0;
    bool quit = false;
    std::vector<int> got;
    std::vector<long> turn_at;
    auto counter = l.spawn([](long& t, const bool& q) -> task<void> {
        while (!q) {
            ++t;
            co_await spindle::yield();
        }
    }(turns, quit));
    auto reader = l.spawn([](channel<int>& ch, std::vector<int>& got, const long& t, std::vector<long>& at, bool& q) -> task<void> {
        spindle::event never;
        for (;;) {
            auto r = co_await when_any(ch.receive(), never.wait());
            if (r.index() != 0 || !std::get<0>(r)) break;
            got.push_back(*std::get<0>(r));
            at.push_back(t);
        }
        q = true;
    }(ch, got, turns, turn_at, quit));
    REQUIRE(run_until(l, [&] { return reader.done() && counter.done(); }));
    REQUIRE(got.size() == 1000);
    for (int i = 0; i < 1000; ++i) REQUIRE(got[static_cast<std::size_t>(i)] == i);
    std::size_t longest = 0, run = 0;
    for (std::size_t i = 0; i < turn_at.size(); ++i) {
        run = (i > 0 && turn_at[i] == turn_at[i - 1]) ? run + 1 : 1;
        longest = std::max(longest, run);
    }
    CHECK(longest <= 8);
}
