// The cooperative budget (spindle/budget.hpp): a task whose operations
// complete without waiting goes to the back of the ready queue every
// loop_options::task_budget of them, its results kept; nothing is lost when
// it dies there.

#include "support.hpp"

#include "task_turn.hpp"

#include <spindle/budget.hpp>
#include <spindle/channel.hpp>
#include <spindle/io.hpp>
#include <spindle/semaphore.hpp>
#include <spindle/signal.hpp>
#include <spindle/timeout.hpp>
#include <spindle/sleep.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using spindle::loop;
using spindle::task;
using spindle::test::error_of;

namespace {

/// Turns ended by count alone: no quantum, so that a preempted test run
/// cannot end one early.
spindle::loop_options budget_of(unsigned n) {
    spindle::loop_options o;
    o.task_budget = n;
    o.task_quantum = 0ns;
    return o;
}

/// Counts its turns: one per tick while anything else is ready.
task<void> turn_counter(long& turns, const bool& quit) {
    while (!quit) {
        ++turns;
        co_await spindle::yield();
    }
}

/// Receives `n` values that are all there already, noting the other task's
/// turn count after each.
task<void> receive_all(spindle::channel<int>& ch, int n, const long& turns, std::vector<int>& got,
                       std::vector<long>& turn_at, bool& quit) {
    for (int i = 0; i < n; ++i) {
        auto r = co_await ch.receive();
        if (!r) break;
        got.push_back(*r);
        turn_at.push_back(turns);
    }
    quit = true;
}

/// The longest run of receives during which the other task had no turn.
std::size_t longest_run(const std::vector<long>& turn_at) {
    std::size_t longest = 0;
    std::size_t run = 0;
    for (std::size_t i = 0; i < turn_at.size(); ++i) {
        run = (i > 0 && turn_at[i] == turn_at[i - 1]) ? run + 1 : 1;
        longest = std::max(longest, run);
    }
    return longest;
}

}  // namespace

TEST_CASE("budget: ready channel receives give the loop back every task_budget of them, nothing lost or repeated",
          "[budget]") {
    for (const unsigned budget : {1u, 8u, 128u}) {
        INFO("task_budget " << budget);
        loop l(budget_of(budget));
        constexpr int values = 1000;
        spindle::channel<int> ch(values);
        for (int i = 0; i < values; ++i) REQUIRE(ch.try_send(i));
        long turns = 0;
        bool quit = false;
        std::vector<int> got;
        std::vector<long> turn_at;
        auto counter = l.spawn(turn_counter(turns, quit));
        auto receiver = l.spawn(receive_all(ch, values, turns, got, turn_at, quit));
        REQUIRE(spindle::test::run_until(l, [&] { return receiver.done() && counter.done(); }));
        REQUIRE(got.size() == values);
        for (int i = 0; i < values; ++i) REQUIRE(got[static_cast<std::size_t>(i)] == i);
        CHECK(longest_run(turn_at) <= budget);
    }
}

TEST_CASE("budget: task_budget 0 turns it off; budget_exempt_scope exempts a run of operations", "[budget]") {
    auto longest_with = [](spindle::loop_options o, bool exempt) {
        loop l(o);
        spindle::channel<int> ch(300);
        for (int i = 0; i < 300; ++i) REQUIRE(ch.try_send(i));
        long turns = 0;
        bool quit = false;
        std::vector<int> got;
        std::vector<long> turn_at;
        auto counter = l.spawn(turn_counter(turns, quit));
        auto receiver = l.spawn([](spindle::channel<int>& c, const long& t, std::vector<int>& g, std::vector<long>& at,
                                   bool& q, bool exempt_it) -> task<void> {
            std::optional<spindle::budget_exempt_scope> scope;
            if (exempt_it) scope.emplace();
            for (int i = 0; i < 300; ++i) {
                auto r = co_await c.receive();
                g.push_back(*r);
                at.push_back(t);
            }
            q = true;
        }(ch, turns, got, turn_at, quit, exempt));
        REQUIRE(spindle::test::run_until(l, [&] { return receiver.done() && counter.done(); }));
        REQUIRE(got.size() == 300);
        return longest_run(turn_at);
    };
    CHECK(longest_with(budget_of(0), false) == 300);
    CHECK(longest_with(budget_of(8), true) == 300);
    CHECK(longest_with(budget_of(8), false) <= 8);
}

