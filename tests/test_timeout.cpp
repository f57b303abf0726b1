// with_timeout and with_deadline (spindle/timeout.hpp): deadlines on raw I/O,
// on tasks doing several waits, on sleeps and connects; nesting; results that
// win the race against the timer; stop_token cancellation; and frames
// destroyed while a deadline is armed.

#include "net_support.hpp"

#include <spindle/net/tcp.hpp>
#include <spindle/net/unix.hpp>

#include <array>
#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::with_deadline;
using spindle::with_timeout;
using spindle::test::bytes_of;
using spindle::test::counted;
using spindle::test::pipe_pair;
using spindle::test::run;
using spindle::test::text_of;
namespace net = spindle::net;
using spindle::test::error_of;

namespace {

/// What one timed operation ended with.
struct outcome {
    bool done = false;
    bool has_value = false;
    std::size_t value = 0;
    std::error_code error;
    steady::duration elapsed{};

    void take(const result<std::size_t>& r, steady::time_point start) {
        done = true;
        has_value = r.has_value();
        if (r) value = *r;
        error = r.error();
        elapsed = steady::now() - start;
    }
};

// --- raw awaiter, task, sleep ----------------------------------------------------

task<void> raw_read_with_timeout(int fd, outcome& o) {
    std::array<std::byte, 8> buf{};
    const auto start = steady::now();
    o.take(co_await with_timeout(50ms, spindle::read(fd, buf)), start);
}

struct steps_state {
    int finished_waits = 0;
    std::error_code inner_saw;
    outcome outer;
};

/// Two sleeps that finish, then a read that never does.
task<result<std::size_t>> several_waits(int fd, steps_state& s) {
    if (auto e = error_of(co_await spindle::sleep_for(10ms))) co_return e;
    ++s.finished_waits;
    if (auto e = error_of(co_await spindle::sleep_for(10ms))) co_return e;
    ++s.finished_waits;
    std::array<std::byte, 8> buf{};
    result<std::size_t> r = co_await spindle::read(fd, buf);
    s.inner_saw = r.error();
    co_return r;
}

task<void> several_waits_main(int fd, steps_state& s) {
    const auto start = steady::now();
    s.outer.take(co_await with_timeout(100ms, several_waits(fd, s)), start);
}

struct later_waits_state {
    std::error_code first;
    std::error_code second_sleep;
    std::error_code ready_read;
    std::error_code outer;
};

/// After its first wait was cancelled by the deadline, the task goes on
/// waiting: every later operation in the expired scope is cancelled at once,
/// a read that would find its byte without waiting too.
task<result<std::size_t>> keeps_waiting(int fd, int wfd, later_waits_state& s) {
    std::array<std::byte, 8> buf{};
    s.first = error_of(co_await spindle::read(fd, buf));
    s.second_sleep = error_of(co_await spindle::sleep_for(1h));
    REQUIRE(::write(wfd, "r", 1) == 1);
    result<std::size_t> r = co_await spindle::read(fd, buf);
    s.ready_read = r.error();
    co_return r;
}

task<void> keeps_waiting_main(int fd, int wfd, later_waits_state& s) {
    result<std::size_t> r = co_await with_timeout(30ms, keeps_waiting(fd, wfd, s));
    s.outer = r.error();
}

struct sleep_state {
    std::error_code long_sleep;
    std::error_code short_sleep;
    std::error_code after;
    steady::duration long_took{};
};

task<void> sleep_main(sleep_state& s) {
    const auto start = steady::now();
    s.long_sleep = error_of(co_await with_timeout(30ms, spindle::sleep_for(10s)));
    s.long_took = steady::now() - start;
    s.short_sleep = error_of(co_await with_timeout(10s, spindle::sleep_for(10ms)));
    // Both deadlines are gone: a plain sleep afterwards runs its course.
    s.after = error_of(co_await spindle::sleep_for(20ms));
}

// --- nesting -------------------------------------------------------------------------

struct nested_state {
    outcome inner_shorter;
    outcome outer_shorter;
    std::error_code after;
};

task<void> nested_main(int fd, nested_state& s) {
    std::array<std::byte, 8> buf{};
    auto start = steady::now();
    s.inner_shorter.take(co_await with_timeout(10s, with_timeout(30ms, spindle::read(fd, buf))), start);
    start = steady::now();
    s.outer_shorter.take(co_await with_timeout(30ms, with_timeout(10s, spindle::read(fd, buf))), start);
    // Neither scope is left open: a later wait is not cancelled.
    s.after = error_of(co_await spindle::sleep_for(50ms));
}

struct nested_task_state {
    std::error_code inner_saw;
    std::error_code outer_got;
    std::error_code first_inner;
    std::error_code second_wait;
    std::error_code outer_after_inner;
};

/// Opens a long deadline of its own inside the caller's shorter one.
task<result<std::size_t>> inner_long_deadline(int fd, nested_task_state& s) {
    std::array<std::byte, 8> buf{};
    result<std::size_t> r = co_await with_timeout(10s, spindle::read(fd, buf));
    s.inner_saw = r.error();
    co_return r;
}

/// Its own short deadline expires first; the caller's expires on a later wait.
task<result<std::size_t>> inner_expires_first(int fd, nested_task_state& s) {
    std::array<std::byte, 8> buf{};
    result<std::size_t> first = co_await with_timeout(20ms, spindle::read(fd, buf));
    s.first_inner = first.error();
    result<std::size_t> second = co_await spindle::read(fd, buf);
    s.second_wait = second.error();
    co_return second;
}

task<void> nested_tasks_main(int fd, nested_task_state& s) {
    s.outer_got = error_of(co_await with_timeout(30ms, inner_long_deadline(fd, s)));
    s.outer_after_inner = error_of(co_await with_timeout(150ms, inner_expires_first(fd, s)));
}

// --- results that win -----------------------------------------------------------------

struct kept_state {
    outcome zero_deadline;
    outcome same_tick;
    std::string same_tick_bytes;
    bool parked = false;
    std::error_code after;
};

task<void> same_tick_reader(int fd, kept_state& s) {
    std::array<std::byte, 8> buf{};
    s.parked = true;
    const auto start = steady::now();
    result<std::size_t> r = co_await with_timeout(30ms, spindle::read(fd, buf));
    s.same_tick.take(r, start);
    if (r) s.same_tick_bytes = text_of(std::span(buf).first(*r));
    // The expired scope closed with the read: later waits are not cancelled.
    s.after = error_of(co_await spindle::sleep_for(20ms));
}

task<void> kept_main(int rfd, int wfd, kept_state& s) {
    // Bytes already there, a deadline of zero: the read completes inside
    // co_await, before any timer can run.
    REQUIRE(::write(wfd, "now", 3) == 3);
    std::array<std::byte, 8> buf{};
    const auto start = steady::now();
    s.zero_deadline.take(co_await with_timeout(0ms, spindle::read(rfd, buf)), start);

    // The reader parks; then the bytes arrive and the deadline passes while the
    // loop is busy, so the next poll completes the read and the same tick's
    // timer phase fires the deadline. The read came first and keeps its bytes.
    auto reader = loop::current().spawn(same_tick_reader(rfd, s));
    co_await spindle::yield();  // the reader runs and parks
    REQUIRE(s.parked);
    REQUIRE_FALSE(reader.done());
    REQUIRE(::write(wfd, "late", 4) == 4);
    std::this_thread::sleep_for(60ms);  // blocks the loop past the deadline
    co_await reader;
}

// --- streams and connects -------------------------------------------------------------

struct stream_state {
    outcome timed;
    std::string next_read;
    std::string peer_got;
    bool open_after = false;
};

task<void> stream_after_timeout(net::unix_stream& a, net::unix_stream& b, stream_state& s) {
    std::array<std::byte, 16> buf{};
    const auto start = steady::now();
    s.timed.take(co_await with_timeout(30ms, a.read_some(buf)), start);
    s.open_after = a.is_open();
    // The peer writes now: the next read gets exactly these bytes, nothing was
    // lost to the read that timed out.
    result<void> w = co_await b.write_all(bytes_of("after"));
    REQUIRE(w.has_value());
    result<std::size_t> r = co_await a.read_some(buf);
    REQUIRE(r.has_value());
    s.next_read = text_of(std::span(buf).first(*r));
    // And the stream still writes.
    w = co_await a.write_all(bytes_of("back"));
    REQUIRE(w.has_value());
    r = co_await b.read_some(buf);
    REQUIRE(r.has_value());
    s.peer_got = text_of(std::span(buf).first(*r));
}

task<void> connect_with_timeout(net::address to, outcome& o) {
    const auto start = steady::now();
    result<net::tcp_stream> s = co_await with_timeout(100ms, net::tcp_stream::connect(to));
    o.done = true;
    o.has_value = s.has_value();
    o.error = s.error();
    o.elapsed = steady::now() - start;
}

// --- stop_token ------------------------------------------------------------------------

task<void> stop_later(std::stop_source& source) {
    (void)co_await spindle::sleep_for(20ms);
    source.request_stop();
}

task<result<void>> sleep_with_token(std::stop_token token) {
    co_return co_await spindle::sleep_for(1h, std::move(token));
}

struct token_state {
    outcome raw;
    std::error_code in_task;
    std::error_code sleep;
};

task<void> token_main(int fd, token_state& s) {
    loop& l = loop::current();
    std::array<std::byte, 8> buf{};
    {
        std::stop_source source;
        auto stopper = l.spawn(stop_later(source));
        const auto start = steady::now();
        s.raw.take(co_await with_timeout(10s, spindle::read(fd, buf, source.get_token())), start);
        co_await stopper;
    }
    {
        std::stop_source source;
        auto stopper = l.spawn(stop_later(source));
        s.in_task = error_of(co_await with_timeout(10s, sleep_with_token(source.get_token())));
        co_await stopper;
    }
    {
        std::stop_source source;
        auto stopper = l.spawn(stop_later(source));
        s.sleep = error_of(co_await with_timeout(10s, spindle::sleep_for(1h, source.get_token())));
        co_await stopper;
    }
}

// --- operations that throw ------------------------------------------------------------

/// Reports a cancelled read by throwing, as value() does.
task<std::size_t> read_or_throw(int fd) {
    std::array<std::byte, 8> buf{};
    result<std::size_t> r = co_await spindle::read(fd, buf);
    co_return r.value();
}

task<void> throws_logic_error() {
    co_await spindle::yield();
    throw std::logic_error("not a cancellation");
}

struct throw_state {
    std::error_code converted;
    std::string logic;
    std::error_code after_sleep{std::make_error_code(std::errc::io_error)};
    std::error_code after_timeout;
};

task<void> throwing_main(int fd, throw_state& s) {
    // The cancellation it throws becomes the result's error: never thrown.
    result<std::size_t> r = co_await with_timeout(20ms, read_or_throw(fd));
    s.converted = r.error();
    // Any other exception passes unchanged, here through two scopes awaited
    // directly one inside the other.
    try {
        (void)co_await with_timeout(10s, with_timeout(10s, throws_logic_error()));
    } catch (const std::logic_error& e) {
        s.logic = e.what();
    }
    // Both scopes closed: a plain wait runs its course, a new deadline works.
    s.after_sleep = error_of(co_await spindle::sleep_for(20ms));
    std::array<std::byte, 8> buf{};
    s.after_timeout = error_of(co_await with_timeout(20ms, spindle::read(fd, buf)));
}

// --- operations that report no error: task<void>, plain values --------------------------

/// Ignores what its waits say, as code that only does work can.
task<void> sleeps_regardless(std::chrono::nanoseconds d, int& finished) {
    (void)co_await spindle::sleep_for(d);
    ++finished;
}

task<int> sleeps_then_answers(std::chrono::nanoseconds d) {
    (void)co_await spindle::sleep_for(d);
    co_return 42;
}

int answer_slot = 0;
task<int&> sleeps_then_refers(std::chrono::nanoseconds d) {
    (void)co_await spindle::sleep_for(d);
    co_return answer_slot;
}

/// Its own short deadline cuts its read short; it carries on and finishes.
task<void> handles_its_own_timeout(int fd, std::error_code& inner) {
    std::array<std::byte, 8> buf{};
    inner = error_of(co_await with_timeout(20ms, spindle::read(fd, buf)));
    (void)co_await spindle::sleep_for(10ms);
}

struct void_state {
    int finished = 0;
    std::error_code cut;
    steady::duration cut_took{};
    std::error_code in_time;
    std::error_code inner_of_nested;
    std::error_code outer_of_nested;
    std::error_code inner_shorter;
    std::error_code own_timeout_inside;
    std::error_code inner_seen_inside;
    std::error_code plain_cut;
    std::optional<int> plain_in_time;
    bool reference_kept = false;
    std::error_code same_tick;
    std::error_code stopped_by_token;
    std::error_code after;
};

task<void> void_main(int fd, void_state& s) {
    // Cut short: timed_out at the deadline, the task having run to its end.
    auto start = steady::now();
    result<void> r = co_await with_timeout(30ms, sleeps_regardless(1h, s.finished));
    s.cut = r.error();
    s.cut_took = steady::now() - start;
    r = co_await with_timeout(10s, sleeps_regardless(1ms, s.finished));
    s.in_time = r.error();

    // An enclosing deadline cuts the inner operation short: the inner scope
    // says operation_canceled, the outer one turns it into timed_out.
    r = co_await with_timeout(30ms, [](void_state& s) -> task<result<void>> {
        result<void> inner = co_await with_timeout(10s, sleeps_regardless(1h, s.finished));
        s.inner_of_nested = inner.error();
        co_return inner;
    }(s));
    s.outer_of_nested = r.error();
    r = co_await with_timeout(10s, with_timeout(30ms, sleeps_regardless(1h, s.finished)));
    s.inner_shorter = r.error();

    // A deadline inside the operation that the operation handles itself does
    // not cut the operation short.
    r = co_await with_timeout(10s, handles_its_own_timeout(fd, s.inner_seen_inside));
    s.own_timeout_inside = r.error();

    // Plain values: a result of them.
    result<int> answer = co_await with_timeout(30ms, sleeps_then_answers(1h));
    s.plain_cut = answer.error();
    answer = co_await with_timeout(10s, sleeps_then_answers(1ms));
    if (answer) s.plain_in_time = *answer;
    result<std::reference_wrapper<int>> ref = co_await with_timeout(10s, sleeps_then_refers(1ms));
    s.reference_kept = ref && &ref->get() == &answer_slot;

    // A stop token's cancellation is the operation's own business: its waits
    // were not cut short by a deadline or by join_handle::cancel.
    std::stop_source source;
    r = co_await with_timeout(10s, [](std::stop_source& source) -> task<void> {
        loop::current().spawn([](std::stop_source& source) -> task<void> {
            (void)co_await spindle::sleep_for(10ms);
            source.request_stop();
        }(source)).detach();
        (void)co_await spindle::sleep_for(1h, source.get_token());
    }(source));
    s.stopped_by_token = r.error();

    s.after = error_of(co_await spindle::sleep_for(10ms));
}

struct void_same_tick_state {
    bool parked = false;
    std::string got;
    std::error_code outcome;
    steady::duration took{};
};

/// Reads, then finishes without another wait.
task<void> read_and_finish(int fd, void_same_tick_state& s) {
    std::array<std::byte, 8> buf{};
    s.parked = true;
    result<std::size_t> n = co_await spindle::read(fd, buf);
    if (n) s.got = text_of(std::span(buf).first(*n));
}

task<void> void_same_tick_main(int rfd, int wfd, void_same_tick_state& s) {
    // As in kept_main: the read completes in the poll of the tick whose timer
    // phase fires the deadline. The operation's wait was over before the
    // deadline; nothing was cut short, so it succeeds.
    auto reader = loop::current().spawn([](int fd, void_same_tick_state& s) -> task<void> {
        const auto start = steady::now();
        result<void> r = co_await with_timeout(30ms, read_and_finish(fd, s));
        s.outcome = r.error();
        s.took = steady::now() - start;
    }(rfd, s));
    co_await spindle::yield();
    REQUIRE(s.parked);
    REQUIRE(::write(wfd, "late", 4) == 4);
    std::this_thread::sleep_for(60ms);  // blocks the loop past the deadline
    co_await reader;
}

struct void_cancel_state {
    bool parked = false;
    std::error_code outcome;
};

task<void> cancelled_inside(void_cancel_state& s, int& finished) {
    s.parked = true;
    result<void> r = co_await with_timeout(10s, sleeps_regardless(1h, finished));
    s.outcome = r.error();
}

// --- frames destroyed inside with_timeout ---------------------------------------------

struct parked_state {
    bool parked = false;
    int resumed = 0;
};

task<result<std::size_t>> nested_parked(int fd, parked_state& s) {
    counted c;
    std::array<std::byte, 8> buf{};
    s.parked = true;
    result<std::size_t> r = co_await with_timeout(10s, spindle::read(fd, buf));
    ++s.resumed;
    co_return r;
}

/// Parks inside a with_timeout around a task that parks inside another.
task<void> parked_inside_timeouts(int fd, parked_state& s, std::chrono::milliseconds outer) {
    counted c;
    result<std::size_t> r = co_await with_timeout(outer, nested_parked(fd, s));
    ++s.resumed;
    (void)r;
}

struct abort_state {
    bool done_after_abort = false;
    int alive_after_abort = -1;
    bool join_threw_cancelled = false;
    std::error_code later_sleep;
};

task<void> abort_main(int fd, parked_state& p, abort_state& a) {
    loop& l = loop::current();
    // The outer deadline (50 ms) is still armed when the frame goes at 10 ms;
    // the main task then outlives it by far: a timer left behind would fire
    // into freed memory.
    auto victim = l.spawn(parked_inside_timeouts(fd, p, 50ms), "victim");
    (void)co_await spindle::sleep_for(10ms);
    REQUIRE(p.parked);
    victim.abort();
    a.done_after_abort = victim.done();
    a.alive_after_abort = counted::alive;
    a.later_sleep = error_of(co_await spindle::sleep_for(100ms));
    try {
        co_await victim;
    } catch (const std::system_error& e) {
        a.join_threw_cancelled = e.code() == std::errc::operation_canceled;
    }
}

/// The deadline fires and makes the victim ready; before it resumes, the main
/// task (woken by a timer of the same deadline, inserted earlier, so it runs
/// first) destroys it.
task<void> abort_when_ready_main(int fd, parked_state& p, abort_state& a) {
    loop& l = loop::current();
    const auto deadline = steady::now() + 30ms;
    auto victim = l.spawn(
        [](int fd, parked_state& p, steady::time_point deadline) -> task<void> {
            counted c;
            std::array<std::byte, 8> buf{};
            p.parked = true;
            result<std::size_t> r = co_await with_deadline(deadline, spindle::read(fd, buf));
            ++p.resumed;
            (void)r;
        }(fd, p, deadline),
        "victim");
    (void)co_await spindle::sleep_until(deadline);
    REQUIRE(p.parked);
    REQUIRE_FALSE(victim.done());
    victim.abort();
    a.done_after_abort = victim.done();
    a.alive_after_abort = counted::alive;
    a.later_sleep = error_of(co_await spindle::sleep_for(20ms));
}

task<void> other_task_sleeps(std::error_code& e) { e = error_of(co_await spindle::sleep_for(60ms)); }

task<void> independent_main(int fd, outcome& timed, std::error_code& other) {
    auto sleeper = loop::current().spawn(other_task_sleeps(other));
    std::array<std::byte, 8> buf{};
    const auto start = steady::now();
    timed.take(co_await with_timeout(20ms, spindle::read(fd, buf)), start);
    co_await sleeper;
}

}  // namespace

