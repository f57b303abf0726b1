// Borrowed reads (spindle::recv_borrowed, stream_socket::read_borrowed) on
// loopback, on every backend: data in a buffer lent by the loop, end of
// stream, resets, cancellation and close without loss, more buffers held at
// once than the io_uring ring has (its growth and its plain fallback), bulk
// data in order, and buffers kept past their loop's end.

#include "net_support.hpp"

#include <spindle/net/tcp.hpp>

#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <vector>

using namespace std::chrono_literals;
using spindle::borrowed_buffer;
using spindle::loop;
using spindle::loop_options;
using spindle::result;
using spindle::task;
using spindle::test::bytes_of;
using spindle::test::fill_pattern;
using spindle::test::pattern_mismatch;
using spindle::test::run;
using spindle::test::text_of;
namespace net = spindle::net;

namespace {

struct tcp_pair {
    net::tcp_stream client;
    net::tcp_stream server;
};

task<tcp_pair> connect_pair(net::tcp_listener& l) {
    result<net::address> to = l.local_address();
    REQUIRE(to.has_value());
    result<net::tcp_stream> client = co_await net::tcp_stream::connect(*to);
    REQUIRE(client.has_value());
    result<net::tcp_stream> server = co_await l.accept();
    REQUIRE(server.has_value());
    co_return tcp_pair{std::move(*client), std::move(*server)};
}

net::tcp_listener listen_loopback() {
    auto l = net::tcp_listener::bind(net::address::ipv4_loopback(0));
    REQUIRE(l.has_value());
    return std::move(*l);
}

// A small pool, so that a handful of connections holding buffers outgrows
// io_uring's ring: 16 buffers of 4 KiB, the ring as small as it can be.
loop_options small_pool() {
    loop_options o;
    o.read_buffer_size = 4096;
    o.read_buffer_batch = 16;
    return o;
}

}  // namespace

TEST_CASE("borrowed read: the bytes that arrived, then an empty buffer at end of stream", "[borrowed]") {
    loop l;
    auto listener = listen_loopback();
    struct outcome {
        std::string first;
        std::size_t size_at_end = 1;
        bool ended = false;
    } got;
    run(l, [](net::tcp_listener& listener, outcome& got) -> task<void> {
        tcp_pair p = co_await connect_pair(listener);
        result<void> sent = co_await p.client.write_all(bytes_of("hello, pool"));
        REQUIRE(sent.has_value());
        result<borrowed_buffer> b = co_await p.server.read_borrowed();
        REQUIRE(b.has_value());
        got.first = text_of(b->bytes());
        b->consume(7);
        CHECK(text_of(b->bytes()) == "pool");
        b->reset();
        CHECK(b->empty());
        REQUIRE(p.client.shutdown_write().has_value());
        result<borrowed_buffer> end = co_await p.server.read_borrowed();
        REQUIRE(end.has_value());
        got.size_at_end = end->size();
        got.ended = true;
    }(listener, got));
    CHECK(got.first == "hello, pool");
    CHECK(got.ended);
    CHECK(got.size_at_end == 0);
}

TEST_CASE("borrowed read: a bulk transfer arrives whole and in order, each buffer at most the pool's size", "[borrowed]") {
    loop l(small_pool());
    auto listener = listen_loopback();
    constexpr std::size_t total = 2 * 1024 * 1024;
    struct outcome {
        std::size_t received = 0;
        std::size_t mismatch = static_cast<std::size_t>(-1);
        std::size_t largest = 0;
        std::error_code error;
    } got;
    run(
        l,
        [](net::tcp_listener& listener, outcome& got) -> task<void> {
            tcp_pair p = co_await connect_pair(listener);
            auto writer = loop::current().spawn([](net::tcp_stream& c) -> task<void> {
                std::vector<std::byte> data(total);
                fill_pattern(data, 11, 0);
                result<void> w = co_await c.write_all(data);
                REQUIRE(w.has_value());
                REQUIRE(c.shutdown_write().has_value());
            }(p.client));
            for (int i = 0; i < 1'000'000; ++i) {
                result<borrowed_buffer> b = co_await p.server.read_borrowed();
                if (!b) {
                    got.error = b.error();
                    break;
                }
                if (b->empty()) break;
                got.largest = std::max(got.largest, b->size());
                const std::size_t bad = pattern_mismatch(b->bytes(), 11, got.received);
                if (bad != static_cast<std::size_t>(-1) && got.mismatch == static_cast<std::size_t>(-1))
                    got.mismatch = got.received + bad;
                got.received += b->size();
            }
            co_await writer;
        }(listener, got),
        30s);
    CHECK(!got.error);
    CHECK(got.received == total);
    CHECK(got.mismatch == static_cast<std::size_t>(-1));
    CHECK(got.largest <= 4096);
    CHECK(got.largest > 0);
}

