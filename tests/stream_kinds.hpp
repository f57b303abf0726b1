#pragma once
// The kinds of byte stream a generic test body runs over: each makes a
// connected pair inside a task. memory_stream needs no descriptor; unix_stream
// is a socketpair; tcp_stream is a connection on IPv4 loopback.

#include "catch.hpp"

#include <spindle/net/memory_stream.hpp>
#include <spindle/net/tcp.hpp>
#include <spindle/net/unix.hpp>
#include <spindle/result.hpp>
#include <spindle/task.hpp>

#include <utility>

// Catch's assertions repeat their expression (once inside
// __builtin_constant_p, where co_await cannot appear): await first, then check.
#define REQUIRE_OK(...)                    \
    do {                                   \
        const auto awaited_ = __VA_ARGS__; \
        REQUIRE(awaited_.has_value());     \
    } while (false)
#define CHECK_ERROR(awaitable, expected)       \
    do {                                       \
        const auto awaited_ = awaitable;       \
        CHECK(awaited_.error() == (expected)); \
    } while (false)

namespace spindle::test {

struct memory_kind {
    using stream = net::memory_stream;
    static constexpr const char* name = "memory_stream";
    static task<std::pair<stream, stream>> make() { co_return net::memory_stream::pair(); }
};

struct unix_kind {
    using stream = net::unix_stream;
    static constexpr const char* name = "unix_stream";
    static task<std::pair<stream, stream>> make() {
        auto p = net::unix_stream::pair();
        REQUIRE(p.has_value());
        co_return std::move(*p);
    }
};

struct tcp_kind {
    using stream = net::tcp_stream;
    static constexpr const char* name = "tcp_stream";
    static task<std::pair<stream, stream>> make() {
        auto l = net::tcp_listener::bind(net::address::ipv4_loopback(0));
        REQUIRE(l.has_value());
        auto at = l->local_address();
        REQUIRE(at.has_value());
        // On loopback the kernel completes the handshake before the accept.
        result<net::tcp_stream> client = co_await net::tcp_stream::connect(*at);
        REQUIRE(client.has_value());
        result<net::tcp_stream> server = co_await l->accept();
        REQUIRE(server.has_value());
        co_return std::pair{std::move(*client), std::move(*server)};
    }
};

}  // namespace spindle::test
