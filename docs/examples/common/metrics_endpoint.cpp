#include "metrics_endpoint.hpp"

#include <spindle/loop_group.hpp>
#include <spindle/metrics.hpp>

#include <charconv>
#include <cstdio>
#include <span>
#include <vector>

namespace spindle::examples {

std::string scrape_metrics() {
    if (loop_group* group = loop_group::current_or_null()) {
        // Another loop's metrics() may be read from this thread; its loop
        // outlives every main of the group, so also this scrape.
        return to_prometheus(group->metrics());
    }
    return to_prometheus(loop::current().metrics());
}

http::dynamic_route metrics_route() { return {"/metrics", prometheus_content_type, scrape_metrics}; }

service_flag metrics_endpoint::flag() {
    return {"--metrics-port", "N",
            "serve GET /metrics (Prometheus text) on 127.0.0.1:N, loopback only (default: not served; 0 picks a free port)",
            [this](std::string_view text) {
                unsigned port = 0;
                const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
                if (ec != std::errc() || end != text.data() + text.size() || port > 65535) return std::string("not a port");
                m_port = static_cast<std::uint16_t>(port);
                return std::string();
            }};
}

bool metrics_endpoint::bind(std::string_view name) {
    const int n = static_cast<int>(name.size());
    result<net::address> at = net::address::from_ip("127.0.0.1", m_port.value_or(0));
    result<net::tcp_listener> listener = at ? net::tcp_listener::bind(*at) : result<net::tcp_listener>(at.error());
    if (!listener) {
        std::fprintf(stderr, "%.*s: cannot serve metrics on 127.0.0.1:%u: %s\n", n, name.data(), unsigned{m_port.value_or(0)},
                     listener.error().message().c_str());
        return false;
    }
    m_listener = std::move(*listener);
    result<net::address> local = m_listener.local_address();
    std::printf("%.*s metrics on %s\n", n, name.data(), local ? local->to_string().c_str() : "127.0.0.1");
    std::fflush(stdout);
    return true;
}

companion metrics_endpoint::serve() {
    if (!m_port) return {};
    return [this](std::stop_token stop) { return run(std::move(stop)); };
}

namespace {

task<void> serve_scrapes(net::tcp_stream stream, std::stop_token stop) {
    // Only the metrics: the example server's own pages are not served here.
    const http::dynamic_route metrics = metrics_route();
    const http::route_table routes{false, std::span(&metrics, 1)};
    http::output_buffer out(4096);
    co_await serve_batches(
        stream, stop,
        [&](std::string_view input) {
            out.clear();
            const http::batch_result batch = http::handle_batch(input, out, {}, routes);
            return batch_outcome{batch.consumed, out.view(), batch.close};
        },
        /*linger=*/true);
}

}  // namespace

task<void> metrics_endpoint::run(std::stop_token stop) {
    connection_set connections;
    for (;;) {
        result<net::tcp_stream> stream = co_await m_listener.accept(stop);
        if (!stream) {
            if (stop.stop_requested()) break;
            logger()->warn("metrics: accept: {}", stream.error().message());
            continue;
        }
        connections.spawn(serve_scrapes(std::move(*stream), stop));
    }
    m_listener.close();
    co_await connections.wait_all();
}

}  // namespace spindle::examples
