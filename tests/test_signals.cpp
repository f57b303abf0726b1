// Waiting for POSIX signals (spindle/signal.hpp), one or any of several, with
// both signal sources: signalfd (the default on Linux) and the self-pipe
// trick. Every behaviour is checked for both; the section name says which
// one ran.
//
// This program starts no threads: a signal sent to the process can only reach
// the test thread, where the loop catches it.

#include "support.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <csignal>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <vector>

using namespace std::chrono_literals;
using spindle::loop;
using spindle::signal_mechanism;
using spindle::task;
using spindle::test::run;
using spindle::test::settle;

namespace {

struct mechanism {
    signal_mechanism kind;
    const char* name;
};
constexpr std::array<mechanism, 2> mechanisms{{
    {signal_mechanism::signalfd, "signalfd"},
    {signal_mechanism::self_pipe, "self-pipe"},
}};

spindle::loop_options options_for(signal_mechanism m) {
    spindle::loop_options o;
    o.signals = m;
    return o;
}

bool is_blocked(int signo) {
    sigset_t now;
    sigemptyset(&now);
    REQUIRE(::pthread_sigmask(SIG_BLOCK, nullptr, &now) == 0);
    return sigismember(&now, signo) == 1;
}

bool is_pending(int signo) {
    sigset_t pending;
    sigemptyset(&pending);
    REQUIRE(::sigpending(&pending) == 0);
    return sigismember(&pending, signo) == 1;
}

using handler_fn = void (*)(int);

handler_fn current_handler(int signo) {
    struct sigaction now {};
    REQUIRE(::sigaction(signo, nullptr, &now) == 0);
    return now.sa_handler;
}

void set_handler(int signo, handler_fn fn) {
    struct sigaction act {};
    act.sa_handler = fn;
    sigemptyset(&act.sa_mask);
    REQUIRE(::sigaction(signo, &act, nullptr) == 0);
}

std::atomic<int> g_test_handler_calls{0};
void test_handler(int) { g_test_handler_calls.fetch_add(1, std::memory_order_relaxed); }

/// Every test starts from SIGUSR1/SIGUSR2 unblocked, default action, not pending.
void require_clean_start() {
    REQUIRE_FALSE(is_blocked(SIGUSR1));
    REQUIRE_FALSE(is_blocked(SIGUSR2));
    REQUIRE_FALSE(is_pending(SIGUSR1));
    REQUIRE_FALSE(is_pending(SIGUSR2));
    REQUIRE(current_handler(SIGUSR1) == SIG_DFL);
    REQUIRE(current_handler(SIGUSR2) == SIG_DFL);
}

int send_signal(int signo, bool use_kill) { return use_kill ? ::kill(::getpid(), signo) : ::raise(signo); }

struct wait_result {
    bool done = false;
    bool has_value = false;
    int signo = 0;
    std::error_code error;
};

task<void> waiter(int signo, std::stop_token token, wait_result& out) {
    auto r = co_await spindle::wait_signal(signo, std::move(token));
    out.done = true;
    out.has_value = r.has_value();
    if (r) out.signo = *r;
    out.error = r.error();
}

task<void> stop_later(std::stop_source& src, std::chrono::milliseconds delay) {
    (void)co_await spindle::sleep_for(delay);
    src.request_stop();
}

task<void> signal_later(int signo, std::chrono::milliseconds delay) {
    (void)co_await spindle::sleep_for(delay);
    REQUIRE(::raise(signo) == 0);
}

/// Counts its own resumptions: a counter that did not move across a co_await
/// proves that the co_await completed without suspending.
task<void> ticker(long& count, const bool& stop) {
    for (int i = 0; i < 10'000'000 && !stop; ++i) {
        ++count;
        co_await spindle::yield();
    }
}

// --- wake-up ------------------------------------------------------------------------

task<void> wake_main(int signo, bool use_kill, wait_result& res, bool& parked_at_send) {
    auto w = loop::current().spawn(waiter(signo, {}, res), "waiter");
    (void)co_await spindle::sleep_for(20ms);
    parked_at_send = !w.done();
    REQUIRE(send_signal(signo, use_kill) == 0);
    co_await w;
}

task<void> several_main(int signo, std::array<wait_result, 3>& res, bool& all_parked, wait_result& after) {
    loop& l = loop::current();
    std::array<spindle::join_handle<void>, 3> hs;
    for (std::size_t i = 0; i < hs.size(); ++i) hs[i] = l.spawn(waiter(signo, {}, res[i]));
    (void)co_await spindle::sleep_for(20ms);
    all_parked = !hs[0].done() && !hs[1].done() && !hs[2].done();
    REQUIRE(::raise(signo) == 0);  // one delivery
    for (auto& h : hs) co_await h;
    // That delivery went to the waiters; nothing is kept for a new wait.
    std::stop_source src;
    auto stopper = l.spawn(stop_later(src, 40ms));
    co_await waiter(signo, src.get_token(), after);
    co_await stopper;
}

// --- kept deliveries ------------------------------------------------------------------

struct kept_state {
    long ticks = 0;
    bool stop = false;
    wait_result first, second, third, fourth;
    long first_moved = -1;
    long second_moved = -1;
};

task<void> kept_main(int signo, kept_state& s) {
    loop& l = loop::current();
    auto t = l.spawn(ticker(s.ticks, s.stop), "ticker");

    l.catch_signal(signo);
    REQUIRE(::raise(signo) == 0);
    (void)co_await spindle::sleep_for(20ms);  // the loop reads it while nobody waits
    long before = s.ticks;
    co_await waiter(signo, {}, s.first);
    s.first_moved = s.ticks - before;

    // Two deliveries while nobody waits (each read by the loop) count as one.
    REQUIRE(::raise(signo) == 0);
    (void)co_await spindle::sleep_for(20ms);
    REQUIRE(::raise(signo) == 0);
    (void)co_await spindle::sleep_for(20ms);
    before = s.ticks;
    co_await waiter(signo, {}, s.second);
    s.second_moved = s.ticks - before;
    // ... so the next wait parks: only the stop token ends it.
    std::stop_source src;
    auto stopper = l.spawn(stop_later(src, 40ms));
    co_await waiter(signo, src.get_token(), s.third);
    co_await stopper;
    // A new delivery wakes the next wait.
    auto raiser = l.spawn(signal_later(signo, 20ms));
    co_await waiter(signo, {}, s.fourth);
    co_await raiser;

    s.stop = true;
    co_await t;
}

// --- cancellation ----------------------------------------------------------------------

struct cancel_state {
    bool parked_at_stop = false;
    wait_result cancelled, kept, pre;
};

task<void> cancel_main(int signo, cancel_state& s) {
    loop& l = loop::current();
    std::stop_source src;
    auto w = l.spawn(waiter(signo, src.get_token(), s.cancelled), "waiter");
    (void)co_await spindle::sleep_for(20ms);
    s.parked_at_stop = !w.done();
    src.request_stop();
    co_await w;
    // The cancelled waiter is gone: a delivery now has nobody to wake and is kept.
    REQUIRE(::raise(signo) == 0);
    (void)co_await spindle::sleep_for(20ms);
    co_await waiter(signo, {}, s.kept);
    // A token stopped before the wait: cancelled at once.
    std::stop_source pre;
    pre.request_stop();
    co_await waiter(signo, pre.get_token(), s.pre);
}

}  // namespace

