// UDP sockets (spindle/net/udp.hpp) on loopback: datagrams with their
// sender, truncation reported as an error, connected sockets, and deadlines
// on receives.

#include "net_support.hpp"

#include <spindle/net/udp.hpp>

#include <array>
#include <chrono>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>
#include <vector>

using namespace std::chrono_literals;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::with_timeout;
using spindle::test::bytes_of;
using spindle::test::run;
using spindle::test::text_of;
using steady = std::chrono::steady_clock;
namespace net = spindle::net;

namespace {

net::udp_socket bind_loopback() {
    auto s = net::udp_socket::bind(net::address::ipv4_loopback(0));
    REQUIRE(s.has_value());
    return std::move(*s);
}

net::address local_of(const net::socket_base& s) {
    auto a = s.local_address();
    REQUIRE(a.has_value());
    return *a;
}

struct round_trip_state {
    std::size_t sent = 0;
    std::string got;
    net::address from;
    std::string reply;
    net::address reply_from;
};

task<void> round_trip_main(net::udp_socket& a, net::udp_socket& b, round_trip_state& s) {
    const net::address b_addr = local_of(b);
    result<std::size_t> n = co_await a.send_to(bytes_of("ping"), b_addr);
    REQUIRE(n.has_value());
    s.sent = *n;
    std::array<std::byte, 64> buf{};
    n = co_await b.recv_from(buf, s.from);
    REQUIRE(n.has_value());
    s.got = text_of(std::span(buf).first(*n));
    // Answer the sender at the address the datagram came from; this time the
    // receiver is parked before the datagram is sent.
    auto answer = loop::current().spawn([](net::udp_socket& b, net::address to) -> task<void> {
        (void)co_await spindle::sleep_for(10ms);
        result<std::size_t> n = co_await b.send_to(bytes_of("pong!"), to);
        REQUIRE(n.has_value());
    }(b, s.from));
    n = co_await a.recv_from(buf, s.reply_from);
    REQUIRE(n.has_value());
    s.reply = text_of(std::span(buf).first(*n));
    co_await answer;
}

struct truncation_state {
    std::error_code error;
    std::string head;
    net::address from;
    std::string next;
    std::size_t empty_size = 99;
};

task<void> truncation_main(net::udp_socket& a, net::udp_socket& b, truncation_state& s) {
    const net::address b_addr = local_of(b);
    const std::string big = "0123456789abcdefghijklmnopqrstuvwxyz";
    result<std::size_t> n = co_await a.send_to(bytes_of(big), b_addr);
    REQUIRE(n.has_value());
    REQUIRE(*n == big.size());
    n = co_await a.send_to(bytes_of("fits"), b_addr);
    REQUIRE(n.has_value());
    n = co_await a.send_to(std::span<const std::byte>(), b_addr);
    REQUIRE(n.has_value());

    std::array<std::byte, 10> small{};
    n = co_await b.recv_from(small, s.from);
    s.error = n.error();
    s.head = text_of(small);
    // The truncated datagram is gone; the next one comes whole.
    n = co_await b.recv_from(small, s.from);
    REQUIRE(n.has_value());
    s.next = text_of(std::span(small).first(*n));
    // An empty datagram is a datagram of size 0, not an end of stream.
    net::address from;
    n = co_await b.recv_from(small, from);
    REQUIRE(n.has_value());
    s.empty_size = *n;
}

struct connected_state {
    std::string a_got;
    std::string b_got;
    std::string after_stranger;
};

task<void> connected_main(net::udp_socket& a, net::udp_socket& b, net::udp_socket& stranger, connected_state& s) {
    std::array<std::byte, 64> buf{};
    result<std::size_t> n = co_await a.send(bytes_of("to b"));
    REQUIRE(n.has_value());
    n = co_await b.recv(buf);
    REQUIRE(n.has_value());
    s.b_got = text_of(std::span(buf).first(*n));
    n = co_await b.send(bytes_of("to a"));
    REQUIRE(n.has_value());
    n = co_await a.recv(buf);
    REQUIRE(n.has_value());
    s.a_got = text_of(std::span(buf).first(*n));
    // A connected socket hears only its peer: the stranger's datagram is
    // dropped by the kernel, the peer's that follows it arrives.
    n = co_await stranger.send_to(bytes_of("stranger"), local_of(b));
    REQUIRE(n.has_value());
    n = co_await a.send(bytes_of("peer again"));
    REQUIRE(n.has_value());
    n = co_await b.recv(buf);
    REQUIRE(n.has_value());
    s.after_stranger = text_of(std::span(buf).first(*n));
}

struct timeout_state {
    bool has_value = true;
    std::error_code error;
    steady::duration elapsed{};
    std::string later;
    net::address later_from;
    std::error_code cancelled;
};

task<void> recv_timeout_main(net::udp_socket& a, net::udp_socket& b, timeout_state& s) {
    std::array<std::byte, 64> buf{};
    net::address from;
    const auto start = steady::now();
    result<std::size_t> n = co_await with_timeout(50ms, b.recv_from(buf, from));
    s.elapsed = steady::now() - start;
    s.has_value = n.has_value();
    s.error = n.error();
    // The socket is still good for the next datagram.
    n = co_await a.send_to(bytes_of("after the deadline"), local_of(b));
    REQUIRE(n.has_value());
    n = co_await with_timeout(10s, b.recv_from(buf, s.later_from));
    REQUIRE(n.has_value());
    s.later = text_of(std::span(buf).first(*n));
    // A stop_token cancels a receive too.
    std::stop_source stop;
    auto stopper = loop::current().spawn([](std::stop_source& st) -> task<void> {
        (void)co_await spindle::sleep_for(10ms);
        st.request_stop();
    }(stop));
    n = co_await b.recv_from(buf, from, stop.get_token());
    s.cancelled = n.error();
    co_await stopper;
}

struct unbound_state {
    net::address from;
    std::string got;
};

task<void> unbound_main(net::udp_socket& sender, net::udp_socket& b, unbound_state& s) {
    result<std::size_t> n = co_await sender.send_to(bytes_of("from nowhere"), local_of(b));
    REQUIRE(n.has_value());
    std::array<std::byte, 64> buf{};
    n = co_await b.recv_from(buf, s.from);
    REQUIRE(n.has_value());
    s.got = text_of(std::span(buf).first(*n));
}

}  // namespace

