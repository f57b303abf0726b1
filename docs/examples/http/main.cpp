// spindle-http: a minimal HTTP/1.1 server. GET / answers "Hello, World!"
// (GET /bytes/N: N bytes, up to 1 MiB, for throughput tests; GET /metrics:
// the loops' metrics in the Prometheus text format);
// keep-alive and pipelining; malformed requests get 400, heads over 8 KiB get
// 431, and the connection is closed after either. HTTPS with --tls-cert and
// --tls-key (ALPN http/1.1).
//
// Per batch of pipelined requests it does one read, answers every complete
// request into one output buffer, and writes that buffer once. Requests are
// parsed in the buffer the read borrowed from the loop; the output buffer
// lives as long as the connection, so a request in steady state allocates
// nothing, and a connection waiting for its next request holds no read buffer.

#include "http_protocol.hpp"
#include "metrics_endpoint.hpp"
#include "service.hpp"
#include "tls_service.hpp"

using namespace spindle;
using namespace spindle::examples;

namespace {

// Any byte stream: a tcp_stream, or the encrypted stream over one.
template <net::byte_stream Stream>
task<void> serve_connection(Stream& stream, std::stop_token stop) {
    // One buffer of responses per connection: its capacity survives clear().
    // Grown by the first responses rather than reserved, so a connection
    // that waits for its first request holds none of it.
    http::output_buffer out;
    const http::dynamic_route metrics = metrics_route();
    const http::route_table routes{true, std::span(&metrics, 1)};
    co_await serve_batches(
        stream, stop,
        [&](std::string_view input) {
            out.clear();
            http::batch_result batch = http::handle_batch(input, out, {}, routes);
            return batch_outcome{batch.consumed, out.view(), batch.close};
        },
        /*linger=*/true);
}

task<void> serve_tcp_connection(net::tcp_stream stream, std::stop_token stop) { co_await serve_connection(stream, stop); }

}  // namespace

int main(int argc, char** argv) {
    tls_flags tls;
    const auto flags = tls.flags();
    const service_options options = parse_service_options(
        argc, argv,
        {.name = "spindle-http",
         .description = "A minimal HTTP/1.1 server: GET / answers \"Hello, World!\" (GET /bytes/N: N bytes, up to 1 MiB; "
                        "GET /metrics: the loops' metrics, Prometheus text); keep-alive and pipelining.",
         .default_port = 8080,
         .flags = flags});
    if (tls.enabled()) {
#if SPINDLE_HAVE_TLS
        tls::context ctx = server_context(tls, "spindle-http", {"http/1.1"});
        if (!ctx) return 1;
        return serve_tcp(options, loop_options{}, "spindle-http",
                         serve_tls(std::move(ctx), [](tls::tcp_stream& s, std::stop_token stop) { return serve_connection(s, std::move(stop)); }));
#else
        return no_tls("spindle-http");
#endif
    }
    return serve_tcp(options, loop_options{}, "spindle-http", serve_tcp_connection);
}
