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
#include "static_site.hpp"
#include "tls_service.hpp"

#include <fcntl.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

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

// --root: one site for every loop of the process (it only holds the root's descriptor).
http::static_site site;

task<void> serve_site_tcp(net::tcp_stream stream, std::stop_token stop) {
    co_await http::serve_site_connection(stream, site, stop);
}

}  // namespace

int main(int argc, char** argv) {
#if defined(__GLIBC__)
    // Request bodies of megabytes (POST /sha256) get pages of their own,
    // given back by munmap when freed. Otherwise glibc's threshold rises with
    // the first such free and later bodies come from a loop thread's arena,
    // whose trimming (madvise, with the arena's lock held) then blocks that
    // loop for milliseconds.
    ::mallopt(M_MMAP_THRESHOLD, 1024 * 1024);
#endif
    tls_flags tls;
    std::string root;
    const auto tls_options = tls.flags();
    const std::array<service_flag, 3> flags{
        tls_options[0], tls_options[1],
        service_flag{"--root", "DIR",
                     "serve the files under DIR (GET, HEAD, one byte range, If-Modified-Since) and POST /sha256",
                     [&root](std::string_view v) {
                         root = v;
                         return std::string();
                     }}};
    const service_options options = parse_service_options(
        argc, argv,
        {.name = "spindle-http",
         .description = "A minimal HTTP/1.1 server: GET / answers \"Hello, World!\" (GET /bytes/N: N bytes, up to 1 MiB; "
                        "GET /metrics: the loops' metrics, Prometheus text); keep-alive and pipelining.",
         .default_port = 8080,
         .flags = flags});
    const http::dynamic_route metrics = metrics_route();
    site.dynamic = std::span(&metrics, 1);
    if (!root.empty()) {
        // Opened once, before any loop runs: a blocking call is fine here.
        site.root_fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (site.root_fd < 0) {
            std::fprintf(stderr, "spindle-http: --root %s: %s\n", root.c_str(), std::strerror(errno));
            return 1;
        }
    }
    if (tls.enabled()) {
#if SPINDLE_HAVE_TLS
        tls::context ctx = server_context(tls, "spindle-http", {"http/1.1"});
        if (!ctx) return 1;
        return serve_tcp(options, loop_options{}, "spindle-http",
                         serve_tls(std::move(ctx), [](tls::tcp_stream& s, std::stop_token stop) -> task<void> {
                             if (site.root_fd >= 0)
                                 co_await http::serve_site_connection(s, site, std::move(stop));
                             else
                                 co_await serve_connection(s, std::move(stop));
                         }));
#else
        return no_tls("spindle-http");
#endif
    }
    if (site.root_fd >= 0) return serve_tcp(options, loop_options{}, "spindle-http", serve_site_tcp);
    return serve_tcp(options, loop_options{}, "spindle-http", serve_tcp_connection);
}
