// A program outside spindle's tree, built by check.sh against an installed
// spindle (pkg-config) and with spindle as a meson subproject: a task, a sleep
// and a TCP round trip on loopback. Exit status 0 only if the bytes came back.
#include <spindle/net.hpp>
#include <spindle/spindle.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <tuple>

using namespace std::chrono_literals;
namespace net = spindle::net;

spindle::task<std::array<std::byte, 4>> serve(net::tcp_listener& listener) {
    net::tcp_stream peer = (co_await listener.accept()).value();
    std::array<std::byte, 4> got{};
    (co_await peer.read_exact(got)).value();
    co_return got;
}

spindle::task<void> send_ping(net::address to) {
    (void)co_await spindle::sleep_for(1ms);  // the accept is parked by now
    net::tcp_stream stream = (co_await net::tcp_stream::connect(to)).value();
    (co_await net::write_all(stream, {"pi", "ng"})).value();  // one gather write of two pieces
}

spindle::task<bool> round_trip() {
    net::tcp_listener listener = net::tcp_listener::bind(net::address::ipv4_loopback(0)).value();
    auto both = co_await spindle::when_all(serve(listener), send_ping(listener.local_address().value()));
    const std::array<std::byte, 4>& got = std::get<0>(both);
    co_return std::memcmp(got.data(), "ping", got.size()) == 0;
}

int main() {
    try {
        spindle::loop loop;
        const bool ok = loop.block_on(round_trip());
        std::puts(ok ? "consumer: round trip ok" : "consumer: wrong bytes");
        return ok ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "consumer: %s\n", e.what());
        return 1;
    }
}
