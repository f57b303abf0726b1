#include "load.hpp"

#if SPINDLE_HAVE_TLS
#include <spindle/tls.hpp>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

namespace spindle::examples {

using namespace std::chrono_literals;

// --- histogram ---------------------------------------------------------------

int latency_histogram::bucket_of(double us) noexcept {
    if (us < 1) return 0;
    // 32 buckets per doubling: each about 2.2% wide.
    int b = static_cast<int>(std::log2(us) * 32) + 1;
    return std::min(b, bucket_count - 1);
}

double latency_histogram::upper_of(int bucket) noexcept { return bucket == 0 ? 1.0 : std::exp2(bucket / 32.0); }

void latency_histogram::add(std::chrono::nanoseconds d) noexcept {
    ++m_buckets[static_cast<std::size_t>(bucket_of(static_cast<double>(d.count()) / 1000.0))];
    ++m_count;
}

void latency_histogram::merge(const latency_histogram& other) noexcept {
    for (std::size_t i = 0; i < m_buckets.size(); ++i) m_buckets[i] += other.m_buckets[i];
    m_count += other.m_count;
}

double latency_histogram::quantile(double q) const noexcept {
    if (m_count == 0) return 0;
    auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(m_count)));
    std::uint64_t seen = 0;
    for (int b = 0; b < bucket_count; ++b) {
        seen += m_buckets[static_cast<std::size_t>(b)];
        if (seen >= std::max<std::uint64_t>(rank, 1)) return upper_of(b);
    }
    return upper_of(bucket_count - 1);
}

double load_report::requests_per_second() const noexcept {
    double s = std::chrono::duration<double>(elapsed).count();
    return s > 0 ? static_cast<double>(requests) / s : 0;
}

double load_report::mib_per_second() const noexcept {
    double s = std::chrono::duration<double>(elapsed).count();
    return s > 0 ? static_cast<double>(bytes) / s / (1024.0 * 1024.0) : 0;
}

double load_report::connections_per_second() const noexcept {
    double s = std::chrono::duration<double>(elapsed).count();
    return s > 0 ? static_cast<double>(connections) / s : 0;
}

std::string load_report::summary() const {
    char line[320];
    int n = std::snprintf(line, sizeof line, "%.0f req/s, %.2f MiB/s, p50 %.0f us, p99 %.0f us, %llu errors", requests_per_second(),
                          mib_per_second(), latency.quantile(0.50), latency.quantile(0.99),
                          static_cast<unsigned long long>(errors));
    if (reconnected && n > 0 && static_cast<std::size_t>(n) < sizeof line)
        std::snprintf(line + n, sizeof line - static_cast<std::size_t>(n), ", %.0f connections/s", connections_per_second());
    return line;
}

// --- connections -------------------------------------------------------------

