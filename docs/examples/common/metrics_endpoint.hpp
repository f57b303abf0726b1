#pragma once
// The example services' metrics in the Prometheus text format: the loop's
// (or, with --threads, every loop's, labelled loop="i") as GET /metrics.
// spindle-http answers it on its own port; the other services take
// --metrics-port N and answer it on a loopback listener of its own, where
// nothing else is served.

#include "http_protocol.hpp"
#include "service.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace spindle::examples {

/// The content type of the text exposition format, version 0.0.4.
inline constexpr std::string_view prometheus_content_type = "text/plain; version=0.0.4; charset=utf-8";

/// The Prometheus text of the calling thread's loop or, on a loop of a group,
/// of every loop of the group.
std::string scrape_metrics();

/// GET /metrics: scrape_metrics() as prometheus_content_type.
http::dynamic_route metrics_route();

/// --metrics-port N: an HTTP/1.1 listener on 127.0.0.1:N that answers
/// GET /metrics, 404 for any other path and 405 for any other method, with
/// keep-alive; a malformed request gets its 4xx and the connection is closed.
/// Loopback only: the numbers say how busy the service is, which is nobody
/// else's business, and a scraper on another host goes through a proxy.
class metrics_endpoint {
public:
    /// The flag, for service_info::flags. Keep the endpoint alive while the
    /// flag may be parsed and the service runs: both refer to it.
    service_flag flag();
    bool enabled() const noexcept { return m_port.has_value(); }

    /// Binds the port, before any loop runs (the first loop to accept on it
    /// adopts it), and prints "<name> metrics on 127.0.0.1:PORT". Says why
    /// on stderr and returns false when it cannot.
    bool bind(std::string_view name);

    /// What serve_tcp runs beside the service once bound: serving scrapes
    /// until the service stops. Empty when the flag was not given.
    companion serve();

private:
    task<void> run(std::stop_token stop);

    std::optional<std::uint16_t> m_port;
    net::tcp_listener m_listener;
};

}  // namespace spindle::examples
