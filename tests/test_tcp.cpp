// TCP streams and listeners (spindle/net/tcp.hpp) and the buffered reader
// (spindle/net/buffered_reader.hpp), on loopback only: many clients, bulk
// transfers, refused and timed-out connects, resets, half-close, closing a
// stream under a pending read, vectored writes, options and addresses.

#include "net_support.hpp"

#include <spindle/net/buffered_reader.hpp>
#include <spindle/net/tcp.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
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
using spindle::test::text_of;
using steady = std::chrono::steady_clock;
namespace net = spindle::net;

namespace {

constexpr std::size_t npos = std::string::npos;

net::tcp_listener listen_loopback(const net::listen_options& options = {}) {
    auto l = net::tcp_listener::bind(net::address::ipv4_loopback(0), options);
    REQUIRE(l.has_value());
    return std::move(*l);
}

net::address local_of(const net::socket_base& s) {
    auto a = s.local_address();
    REQUIRE(a.has_value());
    return *a;
}

struct tcp_pair {
    net::tcp_stream client;
    net::tcp_stream server;
};

/// A connected pair through `l`. On loopback the kernel completes the
/// handshake before anyone accepts, so the two steps can run in turn.
task<tcp_pair> connect_pair(net::tcp_listener& l) {
    result<net::tcp_stream> client = co_await net::tcp_stream::connect(local_of(l));
    REQUIRE(client.has_value());
    result<net::tcp_stream> server = co_await l.accept();
    REQUIRE(server.has_value());
    co_return tcp_pair{std::move(*client), std::move(*server)};
}

/// Reads until end of stream (bounded); the text, or the error that ended it.
task<result<std::string>> read_to_end(net::stream_socket& s) {
    std::string got;
    std::array<std::byte, 4096> buf{};
    for (int i = 0; i < 100'000; ++i) {
        result<std::size_t> n = co_await s.read_some(buf);
        if (!n) co_return n.error();
        if (*n == 0) co_return got;
        got += text_of(std::span(buf).first(*n));
    }
    co_return std::make_error_code(std::errc::message_size);
}

void set_linger_reset(net::socket_base& s) {
    // SO_LINGER {1, 0}: close() sends a reset instead of a FIN.
    ::linger lg{1, 0};
    REQUIRE(::setsockopt(s.native_handle(), SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0);
}

// --- many clients ----------------------------------------------------------------

struct echo_stats {
    int accepted = 0;
    int server_done = 0;
    int server_errors = 0;
    int connect_finished = 0;
    int clients_ok = 0;
    int peak_connected = 0;
    int connected_now = 0;
    std::uint64_t bytes_verified = 0;
    std::vector<std::string> failures;
};

std::size_t client_size(int id) { return 512 + (static_cast<std::size_t>(id) * 131) % 8192; }

task<void> echo_connection(net::tcp_stream s, echo_stats& st) {
    std::array<std::byte, 16 * 1024> buf{};
    for (int i = 0; i < 100'000; ++i) {
        result<std::size_t> n = co_await s.read_some(buf);
        if (!n) {
            ++st.server_errors;
            co_return;
        }
        if (*n == 0) break;
        result<void> w = co_await s.write_all(std::span(buf).first(*n));
        if (!w) {
            ++st.server_errors;
            co_return;
        }
    }
    ++st.server_done;
}

task<void> echo_server(net::tcp_listener& l, int count, echo_stats& st) {
    loop& lp = loop::current();
    std::vector<join_handle<void>> connections;
    connections.reserve(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) {
        result<net::tcp_stream> c = co_await l.accept();
        if (!c) {
            st.failures.push_back("accept: " + c.error().message());
            break;
        }
        ++st.accepted;
        connections.push_back(lp.spawn(echo_connection(std::move(*c), st)));
    }
    for (auto& c : connections) co_await c;
}

task<void> echo_client(net::address to, int id, int total, std::stop_source& all_connected, echo_stats& st) {
    result<net::tcp_stream> s = co_await net::tcp_stream::connect(to);
    // Everyone waits until every client has connected: the connections are
    // all open at once.
    if (++st.connect_finished == total) all_connected.request_stop();
    if (!s) {
        st.failures.push_back("connect " + std::to_string(id) + ": " + s.error().message());
        co_return;
    }
    ++st.connected_now;
    (void)co_await spindle::sleep_for(1h, all_connected.get_token());
    if (st.connected_now > st.peak_connected) st.peak_connected = st.connected_now;

    std::vector<std::byte> out(client_size(id));
    fill_pattern(out, static_cast<std::uint64_t>(id), 0);
    result<void> w = co_await s->write_all(out);
    if (!w) {
        st.failures.push_back("write " + std::to_string(id) + ": " + w.error().message());
        co_return;
    }
    result<void> sh = s->shutdown_write();
    if (!sh) st.failures.push_back("shutdown " + std::to_string(id));
    std::vector<std::byte> in(out.size() + 1);
    std::size_t got = 0;
    for (int i = 0; i < 100'000; ++i) {
        result<std::size_t> n = co_await s->read_some(std::span(in).subspan(got));
        if (!n) {
            st.failures.push_back("read " + std::to_string(id) + ": " + n.error().message());
            co_return;
        }
        if (*n == 0) break;
        got += *n;
        if (got == in.size()) break;  // one byte too many: fails below
    }
    --st.connected_now;
    if (got != out.size()) {
        st.failures.push_back("client " + std::to_string(id) + " got " + std::to_string(got) + " of " +
                              std::to_string(out.size()));
        co_return;
    }
    if (pattern_mismatch(std::span(in).first(got), static_cast<std::uint64_t>(id), 0) != npos) {
        st.failures.push_back("client " + std::to_string(id) + ": bytes differ");
        co_return;
    }
    st.bytes_verified += got;
    ++st.clients_ok;
}

task<void> many_main(net::tcp_listener& l, int clients, echo_stats& st) {
    loop& lp = loop::current();
    const net::address to = local_of(l);
    auto server = lp.spawn(echo_server(l, clients, st), "server");
    std::stop_source all_connected;
    std::vector<join_handle<void>> handles;
    handles.reserve(static_cast<std::size_t>(clients));
    for (int id = 0; id < clients; ++id) handles.push_back(lp.spawn(echo_client(to, id, clients, all_connected, st)));
    for (auto& h : handles) co_await h;
    co_await server;
}

// --- bulk ----------------------------------------------------------------------------

constexpr std::uint64_t bulk_total = 64ull << 20;

struct bulk_direction {
    std::uint64_t written = 0;
    std::uint64_t received = 0;
    std::uint64_t first_mismatch = npos;
    std::error_code write_error;
    std::error_code read_error;
    bool eof = false;
};

task<void> bulk_writer(net::tcp_stream& s, std::uint64_t seed, bulk_direction& d) {
    std::vector<std::byte> chunk(1 << 20);
    for (std::uint64_t offset = 0; offset < bulk_total; offset += chunk.size()) {
        fill_pattern(chunk, seed, offset);
        result<void> w = co_await s.write_all(chunk);
        if (!w) {
            d.write_error = w.error();
            co_return;
        }
        d.written += chunk.size();
    }
    result<void> sh = s.shutdown_write();
    if (!sh) d.write_error = sh.error();
}

task<void> bulk_reader(net::tcp_stream& s, std::uint64_t seed, bulk_direction& d) {
    std::vector<std::byte> buf(256 * 1024);
    for (int i = 0; i < 10'000'000; ++i) {
        result<std::size_t> n = co_await s.read_some(buf);
        if (!n) {
            d.read_error = n.error();
            co_return;
        }
        if (*n == 0) {
            d.eof = true;
            co_return;
        }
        if (d.first_mismatch == npos) {
            std::size_t at = pattern_mismatch(std::span(buf).first(*n), seed, d.received);
            if (at != npos) d.first_mismatch = d.received + at;
        }
        d.received += *n;
    }
}

task<void> bulk_main(net::tcp_listener& l, bulk_direction& up, bulk_direction& down) {
    loop& lp = loop::current();
    tcp_pair p = co_await connect_pair(l);
    // Both directions at once: each side writes 64 MiB while reading the other's.
    auto w1 = lp.spawn(bulk_writer(p.client, 11, up));
    auto r1 = lp.spawn(bulk_reader(p.server, 11, up));
    auto w2 = lp.spawn(bulk_writer(p.server, 22, down));
    auto r2 = lp.spawn(bulk_reader(p.client, 22, down));
    co_await w1;
    co_await r1;
    co_await w2;
    co_await r2;
}

// --- connect failures ---------------------------------------------------------------

net::address closed_port() {
    // Take a free port and give it back: nobody listens there now.
    net::tcp_listener l = listen_loopback();
    net::address a = local_of(l);
    l.close();
    return a;
}

task<void> connect_errors(net::address to, int times, std::vector<std::error_code>& errors) {
    for (int i = 0; i < times; ++i) {
        result<net::tcp_stream> s = co_await net::tcp_stream::connect(to);
        errors.push_back(s ? std::error_code{} : s.error());
    }
}

struct timed_connect {
    bool has_value = true;
    std::error_code error;
    steady::duration elapsed{};
    bool live_ok = false;
};

task<void> connect_timeout_main(net::address stuck, net::address live, timed_connect& t) {
    const auto start = steady::now();
    result<net::tcp_stream> s = co_await net::tcp_stream::connect(stuck, 100ms);
    t.elapsed = steady::now() - start;
    t.has_value = s.has_value();
    t.error = s.error();
    // The same overload connects where a listener does answer.
    result<net::tcp_stream> ok = co_await net::tcp_stream::connect(live, 10s);
    t.live_ok = ok.has_value() && ok->peer() == live;
}

// --- resets ---------------------------------------------------------------------------

struct reset_state {
    bool done_before_reset = true;
    bool has_value = true;
    std::error_code error;
    std::uint64_t server_read = 0;
    std::uint64_t server_mismatch = npos;
};

task<void> reset_read_main(net::tcp_listener& l, reset_state& s) {
    tcp_pair p = co_await connect_pair(l);
    auto reader = loop::current().spawn([](net::tcp_stream& c, reset_state& s) -> task<void> {
        std::array<std::byte, 64> buf{};
        result<std::size_t> r = co_await c.read_some(buf);
        s.has_value = r.has_value();
        s.error = r.error();
    }(p.client, s));
    (void)co_await spindle::sleep_for(20ms);
    s.done_before_reset = reader.done();
    set_linger_reset(p.server);
    p.server.close();
    co_await reader;
}

task<void> reset_write_main(net::tcp_listener& l, reset_state& s) {
    tcp_pair p = co_await connect_pair(l);
    std::vector<std::byte> big(bulk_total);
    fill_pattern(big, 7, 0);
    auto writer = loop::current().spawn([](net::tcp_stream& c, std::span<const std::byte> data, reset_state& s) -> task<void> {
        result<void> w = co_await c.write_all(data);
        s.has_value = w.has_value();
        s.error = w.error();
    }(p.client, big, s));
    // Take some of it, so the write is well under way, then reset.
    std::vector<std::byte> head(64 * 1024);
    result<void> r = co_await p.server.read_exact(head);
    REQUIRE(r.has_value());
    s.server_read = head.size();
    s.server_mismatch = pattern_mismatch(head, 7, 0);
    s.done_before_reset = writer.done();
    set_linger_reset(p.server);
    p.server.close();
    co_await writer;
}

// --- half-close ---------------------------------------------------------------------

struct half_close_state {
    std::string server_got;
    std::string client_got;
    std::size_t second_eof_read = 99;
};

task<void> client_half_close_main(net::tcp_listener& l, half_close_state& s) {
    tcp_pair p = co_await connect_pair(l);
    result<void> w = co_await p.client.write_all(bytes_of("request"));
    REQUIRE(w.has_value());
    REQUIRE(p.client.shutdown_write().has_value());
    // The server sees end of stream, then still writes; the client still reads.
    result<std::string> got = co_await read_to_end(p.server);
    REQUIRE(got.has_value());
    s.server_got = *got;
    std::array<std::byte, 8> buf{};
    result<std::size_t> again = co_await p.server.read_some(buf);  // end of stream stays
    REQUIRE(again.has_value());
    s.second_eof_read = *again;
    w = co_await p.server.write_all(bytes_of("reply"));
    REQUIRE(w.has_value());
    p.server.close();
    got = co_await read_to_end(p.client);
    REQUIRE(got.has_value());
    s.client_got = *got;
}

// --- reads after a read that emptied the socket ------------------------------------

// A receive shorter than its buffer has emptied the socket, so epoll waits for
// the next edge before the next receive instead of trying it first. Whatever
// arrives afterwards must still be read: data while no read waits, data and
// the peer's end in one event, the end alone.
struct drained_state {
    std::vector<std::string> got;
};

/// One read of up to 4 KiB (or a borrowed one): its text, "<end>" at end of
/// stream, or "<error>".
task<std::string> read_once(net::tcp_stream& s, bool borrowed) {
    if (borrowed) {
        result<spindle::borrowed_buffer> b = co_await s.read_borrowed();
        if (!b) co_return "<error>";
        co_return b->bytes().empty() ? std::string("<end>") : text_of(b->bytes());
    }
    std::array<std::byte, 4096> buf{};
    result<std::size_t> n = co_await s.read_some(buf);
    if (!n) co_return "<error>";
    co_return *n == 0 ? std::string("<end>") : text_of(std::span(buf).first(*n));
}

task<void> write_text(net::tcp_stream& s, std::string_view text) {
    result<void> w = co_await s.write_all(bytes_of(text));
    REQUIRE(w.has_value());
}

task<void> drained_main(net::tcp_listener& l, bool borrowed, drained_state& s) {
    loop& lp = loop::current();
    {
        tcp_pair p = co_await connect_pair(l);
        co_await write_text(p.client, "one");
        s.got.push_back(co_await read_once(p.server, borrowed));  // short: emptied
        co_await write_text(p.client, "two");                     // there before the next read
        s.got.push_back(co_await read_once(p.server, borrowed));
        // A read that waits (the descriptor is watched from now on), then data
        // that comes while no read waits: its edge is taken by a poll with
        // nobody to give it to.
        auto waiting = lp.spawn(read_once(p.server, borrowed));
        (void)co_await spindle::sleep_for(5ms);
        co_await write_text(p.client, "three");
        s.got.push_back(co_await waiting);
        co_await write_text(p.client, "four");
        (void)co_await spindle::sleep_for(5ms);
        s.got.push_back(co_await read_once(p.server, borrowed));
        // Data and the end in one event, under a waiting read: the end stays
        // to be read and raises no second edge.
        waiting = lp.spawn(read_once(p.server, borrowed));
        (void)co_await spindle::sleep_for(5ms);
        co_await write_text(p.client, "five");
        REQUIRE(p.client.shutdown_write().has_value());
        s.got.push_back(co_await waiting);
        s.got.push_back(co_await read_once(p.server, borrowed));
        s.got.push_back(co_await read_once(p.server, borrowed));  // and stays
    }
    {
        // The end alone, after a read that emptied the socket.
        tcp_pair p = co_await connect_pair(l);
        co_await write_text(p.client, "six");
        s.got.push_back(co_await read_once(p.server, borrowed));
        auto waiting = lp.spawn(read_once(p.server, borrowed));
        (void)co_await spindle::sleep_for(5ms);
        p.client.close();
        s.got.push_back(co_await waiting);
    }
}

task<void> server_half_close_main(net::tcp_listener& l, half_close_state& s) {
    tcp_pair p = co_await connect_pair(l);
    result<void> w = co_await p.server.write_all(bytes_of("hello"));
    REQUIRE(w.has_value());
    REQUIRE(p.server.shutdown_write().has_value());
    result<std::string> got = co_await read_to_end(p.client);
    REQUIRE(got.has_value());
    s.client_got = *got;
    w = co_await p.client.write_all(bytes_of("bye"));
    REQUIRE(w.has_value());
    REQUIRE(p.client.shutdown_write().has_value());
    got = co_await read_to_end(p.server);
    REQUIRE(got.has_value());
    s.server_got = *got;
}

// --- close under a pending read ---------------------------------------------------------

struct close_state {
    bool done_before_close = true;
    bool has_value = true;
    std::error_code error;
    bool open_after = true;
    std::size_t peer_read = 99;
};

task<void> close_pending_main(net::tcp_listener& l, close_state& s) {
    tcp_pair p = co_await connect_pair(l);
    auto reader = loop::current().spawn([](net::tcp_stream& c, close_state& s) -> task<void> {
        std::array<std::byte, 16> buf{};
        result<std::size_t> r = co_await c.read_some(buf);
        s.has_value = r.has_value();
        s.error = r.error();
    }(p.client, s));
    (void)co_await spindle::sleep_for(10ms);
    s.done_before_close = reader.done();
    p.client.close();
    p.client.close();  // twice is harmless
    s.open_after = p.client.is_open();
    co_await reader;
    // The peer sees an orderly end of stream.
    std::array<std::byte, 16> buf{};
    result<std::size_t> n = co_await p.server.read_some(buf);
    REQUIRE(n.has_value());
    s.peer_read = *n;
}

// --- read_exact ---------------------------------------------------------------------------

struct exact_state {
    std::string full;
    std::error_code short_error;
    std::string short_prefix;
};

task<void> read_exact_main(net::tcp_listener& l, exact_state& s) {
    tcp_pair p = co_await connect_pair(l);
    // Arrives in three writes; read_exact gathers it.
    auto writer = loop::current().spawn([](net::tcp_stream& w) -> task<void> {
        for (std::string_view part : {"0123", "4567", "89"}) {
            result<void> r = co_await w.write_all(bytes_of(part));
            REQUIRE(r.has_value());
            (void)co_await spindle::sleep_for(5ms);
        }
        result<void> r = co_await w.write_all(bytes_of("abc"));
        REQUIRE(r.has_value());
        w.close();
    }(p.server));
    std::array<std::byte, 10> ten{};
    result<void> r = co_await p.client.read_exact(ten);
    REQUIRE(r.has_value());
    s.full = text_of(ten);
    ten.fill(std::byte{'.'});
    r = co_await p.client.read_exact(ten);
    s.short_error = r.error();
    s.short_prefix = text_of(ten);
    co_await writer;
}

// --- vectored writes ------------------------------------------------------------------------

struct vectored_state {
    std::size_t buffers = 0;
    std::uint64_t total = 0;
    std::uint64_t received = 0;
    std::uint64_t mismatch = npos;
    bool caller_iovecs_unchanged = false;
    bool eof = false;
};

task<void> vectored_main(net::tcp_listener& l, vectored_state& s) {
    tcp_pair p = co_await connect_pair(l);
    // Small buffers on both sides: the kernel takes the gather in pieces, so
    // partial sends land inside the window of 16 and across windows.
    REQUIRE(p.client.set_option(SOL_SOCKET, SO_SNDBUF, 4096).has_value());
    REQUIRE(p.server.set_option(SOL_SOCKET, SO_RCVBUF, 16384).has_value());
    REQUIRE(p.client.set_nodelay(true).has_value());

    constexpr std::size_t count = 1000;
    std::vector<std::size_t> sizes(count);
    for (std::size_t i = 0; i < count; ++i) sizes[i] = (i * 37) % 3001;  // includes empty buffers
    std::uint64_t total = 0;
    for (std::size_t n : sizes) total += n;
    std::vector<std::byte> data(total);
    fill_pattern(data, 99, 0);
    std::vector<::iovec> iov(count);
    std::size_t at = 0;
    for (std::size_t i = 0; i < count; ++i) {
        iov[i] = {data.data() + at, sizes[i]};
        at += sizes[i];
    }
    const std::vector<::iovec> original = iov;
    s.buffers = count;
    s.total = total;

    auto reader = loop::current().spawn([](net::tcp_stream& r, vectored_state& s) -> task<void> {
        (void)co_await spindle::sleep_for(20ms);  // let the writer fill the buffers first
        std::vector<std::byte> buf(64 * 1024);
        for (int i = 0; i < 1'000'000; ++i) {
            result<std::size_t> n = co_await r.read_some(buf);
            REQUIRE(n.has_value());
            if (*n == 0) {
                s.eof = true;
                break;
            }
            if (s.mismatch == npos) {
                std::size_t m = pattern_mismatch(std::span(buf).first(*n), 99, s.received);
                if (m != npos) s.mismatch = s.received + m;
            }
            s.received += *n;
        }
    }(p.server, s));

    result<void> w = co_await p.client.write_all(std::span<const ::iovec>(iov));
    REQUIRE(w.has_value());
    REQUIRE(p.client.shutdown_write().has_value());
    co_await reader;
    s.caller_iovecs_unchanged = true;
    for (std::size_t i = 0; i < count; ++i)
        if (iov[i].iov_base != original[i].iov_base || iov[i].iov_len != original[i].iov_len) s.caller_iovecs_unchanged = false;
}

// --- addresses, options, IPv6 ---------------------------------------------------------------

struct address_state {
    net::address listener;
    net::address client_peer;
    net::address client_peer_address;
    net::address client_local;
    net::address server_peer;
    net::address server_peer_address;
    net::address server_local;
};

task<void> addresses_main(net::tcp_listener& l, address_state& s) {
    tcp_pair p = co_await connect_pair(l);
    s.listener = local_of(l);
    s.client_peer = p.client.peer();
    s.client_peer_address = *p.client.peer_address();
    s.client_local = local_of(p.client);
    s.server_peer = p.server.peer();
    s.server_peer_address = *p.server.peer_address();
    s.server_local = local_of(p.server);
}

struct option_state {
    int nodelay_on = -1;
    int nodelay_off = -1;
    int keepalive_on = -1;
    int keepidle = -1;
    int keepidle_longest = -1;
    int keepalive_off = -1;
};

task<void> options_main(net::tcp_listener& l, option_state& s) {
    tcp_pair p = co_await connect_pair(l);
    REQUIRE(p.client.set_nodelay(true).has_value());
    s.nodelay_on = *p.client.get_option(IPPROTO_TCP, TCP_NODELAY);
    REQUIRE(p.client.set_nodelay(false).has_value());
    s.nodelay_off = *p.client.get_option(IPPROTO_TCP, TCP_NODELAY);
    REQUIRE(p.client.set_keepalive(true, 42s).has_value());
    s.keepalive_on = *p.client.get_option(SOL_SOCKET, SO_KEEPALIVE);
    s.keepidle = *p.client.get_option(IPPROTO_TCP, TCP_KEEPIDLE);
    // 2^32 + 1 s would wrap to 1 s in an int: it saturates at the kernel's limit.
    REQUIRE(p.client.set_keepalive(true, std::chrono::seconds((1LL << 32) + 1)).has_value());
    s.keepidle_longest = *p.client.get_option(IPPROTO_TCP, TCP_KEEPIDLE);
    REQUIRE(p.client.set_keepalive(false).has_value());
    s.keepalive_off = *p.client.get_option(SOL_SOCKET, SO_KEEPALIVE);
}

struct v6_state {
    std::string server_got;
    std::string client_got;
    net::address client_peer;
    net::address server_peer;
};

task<void> v6_main(net::tcp_listener& l, v6_state& s) {
    tcp_pair p = co_await connect_pair(l);
    result<void> w = co_await p.client.write_all(bytes_of("over v6"));
    REQUIRE(w.has_value());
    std::array<std::byte, 7> in{};
    result<void> r = co_await p.server.read_exact(in);
    REQUIRE(r.has_value());
    s.server_got = text_of(in);
    w = co_await p.server.write_all(bytes_of("and back"));
    REQUIRE(w.has_value());
    p.server.close();
    result<std::string> got = co_await read_to_end(p.client);
    REQUIRE(got.has_value());
    s.client_got = *got;
    s.client_peer = p.client.peer();
    s.server_peer = p.server.peer();
}

task<void> accept_cancel_main(net::tcp_listener& l, std::error_code& e) {
    std::stop_source stop;
    auto stopper = loop::current().spawn([](std::stop_source& s) -> task<void> {
        (void)co_await spindle::sleep_for(10ms);
        s.request_stop();
    }(stop));
    result<net::tcp_stream> c = co_await l.accept(stop.get_token());
    e = c.error();
    co_await stopper;
}

task<void> accept_closed_main(net::tcp_listener& l, std::error_code& e, bool& done_before_close) {
    auto acceptor = loop::current().spawn([](net::tcp_listener& l, std::error_code& e) -> task<void> {
        result<net::tcp_stream> c = co_await l.accept();
        e = c.error();
    }(l, e));
    (void)co_await spindle::sleep_for(10ms);
    done_before_close = acceptor.done();
    l.close();
    co_await acceptor;
}

// --- buffered_reader ------------------------------------------------------------------------

struct lines_state {
    std::string first;
    std::string second;
    bool first_done_before_rest = true;
};

task<void> split_delimiter_main(net::tcp_listener& l, lines_state& s) {
    tcp_pair p = co_await connect_pair(l);
    net::buffered_reader reader(p.client);
    auto line_reader = loop::current().spawn([](net::buffered_reader& r, lines_state& s) -> task<void> {
        result<std::string_view> line = co_await r.read_until("\r\n", 1024);
        REQUIRE(line.has_value());
        s.first = std::string(*line);
        line = co_await r.read_until("\r\n", 1024);
        REQUIRE(line.has_value());
        s.second = std::string(*line);
    }(reader, s));
    // The delimiter arrives in two writes, "\r" in one and "\n" in the next.
    result<void> w = co_await p.server.write_all(bytes_of("hello\r"));
    REQUIRE(w.has_value());
    (void)co_await spindle::sleep_for(20ms);
    s.first_done_before_rest = !s.first.empty();
    w = co_await p.server.write_all(bytes_of("\nworld\r\n"));
    REQUIRE(w.has_value());
    co_await line_reader;
}

struct too_long_state {
    std::error_code error;
    std::string buffered_then;
    std::string line_after;
};

task<void> line_too_long_main(net::tcp_listener& l, too_long_state& s) {
    tcp_pair p = co_await connect_pair(l);
    net::buffered_reader reader(p.client);
    result<void> w = co_await p.server.write_all(bytes_of(std::string(100, 'a')));
    REQUIRE(w.has_value());
    result<std::string_view> line = co_await reader.read_until("\n", 64);
    s.error = line.error();
    s.buffered_then = text_of(reader.buffered());
    // What arrived stays buffered: with a larger limit the line completes.
    w = co_await p.server.write_all(bytes_of("\n"));
    REQUIRE(w.has_value());
    line = co_await reader.read_until("\n", 200);
    REQUIRE(line.has_value());
    s.line_after = std::string(*line);
}

struct eos_state {
    std::error_code error;
    std::string buffered;
};

task<void> reader_eos_main(net::tcp_listener& l, eos_state& s) {
    tcp_pair p = co_await connect_pair(l);
    net::buffered_reader reader(p.client);
    result<void> w = co_await p.server.write_all(bytes_of("partial"));
    REQUIRE(w.has_value());
    p.server.close();
    result<std::string_view> line = co_await reader.read_until("\n", 100);
    s.error = line.error();
    s.buffered = text_of(reader.buffered());
}

struct mixed_state {
    std::string line;
    std::string buffered_after_line;
    std::string exact;
    std::size_t buffered_after_exact = 99;
    std::string next_line;
};

task<void> mixed_main(net::tcp_listener& l, mixed_state& s) {
    tcp_pair p = co_await connect_pair(l);
    net::buffered_reader reader(p.client);
    result<void> w = co_await p.server.write_all(bytes_of("line\nABCDEF"));
    REQUIRE(w.has_value());
    result<std::string_view> line = co_await reader.read_until("\n", 100);
    REQUIRE(line.has_value());
    s.line = std::string(*line);
    s.buffered_after_line = text_of(reader.buffered());
    auto later = loop::current().spawn([](net::tcp_stream& out) -> task<void> {
        (void)co_await spindle::sleep_for(10ms);
        result<void> w = co_await out.write_all(bytes_of("GHIJtail\n"));
        REQUIRE(w.has_value());
    }(p.server));
    // Six bytes from the buffer, four fresh from the stream.
    std::array<std::byte, 10> ten{};
    result<void> r = co_await reader.read_exact(ten);
    REQUIRE(r.has_value());
    s.exact = text_of(ten);
    s.buffered_after_exact = reader.buffered().size();
    co_await later;
    line = co_await reader.read_until("\n", 100);
    REQUIRE(line.has_value());
    s.next_line = std::string(*line);
}

struct reader_timeout_state {
    std::error_code timed;
    std::string buffered_then;
    std::string line;
};

task<void> reader_timeout_main(net::tcp_listener& l, reader_timeout_state& s) {
    tcp_pair p = co_await connect_pair(l);
    net::buffered_reader reader(p.client);
    result<void> w = co_await p.server.write_all(bytes_of("par"));
    REQUIRE(w.has_value());
    result<std::string_view> line = co_await spindle::with_timeout(30ms, reader.read_until("\n", 100));
    s.timed = line.error();
    s.buffered_then = text_of(reader.buffered());
    w = co_await p.server.write_all(bytes_of("tial\n"));
    REQUIRE(w.has_value());
    line = co_await reader.read_until("\n", 100);
    REQUIRE(line.has_value());
    s.line = std::string(*line);
}

struct small_buffer_state {
    std::vector<std::string> lines;
};

task<void> small_buffer_main(net::tcp_listener& l, small_buffer_state& s) {
    tcp_pair p = co_await connect_pair(l);
    // A 4-byte buffer: a longer line within the limit makes it grow.
    net::buffered_reader reader(p.client, 4);
    auto writer = loop::current().spawn([](net::tcp_stream& out) -> task<void> {
        for (std::string_view part : {"0123", "45678", "9\r", "\nx\r\ny\r\n"}) {
            result<void> w = co_await out.write_all(bytes_of(part));
            REQUIRE(w.has_value());
            (void)co_await spindle::sleep_for(5ms);
        }
    }(p.server));
    for (int i = 0; i < 3; ++i) {
        result<std::string_view> line = co_await reader.read_until("\r\n", 64);
        REQUIRE(line.has_value());
        s.lines.emplace_back(*line);
    }
    co_await writer;
}

}  // namespace

// =====================================================================================

TEST_CASE("tcp: 1,000 concurrent clients on one loop, each echoed its own pattern", "[tcp][load]") {
    constexpr int clients = 1000;
    const rlim_t limit = spindle::test::raise_fd_limit(2100);
    if (limit < 2100) NET_SKIP("RLIMIT_NOFILE is " << limit << ", 2100 descriptors are needed");
    echo_stats st;
    loop l;
    net::listen_options options;
    options.backlog = 2048;
    net::tcp_listener listener = listen_loopback(options);
    run(l, many_main(listener, clients, st), std::chrono::seconds(120));
    for (const auto& f : st.failures) UNSCOPED_INFO(f);
    CHECK(st.failures.empty());
    CHECK(st.accepted == clients);
    CHECK(st.clients_ok == clients);
    CHECK(st.peak_connected == clients);  // all were connected at once
    CHECK(st.server_done == clients);
    CHECK(st.server_errors == 0);
    std::uint64_t expected = 0;
    for (int id = 0; id < clients; ++id) expected += client_size(id);
    CHECK(st.bytes_verified == expected);
}

TEST_CASE("tcp: 64 MiB each way at once arrive intact", "[tcp][bulk]") {
    bulk_direction up, down;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, bulk_main(listener, up, down), std::chrono::seconds(120));
    for (bulk_direction* d : {&up, &down}) {
        CHECK_FALSE(d->write_error);
        CHECK_FALSE(d->read_error);
        CHECK(d->written == bulk_total);
        CHECK(d->received == bulk_total);
        CHECK(d->first_mismatch == npos);
        CHECK(d->eof);
    }
}

