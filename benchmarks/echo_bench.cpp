// spindle-echo-bench: the example echo server (or, with --mode http, the
// example HTTP server) on each backend, driven by spindle's own load
// generator over loopback, in alternating pairs, so the backends can be
// compared on a shared, noisy machine by ratios and medians.
//
// The server runs as a child process pinned to one core, the load in this
// process pinned to another: each side has a core of its own, and the
// server's figures (its CPU time, its system calls) are its alone.

#include "bench_support.hpp"
#include "load.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <optional>
#include <pthread.h>
#include <sched.h>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <sys/resource.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::bench;
using namespace spindle::examples;

namespace {

// These come from meson: the spindle-echo and spindle-http built with this
// program, and the backends this build has (e.g. "epoll,io_uring").
#ifndef SPINDLE_ECHO_SERVER
#define SPINDLE_ECHO_SERVER "spindle-echo"
#endif
#ifndef SPINDLE_HTTP_SERVER
#define SPINDLE_HTTP_SERVER "spindle-http"
#endif
#ifndef SPINDLE_BUILT_BACKENDS
#define SPINDLE_BUILT_BACKENDS "epoll"
#endif

struct options {
    /// echo: 64-byte messages echoed; http: pipelined GET / keep-alive requests.
    load_mode mode = load_mode::echo;
    std::vector<std::string> backends;
    int connections = 100;
    std::size_t size = 64;
    std::vector<int> depths{1, 16};
    int duration_s = 3;
    int rounds = 3;
    bool syscalls = false;
    /// Empty: the spindle server of the mode.
    std::string server;
    /// The server's --threads, each run in turn (several: compared by CPU per message).
    std::vector<int> threads{1};
    /// Instead of steady load: this many connections opened at once, each
    /// doing 10 round trips and closing (connection set-up and teardown).
    int churn = 0;
    /// Instead of steady load: this many connections held open and idle.
    int idle = 0;
    /// Instead of steady load: a bulk stream and a ping beside it (run_flood).
    bool flood = false;
    /// Servers run beside spindle's backends in --flood (each with --backend epoll).
    std::vector<std::string> peers;
};

// One server configuration of a round: a backend and a number of loops.
struct variant {
    std::string backend;
    int threads = 1;
    std::string label() const { return threads == 1 ? backend : backend + " x" + std::to_string(threads); }
};

[[noreturn]] void usage(std::FILE* out, int status) {
    std::fprintf(
        out,
        "usage: spindle-echo-bench [--mode echo|http] [--backends LIST] [--connections N] [--size BYTES]\n"
        "                          [--depth LIST] [--duration SECONDS] [--rounds N] [--syscalls]\n"
        "                          [--server PATH] [--threads LIST] [--churn N] [--idle N]\n"
        "                          [--flood [--peers LIST]]\n"
        "Runs spindle-echo on each backend under spindle's load generator (loopback, every\n"
        "byte verified) and compares the backends round by round.\n\n"
        "  --mode MODE        echo (default), or http: spindle-http answering GET / keep-alive requests,\n"
        "                     --depth of them pipelined on each connection (every response checked)\n"
        "  --backends LIST    comma-separated (default: the backends built, %s)\n"
        "  --connections N    concurrent connections, 1..10000 (default 100)\n"
        "  --size BYTES       message size, 1..1048576 (default 64)\n"
        "  --depth LIST       messages in flight per connection, comma-separated, each 1..1024 (default 1,16)\n"
        "  --duration SECONDS each run, 1..600 (default 3)\n"
        "  --rounds N         rounds, 1..100 (default 3); each runs every backend once per depth\n"
        "  --syscalls         count the server's system calls (perf, else strace)\n"
        "  --server PATH      the server to run (default: the spindle-echo or spindle-http built with this\n"
        "                     program); it must take --backend, --host and --port 0 and print\n"
        "                     \"NAME listening on HOST:PORT\" once it listens\n"
        "  --churn N          instead: N connections opened at once, each doing 10 round trips and closing;\n"
        "                     wall time and server CPU per connection, per backend (N: 1..20000)\n"
        "  --idle N           instead: N connections opened, one round trip each, then held idle for 2 s;\n"
        "                     the server's resident memory per connection and its wake-ups while idle\n"
        "                     (N: 1..60000)\n"
        "  --flood            instead: one connection streams 64 KiB writes as fast as the server echoes them\n"
        "                     while another sends 5-byte pings one at a time; ping latency and bytes echoed\n"
        "                     (every byte verified), per backend, for --duration\n"
        "  --peers LIST       with --flood: other servers (paths, comma-separated) run in turn with the\n"
        "                     backends, each given --backend epoll\n"
        "  --threads LIST     the server's loops, comma-separated, each run in turn (default 1); with more\n"
        "                     than 1 the server is not pinned (its loops share the cores with the load)\n",
        SPINDLE_BUILT_BACKENDS);
    std::exit(status);
}

// The name in its error messages, and the usage text after them.
const program echo_bench{"spindle-echo-bench", usage};

options parse(int argc, char** argv) {
    options o;
    o.backends = split(SPINDLE_BUILT_BACKENDS);
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h") usage(stdout, 0);
        if (arg == "--syscalls") {
            o.syscalls = true;
            continue;
        }
        if (arg == "--flood") {
            o.flood = true;
            continue;
        }
        if (i + 1 >= argc) usage(stderr, 2);
        const std::string_view value = argv[++i];
        if (arg == "--mode") {
            if (value == "echo")
                o.mode = load_mode::echo;
            else if (value == "http")
                o.mode = load_mode::http;
            else
                usage(stderr, 2);
        } else if (arg == "--backends") {
            o.backends = backend_list(echo_bench, value);
        } else if (arg == "--connections") {
            o.connections = static_cast<int>(number(echo_bench, value, 1, 10000));
        } else if (arg == "--size") {
            o.size = static_cast<std::size_t>(number(echo_bench, value, 1, 1 << 20));
        } else if (arg == "--depth") {
            o.depths.clear();
            for (const std::string& d : split(value)) o.depths.push_back(static_cast<int>(number(echo_bench, d, 1, 1024)));
        } else if (arg == "--duration") {
            o.duration_s = static_cast<int>(number(echo_bench, value, 1, 600));
        } else if (arg == "--rounds") {
            o.rounds = static_cast<int>(number(echo_bench, value, 1, 100));
        } else if (arg == "--server") {
            o.server = value;
        } else if (arg == "--idle") {
            o.idle = static_cast<int>(number(echo_bench, value, 1, 60000));
        } else if (arg == "--churn") {
            o.churn = static_cast<int>(number(echo_bench, value, 1, 20000));
        } else if (arg == "--peers") {
            o.peers = split(value);
        } else if (arg == "--threads") {
            o.threads.clear();
            for (const std::string& t : split(value)) o.threads.push_back(static_cast<int>(number(echo_bench, t, 1, 64)));
        } else {
            usage(stderr, 2);
        }
    }
    if (o.backends.empty() || o.depths.empty() || o.threads.empty()) usage(stderr, 2);
    // Churn and idle connections are echo's: one round trip of --size bytes.
    if (o.mode == load_mode::http && (o.churn > 0 || o.idle > 0 || o.flood)) usage(stderr, 2);
    if (!o.peers.empty() && !o.flood) usage(stderr, 2);
    if (o.server.empty()) o.server = o.mode == load_mode::http ? SPINDLE_HTTP_SERVER : SPINDLE_ECHO_SERVER;
    return o;
}