// =====================================================================================

TEST_CASE("udp: send_to and recv_from round trip, with the sender's address", "[udp]") {
    round_trip_state s;
    loop l;
    net::udp_socket a = bind_loopback();
    net::udp_socket b = bind_loopback();
    run(l, round_trip_main(a, b, s));
    CHECK(s.sent == 4u);
    CHECK(s.got == "ping");
    CHECK(s.from == local_of(a));
    CHECK(s.from.family() == net::address_family::ipv4);
    CHECK(s.from.is_loopback());
    CHECK(s.reply == "pong!");
    CHECK(s.reply_from == local_of(b));
}

TEST_CASE("udp: a datagram larger than the buffer is datagram_truncated", "[udp]") {
    truncation_state s;
    loop l;
    net::udp_socket a = bind_loopback();
    net::udp_socket b = bind_loopback();
    run(l, truncation_main(a, b, s));
    CHECK(s.error == net::errc::datagram_truncated);
    CHECK(s.head == "0123456789");  // the buffer holds the datagram's first bytes
    CHECK(s.from == local_of(a));   // and the sender is known even so
    CHECK(s.next == "fits");
    CHECK(s.empty_size == 0u);
}

TEST_CASE("udp: connected sockets send and recv without addresses and hear only their peer", "[udp]") {
    connected_state s;
    loop l;
    net::udp_socket a = bind_loopback();
    net::udp_socket b = bind_loopback();
    net::udp_socket stranger = bind_loopback();
    REQUIRE(a.connect(local_of(b)).has_value());
    REQUIRE(b.connect(local_of(a)).has_value());
    run(l, connected_main(a, b, stranger, s));
    CHECK(s.b_got == "to b");
    CHECK(s.a_got == "to a");
    CHECK(s.after_stranger == "peer again");
}

TEST_CASE("udp: with_timeout on recv_from is timed_out and leaves the socket usable", "[udp][timeout]") {
    timeout_state s;
    loop l;
    net::udp_socket a = bind_loopback();
    net::udp_socket b = bind_loopback();
    run(l, recv_timeout_main(a, b, s));
    CHECK_FALSE(s.has_value);
    CHECK(s.error == std::errc::timed_out);
    CHECK(s.elapsed >= 50ms);
    CHECK(s.later == "after the deadline");
    CHECK(s.later_from == local_of(a));
    CHECK(s.cancelled == std::errc::operation_canceled);
}

TEST_CASE("udp: an unbound socket is bound by the kernel on its first send", "[udp]") {
    unbound_state s;
    loop l;
    auto sender = net::udp_socket::open(net::address_family::ipv4);
    REQUIRE(sender.has_value());
    net::udp_socket b = bind_loopback();
    run(l, unbound_main(*sender, b, s));
    CHECK(s.got == "from nowhere");
    CHECK(s.from.is_loopback());
    CHECK(s.from.port() != 0);
    // Bound to the wildcard address; the datagram came from loopback.
    CHECK(local_of(*sender) == net::address::ipv4_any(s.from.port()));
}

TEST_CASE("udp: round trip over IPv6 loopback", "[udp][ipv6]") {
    auto a = net::udp_socket::bind(net::address::ipv6_loopback(0));
    if (!a) NET_SKIP("no IPv6 loopback here: " << a.error().message());
    auto b = net::udp_socket::bind(net::address::ipv6_loopback(0));
    REQUIRE(b.has_value());
    round_trip_state s;
    loop l;
    run(l, round_trip_main(*a, *b, s));
    CHECK(s.got == "ping");
    CHECK(s.from.family() == net::address_family::ipv6);
    CHECK(s.from == local_of(*a));
    CHECK(s.from.to_string().rfind("[::1]:", 0) == 0);
    CHECK(s.reply == "pong!");
}

TEST_CASE("udp: bind errors", "[udp]") {
    auto none = net::udp_socket::bind(net::address());
    REQUIRE_FALSE(none.has_value());
    CHECK(none.error() == net::errc::invalid_address);
    net::udp_socket first = bind_loopback();
    auto taken = net::udp_socket::bind(local_of(first));
    REQUIRE_FALSE(taken.has_value());
    CHECK(taken.error() == std::errc::address_in_use);
    // With SO_REUSEPORT on both, two sockets share a port.
    net::udp_options shared;
    shared.reuse_port = true;
    auto one = net::udp_socket::bind(net::address::ipv4_loopback(0), shared);
    REQUIRE(one.has_value());
    auto two = net::udp_socket::bind(local_of(*one), shared);
    REQUIRE(two.has_value());
    CHECK(local_of(*two) == local_of(*one));
}
