#include "load.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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

std::string load_report::summary() const {
    char line[256];
    std::snprintf(line, sizeof line, "%.0f req/s, %.2f MiB/s, p50 %.0f us, p99 %.0f us, %llu errors", requests_per_second(),
                  mib_per_second(), latency.quantile(0.50), latency.quantile(0.99),
                  static_cast<unsigned long long>(errors));
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

task<void> echo_connection(shared_state& s, std::uint32_t id) {
    const load_options& o = *s.options;
    result<net::tcp_stream> stream = co_await net::tcp_stream::connect(o.target, 5s);
    if (!stream) co_return fail(s, "connect: " + stream.error().message());
    (void)stream->set_nodelay(true);
    const std::size_t batch = o.message_size * static_cast<std::size_t>(o.depth);
    std::vector<std::byte> out(batch);
    std::vector<std::byte> expected(batch);
    std::vector<std::byte> in(batch);
    latency_histogram local;
    std::uint64_t seq = 0;
    while (clock::now() < s.end) {
        for (int i = 0; i < o.depth; ++i)
            fill_message(out.data() + static_cast<std::size_t>(i) * o.message_size, o.message_size, id, seq + static_cast<std::uint64_t>(i));
        const auto sent = clock::now();
        if (auto w = co_await stream->write_all(out); !w) co_return fail(s, "write: " + w.error().message());
        if (auto r = co_await stream->read_exact(in); !r) co_return fail(s, "read: " + r.error().message());
        const auto latency = clock::now() - sent;
        if (std::memcmp(in.data(), out.data(), batch) != 0) co_return fail(s, "echo returned different bytes");
        for (int i = 0; i < o.depth; ++i) local.add(latency);
        seq += static_cast<std::uint64_t>(o.depth);
        s.report->requests += static_cast<std::uint64_t>(o.depth);
        s.report->bytes += batch;
    }
    s.report->latency.merge(local);
}

// Reads one response head and body from `reader`; checks status and body.
task<result<std::size_t>> read_http_response(net::buffered_reader& reader) {
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

task<void> http_connection(shared_state& s, std::uint32_t) {
    const load_options& o = *s.options;
    result<net::tcp_stream> stream = co_await net::tcp_stream::connect(o.target, 5s);
    if (!stream) co_return fail(s, "connect: " + stream.error().message());
    (void)stream->set_nodelay(true);
    std::string requests;
    for (int i = 0; i < o.depth; ++i) requests += http_request;
    const auto out = std::as_bytes(std::span(requests.data(), requests.size()));
    net::buffered_reader reader(*stream);
    latency_histogram local;
    while (clock::now() < s.end) {
        const auto sent = clock::now();
        if (auto w = co_await stream->write_all(out); !w) co_return fail(s, "write: " + w.error().message());
        for (int i = 0; i < o.depth; ++i) {
            result<std::size_t> n = co_await read_http_response(reader);
            if (!n) co_return fail(s, "response: " + n.error().message());
            local.add(clock::now() - sent);
            ++s.report->requests;
            s.report->bytes += *n;
        }
    }
    s.report->latency.merge(local);
}

}  // namespace

task<load_report> run_load(load_options options) {
    load_report report;
    shared_state s{&options, clock::now() + options.duration, &report};
    const auto start = clock::now();
    std::vector<task<void>> connections;
    connections.reserve(static_cast<std::size_t>(options.connections));
    for (int i = 0; i < options.connections; ++i) {
        auto id = static_cast<std::uint32_t>(i);
        connections.push_back(options.mode == load_mode::echo ? echo_connection(s, id) : http_connection(s, id));
    }
    co_await when_all(std::move(connections));
    report.elapsed = clock::now() - start;
    co_return report;
}

}  // namespace spindle::examples
