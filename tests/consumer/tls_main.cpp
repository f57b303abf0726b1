// A user of spindle-tls outside the tree, as tests/consumer/check.sh builds
// it with `pkg-config --cflags --libs spindle-tls`: a client handshake to a
// peer that answers in plain text fails with OpenSSL's reason.

#include <spindle/net/memory_stream.hpp>
#include <spindle/spindle.hpp>
#include <spindle/tls.hpp>

#include <cstdio>
#include <string_view>

namespace net = spindle::net;
namespace tls = spindle::tls;

spindle::task<int> run() {
    spindle::result<tls::context> ctx = tls::context::client({});
    if (!ctx) co_return 1;
    auto [ours, theirs] = net::memory_stream::pair();
    constexpr std::string_view reply = "HTTP/1.1 400 Bad Request\r\n\r\n";
    if (!co_await theirs.write_all(std::as_bytes(std::span(reply.data(), reply.size())))) co_return 1;
    spindle::result<tls::stream<net::memory_stream>> s = tls::stream<net::memory_stream>::client(*ctx, std::move(ours), "localhost");
    if (!s) co_return 1;
    spindle::result<void> h = co_await s->handshake();
    if (h) co_return 1;
    std::printf("handshake with a plain-text peer: %s\n", h.error().message().c_str());
    co_return h.error().category() == tls::tls_category() ? 0 : 1;
}

int main() {
    spindle::loop loop;
    return loop.block_on(run());
}
