// Timers: ordering, the timer queue against a reference model, cancellation,
// and fixed-rate clocks (interval, repeating timers).
#include "counting_new.hpp"
#include "stop_links.hpp"
#include "support.hpp"
#include "timer_queue.hpp"  // the engine's own, tested directly

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using steady = spindle::clock;
using spindle::task;
using spindle::detail::timer_node;
using spindle::detail::timer_queue;
using spindle::test::error_of;

namespace {

long long to_us(steady::duration d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); }

/// Drives `l` until it has no work left, for at most `limit`. Returns false on timeout.
bool drain(spindle::loop& l, std::chrono::milliseconds limit = 10s) {
    const auto give_up = steady::now() + limit;
    while (l.has_work()) {
        if (steady::now() > give_up) return false;
        l.run_once(10ms);
    }
    return true;
}

double cpu_ms() {
    ::rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

// --- ordering ------------------------------------------------------------------

struct order_state {
    int armed = 0;
    std::vector<int> arm_order;   // arming index of each task, by task
    std::vector<int> fire_order;  // arming indexes, in wake-up order
};

task<void> sleep_until_recorded(order_state& s, steady::time_point when) {
    const int me = s.armed++;
    (void)co_await spindle::sleep_until(when);
    s.fire_order.push_back(me);
}

struct random_timers {
    std::vector<std::unique_ptr<spindle::timer>> timers;
    std::vector<int> fired;
    steady::time_point last{};
    long out_of_order = 0;
    long early = 0;
    long total = 0;
};
struct random_ctx {
    random_timers* s;
    std::size_t index;
};

void on_random_timer(void* p) {
    auto& c = *static_cast<random_ctx*>(p);
    random_timers& s = *c.s;
    const auto d = s.timers[c.index]->deadline();
    if (d < s.last) ++s.out_of_order;
    if (steady::now() < d) ++s.early;
    s.last = d;
    ++s.fired[c.index];
    ++s.total;
}

// --- the timer queue against a model ------------------------------------------

struct queue_model;

struct model_node : timer_node {
    int id = 0;
    queue_model* model = nullptr;
};

/// The reference: a std::map ordered by (deadline, arming sequence).
struct queue_model {
    using key = std::pair<std::int64_t, std::uint64_t>;

    timer_queue q;
    std::vector<model_node> nodes;
    std::vector<std::optional<key>> key_of;
    std::map<key, int> armed;
    std::uint64_t seq = 0;
    std::int64_t now = 0;  // the last time passed to fire_expired
    std::mt19937 rng{12345};

    // State of the fire_expired call in progress.
    std::int64_t fire_now = 0;
    std::uint64_t first_new = 0;
    std::size_t fired = 0;
    long wrong_order = 0;
    bool armed_due_in_callback = false;

    explicit queue_model(int n) : nodes(static_cast<std::size_t>(n)), key_of(static_cast<std::size_t>(n)) {
        for (int i = 0; i < n; ++i) {
            nodes[static_cast<std::size_t>(i)].id = i;
            nodes[static_cast<std::size_t>(i)].model = this;
            nodes[static_cast<std::size_t>(i)].m_fire = &on_fire;
        }
    }
    queue_model(const queue_model&) = delete;
    queue_model& operator=(const queue_model&) = delete;

    int pick() { return static_cast<int>(rng() % nodes.size()); }
    model_node& node(int id) { return nodes[static_cast<std::size_t>(id)]; }

    void insert(int id, std::int64_t deadline) {
        if (node(id).armed()) return;
        q.insert(node(id), deadline);
        key k{deadline, seq++};
        armed.emplace(k, id);
        key_of[static_cast<std::size_t>(id)] = k;
    }
    void cancel(int id) {
        q.cancel(node(id));
        forget(id);
    }
    void forget(int id) {
        auto& k = key_of[static_cast<std::size_t>(id)];
        if (k) armed.erase(*k);
        k.reset();
    }
    std::int64_t earliest() const { return armed.empty() ? timer_queue::no_deadline : armed.begin()->first.first; }

    /// The next timer the queue must fire in the current call, or -1.
    int expected_next() const {
        for (const auto& [k, id] : armed) {
            if (k.first > fire_now) return -1;
            if (k.second < first_new) return id;  // timers armed during the call are skipped
        }
        return -1;
    }
    /// Timers due and armed before the call that are still waiting.
    long left_behind() const {
        long n = 0;
        for (const auto& [k, id] : armed) {
            if (k.first > fire_now) break;
            if (k.second < first_new) ++n;
        }
        return n;
    }

    std::size_t fire(std::int64_t at) {
        now = at;
        fire_now = at;
        first_new = seq;
        fired = 0;
        armed_due_in_callback = false;
        return q.fire_expired(at);
    }

    static void on_fire(timer_node& n) noexcept {
        auto& me = static_cast<model_node&>(n);
        queue_model& m = *me.model;
        if (m.expected_next() != me.id) ++m.wrong_order;
        m.forget(me.id);
        ++m.fired;
        // Callbacks change the queue while it fires.
        switch (m.rng() % 10) {
            case 0:
                // Re-arm itself, already due: must wait for the next call. (Due
                // "now" exactly: a deadline before one already fired is clamped
                // to it, which the model does not follow; see the test below.)
                m.insert(me.id, m.fire_now);
                m.armed_due_in_callback = true;
                break;
            case 1: m.cancel(m.pick()); break;  // maybe one due later in this call
            case 2: m.insert(m.pick(), m.fire_now + 1 + static_cast<std::int64_t>(m.rng() % 500)); break;
            default: break;
        }
    }
};

// --- cancellation ---------------------------------------------------------------

struct cancel_state {
    std::error_code ec;
    steady::duration elapsed{};
    bool continued = false;
};

task<void> cancellable_sleep(std::stop_token token, cancel_state& s, std::chrono::milliseconds d) {
    const auto t0 = steady::now();
    s.ec = error_of(co_await spindle::sleep_for(d, token));
    s.elapsed = steady::now() - t0;
    co_await spindle::yield();  // still a live, schedulable task
    s.continued = true;
}

task<void> stop_after(std::stop_source& source, std::chrono::milliseconds d) {
    (void)co_await spindle::sleep_for(d);
    source.request_stop();
}

task<void> read_one(int fd, bool& flag) {
    std::array<std::byte, 4> buf{};
    auto r = co_await spindle::read(fd, buf);
    flag = r.has_value();
}

struct self_stopping {
    spindle::timer* t = nullptr;
    int calls = 0;
};
void stop_self(void* p) {
    auto& s = *static_cast<self_stopping*>(p);
    ++s.calls;
    s.t->stop();
}

struct pair_state {
    spindle::timer* victim = nullptr;
    std::vector<char> calls;
};
void first_stops_second(void* p) {
    auto& s = *static_cast<pair_state*>(p);
    s.calls.push_back('A');
    s.victim->stop();
}
void second_records(void* p) { static_cast<pair_state*>(p)->calls.push_back('B'); }

// --- fixed rate -----------------------------------------------------------------

struct rate_log {
    steady::time_point start{};
    std::vector<steady::time_point> times;
    std::vector<std::uint64_t> periods;
    std::error_code error;
};

/// Ticks `n` times on a 10 ms interval whose first tick is at start + 10 ms.
/// After tick `block_at` it blocks the loop's thread for `block`; after every
/// tick it works for `lag` (less than a period).
task<void> run_interval(rate_log& r, int n, int block_at, std::chrono::milliseconds block,
                        std::chrono::milliseconds lag) {
    spindle::interval iv(10ms, r.start + 10ms);
    for (int i = 0; i < n; ++i) {
        auto res = co_await iv.tick();
        if (!res) {
            r.error = res.error();
            break;
        }
        r.times.push_back(steady::now());
        r.periods.push_back(res.value());
        if (i == block_at) std::this_thread::sleep_for(block);
        if (lag > 0ms) std::this_thread::sleep_for(lag);
    }
}

struct repeat_log {
    spindle::timer* t = nullptr;
    steady::time_point first_deadline{};
    int limit = 0;
    int block_at = -1;
    std::chrono::milliseconds block{};
    std::vector<steady::time_point> times;
    std::vector<steady::time_point> due;  // the deadline each call fired for
    std::vector<std::uint64_t> missed;
    long off_grid = 0;
};

void on_repeat(void* p) {
    auto& r = *static_cast<repeat_log*>(p);
    const auto now = steady::now();
    const std::uint64_t missed = r.t->missed();
    // The timer re-arms before calling back: deadline() is already the next one.
    const auto period = std::chrono::nanoseconds(10ms);
    const auto next = r.t->deadline();
    if ((next - r.first_deadline) % period != steady::duration::zero()) ++r.off_grid;
    r.times.push_back(now);
    r.missed.push_back(missed);
    r.due.push_back(next - period * static_cast<long>(missed + 1));
    if (static_cast<int>(r.times.size()) == r.block_at) std::this_thread::sleep_for(r.block);
    if (static_cast<int>(r.times.size()) >= r.limit) r.t->stop();
}


// --- far deadlines --------------------------------------------------------------

struct far_sleep {
    std::error_code ec;
    steady::duration elapsed{};
    bool woke = false;
};

template <class Rep, class Period>
task<void> sleep_far(std::chrono::duration<Rep, Period> d, std::stop_token token, far_sleep& s) {
    const auto t0 = steady::now();
    s.ec = error_of(co_await spindle::sleep_for(d, token));
    s.elapsed = steady::now() - t0;
    s.woke = true;
}

task<void> stop_far_sleeps(std::stop_source& source, std::chrono::milliseconds d, const far_sleep& a,
                           const far_sleep& b, bool& woke_before_stop) {
    (void)co_await spindle::sleep_for(d);
    woke_before_stop = a.woke || b.woke;
    source.request_stop();
}

}  // namespace