// =====================================================================================

TEST_CASE("with_timeout: a raw read that gets nothing ends with timed_out, not before its deadline", "[timeout]") {
    pipe_pair p;
    outcome o;
    loop l;
    run(l, raw_read_with_timeout(p.r, o));
    REQUIRE(o.done);
    CHECK_FALSE(o.has_value);
    CHECK(o.error == std::errc::timed_out);
    CHECK(o.elapsed >= 50ms);  // a deadline never fires early
    // Nothing was read: the byte written now is the first the pipe gives.
    REQUIRE(p.put('z'));
    char c = 0;
    REQUIRE(::read(p.r, &c, 1) == 1);
    CHECK(c == 'z');
    CHECK_FALSE(l.has_work());
}

TEST_CASE("with_timeout: a task doing several waits is cancelled in the wait it is parked on", "[timeout]") {
    pipe_pair p;
    steps_state s;
    loop l;
    run(l, several_waits_main(p.r, s));
    CHECK(s.finished_waits == 2);  // the sleeps before the deadline ran their course
    // Inside the scope the cancelled wait reports operation_canceled; the
    // with_timeout that expired turns it into timed_out.
    CHECK(s.inner_saw == std::errc::operation_canceled);
    CHECK_FALSE(s.outer.has_value);
    CHECK(s.outer.error == std::errc::timed_out);
    CHECK(s.outer.elapsed >= 100ms);
}

