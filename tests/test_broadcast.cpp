// broadcast_sender / broadcast_receiver: every receiver reads every value at
// its own pace; values are stored once and copied only when read (moved to
// the last reader); lag is reported with the number of values lost; close,
// cancellation, receivers and tasks destroyed at every point, the budget on
// ready receives, and a randomized run checked against a model, with every
// value's constructions and destructions counted.
#include "support.hpp"

#include <spindle/broadcast.hpp>
#include <spindle/budget.hpp>
#include <spindle/errc.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using spindle::broadcast_receiver;
using spindle::broadcast_result;
using spindle::broadcast_sender;
using spindle::loop;
using spindle::task;
using spindle::with_timeout;
using spindle::test::run;
using spindle::test::run_until;
using spindle::test::settle;

namespace {

const std::error_code closed = make_error_code(spindle::errc::channel_closed);
const std::error_code lagged = make_error_code(spindle::errc::receiver_lagged);
const std::error_code canceled = std::make_error_code(std::errc::operation_canceled);
const std::error_code timed_out = std::make_error_code(std::errc::timed_out);
const std::error_code would_block = std::make_error_code(std::errc::operation_would_block);

/// Counts every construction, copy, move and destruction, to prove where a
/// value is copied and that every one is destroyed.
struct tracked {
    static inline int alive = 0;
    static inline int copies = 0;
    static inline int moves = 0;
    int v = 0;
    explicit tracked(int x) noexcept : v(x) { ++alive; }
    tracked(const tracked& o) noexcept : v(o.v) {
        ++alive;
        ++copies;
    }
    tracked(tracked&& o) noexcept : v(std::exchange(o.v, -1)) {
        ++alive;
        ++moves;
    }
    tracked& operator=(const tracked&) = delete;
    tracked& operator=(tracked&&) = delete;
    ~tracked() { --alive; }

    static void reset() {
        alive = 0;
        copies = 0;
        moves = 0;
    }
};

/// What a receiving task saw, in order: values, and the lags as negative counts.
struct journal {
    std::vector<long> seen;
    std::error_code end;
    bool done = false;
};

task<void> receive_all(broadcast_receiver<int>& rx, journal& j, std::stop_token token = {}) {
    for (;;) {
        broadcast_result<int> r = co_await rx.receive(token);
        if (r) {
            j.seen.push_back(*r);
        } else if (r.error() == spindle::errc::receiver_lagged) {
            j.seen.push_back(-static_cast<long>(r.missed()));
        } else {
            j.end = r.error();
            break;
        }
    }
    j.done = true;
}

task<void> receive_one(broadcast_receiver<int>& rx, journal& j, std::stop_token token = {}) {
    broadcast_result<int> r = co_await rx.receive(std::move(token));
    if (r)
        j.seen.push_back(*r);
    else if (r.error() == spindle::errc::receiver_lagged)
        j.seen.push_back(-static_cast<long>(r.missed()));
    j.end = r.error();
    j.done = true;
}

std::vector<long> upto(long from, long to) {
    std::vector<long> v;
    for (long i = from; i < to; ++i) v.push_back(i);
    return v;
}

}  // namespace

// --- without a loop: try_receive --------------------------------------------------

TEST_CASE("broadcast: capacity, a capacity of 0 is a logic_error, the errors' texts", "[broadcast]") {
    CHECK_THROWS_AS(broadcast_sender<int>(0), std::invalid_argument);
    broadcast_sender<int> tx(5);
    CHECK(tx.capacity() == 5);
    CHECK(tx.receiver_count() == 0);
    CHECK_FALSE(tx.is_closed());
    CHECK(lagged.message() == "receiver lagged: values were overwritten before it read them");
    CHECK(lagged == spindle::errc::receiver_lagged);
    CHECK(std::string(lagged.category().name()) == "spindle");

    broadcast_receiver<int> empty;
    CHECK(empty.is_closed());
    CHECK(empty.try_receive().error() == closed);
}