// -----------------------------------------------------------------------------

TEST_CASE("sleeps with equal deadlines wake in the order they were armed", "[timers][order]") {
    spindle::loop l;
    order_state s;
    const auto when = steady::now() + 20ms;
    std::vector<spindle::join_handle<void>> handles;
    for (int i = 0; i < 1000; ++i) handles.push_back(l.spawn(sleep_until_recorded(s, when)));
    REQUIRE(drain(l));
    REQUIRE(s.fire_order.size() == 1000);
    long misplaced = 0;
    for (int i = 0; i < 1000; ++i)
        if (s.fire_order[static_cast<std::size_t>(i)] != i) ++misplaced;
    CHECK(misplaced == 0);
}

TEST_CASE("earlier deadlines armed later still fire first; ties keep arming order", "[timers][order]") {
    spindle::loop l;
    order_state s;
    const auto when = steady::now() + 20ms;
    std::vector<spindle::join_handle<void>> handles;
    // Even tasks sleep until `when`, odd ones 1 ms earlier.
    for (int i = 0; i < 200; ++i)
        handles.push_back(l.spawn(sleep_until_recorded(s, i % 2 == 0 ? when : when - 1ms)));
    REQUIRE(drain(l));
    REQUIRE(s.fire_order.size() == 200);
    std::vector<int> expected;
    for (int i = 1; i < 200; i += 2) expected.push_back(i);
    for (int i = 0; i < 200; i += 2) expected.push_back(i);
    CHECK(s.fire_order == expected);
}

