// TLS (spindle/tls.hpp): contexts and their errors, the handshake and bulk
// transfer over every kind of byte stream, versions, ALPN, resumption,
// verification failures, faults from the peer (plain HTTP, garbage, a stall,
// a reset, a truncation), a read and a write in flight at once across a
// KeyUpdate, a thousand connections at once, and no allocation per record.
// Certificates are made while the tests run (tls_support.hpp).

#include "child_process.hpp"
#include "counting_new.hpp"
#include "net_support.hpp"
#include "stream_kinds.hpp"
#include "support.hpp"
#include "tls_support.hpp"

#include <spindle/net/buffered_reader.hpp>
#include <spindle/net/write.hpp>
#include <spindle/tls.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using spindle::join_handle;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::test::bytes_of;
using spindle::test::fill_pattern;
using spindle::test::pattern_mismatch;
using spindle::test::run;
using spindle::test::test_pki;
using spindle::test::text_of;
namespace net = spindle::net;
namespace tls = spindle::tls;

// --- allocations ------------------------------------------------------------------------

#if SPINDLE_FRAME_POOL
using spindle::test::t_allocations;
using spindle::test::t_counting;
#endif

namespace {

static_assert(net::byte_stream<tls::stream<net::tcp_stream>>);
static_assert(net::byte_stream<tls::stream<net::memory_stream>>);
static_assert(net::detail::shuts_down_by_operation<tls::tcp_stream>);

tls::context_options server_options(const spindle::test::pem_pair& pair = test_pki::get().server) {
    tls::context_options o;
    o.certificate_pem = pair.certificate;
    o.private_key_pem = pair.key;
    return o;
}

tls::context_options client_options() {
    tls::context_options o;
    o.ca_pem = test_pki::get().ca;
    return o;
}

tls::context make_server(const tls::context_options& o = server_options()) {
    result<tls::context> c = tls::context::server(o);
    if (!c) FAIL("server context: " << c.error().message());
    return *c;
}

tls::context make_client(const tls::context_options& o = client_options()) {
    result<tls::context> c = tls::context::client(o);
    if (!c) FAIL("client context: " << c.error().message());
    return *c;
}

template <class S>
struct tls_pair {
    tls::stream<S> client;
    tls::stream<S> server;
    result<void> client_handshake = std::make_error_code(std::errc::not_connected);
    result<void> server_handshake = std::make_error_code(std::errc::not_connected);
};

/// A connected pair of `Kind`'s streams, each wrapped and handshaken (both
/// sides at once); the outcomes are in the pair.
template <class Kind>
task<tls_pair<typename Kind::stream>> handshake_pair(tls::context client_ctx, tls::context server_ctx,
                                                     std::string server_name = "localhost") {
    using S = typename Kind::stream;
    auto [a, b] = co_await Kind::make();
    result<tls::stream<S>> c = tls::stream<S>::client(client_ctx, std::move(a), server_name);
    REQUIRE(c.has_value());
    result<tls::stream<S>> s = tls::stream<S>::server(server_ctx, std::move(b));
    REQUIRE(s.has_value());
    tls_pair<S> p{std::move(*c), std::move(*s)};
    join_handle<result<void>> server_side = loop::current().spawn(p.server.handshake());
    p.client_handshake = co_await p.client.handshake();
    if (!p.client_handshake) p.client.close();  // the server sees the end at once
    p.server_handshake = co_await server_side;
    co_return std::move(p);
}

/// Writes `total` bytes of pattern `seed`, in writes of varying size.
template <class S>
task<result<void>> write_pattern(S& s, std::uint64_t seed, std::size_t total) {
    std::vector<std::byte> chunk(100'000);
    std::size_t sent = 0;
    for (std::size_t round = 0; sent < total; ++round) {
        const std::size_t n = std::min(total - sent, 1 + (round * 7919) % chunk.size());
        fill_pattern(std::span(chunk).first(n), seed, sent);
        if (result<void> w = co_await s.write_all(std::span<const std::byte>(chunk).first(n)); !w) co_return w;
        sent += n;
    }
    co_return result<void>{};
}

/// Reads `total` bytes and checks each against pattern `seed`: the count of
/// bytes that were right before the first wrong one (total if none).
template <class S>
task<result<std::size_t>> read_pattern(S& s, std::uint64_t seed, std::size_t total) {
    std::vector<std::byte> buf(64 * 1024);
    std::size_t got = 0;
    while (got < total) {
        result<std::size_t> n = co_await s.read_some(std::span(buf).first(std::min(buf.size(), total - got)));
        if (!n) co_return n.error();
        if (*n == 0) co_return std::make_error_code(std::errc::connection_aborted);
        const std::size_t bad = pattern_mismatch(std::span(buf).first(*n), seed, got);
        if (bad != std::string::npos) co_return got + bad;
        got += *n;
    }
    co_return got;
}

}  // namespace

// --- contexts -------------------------------------------------------------------------------

TEST_CASE("tls context: bad certificates, keys and files are clear errors", "[tls][context]") {
    const test_pki& pki = test_pki::get();
    SECTION("a server needs a certificate") {
        result<tls::context> c = tls::context::server({});
        REQUIRE_FALSE(c.has_value());
        CHECK(c.error() == tls::errc::wrong_context);
    }
    SECTION("a missing file is the OS's error") {
        tls::context_options o;
        o.certificate_file = "/nonexistent/spindle/cert.pem";
        o.private_key_file = "/nonexistent/spindle/key.pem";
        result<tls::context> c = tls::context::server(o);
        REQUIRE_FALSE(c.has_value());
        CHECK(c.error() == std::errc::no_such_file_or_directory);
    }
    SECTION("text that is not PEM says so") {
        tls::context_options o;
        o.certificate_pem = "not a certificate";
        o.private_key_pem = pki.server.key;
        result<tls::context> c = tls::context::server(o);
        REQUIRE_FALSE(c.has_value());
        CAPTURE(c.error().message());
        CHECK(c.error().category() == tls::tls_category());
        CHECK(c.error().message().find("no start line") != std::string::npos);
    }
    SECTION("a key that is not the certificate's") {
        tls::context_options o = server_options();
        o.private_key_pem = pki.client.key;
        result<tls::context> c = tls::context::server(o);
        REQUIRE_FALSE(c.has_value());
        CAPTURE(c.error().message());
        CHECK(c.error().message().find("key values mismatch") != std::string::npos);
    }
    SECTION("a client context from the system store, and a server context made right") {
        result<tls::context> client = tls::context::client({});
        REQUIRE(client.has_value());
        CHECK_FALSE(client->is_server());
        result<tls::context> server = tls::context::server(server_options());
        REQUIRE(server.has_value());
        CHECK(server->is_server());
        // Streams of the wrong side are refused.
        auto [a, b] = net::memory_stream::pair();
        CHECK(tls::stream<net::memory_stream>::client(*server, std::move(a), "localhost").error() == tls::errc::wrong_context);
        CHECK(tls::stream<net::memory_stream>::server(*client, std::move(b)).error() == tls::errc::wrong_context);
    }
    SECTION("options that do not fit together are named") {
        tls::context_options key_alone;
        key_alone.private_key_pem = pki.server.key;
        CHECK(tls::context::client(key_alone).error() == tls::errc::certificate_without_key);
        tls::context_options both = server_options();
        both.certificate_file = "/nonexistent/spindle/cert.pem";
        CHECK(tls::context::server(both).error() == tls::errc::file_and_pem);
        tls::context_options no_ca = server_options();
        no_ca.require_client_certificate = true;
        CHECK(tls::context::server(no_ca).error() == tls::errc::client_certificate_without_ca);
        tls::context_options versions = server_options();
        versions.min_version = tls::version::tls1_3;
        versions.max_version = tls::version::tls1_2;
        CHECK(tls::context::server(versions).error() == tls::errc::no_version);
        tls::context_options alpn = client_options();
        alpn.alpn = {"http/1.1", ""};
        result<tls::context> bad_alpn = tls::context::client(alpn);
        REQUIRE_FALSE(bad_alpn.has_value());
        CHECK(bad_alpn.error() == tls::errc::bad_alpn_name);
        CHECK(bad_alpn.error().message() == "an ALPN protocol name must be 1 to 255 bytes");
    }
    SECTION("a verifying client needs the server's name") {
        auto [a, b] = net::memory_stream::pair();
        CHECK(tls::stream<net::memory_stream>::client(make_client(), std::move(a), "").error() == tls::errc::server_name_required);
    }
}

// --- handshake and bulk ----------------------------------------------------------------------

TEMPLATE_TEST_CASE("tls: handshake, then data both ways at once, every byte checked", "[tls][bulk]", spindle::test::memory_kind,
                   spindle::test::unix_kind, spindle::test::tcp_kind) {
    loop l;
    // 64 MiB each way over TCP; the other kinds carry less, the same code.
    const std::size_t total = std::is_same_v<TestType, spindle::test::tcp_kind> ? 64u << 20 : 4u << 20;
    run(
        l,
        [](std::size_t total) -> task<void> {
            auto p = co_await handshake_pair<TestType>(make_client(), make_server());
            REQUIRE(p.client_handshake.has_value());
            REQUIRE(p.server_handshake.has_value());
            CHECK(p.client.protocol_version() == "TLSv1.3");
            CHECK(p.server.handshake_done());
            // Four tasks: each side writes its pattern while reading the other's.
            auto& loop_ = loop::current();
            auto c_write = loop_.spawn(write_pattern(p.client, 1, total));
            auto s_write = loop_.spawn(write_pattern(p.server, 2, total));
            auto c_read = loop_.spawn(read_pattern(p.client, 2, total));
            result<std::size_t> s_got = co_await read_pattern(p.server, 1, total);
            result<std::size_t> c_got = co_await c_read;
            result<void> cw = co_await c_write;
            result<void> sw = co_await s_write;
            REQUIRE(cw.has_value());
            REQUIRE(sw.has_value());
            REQUIRE(s_got.has_value());
            REQUIRE(c_got.has_value());
            CHECK(*s_got == total);
            CHECK(*c_got == total);
            // The orderly end: the server's shutdown waits for the client's
            // close_notify, which the client's read of end of stream answers.
            auto s_done = loop_.spawn(p.server.shutdown());
            std::array<std::byte, 16> tail;
            result<std::size_t> eos = co_await p.client.read_some(tail);
            REQUIRE(eos.has_value());
            CHECK(*eos == 0);
            REQUIRE_OK(co_await p.client.shutdown());
            REQUIRE_OK(co_await s_done);
        }(total),
        300s);
}

/// As read_pattern, through read_borrowed: the bytes in lent buffers.
template <class S>
task<result<std::size_t>> read_pattern_borrowed(S& s, std::uint64_t seed, std::size_t total) {
    std::size_t got = 0;
    while (got < total) {
        result<spindle::borrowed_buffer> b = co_await s.read_borrowed();
        if (!b) co_return b.error();
        if (b->empty()) co_return std::make_error_code(std::errc::connection_aborted);
        REQUIRE(b->size() <= 16u * 1024);
        const std::size_t bad = pattern_mismatch(b->bytes(), seed, got);
        if (bad != std::string::npos) co_return got + bad;
        got += b->size();
    }
    co_return got;
}

TEMPLATE_TEST_CASE("tls: read_borrowed lends the plaintext, every byte checked; an idle stream holds no buffer",
                   "[tls][borrowed]", spindle::test::memory_kind, spindle::test::tcp_kind) {
    loop l;
    const std::size_t total = 8u << 20;
    run(
        l,
        [](std::size_t total) -> task<void> {
            auto p = co_await handshake_pair<TestType>(make_client(), make_server());
            REQUIRE(p.client_handshake.has_value());
            REQUIRE(p.server_handshake.has_value());
            auto& loop_ = loop::current();
            auto c_write = loop_.spawn(write_pattern(p.client, 3, total));
            result<std::size_t> s_got = co_await read_pattern_borrowed(p.server, 3, total);
            REQUIRE_OK(co_await c_write);
            REQUIRE(s_got.has_value());
            CHECK(*s_got == total);
            // A request and its answer, then both sides wait.
            REQUIRE_OK(co_await p.server.write_all(std::as_bytes(std::span(std::string_view("pong")))));
            std::array<std::byte, 16> in;
            result<std::size_t> n = co_await p.client.read_some(in);
            REQUIRE(n.has_value());
            CHECK(*n == 4);
            auto parked = loop_.spawn(p.server.read_borrowed());
            (void)co_await spindle::sleep_for(20ms);
            if constexpr (std::is_same_v<TestType, spindle::test::tcp_kind>) {
                // Over a socket the ciphertext waits in the kernel, the
                // plaintext in nothing: a parked read holds no buffer.
                CHECK(p.server.buffers_held() == 0);
                CHECK(p.client.buffers_held() == 0);
            } else {
                // A memory stream lends nothing: the input buffer stays.
                CHECK(p.server.buffers_held() == tls::detail::session::input_capacity);
            }
            REQUIRE_OK(co_await p.client.write_all(std::as_bytes(std::span(std::string_view("ping")))));
            result<spindle::borrowed_buffer> b = co_await parked;
            REQUIRE(b.has_value());
            CHECK(std::string_view(reinterpret_cast<const char*>(b->data()), b->size()) == "ping");
            b->reset();
            // End of stream reads as an empty buffer.
            auto s_done = loop_.spawn(p.server.read_borrowed());
            REQUIRE_OK(co_await p.client.shutdown_write());
            result<spindle::borrowed_buffer> eos = co_await s_done;
            REQUIRE(eos.has_value());
            CHECK(eos->empty());
        }(total),
        120s);
}

TEST_CASE("tls: TLS 1.2 and 1.3, ALPN, and resumption on a second connection", "[tls][versions]") {
    loop l;
    run(
        l,
        []() -> task<void> {
            for (tls::version v : {tls::version::tls1_2, tls::version::tls1_3}) {
                tls::context_options so = server_options();
                so.max_version = v;
                so.alpn = {"h2", "http/1.1"};
                tls::context server = make_server(so);
                tls::context_options co = client_options();
                co.alpn = {"spdy/1", "http/1.1"};
                tls::context client = make_client(co);
                for (int round = 0; round < 2; ++round) {
                    auto p = co_await handshake_pair<spindle::test::tcp_kind>(client, server);
                    REQUIRE(p.client_handshake.has_value());
                    REQUIRE(p.server_handshake.has_value());
                    CHECK(p.client.protocol_version() == (v == tls::version::tls1_2 ? "TLSv1.2" : "TLSv1.3"));
                    CHECK(p.client.alpn() == "http/1.1");
                    CHECK(p.server.alpn() == "http/1.1");
                    CHECK(p.client.resumed() == (round == 1));
                    CHECK(p.server.resumed() == (round == 1));
                    // A TLS 1.3 ticket arrives after the handshake: reading
                    // something takes it in.
                    REQUIRE_OK(co_await net::write_all(p.server, "hello"));
                    std::array<std::byte, 5> five;
                    result<std::size_t> n = co_await p.client.read_some(five);
                    REQUIRE(n.has_value());
                    CHECK(text_of(std::span(five).first(*n)) == "hello");
                    CHECK(client.cached_sessions() == 1);
                }
            }
            // No protocol in common: the server refuses (RFC 7301).
            tls::context_options so = server_options();
            so.alpn = {"http/1.1"};
            tls::context_options co = client_options();
            co.alpn = {"imap"};
            auto p = co_await handshake_pair<spindle::test::tcp_kind>(make_client(co), make_server(so));
            REQUIRE_FALSE(p.server_handshake.has_value());
            REQUIRE_FALSE(p.client_handshake.has_value());
            CAPTURE(p.server_handshake.error().message(), p.client_handshake.error().message());
            CHECK(p.client_handshake.error().message().find("no application protocol") != std::string::npos);
        }(),
        60s);
}

TEST_CASE("tls: a certificate that does not verify fails the client with its reason", "[tls][verify]") {
    loop l;
    run(
        l,
        []() -> task<void> {
            const test_pki& pki = test_pki::get();
            struct case_ {
                const char* what;
                spindle::test::pem_pair server;
                std::string name;
                const char* reason;
            };
            const std::vector<case_> cases = {
                {"hostname mismatch", pki.server, "wrong.example", "hostname mismatch"},
                {"expired", pki.expired, "localhost", "certificate has expired"},
                {"untrusted CA", pki.stranger, "localhost", "unable to get local issuer certificate"},
                {"an address not in the certificate", pki.server, "127.0.0.2", "IP address mismatch"},
            };
            for (const case_& c : cases) {
                CAPTURE(c.what);
                auto p = co_await handshake_pair<spindle::test::tcp_kind>(make_client(),
                                                                          make_server(server_options(c.server)),
                                                                          c.name);
                REQUIRE_FALSE(p.client_handshake.has_value());
                CAPTURE(p.client_handshake.error().message());
                CHECK(p.client_handshake.error() == tls::errc::certificate_verify_failed);
                CHECK(p.client_handshake.error().message().find(c.reason) != std::string::npos);
                // The server hears why (the client's alert).
                REQUIRE_FALSE(p.server_handshake.has_value());
            }
            // The address it is for verifies; so does a self-signed certificate
            // that is trusted itself.
            auto by_address =
                co_await handshake_pair<spindle::test::tcp_kind>(make_client(), make_server(), "127.0.0.1");
            CHECK(by_address.client_handshake.has_value());
            // Verification off (tests only): the stranger is let in.
            tls::context_options off;
            off.verify_peer = false;
            auto unchecked = co_await handshake_pair<spindle::test::tcp_kind>(make_client(off),
                                                                              make_server(server_options(pki.stranger)),
                                                                              "");
            CHECK(unchecked.client_handshake.has_value());
        }(),
        60s);
}

TEST_CASE("tls: a server that requires a client certificate", "[tls][verify]") {
    loop l;
    run(
        l,
        []() -> task<void> {
            tls::context_options so = server_options();
            so.ca_pem = test_pki::get().ca;
            so.require_client_certificate = true;
            tls::context server = make_server(so);
            auto without = co_await handshake_pair<spindle::test::tcp_kind>(make_client(), server);
            // TLS 1.3: the client's handshake ends before the server has checked;
            // the server refuses, and the client learns it on its first read.
            REQUIRE_FALSE(without.server_handshake.has_value());
            CAPTURE(without.server_handshake.error().message());
            CHECK(without.server_handshake.error().message().find("certificate") != std::string::npos);
            tls::context_options co = client_options();
            co.certificate_pem = test_pki::get().client.certificate;
            co.private_key_pem = test_pki::get().client.key;
            auto with = co_await handshake_pair<spindle::test::tcp_kind>(make_client(co), server);
            CHECK(with.client_handshake.has_value());
            CHECK(with.server_handshake.has_value());
        }(),
        60s);
}

// --- faults ------------------------------------------------------------------------------------

namespace {

/// A server on loopback that handshakes and echoes each connection, counting
/// what its handshakes ended with; it keeps serving whatever a client does.
struct echo_server {
    tls::context ctx;
    net::tcp_listener listener;
    std::vector<std::error_code> failures;
    int served = 0;