// =====================================================================================

TEST_CASE("signals: wait_signal wakes on raise() and on kill(getpid())", "[signals]") {
    require_clean_start();
    for (const auto& m : mechanisms) {
        SECTION(m.name) {
            for (bool use_kill : {false, true}) {
                CAPTURE(use_kill);
                wait_result res;
                bool parked = false;
                loop l(options_for(m.kind));
                run(l, wake_main(SIGUSR1, use_kill, res, parked));
                CHECK(parked);
                CHECK(res.has_value);
                CHECK(res.signo == SIGUSR1);
            }
        }
    }
}

TEST_CASE("signals: every waiter wakes on one delivery", "[signals]") {
    require_clean_start();
    for (const auto& m : mechanisms) {
        SECTION(m.name) {
            std::array<wait_result, 3> res;
            wait_result after;
            bool all_parked = false;
            loop l(options_for(m.kind));
            run(l, several_main(SIGUSR1, res, all_parked, after));
            CHECK(all_parked);
            for (const auto& r : res) {
                CHECK(r.has_value);
                CHECK(r.signo == SIGUSR1);
            }
            CHECK_FALSE(after.has_value);
            CHECK(after.error == std::errc::operation_canceled);
        }
    }
}

TEST_CASE("signals: a delivery nobody waits for is kept, and several count as one", "[signals]") {
    require_clean_start();
    for (const auto& m : mechanisms) {
        SECTION(m.name) {
            kept_state s;
            loop l(options_for(m.kind));
            run(l, kept_main(SIGUSR2, s));
            CHECK(s.first.has_value);
            CHECK(s.first.signo == SIGUSR2);
            CHECK(s.first_moved == 0);  // returned at once
            CHECK(s.second.has_value);
            CHECK(s.second.signo == SIGUSR2);
            CHECK(s.second_moved == 0);
            CHECK_FALSE(s.third.has_value);  // the second delivery was not kept apart
            CHECK(s.third.error == std::errc::operation_canceled);
            CHECK(s.fourth.has_value);
            CHECK(s.fourth.signo == SIGUSR2);
        }
    }
}