TEST_CASE("budget: consume_budget gives a loop of the task's own work turns, and stops a cancelled task",
          "[budget][cancel]") {
    loop l(budget_of(4));
    long turns = 0;
    bool quit = false;
    std::vector<long> turn_at;
    std::error_code ended;
    auto counter = l.spawn(turn_counter(turns, quit));
    auto worker = l.spawn([](const long& t, std::vector<long>& at, std::error_code& out, bool& q) -> task<void> {
        for (int i = 0; i < 1'000'000; ++i) {
            if (std::error_code ec = error_of(co_await spindle::consume_budget())) {
                out = ec;
                break;
            }
            at.push_back(t);
        }
        q = true;
    }(turns, turn_at, ended, quit));
    for (int i = 0; i < 20; ++i) l.run_once(0ns);
    CHECK(longest_run(turn_at) <= 4);
    CHECK(turns >= 10);
    worker.cancel();
    REQUIRE(spindle::test::run_until(l, [&] { return worker.done() && counter.done(); }));
    CHECK(ended == std::errc::operation_canceled);
}

TEST_CASE("budget: a reader of a socket that always has data does not delay a 10 ms sleeper", "[budget][io]") {
    loop l;  // the default budget
    spindle::test::socket_pair pair;
    std::atomic<bool> stop_flood{false};
    std::thread flood([&] {
        // Bounded: until told, or 3 s at most; then end of stream.
        std::array<char, 4096> chunk{};
        const auto give_up = spindle::clock::now() + 3s;
        while (!stop_flood.load() && spindle::clock::now() < give_up) {
            if (::send(pair.b, chunk.data(), chunk.size(), MSG_NOSIGNAL) < 0) std::this_thread::yield();
        }
        ::shutdown(pair.b, SHUT_WR);
    });
    // Let the socket's buffer fill before anything runs.
    std::this_thread::sleep_for(50ms);
    bool quit = false;
    long reads = 0;
    std::chrono::nanoseconds slept{};
    // The sleeper first: it starts its sleep before the reader runs.
    auto sleeper = l.spawn([](std::chrono::nanoseconds& out, bool& q) -> task<void> {
        const auto t0 = spindle::clock::now();
        (void)co_await spindle::sleep_for(10ms);
        out = spindle::clock::now() - t0;
        q = true;
    }(slept, quit));
    // One byte at a time from a socket whose buffer is full (about 200 KB)
    // and kept full: it does not run dry for a long while, so every
    // read completes at once on a readiness backend.
    auto reader = l.spawn([](int fd, const bool& q, long& n) -> task<void> {
        std::array<std::byte, 1> buf{};
        while (!q) {
            auto r = co_await spindle::recv(fd, buf);
            if (!r || *r == 0) break;
            ++n;
        }
    }(pair.a, quit, reads));
    const bool finished = spindle::test::run_until(l, [&] { return sleeper.done() && reader.done(); }, 10s);
    stop_flood = true;
    flood.join();
    REQUIRE(finished);
    const auto ms = std::chrono::duration<double, std::milli>(slept).count();
    INFO("the 10 ms sleep took " << ms << " ms while the reader made " << reads << " reads");
    CHECK(ms >= 10);
    CHECK(ms < 60);  // generous for a shared machine; without the budget, until the socket runs dry
}