TEST_CASE("broadcast: every receiver reads every value in order; stored once, copied for each reader but the last, which gets it moved",
          "[broadcast]") {
    tracked::reset();
    {
        broadcast_sender<tracked> tx(8);
        auto a = tx.subscribe();
        auto b = tx.subscribe();
        auto c = a.subscribe();  // a receiver's subscribe: the same broadcast, from now on
        CHECK(tx.receiver_count() == 3);
        for (int i = 0; i < 5; ++i) {
            auto n = tx.send(tracked(i));
            REQUIRE(n);
            CHECK(*n == 3);
        }
        CHECK(tracked::alive == 5);  // each value once, whatever the number of receivers
        CHECK(tracked::copies == 0);
        CHECK(a.size() == 5);
        for (broadcast_receiver<tracked>* rx : {&a, &b, &c}) {
            for (int i = 0; i < 5; ++i) {
                auto r = rx->try_receive();
                REQUIRE(r);
                CHECK(r->v == i);
            }
            CHECK(rx->try_receive().error() == would_block);
            CHECK(rx->size() == 0);
        }
        // a and b got copies, c (the last) the values themselves; the slots
        // are empty now.
        CHECK(tracked::copies == 10);
        CHECK(tracked::alive == 0);

        const tracked lvalue(9);
        auto n = tx.send(lvalue);  // copied in once
        REQUIRE(n);
        CHECK(tracked::copies == 11);
        CHECK(tracked::alive == 2);
    }
    CHECK(tracked::alive == 0);  // the value still held went with the broadcast
}

TEST_CASE("broadcast: nobody subscribed: nothing stored, the value untouched; subscribers start at the end", "[broadcast]") {
    broadcast_sender<std::string> tx(4);
    std::string s = "kept";
    auto n = tx.send(std::move(s));
    REQUIRE(n);
    CHECK(*n == 0);
    CHECK(s == "kept");  // not moved from

    auto first = tx.subscribe();
    REQUIRE(tx.send(std::string("a")));
    REQUIRE(tx.send(std::string("b")));
    auto second = tx.subscribe();
    CHECK(second.size() == 0);
    CHECK(second.try_receive().error() == would_block);
    REQUIRE(tx.send(std::string("c")));
    CHECK(*first.try_receive() == "a");
    CHECK(*first.try_receive() == "b");
    CHECK(*first.try_receive() == "c");
    CHECK(*second.try_receive() == "c");
}

TEST_CASE("broadcast: a receiver that fell behind by more than the capacity hears how many it missed, then reads the oldest held",
          "[broadcast][lag]") {
    for (const std::size_t capacity : {1u, 3u, 4u, 5u}) {
        INFO("capacity " << capacity);
        tracked::reset();
        {
            broadcast_sender<tracked> tx(capacity);
            auto slow = tx.subscribe();
            auto fast = tx.subscribe();
            for (int i = 0; i < 10; ++i) {
                REQUIRE(tx.send(tracked(i)));
                auto r = fast.try_receive();  // keeps up: never lags
                REQUIRE(r);
                CHECK(r->v == i);
            }
            // Overwritten values were destroyed when overwritten: the ring
            // holds the last `capacity`, each once.
            CHECK(tracked::alive == static_cast<int>(capacity));
            CHECK(slow.size() == capacity);
            auto gap = slow.try_receive();
            REQUIRE_FALSE(gap);
            CHECK(gap.error() == lagged);
            CHECK(gap.missed() == 10 - capacity);
            for (int i = 10 - static_cast<int>(capacity); i < 10; ++i) {
                auto r = slow.try_receive();
                REQUIRE(r);
                CHECK(r->v == i);
            }
            CHECK(slow.try_receive().error() == would_block);
            CHECK(tracked::alive == 0);
        }
        CHECK(tracked::alive == 0);
    }
}

