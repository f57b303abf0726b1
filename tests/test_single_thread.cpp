// Loops with loop_options::single_thread (every loop of a loop_group): built,
// run and destroyed on one thread, fed by others only through post, stop and
// holds. On io_uring the ring is then single-issuer with deferred task work
// where the kernel has them, and its descriptor is registered: completions
// reach the loop only when it enters the kernel asking for them, and nothing
// but the eventfd behind wake() can rouse it from another thread. Also run
// under ThreadSanitizer (the `threads` suite).
//
// Catch2 assertions are made on the test thread only: other threads record
// what they saw in atomics (or in variables the test reads after joining them).

#include "stop_watchdog.hpp"
#include "support.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::test::stop_watchdog;

namespace {

spindle::loop_options single_thread_options() {
    spindle::loop_options options;
    options.single_thread = true;
    return options;
}


double ms_since(spindle::clock::time_point t) {
    return std::chrono::duration<double, std::milli>(spindle::clock::now() - t).count();
}

/// Reads exactly buf.size() bytes; false at end of file or on an error.
task<bool> read_exact(int fd, std::span<std::byte> buf) {
    std::size_t got = 0;
    while (got < buf.size()) {
        result<std::size_t> n = co_await spindle::read(fd, buf.subspan(got));
        if (!n || *n == 0) co_return false;
        got += *n;
    }
    co_return true;
}

task<bool> write_exact(int fd, std::span<const std::byte> buf) {
    std::size_t sent = 0;
    while (sent < buf.size()) {
        result<std::size_t> n = co_await spindle::write(fd, buf.subspan(sent));
        if (!n) co_return false;
        sent += *n;
    }
    co_return true;
}

/// Sends back every 4-byte message until end of file.
task<void> echo_server(int fd, std::atomic<long>& echoed) {
    for (long i = 0; i < 1'000'000; ++i) {
        std::uint32_t message = 0;
        if (!co_await read_exact(fd, std::as_writable_bytes(std::span(&message, 1)))) co_return;
        if (!co_await write_exact(fd, std::as_bytes(std::span(&message, 1)))) co_return;
        echoed.fetch_add(1, std::memory_order_relaxed);
    }
}

/// Sends `rounds` numbered messages one at a time, each answered before the
/// next; counts the answers that came back unchanged.
task<void> echo_client(int fd, int rounds, std::atomic<long>& matched, std::atomic<bool>& finished) {
    for (std::uint32_t i = 0; i < static_cast<std::uint32_t>(rounds); ++i) {
        if (!co_await write_exact(fd, std::as_bytes(std::span(&i, 1)))) break;
        std::uint32_t answer = ~i;
        if (!co_await read_exact(fd, std::as_writable_bytes(std::span(&answer, 1)))) break;
        if (answer == i) matched.fetch_add(1, std::memory_order_relaxed);
    }
    finished.store(true);
}

/// Sleeps `times` times, so the loop also waits on timers throughout.
task<void> napper(int times, std::atomic<int>& naps) {
    for (int i = 0; i < times; ++i) {
        (void)co_await spindle::sleep_for(200us);
        naps.fetch_add(1, std::memory_order_relaxed);
    }
}

/// Parks on a read that never completes, holding a counted local.
task<void> parked_reader(int fd, std::atomic<int>& started) {
    spindle::test::counted alive_while_parked;
    std::byte b{};
    started.fetch_add(1);
    (void)co_await spindle::read(fd, std::span(&b, 1));
}

task<void> parked_accept(int fd, std::atomic<int>& started) {
    spindle::test::counted alive_while_parked;
    started.fetch_add(1);
    result<int> c = co_await spindle::accept(fd);
    if (c) ::close(*c);
}

/// A listening TCP socket on 127.0.0.1 (an ephemeral port), non-blocking; -1 if not.
int loopback_listener() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    ::sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<const ::sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 8) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

}  // namespace

// =====================================================================================

TEST_CASE("a single-thread loop sleeps, and wakes for a post from another thread", "[single_thread][threads]") {
    std::atomic<int> ran{0};
    std::atomic<bool> built{false};
    std::atomic<spindle::loop*> where{nullptr};
    std::atomic<bool> stop_returned{false};
    std::thread owner([&] {
        loop l(single_thread_options());
        where.store(&l);
        loop::hold keep(l);
        l.spawn([](std::atomic<bool>& built) -> task<void> {
            (void)co_await spindle::sleep_for(1ms);
            built.store(true);
        }(built)).detach();
        l.run();
        // run() may return while stop() is still inside the loop on the
        // other thread (it wakes the backend after setting the flag): the
        // loop must outlive that call.
        while (!stop_returned.load()) std::this_thread::yield();
    });
    while (!where.load()) std::this_thread::yield();
    while (!built.load()) std::this_thread::sleep_for(1ms);
    // The loop sleeps in the kernel now: a post must wake it.
    where.load()->post([&ran] { ran.fetch_add(1); });
    for (int i = 0; i < 5000 && ran.load() == 0; ++i) std::this_thread::sleep_for(1ms);
    CHECK(ran.load() == 1);
    where.load()->stop();
    stop_returned.store(true);
    owner.join();
}