TEST_CASE("budget: what a ready operation took goes back when its task dies at the back of the queue",
          "[budget][lifetime]") {
    loop l(budget_of(1));
    SECTION("a channel value") {
        spindle::channel<int> ch(8);
        for (int i = 0; i < 3; ++i) REQUIRE(ch.try_send(i));
        std::vector<int> first;
        auto doomed = l.spawn([](spindle::channel<int>& c, std::vector<int>& out) -> task<void> {
            for (;;) {
                auto r = co_await c.receive();
                if (!r) co_return;
                out.push_back(*r);
            }
        }(ch, first));
        l.run_once(0ns);  // 0 with the budget, then 1 taken and the task queued again
        REQUIRE(first == std::vector<int>{0});
        doomed.abort();
        auto r1 = ch.try_receive();
        auto r2 = ch.try_receive();
        REQUIRE(r1);
        REQUIRE(r2);
        CHECK(*r1 == 1);  // put back where it was, not lost
        CHECK(*r2 == 2);
    }
    SECTION("semaphore permits") {
        spindle::semaphore sem(2);
        int acquired = 0;
        auto doomed = l.spawn([](spindle::semaphore& s, int& n) -> task<void> {
            for (;;) {
                if (!co_await s.acquire()) co_return;
                ++n;
            }
        }(sem, acquired));
        l.run_once(0ns);  // one permit with the budget, the second taken and the task queued again
        REQUIRE(acquired == 1);
        doomed.abort();
        CHECK(sem.available() == 1);  // the second came back
    }
    SECTION("a semaphore destroyed while the task that took permits waits at the back of the queue") {
        auto sem = std::make_unique<spindle::semaphore>(2);
        int acquired = 0;
        std::error_code last;
        auto waiting = l.spawn([](spindle::semaphore& s, int& n, std::error_code& out) -> task<void> {
            for (;;) {
                out = error_of(co_await s.acquire());
                if (out) co_return;
                ++n;
            }
        }(*sem, acquired, last));
        l.run_once(0ns);  // the second permit taken, the task queued again
        REQUIRE(acquired == 1);
        sem.reset();  // forgets the waiter: nothing touches the freed semaphore (ASan)
        REQUIRE(spindle::test::run_until(l, [&] { return waiting.done(); }));
        CHECK(acquired == 1);
        CHECK(last == std::errc::operation_canceled);  // the permits went with the semaphore
    }
}

TEST_CASE("budget: a pending signal taken by a task that dies at the back of the queue is pending again",
          "[budget][signals][lifetime]") {
    loop l(budget_of(1));
    // Catch SIGUSR2 (a wait that times out), then let one arrive with nobody waiting.
    auto catcher = l.spawn([]() -> task<void> {
        (void)co_await spindle::with_timeout(1ms, spindle::wait_signal(SIGUSR2));
    }());
    REQUIRE(spindle::test::run_until(l, [&] { return catcher.done(); }));
    REQUIRE(::kill(::getpid(), SIGUSR2) == 0);
    spindle::test::settle(l);
    bool saw_it = false;
    auto doomed = l.spawn([](bool& saw) -> task<void> {
        (void)co_await spindle::consume_budget();   // the only unit
        (void)co_await spindle::wait_signal(SIGUSR2);  // pending: taken, and the task queued again
        saw = true;
    }(saw_it));
    l.run_once(0ns);
    doomed.abort();
    CHECK_FALSE(saw_it);
    int got = 0;
    auto second = l.spawn([](int& out) -> task<void> {
        auto r = co_await spindle::with_timeout(2s, spindle::wait_signal(SIGUSR2));
        out = r ? *r : -1;
    }(got));
    REQUIRE(spindle::test::run_until(l, [&] { return second.done(); }));
    CHECK(got == SIGUSR2);  // still pending, not lost
}

