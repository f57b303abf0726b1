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

using namespace spindle;
using namespace spindle::examples;

namespace {

// Any byte stream: run_tcp_service hands in a tcp_stream; an encrypted stream
// would be served the same way.
template <net::byte_stream Stream>
task<void> serve_connection(Stream stream, std::stop_token stop) {
    // One buffer of responses per connection: its capacity survives clear().
    http::output_buffer out(4096);
    co_await serve_batches(
        stream, stop,
        [&](std::string_view input) {
            out.clear();
            http::batch_result batch = http::handle_batch(input, out);
            return batch_outcome{batch.consumed, out.view(), batch.close};
        },
        /*linger=*/true);
}

}  // namespace

int main(int argc, char** argv) {
    const service_options options = parse_service_options(
        argc, argv,
        {"spindle-http", "A minimal HTTP/1.1 server: GET / answers \"Hello, World!\"; keep-alive and pipelining.", 8080});
    return serve_tcp(options, loop_options{}, "spindle-http", serve_connection<net::tcp_stream>);
}