TEST_CASE("with_timeout: once expired, every later operation in the scope is cancelled, ready or not", "[timeout]") {
    pipe_pair p;
    later_waits_state s;
    loop l;
    run(l, keeps_waiting_main(p.r, p.w, s));
    CHECK(s.first == std::errc::operation_canceled);
    CHECK(s.second_sleep == std::errc::operation_canceled);
    // A read that would find its byte at once is stopped too: a task past its
    // deadline must not run on through ready operations. The byte stays.
    CHECK(s.ready_read == std::errc::operation_canceled);
    CHECK(s.outer == std::errc::timed_out);
    char c = 0;
    CHECK(::read(p.r, &c, 1) == 1);
}

TEST_CASE("with_timeout: on a sleep, timed_out when the sleep is longer, success when shorter", "[timeout]") {
    sleep_state s;
    loop l;
    run(l, sleep_main(s));
    CHECK(s.long_sleep == std::errc::timed_out);
    CHECK(s.long_took >= 30ms);
    CHECK_FALSE(s.short_sleep);
    CHECK_FALSE(s.after);
    CHECK_FALSE(l.has_work());  // no timer left armed
}

TEST_CASE("with_timeout: nested, whichever deadline is shorter ends the operation with timed_out", "[timeout]") {
    pipe_pair p;
    nested_state s;
    loop l;
    run(l, nested_main(p.r, s));
    CHECK_FALSE(s.inner_shorter.has_value);
    CHECK(s.inner_shorter.error == std::errc::timed_out);
    CHECK(s.inner_shorter.elapsed >= 30ms);
    CHECK_FALSE(s.outer_shorter.has_value);
    CHECK(s.outer_shorter.error == std::errc::timed_out);
    CHECK(s.outer_shorter.elapsed >= 30ms);
    CHECK_FALSE(s.after);
}