TEST_CASE("tcp: connect to a closed port is connection_refused", "[tcp][connect]") {
    const net::address to = closed_port();
    std::vector<std::error_code> errors;
    loop l;
    run(l, connect_errors(to, 5, errors));
    REQUIRE(errors.size() == 5u);
    for (const auto& e : errors) {
        CAPTURE(e.message());
        CHECK(e == std::errc::connection_refused);
    }
    // With a deadline too: the refusal comes first and is not a timeout.
    std::error_code with_deadline;
    run(l, [](net::address to, std::error_code& e) -> task<void> {
        result<net::tcp_stream> s = co_await net::tcp_stream::connect(to, 10s);
        e = s.error();
    }(to, with_deadline));
    CHECK(with_deadline == std::errc::connection_refused);
}

TEST_CASE("tcp: connect with a timeout to a listener whose backlog is full is timed_out", "[tcp][connect][timeout]") {
    spindle::test::full_listener full;
    if (!full.ready) NET_SKIP("the kernel completed every connect to a listener with backlog 0");
    timed_connect t;
    loop l;
    net::tcp_listener live = listen_loopback();
    run(l, connect_timeout_main(full.addr, local_of(live), t));
    CHECK_FALSE(t.has_value);
    CHECK(t.error == std::errc::timed_out);
    CHECK(t.elapsed >= 100ms);
    CHECK(t.live_ok);
}