TEST_CASE("signals: a stop_token cancels a signal wait", "[signals]") {
    require_clean_start();
    for (const auto& m : mechanisms) {
        SECTION(m.name) {
            cancel_state s;
            loop l(options_for(m.kind));
            run(l, cancel_main(SIGUSR1, s));
            CHECK(s.parked_at_stop);
            CHECK_FALSE(s.cancelled.has_value);
            CHECK(s.cancelled.error == std::errc::operation_canceled);
            CHECK(s.kept.has_value);
            CHECK(s.kept.signo == SIGUSR1);
            CHECK_FALSE(s.pre.has_value);
            CHECK(s.pre.error == std::errc::operation_canceled);
        }
    }
}

TEST_CASE("signals: signalfd gives the signal mask back when the loop goes", "[signals][restore]") {
    require_clean_start();
    wait_result res, parked_at_end;
    bool parked = false;
    {
        loop l(options_for(signal_mechanism::signalfd));
        run(l, wake_main(SIGUSR1, false, res, parked));
        CHECK(res.signo == SIGUSR1);
        CHECK(is_blocked(SIGUSR1));  // signalfd reads it as data while the loop lives
        CHECK(current_handler(SIGUSR1) == SIG_DFL);
        // A task still parked in a wait when the loop goes.
        l.spawn(waiter(SIGUSR1, {}, parked_at_end)).detach();
        for (int i = 0; i < 3; ++i) l.run_once(0ns);
        CHECK_FALSE(parked_at_end.done);
        // A delivery still pending in the kernel when the loop goes: it must be
        // consumed, not delivered with its default action (end the process).
        l.catch_signal(SIGUSR2);
        REQUIRE(::raise(SIGUSR2) == 0);
        CHECK(is_pending(SIGUSR2));
    }
    CHECK_FALSE(parked_at_end.done);
    CHECK_FALSE(is_blocked(SIGUSR1));
    CHECK_FALSE(is_blocked(SIGUSR2));
    CHECK_FALSE(is_pending(SIGUSR2));
}

TEST_CASE("signals: signalfd leaves a signal blocked that was blocked before", "[signals][restore]") {
    require_clean_start();
    sigset_t usr2, old;
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    REQUIRE(::pthread_sigmask(SIG_BLOCK, &usr2, &old) == 0);
    wait_result res;
    bool parked = false;
    {
        loop l(options_for(signal_mechanism::signalfd));
        run(l, wake_main(SIGUSR2, false, res, parked));
        CHECK(res.signo == SIGUSR2);
    }
    CHECK(is_blocked(SIGUSR2));
    CHECK_FALSE(is_pending(SIGUSR2));
    if (is_pending(SIGUSR2)) {
        timespec zero{0, 0};
        ::sigtimedwait(&usr2, nullptr, &zero);
    }
    REQUIRE(::pthread_sigmask(SIG_SETMASK, &old, nullptr) == 0);
}

TEST_CASE("signals: self-pipe gives the previous handlers back when the loop goes", "[signals][restore]") {
    require_clean_start();
    set_handler(SIGUSR1, &test_handler);
    g_test_handler_calls = 0;
    wait_result res, parked_at_end;
    bool parked = false;
    {
        loop l(options_for(signal_mechanism::self_pipe));
        run(l, wake_main(SIGUSR1, false, res, parked));
        CHECK(res.signo == SIGUSR1);
        CHECK(current_handler(SIGUSR1) != &test_handler);  // the loop's handler caught it
        CHECK(g_test_handler_calls.load() == 0);
        CHECK_FALSE(is_blocked(SIGUSR1));  // the self-pipe blocks nothing
        l.catch_signal(SIGUSR2);
        CHECK(current_handler(SIGUSR2) != SIG_DFL);
        l.spawn(waiter(SIGUSR1, {}, parked_at_end)).detach();
        for (int i = 0; i < 3; ++i) l.run_once(0ns);
        CHECK_FALSE(parked_at_end.done);
    }
    CHECK_FALSE(parked_at_end.done);
    CHECK(current_handler(SIGUSR1) == &test_handler);
    CHECK(current_handler(SIGUSR2) == SIG_DFL);
    CHECK_FALSE(is_blocked(SIGUSR1));
    // The restored handler is the one that runs now.
    REQUIRE(::raise(SIGUSR1) == 0);
    CHECK(g_test_handler_calls.load() == 1);
    set_handler(SIGUSR1, SIG_DFL);
}