// --- counting the server's system calls --------------------------------------------

enum class count_tool { none, perf, strace };

bool in_path(const char* name) {
    const char* path = std::getenv("PATH");
    for (const std::string& dir : split(path ? path : "/usr/bin:/bin", ':')) {
        if (::access((dir + "/" + name).c_str(), X_OK) == 0) return true;
    }
    return false;
}

std::string read_file(const std::string& path) {
    std::string text;
    if (std::FILE* f = std::fopen(path.c_str(), "r")) {
        char buf[4096];
        for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() < (1 << 20);) text.append(buf, n);
        std::fclose(f);
    }
    return text;
}

// One counting tool attached to the server: started, interrupted with SIGINT
// (both tools print their totals on it), then read.
class syscall_counter {
public:
    syscall_counter(count_tool tool, pid_t target, const cpu_set_t& anywhere) : m_tool(tool), m_target(target), m_anywhere(anywhere) {
        char name[] = "/tmp/spindle-echo-bench-XXXXXX";
        const int fd = ::mkstemp(name);
        if (fd >= 0) {
            ::close(fd);
            m_output = name;
        }
    }
    ~syscall_counter() {
        if (m_pid > 0) reap(m_pid, 0ms);
        if (!m_output.empty()) ::unlink(m_output.c_str());
    }
    syscall_counter(const syscall_counter&) = delete;
    syscall_counter& operator=(const syscall_counter&) = delete;

    void start() {
        if (m_output.empty()) return;
        const std::string pid = std::to_string(m_target);
        std::vector<std::string> args;
        if (m_tool == count_tool::perf)
            args = {"perf", "stat", "--no-big-num", "-e", "raw_syscalls:sys_enter", "-p", pid, "-o", m_output};
        else
            args = {"strace", "-c", "-f", "-p", pid, "-o", m_output};
        m_started = std::chrono::steady_clock::now();
        m_pid = ::fork();
        if (m_pid == 0) {
            // Not pinned to the load generator's core (it inherited that):
            // the scheduler puts the tool's start-up wherever there is room.
            ::sched_setaffinity(0, sizeof m_anywhere, &m_anywhere);
            const int devnull = ::open("/dev/null", O_RDWR);
            ::dup2(devnull, STDIN_FILENO);
            ::dup2(devnull, STDOUT_FILENO);  // errors stay on stderr
            std::vector<char*> argv;
            for (std::string& a : args) argv.push_back(a.data());
            argv.push_back(nullptr);
            ::execvp(argv[0], argv.data());
            ::_exit(127);
        }
    }

    void interrupt() {
        if (m_pid <= 0) return;
        m_stopped = std::chrono::steady_clock::now();
        ::kill(m_pid, SIGINT);
    }

