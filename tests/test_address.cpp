// Socket addresses (spindle/net/address.hpp): parsing and formatting, the
// loopback and wildcard constructors, ports, and the net error category.
// Pure value code: no loop, no socket.

#include "net_support.hpp"

#include <spindle/net/address.hpp>
#include <spindle/net/error.hpp>

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/un.h>

#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

using spindle::net::address;
using spindle::net::address_family;
namespace net = spindle::net;
using namespace std::string_view_literals;

TEST_CASE("address: \"127.0.0.1:8080\" parses and formats back", "[address]") {
    auto a = address::parse("127.0.0.1:8080");
    REQUIRE(a.has_value());
    CHECK(a->family() == address_family::ipv4);
    CHECK(a->port() == 8080);
    CHECK(a->is_loopback());
    CHECK(a->domain() == AF_INET);
    CHECK(a->size() == sizeof(::sockaddr_in));
    CHECK(a->to_string() == "127.0.0.1:8080");
    const auto* in = reinterpret_cast<const ::sockaddr_in*>(a->native());
    CHECK(in->sin_addr.s_addr == htonl(INADDR_LOOPBACK));
    CHECK(ntohs(in->sin_port) == 8080);
    auto again = address::parse(a->to_string());
    REQUIRE(again.has_value());
    CHECK(*again == *a);
}

TEST_CASE("address: \"[::1]:8080\" parses and formats back", "[address]") {
    auto a = address::parse("[::1]:8080");
    REQUIRE(a.has_value());
    CHECK(a->family() == address_family::ipv6);
    CHECK(a->port() == 8080);
    CHECK(a->is_loopback());
    CHECK(a->domain() == AF_INET6);
    CHECK(a->size() == sizeof(::sockaddr_in6));
    CHECK(a->to_string() == "[::1]:8080");
    const auto* in6 = reinterpret_cast<const ::sockaddr_in6*>(a->native());
    CHECK(IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr));
    CHECK(in6->sin6_scope_id == 0u);
    auto again = address::parse(a->to_string());
    REQUIRE(again.has_value());
    CHECK(*again == *a);
}

TEST_CASE("address: longer IPv6 literals format in their canonical short form", "[address]") {
    auto a = address::parse("[2001:db8:0:0:0:0:0:1]:443");
    REQUIRE(a.has_value());
    CHECK(a->to_string() == "[2001:db8::1]:443");
    CHECK_FALSE(a->is_loopback());
    auto mapped = address::parse("[::ffff:127.1.2.3]:7");
    REQUIRE(mapped.has_value());
    CHECK(mapped->family() == address_family::ipv6);
    CHECK(mapped->to_string() == "[::ffff:127.1.2.3]:7");
}

TEST_CASE("address: an IPv6 zone is kept as an interface index", "[address]") {
    auto numeric = address::parse("[fe80::1%1]:80");
    REQUIRE(numeric.has_value());
    CHECK(numeric->to_string() == "[fe80::1%1]:80");
    CHECK(reinterpret_cast<const ::sockaddr_in6*>(numeric->native())->sin6_scope_id == 1u);

    const unsigned lo = ::if_nametoindex("lo");
    if (lo != 0) {
        auto named = address::parse("[fe80::1%lo]:80");
        REQUIRE(named.has_value());
        CHECK(named->to_string() == "[fe80::1%" + std::to_string(lo) + "]:80");
    }
    auto unknown = address::parse("[fe80::1%no-such-interface0]:80");
    REQUIRE_FALSE(unknown.has_value());
    CHECK(unknown.error() == net::errc::invalid_address);
    auto empty_zone = address::parse("[fe80::1%]:80");
    REQUIRE_FALSE(empty_zone.has_value());
    CHECK(empty_zone.error() == net::errc::invalid_address);
}

TEST_CASE("address: \"unix:/tmp/x\" parses and formats back", "[address][unix]") {
    auto a = address::parse("unix:/tmp/x");
    REQUIRE(a.has_value());
    CHECK(a->family() == address_family::unix_path);
    CHECK(a->domain() == AF_UNIX);
    CHECK(a->unix_path() == "/tmp/x");
    CHECK(a->port() == 0);
    CHECK_FALSE(a->is_loopback());
    CHECK(a->to_string() == "unix:/tmp/x");
    // The terminator is part of a path address's length.
    CHECK(a->size() == offsetof(::sockaddr_un, sun_path) + 7);
    CHECK(std::strcmp(reinterpret_cast<const ::sockaddr_un*>(a->native())->sun_path, "/tmp/x") == 0);
    auto again = address::parse(a->to_string());
    REQUIRE(again.has_value());
    CHECK(*again == *a);
}

