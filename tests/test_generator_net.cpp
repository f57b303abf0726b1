// The net layer's generators over loopback: net::connections() over TCP and
// Unix listeners (ends at the stop, at the listener's close, under a
// with_timeout around next()), and buffered_reader::lines() over every kind
// of stream (lines in order, the tail kept buffered, line_too_long yielded
// once, a cancel reaching the read, the consumer aborted while it reads).
#include "net_support.hpp"
#include "stream_kinds.hpp"

#include <spindle/async_generator.hpp>
#include <spindle/net/buffered_reader.hpp>
#include <spindle/net/tcp.hpp>
#include <spindle/net/unix.hpp>
#include <spindle/net/write.hpp>
#include <spindle/timeout.hpp>

#include <unistd.h>

#include <cstddef>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
namespace net = spindle::net;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::test::bytes_of;
using spindle::test::counted;
using spindle::test::run;
using spindle::test::run_until;
using spindle::test::settle;

namespace {

const std::error_code timed_out = std::make_error_code(std::errc::timed_out);

struct server_state {
    std::string got;  // the first byte of each connection, in order
    int accepted = 0;
    std::error_code failure;
    bool ended = false;
};

/// Takes connections until the stream ends; reads one byte from each.
template <class Listener>
task<void> serve(Listener& listener, std::stop_token token, server_state& st) {
    auto incoming = net::connections(listener, token);
    while (auto c = co_await incoming.next()) {
        if (!*c) {
            st.failure = c->error();
            break;
        }
        auto stream = std::move(**c);
        std::byte b{};
        result<std::size_t> n = co_await stream.read_some(std::span(&b, 1));
        if (n && *n == 1) st.got.push_back(static_cast<char>(b));
        ++st.accepted;
    }
    st.ended = incoming.done();
}

/// Connects `n` times in turn, sending one letter on each, and keeps the
/// streams open.
template <class Stream>
task<void> clients(net::address at, int n, std::vector<Stream>& keep) {
    for (int i = 0; i < n; ++i) {
        result<Stream> s = co_await Stream::connect(at);
        REQUIRE(s.has_value());
        const char letter = static_cast<char>('a' + i);
        result<void> w = co_await s->write_all(bytes_of(std::string_view(&letter, 1)));
        REQUIRE(w.has_value());
        keep.push_back(std::move(*s));
    }
}

}  // namespace

TEST_CASE("generator_net: connections() yields each accepted TCP connection in order and ends at the stop",
          "[generator_net][listener]") {
    loop l;
    result<net::tcp_listener> listener = net::tcp_listener::bind(net::address::ipv4_loopback(0));
    REQUIRE(listener.has_value());
    result<net::address> at = listener->local_address();
    REQUIRE(at.has_value());
    std::stop_source stop;
    server_state st;
    std::vector<net::tcp_stream> keep;
    auto server = l.spawn(serve(*listener, stop.get_token(), st));
    auto client = l.spawn(clients<net::tcp_stream>(*at, 3, keep));
    REQUIRE(run_until(l, [&] { return st.accepted == 3 && client.done(); }));
    settle(l);
    CHECK_FALSE(server.done());  // parked in the next accept
    stop.request_stop();
    REQUIRE(run_until(l, [&] { return server.done(); }));
    CHECK(st.got == "abc");
    CHECK_FALSE(st.failure);
    CHECK(st.ended);
}

TEST_CASE("generator_net: connections() over a Unix listener ends when the listener is closed",
          "[generator_net][listener]") {
    loop l;
    const std::string name = "@spindle-generator-test-" + std::to_string(::getpid());
    result<net::address> at = net::address::from_unix_path(name);
    REQUIRE(at.has_value());
    result<net::unix_listener> listener = net::unix_listener::bind(*at);
    REQUIRE(listener.has_value());
    server_state st;
    std::vector<net::unix_stream> keep;
    auto server = l.spawn(serve(*listener, {}, st));
    auto client = l.spawn(clients<net::unix_stream>(*at, 2, keep));
    REQUIRE(run_until(l, [&] { return st.accepted == 2 && client.done(); }));
    settle(l);
    CHECK_FALSE(server.done());
    listener->close();
    REQUIRE(run_until(l, [&] { return server.done(); }));
    CHECK(st.got == "ab");
    CHECK_FALSE(st.failure);
    CHECK(st.ended);
}

