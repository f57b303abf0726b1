// async_generator<T>: values in order with waits between them (sleeps, a
// channel, awaited tasks, another generator), laziness, yielded references
// valid until next(), rvalues and conversions without copies, move-only and
// reference types, early destruction of the producer and its locals, an
// exception reaching next(), cancellation of the consumer (stop token,
// with_timeout, join_handle::cancel) reaching a producer parked on a read,
// the consumer aborted or its loop destroyed while the producer is parked, ten
// million values without an allocation each, and the budget: two consumers of
// never-waiting generators interleave.
#include "counting_new.hpp"
#include "support.hpp"

#include <spindle/async_generator.hpp>
#include <spindle/channel.hpp>
#include <spindle/event.hpp>
#include <spindle/io.hpp>
#include <spindle/sleep.hpp>
#include <spindle/timeout.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using spindle::async_generator;
using spindle::loop;
using spindle::next_result;
using spindle::result;
using spindle::task;
using spindle::test::counted;
using spindle::test::error_of;
using spindle::test::run;
using spindle::test::run_until;
using spindle::test::settle;
using spindle::test::socket_pair;

namespace {

// Compared as conditions: I/O reports the system category's ECANCELED.
constexpr auto canceled = std::errc::operation_canceled;
constexpr auto timed_out = std::errc::timed_out;

spindle::loop_options budget_of(unsigned n) {
    spindle::loop_options o;
    o.task_budget = n;
    return o;
}

/// Counts constructions, copies and destructions, to prove values travel
/// without copies and nothing leaks.
struct tracked {
    static inline int alive = 0;
    static inline int copies = 0;
    int v = 0;
    explicit tracked(int x) noexcept : v(x) { ++alive; }
    tracked(const tracked& o) noexcept : v(o.v) {
        ++alive;
        ++copies;
    }
    tracked(tracked&& o) noexcept : v(std::exchange(o.v, -1)) { ++alive; }
    tracked& operator=(const tracked&) = delete;
    ~tracked() { --alive; }
};

// --- producers ------------------------------------------------------------------------

async_generator<int> counting(int n) {
    for (int i = 0; i < n; ++i) co_yield i;
}

async_generator<int> sleepy(int n) {
    for (int i = 0; i < n; ++i) {
        std::error_code slept = error_of(co_await spindle::sleep_for(1ms));
        if (slept) co_return;
        co_yield i * 10;
    }
}

async_generator<int> from_channel(spindle::channel<int>& ch) {
    for (;;) {
        result<int> v = co_await ch.receive();
        if (!v) co_return;
        co_yield *v;
    }
}

task<int> slow_double(int x) {
    (void)co_await spindle::sleep_for(1ms);
    co_return 2 * x;
}

/// Awaits a task (a frame of its own below the producer's) between yields.
async_generator<int> through_tasks(int n) {
    for (int i = 0; i < n; ++i) co_yield co_await slow_double(i);
}

/// A generator over another one.
async_generator<int> plus_one(async_generator<int>& inner) {
    while (auto v = co_await inner.next()) co_yield *v + 1;
}

task<void> feed(spindle::channel<int>& ch, int n) {
    for (int i = 0; i < n; ++i) {
        (void)co_await spindle::sleep_for(1ms);
        (void)co_await ch.send(100 + i);
    }
    ch.close();
}

/// Takes every value: how many came.
template <class T>
task<int> drain(async_generator<T>& gen) {
    int n = 0;
    while (co_await gen.next()) ++n;
    co_return n;
}

template <class T>
task<std::vector<T>> collect(async_generator<T>& gen) {
    std::vector<T> out;
    while (auto v = co_await gen.next()) out.push_back(*v);
    co_return out;
}

/// Reads one byte at a time from `fd` and yields it, with a counted local;
/// notes how its last read ended.
async_generator<char> bytes_from(int fd, std::error_code& last, int& reads) {
    counted local;
    for (;;) {
        char c = 0;
        result<std::size_t> n = co_await spindle::read(fd, std::as_writable_bytes(std::span(&c, 1)));
        ++reads;
        if (!n) {
            last = n.error();
            co_return;
        }
        if (*n == 0) co_return;
        co_yield c;
    }
}

}  // namespace