TEST_CASE("broadcast: close lets receivers read what they still see, then channel_closed; the last sender's end closes too",
          "[broadcast][close]") {
    SECTION("close()") {
        broadcast_sender<int> tx(4);
        auto rx = tx.subscribe();
        REQUIRE(tx.send(1));
        REQUIRE(tx.send(2));
        tx.close();
        tx.close();  // idempotent
        CHECK(tx.is_closed());
        int three = 3;
        CHECK(tx.send(three).error() == closed);
        CHECK_FALSE(rx.is_closed());
        CHECK(*rx.try_receive() == 1);
        CHECK(*rx.try_receive() == 2);
        CHECK(rx.is_closed());
        CHECK(rx.try_receive().error() == closed);
        CHECK(rx.subscribe().try_receive().error() == closed);
    }
    SECTION("the last sender destroyed; copies and moves of senders count as senders") {
        std::optional<broadcast_sender<int>> tx1(std::in_place, 4);
        auto rx = tx1->subscribe();
        std::optional<broadcast_sender<int>> tx2(*tx1);
        broadcast_sender<int> tx3(std::move(*tx2));
        REQUIRE(tx3.send(7));
        tx1.reset();
        tx2.reset();  // moved from: nothing
        CHECK_FALSE(rx.is_closed());
        REQUIRE(tx3.send(8));
        { broadcast_sender<int> gone(std::move(tx3)); }
        CHECK(*rx.try_receive() == 7);
        CHECK(*rx.try_receive() == 8);
        CHECK(rx.try_receive().error() == closed);
    }
    SECTION("a receiver outlives every sender and keeps what it had not read") {
        tracked::reset();
        std::optional<broadcast_receiver<tracked>> rx;
        {
            broadcast_sender<tracked> tx(4);
            rx.emplace(tx.subscribe());
            REQUIRE(tx.send(tracked(1)));
        }
        CHECK(tracked::alive == 1);
        auto r = rx->try_receive();
        REQUIRE(r);
        CHECK(r->v == 1);
        CHECK(rx->try_receive().error() == closed);
        rx.reset();
    }
}

TEST_CASE("broadcast: a receiver destroyed while the broadcast lives on gives up its claim on the values it had not read",
          "[broadcast][lifetime]") {
    tracked::reset();
    broadcast_sender<tracked> tx(8);
    auto keeper = tx.subscribe();
    std::optional<broadcast_receiver<tracked>> leaver(tx.subscribe());
    for (int i = 0; i < 3; ++i) REQUIRE(tx.send(tracked(i)));
    CHECK(tracked::alive == 3);
    // keeper reads one (a copy: leaver still has to read it).
    {
        auto r = keeper.try_receive();
        REQUIRE(r);
    }
    CHECK(tracked::copies == 1);
    leaver.reset();
    CHECK(tx.receiver_count() == 1);
    CHECK(tracked::alive == 2);  // value 0 was left for leaver alone: destroyed with its claim
    // keeper is now the last reader of 1 and 2: moved, not copied.
    for (int i = 1; i < 3; ++i) {
        auto r = keeper.try_receive();
        REQUIRE(r);
        CHECK(r->v == i);
    }
    CHECK(tracked::copies == 1);
    CHECK(tracked::alive == 0);

    // The other way round: the reader that leaves had read everything.
    std::optional<broadcast_receiver<tracked>> reader(tx.subscribe());
    REQUIRE(tx.send(tracked(5)));
    (void)reader->try_receive();
    reader.reset();
    CHECK(tracked::alive == 1);  // still keeper's
    CHECK(keeper.try_receive()->v == 5);
    CHECK(tracked::alive == 0);
}

// --- receiving tasks --------------------------------------------------------------