TEST_CASE("generator_net: with_timeout around connections().next() is timed_out, and the stream has ended",
          "[generator_net][listener]") {
    loop l;
    result<net::tcp_listener> listener = net::tcp_listener::bind(net::address::ipv4_loopback(0));
    REQUIRE(listener.has_value());
    struct outcome {
        std::error_code error;
        bool done = false;
    } o;
    run(l, [](net::tcp_listener& lst, outcome& out) -> task<void> {
        auto incoming = net::connections(lst);
        auto r = co_await spindle::with_timeout(20ms, incoming.next());  // nobody connects
        if (!r) out.error = r.error();
        out.done = incoming.done();
    }(*listener, o));
    CHECK(o.error == timed_out);
    CHECK(o.done);
}

TEMPLATE_TEST_CASE("generator_net: lines() yields every line in order; the tail stays buffered", "[generator_net][lines]",
                   spindle::test::memory_kind, spindle::test::unix_kind, spindle::test::tcp_kind) {
    loop l;
    struct outcome {
        std::vector<std::string> lines;
        std::string tail;
        bool clean_end = false;
    } o;
    run(l, [](outcome& out) -> task<void> {
        auto [writer, reading] = co_await TestType::make();
        // Two writes, a line split across them, and a tail without delimiter.
        result<void> w = co_await net::write_all(writer, std::string_view("one\ntwo\r\nthr"));
        REQUIRE(w.has_value());
        net::basic_buffered_reader reader(reading, 64);
        auto lines = reader.lines();
        auto first = co_await lines.next();
        REQUIRE(first);
        REQUIRE(first->has_value());
        out.lines.emplace_back(**first);
        w = co_await net::write_all(writer, std::string_view("ee\nfour\npartial"));
        REQUIRE(w.has_value());
        writer.close();
        for (;;) {
            auto line = co_await lines.next();
            if (!line) {
                out.clean_end = !line.cancelled() && lines.done();
                break;
            }
            REQUIRE(line->has_value());
            out.lines.emplace_back(**line);
        }
        out.tail = spindle::test::text_of(reader.buffered());
    }(o));
    CHECK(o.lines == std::vector<std::string>{"one\n", "two\r\n", "three\n", "four\n"});
    CHECK(o.tail == "partial");
    CHECK(o.clean_end);
}

TEST_CASE("generator_net: lines() yields line_too_long once, then ends; the bytes stay buffered", "[generator_net][lines]") {
    loop l;
    struct outcome {
        std::vector<std::string> lines;
        std::error_code error;
        bool end_after = false;
        std::size_t buffered = 0;
    } o;
    run(l, [](outcome& out) -> task<void> {
        auto [writer, reading] = co_await spindle::test::tcp_kind::make();
        result<void> w = co_await net::write_all(writer, std::string_view("a\r\nbbbbbbbbbbbbbbbb\r\n"));
        REQUIRE(w.has_value());
        net::basic_buffered_reader reader(reading);
        auto lines = reader.lines("\r\n", 8);
        for (;;) {
            auto line = co_await lines.next();
            if (!line) break;
            if (!*line) {
                out.error = line->error();
                continue;  // the next next() gives the end
            }
            out.lines.emplace_back(**line);
        }
        out.end_after = lines.done();
        out.buffered = reader.buffered().size();
    }(o));
    CHECK(o.lines == std::vector<std::string>{"a\r\n"});
    CHECK(o.error == net::errc::line_too_long);
    CHECK(o.end_after);
    CHECK(o.buffered >= 8);
}