TEST_CASE("single_thread: posts from 4 threads run exactly once while the loop echoes and sleeps", "[single_thread][threads]") {
    constexpr int producers = 4;
    constexpr int per_producer = 10'000;
    constexpr int rounds = 2'000;

    spindle::test::socket_pair pair;  // outlives the loop
    // Touched on the loop thread (this one) only.
    std::array<long, producers> runs{};
    std::array<long, producers> last{-1, -1, -1, -1};
    std::array<long, producers> out_of_order{};
    long total = 0;
    int producers_done = 0;
    std::thread::id wrong_thread{};
    const std::thread::id loop_thread = std::this_thread::get_id();

    std::atomic<long> echoed{0};
    std::atomic<long> matched{0};
    std::atomic<bool> client_finished{false};
    std::atomic<int> naps{0};
    {
        loop l(single_thread_options());
        std::optional<loop::hold> hold(std::in_place, l);
        auto server = l.spawn(echo_server(pair.b, echoed), "echo server");
        auto client = l.spawn(echo_client(pair.a, rounds, matched, client_finished), "echo client");
        auto sleeper = l.spawn(napper(1'000'000, naps), "napper");
        // The hold goes once every producer is done and the echo is over.
        auto release_when_all_done = [&] {
            if (producers_done == producers && client_finished.load()) hold.reset();
        };
        std::atomic<bool> go{false};
        std::vector<std::thread> threads;
        for (int p = 0; p < producers; ++p) {
            threads.emplace_back([&, p] {
                while (!go.load()) std::this_thread::yield();
                for (long i = 0; i < per_producer; ++i) {
                    l.post([&, p, i] {
                        if (std::this_thread::get_id() != loop_thread) wrong_thread = std::this_thread::get_id();
                        ++runs[p];
                        ++total;
                        if (last[p] + 1 != i) ++out_of_order[p];
                        last[p] = i;
                    });
                    // Now and then let the loop fall asleep between posts.
                    if (i % 250 == 249) std::this_thread::sleep_for(1ms);
                }
                l.post([&] {
                    ++producers_done;
                    release_when_all_done();
                });
            });
        }
        // The client may finish before or after the producers: whichever is
        // last releases the hold.
        auto finisher = l.spawn([](std::atomic<bool>& finished, auto& release) -> task<void> {
            while (!finished.load()) (void)co_await spindle::sleep_for(1ms);
            release();
        }(client_finished, release_when_all_done), "finisher");
        go = true;
        stop_watchdog watchdog(l, 60s);
        const auto started = spindle::clock::now();
        // Not run(): the server and the napper keep the loop busy after the
        // hold is gone; they are stopped below.
        while (hold.has_value() && ms_since(started) < 60'000) (void)l.run_once(10ms);
        const bool stopped_by_watchdog = watchdog.finish();
        for (auto& t : threads) t.join();
        // The rest of the posts (none should be left) and the last replies.
        spindle::test::settle(l);
        // When the producers' last post released the hold, the finisher may
        // still be in its 1 ms sleep: let it see the client finished.
        for (int i = 0; i < 100 && !finisher.done(); ++i) (void)l.run_once(10ms);
        server.abort();
        sleeper.abort();
        CHECK_FALSE(stopped_by_watchdog);
        CHECK(finisher.done());
        CHECK(client.done());
    }
    CHECK(producers_done == producers);
    CHECK(total == long{producers} * per_producer);
    for (int p = 0; p < producers; ++p) {
        CAPTURE(p);
        CHECK(runs[p] == per_producer);
        CHECK(last[p] == per_producer - 1);
        CHECK(out_of_order[p] == 0);
    }
    CHECK(wrong_thread == std::thread::id{});
    CHECK(matched.load() == rounds);
    CHECK(echoed.load() == rounds);
    CHECK(naps.load() > 0);
}

TEST_CASE("single_thread: stop() from another thread ends run() while the loop sleeps", "[single_thread][threads]") {
    spindle::test::socket_pair pair;  // a read parked on it keeps I/O in flight
    loop l(single_thread_options());
    std::optional<loop::hold> hold(std::in_place, l);
    std::atomic<int> started{0};
    auto reader = l.spawn(parked_reader(pair.b, started));
    spindle::test::settle(l);
    REQUIRE(started.load() == 1);
    REQUIRE_FALSE(l.time_to_next_deadline().has_value());  // nothing but I/O or a wake-up ends the sleep

    for (int round = 0; round < 3; ++round) {
        CAPTURE(round);
        std::atomic<bool> stop_called{false};
        std::thread stopper([&] {
            std::this_thread::sleep_for(30ms);
            stop_called = true;
            l.stop();
        });
        stop_watchdog watchdog(l, 10s);
        const auto t0 = spindle::clock::now();
        l.run();
        const double took = ms_since(t0);
        const bool stopped_by_watchdog = watchdog.finish();
        stopper.join();
        CHECK(stop_called.load());  // run() did not return on its own
        CHECK_FALSE(stopped_by_watchdog);
        CHECK(took < 5'000);
        CHECK_FALSE(reader.done());
    }
    reader.abort();
    hold.reset();
    l.run();
    CHECK_FALSE(l.has_work());
}

TEST_CASE("single_thread: a loop that waits on timers only wakes for each of them", "[single_thread]") {
    loop l(single_thread_options());
    std::vector<double> woke_after;
    const auto t0 = spindle::clock::now();
    l.block_on([](std::vector<double>& woke_after, spindle::clock::time_point t0) -> task<void> {
        for (int i = 1; i <= 5; ++i) {
            (void)co_await spindle::sleep_for(10ms);
            woke_after.push_back(ms_since(t0));
        }
    }(woke_after, t0));
    REQUIRE(woke_after.size() == 5);
    for (std::size_t i = 0; i < woke_after.size(); ++i) {
        CAPTURE(i, woke_after[i]);
        CHECK(woke_after[i] >= 10.0 * static_cast<double>(i + 1));  // never early
    }
    CHECK(woke_after.back() < 5'000);  // and not lost
    CHECK_FALSE(l.has_work());
}

TEST_CASE("single_thread: running the loop on another thread than the builder's throws", "[single_thread][threads]") {
    loop l(single_thread_options());
    std::atomic<int> ran{0};
    l.post([&ran] { ran.fetch_add(1); });

    bool run_threw = false;
    bool run_once_threw = false;
    bool block_on_threw = false;
    std::thread other([&] {
        try {
            l.run();
        } catch (const std::logic_error&) {
            run_threw = true;
        }
        try {
            (void)l.run_once(0ns);
        } catch (const std::logic_error&) {
            run_once_threw = true;
        }
        try {
            l.block_on([]() -> task<void> { co_return; }());
        } catch (const std::logic_error&) {
            block_on_threw = true;
        }
    });
    other.join();
    CHECK(run_threw);
    CHECK(run_once_threw);
    CHECK(block_on_threw);
    CHECK(ran.load() == 0);  // nothing ran over there

    // Its own thread still runs it, post and all.
    spindle::test::settle(l);
    CHECK(ran.load() == 1);
    l.run();
    CHECK_FALSE(l.has_work());
}

TEST_CASE("single_thread: a loop destroyed with tasks parked on I/O frees them all", "[single_thread][threads]") {
    constexpr int readers = 8;
    spindle::test::counted::alive = 0;
    std::vector<std::unique_ptr<spindle::test::socket_pair>> pairs;
    for (int i = 0; i < readers; ++i) pairs.push_back(std::make_unique<spindle::test::socket_pair>());
    const int listener = loopback_listener();
    REQUIRE(listener >= 0);

    // Built, run and destroyed on its own thread, as a loop of a loop group.
    std::atomic<int> started{0};
    std::atomic<int> alive_before{-1};
    std::atomic<int> alive_after{-1};
    std::atomic<bool> reached{false};
    std::thread owner([&] {
        {
            loop l(single_thread_options());
            for (int i = 0; i < readers; ++i) l.spawn(parked_reader(pairs[i]->b, started)).detach();
            l.spawn(parked_accept(listener, started)).detach();
            // Parked in the kernel: a recv per socket and the accept are in flight.
            spindle::test::run_until(l, [&] { return started.load() == readers + 1; });
            for (int i = 0; i < 4; ++i) (void)l.run_once(1ms);
            alive_before.store(spindle::test::counted::alive);
            reached.store(started.load() == readers + 1 && l.task_count() == readers + 1);
        }
        alive_after.store(spindle::test::counted::alive);
    });
    owner.join();
    ::close(listener);
    CHECK(reached.load());
    CHECK(alive_before.load() == readers + 1);
    CHECK(alive_after.load() == 0);
    // The descriptors are still ours and still work: nothing was closed or
    // left reading from them.
    for (auto& p : pairs) {
        REQUIRE(::write(p->a, "x", 1) == 1);
        char c = 0;
        CHECK(::recv(p->b, &c, 1, MSG_DONTWAIT) == 1);
    }
}
