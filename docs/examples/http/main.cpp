// spindle-http: a minimal HTTP/1.1 server. GET / answers "Hello, World!";
// keep-alive and pipelining; malformed requests get 400, heads over 8 KiB get
// 431, and the connection is closed after either.
//
// Per batch of pipelined requests it does one read, answers every complete
// request into one output buffer, and writes that buffer once. Both buffers
// live as long as the connection, so a request in steady state allocates
// nothing.

#include "http_protocol.hpp"
#include "service.hpp"

#include <cstring>
#include <memory>

using namespace spindle;
using namespace spindle::examples;

namespace {

// Room for a full head plus pipelined requests behind it; grows only for a
// request body larger than what is left (up to the parser's body limit).
constexpr std::size_t read_buffer_size = 16 * 1024;

// After an error response the client may still be sending. Closing with its
// bytes unread would make the kernel send a reset, which can destroy the
// response before the client reads it: half-close, then read and discard for a
// short while (as nginx's lingering close does).
task<void> close_gracefully(net::tcp_stream& stream, std::span<std::byte> scratch, std::stop_token stop) {
    using namespace std::chrono_literals;
    if (!stream.shutdown_write()) co_return;
    const auto until = clock::now() + 500ms;
    for (std::size_t drained = 0; drained < 1024 * 1024;) {
        result<std::size_t> n = co_await with_deadline(until, stream.read_some(scratch, stop));
        if (!n || *n == 0) co_return;
        drained += *n;
    }
}

task<void> serve_connection(net::tcp_stream stream, std::stop_token stop) {
    (void)stream.set_nodelay(true);
    std::unique_ptr<char[]> in(new char[read_buffer_size]);
    std::size_t capacity = read_buffer_size;
    std::size_t used = 0;
    http::output_buffer out(4096);
    for (;;) {
        if (used == capacity) {
            // A body that does not fit yet: the parser bounds it, so does this.
            std::unique_ptr<char[]> bigger(new char[capacity * 2]);
            std::memcpy(bigger.get(), in.get(), used);
            in = std::move(bigger);
            capacity *= 2;
        }
        result<std::size_t> n =
            co_await stream.read_some(std::as_writable_bytes(std::span(in.get() + used, capacity - used)), stop);
        if (!n || *n == 0) break;  // closed, reset, or the server is stopping
        used += *n;

        out.clear();
        http::batch_result batch = http::handle_batch(std::string_view(in.get(), used), out);
        if (!out.empty()) {
            if (result<void> w = co_await stream.write_all(out.bytes(), stop); !w) break;
        }
        if (batch.close) {
            co_await close_gracefully(stream, std::as_writable_bytes(std::span(in.get(), capacity)), stop);
            break;
        }
        used -= batch.consumed;
        if (used > 0 && batch.consumed > 0) std::memmove(in.get(), in.get() + batch.consumed, used);
    }
    // The stream closes here, on leaving the frame.
}

}  // namespace

int main(int argc, char** argv) {
    const service_options options = parse_service_options(
        argc, argv,
        {"spindle-http", "A minimal HTTP/1.1 server: GET / answers \"Hello, World!\"; keep-alive and pipelining.", 8080});
    loop_options lo;
    lo.backend = options.backend;
    return run_service_loop(lo, [&] { return run_tcp_service(options, "spindle-http", serve_connection); });
}