TEST_CASE("broadcast: waiting receivers wake on each send and each read every value, in order", "[broadcast]") {
    loop l;
    broadcast_sender<int> tx(16);
    std::vector<broadcast_receiver<int>> rxs;
    for (int i = 0; i < 3; ++i) rxs.push_back(tx.subscribe());
    journal js[3];
    std::vector<spindle::join_handle<void>> hs;
    for (int i = 0; i < 3; ++i) hs.push_back(l.spawn(receive_all(rxs[static_cast<std::size_t>(i)], js[i]), "listener"));
    settle(l);
    std::vector<std::string> parked;
    for (const auto& t : l.tasks())
        if (t.state == spindle::task_info::state_kind::parked) parked.push_back(t.waiting_on);
    CHECK(parked == std::vector<std::string>(3, "broadcast receive (nothing new)"));
    auto producer = [](broadcast_sender<int> tx) -> task<void> {
        for (int i = 0; i < 100; ++i) {
            REQUIRE(tx.send(i));
            if (i % 7 == 0) co_await spindle::yield();
        }
    };  // the producer's sender is the last: the broadcast closes when it ends
    auto p = l.spawn(producer(std::move(tx)));
    REQUIRE(run_until(l, [&] { return js[0].done && js[1].done && js[2].done; }));
    for (auto& j : js) {
        CHECK(j.seen == upto(0, 100));
        CHECK(j.end == closed);
    }
}

TEST_CASE("broadcast: a receive reads when its task resumes: woken, then lapped before it ran, it reports the lag",
          "[broadcast][lag]") {
    loop l;
    broadcast_sender<int> tx(2);
    auto rx = tx.subscribe();
    journal j;
    auto h = l.spawn(receive_all(rx, j));
    settle(l);
    for (int i = 0; i < 5; ++i) REQUIRE(tx.send(i));  // wakes it, then overwrites 0, 1, 2
    tx.close();
    REQUIRE(run_until(l, [&] { return j.done; }));
    CHECK(j.seen == std::vector<long>{-3, 3, 4});
    CHECK(j.end == closed);
}

TEST_CASE("broadcast: a parked receive cancelled by stop_token, with_timeout or join_handle::cancel; nothing is skipped",
          "[broadcast][cancel]") {
    loop l;
    broadcast_sender<int> tx(4);
    auto rx = tx.subscribe();
    SECTION("stop_token") {
        std::stop_source src;
        journal j;
        auto h = l.spawn(receive_one(rx, j, src.get_token()));
        settle(l);
        CHECK_FALSE(j.done);
        src.request_stop();
        settle(l);
        REQUIRE(j.done);
        CHECK(j.end == canceled);
        // A token stopped before: cancelled at once, even with a value there.
        REQUIRE(tx.send(1));
        journal pre;
        auto h2 = l.spawn(receive_one(rx, pre, src.get_token()));
        settle(l);
        CHECK(pre.end == canceled);
    }
    SECTION("with_timeout") {
        auto body = [](broadcast_receiver<int>& rx) -> task<std::error_code> {
            auto r = co_await with_timeout(10ms, rx.receive());
            co_return r.error();
        };
        CHECK(run(l, body(rx)) == timed_out);
        REQUIRE(tx.send(1));
    }
    SECTION("join_handle::cancel") {
        journal j;
        auto h = l.spawn(receive_one(rx, j));
        settle(l);
        h.cancel();
        settle(l);
        CHECK(j.end == canceled);
        REQUIRE(tx.send(1));
    }
    // The cancelled receive took nothing: the receiver goes on with 1.
    auto r = rx.try_receive();
    REQUIRE(r);
    CHECK(*r == 1);
}