TEST_CASE("tcp: a peer reset during a pending read is connection_reset", "[tcp][reset]") {
    reset_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, reset_read_main(listener, s));
    CHECK_FALSE(s.done_before_reset);  // the read was parked when the reset came
    CHECK_FALSE(s.has_value);
    CHECK(s.error == std::errc::connection_reset);
}

TEST_CASE("tcp: a peer reset during write_all is broken_pipe or connection_reset, and no SIGPIPE", "[tcp][reset]") {
    spindle::test::sigpipe_kills dfl;  // a SIGPIPE would end this program
    reset_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, reset_write_main(listener, s), std::chrono::seconds(30));
    CHECK(s.server_read == 64u * 1024);
    CHECK(s.server_mismatch == npos);
    CHECK_FALSE(s.done_before_reset);  // 64 MiB cannot fit in the socket buffers
    CHECK_FALSE(s.has_value);
    CAPTURE(s.error.message());
    CHECK((s.error == std::errc::broken_pipe || s.error == std::errc::connection_reset));
}

TEST_CASE("tcp: half-close by the client: the server reads end of stream and still replies", "[tcp][half-close]") {
    half_close_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, client_half_close_main(listener, s));
    CHECK(s.server_got == "request");
    CHECK(s.second_eof_read == 0u);
    CHECK(s.client_got == "reply");
}

