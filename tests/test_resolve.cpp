// Name resolution (spindle/net/resolve.hpp) and connecting by name. Only
// "localhost", numeric hosts and a name under the reserved ".invalid" domain
// (which must fail) are looked up.

#include "net_support.hpp"

#include <spindle/net/resolve.hpp>
#include <spindle/net/tcp.hpp>

#include <array>
#include <chrono>
#include <fstream>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using spindle::join_handle;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::test::bytes_of;
using spindle::test::run;
using spindle::test::text_of;
namespace net = spindle::net;

namespace {

/// The threads of this process, from /proc.
int thread_count() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
        if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
    return -1;
}

struct lookup {
    bool has_value = false;
    std::error_code error;
    std::vector<net::address> found;
};

task<void> resolve_into(std::string host, std::string service, net::resolve_hints hints, lookup& out) {
    result<std::vector<net::address>> r = co_await net::resolve(std::move(host), std::move(service), hints);
    out.has_value = r.has_value();
    out.error = r.error();
    if (r) out.found = *r;
}

task<void> ticker(long& count, const bool& stop) {
    for (int i = 0; i < 10'000'000 && !stop; ++i) {
        ++count;
        co_await spindle::yield();
    }
}

struct numeric_state {
    long ticks_during_v4 = -1;
    long ticks_during_v6 = -1;
    lookup v4;
    lookup v6;
};

task<void> numeric_main(numeric_state& s) {
    long ticks = 0;
    bool stop = false;
    auto t = loop::current().spawn(ticker(ticks, stop));
    for (int i = 0; i < 3; ++i) co_await spindle::yield();
    REQUIRE(ticks > 0);  // the ticker does run between our suspensions
    // A numeric host completes inside co_await: no other task runs meanwhile,
    // so no worker and no post were involved.
    long before = ticks;
    co_await resolve_into("127.0.0.1", "80", {}, s.v4);
    s.ticks_during_v4 = ticks - before;
    before = ticks;
    co_await resolve_into("::1", "443", {}, s.v6);
    s.ticks_during_v6 = ticks - before;
    stop = true;
    co_await t;
}

struct cancel_state {
    bool parked = false;
    std::error_code cancelled;
    std::error_code pre_stopped;
    lookup after;
};

task<void> cancel_main(cancel_state& s) {
    loop& l = loop::current();
    std::stop_source stop;
    auto resolver = l.spawn([](std::stop_token token, cancel_state& s) -> task<void> {
        s.parked = true;
        result<std::vector<net::address>> r = co_await net::resolve("localhost", "80", {}, std::move(token));
        s.cancelled = r.error();
    }(stop.get_token(), s));
    // The resolver runs first in the next tick and parks; we run right after it,
    // in the same tick. The worker's answer can only reach the loop through a
    // post, in a later tick: the cancellation comes first, whatever the worker does.
    co_await spindle::yield();
    REQUIRE(s.parked);
    REQUIRE_FALSE(resolver.done());
    stop.request_stop();
    co_await resolver;
    // Let the worker finish and its answer be dropped.
    (void)co_await spindle::sleep_for(200ms);

    std::stop_source already;
    already.request_stop();
    result<std::vector<net::address>> r = co_await net::resolve("localhost", "80", {}, already.get_token());
    s.pre_stopped = r.error();

    co_await resolve_into("localhost", "80", {}, s.after);
}

task<void> many_main(int count, std::vector<lookup>& out) {
    loop& l = loop::current();
    out.resize(static_cast<std::size_t>(count));
    std::vector<join_handle<void>> handles;
    for (int i = 0; i < count; ++i) handles.push_back(l.spawn(resolve_into("localhost", std::to_string(1000 + i), {}, out[static_cast<std::size_t>(i)])));
    for (auto& h : handles) co_await h;
}

struct connect_state {
    bool has_value = false;
    std::error_code error;
    net::address peer;
    std::string server_got;
    std::error_code closed_port;
    std::error_code no_such_host;
};

task<void> connect_by_name_main(net::tcp_listener& l, std::uint16_t closed, connect_state& s) {
    const std::uint16_t port = l.local_address()->port();
    result<net::tcp_stream> c = co_await net::tcp_stream::connect("localhost", std::to_string(port));
    s.has_value = c.has_value();
    s.error = c.error();
    if (c) {
        s.peer = c->peer();
        result<void> w = co_await c->write_all(bytes_of("by name"));
        REQUIRE(w.has_value());
        result<net::tcp_stream> accepted = co_await l.accept();
        REQUIRE(accepted.has_value());
        std::array<std::byte, 7> in{};
        result<void> r = co_await accepted->read_exact(in);
        REQUIRE(r.has_value());
        s.server_got = text_of(in);
    }
    // Every address refused: the last error is what comes back.
    c = co_await net::tcp_stream::connect("localhost", std::to_string(closed));
    s.closed_port = c.error();
    c = co_await net::tcp_stream::connect("no-such-host.invalid", "80");
    s.no_such_host = c.error();
}

}  // namespace

// =====================================================================================