TEST_CASE("generator: values in order, with sleeps, a channel, awaited tasks and another generator between them",
          "[generator]") {
    loop l;
    auto values = run(l, []() -> task<std::vector<int>> {
        auto gen = sleepy(5);
        co_return co_await collect(gen);
    }());
    CHECK(values == std::vector<int>{0, 10, 20, 30, 40});

    spindle::channel<int> ch(1);
    l.spawn(feed(ch, 4)).detach();
    auto fed = run(l, [](spindle::channel<int>& c) -> task<std::vector<int>> {
        auto gen = from_channel(c);
        co_return co_await collect(gen);
    }(ch));
    CHECK(fed == std::vector<int>{100, 101, 102, 103});

    auto doubled = run(l, []() -> task<std::vector<int>> {
        auto gen = through_tasks(4);
        co_return co_await collect(gen);
    }());
    CHECK(doubled == std::vector<int>{0, 2, 4, 6});

    auto nested = run(l, []() -> task<std::vector<int>> {
        auto inner = sleepy(3);
        auto outer = plus_one(inner);
        co_return co_await collect(outer);
    }());
    CHECK(nested == std::vector<int>{1, 11, 21});
}

TEST_CASE("generator: lazy; the producer runs inside the consumer's task; after the end next() gives the end again",
          "[generator]") {
    loop l;
    struct state {
        int started = 0;
        const spindle::detail::task_header* producer_task = nullptr;
        const spindle::detail::task_header* consumer_task = nullptr;
        int ends_seen = 0;
        bool done_at_end = false;
    } s;
    run(l, [](state& st) -> task<void> {
        auto make = [](state& in) -> async_generator<int> {
            ++in.started;
            (void)co_await spindle::sleep_for(1ms);
            in.producer_task = spindle::detail::current_task_or_null();
            co_yield 1;
        };
        auto gen = make(st);
        CHECK(gen.valid());
        CHECK(st.started == 0);  // nothing runs before next()
        (void)co_await spindle::sleep_for(1ms);
        CHECK(st.started == 0);
        st.consumer_task = spindle::detail::current_task_or_null();
        auto first = co_await gen.next();
        CHECK(first);
        CHECK(st.started == 1);
        CHECK_FALSE(gen.done());
        for (int i = 0; i < 3; ++i) {
            auto r = co_await gen.next();
            if (!r && !r.cancelled()) ++st.ends_seen;
        }
        st.done_at_end = gen.done();
    }(s));
    CHECK(s.producer_task != nullptr);
    CHECK(s.producer_task == s.consumer_task);
    CHECK(s.ends_seen == 3);
    CHECK(s.done_at_end);

    // An empty generator: the end at once.
    bool empty_end = run(l, []() -> task<bool> {
        async_generator<int> none;
        auto r = co_await none.next();
        co_return !r && none.done() && !none.valid();
    }());
    CHECK(empty_end);
}

TEST_CASE("generator: a yielded lvalue is the producer's object, valid until the next next()", "[generator]") {
    loop l;
    struct state {
        bool same_object = false;
        std::string seen_before_next;
        std::string producer_saw;
        int producer_value_after = 0;
    } s;
    run(l, [](state& st) -> task<void> {
        const std::string* where = nullptr;
        auto strings = [](const std::string*& at) -> async_generator<std::string> {
            std::string text = "first value, long enough not to fit a small-string buffer";
            at = &text;
            co_yield text;
            // Reached only at the next next(): the consumer's view of `text`
            // was valid until then.
            text = "changed";
            co_yield text;
        }(where);
        auto v = co_await strings.next();
        REQUIRE(v);
        st.same_object = &*v == where;
        (void)co_await spindle::sleep_for(1ms);  // the producer stays suspended meanwhile
        st.seen_before_next = *v;
        auto w = co_await strings.next();
        REQUIRE(w);
        st.producer_saw = *w;

        // A generator of references: the consumer writes through to the producer.
        auto refs = [](int& out) -> async_generator<int&> {
            int local = 1;
            co_yield local;
            out = local;  // what the consumer wrote
        }(st.producer_value_after);
        auto r = co_await refs.next();
        REQUIRE(r);
        *r = 42;
        auto end = co_await refs.next();
        CHECK_FALSE(end);
    }(s));
    CHECK(s.same_object);
    CHECK(s.seen_before_next == "first value, long enough not to fit a small-string buffer");
    CHECK(s.producer_saw == "changed");
    CHECK(s.producer_value_after == 42);
}

