// spindle-echo: a TCP echo server, one coroutine per connection.

#include "service.hpp"

#include <array>

using namespace spindle;
using namespace spindle::examples;

namespace {

// In the frame, so a connection costs one allocation and a message none.
constexpr std::size_t buffer_size = 16 * 1024;

bool cancelled(std::error_code error) noexcept { return error == std::errc::operation_canceled; }

// Any byte stream: run_tcp_service hands it a tcp_stream (with TCP_NODELAY
// set); an encrypted stream or a test's memory_stream would do as well.
template <net::byte_stream Stream>
task<void> echo(Stream stream, std::stop_token stop) {
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

}  // namespace

int main(int argc, char** argv) {
    const service_options options =
        parse_service_options(argc, argv, {"spindle-echo", "A TCP echo server, one coroutine per connection.", 7007});
    return serve_tcp(options, loop_options{}, "spindle-echo", echo<net::tcp_stream>);
}