TEST_CASE("borrowed read: 64 connections holding their buffers at once outgrow a 16-buffer pool and lose nothing", "[borrowed]") {
    // Every server side waits in a borrowed read (holding nothing), then
    // every client sends; each reader keeps its buffer until all have read,
    // so 64 are lent at once: on io_uring the ring is emptied and the rest
    // take the plain way (readiness, then a buffer of the pool's others).
    loop l(small_pool());
    auto listener = listen_loopback();
    constexpr int connections = 64;
    struct outcome {
        int right = 0;
        int ended = 0;
        std::error_code error;
    } got;
    run(
        l,
        [](net::tcp_listener& listener, outcome& got) -> task<void> {
            std::vector<tcp_pair> pairs;
            for (int i = 0; i < connections; ++i) pairs.push_back(co_await connect_pair(listener));
            std::vector<borrowed_buffer> held(connections);
            spindle::event all_read;
            int reads = 0;
            std::vector<spindle::join_handle<void>> readers;
            for (int i = 0; i < connections; ++i) {
                readers.push_back(loop::current().spawn([](net::tcp_stream& s, borrowed_buffer& keep, int& reads,
                                                           spindle::event& all_read, outcome& got) -> task<void> {
                    result<borrowed_buffer> b = co_await s.read_borrowed();
                    if (!b) {
                        got.error = b.error();
                    } else {
                        keep = std::move(*b);
                    }
                    if (++reads == connections) all_read.set();
                    (void)co_await all_read.wait();
                }(pairs[static_cast<std::size_t>(i)].server, held[static_cast<std::size_t>(i)], reads, all_read, got)));
            }
            (void)co_await spindle::sleep_for(10ms);  // every reader parked
            for (int i = 0; i < connections; ++i) {
                const std::string text = "connection " + std::to_string(i);
                result<void> sent = co_await pairs[static_cast<std::size_t>(i)].client.write_all(bytes_of(text));
                REQUIRE(sent.has_value());
            }
            for (auto& r : readers) co_await r;
            for (int i = 0; i < connections; ++i)
                if (text_of(held[static_cast<std::size_t>(i)].bytes()) == "connection " + std::to_string(i))
                    ++got.right;
            held.clear();
            // The pool is whole again: every connection reads end of stream.
            for (auto& p : pairs) REQUIRE(p.client.shutdown_write().has_value());
            for (auto& p : pairs) {
                result<borrowed_buffer> end = co_await p.server.read_borrowed();
                if (end && end->empty()) ++got.ended;
            }
        }(listener, got),
        30s);
    CHECK(!got.error);
    CHECK(got.right == connections);
    CHECK(got.ended == connections);
}