TEST_CASE("generator: rvalues and converted values live in the producer's frame, never copied", "[generator]") {
    tracked::alive = 0;
    tracked::copies = 0;
    loop l;
    std::vector<int> got;
    std::vector<int> alive_at;
    run(l, [](std::vector<int>& out, std::vector<int>& alive) -> task<void> {
        auto gen = []() -> async_generator<tracked> {
            co_yield tracked(1);  // a temporary of the co_yield expression
            {
                tracked named(2);
                co_yield std::move(named);  // an xvalue: the named object itself
            }
            co_yield 3;  // converted: built in the frame
            const tracked constant(4);
            co_yield constant;  // a const lvalue: the one copy asked for
        }();
        while (auto v = co_await gen.next()) {
            out.push_back(v->v);
            alive.push_back(tracked::alive);
        }
    }(got, alive_at));
    CHECK(got == std::vector<int>{1, 2, 3, 4});
    CHECK(alive_at == std::vector<int>{1, 1, 1, 2});  // the last: `constant` and its copy
    CHECK(tracked::copies == 1);
    CHECK(tracked::alive == 0);
}

TEST_CASE("generator: move-only values are moved out by the consumer", "[generator]") {
    loop l;
    std::vector<int> got;
    run(l, [](std::vector<int>& out) -> task<void> {
        auto gen = []() -> async_generator<std::unique_ptr<int>> {
            for (int i = 0; i < 3; ++i) {
                (void)co_await spindle::sleep_for(1ms);
                co_yield std::make_unique<int>(i);
            }
            auto kept = std::make_unique<int>(7);
            co_yield kept;  // an lvalue: the consumer may move it out too
            CHECK(kept == nullptr);
        }();
        while (auto v = co_await gen.next()) {
            std::unique_ptr<int> mine = std::move(*v);
            REQUIRE(mine);
            out.push_back(*mine);
        }
    }(got));
    CHECK(got == std::vector<int>{0, 1, 2, 7});
}

TEST_CASE("generator: destroyed early, the producer's frame and its locals go", "[generator]") {
    counted::alive = 0;
    loop l;
    run(l, []() -> task<void> {
        auto make = [](const counted& param) -> async_generator<int> {
            counted copy = param;
            counted local;
            for (int i = 0;; ++i) {
                (void)co_await spindle::sleep_for(1ms);
                co_yield i;
            }
        };
        counted outside;
        {
            auto never_started = make(outside);
            CHECK(counted::alive == 1);  // only `outside`: the body has not run
        }
        {
            auto gen = make(outside);
            auto a = co_await gen.next();
            const int first = a ? *a : -1;  // `a` refers to the producer's `i`, valid until the next next()
            auto b = co_await gen.next();
            CHECK(first == 0);
            CHECK((b && *b == 1));
            CHECK(counted::alive == 3);  // outside, copy, local
        }
        CHECK(counted::alive == 1);
        {
            // Moved, then the target assigned over: the first producer goes then.
            auto gen = make(outside);
            auto a = co_await gen.next();
            CHECK(a);
            async_generator<int> moved = std::move(gen);
            CHECK_FALSE(gen.valid());
            CHECK(counted::alive == 3);
            moved = counting(1);
            CHECK(counted::alive == 1);
        }
    }());
    CHECK(counted::alive == 0);
}

TEST_CASE("generator: the producer's exception is rethrown from next(), then next() gives the end", "[generator]") {
    loop l;
    counted::alive = 0;
    struct outcome {
        std::vector<int> values;
        std::string error;
        bool end_after = false;
        bool done = false;
    } o;
    run(l, [](outcome& out) -> task<void> {
        auto gen = []() -> async_generator<int> {
            counted local;
            co_yield 1;
            (void)co_await spindle::sleep_for(1ms);
            co_yield 2;
            throw std::runtime_error("producer failed");
        }();
        try {
            while (auto v = co_await gen.next()) out.values.push_back(*v);
        } catch (const std::runtime_error& e) {
            out.error = e.what();
        }
        auto after = co_await gen.next();
        out.end_after = !after && !after.cancelled();
        out.done = gen.done();
    }(o));
    CHECK(o.values == std::vector<int>{1, 2});
    CHECK(o.error == "producer failed");
    CHECK(o.end_after);
    CHECK(o.done);
    CHECK(counted::alive == 0);

    // Thrown before the first yield.
    bool thrown = run(l, []() -> task<bool> {
        auto gen = []() -> async_generator<int> {
            throw std::logic_error("at once");
            co_return;
        }();
        try {
            (void)co_await gen.next();
        } catch (const std::logic_error&) {
            co_return true;
        }
        co_return false;
    }());
    CHECK(thrown);
}