TEST_CASE("with_timeout: nested in tasks, only the scope that expired reports timed_out", "[timeout]") {
    pipe_pair p;
    nested_task_state s;
    loop l;
    run(l, nested_tasks_main(p.r, s));
    // Outer 30 ms around an inner 10 s: the inner scope did not expire, so the
    // inner with_timeout passes operation_canceled on; the outer one converts it.
    CHECK(s.inner_saw == std::errc::operation_canceled);
    CHECK(s.outer_got == std::errc::timed_out);
    // Inner 20 ms inside outer 150 ms: the inner one times out first, the task
    // goes on, and its next wait is cancelled by the outer deadline.
    CHECK(s.first_inner == std::errc::timed_out);
    CHECK(s.second_wait == std::errc::operation_canceled);
    CHECK(s.outer_after_inner == std::errc::timed_out);
}

TEST_CASE("with_timeout: an operation that completed first keeps its result, even in the deadline's tick", "[timeout]") {
    pipe_pair p;
    kept_state s;
    loop l;
    run(l, kept_main(p.r, p.w, s));
    REQUIRE(s.zero_deadline.has_value);
    CHECK(s.zero_deadline.value == 3u);
    REQUIRE(s.same_tick.done);
    CHECK(s.same_tick.elapsed >= 30ms);  // the deadline had passed when it resumed
    REQUIRE(s.same_tick.has_value);
    CHECK(s.same_tick.value == 4u);
    CHECK(s.same_tick_bytes == "late");
    CHECK_FALSE(s.after);
}