TEST_CASE("tcp: half-close by the server: the client reads end of stream and still writes", "[tcp][half-close]") {
    half_close_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, server_half_close_main(listener, s));
    CHECK(s.client_got == "hello");
    CHECK(s.server_got == "bye");
}

TEST_CASE("tcp: after a read that emptied the socket, data and the end that come later are still read", "[tcp][drained]") {
    for (bool borrowed : {false, true}) {
        CAPTURE(borrowed);
        drained_state s;
        loop l;
        net::tcp_listener listener = listen_loopback();
        run(l, drained_main(listener, borrowed, s));
        const std::vector<std::string> expected{"one", "two", "three", "four", "five", "<end>", "<end>", "six", "<end>"};
        CHECK(s.got == expected);
    }
}

TEST_CASE("tcp: closing a stream from another task completes its pending read with operation_canceled", "[tcp][cancel]") {
    close_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, close_pending_main(listener, s));
    CHECK_FALSE(s.done_before_close);
    CHECK_FALSE(s.has_value);
    CHECK(s.error == std::errc::operation_canceled);
    CHECK_FALSE(s.open_after);
    CHECK(s.peer_read == 0u);
}

TEST_CASE("tcp: read_exact gathers partial reads, and is end_of_stream when the peer closes first", "[tcp]") {
    exact_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, read_exact_main(listener, s));
    CHECK(s.full == "0123456789");
    CHECK(s.short_error == net::errc::end_of_stream);
    CHECK(s.short_prefix == "abc.......");  // what arrived stays in the buffer
}