TEST_CASE("generator: next(token) cancels the read the producer is parked on; the frames are freed", "[generator][cancel]") {
    counted::alive = 0;
    socket_pair sp;
    loop l;
    std::stop_source stop;
    struct outcome {
        std::vector<char> got;
        bool cancelled = false;
        bool done = false;
        std::error_code last;
        int reads = 0;
        bool finished = false;
    } o;
    auto consumer = l.spawn([](int fd, std::stop_token token, outcome& out) -> task<void> {
        counted consumer_local;
        auto gen = bytes_from(fd, out.last, out.reads);
        for (;;) {
            auto v = co_await gen.next(token);
            if (!v) {
                out.cancelled = v.cancelled();
                break;
            }
            out.got.push_back(*v);
        }
        out.done = gen.done();
        out.finished = true;
    }(sp.a, stop.get_token(), o), "consumer");
    REQUIRE(::write(sp.b, "ab", 2) == 2);
    REQUIRE(run_until(l, [&] { return o.got.size() == 2; }));
    settle(l);
    // The consumer's task is parked on the producer's read.
    bool parked_on_read = false;
    for (const auto& t : l.tasks())
        if (t.name == "consumer")
            parked_on_read = t.state == spindle::task_info::state_kind::parked && t.waiting_on.find("fd") != std::string::npos;
    CHECK(parked_on_read);
    CHECK(counted::alive == 2);
    stop.request_stop();
    REQUIRE(run_until(l, [&] { return consumer.done(); }));
    CHECK(o.finished);
    CHECK(o.got == std::vector<char>{'a', 'b'});
    CHECK(o.last == canceled);  // the producer's read saw the cancel
    CHECK(o.cancelled);
    CHECK(o.done);
    CHECK(counted::alive == 0);
}

TEST_CASE("generator: next(token) stopped before the call does not resume the producer", "[generator][cancel]") {
    loop l;
    struct outcome {
        int steps = 0;
        bool cancelled = false;
        bool later_value = false;
    } o;
    run(l, [](outcome& out) -> task<void> {
        auto gen = [](int& steps) -> async_generator<int> {
            for (int i = 0;; ++i) {
                ++steps;
                co_yield i;
            }
        }(out.steps);
        std::stop_source stop;
        stop.request_stop();
        auto r = co_await gen.next(stop.get_token());
        out.cancelled = !r && r.cancelled();
        CHECK(out.steps == 0);
        auto later = co_await gen.next();  // the generator goes on where it was
        out.later_value = later && *later == 0;
    }(o));
    CHECK(o.cancelled);
    CHECK(o.later_value);
    CHECK(o.steps == 1);
}

TEST_CASE("generator: after next(token)'s stop, later waits of the producer are cancelled at once until it yields",
          "[generator][cancel]") {
    socket_pair sp;
    loop l;
    std::stop_source stop;
    struct outcome {
        std::error_code read_error;
        std::error_code sleep_error;
        bool got_value = false;
        bool cancelled_flag = true;
        bool after_value = false;
    } o;
    auto consumer = l.spawn([](int fd, std::stop_token token, outcome& out) -> task<void> {
        auto gen = [](int f, outcome& st) -> async_generator<result<int>> {
            char c = 0;
            result<std::size_t> n = co_await spindle::read(f, std::as_writable_bytes(std::span(&c, 1)));
            st.read_error = n.error();
            // Inside the cancelled scope: cancelled at once, not after an hour.
            st.sleep_error = error_of(co_await spindle::sleep_for(1h));
            co_yield n.error();  // a result-style error, as a value
            (void)co_await spindle::sleep_for(1ms);  // outside next(token): sleeps
            co_yield 5;
        }(fd, out);
        auto v = co_await gen.next(token);
        out.got_value = v && !*v && (*v).error() == std::errc::operation_canceled;
        out.cancelled_flag = v.cancelled();
        auto w = co_await gen.next(token);  // a stopped token: the producer is not resumed
        auto x = co_await gen.next();
        out.after_value = !w && w.cancelled() && x && *x && **x == 5;
    }(sp.a, stop.get_token(), o));
    settle(l);
    stop.request_stop();
    REQUIRE(run_until(l, [&] { return consumer.done(); }));
    CHECK(o.read_error == canceled);
    CHECK(o.sleep_error == canceled);
    CHECK(o.got_value);
    CHECK_FALSE(o.cancelled_flag);
    CHECK(o.after_value);
}