TEST_CASE("address: \"unix:@abstract\" is an abstract name and formats back with '@'", "[address][unix]") {
    auto a = address::parse("unix:@abstract");
    REQUIRE(a.has_value());
    CHECK(a->family() == address_family::unix_path);
    // The kernel's form: a NUL first, no terminator counted.
    CHECK(a->unix_path() == "\0abstract"sv);
    CHECK(a->size() == offsetof(::sockaddr_un, sun_path) + 9);
    const auto* un = reinterpret_cast<const ::sockaddr_un*>(a->native());
    CHECK(un->sun_path[0] == '\0');
    CHECK(std::string_view(un->sun_path + 1, 8) == "abstract");
    CHECK(a->to_string() == "unix:@abstract");
    auto again = address::parse(a->to_string());
    REQUIRE(again.has_value());
    CHECK(*again == *a);
    // A path and the abstract name spelled alike are different addresses.
    auto path = address::parse("unix:abstract");
    REQUIRE(path.has_value());
    CHECK_FALSE(*path == *a);
}

TEST_CASE("address: from_unix_path bounds the length by sun_path", "[address][unix]") {
    constexpr std::size_t room = sizeof(::sockaddr_un{}.sun_path);
    const std::string longest(room - 1, 'p');
    auto fits = address::from_unix_path(longest);
    REQUIRE(fits.has_value());
    CHECK(fits->unix_path() == longest);
    auto too_long = address::from_unix_path(std::string(room, 'p'));
    REQUIRE_FALSE(too_long.has_value());
    CHECK(too_long.error() == net::errc::invalid_address);
    auto empty = address::from_unix_path("");
    REQUIRE_FALSE(empty.has_value());
    CHECK(empty.error() == net::errc::invalid_address);
    auto embedded_nul = address::from_unix_path("/tmp/a\0b"sv);
    REQUIRE_FALSE(embedded_nul.has_value());
    CHECK(embedded_nul.error() == net::errc::invalid_address);
}

TEST_CASE("address: invalid text is invalid_address", "[address]") {
    const char* inputs[] = {
        "1.2.3.4",        // no port
        "1.2.3.4:99999",  // port out of range
        "1.2.3.4:65536",  // just out of range
        "::1:80",         // unbracketed IPv6 with a port is ambiguous
        "[::1]",          // bracketed without a port
        "[::1]:",         // empty port
        "[::1]80",        // no colon after the bracket
        "[1.2.3.4]:80",   // brackets are for IPv6
        "[::1:80",        // unclosed bracket
        "host:80",        // not numeric: parse never resolves
        "localhost:80",   // not numeric either
        "",               //
        ":80",            // no host
        "1.2.3.4:",       // no port digits
        "1.2.3.4:80x",    // trailing garbage
        "1.2.3.4:+80",    // sign
        "1.2.3.4:-1",     // negative
        "1.2.3.4: 80",    // space
        "256.1.1.1:80",   // octet out of range
        "1.2.3:80",       // three octets
        "unix:",          // empty path
    };
    for (const char* text : inputs) {
        CAPTURE(text);
        auto a = address::parse(text);
        REQUIRE_FALSE(a.has_value());
        CHECK(a.error() == net::errc::invalid_address);
        CHECK(a.error().category() == net::net_category());
    }
}

// Found by fuzzing (tests/fuzz/fuzz_address.cpp): inet_pton reads a C
// string, so a host with a NUL in it was parsed only up to the NUL and the
// rest of the text accepted unread.
TEST_CASE("address: a NUL anywhere in the host is invalid_address", "[address]") {
    for (const std::string_view text : {"127.0.0.1\0:80"sv, "127.0.0.1\0.evil:80"sv, "[::1\0junk]:80"sv,
                                        "[fe80::1%1\0x]:80"sv}) {
        CAPTURE(text);
        auto a = address::parse(text);
        REQUIRE_FALSE(a.has_value());
        CHECK(a.error() == net::errc::invalid_address);
    }
    for (const std::string_view host : {"127.0.0.1\0"sv, "::1\0x"sv, "fe80::1%1\0"sv, "::8\0\0\0\n8"sv}) {
        CAPTURE(host);
        auto a = address::from_ip(host, 80);
        REQUIRE_FALSE(a.has_value());
        CHECK(a.error() == net::errc::invalid_address);
    }
}

TEST_CASE("address: ports 0 and 65535 are valid", "[address]") {
    auto zero = address::parse("127.0.0.9:0");
    REQUIRE(zero.has_value());
    CHECK(zero->port() == 0);
    auto top = address::parse("[::]:65535");
    REQUIRE(top.has_value());
    CHECK(top->port() == 65535);
    CHECK(top->to_string() == "[::]:65535");
    auto padded = address::parse("127.0.0.1:00080");
    REQUIRE(padded.has_value());
    CHECK(padded->port() == 80);
    CHECK(padded->to_string() == "127.0.0.1:80");
}

TEST_CASE("address: from_ip takes a bare numeric host and a port", "[address]") {
    auto v4 = address::from_ip("192.0.2.7", 53);
    REQUIRE(v4.has_value());
    CHECK(v4->to_string() == "192.0.2.7:53");
    auto v6 = address::from_ip("::1", 53);
    REQUIRE(v6.has_value());
    CHECK(v6->to_string() == "[::1]:53");
    for (const char* bad : {"localhost", "[::1]", "1.2.3.4:80", "", "1.2.3.4.5"}) {
        CAPTURE(bad);
        auto r = address::from_ip(bad, 1);
        REQUIRE_FALSE(r.has_value());
        CHECK(r.error() == net::errc::invalid_address);
    }
}