TEST_CASE("tcp: vectored write_all of 1,000 buffers (more than one window of 16) arrives intact", "[tcp][vectored]") {
    vectored_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, vectored_main(listener, s), std::chrono::seconds(30));
    CHECK(s.buffers == 1000u);
    CHECK(s.received == s.total);
    CHECK(s.mismatch == npos);
    CHECK(s.eof);
    CHECK(s.caller_iovecs_unchanged);
}

task<void> accepted_nodelay_main(net::tcp_listener& l, int& accepted) {
    tcp_pair p = co_await connect_pair(l);
    accepted = *p.server.get_option(IPPROTO_TCP, TCP_NODELAY);
}

TEST_CASE("tcp: accepted connections have TCP_NODELAY unless listen_options::no_delay is off", "[tcp][options]") {
    const bool no_delay = GENERATE(true, false);
    INFO("no_delay " << no_delay);
    net::listen_options options;
    options.no_delay = no_delay;
    loop l;
    net::tcp_listener listener = listen_loopback(options);
    int accepted = -1;
    run(l, accepted_nodelay_main(listener, accepted));
    REQUIRE(accepted >= 0);
    CHECK((accepted != 0) == no_delay);
}

TEST_CASE("tcp: set_nodelay and set_keepalive reach the socket", "[tcp][options]") {
    option_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, options_main(listener, s));
    CHECK(s.nodelay_on != 0);
    CHECK(s.nodelay_off == 0);
    CHECK(s.keepalive_on != 0);
    CHECK(s.keepidle == 42);
    CHECK(s.keepidle_longest == 32767);
    CHECK(s.keepalive_off == 0);
}