TEST_CASE("broadcast: a task destroyed while its receive waits withdraws it; a receiver destroyed under a waiting task ends the wait",
          "[broadcast][lifetime]") {
    loop l;
    broadcast_sender<int> tx(4);
    SECTION("the task aborted") {
        auto rx = tx.subscribe();
        journal j;
        auto h = l.spawn(receive_one(rx, j));
        settle(l);
        h.abort();
        REQUIRE(tx.send(1));  // wakes nobody: nothing of the task is left (ASan)
        settle(l);
        CHECK_FALSE(j.done);
        CHECK(*rx.try_receive() == 1);  // and the receiver is free for the next receive
    }
    SECTION("the task aborted after the send woke it, before it ran") {
        auto rx = tx.subscribe();
        journal j;
        auto h = l.spawn(receive_one(rx, j));
        settle(l);
        REQUIRE(tx.send(2));
        h.abort();
        CHECK_FALSE(j.done);
        CHECK(*rx.try_receive() == 2);  // the value was not taken
    }
    SECTION("the receiver destroyed") {
        auto rx = std::make_unique<broadcast_receiver<int>>(tx.subscribe());
        journal j;
        auto h = l.spawn(receive_one(*rx, j));
        settle(l);
        rx.reset();
        CHECK(tx.receiver_count() == 0);
        settle(l);
        REQUIRE(j.done);
        CHECK(j.end == closed);
    }
    SECTION("the receiver moved while a task waits: the wait follows it") {
        auto rx = tx.subscribe();
        journal j;
        auto h = l.spawn(receive_one(rx, j));
        settle(l);
        broadcast_receiver<int> moved(std::move(rx));
        REQUIRE(tx.send(3));
        settle(l);
        REQUIRE(j.done);
        CHECK(j.seen == std::vector<long>{3});
        CHECK(moved.size() == 0);
    }
}

TEST_CASE("broadcast: one receive at a time per receiver", "[broadcast]") {
    loop l;
    broadcast_sender<int> tx(4);
    auto rx = tx.subscribe();
    journal first;
    auto h1 = l.spawn(receive_one(rx, first));
    settle(l);
    CHECK_THROWS_AS(rx.try_receive(), std::logic_error);
    auto second = [](broadcast_receiver<int>& rx) -> task<bool> {
        try {
            (void)co_await rx.receive();
        } catch (const std::logic_error&) {
            co_return true;
        }
        co_return false;
    };
    CHECK(run(l, second(rx)));
    REQUIRE(tx.send(4));
    settle(l);
    CHECK(first.seen == std::vector<long>{4});
}

TEST_CASE("broadcast: values held are destroyed when the last handle goes, and with the loop while receivers are parked",
          "[broadcast][lifetime]") {
    tracked::reset();
    {
        loop l;
        broadcast_sender<tracked> tx(4);
        auto holder = tx.subscribe();  // reads nothing: keeps every value
        auto rx = std::make_unique<broadcast_receiver<tracked>>(tx.subscribe());
        auto h = l.spawn([](broadcast_receiver<tracked>& rx, broadcast_sender<tracked>& tx) -> task<void> {
            REQUIRE(tx.send(tracked(1)));
            REQUIRE(tx.send(tracked(2)));
            for (int i = 0; i < 2; ++i) (void)co_await rx.receive();
            (void)co_await rx.receive();  // parks: the loop goes first
        }(*rx, tx));
        settle(l);
        CHECK(tracked::alive == 2);  // held for holder
    }
    CHECK(tracked::alive == 0);
}