TEST_CASE("with_timeout: a plain value whose operation throws operation_canceled when cut off is timed_out; other exceptions pass",
          "[timeout]") {
    pipe_pair p;
    throw_state s;
    loop l;
    run(l, throwing_main(p.r, s));
    CHECK(s.converted == std::errc::timed_out);
    CHECK(s.logic == "not a cancellation");
    CHECK_FALSE(s.after_sleep);
    CHECK(s.after_timeout == std::errc::timed_out);
}

TEST_CASE("with_timeout: a task<void> gives result<void>, timed_out when the deadline cut it short", "[timeout][void]") {
    pipe_pair p;
    void_state s;
    loop l;
    run(l, void_main(p.r, s));
    CHECK(s.cut == std::errc::timed_out);
    CHECK(s.cut_took >= 30ms);
    CHECK(s.cut_took < 10s);
    CHECK_FALSE(s.in_time);
    CHECK(s.inner_of_nested == std::errc::operation_canceled);
    CHECK(s.outer_of_nested == std::errc::timed_out);
    CHECK(s.inner_shorter == std::errc::timed_out);
    CHECK(s.inner_seen_inside == std::errc::timed_out);
    CHECK_FALSE(s.own_timeout_inside);
    CHECK(s.plain_cut == std::errc::timed_out);
    CHECK(s.plain_in_time == 42);
    CHECK(s.reference_kept);
    CHECK_FALSE(s.stopped_by_token);
    CHECK(s.finished == 4);  // every task ran to its end, cut short or not
    CHECK_FALSE(s.after);
}