namespace {

// Every server side of `connections` waits in a borrowed read, then every
// client sends at once; each reader gives its buffer back as soon as it has
// checked it and reads again. Returns the loop's read_buffers gauge once all
// have read, and sets `lent` to what is still lent then (none) and
// `io_uring` to whether the loop ran on it.
std::uint64_t buffers_for_a_burst(const loop_options& options, int connections, std::uint64_t& lent, bool& io_uring) {
    loop l(options);
    io_uring = l.backend() == spindle::backend_kind::io_uring;
    auto listener = listen_loopback();
    struct outcome {
        int right = 0;
        std::error_code error;
    } got;
    run(
        l,
        [](net::tcp_listener& listener, int connections, outcome& got) -> task<void> {
            std::vector<tcp_pair> pairs;
            for (int i = 0; i < connections; ++i) pairs.push_back(co_await connect_pair(listener));
            spindle::event all_read;
            int reads = 0;
            std::vector<spindle::join_handle<void>> readers;
            for (int i = 0; i < connections; ++i) {
                readers.push_back(loop::current().spawn([](net::tcp_stream& s, int i, int connections, int& reads,
                                                           spindle::event& all_read, outcome& got) -> task<void> {
                    for (;;) {
                        result<borrowed_buffer> b = co_await s.read_borrowed();
                        if (!b) {
                            got.error = b.error();
                            break;
                        }
                        if (b->empty()) break;
                        if (text_of(b->bytes()) == "connection " + std::to_string(i)) ++got.right;
                        if (++reads == connections) all_read.set();
                    }
                }(pairs[static_cast<std::size_t>(i)].server, i, connections, reads, all_read, got)));
            }
            (void)co_await spindle::sleep_for(10ms);  // every reader parked, holding nothing
            // Sent in one go, without a suspension between: the loop looks at the
            // OS only after all of them, and finds every connection readable.
            for (int i = 0; i < connections; ++i) {
                const std::string text = "connection " + std::to_string(i);
                const auto n = ::send(pairs[static_cast<std::size_t>(i)].client.native_handle(), text.data(),
                                      text.size(), MSG_NOSIGNAL);
                REQUIRE(n == static_cast<::ssize_t>(text.size()));
            }
            (void)co_await all_read.wait();
            for (auto& p : pairs) REQUIRE(p.client.shutdown_write().has_value());
            for (auto& r : readers) co_await r;
        }(listener, connections, got),
        30s);
    CHECK(!got.error);
    CHECK(got.right == connections);
    const spindle::loop_metrics m = l.metrics();
    lent = m.read_buffers_lent;
    return m.read_buffers;
}

}  // namespace

TEST_CASE("borrowed read: a burst of 64 readable connections takes one batch of buffers, not one each", "[borrowed]") {
    // 16 to a batch: the loop lends 16, the readers give them back, the next
    // look at the OS lends the same 16 again. The pool maps them 16 at a
    // time, so it stays at one mapping. On io_uring the batch is the kernel's
    // ring, which the first 16 receives empty; the other 48 find it dry and
    // wait for readiness, and by then the readers have given the 16 back
    // into the ring, which serves them in turn: one mapping there too.
    std::uint64_t lent = 1;
    bool io_uring = false;
    const std::uint64_t batched = buffers_for_a_burst(small_pool(), 64, lent, io_uring);
    CHECK(batched == 16);
    CHECK(lent == 0);
    // The same burst with a batch larger than it: one buffer per connection
    // before any reader could give one back. What the batch saves. (On
    // io_uring, the ring grows by one mapping per 16 receives that found it
    // dry at once, not one per receive.)
    loop_options unbatched = small_pool();
    unbatched.read_buffer_batch = 256;
    lent = 1;
    CHECK(buffers_for_a_burst(unbatched, 64, lent, io_uring) == 64);
    CHECK(lent == 0);
}

TEST_CASE("borrowed read: a cancelled read takes nothing, and the next read gets every byte", "[borrowed]") {
    loop l;
    auto listener = listen_loopback();
    struct outcome {
        std::error_code cancelled;
        std::string after;
    } got;
    run(l, [](net::tcp_listener& listener, outcome& got) -> task<void> {
        tcp_pair p = co_await connect_pair(listener);
        std::stop_source stop;
        auto reader = loop::current().spawn([](net::tcp_stream& s, std::stop_token token, outcome& got) -> task<void> {
            result<borrowed_buffer> b = co_await s.read_borrowed(token);
            got.cancelled = b.error();
        }(p.server, stop.get_token(), got));
        (void)co_await spindle::sleep_for(5ms);
        stop.request_stop();
        co_await reader;
        result<void> sent = co_await p.client.write_all(bytes_of("still here"));
        REQUIRE(sent.has_value());
        result<borrowed_buffer> b = co_await p.server.read_borrowed();
        REQUIRE(b.has_value());
        got.after = text_of(b->bytes());
    }(listener, got));
    CHECK(got.cancelled == std::errc::operation_canceled);
    CHECK(got.after == "still here");
}