TEST_CASE("generator_net: a stop on next(token) reaches lines()' read over TCP; what arrived stays buffered",
          "[generator_net][lines][cancel]") {
    loop l;
    std::stop_source stop;
    struct outcome {
        std::vector<std::string> lines;
        bool cancelled = false;
        bool done = false;
        std::string buffered;
        bool finished = false;
    } o;
    bool parked = false;
    auto consumer = l.spawn([](std::stop_token token, outcome& out, bool& waiting) -> task<void> {
        auto [writer, reading] = co_await spindle::test::tcp_kind::make();
        result<void> w = co_await net::write_all(writer, std::string_view("x\nhalf"));
        REQUIRE(w.has_value());
        net::buffered_reader reader(reading);
        auto lines = reader.lines();
        for (;;) {
            waiting = true;
            auto line = co_await lines.next(token);
            waiting = false;
            if (!line) {
                out.cancelled = line.cancelled();
                break;
            }
            out.lines.emplace_back(**line);
        }
        out.done = lines.done();
        out.buffered = spindle::test::text_of(reader.buffered());
        out.finished = true;
    }(stop.get_token(), o, parked));
    REQUIRE(run_until(l, [&] { return o.lines.size() == 1 && parked; }));
    settle(l);
    CHECK_FALSE(consumer.done());
    stop.request_stop();
    REQUIRE(run_until(l, [&] { return consumer.done(); }));
    CHECK(o.finished);
    CHECK(o.lines == std::vector<std::string>{"x\n"});
    CHECK(o.cancelled);
    CHECK(o.done);
    CHECK(o.buffered == "half");
}

TEST_CASE("generator_net: the consumer aborted while lines() reads: every frame goes, once", "[generator_net][lines][lifetime]") {
    counted::alive = 0;
    loop l;
    int seen = 0;
    auto consumer = l.spawn([](int& lines_seen) -> task<void> {
        counted local;
        auto [writer, reading] = co_await spindle::test::tcp_kind::make();
        result<void> w = co_await net::write_all(writer, std::string_view("1\n2\n"));
        REQUIRE(w.has_value());
        net::buffered_reader reader(reading);
        auto lines = reader.lines();
        while (co_await lines.next()) ++lines_seen;
    }(seen));
    REQUIRE(run_until(l, [&] { return seen == 2; }));
    settle(l);
    CHECK_FALSE(consumer.done());
    CHECK(counted::alive == 1);
    consumer.abort();
    CHECK(counted::alive == 0);
    CHECK(consumer.done());
}

TEST_CASE("generator_net: lines() with its token stopped ends at a buffered line, which stays buffered",
          "[generator_net][lines][cancel]") {
    loop l;
    struct outcome {
        std::vector<std::string> lines;
        bool clean_end = false;
        std::string buffered;
        std::vector<std::string> again;
    } o;
    run(l, [](outcome& out) -> task<void> {
        auto [writer, reading] = co_await spindle::test::memory_kind::make();
        result<void> w = co_await net::write_all(writer, std::string_view("1\n2\n3\n"));
        REQUIRE(w.has_value());
        net::basic_buffered_reader reader(reading);
        std::stop_source stop;
        {
            auto lines = reader.lines(stop.get_token());
            auto first = co_await lines.next();
            REQUIRE(first);
            out.lines.emplace_back(**first);
            stop.request_stop();  // "2\n" and "3\n" are buffered: no wait would be needed
            auto next = co_await lines.next();
            out.clean_end = !next && lines.done();
        }
        out.buffered = spindle::test::text_of(reader.buffered());
        writer.close();
        auto more = reader.lines();  // a new one goes on from there
        while (auto line = co_await more.next()) out.again.emplace_back(**line);
    }(o));
    CHECK(o.lines == std::vector<std::string>{"1\n"});
    CHECK(o.clean_end);
    CHECK(o.buffered == "2\n3\n");
    CHECK(o.again == std::vector<std::string>{"2\n", "3\n"});
}