TEST_CASE("address: loopback and wildcard constructors", "[address]") {
    CHECK(address::ipv4_loopback(8080).to_string() == "127.0.0.1:8080");
    CHECK(address::ipv6_loopback(8080).to_string() == "[::1]:8080");
    CHECK(address::ipv4_any(80).to_string() == "0.0.0.0:80");
    CHECK(address::ipv6_any(80).to_string() == "[::]:80");
    CHECK(address::ipv4_loopback().port() == 0);
    CHECK(address::ipv6_any().port() == 0);

    CHECK(address::ipv4_loopback(1).family() == address_family::ipv4);
    CHECK(address::ipv6_loopback(1).family() == address_family::ipv6);
    CHECK(address::ipv4_any(1).family() == address_family::ipv4);
    CHECK(address::ipv6_any(1).family() == address_family::ipv6);

    CHECK(address::ipv4_loopback(8080) == *address::parse("127.0.0.1:8080"));
    CHECK(address::ipv6_loopback(8080) == *address::parse("[::1]:8080"));
    CHECK(address::ipv4_any(9) == *address::parse("0.0.0.0:9"));
    CHECK(address::ipv6_any(9) == *address::parse("[::]:9"));
    CHECK_FALSE(address::ipv4_loopback(8080) == address::ipv4_loopback(8081));
    CHECK_FALSE(address::ipv4_loopback(8080) == address::ipv6_loopback(8080));
}

TEST_CASE("address: is_loopback covers 127/8 and ::1 only", "[address]") {
    CHECK(address::ipv4_loopback().is_loopback());
    CHECK(address::ipv6_loopback().is_loopback());
    CHECK(address::parse("127.255.0.1:1")->is_loopback());
    CHECK(address::parse("127.0.0.2:1")->is_loopback());
    CHECK_FALSE(address::parse("128.0.0.1:1")->is_loopback());
    CHECK_FALSE(address::parse("192.0.2.1:1")->is_loopback());
    CHECK_FALSE(address::ipv4_any().is_loopback());
    CHECK_FALSE(address::ipv6_any().is_loopback());
    CHECK_FALSE(address::parse("[::2]:1")->is_loopback());
    CHECK_FALSE(address::parse("unix:/tmp/x")->is_loopback());
    CHECK_FALSE(address().is_loopback());
}

TEST_CASE("address: set_port changes IP ports and leaves others alone", "[address]") {
    address v4 = address::ipv4_loopback(1);
    v4.set_port(65535);
    CHECK(v4.port() == 65535);
    CHECK(v4.to_string() == "127.0.0.1:65535");
    address v6 = address::ipv6_loopback(1);
    v6.set_port(443);
    CHECK(v6.to_string() == "[::1]:443");
    address un = *address::parse("unix:/tmp/x");
    const address before = un;
    un.set_port(80);
    CHECK(un.port() == 0);
    CHECK(un == before);
}

TEST_CASE("address: an empty address has no family, port or text", "[address]") {
    address a;
    CHECK(a.family() == address_family::none);
    CHECK(a.port() == 0);
    CHECK(a.size() == 0u);
    CHECK(a.to_string().empty());
    CHECK(a.unix_path().empty());
    CHECK(a == address());
    CHECK_FALSE(a == address::ipv4_any());
}

TEST_CASE("address: from_native copies what accept or getsockname reported", "[address]") {
    ::sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_port = htons(4242);
    REQUIRE(::inet_pton(AF_INET, "192.0.2.1", &in.sin_addr) == 1);
    address a = address::from_native(reinterpret_cast<const ::sockaddr*>(&in), sizeof in);
    CHECK(a.family() == address_family::ipv4);
    CHECK(a.to_string() == "192.0.2.1:4242");
    CHECK(a == *address::parse("192.0.2.1:4242"));

    address copy = address::from_native(a.native(), a.size());
    CHECK(copy == a);
    CHECK(address::from_native(nullptr, 16).family() == address_family::none);

    // recvfrom-style: fill native() up to capacity(), then set_size().
    address filled;
    std::memcpy(filled.native(), &in, sizeof in);
    filled.set_size(sizeof in);
    CHECK(filled == a);
    CHECK(address::capacity() == sizeof(::sockaddr_storage));
}

TEST_CASE("net errors: a category of their own, compared with net::errc", "[address][errors]") {
    std::error_code ec = net::errc::invalid_address;
    CHECK(ec == net::errc::invalid_address);
    CHECK_FALSE(ec == net::errc::end_of_stream);
    CHECK(std::string(ec.category().name()) == "spindle.net");
    CHECK(ec.message() == "invalid address");
    CHECK(std::error_code(net::errc::end_of_stream).message() == "end of stream");
    CHECK(std::error_code(net::errc::line_too_long).message() == "line too long");
    CHECK(std::error_code(net::errc::datagram_truncated).message() == "datagram truncated");
    CHECK(std::error_code(net::errc::resolve_failed).message() == "name resolution failed");
    // Not an OS error: no std::errc compares equal to it.
    CHECK_FALSE(ec == std::errc::invalid_argument);
    CHECK(bool(ec));
}