    explicit echo_server(tls::context c) : ctx(std::move(c)) {
        result<net::tcp_listener> l = net::tcp_listener::bind(net::address::ipv4_loopback(0));
        REQUIRE(l.has_value());
        listener = std::move(*l);
    }
    net::address address() const { return *listener.local_address(); }

    task<void> connection(net::tcp_stream tcp) {
        result<tls::tcp_stream> s = tls::tcp_stream::server(ctx, std::move(tcp));
        REQUIRE(s.has_value());
        if (result<void> h = co_await s->handshake(); !h) {
            failures.push_back(h.error());
            co_return;
        }
        std::array<std::byte, 4096> buf;
        for (;;) {
            result<std::size_t> n = co_await s->read_some(buf);
            if (!n) {
                failures.push_back(n.error());
                co_return;
            }
            if (*n == 0) break;
            if (!co_await s->write_all(std::span(buf).first(*n))) co_return;
        }
        ++served;
        (void)co_await s->shutdown();
    }

    /// Accepts `count` connections, serving each as its own task, and waits
    /// for them all.
    task<void> serve(int count) {
        std::vector<join_handle<void>> running;
        for (int i = 0; i < count; ++i) {
            result<net::tcp_stream> tcp = co_await listener.accept();
            REQUIRE(tcp.has_value());
            running.push_back(loop::current().spawn(connection(std::move(*tcp))));
        }
        for (auto& r : running) co_await r;
    }
};

/// A TLS client that sends `text`, reads its echo and ends politely.
task<result<std::string>> echo_once(tls::context ctx, net::address at, std::string text) {
    result<tls::tcp_stream> s = co_await tls::connect(ctx, at, "localhost");
    if (!s) co_return s.error();
    if (result<void> w = co_await net::write_all(*s, text); !w) co_return w.error();
    std::string got(text.size(), '\0');
    net::basic_buffered_reader<tls::tcp_stream> reader(*s);
    if (result<void> r = co_await reader.read_exact(std::as_writable_bytes(std::span(got))); !r) co_return r.error();
    if (result<void> d = co_await s->shutdown(); !d) co_return d.error();
    co_return got;
}

/// Sends raw bytes to `at` over plain TCP and reads until the server closes:
/// what it answered.
task<std::string> send_plain(net::address at, std::string_view bytes) {
    result<net::tcp_stream> tcp = co_await net::tcp_stream::connect(at);
    REQUIRE(tcp.has_value());
    REQUIRE_OK(co_await net::write_all(*tcp, bytes));
    std::string answer;
    std::array<std::byte, 1024> buf;
    for (;;) {
        result<std::size_t> n = co_await spindle::with_timeout(5s, tcp->read_some(buf));
        if (!n || *n == 0) break;
        answer += text_of(std::span(buf).first(*n));
    }
    co_return answer;
}

}  // namespace

TEST_CASE("tls: plain HTTP, random bytes, a stalled handshake and a reset each fail alone; the server serves on", "[tls][faults]") {
    loop l;
    run(
        l,
        []() -> task<void> {
            tls::context_options so = server_options();
            so.handshake_timeout = 300ms;
            echo_server server(make_server(so));
            const int connections = 6;
            join_handle<void> serving = loop::current().spawn(server.serve(connections));
            const net::address at = server.address();

            // Plain HTTP to the TLS port: the server answers with an alert and closes.
            std::string answer = co_await send_plain(at, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
            CHECK(answer.size() < 64);
            // Random bytes instead of a ClientHello.
            std::string noise(512, '\0');
            for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<char>((i * 2654435761u) >> 13);
            (void)co_await send_plain(at, noise);

            // A ClientHello's first half, then silence: the handshake timeout ends it.
            {
                result<net::tcp_stream> tcp = co_await net::tcp_stream::connect(at);
                REQUIRE(tcp.has_value());
                // A record header promising 512 bytes, and only 10 of them.
                const std::array<unsigned char, 15> half{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01,
                                                         0xfc, 0x03, 0x03, 1,    2,    3,    4};
                REQUIRE_OK(co_await tcp->write_all(std::as_bytes(std::span(half))));
                std::array<std::byte, 64> buf;
                const auto started = spindle::clock::now();
                result<std::size_t> n = co_await spindle::with_timeout(5s, tcp->read_some(buf));
                CHECK(spindle::clock::now() - started < 4s);  // closed by the server, not by our deadline
                if (n) CHECK(*n <= 64);
            }

            // A peer that resets the connection in the middle of a record.
            {
                result<net::tcp_stream> tcp = co_await net::tcp_stream::connect(at);
                REQUIRE(tcp.has_value());
                const std::array<unsigned char, 8> part{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01};
                REQUIRE_OK(co_await tcp->write_all(std::as_bytes(std::span(part))));
                (void)co_await spindle::sleep_for(20ms);
                const ::linger hard{1, 0};
                REQUIRE(::setsockopt(tcp->native_handle(), SOL_SOCKET, SO_LINGER, &hard, sizeof hard) == 0);
                tcp->close();
            }

            // And then two well-behaved clients are served.
            for (int i = 0; i < 2; ++i) {
                result<std::string> echoed =
                    co_await echo_once(make_client(), at, "still serving " + std::to_string(i));
                REQUIRE(echoed.has_value());
                CHECK(*echoed == "still serving " + std::to_string(i));
            }
            co_await serving;
            CHECK(server.served == 2);
            REQUIRE(server.failures.size() == 4);
            std::string reasons;
            for (const std::error_code& e : server.failures) reasons += e.message() + "; ";
            CAPTURE(reasons);
            CHECK(server.failures[0].message().find("http request") != std::string::npos);
            CHECK(server.failures[1].category() == tls::tls_category());
            CHECK(server.failures[2] == std::errc::timed_out);
            CHECK(server.failures[3] == std::errc::connection_reset);
        }(),
        60s);
}

TEST_CASE("tls: an end without close_notify is truncated, not end of stream", "[tls][faults]") {
    loop l;
    run(
        l,
        []() -> task<void> {
            auto p = co_await handshake_pair<spindle::test::tcp_kind>(make_client(), make_server());
            REQUIRE(p.client_handshake.has_value());
            REQUIRE_OK(co_await net::write_all(p.server, "partial"));
            // The server's socket closes with no close_notify.
            p.server.next_layer().close();
            std::array<std::byte, 64> buf;
            result<std::size_t> n = co_await p.client.read_some(buf);
            REQUIRE(n.has_value());
            CHECK(text_of(std::span(buf).first(*n)) == "partial");
            result<std::size_t> end = co_await p.client.read_some(buf);
            REQUIRE_FALSE(end.has_value());
            CHECK(end.error() == tls::errc::truncated);
            CHECK(end.error().message().find("close_notify") != std::string::npos);

            // With close_notify (shutdown_write), the same read is a clean 0.
            auto q = co_await handshake_pair<spindle::test::tcp_kind>(make_client(), make_server());
            REQUIRE(q.client_handshake.has_value());
            REQUIRE_OK(co_await net::shutdown_write(q.server));
            result<std::size_t> clean = co_await q.client.read_some(buf);
            REQUIRE(clean.has_value());
            CHECK(*clean == 0);
            // Half-closed: the client can still write, and the server read it.
            REQUIRE_OK(co_await net::write_all(q.client, "after"));
            result<std::size_t> after = co_await q.server.read_some(buf);
            REQUIRE(after.has_value());
            CHECK(text_of(std::span(buf).first(*after)) == "after");

            // A peer that never answers close_notify: shutdown gives up after its timeout.
            tls::context_options co = client_options();
            co.shutdown_timeout = 100ms;
            auto r = co_await handshake_pair<spindle::test::tcp_kind>(make_client(co), make_server());
            REQUIRE(r.client_handshake.has_value());
            CHECK_ERROR(co_await r.client.shutdown(), std::errc::timed_out);
        }(),
        60s);
}

TEST_CASE("tls: a stop or a deadline ends a parked read, and the stream stays usable", "[tls][cancel]") {
    loop l;
    run(
        l,
        []() -> task<void> {
            auto p = co_await handshake_pair<spindle::test::memory_kind>(make_client(), make_server());
            REQUIRE(p.client_handshake.has_value());
            std::array<std::byte, 16> buf;
            CHECK_ERROR(co_await spindle::with_timeout(20ms, p.client.read_some(buf)), std::errc::timed_out);
            std::stop_source stop;
            stop.request_stop();
            CHECK_ERROR(co_await p.client.read_some(buf, stop.get_token()), std::errc::operation_canceled);
            REQUIRE_OK(co_await net::write_all(p.server, "later"));
            result<std::size_t> n = co_await p.client.read_some(buf);
            REQUIRE(n.has_value());
            CHECK(text_of(std::span(buf).first(*n)) == "later");
            // A handshake that no peer answers: the context's timeout.
            auto [a, b] = net::memory_stream::pair();
            tls::context_options co = client_options();
            co.handshake_timeout = 50ms;
            result<tls::stream<net::memory_stream>> lonely =
                tls::stream<net::memory_stream>::client(make_client(co), std::move(a), "localhost");
            REQUIRE(lonely.has_value());
            CHECK_ERROR(co_await lonely->handshake(), std::errc::timed_out);
        }(),
        30s);
}

// --- concurrency --------------------------------------------------------------------------------

TEST_CASE("tls: a read and a write in flight on one stream at once, across KeyUpdates both sides ask for", "[tls][concurrency]") {
    loop l;
    run(
        l,
        []() -> task<void> {
            auto p = co_await handshake_pair<spindle::test::tcp_kind>(make_client(), make_server());
            REQUIRE(p.client_handshake.has_value());
            REQUIRE(p.server_handshake.has_value());
            constexpr std::size_t total = 8u << 20;
            constexpr std::size_t piece = 256 * 1024;
            auto& here = loop::current();
            // The server echoes with a reader and a writer task of its own.
            auto server_echo = [](tls::tcp_stream& s) -> task<result<void>> {
                std::vector<std::byte> buf(32 * 1024);
                for (std::size_t done = 0; done < total;) {
                    result<std::size_t> n = co_await s.read_some(buf);
                    if (!n) co_return n.error();
                    if (*n == 0) co_return std::make_error_code(std::errc::connection_aborted);
                    if (done < total / 2 && done + *n >= total / 2) REQUIRE(s.request_key_update(true).has_value());
                    if (result<void> w = co_await s.write_all(std::span(buf).first(*n)); !w) co_return w;
                    done += *n;
                }
                co_return result<void>{};
            };
            auto echo = here.spawn(server_echo(p.server));
            // The client writes in pieces from one task and reads the echo from
            // another; between pieces it asks for new keys both ways.
            auto writer = [](tls::tcp_stream& s) -> task<result<void>> {
                std::vector<std::byte> chunk(piece);
                for (std::size_t sent = 0; sent < total; sent += piece) {
                    fill_pattern(chunk, 7, sent);
                    if (sent % (2 * 1024 * 1024) == 0) REQUIRE(s.request_key_update(true).has_value());
                    if (result<void> w = co_await s.write_all(chunk); !w) co_return w;
                }
                co_return result<void>{};
            };
            auto w = here.spawn(writer(p.client));
            result<std::size_t> got = co_await read_pattern(p.client, 7, total);
            REQUIRE_OK(co_await w);
            REQUIRE_OK(co_await echo);
            REQUIRE(got.has_value());
            CHECK(*got == total);
        }(),
        120s);
}

TEST_CASE("tls: a thousand connections at once, each echoed", "[tls][scale]") {
    const rlim_t limit = spindle::test::raise_fd_limit(2200);
    if (limit < 2200) {
        WARN("descriptor limit " << limit << ": skipped");
        return;
    }
    loop l;
    run(
        l,
        []() -> task<void> {
            constexpr int count = 1000;
            // A thousand handshakes queue up on one loop: on a loaded machine
            // (or under a sanitizer) the last may wait longer than the default
            // 10 s bound, which this test is not about.
            tls::context_options so = server_options();
            so.handshake_timeout = 120s;
            echo_server server(make_server(so));
            join_handle<void> serving = loop::current().spawn(server.serve(count));
            tls::context client = make_client();
            std::vector<task<result<std::string>>> clients;
            for (int i = 0; i < count; ++i)
                clients.push_back(echo_once(client, server.address(), "client " + std::to_string(i)));
            std::vector<result<std::string>> answers = co_await spindle::when_all(std::move(clients));
            int right = 0;
            std::string first_error;
            for (int i = 0; i < count; ++i) {
                const result<std::string>& a = answers[static_cast<std::size_t>(i)];
                if (a && *a == "client " + std::to_string(i))
                    ++right;
                else if (first_error.empty())
                    first_error = a ? "wrong echo: " + *a : a.error().message();
            }
            CAPTURE(first_error);
            CHECK(right == count);
            co_await serving;
            CHECK(server.served == count);
        }(),
        240s);
}

TEST_CASE("tls: reads and writes allocate nothing once the handshake is done", "[tls][allocation]") {
    loop l;
    std::size_t allocations = 0;
    bool all_ok = true;
    run(l, [](std::size_t& allocations, bool& all_ok) -> task<void> {
        auto p = co_await handshake_pair<spindle::test::unix_kind>(make_client(), make_server());
        REQUIRE(p.client_handshake.has_value());
        std::array<std::byte, 2048> out{};
        std::array<std::byte, 2048> in{};
        for (int round = 0; round < 201; ++round) {
#if SPINDLE_FRAME_POOL
            t_counting = round > 0;  // the first round warms the frame pool and takes the ticket in
#endif
            result<void> w = co_await p.client.write_all(out);
            all_ok = all_ok && w.has_value();
            for (std::size_t want = out.size(); want > 0;) {
                result<std::size_t> n = co_await p.server.read_some(std::span(in).first(want));
                if (!n || *n == 0) {
                    all_ok = false;
                    break;
                }
                want -= *n;
            }
            w = co_await net::write_all(p.server, {std::string_view("head"), std::span<const std::byte>(in).first(100)});
            all_ok = all_ok && w.has_value();
            result<std::size_t> back = co_await p.client.read_some(in);
            all_ok = all_ok && back.has_value();
        }
#if SPINDLE_FRAME_POOL
        t_counting = false;
        allocations = t_allocations;
#endif
    }(allocations, all_ok));
    CHECK(all_ok);
#if SPINDLE_FRAME_POOL
    CHECK(allocations == 0);
#else
    WARN("frame pool off (sanitizer build): allocations not counted");
#endif
}

// --- interoperability ------------------------------------------------------------------------

namespace {

/// `openssl s_server` as a child process, on a port of its choosing.
class openssl_server {
public:
    explicit openssl_server(std::vector<std::string> argv) {
        const spindle::test::child_output child = spindle::test::spawn_with_output(std::move(argv));
        m_pid = child.pid;
        m_out = child.out;
    }
    ~openssl_server() {
        ::kill(m_pid, SIGKILL);
        ::waitpid(m_pid, nullptr, 0);
        ::close(m_out);
    }
    openssl_server(const openssl_server&) = delete;
    openssl_server& operator=(const openssl_server&) = delete;

    /// The port of its "ACCEPT 127.0.0.1:PORT" line (0 if none within 10 s).
    std::uint16_t port() {
        const auto give_up = std::chrono::steady_clock::now() + 10s;
        std::string text;
        while (std::chrono::steady_clock::now() < give_up) {
            if (auto at = text.find("ACCEPT 127.0.0.1:"); at != std::string::npos && text.find('\n', at) != std::string::npos)
                return static_cast<std::uint16_t>(std::stoi(text.substr(at + 17)));
            pollfd p{m_out, POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;
            char buf[512];
            const ssize_t n = ::read(m_out, buf, sizeof buf);
            if (n <= 0) break;
            text.append(buf, static_cast<std::size_t>(n));
        }
        INFO("openssl s_server said: " << text);
        return 0;
    }

private:
    pid_t m_pid = -1;
    int m_out = -1;
};

bool have_openssl_command() { return std::system("command -v openssl >/dev/null 2>&1") == 0; }

}  // namespace

TEST_CASE("tls: spindle's client against openssl s_server, TLS 1.3 and 1.2", "[tls][interop]") {
    if (!have_openssl_command()) {
        WARN("the openssl command is not installed (./setup.sh installs it): skipped");
        return;
    }
    spindle::test::temp_dir dir;
    const std::string cert = dir.write("server.pem", test_pki::get().server.certificate);
    const std::string key = dir.write("server.key", test_pki::get().server.key);
    for (const char* version : {"-tls1_3", "-tls1_2"}) {
        CAPTURE(version);
        openssl_server server({"openssl", "s_server", "-accept", "127.0.0.1:0", "-cert", cert, "-key", key, "-www", "-naccept", "1",
                               version, "-alpn", "http/1.1"});
        const std::uint16_t port = server.port();
        REQUIRE(port != 0);
        loop l;
        run(
            l,
            [](std::uint16_t port, std::string version) -> task<void> {
                tls::context_options o = client_options();
                o.alpn = {"http/1.1"};
                result<tls::tcp_stream> s =
                    co_await tls::connect(make_client(o), net::address::ipv4_loopback(port), "localhost");
                if (!s) FAIL("connect: " << s.error().message());
                CHECK(s->protocol_version() == (version == "-tls1_3" ? "TLSv1.3" : "TLSv1.2"));
                CHECK(s->alpn() == "http/1.1");
                REQUIRE_OK(co_await net::write_all(*s, "GET / HTTP/1.0\r\n\r\n"));
                std::string page;
                std::array<std::byte, 4096> buf;
                for (;;) {
                    result<std::size_t> n = co_await s->read_some(buf);
                    if (!n || *n == 0) break;  // s_server may close without close_notify
                    page += text_of(std::span(buf).first(*n));
                }
                CHECK(page.starts_with("HTTP/1.0 200 ok"));
                CHECK(page.find(std::string(s->cipher())) != std::string::npos);  // it lists the suite it chose
            }(port, version),
            20s);
    }
}

// --- edges of the operations ----------------------------------------------------------------

TEST_CASE("tls: without handshake(), the first write or read does it, whichever side speaks first", "[tls][handshake]") {
    loop l;
    run(
        l,
        []() -> task<void> {
            for (int server_speaks_first = 0; server_speaks_first < 2; ++server_speaks_first) {
                CAPTURE(server_speaks_first);
                auto [a, b] = co_await spindle::test::tcp_kind::make();
                result<tls::tcp_stream> c = tls::tcp_stream::client(make_client(), std::move(a), "localhost");
                result<tls::tcp_stream> s = tls::tcp_stream::server(make_server(), std::move(b));
                REQUIRE(c.has_value());
                REQUIRE(s.has_value());
                // One side writes with nobody reading on its stream: its
                // handshake flight must go out before it waits for the peer's.
                tls::tcp_stream& speaker = server_speaks_first ? *s : *c;
                tls::tcp_stream& listener = server_speaks_first ? *c : *s;
                auto greet = loop::current().spawn(net::write_all(speaker, "220 hello\r\n"));
                std::array<std::byte, 64> buf;
                result<std::size_t> n = co_await spindle::with_timeout(5s, listener.read_some(buf));
                REQUIRE(n.has_value());
                CHECK(text_of(std::span(buf).first(*n)) == "220 hello\r\n");
                REQUIRE_OK(co_await greet);
                CHECK(speaker.handshake_done());
            }
        }(),
        30s);
}

TEST_CASE("tls: a reader aborted mid-wait, or a stream destroyed under a parked read, leaves nothing stuck", "[tls][lifetime]") {
    loop l;
    run(
        l,
        []() -> task<void> {
            auto p = co_await handshake_pair<spindle::test::tcp_kind>(make_client(), make_server());
            REQUIRE(p.client_handshake.has_value());
            // A reader parked on the socket, destroyed where it waits.
            auto reader = [](tls::tcp_stream& s) -> task<void> {
                std::array<std::byte, 16> buf;
                (void)co_await s.read_some(buf);
            };
            join_handle<void> parked = loop::current().spawn(reader(p.client));
            (void)co_await spindle::sleep_for(10ms);
            parked.abort();
            // The next read on the same stream is not left waiting for it.
            REQUIRE_OK(co_await net::write_all(p.server, "after the abort"));
            std::array<std::byte, 64> buf;
            result<std::size_t> n = co_await spindle::with_timeout(5s, p.client.read_some(buf));
            REQUIRE(n.has_value());
            CHECK(text_of(std::span(buf).first(*n)) == "after the abort");

            // A stream destroyed while a read is parked on it: the read ends with
            // operation_canceled (and touches nothing freed: ASan).
            std::optional<tls::tcp_stream> doomed(std::move(p.client));
            auto last = [](tls::tcp_stream& s) -> task<result<std::size_t>> {
                std::array<std::byte, 16> b;
                co_return co_await s.read_some(b);
            };
            join_handle<result<std::size_t>> pending = loop::current().spawn(last(*doomed));
            (void)co_await spindle::sleep_for(10ms);
            doomed.reset();
            result<std::size_t> ended = co_await pending;
            REQUIRE_FALSE(ended.has_value());
            CHECK(ended.error() == std::errc::operation_canceled);
        }(),
        30s);
}

// --- flights and Nagle ---------------------------------------------------------------------

namespace {

/// A byte stream that counts the writes reaching the stream underneath.
template <class S>
struct counting_stream {
    S next;
    int* writes;

    auto read_some(std::span<std::byte> b, std::stop_token t = {}) { return next.read_some(b, std::move(t)); }
    auto write_some(std::span<const std::byte> b, std::stop_token t = {}) {
        ++*writes;
        return next.write_some(b, std::move(t));
    }
    auto write_all(std::span<const std::byte> b, std::stop_token t = {}) {
        ++*writes;
        return next.write_all(b, std::move(t));
    }
    auto write_all(std::span<const ::iovec> b, std::stop_token t = {}) {
        ++*writes;
        return next.write_all(b, std::move(t));
    }
    result<void> shutdown_write() { return next.shutdown_write(); }
    void close() noexcept { next.close(); }
};

/// The server's writes for one request and its reply over a fresh TLS 1.3
/// connection, the server calling handshake() first or not.
task<int> server_writes_for_one_reply(bool explicit_handshake) {
    auto [a, b] = net::memory_stream::pair();
    int writes = 0;
    result<tls::stream<net::memory_stream>> c = tls::stream<net::memory_stream>::client(make_client(), std::move(a), "localhost");
    using counted_tls = tls::stream<counting_stream<net::memory_stream>>;
    result<counted_tls> s = counted_tls::server(make_server(), counting_stream<net::memory_stream>{std::move(b), &writes});
    REQUIRE(c.has_value());
    REQUIRE(s.has_value());
    join_handle<result<void>> serving = loop::current().spawn([](counted_tls& s, bool explicit_handshake) -> task<result<void>> {
        if (explicit_handshake) {
            if (result<void> h = co_await s.handshake(); !h) co_return h;
        }
        std::array<std::byte, 64> buf;
        result<std::size_t> n = co_await s.read_some(buf);
        if (!n) co_return n.error();
        co_return co_await s.write_all(std::span<const std::byte>(buf).first(*n));
    }(*s, explicit_handshake));
    REQUIRE_OK(co_await c->handshake());
    REQUIRE_OK(co_await net::write_all(*c, "ping"));
    std::array<std::byte, 64> buf;
    result<std::size_t> n = co_await c->read_some(buf);
    REQUIRE(n.has_value());
    CHECK(text_of(std::span(buf).first(*n)) == "ping");
    REQUIRE_OK(co_await serving);
    CHECK(s->protocol_version() == "TLSv1.3");
    co_return writes;
}

}  // namespace

TEST_CASE("tls: a TLS 1.3 server's session tickets leave with its first reply, in one write", "[tls][flights]") {
    const bool explicit_handshake = GENERATE(true, false);
    CAPTURE(explicit_handshake);
    loop l;
    // One write for the server's handshake flight, one for tickets and reply.
    CHECK(run(l, server_writes_for_one_reply(explicit_handshake)) == 2);
}

TEST_CASE("tls: the first reply on 100 fresh TLS 1.3 connections is not held back by Nagle", "[tls][flights]") {
    loop l;
    run(
        l,
        []() -> task<void> {
            // Written as docs/tls.md's server: a plain listener, a context, one
            // encrypted stream per connection, no socket option set by hand.
            constexpr int count = 100;
            echo_server server(make_server());
            join_handle<void> serving = loop::current().spawn(server.serve(count));
            tls::context client = make_client();
            int delayed = 0;
            std::chrono::nanoseconds slowest{0};
            for (int i = 0; i < count; ++i) {
                result<tls::tcp_stream> s = co_await tls::connect(client, server.address(), "localhost");
                REQUIRE(s.has_value());
                const auto sent = std::chrono::steady_clock::now();
                REQUIRE_OK(co_await net::write_all(*s, "ping"));
                std::array<std::byte, 16> buf;
                result<std::size_t> n = co_await s->read_some(buf);
                const auto waited = std::chrono::steady_clock::now() - sent;
                REQUIRE(n.has_value());
                slowest = std::max<std::chrono::nanoseconds>(slowest, waited);
                if (waited > 20ms) ++delayed;
                (void)co_await s->shutdown();
            }
            co_await serving;
            // Nagle against the client's delayed ACK held back some 15 in 100 by
            // 40 ms. Two are allowed for a machine that stalls a test now and
            // then; the delayed ACK would be far more.
            CAPTURE(std::chrono::duration_cast<std::chrono::microseconds>(slowest).count());
            CHECK(delayed <= 2);
        }(),
        120s);
}

// Built with -Wextra -Werror: g++ 12 warns of every member without a default
// initializer that a designated initializer leaves out.
TEST_CASE("tls::context_options take designated initializers", "[tls][context]") {
    const tls::context_options o{.verify_peer = false};
    CHECK_FALSE(o.verify_peer);
    CHECK(o.certificate_pem.empty());
}