    /// After interrupt(): how many system calls the server made while counted,
    /// and for how long (wall time). Nullopt if the tool failed.
    std::optional<std::pair<double, double>> result() {
        if (m_pid <= 0) return std::nullopt;
        const std::optional<int> status = reap(m_pid, 10s);
        m_pid = -1;
        const std::string text = read_file(m_output);
        // perf: "  123456      raw_syscalls:sys_enter" and "  2.01 seconds time
        // elapsed", the wall time its counter was enabled (it takes a good
        // fraction of a second to attach, so our own clock would overstate it).
        // strace: "% time  seconds  usecs/call  calls  errors  syscall" ending
        // with a "total" row; it was attached for the whole run.
        std::optional<double> calls, seconds;
        if (m_tool == count_tool::strace) seconds = std::chrono::duration<double>(m_stopped - m_started).count();
        std::istringstream lines(text);
        for (std::string line; std::getline(lines, line);) {
            std::istringstream words(line);
            std::string w[4];
            for (std::string& x : w) words >> x;
            if (m_tool == count_tool::perf && line.find("raw_syscalls:sys_enter") != std::string::npos && !w[0].starts_with("<"))
                calls = std::atof(w[0].c_str());
            else if (m_tool == count_tool::perf && line.find("seconds time elapsed") != std::string::npos)
                seconds = std::atof(w[0].c_str());
            else if (m_tool == count_tool::strace && line.ends_with(" total"))
                calls = std::atof(w[3].c_str());
        }
        if (calls && seconds && *seconds > 0) return std::pair{*calls, *seconds};
        if (!status) std::fprintf(stderr, "the counting tool did not stop\n");
        return std::nullopt;
    }

private:
    count_tool m_tool;
    pid_t m_target;
    cpu_set_t m_anywhere;
    pid_t m_pid = -1;
    std::string m_output;
    std::chrono::steady_clock::time_point m_started, m_stopped;
};

// --- one run ---------------------------------------------------------------------

struct run_result {
    bool ok = false;
    double messages_per_s = 0;
    double mib_per_s = 0;
    double p50_us = 0;
    double p99_us = 0;
    std::uint64_t errors = 0;
    // CPU time (user + system) per echoed message: the server's over its
    // whole life, the load generator's over the run. A side far below one
    // core's worth is waiting, not working: on a shared machine, often for a
    // core someone else holds.
    double server_cpu_us_per_message = 0;
    // The server's, split: its own code (user) and the kernel's on its
    // behalf (system calls, the network stack, page faults).
    double server_user_us_per_message = 0;
    double server_kernel_us_per_message = 0;
    double load_cpu_us_per_message = 0;
    std::optional<double> syscalls_per_message;
};

double seconds_of(const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; }
double cpu_seconds(const rusage& u) { return seconds_of(u.ru_utime) + seconds_of(u.ru_stime); }

// Counts with perf over the middle of the run only: connections are set up
// and torn down outside the window, and its first and last sixth (at least
// 100 ms, at most 1 s) are left out.
task<void> perf_window(syscall_counter& counter, std::chrono::milliseconds margin, std::chrono::milliseconds length) {
    (void)co_await sleep_for(margin);
    counter.start();
    (void)co_await sleep_for(length);
    counter.interrupt();
}

/// A run cut short by its bound counts as one error; its partial figures are lost.
load_report within_bound(result<load_report> r) {
    if (r) return std::move(*r);
    load_report failed;
    failed.errors = 1;
    failed.first_error = "the load did not end in time: " + r.error().message();
    return failed;
}

task<load_report> drive(load_options lo, syscall_counter* counter, count_tool tool) {
    // The load ends by itself after its duration; the deadline only bounds a
    // server that stops answering.
    const auto bound = lo.duration + 15s;
    if (!counter) co_return within_bound(co_await with_timeout(bound, run_load(lo)));
    if (tool == count_tool::strace) {
        // strace slows every system call of the server, so the run's own
        // message count is the only right denominator: trace the whole run,
        // connection set-up included (a few calls per connection).
        counter->start();
        (void)co_await sleep_for(500ms);  // for strace to attach
        load_report report = within_bound(co_await with_timeout(bound, run_load(lo)));
        counter->interrupt();
        co_return report;
    }
    const auto margin = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(lo.duration / 6),
                                   std::chrono::milliseconds(100), std::chrono::milliseconds(1000));
    join_handle<void> window = loop::current().spawn(perf_window(*counter, margin, lo.duration - 2 * margin), "perf window");
    load_report report = within_bound(co_await with_timeout(bound, run_load(lo)));
    co_await std::move(window);
    co_return report;
}