TEST_CASE("generator: with_timeout around next() reaches the producer's read; timed_out; the frames are freed",
          "[generator][cancel]") {
    counted::alive = 0;
    socket_pair sp;
    loop l;
    struct outcome {
        std::error_code timeout_error;
        std::error_code last;
        int reads = 0;
        bool value_in_time = false;
        bool end_after = false;
    } o;
    run(l, [](int fd, int writer, outcome& out) -> task<void> {
        auto gen = bytes_from(fd, out.last, out.reads);
        // A byte arrives in time: the value, no timeout.
        REQUIRE(::write(writer, "x", 1) == 1);
        auto in_time = co_await spindle::with_timeout(10s, gen.next());
        out.value_in_time = in_time && *in_time && **in_time == 'x';
        // Nothing arrives: the deadline cancels the read, inside the producer.
        auto late = co_await spindle::with_timeout(20ms, gen.next());
        if (!late) out.timeout_error = late.error();
        auto after = co_await gen.next();
        out.end_after = !after && gen.done();
    }(sp.a, sp.b, o));
    CHECK(o.value_in_time);
    CHECK(o.timeout_error == timed_out);
    CHECK(o.last == canceled);
    CHECK(o.end_after);
    CHECK(counted::alive == 0);

    // A deadline on a next(token): the same.
    std::error_code both = run(l, [](int fd) -> task<std::error_code> {
        std::error_code last;
        int reads = 0;
        auto gen = bytes_from(fd, last, reads);
        std::stop_source stop;
        auto r = co_await spindle::with_timeout(20ms, gen.next(stop.get_token()));
        co_return r ? std::error_code{} : r.error();
    }(sp.a));
    CHECK(both == timed_out);
    CHECK(counted::alive == 0);
}

TEST_CASE("generator: join_handle::cancel of the consumer reaches the producer's read", "[generator][cancel]") {
    counted::alive = 0;
    socket_pair sp;
    loop l;
    struct outcome {
        std::error_code last;
        int reads = 0;
        bool ended = false;
    } o;
    auto consumer = l.spawn([](int fd, outcome& out) -> task<void> {
        auto gen = bytes_from(fd, out.last, out.reads);
        (void)co_await drain(gen);
        out.ended = gen.done();
    }(sp.a, o));
    settle(l);
    CHECK(counted::alive == 1);
    consumer.cancel();
    REQUIRE(run_until(l, [&] { return consumer.done(); }));
    CHECK(o.last == canceled);
    CHECK(o.ended);
    CHECK(counted::alive == 0);
}

TEST_CASE("generator: the consumer aborted, or its loop destroyed, while the producer is parked: both frames go once",
          "[generator][lifetime]") {
    counted::alive = 0;
    socket_pair sp;
    std::error_code last;
    int reads = 0;
    {
        loop l;
        auto consumer = l.spawn([](int fd, std::error_code& e, int& n) -> task<void> {
            counted consumer_local;
            auto gen = bytes_from(fd, e, n);
            std::stop_source stop;  // a pending next(token) too: its scope and callback go first
            while (co_await gen.next(stop.get_token())) {
            }
        }(sp.a, last, reads));
        settle(l);
        CHECK(counted::alive == 2);
        consumer.abort();
        CHECK(counted::alive == 0);
        CHECK(reads == 0);  // the read was withdrawn, never completed
        // The loop goes on: the withdrawn read does not come back.
        REQUIRE(::write(sp.b, "z", 1) == 1);
        settle(l);
        CHECK(reads == 0);
    }
    {
        auto l = std::make_unique<loop>();
        auto consumer = l->spawn([](int fd, std::error_code& e, int& n) -> task<void> {
            counted consumer_local;
            auto gen = bytes_from(fd, e, n);
            (void)co_await drain(gen);  // next() one task deeper than the generator
        }(sp.a, last, reads));
        // Drain the byte written above first, so the read parks.
        char c;
        while (::recv(sp.a, &c, 1, MSG_DONTWAIT) > 0) {
        }
        settle(*l);
        CHECK(counted::alive == 2);
        l.reset();
        CHECK(counted::alive == 0);
        CHECK(consumer.done());
    }
}