TEST_CASE("tcp: peer(), peer_address() and local_address() on both ends", "[tcp][address]") {
    address_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, addresses_main(listener, s));
    CHECK(s.listener.family() == net::address_family::ipv4);
    CHECK(s.listener.is_loopback());
    CHECK(s.listener.port() != 0);
    CHECK(s.client_peer == s.listener);
    CHECK(s.client_peer_address == s.listener);
    CHECK(s.server_local == s.listener);
    CHECK(s.server_peer == s.client_local);
    CHECK(s.server_peer_address == s.client_local);
    CHECK(s.client_local.is_loopback());
    CHECK(s.client_local.port() != s.listener.port());
}

TEST_CASE("tcp: a round trip over IPv6 loopback", "[tcp][ipv6]") {
    auto bound = net::tcp_listener::bind(net::address::ipv6_loopback(0));
    if (!bound) NET_SKIP("no IPv6 loopback here: " << bound.error().message());
    v6_state s;
    loop l;
    run(l, v6_main(*bound, s));
    CHECK(s.server_got == "over v6");
    CHECK(s.client_got == "and back");
    CHECK(s.client_peer.family() == net::address_family::ipv6);
    CHECK(s.client_peer.is_loopback());
    CHECK(s.client_peer == local_of(*bound));
    CHECK(s.server_peer.is_loopback());
    CHECK(s.server_peer.to_string().rfind("[::1]:", 0) == 0);
}