run_result run_one(const options& o, const variant& v, int depth, int server_cpu, count_tool tool, const cpu_set_t& anywhere) {
    run_result r;
    const std::string& backend = v.backend;
    // The server on a free loopback port, on its own core (or anywhere if
    // server_cpu is negative; a server of several loops uses every core).
    std::optional<server_child> s =
        start_server(o.server, backend, spawn_options{.cpu = v.threads == 1 ? server_cpu : -1},
                     v.threads == 1 ? std::vector<std::string>{} : std::vector<std::string>{"--threads", std::to_string(v.threads)});
    if (!s) return r;

    load_options lo;
    lo.mode = o.mode;
    lo.target = net::address::ipv4_loopback(s->port);
    lo.connections = o.connections;
    lo.message_size = o.size;
    lo.depth = depth;
    lo.duration = std::chrono::seconds(o.duration_s);

    std::optional<syscall_counter> counter;
    if (tool != count_tool::none) counter.emplace(tool, s->pid, anywhere);
    // The load generator always uses epoll, so that only the server changes
    // from one run to the next.
    loop_options client;
    client.backend = backend_kind::epoll;
    load_report report;
    rusage before{}, after{};
    ::getrusage(RUSAGE_SELF, &before);
    {
        loop l(client);
        report = l.block_on(drive(lo, counter ? &*counter : nullptr, tool));
    }
    ::getrusage(RUSAGE_SELF, &after);

    r.messages_per_s = report.requests_per_second();
    r.mib_per_s = report.mib_per_second();
    r.p50_us = report.latency.quantile(0.50);
    r.p99_us = report.latency.quantile(0.99);
    r.errors = report.errors;
    if (!report.first_error.empty()) std::printf("  first error: %s\n", report.first_error.c_str());

    if (counter) {
        if (auto counted = counter->result()) {
            const auto [calls, seconds] = *counted;
            // perf: the window's messages, at the run's rate (connections are
            // steady by then); strace: the run's own count.
            const double messages =
                tool == count_tool::perf ? r.messages_per_s * seconds : static_cast<double>(report.requests);
            if (messages > 0) r.syscalls_per_message = calls / messages;
        } else {
            std::printf("  could not count system calls (is perf allowed? see /proc/sys/kernel/perf_event_paranoid)\n");
        }
    }

    rusage usage{};
    const bool clean = exited_with_zero(stop_child(s->pid, SIGTERM, 10s, &usage));
    if (!clean) std::printf("  %s --backend %s did NOT exit with status 0 on SIGTERM\n", o.server.c_str(), backend.c_str());
    if (report.requests > 0) {
        const auto messages = static_cast<double>(report.requests);
        r.server_cpu_us_per_message = cpu_seconds(usage) * 1e6 / messages;
        r.server_user_us_per_message = seconds_of(usage.ru_utime) * 1e6 / messages;
        r.server_kernel_us_per_message = seconds_of(usage.ru_stime) * 1e6 / messages;
        r.load_cpu_us_per_message = (cpu_seconds(after) - cpu_seconds(before)) * 1e6 / messages;
    }
    r.ok = clean && report.errors == 0 && report.requests > 0;
    return r;
}

// --- connection churn ----------------------------------------------------------------

constexpr int churn_round_trips = 10;

/// Writes `out` and reads as many bytes back; false on an error or an early end.
task<bool> round_trip(net::tcp_stream& s, std::span<const std::byte> out, std::span<std::byte> in) {
    if (!co_await s.write_all(out)) co_return false;
    for (std::size_t got = 0; got < in.size();) {
        result<std::size_t> r = co_await s.read_some(in.subspan(got));
        if (!r || *r == 0) co_return false;
        got += *r;
    }
    co_return true;
}

task<void> churn_client(net::address target, std::size_t size, long& done, long& failed) {
    result<net::tcp_stream> s = co_await net::tcp_stream::connect(target, 10s);
    std::vector<std::byte> out(size, std::byte{'x'}), in(size);
    bool ok = s.has_value();
    for (int i = 0; ok && i < churn_round_trips; ++i) ok = co_await round_trip(*s, out, in);
    ++(ok ? done : failed);
}

struct churn_result {
    bool ok = false;
    double wall_s = 0;
    double server_cpu_us_per_connection = 0;
};

churn_result run_churn(const options& o, const variant& v, int server_cpu) {
    churn_result r;
    std::optional<server_child> s = start_server(o.server, v.backend, spawn_options{.cpu = server_cpu}, {});
    if (!s) return r;
    long done = 0, failed = 0;
    loop_options client;
    client.backend = backend_kind::epoll;  // only the server changes from run to run
    const auto t0 = std::chrono::steady_clock::now();
    {
        loop l(client);
        const net::address target = net::address::ipv4_loopback(s->port);
        for (int i = 0; i < o.churn; ++i) l.spawn(churn_client(target, o.size, done, failed)).detach();
        l.run();
    }
    r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rusage usage{};
    const bool clean = exited_with_zero(stop_child(s->pid, SIGTERM, 10s, &usage));
    r.server_cpu_us_per_connection = cpu_seconds(usage) * 1e6 / o.churn;
    r.ok = clean && failed == 0 && done == o.churn;
    if (failed) std::printf("  %ld of %d connections failed\n", failed, o.churn);
    return r;
}

int churn_main(const options& o, int server_cpu) {
    std::printf("%d connections opened at once, each %d round trips of %zu bytes, then closed; %d rounds\n\n", o.churn,
                churn_round_trips, o.size, o.rounds);
    std::vector<std::vector<churn_result>> results(o.backends.size());
    bool all_ok = true;
    for (int round = 1; round <= o.rounds; ++round) {
        for (std::size_t i = 0; i < o.backends.size(); ++i) {
            const std::size_t b = round % 2 ? i : o.backends.size() - 1 - i;
            const churn_result r = run_churn(o, variant{o.backends[b], 1}, server_cpu);
            std::printf("round %d  %-9s wall %.3f s  server cpu %.1f us/connection%s\n", round, o.backends[b].c_str(),
                        r.wall_s, r.server_cpu_us_per_connection, r.ok ? "" : "  FAILED");
            std::fflush(stdout);
            all_ok = all_ok && r.ok;
            results[b].push_back(r);
        }
    }
    std::printf("\nmedians of %d rounds:\n", o.rounds);
    for (std::size_t b = 0; b < o.backends.size(); ++b) {
        std::vector<double> wall, cpu;
        for (const churn_result& r : results[b]) {
            wall.push_back(r.wall_s);
            cpu.push_back(r.server_cpu_us_per_connection);
        }
        std::printf("churn %-9s connections=%d round_trips=%d wall_s=%.3f server_cpu_us_per_connection=%.1f\n",
                    o.backends[b].c_str(), o.churn, churn_round_trips, median(wall), median(cpu));
    }
    return all_ok ? 0 : 1;
}

