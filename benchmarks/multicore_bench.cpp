// Thread-per-core figures (docs/benchmarks.md#thread-per-core-cross-loop-calls-and-distribution):
// cross-loop calls between the loops of a loop_group, in a stream and one at
// a time, beside the same round trip between two plain threads over a pipe
// and an eventfd; and how evenly a shared_listener spreads connections.
// One line per figure:
//   NAME key=value ...
// Every figure is the median of five rounds, with the smallest and largest
// round beside it; each round has a fixed count and a time limit (a group
// that overruns it is stopped, and the line says so). The machines these run
// on are shared: compare ratios and medians, not single figures.
//
// Usage: spindle-multicore-bench [case...]   (default: every case)
//   cases: stream stream_pinned latency latency_pinned reference
//          reference_pinned distribution; the _pinned ones pin the two
//          loops (or threads) to the first two CPUs this process may use.
// SPINDLE_BACKEND picks the loops' backend.

#include "bench_support.hpp"

#include <spindle/spindle.hpp>
#include <spindle/net/address.hpp>
#include <spindle/net/shared_listener.hpp>
#include <spindle/net/tcp.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using spindle::loop_group;
using spindle::loop_group_options;
using spindle::result;
using spindle::task;
namespace net = spindle::net;

constexpr int rounds = 5;