TEST_CASE("100,000 random timers fire once each, in deadline order, never early", "[timers][order]") {
    spindle::loop l;
    random_timers s;
    constexpr std::size_t n = 100'000;
    std::vector<random_ctx> ctx;
    ctx.reserve(n);
    s.timers.reserve(n);
    s.fired.assign(n, 0);
    std::mt19937 rng(20240601);
    std::uniform_int_distribution<int> delay_us(0, 200'000);
    for (std::size_t i = 0; i < n; ++i) {
        ctx.push_back(random_ctx{&s, i});
        s.timers.push_back(std::make_unique<spindle::timer>(l));
        s.timers.back()->start(std::chrono::microseconds(delay_us(rng)), &on_random_timer, &ctx.back());
    }
    CHECK(l.timer_count() == n);
    REQUIRE(drain(l));
    CHECK(s.total == static_cast<long>(n));
    CHECK(s.out_of_order == 0);
    CHECK(s.early == 0);
    CHECK(std::count(s.fired.begin(), s.fired.end(), 1) == static_cast<long>(n));
    s.timers.clear();  // before the loop
}

namespace {
/// Runs 100,000 random operations on the queue and its model; `delay()` gives
/// a new timer's deadline after the model's now, `advance()` how far a fire
/// call moves time.
template <class Delay, class Advance>
void run_queue_model(queue_model& m, Delay delay, Advance advance) {
    long size_mismatch = 0, late_next = 0, stale_empty = 0, count_mismatch = 0, missed = 0, due_after_fire = 0;
    long first_bad_op = -1, empty_states = 0;
    std::uniform_int_distribution<int> percent(0, 99);
    auto bad = [&] {
        return size_mismatch + late_next + stale_empty + count_mismatch + missed + due_after_fire + m.wrong_order > 0;
    };
    for (long op = 0; op < 100'000; ++op) {
        const bool bad_before = bad();
        // Phases: fill, cancel-heavy (dead entries outnumber live ones: purges),
        // drain, and empty-out (the queue runs dry).
        const int phase = static_cast<int>(op / 5000 % 4);
        const int insert_p = phase == 0 ? 70 : phase == 3 ? 0 : 20;
        const int cancel_p = phase == 1 ? 70 : phase == 3 ? 50 : 10;
        const int roll = percent(m.rng);
        if (roll < insert_p) {
            m.insert(m.pick(), m.now + delay());
        } else if (roll < insert_p + cancel_p) {
            int id = m.pick();
            for (int tries = 0; tries < 8 && !m.node(id).armed(); ++tries) id = m.pick();
            if (phase == 3 && !m.armed.empty()) id = m.armed.begin()->second;
            m.cancel(id);
        } else {
            const std::int64_t at = m.now + advance();
            const std::size_t got = m.fire(at);
            if (got != m.fired) ++count_mismatch;
            if (m.left_behind() != 0) ++missed;
            // With nothing due armed by a callback, nothing due may be left to report.
            if (!m.armed_due_in_callback && m.q.next_deadline() <= at) ++due_after_fire;
        }
        if (m.armed.empty()) ++empty_states;
        if (m.q.size() != m.armed.size()) ++size_mismatch;
        const std::int64_t next = m.q.next_deadline();
        // A cancelled timer may make next_deadline early (an early wake-up), never late.
        if (next > m.earliest()) ++late_next;
        // An empty queue has nothing that could ever fire to clear a stale deadline.
        if (m.armed.empty() && next != timer_queue::no_deadline) ++stale_empty;
        if (!bad_before && bad()) first_bad_op = op;
    }
    INFO("first bad op: " << first_bad_op << "; ops ending with an empty model: " << empty_states);
    CHECK(empty_states > 0);  // the run-dry path was exercised
    CHECK(m.wrong_order == 0);
    CHECK(count_mismatch == 0);
    CHECK(missed == 0);
    CHECK(due_after_fire == 0);
    CHECK(size_mismatch == 0);
    CHECK(late_next == 0);
    CHECK(stale_empty == 0);
    m.q.clear();
}
}  // namespace

TEST_CASE("timer_queue matches a reference model under 100,000 random operations", "[timers][queue]") {
    queue_model m(4096);
    // Ties are common: deadlines on a 10 ns grid over 10 us.
    run_queue_model(
        m, [&] { return 10 * static_cast<std::int64_t>(m.rng() % 1000); },
        [&] { return static_cast<std::int64_t>(m.rng() % 40); });
}

TEST_CASE("timer_queue matches the model at every scale, from nanoseconds to centuries", "[timers][queue]") {
    // Delays of 2^k ns for any k up to 62 (146 years), and time moving in jumps
    // of any size, so timers enter at every level of the wheel and come down
    // through the others; a few shared absolute deadlines, armed at different
    // times from different levels, must still fire in arming order.
    queue_model m(4096);
    std::array<std::int64_t, 4> shared{};
    auto scaled = [&](int max_bits) {
        const int bits = static_cast<int>(m.rng() % static_cast<unsigned>(max_bits + 1));
        const std::uint64_t span = std::uint64_t{1} << bits;
        return static_cast<std::int64_t>((static_cast<std::uint64_t>(m.rng()) << 32 | m.rng()) % span);
    };
    long refresh = 0;
    run_queue_model(
        m,
        [&]() -> std::int64_t {
            if (refresh++ % 5000 == 0)
                for (auto& d : shared) d = m.now + scaled(40);
            if (m.rng() % 4 == 0) {
                const std::int64_t d = shared[m.rng() % shared.size()] - m.now;
                if (d >= 0) return d;
            }
            return scaled(62);
        },
        [&] { return m.rng() % 8 == 0 ? scaled(44) : scaled(20); });
}

TEST_CASE("timer_queue: woken at next_wake(), no timer fires early or later than its slack", "[timers][queue][slack]") {
    // The loop's view, simulated: sleep until next_wake(), fire what is due.
    // A timer may be late by the 50 us grid, or by 1/1024 of its delay when
    // that is longer (rounded down to a power of two); never early.
    constexpr std::int64_t grid = 50'000;
    struct node : timer_node {
        std::int64_t deadline = 0;
        std::int64_t allowed = 0;  // lateness allowed
        std::int64_t* now = nullptr;
        long* early = nullptr;
        long* too_late = nullptr;
        long* fired = nullptr;
    };
    for (const bool scaled : {true, false}) {
        timer_queue q;
        q.set_slack(grid, scaled);
        std::mt19937_64 rng(99);
        std::vector<node> nodes(20'000);
        std::int64_t now = 1'000'000'000;
        long early = 0, too_late = 0, fired = 0, wakes = 0;
        auto fire = [](timer_node& n) noexcept {
            auto& me = static_cast<node&>(n);
            ++*me.fired;
            if (*me.now < me.deadline) ++*me.early;
            if (*me.now > me.deadline + me.allowed) ++*me.too_late;
        };
        for (auto& n : nodes) {
            // Delays from 1 ns to 100 s, spread over the scales.
            const std::int64_t delay = static_cast<std::int64_t>(rng() % (std::uint64_t{1} << (rng() % 37))) + 1;
            n.deadline = now + delay;
            const std::int64_t to_grid = (n.deadline + grid - 1) / grid * grid - n.deadline;
            std::int64_t scaled_slack = 0;
            if (scaled && delay / 1024 > grid) scaled_slack = std::int64_t{1} << (63 - __builtin_clzll(static_cast<std::uint64_t>(delay / 1024)));
            n.allowed = std::max(to_grid, scaled_slack);
            n.now = &now;
            n.early = &early;
            n.too_late = &too_late;
            n.fired = &fired;
            n.m_fire = fire;
            q.insert(n, n.deadline, now);
        }
        while (!q.empty() && wakes < 1'000'000) {
            const std::int64_t wake = q.next_wake();
            REQUIRE(wake != timer_queue::no_deadline);
            now = std::max(now, wake);
            q.fire_expired(now);
            ++wakes;
        }
        INFO("scaled slack: " << scaled << "; wake-ups: " << wakes);
        CHECK(fired == static_cast<long>(nodes.size()));
        CHECK(early == 0);
        CHECK(too_late == 0);
        // Long timers share wake-ups: far fewer than one per timer.
        if (scaled) CHECK(wakes < static_cast<long>(nodes.size()) / 4);
        if (!scaled) CHECK(wakes > static_cast<long>(nodes.size()) / 4);
        q.clear();
    }
}

TEST_CASE("timer_queue: a timer armed by a callback with a due deadline waits for the next call", "[timers][queue]") {
    struct fixture {
        timer_queue q;
        struct node : timer_node {
            fixture* f = nullptr;
            char name = '?';
            std::int64_t rearm = -1;  // deadline to arm `other` with, when >= 0
            node* other = nullptr;
        } a, b, c;
        std::string calls;
        static void fire(timer_node& n) noexcept {
            auto& me = static_cast<node&>(n);
            me.f->calls.push_back(me.name);
            if (me.rearm >= 0 && me.other) me.f->q.insert(*me.other, me.rearm);
        }
    } f;
    for (auto* n : {&f.a, &f.b, &f.c}) {
        n->f = &f;
        n->m_fire = &fixture::fire;
    }
    f.a.name = 'A';
    f.b.name = 'B';
    f.c.name = 'C';

    SECTION("re-arming itself at a due deadline does not fire twice in one call") {
        f.a.rearm = 10;
        f.a.other = &f.a;
        f.q.insert(f.a, 10);
        CHECK(f.q.fire_expired(30) == 1);
        CHECK(f.calls == "A");
        CHECK(f.q.size() == 1);
        f.a.rearm = -1;
        CHECK(f.q.fire_expired(30) == 1);
        CHECK(f.calls == "AA");
        CHECK(f.q.empty());
    }
    SECTION("every timer due and armed before the call still fires in it") {
        // A (10) arms C at 15, between A and B (20): C waits, B must not.
        f.a.rearm = 15;
        f.a.other = &f.c;
        f.q.insert(f.a, 10);
        f.q.insert(f.b, 20);
        CHECK(f.q.fire_expired(30) == 2);
        CHECK(f.calls == "AB");
        CHECK(f.q.size() == 1);
        CHECK(f.q.fire_expired(30) == 1);
        CHECK(f.calls == "ABC");
    }
    SECTION("a deadline equal to the one firing waits too, behind the others") {
        f.a.rearm = 10;
        f.a.other = &f.c;
        f.q.insert(f.a, 10);
        f.q.insert(f.b, 10);
        CHECK(f.q.fire_expired(10) == 2);
        CHECK(f.calls == "AB");
        CHECK(f.q.fire_expired(10) == 1);
        CHECK(f.calls == "ABC");
    }
    f.q.clear();
}

TEST_CASE("timer_queue: cancel withdraws a timer and the queue forgets it", "[timers][queue]") {
    timer_queue q;
    struct node : timer_node {
        int calls = 0;
    } a, b;
    auto fire = [](timer_node& n) noexcept { ++static_cast<node&>(n).calls; };
    a.m_fire = fire;
    b.m_fire = fire;
    q.insert(a, 100);
    q.insert(b, 200);
    CHECK(q.next_deadline() == 100);
    q.cancel(a);
    CHECK_FALSE(a.armed());
    CHECK(q.size() == 1);
    q.cancel(a);  // no-op
    CHECK(q.size() == 1);
    CHECK(q.next_deadline() <= 200);  // early is allowed, late is not
    CHECK(q.fire_expired(300) == 1);
    CHECK(a.calls == 0);
    CHECK(b.calls == 1);
    CHECK(q.empty());
    CHECK(q.next_deadline() == timer_queue::no_deadline);

    // Cancelling the last armed timer leaves no deadline behind...
    q.insert(a, 400);
    q.cancel(a);
    CHECK(q.empty());
    CHECK(q.next_deadline() == timer_queue::no_deadline);

    // ...nor does firing the last live one while a cancelled one is still queued:
    // nothing would ever fire to clear it, and a loop would poll without waiting.
    q.insert(a, 500);
    q.insert(b, 600);
    q.cancel(b);
    CHECK(q.fire_expired(550) == 1);
    CHECK(q.empty());
    CHECK(q.next_deadline() == timer_queue::no_deadline);
    CHECK(a.calls == 1);
    CHECK(b.calls == 1);
}

TEST_CASE("timer_queue: a crowd that passed through the slots of level 5 and above leaves no storage there", "[timers][queue]") {
    // A queue that has taken nothing out yet files timers by how far they lie
    // from 0: 10,000 deadlines within 10 us of 2^40 ns (18 minutes) all go
    // to one slot of level 6 first, then move down as they come due. That
    // slot comes round again only after 64^7 ns; it must not keep its room
    // for 10,000 entries, while the lower slots they went through keep theirs.
    timer_queue q;
    constexpr std::int64_t start = std::int64_t{1} << 40;
    constexpr int n = 10'000;
    std::vector<timer_node> nodes(n);
    int fired = 0;
    for (auto& node : nodes) node.m_fire = [](timer_node&) noexcept {};
    for (int i = 0; i < n; ++i) q.insert(nodes[static_cast<std::size_t>(i)], start + i);
    CHECK(q.reserved_entries(5) >= std::size_t{n});  // while they wait up there
    fired = static_cast<int>(q.fire_expired(start + n));
    CHECK(fired == n);
    CHECK(q.empty());
    // What is left at level 5 and above is the wheel's first room, 4 entries a slot.
    CHECK(q.reserved_entries(5) <= std::size_t{6 * 64 * 4});
    CHECK(q.reserved_entries(0) >= std::size_t{n} / 4);  // the lower slots kept theirs
}

/// A timer that, fired, appends its index to a list: the order the queue fired in.
struct recorded_timer : timer_node {
    int index = 0;
    std::vector<int>* order = nullptr;
    void record_into(std::vector<int>& out, int i) {
        index = i;
        order = &out;
        m_fire = [](timer_node& t) noexcept {
            auto& r = static_cast<recorded_timer&>(t);
            r.order->push_back(r.index);
        };
    }
};

TEST_CASE("timer_queue: a crowd armed on an empty wheel is filed by its delay, not from a start long past", "[timers][queue]") {
    // Armed at `now`, an empty wheel starts from now: 10,000 deadlines over
    // the next second after 2^40 ns differ from it only below bit 30, so none
    // goes above level 4, and none has to be moved down from level 6 (which
    // is where they would go, counted from 0). They still fire in order.
    timer_queue q;
    constexpr std::int64_t start = std::int64_t{1} << 40;
    constexpr int n = 10'000;
    std::vector<recorded_timer> nodes(n);
    std::vector<int> order;
    std::mt19937_64 rng(7);
    std::vector<std::int64_t> deadlines(n);
    for (int i = 0; i < n; ++i) {
        recorded_timer& node = nodes[static_cast<std::size_t>(i)];
        node.record_into(order, i);
        deadlines[static_cast<std::size_t>(i)] = start + static_cast<std::int64_t>(rng() % 1'000'000'000);
        q.insert(node, deadlines[static_cast<std::size_t>(i)], start);
    }
    // Level 5 and above keep only the wheel's first room, 4 entries a slot.
    CHECK(q.reserved_entries(5) == std::size_t{6 * 64 * 4});
    CHECK(q.fire_expired(start + 1'000'000'000) == std::size_t{n});
    REQUIRE(order.size() == std::size_t{n});
    for (std::size_t i = 1; i < order.size(); ++i) {
        const auto a = static_cast<std::size_t>(order[i - 1]), b = static_cast<std::size_t>(order[i]);
        REQUIRE((deadlines[a] < deadlines[b] || (deadlines[a] == deadlines[b] && a < b)));
    }
}

TEST_CASE("timer_queue: timers armed after their deadlines passed fire in deadline order", "[timers][queue]") {
    // On an empty wheel (which starts again from `now`) and on one that has
    // taken slots out already: deadlines behind the wheel still order the
    // due run, then insertion among equal ones.
    timer_queue q;
    std::vector<int> order;
    std::vector<recorded_timer> nodes(8);
    for (std::size_t i = 0; i < nodes.size(); ++i) nodes[i].record_into(order, static_cast<int>(i));
    constexpr std::int64_t now = std::int64_t{1} << 40;
    q.insert(nodes[0], now - 10, now);
    q.insert(nodes[1], now - 30, now);
    q.insert(nodes[2], now + 5, now);
    q.insert(nodes[3], now - 20, now);
    q.insert(nodes[4], now - 30, now);
    CHECK(q.next_deadline() == now - 30);
    CHECK(q.fire_expired(now + 5) == 5);
    CHECK(order == std::vector<int>{1, 4, 3, 0, 2});
    // The wheel has taken slots out up to now + 5; these are all behind it.
    order.clear();
    q.insert(nodes[5], now + 1, now + 100);  // not empty any more after this one
    q.insert(nodes[6], now - 1000, now + 100);
    q.insert(nodes[7], now + 3, now + 100);
    CHECK(q.fire_expired(now + 100) == 3);
    CHECK(order == std::vector<int>{6, 5, 7});
}

TEST_CASE("a sleep is cancelled promptly by a stop request from another task", "[timers][cancel]") {
    spindle::loop l;
    std::stop_source source;
    cancel_state s;
    auto sleeper = l.spawn(cancellable_sleep(source.get_token(), s, 10s));
    auto canceller = l.spawn(stop_after(source, 20ms));
    REQUIRE(drain(l, 5s));
    CHECK(s.ec == std::errc::operation_canceled);
    INFO("cancelled after " << to_us(s.elapsed) << " us");
    CHECK(s.elapsed >= 20ms);
    CHECK(s.elapsed < 2s);  // long before its 10 s deadline
    CHECK(s.continued);
    // The withdrawn sleep left no timer to keep the loop alive.
    CHECK((l.timer_count() == 0));
    CHECK_FALSE(l.has_work());
}

// A frame holds a wait for as long as its task waits: a cancellable wait keeps
// one word for its stop_token and, once parked, three for its place among
// the token's waits on its loop, in the same words; a wait that cannot be
// cancelled keeps neither.
namespace size_check {
struct plain_wait : spindle::waiter {
    void on_park() {}
    void on_abandon() noexcept {}
};
struct cancellable_wait : plain_wait {
    void on_cancel() noexcept {}
};
static_assert(sizeof(spindle::parked<plain_wait>) == sizeof(plain_wait));
static_assert(sizeof(spindle::parked<cancellable_wait>) == sizeof(cancellable_wait) + 3 * sizeof(void*));
static_assert(sizeof(spindle::parked<cancellable_wait, false>) == sizeof(cancellable_wait));
}  // namespace size_check

TEST_CASE("sleeps with a token that can stop allocate nothing once warm", "[timers][cancel][alloc]") {
    // Each parks linked to the loop's entry for the token, made by the
    // first: nothing is allocated after it.
    spindle::loop l;
    std::stop_source source;
    struct outcome {
        std::size_t allocations = 0;
        int slept = 0;
    } o;
    l.spawn([](std::stop_token token, outcome& out) -> task<void> {
        for (int i = 0; i < 1000; ++i) {
#if SPINDLE_FRAME_POOL
            if (i == 100) {
                spindle::test::t_allocations = 0;
                spindle::test::t_counting = true;
            }
#endif
            if (co_await spindle::sleep_for(1ns, token)) ++out.slept;
        }
#if SPINDLE_FRAME_POOL
        spindle::test::t_counting = false;
        out.allocations = spindle::test::t_allocations;
#endif
    }(source.get_token(), o)).detach();
    REQUIRE(drain(l));
    CHECK(o.slept == 1000);
    CHECK(o.allocations == 0);
}

TEST_CASE("a stop reaches every wait parked on its token, and only those", "[timers][cancel]") {
    // Many waits share a token (one entry on the loop); another token's waits
    // go on; tokens of their own, thousands of them one after another, each
    // still cancel their wait while idle entries are dropped.
    spindle::loop l;
    std::stop_source a, b;
    struct tally {
        int cancelled = 0;
        int slept = 0;
    } on_a, on_b, own;
    auto sleeper = [](std::stop_token token, std::chrono::nanoseconds d, tally& t) -> task<void> {
        spindle::result<void> r = co_await spindle::sleep_for(d, token);
        ++(r ? t.slept : t.cancelled);
    };
    for (int i = 0; i < 200; ++i) {
        l.spawn(sleeper(a.get_token(), 10s, on_a)).detach();
        l.spawn(sleeper(b.get_token(), 30ms, on_b)).detach();
    }
    l.run_once(0ns);  // all parked
    a.request_stop();
    CHECK(on_a.cancelled == 0);  // cancelled waits resume in a later tick, never inline
    REQUIRE(drain(l));
    CHECK(on_a.cancelled == 200);
    CHECK(on_a.slept == 0);
    CHECK(on_b.slept == 200);
    CHECK(on_b.cancelled == 0);

    std::vector<std::stop_source> sources(3000);
    for (std::size_t i = 0; i < sources.size(); ++i) {
        l.spawn(sleeper(sources[i].get_token(), i % 2 ? 10s : 1ms, own)).detach();
        if (i % 100 == 99) l.run_once(0ns);
    }
    l.run_once(0ns);
    for (std::size_t i = 1; i < sources.size(); i += 2) sources[i].request_stop();
    REQUIRE(drain(l));
    CHECK(own.cancelled == 1500);
    CHECK(own.slept == 1500);
}

TEST_CASE("a loop's stop entries: one per token, idle ones dropped, linked ones kept", "[timers][cancel]") {
    spindle::detail::stop_links links;
    std::stop_source kept;
    spindle::detail::stop_entry& first = links.entry_for(kept.get_token());
    CHECK(&links.entry_for(kept.get_token()) == &first);  // another token of the same source: the same entry
    spindle::detail::stop_link link;                      // a wait parked on it, never stopped here
    spindle::detail::link_stop(first, link);
    std::vector<std::stop_source> others(1000);
    std::size_t most = 0;
    for (auto& s : others) {
        (void)links.entry_for(s.get_token());
        most = std::max(most, links.size());
    }
    CHECK(most <= 65);                                    // idle entries go once 64 pile up
    CHECK(&links.entry_for(kept.get_token()) == &first);  // the linked one stayed
    link.unlink();
}

TEST_CASE("a sleep whose token was stopped before the await returns at once", "[timers][cancel]") {
    spindle::loop l;
    std::stop_source source;
    source.request_stop();
    cancel_state s;
    auto sleeper = l.spawn(cancellable_sleep(source.get_token(), s, 10s));
    l.run_once(0ns);  // first turn: the sleep completes without parking
    CHECK(s.ec == std::errc::operation_canceled);
    CHECK((l.timer_count() == 0));
    l.run_once(0ns);  // the yield after it
    CHECK(sleeper.done());
    CHECK(s.continued);
}

TEST_CASE("a sleep that completes normally reports no error", "[timers][cancel]") {
    spindle::loop l;
    std::stop_source source;  // never stopped
    cancel_state s;
    auto sleeper = l.spawn(cancellable_sleep(source.get_token(), s, 5ms));
    REQUIRE(drain(l, 5s));
    CHECK_FALSE(s.ec);
    CHECK(s.elapsed >= 5ms);
    // A stop after the sleep ended touches nothing.
    source.request_stop();
    CHECK(s.continued);
}

TEST_CASE("a withdrawn sleep does not make a loop waiting for I/O spin", "[timers][cancel]") {
    int fds[2];
    REQUIRE(::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
    double cpu = 0;
    {
        spindle::loop l;
        std::stop_source source;
        cancel_state s;
        bool read_done = false;
        auto sleeper = l.spawn(cancellable_sleep(source.get_token(), s, 2ms));
        auto reader = l.spawn(read_one(fds[0], read_done));
        l.run_once(0ns);  // both park
        source.request_stop();
        std::thread writer([w = fds[1]] {
            std::this_thread::sleep_for(150ms);
            char c = 'x';
            [[maybe_unused]] auto n = ::write(w, &c, 1);
        });
        const double cpu0 = cpu_ms();
        const bool finished = drain(l, 5s);
        cpu = cpu_ms() - cpu0;
        writer.join();
        CHECK(finished);
        CHECK(read_done);
        CHECK(s.ec == std::errc::operation_canceled);
    }
    ::close(fds[0]);
    ::close(fds[1]);
    INFO("CPU while waiting 150 ms for the pipe: " << cpu << " ms");
    CHECK(cpu < 30.0);  // a spinning loop burns about 150 ms
}

TEST_CASE("timer::stop inside its own callback: a repeating timer never fires again", "[timers][cancel]") {
    spindle::loop l;
    spindle::timer t(l);
    self_stopping s{&t};
    t.start_repeating(2ms, &stop_self, &s);
    REQUIRE(drain(l, 5s));  // returns only once no timer is armed
    CHECK(s.calls == 1);
    CHECK_FALSE(t.active());
}

TEST_CASE("timer::stop inside another timer's callback in the same phase: it never fires", "[timers][cancel]") {
    spindle::loop l;
    spindle::timer a(l), b(l);
    pair_state s;
    s.victim = &b;
    // Both due at once; A was armed first, so fires first, in the same phase as B.
    a.start(0ms, &first_stops_second, &s);
    b.start(0ms, &second_records, &s);
    std::this_thread::sleep_for(1ms);
    l.run_once(0ns);
    REQUIRE(s.calls.size() == 1);
    CHECK(s.calls[0] == 'A');
    CHECK_FALSE(b.active());
    REQUIRE(drain(l, 1s));
    CHECK(s.calls.size() == 1);
}

TEST_CASE("interval ticks at start + k*period without drift", "[timers][rate]") {
    spindle::loop l;
    rate_log r;
    r.start = steady::now();
    // 3 ms of work after each tick: a clock re-armed from "now" would drift by it.
    auto h = l.spawn(run_interval(r, 20, -1, 0ms, 3ms));
    REQUIRE(drain(l, 5s));
    REQUIRE_FALSE(r.error);
    REQUIRE(r.times.size() == 20);
    const auto period = 10ms;
    std::uint64_t k = 1;  // grid index of the tick at hand
    for (std::size_t i = 0; i < r.times.size(); ++i) {
        INFO("tick " << i << " at " << to_us(r.times[i] - r.start) << " us, grid point " << k);
        CHECK(r.times[i] >= r.start + period * static_cast<long>(k));  // never early
        k += r.periods[i];
    }
    const std::uint64_t last_k = k - r.periods.back();
    INFO("last tick at " << to_us(r.times.back() - r.start) << " us, grid point " << last_k);
    CHECK(r.times.back() < r.start + period * static_cast<long>(last_k) + 15ms);
    // Normally nothing is skipped and the 20th tick is the 200 ms point.
    CHECK(r.times.back() < r.start + 200ms + 15ms);
}

TEST_CASE("interval skips the ticks missed while the loop was blocked, then is back on the grid", "[timers][rate]") {
    spindle::loop l;
    rate_log r;
    r.start = steady::now();
    auto h = l.spawn(run_interval(r, 5, 0, 35ms, 0ms));
    REQUIRE(drain(l, 5s));
    REQUIRE_FALSE(r.error);
    REQUIRE(r.times.size() == 5);
    // Blocked 35 ms after the first tick: the next one stands for 3+ periods.
    CHECK(r.periods[1] >= 3);
    const auto period = 10ms;
    std::uint64_t k = 1 + r.periods[0] + r.periods[1];
    for (std::size_t i = 2; i < r.times.size(); ++i) {
        INFO("tick " << i << " at " << to_us(r.times[i] - r.start) << " us, grid point " << k);
        CHECK(r.times[i] >= r.start + period * static_cast<long>(k));
        CHECK(r.times[i] < r.start + period * static_cast<long>(k) + 15ms);
        k += r.periods[i];
    }
}

TEST_CASE("a repeating timer keeps its grid without drift", "[timers][rate]") {
    spindle::loop l;
    spindle::timer t(l);
    repeat_log r;
    r.t = &t;
    r.limit = 20;
    const auto start = steady::now();
    t.start_repeating(10ms, &on_repeat, &r);
    r.first_deadline = t.deadline();
    CHECK(r.first_deadline >= start + 10ms);
    REQUIRE(drain(l, 5s));
    REQUIRE(r.times.size() == 20);
    CHECK(r.off_grid == 0);
    for (std::size_t i = 0; i < r.times.size(); ++i) {
        INFO("call " << i << " at " << to_us(r.times[i] - r.first_deadline) << " us after the first deadline");
        CHECK(r.times[i] >= r.due[i]);  // never early
    }
    CHECK(r.times.back() < r.due.back() + 15ms);
    CHECK(r.times.back() < r.first_deadline + 190ms + 15ms);
}

TEST_CASE("a repeating timer skips and counts the ticks missed while the loop was blocked", "[timers][rate]") {
    spindle::loop l;
    spindle::timer t(l);
    repeat_log r;
    r.t = &t;
    r.limit = 5;
    r.block_at = 1;
    r.block = 35ms;
    t.start_repeating(10ms, &on_repeat, &r);
    r.first_deadline = t.deadline();
    REQUIRE(drain(l, 5s));
    REQUIRE(r.times.size() == 5);
    CHECK(r.off_grid == 0);
    CHECK(r.missed[0] == 0);
    // Blocked 35 ms in the first call: the second call comes late, after the
    // deadlines at +20 and +30 ms passed unreplayed.
    CHECK(r.missed[1] >= 2);
    // No burst: each call is one on the grid, the later ones on time.
    for (std::size_t i = 2; i < r.times.size(); ++i) {
        INFO("call " << i);
        CHECK(r.times[i] >= r.due[i]);
        CHECK(r.times[i] < r.due[i] + 15ms);
        CHECK(r.due[i] > r.due[i - 1]);
    }
}

TEST_CASE("sleep_for(nanoseconds::max()) and sleep_for(hours::max()) last until cancelled", "[timers][cancel]") {
    spindle::loop l;
    std::stop_source source;
    far_sleep ns, hours;
    bool woke_before_stop = true;
    auto a = l.spawn(sleep_far(std::chrono::nanoseconds::max(), source.get_token(), ns));
    auto b = l.spawn(sleep_far(std::chrono::hours::max(), source.get_token(), hours));
    auto c = l.spawn(stop_far_sleeps(source, 50ms, ns, hours, woke_before_stop));
    REQUIRE(drain(l, 5s));
    CHECK_FALSE(woke_before_stop);
    int index = 0;
    for (const far_sleep* s : {&ns, &hours}) {
        INFO((index++ == 0 ? "nanoseconds::max()" : "hours::max()") << ", returned after " << to_us(s->elapsed) << " us");
        CHECK(s->woke);
        CHECK(s->ec == std::errc::operation_canceled);
        CHECK(s->elapsed >= 50ms);
    }
    CHECK((l.timer_count() == 0));
    CHECK_FALSE(l.has_work());
}

// =====================================================================================
// Periods and deadlines a user passes saturate instead of overflowing, a
// timer callback that throws is logged and the loop goes on, and time reported
// to a host is the loop's own clock.

namespace {

void count_call(void* p) { ++*static_cast<int*>(p); }
void throw_from_callback(void*) { throw std::runtime_error("timer callback boom"); }

task<std::error_code> second_tick_of_endless_interval() {
    spindle::interval iv(steady::duration::max());
    if (auto first = co_await iv.tick(); !first) co_return first.error();  // at once
    auto second = co_await spindle::with_timeout(20ms, iv.tick());
    co_return second ? std::error_code{} : second.error();
}

task<void> sleep_an_hour_then_a_little(bool& in_second_sleep) {
    (void)co_await spindle::sleep_for(1h);
    in_second_sleep = true;
    (void)co_await spindle::sleep_for(10ms);
}

}  // namespace

TEST_CASE("timer: a period of duration::max() never fires instead of firing on every tick", "[timers][overflow]") {
    spindle::loop l;
    int calls = 0;
    spindle::timer t(l);
    t.start_repeating(steady::duration::max(), &count_call, &calls);
    CHECK(t.active());
    CHECK(t.deadline() == steady::time_point::max());
    for (int i = 0; i < 5; ++i) l.run_once(1ms);
    CHECK(calls == 0);
    t.start(steady::duration::max(), &count_call, &calls);
    CHECK(t.deadline() == steady::time_point::max());
    t.start(-5s, &count_call, &calls);  // in the past: the next timer phase
    for (int i = 0; i < 3 && calls == 0; ++i) l.run_once(1ms);
    CHECK(calls == 1);
    CHECK_THROWS_AS(t.start_repeating(-1s, &count_call, &calls), std::invalid_argument);
}

TEST_CASE("interval: a period of duration::max() gives its first tick, then none", "[timers][overflow]") {
    spindle::loop l;
    std::error_code second = spindle::test::run(l, second_tick_of_endless_interval());
    CHECK(second == std::errc::timed_out);
}

TEST_CASE("timer: a callback that throws is logged and the loop goes on", "[timers]") {
    spindle::test::log_capture log;
    spindle::loop l;
    int calls = 0;
    spindle::timer bad(l);
    spindle::timer good(l);
    bad.start_repeating(1ms, &throw_from_callback, nullptr);
    good.start(3ms, &count_call, &calls);
    const auto give_up = steady::now() + 5s;
    while (calls == 0 && steady::now() < give_up) l.run_once(1ms);
    CHECK(calls == 1);
    CHECK(bad.active());  // a repeating timer stays armed after its callback threw
    CHECK(log.contains("timer callback boom"));
}

TEST_CASE("virtual time: time_to_next_deadline() reads the loop's clock between ticks", "[timers][virtual_time]") {
    spindle::loop_options o;
    o.virtual_time = true;
    spindle::loop l(o);
    bool in_second_sleep = false;
    auto h = l.spawn(sleep_an_hour_then_a_little(in_second_sleep));
    const auto give_up = steady::now() + 5s;
    l.run_once(0ns);  // the task starts and parks for an hour
    REQUIRE(l.timer_count() == 1);
    // No limit on the wait: the virtual clock jumps to the hour's end, where the timer fires.
    while (l.timer_count() == 1 && steady::now() < give_up) l.run_once(-1ns);
    // A tick that may not wait: the task resumes and parks in its 10 ms sleep;
    // the clock stays where it is.
    l.run_once(0ns);
    REQUIRE(in_second_sleep);
    std::optional<std::chrono::nanoseconds> next = l.time_to_next_deadline();
    REQUIRE(next.has_value());
    CHECK(*next <= 10ms);
    CHECK(*next > 0ns);
    while (!h.done() && steady::now() < give_up) l.run_once(-1ns);
    CHECK(h.done());
}

// =====================================================================================
// Every duration and deadline a user passes saturates, whatever its type: the
// far end means never, the near end (and anything negative) now. Run under
// UBSan in CI, where an overflow on the way is an error.

namespace {

using far_double = std::chrono::duration<double>;
using picoseconds = std::chrono::duration<std::int64_t, std::pico>;

struct extremes_state {
    // Far: still waiting when the test ends them (cancelled or never due).
    std::error_code far_sleep_hours, far_sleep_infinity, far_sleep_until, far_timeout, far_deadline;
    // Near: over at once.
    std::error_code near_sleep_hours, near_sleep_min, near_sleep_negative_infinity, near_sleep_nan, near_sleep_until;
    std::error_code near_timeout, near_deadline, near_interval_first;
    int near_done = 0;
};

template <class Rep, class Period>
task<void> sleep_into(std::chrono::duration<Rep, Period> d, std::stop_token token, std::error_code& out, int* done = nullptr) {
    out = error_of(co_await spindle::sleep_for(d, std::move(token)));
    if (done) ++*done;
}

task<void> sleep_until_into(steady::time_point t, std::stop_token token, std::error_code& out, int* done = nullptr) {
    out = error_of(co_await spindle::sleep_until(t, std::move(token)));
    if (done) ++*done;
}

template <class Rep, class Period>
task<void> timeout_into(std::chrono::duration<Rep, Period> d, spindle::event& ev, std::error_code& out, int* done = nullptr) {
    out = error_of(co_await spindle::with_timeout(d, ev.wait()));
    if (done) ++*done;
}

task<void> deadline_into(steady::time_point t, spindle::event& ev, std::error_code& out, int* done = nullptr) {
    out = error_of(co_await spindle::with_deadline(t, ev.wait()));
    if (done) ++*done;
}

task<void> first_tick_into(std::error_code& out, int& done) {
    spindle::interval iv(1h, steady::time_point::min());
    auto r = co_await iv.tick();
    out = r ? std::error_code{} : r.error();
    ++done;
}

}  // namespace

TEST_CASE("saturating_ns: every duration type converts without overflow", "[timers][overflow]") {
    using spindle::detail::saturating_ns;
    constexpr auto max = std::numeric_limits<std::int64_t>::max();
    constexpr auto min = std::numeric_limits<std::int64_t>::min();
    CHECK(saturating_ns(std::chrono::nanoseconds::max()) == max);
    CHECK(saturating_ns(std::chrono::nanoseconds::min()) == min);
    CHECK(saturating_ns(std::chrono::hours::max()) == max);
    CHECK(saturating_ns(std::chrono::hours::min()) == min);
    CHECK(saturating_ns(std::chrono::hours(-1)) == -3'600'000'000'000);
    CHECK(saturating_ns(picoseconds::max()) == picoseconds::max().count() / 1000);
    CHECK(saturating_ns(far_double::max()) == max);
    CHECK(saturating_ns(far_double(std::numeric_limits<double>::infinity())) == max);
    CHECK(saturating_ns(far_double(-std::numeric_limits<double>::infinity())) == min);
    CHECK(saturating_ns(far_double(std::numeric_limits<double>::quiet_NaN())) == 0);
    CHECK(saturating_ns(far_double(1.5)) == 1'500'000'000);
    CHECK(saturating_ns(std::chrono::seconds(1)) == 1'000'000'000);
}

TEST_CASE("sleeps, timeouts, deadlines, timers, intervals and run_once saturate at both ends", "[timers][overflow]") {
    spindle::loop l;
    extremes_state s;
    std::stop_source stop_far;
    spindle::event never;  // nobody sets it: a wait that ends only by time
    std::vector<spindle::join_handle<void>> tasks;
    constexpr double inf = std::numeric_limits<double>::infinity();

    tasks.push_back(l.spawn(sleep_into(std::chrono::hours::max(), stop_far.get_token(), s.far_sleep_hours)));
    tasks.push_back(l.spawn(sleep_into(far_double(inf), stop_far.get_token(), s.far_sleep_infinity)));
    tasks.push_back(l.spawn(sleep_until_into(steady::time_point::max(), stop_far.get_token(), s.far_sleep_until)));
    tasks.push_back(l.spawn(timeout_into(std::chrono::hours::max(), never, s.far_timeout)));
    tasks.push_back(l.spawn(deadline_into(steady::time_point::max(), never, s.far_deadline)));

    int* done = &s.near_done;
    tasks.push_back(l.spawn(sleep_into(std::chrono::hours::min(), {}, s.near_sleep_hours, done)));
    tasks.push_back(l.spawn(sleep_into(std::chrono::nanoseconds::min(), {}, s.near_sleep_min, done)));
    tasks.push_back(l.spawn(sleep_into(far_double(-inf), {}, s.near_sleep_negative_infinity, done)));
    tasks.push_back(l.spawn(sleep_into(far_double(std::numeric_limits<double>::quiet_NaN()), {}, s.near_sleep_nan, done)));
    tasks.push_back(l.spawn(sleep_until_into(steady::time_point::min(), {}, s.near_sleep_until, done)));
    tasks.push_back(l.spawn(timeout_into(std::chrono::hours::min(), never, s.near_timeout, done)));
    tasks.push_back(l.spawn(deadline_into(steady::time_point::min(), never, s.near_deadline, done)));
    tasks.push_back(l.spawn(first_tick_into(s.near_interval_first, *done)));
    constexpr int near_count = 8;

    int timer_calls = 0;
    spindle::timer far_timer(l);
    far_timer.start(std::chrono::hours::max(), &count_call, &timer_calls);
    CHECK(far_timer.deadline() == steady::time_point::max());
    spindle::timer far_repeating(l);
    far_repeating.start_repeating(std::chrono::hours::max(), &count_call, &timer_calls);
    CHECK(far_repeating.deadline() == steady::time_point::max());
    spindle::timer near_timer(l);
    near_timer.start(std::chrono::hours::min(), &count_call, &timer_calls);
    CHECK_THROWS_AS(near_timer.start_repeating(std::chrono::hours::min(), &count_call, &timer_calls), std::invalid_argument);
    near_timer.start(std::chrono::hours::min(), &count_call, &timer_calls);
    CHECK_THROWS_AS(spindle::interval(std::chrono::hours::min()), std::invalid_argument);

    // run_once's own limit at both ends, each time with something due, so
    // neither waits: first the near waits themselves, then the near timer.
    const auto t0 = steady::now();
    l.run_once(std::chrono::nanoseconds::min());  // negative: no limit
    near_timer.start(std::chrono::hours::min(), &count_call, &timer_calls);
    l.run_once(std::chrono::nanoseconds::max());
    for (int i = 0; i < 10 && s.near_done < near_count; ++i) l.run_once(100ms);
    CHECK(steady::now() - t0 < 5s);
    CHECK(s.near_done == near_count);
    CHECK(timer_calls == 2);  // the near timer, twice; neither far one
    CHECK_FALSE(s.near_sleep_hours);
    CHECK_FALSE(s.near_sleep_min);
    CHECK_FALSE(s.near_sleep_negative_infinity);
    CHECK_FALSE(s.near_sleep_nan);
    CHECK_FALSE(s.near_sleep_until);
    CHECK(s.near_timeout == std::errc::timed_out);
    CHECK(s.near_deadline == std::errc::timed_out);
    CHECK_FALSE(s.near_interval_first);

    // The far group is still waiting; its deadlines are all "never".
    for (int i = 0; i < 5; ++i) l.run_once(2ms);
    CHECK(l.time_to_next_deadline() == std::nullopt);
    CHECK(timer_calls == 2);
    stop_far.request_stop();
    never.set();
    for (int i = 0; i < 10 && !std::all_of(tasks.begin(), tasks.end(), [](const auto& h) { return h.done(); }); ++i)
        l.run_once(1ms);
    CHECK(std::all_of(tasks.begin(), tasks.end(), [](const auto& h) { return h.done(); }));
    CHECK(s.far_sleep_hours == std::errc::operation_canceled);
    CHECK(s.far_sleep_infinity == std::errc::operation_canceled);
    CHECK(s.far_sleep_until == std::errc::operation_canceled);
    CHECK_FALSE(s.far_timeout);  // the event came first, after all
    CHECK_FALSE(s.far_deadline);
}