// --- waiting for any of several signals --------------------------------------------

namespace {

task<void> set_waiter(spindle::signal_set signals, std::stop_token token, wait_result& out) {
    auto r = co_await spindle::wait_signal(signals, std::move(token));
    out.done = true;
    out.has_value = r.has_value();
    if (r) out.signo = *r;
    out.error = r.error();
}

task<void> set_wake_main(bool use_kill, wait_result& first, wait_result& second, bool& parked_at_send) {
    loop& l = loop::current();
    auto w = l.spawn(set_waiter({SIGUSR1, SIGUSR2}, {}, first), "waiter");
    (void)co_await spindle::sleep_for(20ms);
    parked_at_send = !w.done();
    REQUIRE(send_signal(SIGUSR2, use_kill) == 0);
    co_await w;
    // The braced list is the set; the other one of it wakes the next wait.
    auto raiser = l.spawn(signal_later(SIGUSR1, 20ms));
    auto r = co_await spindle::wait_signal({SIGUSR1, SIGUSR2});
    second.done = true;
    second.has_value = r.has_value();
    if (r) second.signo = *r;
    co_await raiser;
}

struct set_kept_state {
    long ticks = 0;
    bool stop = false;
    wait_result first, second, third;
    long first_moved = -1;
    long second_moved = -1;
};

task<void> set_kept_main(set_kept_state& s) {
    loop& l = loop::current();
    auto t = l.spawn(ticker(s.ticks, s.stop), "ticker");
    l.catch_signal(SIGUSR1);
    l.catch_signal(SIGUSR2);
    REQUIRE(::raise(SIGUSR2) == 0);
    REQUIRE(::raise(SIGUSR1) == 0);
    (void)co_await spindle::sleep_for(20ms);  // both read while nobody waits: both kept
    long before = s.ticks;
    co_await set_waiter({SIGUSR1, SIGUSR2}, {}, s.first);  // the lowest first
    s.first_moved = s.ticks - before;
    before = s.ticks;
    co_await set_waiter({SIGUSR2, SIGUSR1}, {}, s.second);  // the other was still kept
    s.second_moved = s.ticks - before;
    std::stop_source src;
    auto stopper = l.spawn(stop_later(src, 40ms));
    co_await set_waiter({SIGUSR1, SIGUSR2}, src.get_token(), s.third);  // nothing kept any more
    co_await stopper;
    s.stop = true;
    co_await t;
}

struct mixed_state {
    wait_result single, both, other, other_later, after_cancel;
    bool parked = false;
    bool other_parked_after_first = false;
};

task<void> mixed_main(mixed_state& s) {
    loop& l = loop::current();
    auto a = l.spawn(waiter(SIGUSR1, {}, s.single));
    auto b = l.spawn(set_waiter({SIGUSR1, SIGUSR2}, {}, s.both));
    auto c = l.spawn(set_waiter(spindle::signal_set{SIGUSR2}, {}, s.other));
    (void)co_await spindle::sleep_for(20ms);
    s.parked = !a.done() && !b.done() && !c.done();
    REQUIRE(::raise(SIGUSR1) == 0);  // one delivery: the single waiter and the set with SIGUSR1
    co_await a;
    co_await b;
    (void)co_await spindle::sleep_for(20ms);
    s.other_parked_after_first = !c.done();
    REQUIRE(::raise(SIGUSR2) == 0);
    co_await c;
    // A set wait cancelled by its deadline leaves the list: the next delivery
    // has nobody to wake and is kept for the wait after.
    auto r = co_await spindle::with_timeout(20ms, spindle::wait_signal({SIGUSR1, SIGUSR2}));
    s.after_cancel.error = r.error();
    REQUIRE(::raise(SIGUSR2) == 0);
    (void)co_await spindle::sleep_for(20ms);
    co_await set_waiter({SIGUSR1, SIGUSR2}, {}, s.other_later);
}

/// Runs ticks until the task is ready to run again (its wait completed) but
/// has not run yet.
bool run_until_ready(loop& l, std::uint64_t id) {
    return spindle::test::run_until(l, [&] {
        for (const auto& t : l.tasks())
            if (t.id == id) return t.state == spindle::task_info::state_kind::ready;
        return false;
    });
}

}  // namespace