TEST_CASE("resolve: a numeric host is parsed in place, without the worker pool", "[resolve]") {
    numeric_state s;
    loop l;
    // Counted once the loop exists: a backend may start threads of its own
    // (libkqueue does); the resolver must not.
    const int threads_before = thread_count();
    run(l, numeric_main(s));
    CHECK(s.ticks_during_v4 == 0);
    CHECK(s.ticks_during_v6 == 0);
    REQUIRE(s.v4.has_value);
    REQUIRE(s.v4.found.size() == 1u);
    CHECK(s.v4.found[0] == net::address::ipv4_loopback(80));
    REQUIRE(s.v6.has_value);
    REQUIRE(s.v6.found.size() == 1u);
    CHECK(s.v6.found[0] == net::address::ipv6_loopback(443));
    // No worker thread was started for them.
    CHECK(thread_count() == threads_before);
}

TEST_CASE("resolve: \"localhost\" gives loopback addresses with the service's port", "[resolve]") {
    lookup any, v4, udp;
    loop l;
    run(l, resolve_into("localhost", "80", {}, any), std::chrono::seconds(30));
    INFO(any.error.message());
    REQUIRE(any.has_value);
    REQUIRE_FALSE(any.found.empty());
    for (const net::address& a : any.found) {
        CAPTURE(a.to_string());
        CHECK(a.is_loopback());
        CHECK(a.port() == 80);
    }
    for (std::size_t i = 0; i < any.found.size(); ++i)
        for (std::size_t j = i + 1; j < any.found.size(); ++j) CHECK_FALSE(any.found[i] == any.found[j]);

    net::resolve_hints only_v4;
    only_v4.family = net::address_family::ipv4;
    run(l, resolve_into("localhost", "8080", only_v4, v4), std::chrono::seconds(30));
    REQUIRE(v4.has_value);
    REQUIRE(v4.found.size() == 1u);
    CHECK(v4.found[0] == net::address::ipv4_loopback(8080));

    net::resolve_hints datagram = only_v4;
    datagram.datagram = true;
    run(l, resolve_into("localhost", "53", datagram, udp), std::chrono::seconds(30));
    REQUIRE(udp.has_value);
    REQUIRE(udp.found.size() == 1u);
    CHECK(udp.found[0] == net::address::ipv4_loopback(53));
}

TEST_CASE("resolve: a name that does not exist is resolve_failed", "[resolve]") {
    lookup r;
    loop l;
    // ".invalid" is reserved: no resolver may answer it.
    run(l, resolve_into("no-such-host.invalid", "80", {}, r), std::chrono::seconds(40));
    CHECK_FALSE(r.has_value);
    CAPTURE(r.error.message());
    CHECK(r.error == net::errc::resolve_failed);
    CHECK(r.found.empty());
}

TEST_CASE("resolve: a stop_token cancels a pending resolution at once; the worker's answer is dropped", "[resolve][cancel]") {
    cancel_state s;
    loop l;
    run(l, cancel_main(s), std::chrono::seconds(30));
    CHECK(s.cancelled == std::errc::operation_canceled);
    CHECK(s.pre_stopped == std::errc::operation_canceled);
    // The pool serves the next one as usual.
    REQUIRE(s.after.has_value);
    CHECK_FALSE(s.after.found.empty());
}

TEST_CASE("resolve: many resolutions at once all complete", "[resolve]") {
    std::vector<lookup> out;
    loop l;
    run(l, many_main(16, out), std::chrono::seconds(30));
    REQUIRE(out.size() == 16u);
    for (std::size_t i = 0; i < out.size(); ++i) {
        CAPTURE(i);
        REQUIRE(out[i].has_value);
        REQUIRE_FALSE(out[i].found.empty());
        CHECK(out[i].found[0].port() == 1000 + i);
    }
}

TEST_CASE("resolve: a loop destroyed while a resolution is pending leaves the worker nothing to touch", "[resolve][lifetime]") {
    lookup never;
    {
        loop l;
        auto h = l.spawn(resolve_into("localhost", "80", {}, never));
        l.run_once(std::chrono::nanoseconds::zero());  // the task runs and parks
        REQUIRE_FALSE(h.done());
    }
    // The worker answers into the void.
    std::this_thread::sleep_for(200ms);
    CHECK_FALSE(never.has_value);
    CHECK_FALSE(never.error);
    // And the pool still serves a new loop.
    lookup later;
    loop l2;
    run(l2, resolve_into("localhost", "80", {}, later), std::chrono::seconds(30));
    CHECK(later.has_value);
}

TEST_CASE("tcp_stream::connect(\"localhost\", port) resolves and connects", "[resolve][tcp]") {
    std::uint16_t closed = 0;
    {
        auto gone = net::tcp_listener::bind(net::address::ipv4_loopback(0));
        REQUIRE(gone.has_value());
        closed = gone->local_address()->port();
    }
    connect_state s;
    loop l;
    auto listener = net::tcp_listener::bind(net::address::ipv4_loopback(0));
    REQUIRE(listener.has_value());
    run(l, connect_by_name_main(*listener, closed, s), std::chrono::seconds(40));
    CAPTURE(s.error.message());
    REQUIRE(s.has_value);
    CHECK(s.peer == *listener->local_address());
    CHECK(s.server_got == "by name");
    CHECK(s.closed_port == std::errc::connection_refused);
    CHECK(s.no_such_host == net::errc::resolve_failed);
}
