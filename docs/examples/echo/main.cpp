// spindle-echo: a TCP echo server, one coroutine per connection; over TLS
// with --tls-cert and --tls-key; GET /metrics on a loopback port with
// --metrics-port.

#include "metrics_endpoint.hpp"
#include "service.hpp"
#include "tls_service.hpp"

#include <array>
#include <vector>

using namespace spindle;
using namespace spindle::examples;

namespace {

// For a stream that cannot lend buffers: in the frame, so a connection costs
// one allocation and a message none.
constexpr std::size_t buffer_size = 16 * 1024;

bool cancelled(std::error_code error) noexcept { return error == std::errc::operation_canceled; }

// A socket lends its reads' buffers: a connection waiting for input holds no
// buffer at all, only its frame (about 5 KiB less per idle connection).
template <net::reads_borrowed Stream>
task<void> echo(Stream& stream, std::stop_token stop) {
    for (;;) {
        result<borrowed_buffer> got = co_await stream.read_borrowed(stop);
        if (!got) {
            if (!cancelled(got.error())) logger()->debug("echo: read: {}", got.error().message());
            break;
        }
        if (got->empty()) break;  // the peer closed
        if (result<void> w = co_await stream.write_all(got->bytes(), stop); !w) {
            if (!cancelled(w.error())) logger()->debug("echo: write: {}", w.error().message());
            break;
        }
    }
}

// Any other byte stream: the encrypted stream over a socket, a test's
// memory_stream.
template <net::byte_stream Stream>
    requires(!net::reads_borrowed<Stream>)
task<void> echo(Stream& stream, std::stop_token stop) {
    std::array<std::byte, buffer_size> buffer;
    for (;;) {
        // Both calls take the stop token, so shutdown ends a connection parked
        // in either: a client that never reads cannot hold the server open.
        result<std::size_t> n = co_await stream.read_some(buffer, stop);
        if (!n) {
            if (!cancelled(n.error())) logger()->debug("echo: read: {}", n.error().message());
            break;
        }
        if (*n == 0) break;  // the peer closed
        if (result<void> w = co_await stream.write_all(std::span(buffer).first(*n), stop); !w) {
            if (!cancelled(w.error())) logger()->debug("echo: write: {}", w.error().message());
            break;
        }
    }
}

static_assert(net::reads_borrowed<net::tcp_stream>);
task<void> echo_tcp(net::tcp_stream stream, std::stop_token stop) { co_await echo(stream, stop); }

}  // namespace

int main(int argc, char** argv) {
    tls_flags tls;
    metrics_endpoint metrics;
    const auto tls_flag_list = tls.flags();
    const std::vector<service_flag> flags{tls_flag_list[0], tls_flag_list[1], metrics.flag()};
    const service_options options = parse_service_options(
        argc, argv, {.name = "spindle-echo", .description = "A TCP echo server, one coroutine per connection.", .default_port = 7007, .flags = flags});
    if (metrics.enabled() && !metrics.bind("spindle-echo")) return 1;
    if (tls.enabled()) {
#if SPINDLE_HAVE_TLS
        tls::context ctx = server_context(tls, "spindle-echo", {});
        if (!ctx) return 1;
        return serve_tcp(options, loop_options{}, "spindle-echo",
                         serve_tls(std::move(ctx), [](tls::tcp_stream& s, std::stop_token stop) { return echo(s, std::move(stop)); }),
                         no_group_setup, metrics.serve());
#else
        return no_tls("spindle-echo");
#endif
    }
    return serve_tcp(options, loop_options{}, "spindle-echo", echo_tcp, no_group_setup, metrics.serve());
}