TEST_CASE("generator: next() while another next() of the same generator is pending throws logic_error", "[generator]") {
    loop l;
    spindle::event go;
    async_generator<int> gen = [](spindle::event& ev) -> async_generator<int> {
        (void)co_await ev.wait();
        co_yield 1;
    }(go);
    bool first_value = false;
    auto first = l.spawn([](async_generator<int>& g, bool& ok) -> task<void> {
        auto v = co_await g.next();
        ok = v && *v == 1;
    }(gen, first_value));
    settle(l);
    bool threw = run(l, [](async_generator<int>& g) -> task<bool> {
        try {
            (void)co_await g.next();
        } catch (const std::logic_error&) {
            co_return true;
        }
        co_return false;
    }(gen));
    CHECK(threw);
    go.set();
    REQUIRE(run_until(l, [&] { return first.done(); }));
    CHECK(first_value);
}

TEST_CASE("generator: ten million values cost no allocation each", "[generator][alloc]") {
    loop l;
    struct outcome {
        std::int64_t sum = 0;
        std::int64_t count = 0;
        std::size_t allocations = 0;
    } o;
    constexpr int n = 10'000'000;
    run(
        l,
        [](outcome& out) -> task<void> {
            auto gen = counting(n);
            auto first = co_await gen.next();  // the frame is allocated by now
            REQUIRE(first);
            out.sum += *first;
            ++out.count;
#if SPINDLE_FRAME_POOL
            spindle::test::t_allocations = 0;
            spindle::test::t_counting = true;
#endif
            while (auto v = co_await gen.next()) {
                out.sum += *v;
                ++out.count;
            }
#if SPINDLE_FRAME_POOL
            spindle::test::t_counting = false;
            out.allocations = spindle::test::t_allocations;
#endif
        }(o),
        std::chrono::seconds(120));
    CHECK(o.count == n);
    CHECK(o.sum == std::int64_t{n} * (n - 1) / 2);
#if SPINDLE_FRAME_POOL
    CHECK(o.allocations == 0);
#else
    WARN("frame pool off (sanitizer build): allocations not counted");
#endif
}

TEST_CASE("generator: two consumers of never-waiting generators interleave within the budget", "[generator][budget]") {
    for (const unsigned budget : {1u, 8u, 128u}) {
        INFO("task_budget " << budget);
        loop l(budget_of(budget));
        constexpr int values = 2000;
        std::vector<int> order;  // which consumer took each value
        std::vector<int> got_a;
        std::vector<int> got_b;
        auto consume = [](int who, std::vector<int>& seq, std::vector<int>& got) -> task<void> {
            auto gen = counting(values);
            while (auto v = co_await gen.next()) {
                seq.push_back(who);
                got.push_back(*v);
            }
        };
        auto a = l.spawn(consume(0, order, got_a));
        auto b = l.spawn(consume(1, order, got_b));
        REQUIRE(run_until(l, [&] { return a.done() && b.done(); }));
        REQUIRE(got_a.size() == values);
        REQUIRE(got_b.size() == values);
        for (int i = 0; i < values; ++i) {
            REQUIRE(got_a[static_cast<std::size_t>(i)] == i);
            REQUIRE(got_b[static_cast<std::size_t>(i)] == i);
        }
        std::size_t longest = 0;
        std::size_t run = 0;
        std::size_t switches = 0;
        for (std::size_t i = 0; i < order.size(); ++i) {
            const bool same = i > 0 && order[i] == order[i - 1];
            if (i > 0 && !same) ++switches;
            run = same ? run + 1 : 1;
            longest = std::max(longest, run);
        }
        // Each turn hands over at most a budget of values (the first turn's
        // value that found the budget spent counts in the next).
        CHECK(longest <= budget);
        CHECK(switches >= 2 * values / budget - 2);
    }
}

TEST_CASE("generator: a budget_exempt_scope lets a producer's values run on without a requeue", "[generator][budget]") {
    loop l(budget_of(4));
    long other_turns = 0;
    bool quit = false;
    auto counter = l.spawn([](long& turns, const bool& stop) -> task<void> {
        while (!stop) {
            ++turns;
            co_await spindle::yield();
        }
    }(other_turns, quit));
    long turns_during = -1;
    auto consumer = l.spawn([](const long& turns, long& during, bool& stop) -> task<void> {
        co_await spindle::yield();
        const long before = turns;
        {
            spindle::budget_exempt_scope exempt;
            auto gen = counting(100);
            (void)co_await drain(gen);
        }
        during = turns - before;
        stop = true;
    }(other_turns, turns_during, quit));
    REQUIRE(run_until(l, [&] { return consumer.done() && counter.done(); }));
    CHECK(turns_during == 0);
}