TEST_CASE("with_timeout: a task<void> whose last wait completed in the deadline's tick succeeds", "[timeout][void]") {
    pipe_pair p;
    void_same_tick_state s;
    loop l;
    run(l, void_same_tick_main(p.r, p.w, s));
    CHECK(s.got == "late");
    CHECK(s.took >= 30ms);  // the deadline had passed when it resumed
    CHECK_FALSE(s.outcome);
}

TEST_CASE("with_timeout: join_handle::cancel() cutting a task<void> short gives operation_canceled", "[timeout][void][cancel]") {
    void_cancel_state s;
    int finished = 0;
    loop l;
    auto h = l.spawn(cancelled_inside(s, finished));
    REQUIRE(spindle::test::run_until(l, [&] { return s.parked; }));
    spindle::test::settle(l);
    h.cancel();
    REQUIRE(spindle::test::run_until(l, [&] { return h.done(); }));
    CHECK(s.outcome == std::errc::operation_canceled);
    CHECK(finished == 1);
}

TEST_CASE("with_timeout: a stream read that timed out consumed nothing and leaves the stream open for more reads and writes",
          "[timeout][net]") {
    stream_state s;
    loop l;
    auto pair = net::unix_stream::pair();
    REQUIRE(pair.has_value());
    run(l, stream_after_timeout(pair->first, pair->second, s));
    CHECK_FALSE(s.timed.has_value);
    CHECK(s.timed.error == std::errc::timed_out);
    CHECK(s.open_after);
    CHECK(s.next_read == "after");
    CHECK(s.peer_got == "back");
}