TEST_CASE("budget: a turn's stints add up to the budget, and the quantum ends it on the clock", "[budget]") {
    using spindle::detail::task_turn;
    SECTION("no quantum: the whole budget in one stint, then the turn is over") {
        task_turn turn(128, 0);
        CHECK(turn.start(0) == 128);
        CHECK(turn.next(1'000'000'000) == 0);
        CHECK(turn.next(2'000'000'000) == 0);
    }
    SECTION("cheap operations: stints of at most 32 that add up to the budget exactly") {
        task_turn turn(100, 500'000);
        std::int64_t now = 0;
        std::uint32_t total = turn.start(now);
        for (std::uint32_t stint = total; stint != 0; total += stint) {
            CHECK(stint <= task_turn::longest_stint);
            now += 20 * stint;  // 20 ns an operation
            stint = turn.next(now);
        }
        CHECK(total == 100);
    }
    SECTION("long operations: the turn ends once the quantum ran out, and a new turn starts afresh") {
        task_turn turn(128, 500'000);
        std::int64_t now = 0;
        std::uint32_t total = turn.start(now);
        CHECK(total >= task_turn::first_stint_floor);
        for (std::uint32_t stint = total; stint != 0; total += stint) {
            now += 100'000 * static_cast<std::int64_t>(stint);  // 100 us an operation
            stint = turn.next(now);
        }
        CHECK(now >= 500'000);
        CHECK(total < 16);
        CHECK(turn.next(now) == 0);
        // The next turn sizes its first stint from what it learnt: 100 us an
        // operation fits 5 in the quantum.
        CHECK(turn.start(now) == 5);
    }
    SECTION("no budget (0): the quantum alone ends a turn") {
        task_turn turn(0, 1'000'000);
        std::int64_t now = 0;
        std::uint64_t total = turn.start(now);
        for (std::uint32_t stint = static_cast<std::uint32_t>(total); stint != 0; total += stint) {
            now += 10'000 * static_cast<std::int64_t>(stint);
            stint = turn.next(now);
        }
        CHECK(total >= 100);
        CHECK(total <= 100 + task_turn::longest_stint);
    }
}

namespace {

/// Busy for `d` of wall time: work that takes long between two ready operations.
void spin_for(std::chrono::nanoseconds d) {
    const auto until = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < until) {
    }
}

/// Runs a worker whose every ready operation follows 250 us of work beside a
/// turn counter: the longest run of its operations without the other's turn.
std::size_t longest_run_of_long_operations(spindle::loop_options o) {
    loop l(o);
    long turns = 0;
    bool quit = false;
    std::vector<long> turn_at;
    auto counter = l.spawn(turn_counter(turns, quit));
    auto worker = l.spawn([](const long& t, std::vector<long>& at, bool& q) -> task<void> {
        for (int i = 0; i < 200; ++i) {
            spin_for(250us);
            (void)co_await spindle::consume_budget();
            at.push_back(t);
        }
        q = true;
    }(turns, turn_at, quit));
    REQUIRE(spindle::test::run_until(l, [&] { return worker.done() && counter.done(); }));
    REQUIRE(turn_at.size() == 200);
    return longest_run(turn_at);
}

}  // namespace

TEST_CASE("budget: a task whose operations run long gives the loop back after task_quantum, not task_budget of them",
          "[budget]") {
    spindle::loop_options o;
    o.task_budget = 128;
    o.task_quantum = 1ms;
    // 250 us each: the quantum ends a turn within about 4 of them (a first
    // stint of 8 before the loop has measured one). A slower machine only
    // makes each take longer, and the turns shorter.
    CHECK(longest_run_of_long_operations(o) <= 12);
    o.task_quantum = 0ns;
    CHECK(longest_run_of_long_operations(o) == 128);
}

TEST_CASE("budget: with a quantum that never runs out, ready operations still end a turn at task_budget exactly",
          "[budget]") {
    spindle::loop_options o;
    o.task_budget = 100;
    o.task_quantum = 10s;
    loop l(o);
    spindle::channel<int> ch(1000);
    for (int i = 0; i < 1000; ++i) REQUIRE(ch.try_send(i));
    long turns = 0;
    bool quit = false;
    std::vector<int> got;
    std::vector<long> turn_at;
    auto counter = l.spawn(turn_counter(turns, quit));
    auto receiver = l.spawn(receive_all(ch, 1000, turns, got, turn_at, quit));
    REQUIRE(spindle::test::run_until(l, [&] { return receiver.done() && counter.done(); }));
    REQUIRE(got.size() == 1000);
    CHECK(longest_run(turn_at) == 100);
}