TEST_CASE("broadcast: receives that find a value spend the budget; one sent to the back of the queue and destroyed there took nothing",
          "[broadcast][budget]") {
    SECTION("the budget") {
        spindle::loop_options o;
        o.task_budget = 8;
        loop l(o);
        broadcast_sender<int> tx(1000);
        auto rx = tx.subscribe();
        for (int i = 0; i < 1000; ++i) REQUIRE(tx.send(i));
        tx.close();
        long turns = 0;
        bool quit = false;
        std::vector<long> turn_at;
        journal j;
        auto counter = l.spawn([](long& t, const bool& q) -> task<void> {
            while (!q) {
                ++t;
                co_await spindle::yield();
            }
        }(turns, quit));
        auto reader = l.spawn([](broadcast_receiver<int>& rx, journal& j, const long& t, std::vector<long>& at, bool& q) -> task<void> {
            for (;;) {
                auto r = co_await rx.receive();
                if (!r) break;
                j.seen.push_back(*r);
                at.push_back(t);
            }
            q = true;
        }(rx, j, turns, turn_at, quit));
        REQUIRE(run_until(l, [&] { return reader.done() && counter.done(); }));
        CHECK(j.seen == upto(0, 1000));
        std::size_t longest = 0, run = 0;
        for (std::size_t i = 0; i < turn_at.size(); ++i) {
            run = (i > 0 && turn_at[i] == turn_at[i - 1]) ? run + 1 : 1;
            longest = std::max(longest, run);
        }
        CHECK(longest <= 8);
    }
    SECTION("requeued, then destroyed") {
        spindle::loop_options o;
        o.task_budget = 1;
        loop l(o);
        broadcast_sender<int> tx(8);
        auto rx = tx.subscribe();
        for (int i = 0; i < 3; ++i) REQUIRE(tx.send(i));
        journal j;
        auto doomed = l.spawn(receive_all(rx, j));
        l.run_once(0ns);  // 0 with the budget; 1 found, and the task queued again
        REQUIRE(j.seen == std::vector<long>{0});
        doomed.abort();
        CHECK(*rx.try_receive() == 1);
        CHECK(*rx.try_receive() == 2);
    }
}

// --- a randomized run against a model ---------------------------------------------

TEST_CASE("broadcast: 20,000 random sends, reads, subscribes and departures agree with a model; every value destroyed once",
          "[broadcast][model]") {
    tracked::reset();
    std::mt19937 rng(1234);
    constexpr std::size_t capacity = 5;
    {
        broadcast_sender<tracked> tx(capacity);
        struct model_rx {
            std::unique_ptr<broadcast_receiver<tracked>> rx;
            std::uint64_t cursor;  // model: next sequence to read
            std::uint64_t since;   // subscribed when this many had been sent
        };
        std::vector<model_rx> rxs;
        std::uint64_t sent = 0;  // sequence numbers are the values
        for (int step = 0; step < 20'000; ++step) {
            const unsigned op = rng() % 10;
            if (op < 4) {
                auto n = tx.send(tracked(static_cast<int>(sent)));
                REQUIRE(n);
                REQUIRE(*n == rxs.size());
                if (!rxs.empty()) ++sent;  // nothing is stored without a receiver
            } else if (op < 8 && !rxs.empty()) {
                model_rx& m = rxs[rng() % rxs.size()];
                const std::uint64_t oldest = sent > capacity ? sent - capacity : 0;
                auto r = m.rx->try_receive();
                if (m.cursor < oldest) {
                    REQUIRE(r.error() == lagged);
                    REQUIRE(r.missed() == oldest - m.cursor);
                    m.cursor = oldest;
                } else if (m.cursor == sent) {
                    REQUIRE(r.error() == would_block);
                } else {
                    REQUIRE(r);
                    REQUIRE(r->v == static_cast<int>(m.cursor));
                    ++m.cursor;
                }
            } else if (op == 8 && rxs.size() < 6) {
                rxs.push_back({std::make_unique<broadcast_receiver<tracked>>(tx.subscribe()), sent, sent});
            } else if (!rxs.empty()) {
                rxs.erase(rxs.begin() + static_cast<std::ptrdiff_t>(rng() % rxs.size()));
            }
            // The values alive are exactly those held that some receiver still has to read.
            if (step % 97 == 0) {
                const std::uint64_t oldest = sent > capacity ? sent - capacity : 0;
                int needed = 0;
                for (std::uint64_t seq = oldest; seq < sent; ++seq)
                    if (std::any_of(rxs.begin(), rxs.end(), [&](const model_rx& m) { return m.cursor <= seq && m.since <= seq; }))
                        ++needed;
                REQUIRE(tracked::alive == needed);
            }
        }
        CHECK(sent > 1000);
    }
    CHECK(tracked::alive == 0);
}