TEST_CASE("tcp: listener bind errors", "[tcp][listener]") {
    auto unix_addr = net::address::parse("unix:/tmp/not-for-tcp");
    REQUIRE(unix_addr.has_value());
    auto wrong = net::tcp_listener::bind(*unix_addr);
    REQUIRE_FALSE(wrong.has_value());
    CHECK(wrong.error() == net::errc::invalid_address);
    auto none = net::tcp_listener::bind(net::address());
    REQUIRE_FALSE(none.has_value());
    CHECK(none.error() == net::errc::invalid_address);

    net::tcp_listener first = listen_loopback();
    auto taken = net::tcp_listener::bind(local_of(first));
    REQUIRE_FALSE(taken.has_value());
    CHECK(taken.error() == std::errc::address_in_use);
}

TEST_CASE("tcp: a stop_token cancels a pending accept", "[tcp][listener][cancel]") {
    std::error_code e;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, accept_cancel_main(listener, e));
    CHECK(e == std::errc::operation_canceled);
}

TEST_CASE("tcp: closing a listener completes its pending accept with operation_canceled", "[tcp][listener][cancel]") {
    std::error_code e;
    bool done_before_close = true;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, accept_closed_main(listener, e, done_before_close));
    CHECK_FALSE(done_before_close);
    CHECK(e == std::errc::operation_canceled);
    CHECK_FALSE(listener.is_open());
}