namespace {

constexpr std::string_view http_request = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
constexpr std::string_view http_body = "Hello, World!";

struct shared_state {
    const load_options* options;
    clock::time_point end;
    load_report* report;
};

void fail(shared_state& s, std::string what) {
    ++s.report->errors;
    if (s.report->first_error.empty()) s.report->first_error = std::move(what);
}

// Each message carries its connection, its sequence number and a pattern
// derived from both, so a byte from the wrong place is caught.
void fill_message(std::byte* out, std::size_t size, std::uint32_t conn, std::uint64_t seq) {
    std::uint64_t x = (static_cast<std::uint64_t>(conn) << 40) ^ seq ^ 0x9e3779b97f4a7c15ull;
    for (std::size_t i = 0; i < size; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out[i] = static_cast<std::byte>(x);
    }
}

/// Opens plain TCP connections.
struct tcp_connector {
    using stream = net::tcp_stream;
    task<result<stream>> open(const load_options& o) {
        result<net::tcp_stream> tcp = co_await net::tcp_stream::connect(o.target, 5s);
        if (tcp) (void)tcp->set_nodelay(true);
        co_return tcp;
    }
};

#if SPINDLE_HAVE_TLS
/// Opens TLS connections: TCP, then the client handshake.
struct tls_connector {
    using stream = tls::tcp_stream;
    tls::context ctx;
    task<result<stream>> open(const load_options& o) {
        co_return co_await spindle::with_timeout(5s, tls::connect(ctx, o.target, o.server_name));
    }
};

result<tls::context> client_context(const load_options& options) {
    tls::context_options o;
    if (!options.tls_ca.empty()) o.ca_files = {options.tls_ca};
    o.session_resumption = options.tls_resume;
    if (options.mode == load_mode::http) o.alpn = {"http/1.1"};
    return tls::context::client(o);
}
#endif

template <class Stream>
task<result<void>> read_exactly(Stream& stream, std::span<std::byte> out) {
    while (!out.empty()) {
        result<std::size_t> n = co_await stream.read_some(out);
        if (!n) co_return n.error();
        if (*n == 0) co_return make_error_code(net::errc::end_of_stream);
        out = out.subspan(*n);
    }
    co_return result<void>{};
}

template <class Connector>
task<void> echo_connection(shared_state& s, Connector& connector, std::uint32_t id) {
    const load_options& o = *s.options;
    std::optional<typename Connector::stream> stream;
    const std::size_t batch = o.message_size * static_cast<std::size_t>(o.depth);
    std::vector<std::byte> out(batch);
    std::vector<std::byte> in(batch);
    latency_histogram local;
    std::uint64_t seq = 0;
    while (clock::now() < s.end) {
        if (!stream) {
            result<typename Connector::stream> opened = co_await connector.open(o);
            if (!opened) co_return fail(s, "connect: " + opened.error().message());
            stream.emplace(std::move(*opened));
            ++s.report->connections;
        }
        for (int i = 0; i < o.depth; ++i)
            fill_message(out.data() + static_cast<std::size_t>(i) * o.message_size, o.message_size, id, seq + static_cast<std::uint64_t>(i));
        const auto sent = clock::now();
        if (auto w = co_await stream->write_all(out); !w) co_return fail(s, "write: " + w.error().message());
        if (auto r = co_await read_exactly(*stream, in); !r) co_return fail(s, "read: " + r.error().message());
        const auto latency = clock::now() - sent;
        if (std::memcmp(in.data(), out.data(), batch) != 0) co_return fail(s, "echo returned different bytes");
        for (int i = 0; i < o.depth; ++i) local.add(latency);
        seq += static_cast<std::uint64_t>(o.depth);
        s.report->requests += static_cast<std::uint64_t>(o.depth);
        s.report->bytes += batch;
        if (o.reconnect) stream.reset();  // closed without a goodbye, as a load generator may
    }
    s.report->latency.merge(local);
}

// Reads one response head and body from `reader`; checks status and body.
template <class Reader>
task<result<std::size_t>> read_http_response(Reader& reader) {
    result<std::string_view> head = co_await reader.read_until("\r\n\r\n", 8192);
    if (!head) co_return head.error();
    std::string_view h = *head;
    if (!h.starts_with("HTTP/1.1 200 ")) co_return std::make_error_code(std::errc::protocol_error);
    std::size_t length = 0;
    constexpr std::string_view key = "Content-Length: ";
    auto at = h.find(key);
    if (at == std::string_view::npos) co_return std::make_error_code(std::errc::protocol_error);
    for (std::size_t i = at + key.size(); i < h.size() && h[i] >= '0' && h[i] <= '9'; ++i) length = length * 10 + static_cast<std::size_t>(h[i] - '0');
    const std::size_t head_size = h.size();
    if (length != http_body.size()) co_return std::make_error_code(std::errc::protocol_error);
    std::array<std::byte, http_body.size()> body;
    if (auto r = co_await reader.read_exact(body); !r) co_return r.error();
    if (std::memcmp(body.data(), http_body.data(), body.size()) != 0) co_return std::make_error_code(std::errc::protocol_error);
    co_return head_size + length;
}

template <class Connector>
task<void> http_connection(shared_state& s, Connector& connector, std::uint32_t) {
    using stream_type = typename Connector::stream;
    const load_options& o = *s.options;
    std::string requests;
    for (int i = 0; i < o.depth; ++i) requests += http_request;
    const auto out = std::as_bytes(std::span(requests.data(), requests.size()));
    std::optional<stream_type> stream;
    std::optional<net::basic_buffered_reader<stream_type>> reader;
    latency_histogram local;
    while (clock::now() < s.end) {
        if (!stream) {
            result<stream_type> opened = co_await connector.open(o);
            if (!opened) co_return fail(s, "connect: " + opened.error().message());
            stream.emplace(std::move(*opened));
            reader.emplace(*stream);
            ++s.report->connections;
        }
        const auto sent = clock::now();
        if (auto w = co_await stream->write_all(out); !w) co_return fail(s, "write: " + w.error().message());
        for (int i = 0; i < o.depth; ++i) {
            result<std::size_t> n = co_await read_http_response(*reader);
            if (!n) co_return fail(s, "response: " + n.error().message());
            local.add(clock::now() - sent);
            ++s.report->requests;
            s.report->bytes += *n;
        }
        if (o.reconnect) {
            reader.reset();
            stream.reset();
        }
    }
    s.report->latency.merge(local);
}

template <class Connector>
task<void> run_connections(shared_state& s, Connector& connector) {
    std::vector<task<void>> connections;
    connections.reserve(static_cast<std::size_t>(s.options->connections));
    for (int i = 0; i < s.options->connections; ++i) {
        auto id = static_cast<std::uint32_t>(i);
        connections.push_back(s.options->mode == load_mode::echo ? echo_connection(s, connector, id) : http_connection(s, connector, id));
    }
    co_await when_all(std::move(connections));
}

}  // namespace

task<load_report> run_load(load_options options) {
    load_report report;
    shared_state s{&options, clock::now() + options.duration, &report};
    report.reconnected = options.reconnect;
    const auto start = clock::now();
    // The connectors are named locals passed by reference: g++ 12 destroys
    // a temporary with a destructor inside a co_await expression twice.
    if (!options.tls) {
        tcp_connector plain;
        co_await run_connections(s, plain);
    } else {
#if SPINDLE_HAVE_TLS
        result<tls::context> ctx = client_context(options);
        if (ctx) {
            tls_connector encrypted{*ctx};
            co_await run_connections(s, encrypted);
        } else {
            fail(s, "tls: " + ctx.error().message());
        }
#else
        fail(s, "built without TLS");
#endif
    }
    report.elapsed = clock::now() - start;
    co_return report;
}

}  // namespace spindle::examples