// --- idle connections ------------------------------------------------------------------

/// A field of /proc/PID/status ("VmRSS", "voluntary_ctxt_switches"), or -1.
long proc_status(pid_t pid, const char* field) {
    std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
    if (!f) return -1;
    char line[256];
    long value = -1;
    const std::size_t len = std::strlen(field);
    while (std::fgets(line, sizeof line, f))
        if (std::strncmp(line, field, len) == 0 && line[len] == ':') value = std::strtol(line + len + 1, nullptr, 10);
    std::fclose(f);
    return value;
}

task<void> idle_client(net::address target, std::size_t size, long& opened, long& failed, const bool& release) {
    result<net::tcp_stream> s = co_await net::tcp_stream::connect(target, 10s);
    // One round trip, so the server has read from it once and waits again.
    std::vector<std::byte> out(size, std::byte{'x'}), in(size);
    if (!s || !co_await round_trip(*s, out, in)) {
        ++failed;
        co_return;
    }
    ++opened;
    while (!release) (void)co_await sleep_for(50ms);
}

task<void> hold_idle(const options& o, net::address target, pid_t server, long rss_before_kib, bool& ok) {
    long opened = 0, failed = 0;
    bool release = false;
    loop& l = loop::current();
    for (int i = 0; i < o.idle; ++i) l.spawn(idle_client(target, o.size, opened, failed, release)).detach();
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    while (opened + failed < o.idle && std::chrono::steady_clock::now() < give_up) (void)co_await sleep_for(10ms);
    (void)co_await sleep_for(200ms);  // settled
    const long switches0 = proc_status(server, "voluntary_ctxt_switches") + proc_status(server, "nonvoluntary_ctxt_switches");
    (void)co_await sleep_for(2s);
    const long switches1 = proc_status(server, "voluntary_ctxt_switches") + proc_status(server, "nonvoluntary_ctxt_switches");
    const long rss_kib = proc_status(server, "VmRSS");
    std::printf("idle connections=%ld rss_per_connection_bytes=%.0f server_rss_kib=%ld (before: %ld) "
                "wakeups_while_idle_per_s=%.1f failed=%ld\n",
                opened, opened ? static_cast<double>(rss_kib - rss_before_kib) * 1024.0 / static_cast<double>(opened) : 0.0,
                rss_kib, rss_before_kib, static_cast<double>(switches1 - switches0) / 2.0, failed);
    std::fflush(stdout);
    ok = failed == 0 && opened == o.idle;
    release = true;
}