// The error a borrowed read waiting on the server side ends with when
// `interrupt` does something to the pair 5 ms into its wait.
std::error_code waiting_read_error(void (*interrupt)(tcp_pair&)) {
    loop l;
    auto listener = listen_loopback();
    std::error_code error;
    run(l, [](net::tcp_listener& listener, void (*interrupt)(tcp_pair&), std::error_code& error) -> task<void> {
        tcp_pair p = co_await connect_pair(listener);
        auto reader = loop::current().spawn([](net::tcp_stream& s, std::error_code& error) -> task<void> {
            result<borrowed_buffer> b = co_await s.read_borrowed();
            error = b.error();
        }(p.server, error));
        (void)co_await spindle::sleep_for(5ms);
        interrupt(p);
        co_await reader;
    }(listener, interrupt, error));
    return error;
}

TEST_CASE("borrowed read: closing the stream under a waiting read completes it with operation_canceled", "[borrowed]") {
    CHECK(waiting_read_error([](tcp_pair& p) { p.server.close(); }) == std::errc::operation_canceled);
}

TEST_CASE("borrowed read: a reset peer is connection_reset", "[borrowed]") {
    const std::error_code error = waiting_read_error([](tcp_pair& p) {
        ::linger lg{1, 0};  // close() sends a reset instead of a FIN
        REQUIRE(::setsockopt(p.client.native_handle(), SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0);
        p.client.close();
    });
    CHECK(error == std::errc::connection_reset);
}

TEST_CASE("borrowed read: a buffer kept past its loop's end stays valid and is freed when given back", "[borrowed]") {
    borrowed_buffer kept;
    {
        loop l;
        auto listener = listen_loopback();
        run(l, [](net::tcp_listener& listener, borrowed_buffer& kept) -> task<void> {
            tcp_pair p = co_await connect_pair(listener);
            result<void> sent = co_await p.client.write_all(bytes_of("outlives the loop"));
            REQUIRE(sent.has_value());
            result<borrowed_buffer> b = co_await p.server.read_borrowed();
            REQUIRE(b.has_value());
            kept = std::move(*b);
        }(listener, kept));
    }
    // The loop and its backend are gone; the sanitizers see the rest.
    CHECK(text_of(kept.bytes()) == "outlives the loop");
    kept.reset();
    CHECK(kept.empty());
}

TEST_CASE("borrowed read: a loop destroyed with reads waiting frees everything", "[borrowed]") {
    auto listener = listen_loopback();
    std::vector<tcp_pair> pairs;
    {
        loop l(small_pool());
        pairs = run(l, [](net::tcp_listener& listener) -> task<std::vector<tcp_pair>> {
            std::vector<tcp_pair> pairs;
            for (int i = 0; i < 20; ++i) pairs.push_back(co_await connect_pair(listener));
            co_return pairs;
        }(listener));
        for (auto& p : pairs) {
            (void)l.spawn([](net::tcp_stream& s) -> task<void> {
                for (int i = 0; i < 100; ++i) {
                    result<borrowed_buffer> b = co_await s.read_borrowed();
                    if (!b || b->empty()) break;
                }
            }(p.server));
        }
        // Half the connections have data when the loop goes: some reads done
        // and not resumed, some still waiting.
        for (std::size_t i = 0; i < pairs.size(); i += 2)
            REQUIRE(::send(pairs[i].client.native_handle(), "x", 1, MSG_NOSIGNAL) == 1);
        l.run_once(0ms);
        l.run_once(1ms);
    }
    SUCCEED("the loop went with its parked readers; the sanitizers check that nothing leaked");
}

TEST_CASE("borrowed read: a loop refuses a read buffer size of 0 or over 1 GiB", "[borrowed]") {
    loop_options none;
    none.read_buffer_size = 0;
    CHECK_THROWS_AS(loop(none), std::invalid_argument);
    loop_options huge;
    huge.read_buffer_size = (std::size_t{1} << 30) + 1;
    CHECK_THROWS_AS(loop(huge), std::invalid_argument);
}
