#pragma once
// A closed-loop load generator on spindle itself: N connections, each keeping
// `depth` requests in flight (sent together, answered together), for a fixed
// time. Every answer is checked byte for byte; latencies go into a fixed
// histogram, so measuring allocates nothing while it runs.

#include <spindle/net.hpp>
#include <spindle/spindle.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <string>

namespace spindle::examples {

enum class load_mode { echo, http };

struct load_options {
    load_mode mode = load_mode::echo;
    net::address target;
    int connections = 50;
    std::size_t message_size = 64;  ///< echo: bytes per message
    int depth = 1;                  ///< requests in flight per connection
    std::chrono::milliseconds duration{3000};
    /// A new connection for each batch of `depth` requests (with TLS: a
    /// handshake each, so handshakes per second).
    bool reconnect = false;
    /// TLS: verify the server against `tls_ca` (PEM file; empty: the
    /// system's store) and the name `server_name`; with `tls_resume`,
    /// reconnections resume the session instead of a full handshake.
    bool tls = false;
    std::string tls_ca;
    std::string server_name;
    bool tls_resume = false;
};

/// Latencies in microseconds, in buckets of about 3% width up to 10 s.
class latency_histogram {
public:
    void add(std::chrono::nanoseconds d) noexcept;
    void merge(const latency_histogram& other) noexcept;
    /// The latency below which a share `q` (0..1) of the samples fall, in µs.
    double quantile(double q) const noexcept;
    std::uint64_t count() const noexcept { return m_count; }

private:
    static constexpr int bucket_count = 32 * 24;
    static int bucket_of(double us) noexcept;
    static double upper_of(int bucket) noexcept;
    std::array<std::uint64_t, bucket_count> m_buckets{};
    std::uint64_t m_count = 0;
};

struct load_report {
    std::uint64_t requests = 0;       ///< answered and verified
    std::uint64_t bytes = 0;          ///< payload bytes received
    std::uint64_t errors = 0;         ///< connections that failed or saw wrong bytes
    std::uint64_t connections = 0;    ///< connections made (with TLS, handshakes)
    bool reconnected = false;         ///< --reconnect: connections/s is a figure of its own
    std::string first_error;
    std::chrono::nanoseconds elapsed{};
    latency_histogram latency;

    double requests_per_second() const noexcept;
    double mib_per_second() const noexcept;
    double connections_per_second() const noexcept;
    /// One line: "12345 req/s, 1.2 MiB/s, p50 80 us, p99 210 us, 0 errors"
    /// (and connections per second when it reconnected).
    std::string summary() const;
};

/// Runs the load on the current loop and returns once every connection ended.
task<load_report> run_load(load_options options);

}  // namespace spindle::examples