int idle_main(const options& o, int server_cpu) {
    bool all_ok = true;
    for (int round = 1; round <= o.rounds; ++round) {
        for (std::size_t i = 0; i < o.backends.size(); ++i) {
            const std::string& backend = o.backends[round % 2 ? i : o.backends.size() - 1 - i];
            std::optional<server_child> s = start_server(o.server, backend, spawn_options{.cpu = server_cpu}, {});
            if (!s) return 1;
            ::usleep(200'000);
            const long before = proc_status(s->pid, "VmRSS");
            std::printf("round %d  %-9s ", round, backend.c_str());
            bool ok = false;
            loop_options client;
            client.backend = backend_kind::epoll;
            client.stall_threshold = std::chrono::nanoseconds::zero();  // it spawns thousands in one go
            {
                loop l(client);
                l.block_on(hold_idle(o, net::address::ipv4_loopback(s->port), s->pid, before, ok));
            }
            const bool clean = exited_with_zero(stop_child(s->pid, SIGTERM, 10s, nullptr));
            all_ok = all_ok && ok && clean;
        }
    }
    return all_ok ? 0 : 1;
}

// --- a bulk stream and a ping beside it ----------------------------------------------

// The client side is plain blocking sockets on threads of their own (all on
// the load's core): the same client for every server, and one whose ping is
// never queued behind its own bulk stream.

constexpr std::size_t flood_chunk = 64 * 1024;
constexpr std::size_t ping_size = 5;
/// The bulk stream's byte at offset i is i % 251: no period of a power of
/// two, so a chunk lost, repeated or moved shows.
constexpr std::uint64_t pattern_period = 251;

/// A blocking TCP connection to 127.0.0.1:port, without Nagle's delay, every
/// send and receive bounded by 5 s; -1 on failure.
int connect_blocking(std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const timeval limit{.tv_sec = 5, .tv_usec = 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

bool send_all(int fd, const std::byte* data, std::size_t size) {
    while (size > 0) {
        const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        data += n;
        size -= static_cast<std::size_t>(n);
    }
    return true;
}

/// SCHED_FIFO for the calling thread, if this process may (root or
/// CAP_SYS_NICE); false otherwise, which leaves it as it was.
bool prioritise_this_thread() {
    const sched_param p{.sched_priority = 1};
    return ::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &p) == 0;
}
void deprioritise_this_thread() {
    const sched_param p{.sched_priority = 0};
    ::pthread_setschedparam(::pthread_self(), SCHED_OTHER, &p);
}

struct flood_result {
    bool ok = false;
    std::size_t pings = 0;
    double ping_p50_us = 0;
    double ping_p99_us = 0;
    double ping_max_us = 0;
    double echoed_mib = 0;  ///< bulk bytes echoed back and verified
    double server_cpu_s = 0;
    std::string error;
};

double quantile(std::vector<double>& sorted, double q) {
    if (sorted.empty()) return 0;
    return sorted[std::min(sorted.size() - 1, static_cast<std::size_t>(q * static_cast<double>(sorted.size())))];
}

flood_result run_flood(const std::string& server, const std::string& backend, int duration_s, int server_cpu) {
    using std::chrono::steady_clock;
    flood_result r;
    std::optional<server_child> s = start_server(server, backend, spawn_options{.cpu = server_cpu}, {});
    if (!s) {
        r.error = "the server did not start";
        return r;
    }
    const int bulk = connect_blocking(s->port);
    const int ping = connect_blocking(s->port);
    std::atomic<std::uint64_t> written{0};
    std::atomic<bool> writer_done{false};
    std::uint64_t echoed = 0;
    std::string bulk_error, ping_error;
    std::vector<double> latencies;
    if (bulk < 0 || ping < 0) {
        r.error = "could not connect";
    } else {
        const auto start = steady_clock::now();
        const auto deadline = start + std::chrono::seconds(duration_s);
        // One period longer than a chunk: the bytes at any offset, up to a
        // chunk of them, are a window of it.
        std::vector<std::byte> pattern(flood_chunk + pattern_period);
        for (std::size_t i = 0; i < pattern.size(); ++i)
            pattern[i] = std::byte(static_cast<unsigned char>(i % pattern_period));
        std::thread writer([&] {
            std::uint64_t at = 0;
            while (steady_clock::now() < deadline &&
                   send_all(bulk, pattern.data() + at % pattern_period, flood_chunk)) {
                at += flood_chunk;
                written.store(at, std::memory_order_release);
            }
            writer_done.store(true, std::memory_order_release);
            ::shutdown(bulk, SHUT_WR);
        });
        std::thread reader([&] {
            std::vector<std::byte> in(flood_chunk);
            for (;;) {
                if (writer_done.load(std::memory_order_acquire) && echoed == written.load(std::memory_order_acquire))
                    break;
                const ssize_t n = ::recv(bulk, in.data(), in.size(), 0);
                if (n < 0 && errno == EINTR) continue;
                if (n < 0) {
                    bulk_error = std::string("bulk read: ") + std::strerror(errno);
                    break;
                }
                if (n == 0) break;
                if (std::memcmp(in.data(), pattern.data() + echoed % pattern_period, static_cast<std::size_t>(n)) !=
                    0) {
                    bulk_error = "bulk echo differs after byte " + std::to_string(echoed);
                    break;
                }
                echoed += static_cast<std::uint64_t>(n);
            }
        });
        // The pings, one at a time, each of its own bytes; the first 100 ms
        // (the bulk stream ramping up) are not counted. The pinging thread
        // runs first on the load's core where it may (real-time priority):
        // what it measures is then the server's delay, not the wait for the
        // bulk threads beside it to be descheduled.
        const bool prioritised = prioritise_this_thread();
        std::byte out[ping_size], back[ping_size];
        for (std::uint64_t k = 0; ping_error.empty() && steady_clock::now() < deadline; ++k) {
            for (std::size_t i = 0; i < ping_size; ++i)
                out[i] = std::byte(static_cast<unsigned char>('a' + (k + i) % 26));
            const auto t0 = steady_clock::now();
            if (!send_all(ping, out, ping_size)) {
                ping_error = std::string("ping write: ") + std::strerror(errno);
                break;
            }
            for (std::size_t got = 0; got < ping_size;) {
                const ssize_t n = ::recv(ping, back + got, ping_size - got, 0);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) {
                    ping_error = n == 0 ? "ping: the server closed" : std::string("ping read: ") + std::strerror(errno);
                    break;
                }
                got += static_cast<std::size_t>(n);
            }
            if (!ping_error.empty()) break;
            if (std::memcmp(out, back, ping_size) != 0) ping_error = "ping echo differs";
            if (t0 - start >= std::chrono::milliseconds(100))
                latencies.push_back(std::chrono::duration<double, std::micro>(steady_clock::now() - t0).count());
        }
        if (prioritised) deprioritise_this_thread();
        writer.join();
        reader.join();
        if (echoed != written.load())
            bulk_error += (bulk_error.empty() ? "" : "; ") + std::string("bulk: ") +
                          std::to_string(written.load() - echoed) + " bytes not echoed";
    }
    if (bulk >= 0) ::close(bulk);
    if (ping >= 0) ::close(ping);
    rusage usage{};
    const bool clean = exited_with_zero(stop_child(s->pid, SIGTERM, 10s, &usage));
    std::sort(latencies.begin(), latencies.end());
    r.pings = latencies.size();
    r.ping_p50_us = quantile(latencies, 0.50);
    r.ping_p99_us = quantile(latencies, 0.99);
    r.ping_max_us = latencies.empty() ? 0 : latencies.back();
    r.echoed_mib = static_cast<double>(echoed) / (1024.0 * 1024.0);
    r.server_cpu_s = cpu_seconds(usage);
    if (r.error.empty())
        r.error = bulk_error.empty() ? ping_error : bulk_error + (ping_error.empty() ? "" : "; " + ping_error);
    if (r.error.empty() && !clean) r.error = "the server did not exit with status 0 on SIGTERM";
    r.ok = r.error.empty() && r.pings > 0;
    return r;
}

int flood_main(const options& o, int server_cpu) {
    struct contender {
        std::string label, server, backend;
    };
    std::vector<contender> contenders;
    for (const std::string& b : o.backends) contenders.push_back({b, o.server, b});
    for (const std::string& p : o.peers) contenders.push_back({p.substr(p.find_last_of('/') + 1), p, "epoll"});
    std::printf(
        "flood: one connection streams %zu KiB writes and reads the echo, another sends %zu-byte pings one at a "
        "time; %d s per run, %d rounds, loopback\n\n",
        flood_chunk / 1024, ping_size, o.duration_s, o.rounds);
    std::vector<std::vector<flood_result>> results(contenders.size());
    bool all_ok = true;
    for (int round = 1; round <= o.rounds; ++round) {
        for (std::size_t i = 0; i < contenders.size(); ++i) {
            const std::size_t c = round % 2 ? i : contenders.size() - 1 - i;
            const flood_result r = run_flood(contenders[c].server, contenders[c].backend, o.duration_s, server_cpu);
            std::printf(
                "round %d  %-12s pings %6zu  p50 %7.0f us  p99 %7.0f us  max %7.0f us  echoed %8.0f MiB  "
                "server cpu %.2f s%s%s\n",
                round, contenders[c].label.c_str(), r.pings, r.ping_p50_us, r.ping_p99_us, r.ping_max_us, r.echoed_mib,
                r.server_cpu_s, r.ok ? "" : "  FAILED: ", r.error.c_str());
            std::fflush(stdout);
            all_ok = all_ok && r.ok;
            results[c].push_back(r);
        }
    }
    std::printf("\nmedians of %d rounds:\n", o.rounds);
    for (std::size_t c = 0; c < contenders.size(); ++c) {
        auto med = [&](double flood_result::*field) {
            std::vector<double> v;
            for (const flood_result& r : results[c]) v.push_back(r.*field);
            return median(v);
        };
        std::printf(
            "flood %-12s ping_p50_us=%.0f ping_p99_us=%.0f ping_max_us=%.0f echoed_mib=%.0f "
            "echoed_mib_per_server_cpu_s=%.0f\n",
            contenders[c].label.c_str(), med(&flood_result::ping_p50_us), med(&flood_result::ping_p99_us),
            med(&flood_result::ping_max_us), med(&flood_result::echoed_mib),
            med(&flood_result::echoed_mib) / std::max(med(&flood_result::server_cpu_s), 1e-9));
    }
    std::printf("\n%s\n", all_ok ? "every run: all bytes verified, server exited with status 0"
                                 : "FAILED: see the runs marked FAILED");
    return all_ok ? 0 : 1;
}

// --- reporting ---------------------------------------------------------------------

void print_run(int round, int depth, const std::string& backend, const run_result& r) {
    std::printf(
        "round %d  depth %-3d %-9s %8.0f msg/s %6.2f MiB/s  p50 %5.0f us  p99 %6.0f us  %llu errors"
        "  cpu us/msg: server %.2f (user %.2f, kernel %.2f), load %.2f",
        round, depth, backend.c_str(), r.messages_per_s, r.mib_per_s, r.p50_us, r.p99_us,
        static_cast<unsigned long long>(r.errors), r.server_cpu_us_per_message, r.server_user_us_per_message,
        r.server_kernel_us_per_message, r.load_cpu_us_per_message);
    if (r.syscalls_per_message) std::printf("  %.3f syscalls/msg", *r.syscalls_per_message);
    std::printf("%s\n", r.ok ? "" : "  FAILED");
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    const options o = parse(argc, argv);

    // SPINDLE_BACKEND would override the server's --backend (the child
    // inherits it) and the load generator's choice: the comparison would be
    // silently void.
    ignore_backend_override("each run names its backend");

    // Two cores of those we may use: the server on the first, the load on the second.
    const cpu_set_t allowed = allowed_cpus();
    const std::vector<int> cpus = first_cpus(allowed, 2);
    int server_cpu = -1;
    if (cpus.size() >= 2) {
        server_cpu = cpus[0];
        pin_to_cpu(cpus[1]);
        std::printf("server pinned to CPU %d, load generator to CPU %d\n", cpus[0], cpus[1]);
    } else {
        std::printf("only 1 core available: server and load generator run unpinned, sharing it\n");
    }

    if (o.churn > 0) return churn_main(o, server_cpu);
    if (o.idle > 0) return idle_main(o, server_cpu);
    if (o.flood) return flood_main(o, server_cpu);

    count_tool tool = count_tool::none;
    if (o.syscalls) {
        if (in_path("perf")) {
            tool = count_tool::perf;
            std::printf("system calls: perf stat -e raw_syscalls:sys_enter on the server, over the middle of each run\n");
        } else if (in_path("strace")) {
            tool = count_tool::strace;
            std::printf("system calls: strace -c -f on the server over the whole run (no perf); strace slows the server,\n"
                        "so the throughput of these runs is not comparable to runs without it\n");
        } else {
            std::printf("system calls: cannot count them (neither perf nor strace is installed)\n");
        }
    }
    if (o.mode == load_mode::http)
        std::printf("%d connections, HTTP/1.1 GET / keep-alive (a message: one request and its response), %d s per run, "
                    "%d rounds, loopback, server %s\n\n",
                    o.connections, o.duration_s, o.rounds, o.server.c_str());
    else
        std::printf("%d connections, %zu-byte messages, %d s per run, %d rounds, loopback, server %s\n\n", o.connections,
                    o.size, o.duration_s, o.rounds, o.server.c_str());
    std::fflush(stdout);

    std::vector<variant> variants;
    for (const std::string& b : o.backends)
        for (int t : o.threads) variants.push_back({b, t});

    // results[depth index][variant index][round]
    std::vector<std::vector<std::vector<run_result>>> results(o.depths.size(),
                                                              std::vector<std::vector<run_result>>(variants.size()));
    bool all_ok = true;
    for (int round = 1; round <= o.rounds; ++round) {
        for (std::size_t d = 0; d < o.depths.size(); ++d) {
            // The variants run back to back for each depth, in an order that
            // flips every round, so a slow phase of the machine hits both
            // sides of a pair and favours neither over the rounds.
            for (std::size_t i = 0; i < variants.size(); ++i) {
                const std::size_t b = round % 2 ? i : variants.size() - 1 - i;
                const run_result r = run_one(o, variants[b], o.depths[d], server_cpu, tool, allowed);
                print_run(round, o.depths[d], variants[b].label(), r);
                all_ok = all_ok && r.ok;
                results[d][b].push_back(r);
            }
        }
    }

    std::printf("\nmedians of %d rounds:\n", o.rounds);
    for (std::size_t d = 0; d < o.depths.size(); ++d) {
        for (std::size_t b = 0; b < variants.size(); ++b) {
            const auto& rs = results[d][b];
            auto med = [&rs](auto field) {
                std::vector<double> v;
                for (const run_result& r : rs) v.push_back(field(r));
                return median(v);
            };
            std::printf(
                "depth %-3d %-12s %8.0f msg/s %6.2f MiB/s  p50 %5.0f us  p99 %6.0f us  cpu us/msg: server %.2f "
                "(user %.2f, kernel %.2f), load %.2f",
                o.depths[d], variants[b].label().c_str(), med([](const run_result& r) { return r.messages_per_s; }),
                med([](const run_result& r) { return r.mib_per_s; }), med([](const run_result& r) { return r.p50_us; }),
                med([](const run_result& r) { return r.p99_us; }),
                med([](const run_result& r) { return r.server_cpu_us_per_message; }),
                med([](const run_result& r) { return r.server_user_us_per_message; }),
                med([](const run_result& r) { return r.server_kernel_us_per_message; }),
                med([](const run_result& r) { return r.load_cpu_us_per_message; }));
            std::vector<double> calls;
            for (const run_result& r : rs)
                if (r.syscalls_per_message) calls.push_back(*r.syscalls_per_message);
            if (!calls.empty()) std::printf("  %.3f syscalls/msg", median(calls));
            std::printf("\n");
        }
    }

    // Several loops against one: the server's CPU per message, pair by pair.
    if (o.threads.size() > 1 && o.threads.front() == 1) {
        std::printf("\nserver CPU per message, N loops / 1 loop:\n");
        for (std::size_t d = 0; d < o.depths.size(); ++d) {
            for (std::size_t b = 0; b < variants.size(); ++b) {
                if (variants[b].threads == 1) continue;
                const std::size_t one = b - (b % o.threads.size());  // the same backend's 1-loop variant
                std::vector<double> ratios;
                std::printf("depth %-3d %-12s rounds", o.depths[d], variants[b].label().c_str());
                for (int round = 0; round < o.rounds; ++round) {
                    const double base = results[d][one][static_cast<std::size_t>(round)].server_cpu_us_per_message;
                    const double ratio = base > 0 ? results[d][b][static_cast<std::size_t>(round)].server_cpu_us_per_message / base : 0;
                    ratios.push_back(ratio);
                    std::printf(" %.3f", ratio);
                }
                std::printf("  median %.3f\n", median(ratios));
            }
        }
    }

    // The ratio within each round's pair, then its median: the pair ran
    // seconds apart, so a noisy neighbour moves both of its sides alike.
    const auto epoll = std::find(o.backends.begin(), o.backends.end(), "epoll");
    const auto uring = std::find(o.backends.begin(), o.backends.end(), "io_uring");
    if (epoll != o.backends.end() && uring != o.backends.end()) {
        // The first thread count of each backend.
        const auto e = static_cast<std::size_t>(epoll - o.backends.begin()) * o.threads.size();
        const auto u = static_cast<std::size_t>(uring - o.backends.begin()) * o.threads.size();
        std::printf("\nio_uring/epoll, messages/s:\n");
        for (std::size_t d = 0; d < o.depths.size(); ++d) {
            std::vector<double> ratios;
            std::printf("depth %-3d rounds", o.depths[d]);
            for (int round = 0; round < o.rounds; ++round) {
                const double base = results[d][e][static_cast<std::size_t>(round)].messages_per_s;
                const double ratio = base > 0 ? results[d][u][static_cast<std::size_t>(round)].messages_per_s / base : 0;
                ratios.push_back(ratio);
                std::printf(" %.3f", ratio);
            }
            std::printf("  median %.3f\n", median(ratios));
        }
    }
    std::printf("\n%s\n", all_ok ? "every run: all bytes verified, 0 errors, server exited with status 0" : "FAILED: see the runs marked FAILED");
    return all_ok ? 0 : 1;
}