TEST_CASE("with_timeout: around a connect that the peer never completes", "[timeout][net]") {
    spindle::test::full_listener full;
    if (!full.ready) NET_SKIP("the kernel completed every connect to a listener with backlog 0");
    outcome o;
    loop l;
    run(l, connect_with_timeout(full.addr, o));
    REQUIRE(o.done);
    CHECK_FALSE(o.has_value);
    CHECK(o.error == std::errc::timed_out);
    CHECK(o.elapsed >= 100ms);
}

TEST_CASE("with_timeout: a stop_token cancellation inside it stays operation_canceled", "[timeout][cancel]") {
    pipe_pair p;
    token_state s;
    loop l;
    run(l, token_main(p.r, s));
    CHECK_FALSE(s.raw.has_value);
    CHECK(s.raw.error == std::errc::operation_canceled);
    CHECK(s.in_task == std::errc::operation_canceled);
    CHECK(s.sleep == std::errc::operation_canceled);
}

TEST_CASE("with_timeout: one task's deadline does not touch another task's waits", "[timeout]") {
    pipe_pair p;
    outcome timed;
    std::error_code other{std::make_error_code(std::errc::io_error)};
    loop l;
    run(l, independent_main(p.r, timed, other));
    CHECK(timed.error == std::errc::timed_out);
    CHECK_FALSE(other);
}

TEST_CASE("with_timeout: a task aborted while parked inside nested timeouts leaves no timer or wait behind", "[timeout][lifetime]") {
    pipe_pair p;
    parked_state ps;
    abort_state as;
    counted::alive = 0;
    {
        loop l;
        run(l, abort_main(p.r, ps, as));
        CHECK_FALSE(l.has_work());
    }
    CHECK(as.done_after_abort);
    CHECK(as.alive_after_abort == 0);
    CHECK(ps.resumed == 0);
    CHECK_FALSE(as.later_sleep);  // the main task's own sleep was not cancelled
    CHECK(as.join_threw_cancelled);
    // The aborted read took nothing.
    REQUIRE(p.put('k'));
    char c = 0;
    REQUIRE(::read(p.r, &c, 1) == 1);
    CHECK(c == 'k');
}

TEST_CASE("with_timeout: a task aborted after its deadline fired but before it resumed", "[timeout][lifetime]") {
    pipe_pair p;
    parked_state ps;
    abort_state as;
    counted::alive = 0;
    {
        loop l;
        run(l, abort_when_ready_main(p.r, ps, as));
        CHECK_FALSE(l.has_work());
    }
    CHECK(as.done_after_abort);
    CHECK(as.alive_after_abort == 0);
    CHECK(ps.resumed == 0);
    CHECK_FALSE(as.later_sleep);
}

TEST_CASE("with_timeout: a loop destroyed while tasks are parked inside timeouts frees their frames", "[timeout][lifetime]") {
    pipe_pair p;
    parked_state short_deadline, long_deadline;
    counted::alive = 0;
    {
        loop l;
        // Detached: the loop owns them, and destroys them parked.
        l.spawn(parked_inside_timeouts(p.r, short_deadline, 20ms)).detach();
        l.spawn(parked_inside_timeouts(p.r, long_deadline, 10s)).detach();
        for (int i = 0; i < 100 && !(short_deadline.parked && long_deadline.parked); ++i) l.run_once(1ms);
        REQUIRE(short_deadline.parked);
        REQUIRE(long_deadline.parked);
        CHECK(counted::alive == 4);
    }
    CHECK(counted::alive == 0);
    CHECK(short_deadline.resumed == 0);
    CHECK(long_deadline.resumed == 0);
}

// =====================================================================================
// Every way of cancelling stops the next operation, whether it would have to
// wait or not: a cancelled task does not run on through ready operations.