double now_ns() {
    return static_cast<double>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

/// The median, smallest and largest of the rounds of one figure.
struct spread {
    double median = 0, min = 0, max = 0;
};

spread spread_of(const std::vector<double>& v) {
    if (v.empty()) return {};
    return {spindle::bench::median(v), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
}

/// The value at fraction `q` of the sorted samples (q = 0.5: the median).
double quantile(std::vector<double>& sorted, double q) {
    if (sorted.empty()) return 0;
    const auto at = static_cast<std::size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
    return sorted[std::min(at, sorted.size() - 1)];
}

// --idle-spin US: loop_group_options::idle_spin for every group (default: its default).
std::optional<std::chrono::microseconds> g_idle_spin;

loop_group_options group_of(unsigned loops, std::vector<int> cpus = {}) {
    loop_group_options o;
    if (g_idle_spin) o.idle_spin = *g_idle_spin;
    o.threads = loops;
    o.cpus = std::move(cpus);
    o.stop_signals = {};  // a benchmark run is ended by its own limits, not by ^C handling
    return o;
}

/// Two CPUs to pin a pair of loops (or threads) to, or none when this process
/// may run on fewer.
std::vector<int> two_cpus() {
    std::vector<int> cpus = spindle::bench::first_cpus(spindle::bench::allowed_cpus(), 2);
    if (cpus.size() < 2) cpus.clear();
    return cpus;
}

std::string cpus_text(const std::vector<int>& cpus) {
    if (cpus.empty()) return "none";
    std::string s;
    for (int c : cpus) s += (s.empty() ? "" : ",") + std::to_string(c);
    return s;
}

// Stops a group whose round overruns its time limit, so a figure that hangs
// ends as a line that says so instead of a benchmark that never returns.
class time_limit {
public:
    time_limit(loop_group& g, std::chrono::seconds limit) : m_thread([&g, limit, this] {
        const auto until = std::chrono::steady_clock::now() + limit;
        while (!m_done.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
        if (!m_done.load()) {
            m_fired.store(true);
            g.stop();
        }
    }) {}
    ~time_limit() {
        m_done.store(true);
        m_thread.join();
    }
    time_limit(const time_limit&) = delete;
    time_limit& operator=(const time_limit&) = delete;
    bool fired() const { return m_fired.load(); }

private:
    std::atomic<bool> m_done{false};
    std::atomic<bool> m_fired{false};
    std::thread m_thread;
};

// --- 1. a stream of calls from loop 0 to loop 1 ------------------------------------

constexpr long stream_calls = 1'000'000;

/// How deep a stream runs: callers, each with one call in flight at a time,
/// one more of them than the link's credits, so the ring stays full.
struct stream_depth {
    int callers;
    std::size_t calls_in_flight;
};

constexpr stream_depth default_depth{128, 127};  // loop_group_options' default credits
constexpr stream_depth deep{1024, 1023};

double cpu_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

struct stream_tally {
    long answered = 0;
    long failed = 0;
};

task<void> stream_caller(long count, stream_tally& tally, std::stop_token stop) {
    for (long i = 0; i < count; ++i) {
        result<int> r = co_await spindle::submit_to(1, [] { return 1; }, stop);
        if (r) {
            tally.answered += *r;
        } else {
            ++tally.failed;
            if (stop.stop_requested()) co_return;
        }
    }
}

/// Wall and CPU time (both loops) per call of one round.
struct stream_cost {
    double wall = 0, cpu = 0;
};

/// One round; nullopt if it failed (said on stdout).
std::optional<stream_cost> stream_round(const std::vector<int>& cpus, stream_depth depth) {
    loop_group_options o = group_of(2, cpus);
    o.calls_in_flight = depth.calls_in_flight;
    loop_group g(o);
    time_limit limit(g, 30s);
    stream_tally tally;
    double elapsed = 0, cpu = 0;
    const int callers_n = depth.callers;
    const int status = g.run([&](std::stop_token stop) -> task<void> {
        // Loop 1 only answers: its main returns, the loop runs on until loop 0's does.
        if (loop_group::current_index() != 0) co_return;
        std::vector<task<void>> callers;
        for (int c = 0; c < callers_n; ++c) callers.push_back(stream_caller(stream_calls / callers_n, tally, stop));
        const double t0 = now_ns();
        const double c0 = cpu_ns();
        co_await spindle::when_all(std::move(callers));
        elapsed = now_ns() - t0;
        cpu = cpu_ns() - c0;
    });
    const long expected = stream_calls / callers_n * callers_n;
    if (status != 0 || limit.fired() || tally.answered != expected) {
        std::printf("stream: round failed: status=%d timed_out=%d answered=%ld of %ld failed=%ld\n", status,
                    limit.fired() ? 1 : 0, tally.answered, expected, tally.failed);
        return std::nullopt;
    }
    return stream_cost{elapsed / static_cast<double>(expected), cpu / static_cast<double>(expected)};
}

void stream_figure(const char* name, const std::vector<int>& cpus, stream_depth depth) {
    std::vector<double> wall, cpu;
    for (int r = 0; r < rounds; ++r)
        if (std::optional<stream_cost> c = stream_round(cpus, depth)) {
            wall.push_back(c->wall);
            cpu.push_back(c->cpu);
        }
    const spread s = spread_of(wall);
    std::printf("%s ns_per_call=%.1f min=%.1f max=%.1f calls_per_s=%.3gM cpu_ns_per_call=%.1f calls=%ld callers=%d "
                "calls_in_flight=%zu pinned=%s rounds=%zu\n",
                name, s.median, s.min, s.max, s.median > 0 ? 1e3 / s.median : 0.0, spread_of(cpu).median,
                stream_calls / depth.callers * depth.callers, depth.callers, depth.calls_in_flight, cpus_text(cpus).c_str(),
                wall.size());
}

void bench_stream() {
    stream_figure("stream", {}, default_depth);
    stream_figure("stream_deep", {}, deep);
}

void bench_stream_pinned() {
    const std::vector<int> cpus = two_cpus();
    if (cpus.empty()) {
        std::printf("stream_pinned skipped: fewer than 2 CPUs\n");
        return;
    }
    stream_figure("stream_pinned", cpus, default_depth);
    stream_figure("stream_deep_pinned", cpus, deep);
}

// --- 2. one call at a time ------------------------------------------------------------

constexpr long latency_calls = 20'000;
constexpr long latency_warmup = 1'000;

/// The median and p99 round trip of one round, in ns.
struct round_trip {
    double median = 0, p99 = 0;
};

task<void> ping(long count, std::vector<double>& samples, std::stop_token stop) {
    for (long i = 0; i < latency_warmup + count && !stop.stop_requested(); ++i) {
        const double t0 = now_ns();
        result<int> r = co_await spindle::submit_to(1, [] { return 1; }, stop);
        const double t1 = now_ns();
        if (!r) co_return;
        if (i >= latency_warmup) samples.push_back(t1 - t0);
    }
}

/// Loop 0 calls loop 1 `latency_calls` times, one at a time. The callee is
/// idle (asleep in the kernel between calls) or busy (a task yields in a
/// loop, so it ticks all the time and finds each call at its next tick).
std::optional<round_trip> latency_round(bool busy_callee, const std::vector<int>& cpus) {
    loop_group g(group_of(2, cpus));
    time_limit limit(g, 30s);
    std::vector<double> samples;
    samples.reserve(latency_calls);
    std::atomic<bool> done{false};
    const int status = g.run([&](std::stop_token stop) -> task<void> {
        if (loop_group::current_index() != 0) {
            if (busy_callee)
                while (!done.load(std::memory_order_relaxed) && !stop.stop_requested()) co_await spindle::yield();
            co_return;
        }
        co_await ping(latency_calls, samples, stop);
        done.store(true);
    });
    if (status != 0 || limit.fired() || samples.size() != static_cast<std::size_t>(latency_calls)) {
        std::printf("latency: round failed: status=%d timed_out=%d samples=%zu of %ld\n", status, limit.fired() ? 1 : 0,
                    samples.size(), latency_calls);
        return std::nullopt;
    }
    std::sort(samples.begin(), samples.end());
    return round_trip{quantile(samples, 0.5), quantile(samples, 0.99)};
}

struct latency_summary {
    spread median, p99;
};

template <class Round>
latency_summary latency_figure(const char* name, const char* details, Round&& round) {
    std::vector<double> medians, p99s;
    for (int r = 0; r < rounds; ++r)
        if (std::optional<round_trip> t = round()) {
            medians.push_back(t->median);
            p99s.push_back(t->p99);
        }
    const latency_summary s{spread_of(medians), spread_of(p99s)};
    std::printf("%s median_ns=%.0f min=%.0f max=%.0f p99_ns=%.0f min=%.0f max=%.0f calls=%ld %s rounds=%zu\n", name,
                s.median.median, s.median.min, s.median.max, s.p99.median, s.p99.min, s.p99.max, latency_calls, details,
                medians.size());
    return s;
}

// The reference figures, kept for the ratios printed at the end.
double g_idle_ns = 0, g_idle_pinned_ns = 0, g_pipe_ns = 0, g_pipe_pinned_ns = 0;

void bench_latency() {
    g_idle_ns = latency_figure("roundtrip_idle", "callee=idle pinned=none", [] { return latency_round(false, {}); }).median.median;
    latency_figure("roundtrip_busy", "callee=busy pinned=none", [] { return latency_round(true, {}); });
}

void bench_latency_pinned() {
    const std::vector<int> cpus = two_cpus();
    if (cpus.empty()) {
        std::printf("latency_pinned skipped: fewer than 2 CPUs\n");
        return;
    }
    const std::string idle = "callee=idle pinned=" + cpus_text(cpus);
    g_idle_pinned_ns =
        latency_figure("roundtrip_idle_pinned", idle.c_str(), [&] { return latency_round(false, cpus); }).median.median;
    const std::string busy = "callee=busy pinned=" + cpus_text(cpus);
    latency_figure("roundtrip_busy_pinned", busy.c_str(), [&] { return latency_round(true, cpus); });
}

// --- 3. the same round trip between two plain threads ---------------------------------

// A blocking descriptor pair each way: a pipe (1 byte) or an eventfd (its
// 8-byte counter). The answering thread stops at end of file or an error, so
// a failed round ends instead of hanging.
struct channel_fds {
    int ping_read = -1, ping_write = -1, pong_read = -1, pong_write = -1;
};

bool open_pair(bool eventfd_kind, channel_fds& c) {
    if (eventfd_kind) {
        const int a = ::eventfd(0, EFD_CLOEXEC);
        const int b = ::eventfd(0, EFD_CLOEXEC);
        if (a < 0 || b < 0) return false;
        c = {a, a, b, b};
        return true;
    }
    int p[2], q[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return false;
    if (::pipe2(q, O_CLOEXEC) != 0) return false;
    c = {p[0], p[1], q[0], q[1]};
    return true;
}

void close_pair(bool eventfd_kind, channel_fds& c) {
    ::close(c.ping_read);
    ::close(c.pong_read);
    if (!eventfd_kind) {
        ::close(c.ping_write);
        ::close(c.pong_write);
    }
}

bool send_one(bool eventfd_kind, int fd) {
    if (eventfd_kind) {
        const std::uint64_t one = 1;
        return ::write(fd, &one, sizeof one) == static_cast<ssize_t>(sizeof one);
    }
    const char byte = 'x';
    return ::write(fd, &byte, 1) == 1;
}

bool take_one(bool eventfd_kind, int fd) {
    if (eventfd_kind) {
        std::uint64_t v = 0;
        return ::read(fd, &v, sizeof v) == static_cast<ssize_t>(sizeof v);
    }
    char byte = 0;
    return ::read(fd, &byte, 1) == 1;
}

std::optional<round_trip> thread_round(bool eventfd_kind, const std::vector<int>& cpus) {
    channel_fds c;
    if (!open_pair(eventfd_kind, c)) {
        std::printf("reference: cannot open %s: %s\n", eventfd_kind ? "an eventfd" : "a pipe", std::strerror(errno));
        return std::nullopt;
    }
    const long total = latency_warmup + latency_calls;
    std::vector<double> samples;
    samples.reserve(latency_calls);
    std::thread answerer([&] {
        if (!cpus.empty()) spindle::bench::pin_to_cpu(cpus[1]);
        for (long i = 0; i < total; ++i)
            if (!take_one(eventfd_kind, c.ping_read) || !send_one(eventfd_kind, c.pong_write)) return;
    });
    std::thread caller([&] {
        if (!cpus.empty()) spindle::bench::pin_to_cpu(cpus[0]);
        for (long i = 0; i < total; ++i) {
            const double t0 = now_ns();
            if (!send_one(eventfd_kind, c.ping_write) || !take_one(eventfd_kind, c.pong_read)) return;
            const double t1 = now_ns();
            if (i >= latency_warmup) samples.push_back(t1 - t0);
        }
    });
    caller.join();
    if (samples.size() != static_cast<std::size_t>(latency_calls) && !eventfd_kind) ::close(c.ping_write);  // let it end
    answerer.join();
    close_pair(eventfd_kind, c);
    if (samples.size() != static_cast<std::size_t>(latency_calls)) return std::nullopt;
    std::sort(samples.begin(), samples.end());
    return round_trip{quantile(samples, 0.5), quantile(samples, 0.99)};
}

void bench_reference() {
    g_pipe_ns = latency_figure("pipe_pingpong", "threads=2 pinned=none", [] { return thread_round(false, {}); }).median.median;
    latency_figure("eventfd_pingpong", "threads=2 pinned=none", [] { return thread_round(true, {}); });
}

void bench_reference_pinned() {
    const std::vector<int> cpus = two_cpus();
    if (cpus.empty()) {
        std::printf("reference_pinned skipped: fewer than 2 CPUs\n");
        return;
    }
    const std::string details = "threads=2 pinned=" + cpus_text(cpus);
    g_pipe_pinned_ns =
        latency_figure("pipe_pingpong_pinned", details.c_str(), [&] { return thread_round(false, cpus); }).median.median;
    latency_figure("eventfd_pingpong_pinned", details.c_str(), [&] { return thread_round(true, cpus); });
}

void print_ratios() {
    if (g_idle_ns > 0 && g_pipe_ns > 0)
        std::printf("ratio roundtrip_idle/pipe_pingpong=%.2f\n", g_idle_ns / g_pipe_ns);
    if (g_idle_pinned_ns > 0 && g_pipe_pinned_ns > 0)
        std::printf("ratio roundtrip_idle_pinned/pipe_pingpong_pinned=%.2f\n", g_idle_pinned_ns / g_pipe_pinned_ns);
}

// --- 4. how a shared_listener spreads connections ----------------------------------------

constexpr int connections = 1'000;

struct distribution_outcome {
    double imbalance = 0;
    std::vector<std::size_t> live;
    double accept_ms = 0;  // from the first connect to the last connection counted
};

/// Opens a blocking loopback connection to `at`; -1 on failure.
int connect_blocking(const net::address& at) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (::connect(fd, at.native(), at.size()) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

/// A group of `loops`, each accepting from one shared listener and holding
/// every connection open; a plain thread opens `connections` to it and, once
/// all are counted, reads the spread, closes its ends and stops the group.
std::optional<distribution_outcome> distribution_round(unsigned loops, net::distribution mode) {
    loop_group g(group_of(loops));
    result<net::shared_listener> listener = net::shared_listener::bind(g, net::address::ipv4_loopback(0), mode);
    if (!listener) {
        std::printf("distribution: bind: %s\n", listener.error().message().c_str());
        return std::nullopt;
    }
    std::atomic<unsigned> accepting{0};
    std::vector<std::string> accept_errors(loops);
    distribution_outcome out;
    std::string client_error;
    time_limit limit(g, 60s);
    std::thread client([&] {
        const auto give_up = std::chrono::steady_clock::now() + 20s;
        // Every loop is inside accept() before the first connection, so
        // least_loaded can choose among all of them from the start.
        while (accepting.load() < loops && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(20ms);
        std::vector<int> fds;
        fds.reserve(connections);
        const double t0 = now_ns();
        for (int i = 0; i < connections && std::chrono::steady_clock::now() < give_up; ++i) {
            const int fd = connect_blocking(listener->local_address());
            if (fd < 0) {
                client_error = std::string("connect: ") + std::strerror(errno);
                break;
            }
            fds.push_back(fd);
        }
        std::size_t counted = 0;
        while (std::chrono::steady_clock::now() < give_up) {
            counted = 0;
            for (unsigned i = 0; i < loops; ++i) counted += listener->live(i);
            if (counted >= fds.size()) break;
            std::this_thread::sleep_for(200us);
        }
        out.accept_ms = (now_ns() - t0) / 1e6;
        out.imbalance = listener->imbalance();
        for (unsigned i = 0; i < loops; ++i) out.live.push_back(listener->live(i));
        if (client_error.empty() && counted != static_cast<std::size_t>(connections))
            client_error = "counted " + std::to_string(counted) + " of " + std::to_string(fds.size()) + " connections";
        // An abortive close (RST): no TIME_WAIT left behind on the client's
        // ports, round after round.
        const ::linger abort_close{1, 0};
        for (int fd : fds) {
            ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_close, sizeof abort_close);
            ::close(fd);
        }
        g.stop();
    });
    const int status = g.run([&](std::stop_token stop) -> task<void> {
        const std::size_t me = loop_group::current_index();
        std::vector<net::tcp_stream> held;
        held.reserve(connections);
        accepting.fetch_add(1);
        for (;;) {
            result<net::tcp_stream> s = co_await listener->accept(stop);
            if (!s) {
                if (!stop.stop_requested()) accept_errors[me] = s.error().message();
                break;
            }
            held.push_back(std::move(*s));
        }
    });
    client.join();
    std::string errors;
    for (unsigned i = 0; i < loops; ++i)
        if (!accept_errors[i].empty()) errors += " loop " + std::to_string(i) + ": " + accept_errors[i];
    if (status != 0 || limit.fired() || !client_error.empty() || !errors.empty()) {
        std::printf("distribution: round failed: loops=%u mode=%s status=%d timed_out=%d client=[%s] accept=[%s]\n", loops,
                    std::string(net::to_string(mode)).c_str(), status, limit.fired() ? 1 : 0, client_error.c_str(),
                    errors.c_str());
        return std::nullopt;
    }
    return out;
}

void distribution_figure(unsigned loops, net::distribution mode) {
    std::vector<double> imbalance, accept_ms;
    std::vector<std::size_t> median_live;  // the per-loop counts of the median round
    std::vector<distribution_outcome> outcomes;
    for (int r = 0; r < rounds; ++r)
        if (std::optional<distribution_outcome> o = distribution_round(loops, mode)) {
            imbalance.push_back(o->imbalance);
            accept_ms.push_back(o->accept_ms);
            outcomes.push_back(std::move(*o));
        }
    const spread s = spread_of(imbalance);
    std::string live;
    if (!outcomes.empty()) {
        std::sort(outcomes.begin(), outcomes.end(),
                  [](const distribution_outcome& a, const distribution_outcome& b) { return a.imbalance < b.imbalance; });
        for (std::size_t n : outcomes[outcomes.size() / 2].live) live += (live.empty() ? "" : "/") + std::to_string(n);
    }
    std::printf("distribution loops=%u mode=%s max_over_mean=%.3f min=%.3f max=%.3f live_median_round=%s "
                "accept_all_ms=%.1f connections=%d rounds=%zu\n",
                loops, std::string(net::to_string(mode)).c_str(), s.median, s.min, s.max, live.empty() ? "-" : live.c_str(),
                spread_of(accept_ms).median, connections, imbalance.size());
}

void bench_distribution() {
    for (unsigned loops : {2u, 4u})
        for (net::distribution mode : {net::distribution::reuseport, net::distribution::least_loaded})
            distribution_figure(loops, mode);
}

// Client and server ends of every connection live in this process.
void raise_fd_limit() {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < static_cast<rlim_t>(2 * connections + 64))
        std::printf("distribution: descriptor limit %llu is below the %d needed\n",
                    static_cast<unsigned long long>(lim.rlim_cur), 2 * connections + 64);
}

struct bench_case {
    const char* name;
    void (*run)();
};

constexpr bench_case cases[] = {
    {"stream", &bench_stream},
    {"stream_pinned", &bench_stream_pinned},
    {"latency", &bench_latency},
    {"latency_pinned", &bench_latency_pinned},
    {"reference", &bench_reference},
    {"reference_pinned", &bench_reference_pinned},
    {"distribution", &bench_distribution},
};

}  // namespace

int main(int argc, char** argv) {
    std::vector<char*> names;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--idle-spin") == 0 && i + 1 < argc) {
            g_idle_spin = std::chrono::microseconds(std::atoi(argv[++i]));
            continue;
        }
        names.push_back(argv[i]);
    }
    argc = static_cast<int>(names.size()) + 1;
    for (std::size_t k = 0; k < names.size(); ++k) argv[k + 1] = names[k];
    for (int i = 1; i < argc; ++i) {
        const bool known = std::any_of(std::begin(cases), std::end(cases),
                                       [&](const bench_case& c) { return std::strcmp(argv[i], c.name) == 0; });
        if (!known) {
            std::fprintf(stderr, "usage: spindle-multicore-bench [--idle-spin US] [case...]\n  cases:");
            for (const auto& c : cases) std::fprintf(stderr, " %s", c.name);
            std::fprintf(stderr, "\n");
            return 2;
        }
    }
    raise_fd_limit();
    {
        spindle::loop probe;
        const cpu_set_t allowed = spindle::bench::allowed_cpus();
        std::printf("backend=%s cpus=%d\n", std::string(spindle::to_string(probe.backend())).c_str(), CPU_COUNT(&allowed));
    }
    for (const auto& c : cases) {
        bool wanted = argc == 1;
        for (int i = 1; i < argc; ++i) wanted = wanted || std::strcmp(argv[i], c.name) == 0;
        if (wanted) {
            c.run();
            std::fflush(stdout);
        }
    }
    print_ratios();
}