TEST_CASE("signals: wait_signal({a, b}) wakes on either and gives the one that arrived", "[signals][set]") {
    require_clean_start();
    for (const auto& m : mechanisms) {
        SECTION(m.name) {
            for (bool use_kill : {false, true}) {
                CAPTURE(use_kill);
                wait_result first, second;
                bool parked = false;
                loop l(options_for(m.kind));
                run(l, set_wake_main(use_kill, first, second, parked));
                CHECK(parked);
                CHECK(first.has_value);
                CHECK(first.signo == SIGUSR2);
                CHECK(second.has_value);
                CHECK(second.signo == SIGUSR1);
            }
        }
    }
}

TEST_CASE("signals: a set wait takes a kept signal at once, the lowest first; the others stay kept", "[signals][set]") {
    require_clean_start();
    for (const auto& m : mechanisms) {
        SECTION(m.name) {
            set_kept_state s;
            loop l(options_for(m.kind));
            run(l, set_kept_main(s));
            CHECK(s.first.signo == SIGUSR1);
            CHECK(s.first_moved == 0);  // returned at once
            CHECK(s.second.signo == SIGUSR2);
            CHECK(s.second_moved == 0);
            CHECK_FALSE(s.third.has_value);
            CHECK(s.third.error == std::errc::operation_canceled);
        }
    }
}

TEST_CASE("signals: one delivery wakes single and set waiters that hold it; a set without it stays parked; a cancelled set wait leaves",
          "[signals][set]") {
    require_clean_start();
    for (const auto& m : mechanisms) {
        SECTION(m.name) {
            mixed_state s;
            loop l(options_for(m.kind));
            run(l, mixed_main(s));
            CHECK(s.parked);
            CHECK(s.single.signo == SIGUSR1);
            CHECK(s.both.signo == SIGUSR1);
            CHECK(s.other_parked_after_first);
            CHECK(s.other.signo == SIGUSR2);
            CHECK(s.after_cancel.error == std::errc::timed_out);
            CHECK(s.other_later.signo == SIGUSR2);
        }
    }
}

TEST_CASE("signals: a wait woken by a signal and destroyed before its task ran gives the signal back", "[signals][set][lifetime]") {
    require_clean_start();
    for (const auto& m : mechanisms) {
        SECTION(m.name) {
            for (bool set : {false, true}) {
                CAPTURE(set);
                loop l(options_for(m.kind));
                wait_result doomed_result;
                auto doomed = set ? l.spawn(set_waiter({SIGUSR1, SIGUSR2}, {}, doomed_result), "doomed")
                                  : l.spawn(waiter(SIGUSR2, {}, doomed_result), "doomed");
                settle(l);
                std::vector<std::string> waits;
                for (const auto& t : l.tasks()) waits.push_back(t.waiting_on);
                CHECK(waits == std::vector<std::string>{set ? "signals 10,12" : "signal 12"});
                REQUIRE(::raise(SIGUSR2) == 0);
                REQUIRE(run_until_ready(l, doomed.id()));
                doomed.abort();
                CHECK_FALSE(doomed_result.done);
                // Kept again: the next wait returns at once.
                wait_result next;
                auto h = l.spawn(waiter(SIGUSR2, {}, next));
                settle(l);
                CHECK(next.done);
                CHECK(next.signo == SIGUSR2);
            }
        }
    }
}

TEST_CASE("signals: a set is 1 to 64; an empty set is refused", "[signals][set]") {
    CHECK_THROWS_AS(spindle::signal_set(0), std::invalid_argument);
    CHECK_THROWS_AS(spindle::signal_set(SIGUSR1, 65), std::invalid_argument);
    spindle::signal_set s{SIGUSR1, 64};
    CHECK(s.contains(SIGUSR1));
    CHECK(s.contains(64));
    CHECK_FALSE(s.contains(SIGUSR2));
    CHECK_FALSE(s.contains(0));
    CHECK_THROWS_AS((void)spindle::wait_signal(spindle::signal_set{}), std::invalid_argument);
}