TEST_CASE("buffered_reader: read_until finds a \"\\r\\n\" that arrives in two writes", "[tcp][buffered]") {
    lines_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, split_delimiter_main(listener, s));
    CHECK_FALSE(s.first_done_before_rest);  // "\r" alone did not end the line
    CHECK(s.first == "hello\r\n");
    CHECK(s.second == "world\r\n");
}

TEST_CASE("buffered_reader: line_too_long keeps the bytes buffered", "[tcp][buffered]") {
    too_long_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, line_too_long_main(listener, s));
    CHECK(s.error == net::errc::line_too_long);
    CHECK(s.buffered_then.size() >= 64u);
    CHECK(s.buffered_then == std::string(s.buffered_then.size(), 'a'));
    CHECK(s.line_after == std::string(100, 'a') + "\n");
}

TEST_CASE("buffered_reader: end_of_stream before a delimiter leaves what arrived in buffered()", "[tcp][buffered]") {
    eos_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, reader_eos_main(listener, s));
    CHECK(s.error == net::errc::end_of_stream);
    CHECK(s.buffered == "partial");
}

TEST_CASE("buffered_reader: read_exact takes buffered bytes first, then fresh ones", "[tcp][buffered]") {
    mixed_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, mixed_main(listener, s));
    CHECK(s.line == "line\n");
    CHECK(s.buffered_after_line == "ABCDEF");
    CHECK(s.exact == "ABCDEFGHIJ");
    CHECK(s.buffered_after_exact == 0u);
    CHECK(s.next_line == "tail\n");
}

TEST_CASE("buffered_reader: a read_until that timed out keeps what arrived, and the line completes later", "[tcp][buffered][timeout]") {
    reader_timeout_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, reader_timeout_main(listener, s));
    CHECK(s.timed == std::errc::timed_out);
    CHECK(s.buffered_then == "par");
    CHECK(s.line == "partial\n");
}

TEST_CASE("buffered_reader: a buffer smaller than a line grows up to the limit", "[tcp][buffered]") {
    small_buffer_state s;
    loop l;
    net::tcp_listener listener = listen_loopback();
    run(l, small_buffer_main(listener, s));
    REQUIRE(s.lines.size() == 3u);
    CHECK(s.lines[0] == "0123456789\r\n");
    CHECK(s.lines[1] == "x\r\n");
    CHECK(s.lines[2] == "y\r\n");
}