namespace {

struct ready_receiver_state {
    long received = 0;
    long received_at_cancel = -1;
    std::error_code stopped_by;
};

task<void> receive_all(spindle::channel<int>& ch, ready_receiver_state& s) {
    for (;;) {
        result<int> v = co_await ch.receive();
        if (!v) {
            s.stopped_by = v.error();
            co_return;
        }
        // Turn-taking is not a wait: only the cancel can stop this loop.
        if (++s.received % 100 == 0) co_await spindle::yield();
    }
}

task<void> cancel_after(spindle::join_handle<void>& victim, ready_receiver_state& s) {
    while (s.received < 1000) co_await spindle::yield();
    victim.cancel();
    s.received_at_cancel = s.received;
}

struct ready_reader_state {
    std::size_t read = 0;
    std::error_code stopped_by;
};

task<result<void>> read_byte_by_byte(int fd, ready_reader_state& s) {
    std::array<std::byte, 1> b{};
    for (;;) {
        result<std::size_t> n = co_await spindle::read(fd, b);
        if (!n) co_return n.error();
        s.read += *n;
        co_await spindle::yield();
    }
}

task<void> read_until_deadline(int fd, ready_reader_state& s) {
    result<void> r = co_await with_timeout(20ms, read_byte_by_byte(fd, s));
    s.stopped_by = r.error();
}

}  // namespace

TEST_CASE("cancel: a task that receives only ready values stops at the receive after join_handle::cancel()",
          "[timeout][cancel]") {
    loop l;
    spindle::channel<int> ch(spindle::unbounded_channel);
    for (int i = 0; i < 100'000; ++i) REQUIRE(ch.try_send(int{i}));
    ready_receiver_state s;
    auto victim = l.spawn(receive_all(ch, s));
    auto canceller = l.spawn(cancel_after(victim, s));
    const auto give_up = steady::now() + 10s;
    while (!victim.done() && steady::now() < give_up) l.run_once(10ms);
    REQUIRE(victim.done());
    CHECK(s.stopped_by == std::errc::operation_canceled);
    // Not one more value after the cancel; the rest stay in the channel.
    CHECK(s.received == s.received_at_cancel);
    CHECK(ch.size() == static_cast<std::size_t>(100'000 - s.received));
}

TEST_CASE("with_timeout: a loop of reads that find data at once ends at the deadline, not when the data does",
          "[timeout][cancel]") {
    loop l;
    spindle::test::socket_pair sp;
    // Fill the connection: far more than a byte-by-byte reader gets through in 20 ms.
    std::array<char, 4096> chunk{};
    std::size_t written = 0;
    for (;;) {
        const ssize_t n = ::write(sp.b, chunk.data(), chunk.size());
        if (n <= 0) break;
        written += static_cast<std::size_t>(n);
    }
    REQUIRE(written >= 64 * 1024);
    ready_reader_state s;
    run(l, read_until_deadline(sp.a, s));
    CHECK(s.stopped_by == std::errc::timed_out);
    CAPTURE(s.read, written);
    CHECK(s.read < written);  // stopped with data still buffered
}

// --- a join that can be cancelled ---------------------------------------------------------

TEST_CASE("join(token): a deadline or a stop ends the join, not the task, which can be joined again", "[timeout][join]") {
    loop l;
    struct outcome {
        std::error_code timed;
        std::error_code stopped;
        int value = 0;
        bool still_running_after_cancels = false;
    } o;
    run(l, [](outcome& o) -> task<void> {
        auto h = loop::current().spawn([]() -> task<int> {
            (void)co_await spindle::sleep_for(30ms);
            co_return 42;
        }());
        result<int> timed = co_await with_timeout(5ms, h.join());
        o.timed = timed.error();
        std::stop_source stop;
        auto stopper = loop::current().spawn([](std::stop_source& s) -> task<void> {
            (void)co_await spindle::sleep_for(5ms);
            s.request_stop();
        }(stop));
        result<int> stopped = co_await h.join(stop.get_token());
        o.stopped = stopped.error();
        co_await stopper;
        o.still_running_after_cancels = !h.done();
        result<int> joined = co_await h.join();
        o.value = joined ? *joined : -1;
    }(o));
    CHECK(o.timed == std::errc::timed_out);
    CHECK(o.stopped == std::errc::operation_canceled);
    CHECK(o.still_running_after_cancels);
    CHECK(o.value == 42);
}

TEST_CASE("join(token): a task<void> joins as result<void>, an exception is rethrown", "[timeout][join]") {
    loop l;
    run(l, []() -> task<void> {
        auto quiet = loop::current().spawn([]() -> task<void> { co_return; }());
        result<void> done = co_await quiet.join();
        CHECK(done);
        auto failing = loop::current().spawn([]() -> task<int> {
            (void)co_await spindle::sleep_for(1ms);
            throw std::runtime_error("joined failure");
        }());
        std::string what;
        try {
            (void)co_await failing.join();
        } catch (const std::runtime_error& e) {
            what = e.what();
        }
        CHECK(what == "joined failure");
    }());
}
