// spindle-soak: the example echo and HTTP servers under a long, mixed load.
//
// Each server runs as a child process on loopback with the chosen backend and
// a small RLIMIT_NOFILE. This process drives them from a spindle loop of its
// own: per server, a fixed number of workers each run one session after
// another, each session of a kind drawn from a seeded generator (ordinary
// exchanges, streams, half-closes, slow clients, resets, malformed or closing
// HTTP requests). Every byte that comes back is compared with the byte
// expected. At random times (seeded too) a burst of connections larger than
// the server's descriptor limit pushes it into EMFILE: it must stay calm (no
// spinning) and answer everyone once descriptors free up.
//
// Every report interval each server is brought to a quiet point (no session
// of ours open, its descriptors back to their idle count), and its resident
// memory and open descriptors are read from /proc. After the warm-up neither
// may grow: memory beyond a tolerance over the figure at the end of the
// warm-up, descriptors beyond the count then. A lost or wrong byte, a timeout,
// a server that exits, or a server that does not exit with status 0 on
// SIGTERM at the end fails the run too.

#include "bench_support.hpp"

#include <spindle/net.hpp>
#include <spindle/spindle.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::bench;

namespace {

// From meson: the example servers built with this program, and the backends
// this build has (e.g. "epoll,io_uring").
#ifndef SPINDLE_ECHO_SERVER
#define SPINDLE_ECHO_SERVER "spindle-echo"
#endif
#ifndef SPINDLE_HTTP_SERVER
#define SPINDLE_HTTP_SERVER "spindle-http"
#endif
#ifndef SPINDLE_BUILT_BACKENDS
#define SPINDLE_BUILT_BACKENDS "epoll"
#endif

using steady = std::chrono::steady_clock;

// --- options -----------------------------------------------------------------

struct options {
    bool echo = true;
    bool http = true;
    std::string backend;
    std::string client_backend = "epoll";
    int duration_s = 600;
    int warmup_s = -1;  // default: a third of the duration, at most 60 s
    int report_s = 10;
    std::uint64_t seed = 0;
    int connections = 16;
    int fd_limit = 256;
    int exhaust_every_s = 60;
    int rss_tolerance_kib = 4096;
    int rss_tolerance_percent = 10;
    std::string echo_server = SPINDLE_ECHO_SERVER;
    std::string http_server = SPINDLE_HTTP_SERVER;
};

[[noreturn]] void usage(std::FILE* out, int status) {
    std::fprintf(out,
                 "usage: spindle-soak [--server echo|http|both] [--backend NAME] [--duration SECONDS] [--seed N]\n"
                 "                    [--connections N] [--report-interval SECONDS] [--warmup SECONDS]\n"
                 "                    [--fd-limit N] [--exhaust-every SECONDS] [--rss-tolerance KIB,PERCENT]\n"
                 "                    [--client-backend NAME] [--echo-server PATH] [--http-server PATH]\n"
                 "Runs spindle-echo and spindle-http under a mixed, seeded load on loopback for a given time:\n"
                 "exchanges, streams, half-closes, slow clients, resets and bursts beyond the servers'\n"
                 "descriptor limit, every byte verified. Fails when a byte is lost or wrong, when a server's\n"
                 "memory or descriptors grow after the warm-up, or when a server does not exit cleanly.\n\n"
                 "  --server WHICH          echo, http or both (default both)\n"
                 "  --backend NAME          the servers' backend (default io_uring if built; built: %s)\n"
                 "  --duration SECONDS      1..86400 (default 600)\n"
                 "  --seed N                seeds every random choice (default: from the clock; printed)\n"
                 "  --connections N         concurrent sessions per server, 1..1000 (default 16)\n"
                 "  --report-interval SEC   a quiet point and a report line every SEC, 1..3600 (default 10)\n"
                 "  --warmup SECONDS        growth is measured from its end (default: a third of the duration,\n"
                 "                          at most 60)\n"
                 "  --fd-limit N            the servers' RLIMIT_NOFILE, 32..4096 (default 256)\n"
                 "  --exhaust-every SEC     mean time between descriptor-exhaustion bursts per server,\n"
                 "                          5..3600 (default 60); one always falls in the warm-up\n"
                 "  --rss-tolerance K,P     growth allowed over the warm-up figure: the larger of K KiB and\n"
                 "                          P percent (default 4096,10)\n"
                 "  --client-backend NAME   this program's own loop (default epoll)\n"
                 "  --echo-server PATH      (default: the spindle-echo built with this program)\n"
                 "  --http-server PATH      (default: the spindle-http built with this program)\n",
                 SPINDLE_BUILT_BACKENDS);
    std::exit(status);
}

// The name in its error messages, and the usage text after them.
const program soak_program{"spindle-soak", usage};

std::string default_backend() {
    const std::string_view built = SPINDLE_BUILT_BACKENDS;
    if (built.find("io_uring") != std::string_view::npos) return "io_uring";
    return std::string(built.substr(0, built.find(',')));
}

options parse(int argc, char** argv) {
    options o;
    o.backend = default_backend();
    bool seeded = false;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h") usage(stdout, 0);
        if (i + 1 >= argc) usage(stderr, 2);
        const std::string_view value = argv[++i];
        if (arg == "--server") {
            if (value != "echo" && value != "http" && value != "both") usage(stderr, 2);
            o.echo = value != "http";
            o.http = value != "echo";
        } else if (arg == "--backend" || arg == "--client-backend") {
            require_backend(soak_program, value);
            (arg == "--backend" ? o.backend : o.client_backend) = value;
        } else if (arg == "--duration") {
            o.duration_s = static_cast<int>(number(soak_program, value, 1, 86400));
        } else if (arg == "--warmup") {
            o.warmup_s = static_cast<int>(number(soak_program, value, 0, 86400));
        } else if (arg == "--report-interval") {
            o.report_s = static_cast<int>(number(soak_program, value, 1, 3600));
        } else if (arg == "--seed") {
            std::uint64_t v = 0;
            auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
            if (ec != std::errc() || end != value.data() + value.size()) usage(stderr, 2);
            o.seed = v;
            seeded = true;
        } else if (arg == "--connections") {
            o.connections = static_cast<int>(number(soak_program, value, 1, 1000));
        } else if (arg == "--fd-limit") {
            o.fd_limit = static_cast<int>(number(soak_program, value, 32, 4096));
        } else if (arg == "--exhaust-every") {
            o.exhaust_every_s = static_cast<int>(number(soak_program, value, 5, 3600));
        } else if (arg == "--rss-tolerance") {
            const auto comma = value.find(',');
            if (comma == std::string_view::npos) usage(stderr, 2);
            o.rss_tolerance_kib = static_cast<int>(number(soak_program, value.substr(0, comma), 0, 1 << 20));
            o.rss_tolerance_percent = static_cast<int>(number(soak_program, value.substr(comma + 1), 0, 1000));
        } else if (arg == "--echo-server") {
            o.echo_server = value;
        } else if (arg == "--http-server") {
            o.http_server = value;
        } else {
            usage(stderr, 2);
        }
    }
    if (o.warmup_s < 0) o.warmup_s = std::min(60, o.duration_s / 3);
    if (!seeded) o.seed = static_cast<std::uint64_t>(steady::now().time_since_epoch().count()) ^ static_cast<std::uint64_t>(::getpid());
    return o;
}

// --- the server processes and /proc ------------------------------------------

/// Reaps `pid` if it has exited: its wait status, or nullopt while it runs.
std::optional<int> exited(pid_t pid) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    return std::nullopt;
}

std::string describe_status(int status) {
    char text[64];
    if (WIFEXITED(status))
        std::snprintf(text, sizeof text, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        std::snprintf(text, sizeof text, "signal %d (%s)", WTERMSIG(status), ::strsignal(WTERMSIG(status)));
    else
        std::snprintf(text, sizeof text, "wait status %#x", status);
    return text;
}

/// Open descriptors of `pid` (entries of /proc/PID/fd), or -1.
int descriptor_count(pid_t pid) {
    const std::string path = "/proc/" + std::to_string(pid) + "/fd";
    DIR* dir = ::opendir(path.c_str());
    if (!dir) return -1;
    int n = 0;
    while (const dirent* e = ::readdir(dir))
        if (e->d_name[0] != '.') ++n;
    ::closedir(dir);
    return n;
}

struct memory_figures {
    long rss_kib = -1;  ///< VmRSS
    long hwm_kib = -1;  ///< VmHWM, the peak RSS
};

memory_figures memory_of(pid_t pid) {
    memory_figures m;
    const std::string path = "/proc/" + std::to_string(pid) + "/status";
    if (std::FILE* f = std::fopen(path.c_str(), "r")) {
        char line[256];
        while (std::fgets(line, sizeof line, f)) {
            if (std::strncmp(line, "VmRSS:", 6) == 0) m.rss_kib = std::atol(line + 6);
            if (std::strncmp(line, "VmHWM:", 6) == 0) m.hwm_kib = std::atol(line + 6);
        }
        std::fclose(f);
    }
    return m;
}

/// User plus system CPU time of `pid` so far, in seconds (/proc/PID/stat), or -1.
double cpu_seconds(pid_t pid) {
    const std::string path = "/proc/" + std::to_string(pid) + "/stat";
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (!f) return -1;
    char text[1024];
    const std::size_t n = std::fread(text, 1, sizeof text - 1, f);
    std::fclose(f);
    text[n] = '\0';
    // The command name may hold spaces and parentheses: fields count from the last ')'.
    const char* p = std::strrchr(text, ')');
    if (!p) return -1;
    unsigned long utime = 0, stime = 0;
    // After ") ": state(3) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime(14) stime(15)
    if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2) return -1;
    return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// --- what is counted ----------------------------------------------------------

enum class session_kind : std::uint8_t {
    exchange,    ///< echo: messages one at a time, each read back before the next
    stream,      ///< echo: a long stream written and read back concurrently
    half_close,  ///< echo: a stream, then shutdown(SHUT_WR); everything back, then end of stream
    keep_alive,  ///< http: requests one at a time or pipelined, the client closes
    closing,     ///< http: the last request closes (Connection: close, HTTP/1.0, or an error reply)
    http_half,   ///< http: pipelined requests, then shutdown(SHUT_WR); every response, then end of stream
    slow,        ///< a few bytes per write with pauses between, read in small pieces
    reset,       ///< the client aborts (SO_LINGER 0, then close) mid-request or mid-reply
    count,
};
constexpr std::array<const char*, static_cast<std::size_t>(session_kind::count)> kind_names{
    "exchange", "stream", "half-close", "keep-alive", "closing", "half-close", "slow", "reset"};

enum class error_kind : std::uint8_t {
    connect,     ///< the connection could not be made
    corrupt,     ///< a byte differs from the one expected, or a byte came that should not have
    lost,        ///< end of stream before every expected byte came
    reset,       ///< the server reset the connection
    timeout,     ///< a session or a burst took too long
    io,          ///< any other error on a read or a write
    count,
};
constexpr std::array<const char*, static_cast<std::size_t>(error_kind::count)> error_names{
    "connect", "corrupt", "lost", "reset", "timeout", "io"};

struct counters {
    std::array<std::uint64_t, kind_names.size()> sessions{};
    std::array<std::uint64_t, error_names.size()> errors{};
    std::uint64_t requests = 0;  ///< echo messages or HTTP responses, verified whole
    std::uint64_t bytes = 0;     ///< bytes received and verified
    std::uint64_t bursts = 0;
    std::uint64_t bursts_starved = 0;  ///< bursts during which the server ran out of descriptors
    std::uint64_t burst_connections = 0;

    std::uint64_t error_total() const {
        std::uint64_t n = 0;
        for (std::uint64_t e : errors) n += e;
        return n;
    }
};

enum class protocol : std::uint8_t { echo, http };

/// One server under soak, and what is known of it.
struct target {
    std::string name;
    protocol proto;
    server_child proc;
    net::address address;
    counters count;
    std::mt19937_64 rng;  // the bursts' times and sizes

    // Sessions start only while `open` is set; `live` of them are running.
    // Quiet points and bursts reset it and wait for `live` to reach zero.
    event open{true};
    int live = 0;
    mutex exclusive;  // one quiet point or burst at a time

    int idle_fds = -1;  ///< descriptors before any load
    int peak_fds = 0;   ///< the most seen since the last report
    long peak_rss_kib = 0;
    std::optional<int> warm_fds;  ///< at the quiet point ending the warm-up
    long warm_rss_kib = -1;
    int last_fds = -1;
    long last_rss_kib = -1;
    long hwm_kib = -1;  ///< the server's peak RSS, as of the last quiet point
    std::optional<int> exit_status;  ///< once reaped
};

// --- the run -----------------------------------------------------------------------

struct run_state {
    const options* opts;
    std::vector<std::unique_ptr<target>> targets;
    std::stop_source stop;  // the end of the run, or the first failure
    std::vector<std::string> failures;
    steady::time_point start;

    double elapsed() const { return std::chrono::duration<double>(steady::now() - start).count(); }

    void fail(std::string what) {
        // The final quiet point repeats the last one's findings.
        if (std::find(failures.begin(), failures.end(), what) != failures.end()) return;
        // After a server dies every session fails: the first few say enough.
        if (failures.size() < 20) {
            std::printf("[%6.1fs] FAILURE: %s\n", elapsed(), what.c_str());
            std::fflush(stdout);
        }
        failures.push_back(std::move(what));
        stop.request_stop();
    }
};

run_state* state = nullptr;

std::size_t uniform(std::mt19937_64& rng, std::size_t lo, std::size_t hi) {
    return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
}
bool chance(std::mt19937_64& rng, double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

void fill_random(std::mt19937_64& rng, std::span<char> out) {
    std::size_t i = 0;
    while (i < out.size()) {
        std::uint64_t x = rng();
        for (int b = 0; b < 8 && i < out.size(); ++b, x >>= 8) out[i++] = static_cast<char>(x);
    }
}

/// The outcome of one session, recorded against its server.
struct session {
    explicit session(std::mt19937_64& generator) noexcept : rng(generator) {}

    std::mt19937_64& rng;
    bool slow = false;
    std::uint64_t requests = 0;
    std::uint64_t bytes = 0;
    std::optional<error_kind> error;
    std::string what;

    bool bad(error_kind kind, std::string text) {
        if (!error) {
            error = kind;
            what = std::move(text);
        }
        return false;
    }
    bool bad(std::error_code ec, std::string_view doing) {
        error_kind kind = error_kind::io;
        if (ec == std::errc::connection_reset || ec == std::errc::broken_pipe) kind = error_kind::reset;
        // A session's deadline cancels the wait it is parked on.
        if (ec == std::errc::operation_canceled || ec == std::errc::timed_out) kind = error_kind::timeout;
        return bad(kind, std::string(doing) + ": " + ec.message());
    }
};

std::span<const std::byte> bytes_of(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

/// Writes `data`, in pieces of random size; a slow session writes 1 to 8
/// bytes at a time with pauses of up to 4 ms.
task<bool> write_pieces(net::tcp_stream& s, session& ss, std::string_view data) {
    std::size_t at = 0;
    while (at < data.size()) {
        std::size_t piece = data.size() - at;
        if (ss.slow) {
            piece = std::min(piece, uniform(ss.rng, 1, 8));
        } else if (chance(ss.rng, 0.3)) {
            piece = std::min(piece, uniform(ss.rng, 1, 64 * 1024));
        }
        if (auto w = co_await s.write_all(bytes_of(data.substr(at, piece))); !w) co_return ss.bad(w.error(), "write");
        at += piece;
        if (ss.slow && chance(ss.rng, 0.5)) (void)co_await sleep_for(std::chrono::milliseconds(uniform(ss.rng, 0, 4)));
    }
    co_return true;
}

/// Reads until `expected.size()` bytes came, comparing each with the one
/// expected; a slow session reads in small pieces with pauses. Counts the
/// bytes verified; `ends` are the offsets at which a request's reply is
/// complete (each counts one request verified once passed).
task<bool> read_expected(net::tcp_stream& s, session& ss, std::string_view expected, std::span<const std::size_t> ends = {}) {
    std::array<char, 16 * 1024> buffer;
    std::size_t at = 0;
    std::size_t next_end = 0;
    while (at < expected.size()) {
        std::size_t room = std::min(buffer.size(), expected.size() - at);
        if (ss.slow) room = std::min(room, uniform(ss.rng, 1, 16));
        result<std::size_t> n = co_await s.read_some(std::as_writable_bytes(std::span(buffer.data(), room)));
        if (!n) co_return ss.bad(n.error(), "read");
        if (*n == 0) {
            co_return ss.bad(error_kind::lost, "end of stream after " + std::to_string(at) + " of " +
                                                   std::to_string(expected.size()) + " bytes");
        }
        if (std::memcmp(buffer.data(), expected.data() + at, *n) != 0) {
            std::size_t i = 0;
            while (buffer[i] == expected[at + i]) ++i;
            co_return ss.bad(error_kind::corrupt, "byte " + std::to_string(at + i) + " of " + std::to_string(expected.size()) +
                                                      " differs");
        }
        at += *n;
        ss.bytes += *n;
        while (next_end < ends.size() && ends[next_end] <= at) {
            ++ss.requests;
            ++next_end;
        }
        if (ss.slow && chance(ss.rng, 0.3)) (void)co_await sleep_for(std::chrono::milliseconds(uniform(ss.rng, 0, 4)));
    }
    co_return true;
}

/// The next read must be the end of stream: a byte more is one too many.
task<bool> read_end(net::tcp_stream& s, session& ss) {
    std::array<std::byte, 256> buffer;
    result<std::size_t> n = co_await s.read_some(buffer);
    if (!n) co_return ss.bad(n.error(), "read at the end");
    if (*n != 0) co_return ss.bad(error_kind::corrupt, std::to_string(*n) + " bytes more than expected");
    co_return true;
}

/// Closes with a reset instead of a FIN: SO_LINGER on, with a zero timeout.
void abort_connection(net::tcp_stream& s) {
    const ::linger l{1, 0};
    ::setsockopt(s.native_handle(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
    s.close();
}

// --- echo sessions ---------------------------------------------------------------

/// A message size: mostly small, some of a few KiB, a few large.
std::size_t echo_size(std::mt19937_64& rng, std::size_t most) {
    const double p = std::uniform_real_distribution<double>(0, 1)(rng);
    std::size_t n = p < 0.6 ? uniform(rng, 1, 256) : p < 0.9 ? uniform(rng, 257, 8192) : p < 0.99 ? uniform(rng, 8193, 65536)
                                                                                                   : uniform(rng, 65537, 256 * 1024);
    return std::min(n, most);
}

task<bool> echo_session(net::tcp_stream& s, session& ss, session_kind kind) {
    std::mt19937_64& rng = ss.rng;
    if (kind == session_kind::exchange || (kind == session_kind::slow && chance(rng, 0.5))) {
        // One message at a time, each read back before the next. 64 KiB at
        // most: the server echoes only what it can write, and a larger
        // message written before reading could fill both directions' buffers.
        const std::size_t messages = uniform(rng, 1, ss.slow ? 4 : 32);
        std::string message;
        for (std::size_t i = 0; i < messages; ++i) {
            message.resize(echo_size(rng, ss.slow ? 512 : 64 * 1024));
            fill_random(rng, message);
            if (!co_await write_pieces(s, ss, message)) co_return false;
            if (!co_await read_expected(s, ss, message)) co_return false;
            ++ss.requests;
        }
        co_return true;
    }
    if (kind == session_kind::reset) {
        // Some bytes out, perhaps some back, then an abort: mid-message, or
        // while the server is still writing a large echo.
        std::string message(echo_size(rng, 256 * 1024), '\0');
        fill_random(rng, message);
        if (!co_await write_pieces(s, ss, message)) co_return false;
        if (chance(rng, 0.5)) {
            const std::size_t part = uniform(rng, 0, message.size() - 1);
            if (!co_await read_expected(s, ss, std::string_view(message).substr(0, part))) co_return false;
        }
        abort_connection(s);
        co_return true;
    }
    // A stream (half-close: then end of stream), written and read back
    // concurrently, so its size is not bounded by the socket buffers.
    std::string data;
    const std::size_t messages = uniform(rng, 1, ss.slow ? 4 : 16);
    std::vector<std::size_t> ends;
    for (std::size_t i = 0; i < messages; ++i) {
        const std::size_t old = data.size();
        data.resize(old + echo_size(rng, ss.slow ? 512 : 256 * 1024));
        fill_random(rng, std::span(data).subspan(old));
        ends.push_back(data.size());
    }
    const bool half = kind == session_kind::half_close || (ss.slow && chance(rng, 0.5));
    auto writer = [](net::tcp_stream& s, session& ss, std::string_view data, bool half) -> task<bool> {
        if (!co_await write_pieces(s, ss, data)) co_return false;
        if (half) {
            if (auto r = s.shutdown_write(); !r) co_return ss.bad(r.error(), "shutdown");
        }
        co_return true;
    };
    auto reader = [](net::tcp_stream& s, session& ss, std::string_view data, std::span<const std::size_t> ends,
                     bool half) -> task<bool> {
        if (!co_await read_expected(s, ss, data, ends)) co_return false;
        if (half) co_return co_await read_end(s, ss);
        co_return true;
    };
    auto [wrote, read] = co_await when_all(writer(s, ss, data, half), reader(s, ss, data, ends, half));
    co_return wrote && read;
}

// --- HTTP sessions -------------------------------------------------------------------

/// The exact response spindle-http gives (see docs/examples/http): written
/// out here, independently of its code, so any difference shows.
std::string http_response(int status, std::string_view reason, std::string_view body, std::string_view connection,
                          std::string_view extra = {}, bool head_only = false) {
    std::string r = "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) + "\r\nServer: spindle\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\nContent-Type: text/plain\r\n";
    if (!connection.empty()) r += "Connection: " + std::string(connection) + "\r\n";
    r += extra;
    r += "\r\n";
    if (!head_only) r += body;
    return r;
}

struct http_exchange {
    std::string request;
    std::string response;
    bool closes = false;  ///< the server closes after this response
};

std::string printable(std::mt19937_64& rng, std::size_t n) {
    std::string s(n, 'a');
    for (char& c : s) c = static_cast<char>(uniform(rng, 0x21, 0x7e));
    return s;
}

/// A request that keeps the connection open, and its response.
http_exchange keep_alive_request(std::mt19937_64& rng) {
    const std::string hello = "Hello, World!";
    switch (uniform(rng, 0, 9)) {
    case 0:
        return {"GET /missing/" + std::to_string(rng() % 100000) + "?q=" + printable(rng, uniform(rng, 0, 64)) +
                    " HTTP/1.1\r\nHost: soak\r\n\r\n",
                http_response(404, "Not Found", "Not Found", {})};
    case 1: return {"HEAD / HTTP/1.1\r\nHost: soak\r\n\r\n", http_response(200, "OK", hello, {}, {}, true)};
    case 2: {
        std::string body(uniform(rng, 0, 4096), '\0');
        fill_random(rng, body);  // any bytes: a body is not parsed
        return {"POST /form HTTP/1.1\r\nHost: soak\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body,
                http_response(405, "Method Not Allowed", "Method Not Allowed", {}, "Allow: GET, HEAD\r\n")};
    }
    case 3:
        return {"GET /?v=1.0 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", http_response(200, "OK", hello, "keep-alive")};
    case 4:
        // A large head (the server reads 16 KiB at a time and accepts 8 KiB).
        return {"GET /?big HTTP/1.1\r\nHost: soak\r\nX-Soak: " + printable(rng, uniform(rng, 100, 7000)) + "\r\n\r\n",
                http_response(200, "OK", hello, {})};
    default: return {"GET / HTTP/1.1\r\nHost: soak\r\n\r\n", http_response(200, "OK", hello, {})};
    }
}

/// A request after which the server answers and closes.
http_exchange closing_request(std::mt19937_64& rng) {
    const std::string hello = "Hello, World!";
    switch (uniform(rng, 0, 4)) {
    case 0: return {"GET / HTTP/1.0\r\n\r\n", http_response(200, "OK", hello, "close"), true};
    case 1: return {"GET /\r\n\r\n", http_response(400, "Bad Request", "Bad Request", "close"), true};  // no version
    case 2: return {"GET / HTTP/1.1\r\n\r\n", http_response(400, "Bad Request", "Bad Request", "close"), true};  // no Host
    case 3:
        // Refused from the head alone; the body never comes.
        return {"POST / HTTP/1.1\r\nHost: soak\r\nContent-Length: 2000000\r\n\r\n",
                http_response(413, "Content Too Large", "Content Too Large", "close"), true};
    default: return {"GET / HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n", http_response(200, "OK", hello, "close"), true};
    }
}

task<bool> http_session(net::tcp_stream& s, session& ss, session_kind kind) {
    std::mt19937_64& rng = ss.rng;
    std::vector<http_exchange> exchanges;
    const std::size_t n = uniform(rng, 1, ss.slow ? 3 : 24);
    for (std::size_t i = 0; i < n; ++i) exchanges.push_back(keep_alive_request(rng));
    const bool closes = kind == session_kind::closing || (kind == session_kind::slow && chance(rng, 0.3));
    if (closes) {
        exchanges.push_back(closing_request(rng));
        // Requests pipelined behind the closing one are never answered, and
        // the server reads them away before it closes (no reset).
        if (!ss.slow && chance(rng, 0.3)) exchanges.push_back({"GET /never HTTP/1.1\r\nHost: soak\r\n\r\n", {}});
    }

    if (kind == session_kind::reset) {
        // Part of the requests (perhaps cut inside one), perhaps some replies, then an abort.
        std::string all;
        for (const http_exchange& e : exchanges) all += e.request;
        all.resize(uniform(rng, 1, all.size()));
        if (!co_await write_pieces(s, ss, all)) co_return false;
        if (chance(rng, 0.3)) (void)co_await sleep_for(std::chrono::milliseconds(uniform(rng, 0, 5)));
        abort_connection(s);
        co_return true;
    }

    std::string requests, responses;
    std::vector<std::size_t> ends;
    for (const http_exchange& e : exchanges) {
        requests += e.request;
        responses += e.response;
        if (!e.response.empty()) ends.push_back(responses.size());
    }
    const bool half = kind == session_kind::http_half;
    if (!half && !ss.slow && chance(rng, 0.5)) {
        // One at a time: each response read before the next request goes.
        for (const http_exchange& e : exchanges) {
            if (!co_await write_pieces(s, ss, e.request)) co_return false;
            if (!co_await read_expected(s, ss, e.response)) co_return false;
            ++ss.requests;
            if (e.closes) break;
        }
    } else {
        // Pipelined, written and read concurrently.
        auto writer = [](net::tcp_stream& s, session& ss, std::string_view data, bool half) -> task<bool> {
            if (!co_await write_pieces(s, ss, data)) co_return false;
            if (half) {
                if (auto r = s.shutdown_write(); !r) co_return ss.bad(r.error(), "shutdown");
            }
            co_return true;
        };
        auto [wrote, read] = co_await when_all(writer(s, ss, requests, half), read_expected(s, ss, responses, ends));
        if (!wrote || !read) co_return false;
    }
    // After a closing response, or our half-close, the server closes.
    if (closes || half) co_return co_await read_end(s, ss);
    co_return true;
}

// --- workers -------------------------------------------------------------------------

session_kind pick_kind(std::mt19937_64& rng, protocol proto) {
    const std::size_t p = uniform(rng, 0, 99);
    if (p < 10) return session_kind::slow;
    if (p < 20) return session_kind::reset;
    if (proto == protocol::echo) return p < 60 ? session_kind::exchange : p < 80 ? session_kind::stream : session_kind::half_close;
    return p < 60 ? session_kind::keep_alive : p < 80 ? session_kind::closing : session_kind::http_half;
}

task<void> run_session(target& t, std::mt19937_64& rng) {
    const session_kind kind = pick_kind(rng, t.proto);
    session ss(rng);
    ss.slow = kind == session_kind::slow;
    const auto deadline = steady::now() + 30s;
    bool ok = false;
    result<net::tcp_stream> s = co_await net::tcp_stream::connect(t.address, 10s);
    if (!s) {
        ss.bad(error_kind::connect, "connect: " + s.error().message());
    } else {
        (void)s->set_nodelay(true);
        task<bool> session_task = t.proto == protocol::echo ? echo_session(*s, ss, kind) : http_session(*s, ss, kind);
        // timed_out when the deadline cut the session short.
        result<bool> done = co_await with_deadline(deadline, std::move(session_task));
        if (done)
            ok = *done;
        else
            ss.bad(done.error(), "session");
        if (!ok && !ss.error) ss.bad(error_kind::timeout, "no answer within 30 s");
    }
    t.count.requests += ss.requests;
    t.count.bytes += ss.bytes;
    if (ok) {
        ++t.count.sessions[static_cast<std::size_t>(kind)];
    } else {
        ++t.count.errors[static_cast<std::size_t>(*ss.error)];
        state->fail(t.name + ": " + kind_names[static_cast<std::size_t>(kind)] + " session: " + ss.what);
    }
}

task<void> worker(target& t, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    const std::stop_token stop = state->stop.get_token();
    while (!stop.stop_requested()) {
        if (!co_await t.open.wait(stop)) break;
        // The gate may have closed again between its opening and this resumption.
        if (!t.open.is_set() || stop.stop_requested()) continue;
        ++t.live;
        co_await run_session(t, rng);
        --t.live;
    }
}

// --- quiet points ----------------------------------------------------------------------

/// Stops new sessions on `t` and waits for those running to end. False if
/// they do not end in time (their deadline is 30 s).
task<bool> drain(target& t) {
    t.open.reset();
    const auto until = steady::now() + 45s;
    while (t.live > 0) {
        if (steady::now() > until) co_return false;
        (void)co_await sleep_for(5ms);
    }
    co_return true;
}

/// At a quiet point: waits up to 3 s for the server to close its side of our
/// connections, then reads its descriptors and memory.
task<void> sample_quiet(target& t) {
    const auto until = steady::now() + 3s;
    int fds = descriptor_count(t.proc.pid);
    while (fds > t.idle_fds && steady::now() < until) {
        (void)co_await sleep_for(10ms);
        fds = descriptor_count(t.proc.pid);
    }
    t.last_fds = fds;
    const memory_figures m = memory_of(t.proc.pid);
    t.last_rss_kib = m.rss_kib;
    t.hwm_kib = m.hwm_kib;
}

// --- descriptor exhaustion --------------------------------------------------------------

struct burst_conn {
    net::tcp_stream stream;
    std::string request;
    std::string response;
    int requests = 1;
    bool answered = false;
    bool failed = false;
};

task<void> await_answer(target& t, burst_conn& c) {
    std::mt19937_64 rng(0);
    session ss(rng);
    result<bool> read = co_await with_timeout(30s, read_expected(c.stream, ss, c.response));
    if (read && *read) {
        c.answered = true;
        t.count.requests += static_cast<std::uint64_t>(c.requests);
        t.count.bytes += ss.bytes;
        co_return;
    }
    c.failed = true;
    if (!ss.error) ss.bad(error_kind::timeout, "no answer within 30 s");
    ++t.count.errors[static_cast<std::size_t>(*ss.error)];
    state->fail(t.name + ": descriptor exhaustion: " + ss.what);
}

/// Opens more connections than the server has descriptors, each with one
/// request: the server answers those it can accept and must then wait (not
/// spin) for descriptors, the rest waiting in its backlog. Once the first
/// ones close it must accept and answer every other one.
task<void> exhaust(target& t) {
    const options& o = *state->opts;
    const std::size_t n = static_cast<std::size_t>(o.fd_limit) + uniform(t.rng, 32, static_cast<std::size_t>(o.fd_limit) / 2 + 32);
    std::vector<std::unique_ptr<burst_conn>> conns;
    conns.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
        result<net::tcp_stream> s = co_await net::tcp_stream::connect(t.address, 10s);
        if (!s) {
            ++t.count.errors[static_cast<std::size_t>(error_kind::connect)];
            state->fail(t.name + ": descriptor exhaustion: connect " + std::to_string(i + 1) + " of " + std::to_string(n) + ": " +
                        s.error().message());
            co_return;
        }
        auto c = std::make_unique<burst_conn>();
        c->stream = std::move(*s);
        // Requests that fill most of a connection's read buffer (16 KiB in
        // both servers): memory at the quiet points after a burst is then
        // what as many connections as the server can hold really take, and
        // the warm-up's burst sets that baseline, not a lucky smaller one.
        if (t.proto == protocol::echo) {
            c->request.resize(uniform(t.rng, 8 * 1024, 16 * 1024));
            fill_random(t.rng, c->request);
            c->response = c->request;
        } else {
            for (int r = 0; r < 2; ++r) {
                c->request += "GET /?burst=" + std::to_string(i) + " HTTP/1.1\r\nHost: soak\r\nX-Soak: " +
                              printable(t.rng, uniform(t.rng, 6000, 7900)) + "\r\n\r\n";
                c->response += http_response(200, "OK", "Hello, World!", {});
            }
            c->requests = 2;
        }
        if (auto w = co_await c->stream.write_all(bytes_of(c->request)); !w) {
            ++t.count.errors[static_cast<std::size_t>(error_kind::io)];
            state->fail(t.name + ": descriptor exhaustion: write: " + w.error().message());
            co_return;
        }
        conns.push_back(std::move(c));
    }
    task_group readers;
    for (auto& c : conns) readers.spawn(await_answer(t, *c));

    // What the server can accept it has accepted and answered within a second.
    (void)co_await sleep_for(1s);
    const auto answered = [&] {
        return static_cast<std::size_t>(std::count_if(conns.begin(), conns.end(), [](const auto& c) { return c->answered; }));
    };
    const std::size_t at_once = answered();
    const int fds_starved = descriptor_count(t.proc.pid);
    // Out of descriptors, with nothing else to do, the server must idle: its
    // accept backs off. A spinning accept would take a whole core.
    const double cpu_before = cpu_seconds(t.proc.pid);
    const auto measured_from = steady::now();
    (void)co_await sleep_for(2s);
    const double cpu = (cpu_seconds(t.proc.pid) - cpu_before) /
                       std::chrono::duration<double>(steady::now() - measured_from).count();

    // Release: the answered ones go (some with a reset), and the others must be answered.
    const auto released = steady::now();
    for (auto& c : conns) {
        if (!c->answered) continue;
        if (chance(t.rng, 0.2))
            abort_connection(c->stream);
        else
            c->stream.close();
    }
    co_await readers.join();
    const double recovery = std::chrono::duration<double>(steady::now() - released).count();
    for (auto& c : conns) c->stream.close();

    ++t.count.bursts;
    t.count.burst_connections += n;
    if (at_once < n) ++t.count.bursts_starved;
    std::printf("[%6.1fs] %s: burst of %zu connections: %zu answered at once, %zu waited (server at %d descriptors of %d, "
                "its CPU %.1f%% meanwhile); %s %.2f s after the release\n",
                state->elapsed(), t.name.c_str(), n, at_once, n - at_once, fds_starved, o.fd_limit, cpu * 100,
                answered() == n ? "all answered" : "NOT all answered", recovery);
    std::fflush(stdout);
    if (cpu > 0.3) state->fail(t.name + ": " + std::to_string(static_cast<int>(cpu * 100)) + "% CPU while out of descriptors");
}

/// At random times (the mean given by --exhaust-every; the first within the
/// warm-up, so memory is measured against a baseline that has seen a burst).
task<void> exhauster(target& t) {
    const options& o = *state->opts;
    const std::stop_token stop = state->stop.get_token();
    const double mean = o.exhaust_every_s;
    double at = std::uniform_real_distribution<double>(0.2, 0.6)(t.rng) * std::max(o.warmup_s, 5);
    // No burst in the last 15 s: the run ends with a clean quiet point.
    while (at < o.duration_s - 15 && !stop.stop_requested()) {
        const auto when = state->start + std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(at));
        if (!co_await sleep_until(when, stop)) break;
        {
            result<mutex::guard> g = co_await t.exclusive.lock(stop);
            if (!g) break;
            if (!co_await drain(t)) {
                state->fail(t.name + ": sessions did not end before a burst");
                break;
            }
            co_await exhaust(t);
            t.open.set();
        }
        at += std::uniform_real_distribution<double>(0.5, 1.5)(t.rng) * mean;
    }
}

// --- reports -------------------------------------------------------------------------------

std::string errors_text(const counters& c) {
    if (c.error_total() == 0) return "0 errors";
    std::string s;
    for (std::size_t i = 0; i < error_names.size(); ++i) {
        if (c.errors[i] == 0) continue;
        s += (s.empty() ? "errors " : ",") + std::string(error_names[i]) + "=" + std::to_string(c.errors[i]);
    }
    return s;
}

/// Samples every 250 ms: the peaks between two quiet points, and whether a
/// server died.
task<void> watch(std::stop_token stop) {
    while (co_await sleep_for(250ms, stop)) {
        for (auto& t : state->targets) {
            if (std::optional<int> status = exited(t->proc.pid)) {
                t->exit_status = status;
                state->fail(t->name + " exited during the run: " + describe_status(*status));
                co_return;
            }
            t->peak_fds = std::max(t->peak_fds, descriptor_count(t->proc.pid));
            t->peak_rss_kib = std::max(t->peak_rss_kib, memory_of(t->proc.pid).rss_kib);
        }
    }
}

/// The RSS allowed at a quiet point after the warm-up.
long rss_limit(const target& t) {
    const options& o = *state->opts;
    return t.warm_rss_kib + std::max<long>(o.rss_tolerance_kib, t.warm_rss_kib * o.rss_tolerance_percent / 100);
}

/// Brings every server to a quiet point, prints one line and checks growth.
task<void> report(bool final) {
    const options& o = *state->opts;
    const bool warmed = state->elapsed() >= o.warmup_s;
    std::string line;
    char text[512];
    for (auto& tp : state->targets) {
        target& t = *tp;
        {
            result<mutex::guard> g = co_await t.exclusive.lock();
            if (!co_await drain(t)) state->fail(t.name + ": sessions did not end for a quiet point");
            co_await sample_quiet(t);
            if (!final) t.open.set();
        }
        std::snprintf(text, sizeof text,
                      " %s: %llu req %.1f MiB verified, %s, rss %ld KiB (peak %ld), fds %d (peak %d)%s", t.name.c_str(),
                      static_cast<unsigned long long>(t.count.requests), static_cast<double>(t.count.bytes) / (1 << 20),
                      errors_text(t.count).c_str(), t.last_rss_kib, t.peak_rss_kib, t.last_fds, t.peak_fds,
                      &tp == &state->targets.back() ? "" : " |");
        line += text;
        t.peak_fds = t.last_fds;
        t.peak_rss_kib = t.last_rss_kib;
        if (!warmed) continue;
        if (!t.warm_fds) {
            // The first quiet point after the warm-up is the baseline.
            t.warm_fds = t.last_fds;
            t.warm_rss_kib = t.last_rss_kib;
            if (t.last_fds > t.idle_fds)
                state->fail(t.name + ": " + std::to_string(t.last_fds) + " descriptors at a quiet point after the warm-up, " +
                            std::to_string(t.idle_fds) + " before any load");
            continue;
        }
        if (t.last_fds > *t.warm_fds)
            state->fail(t.name + ": descriptors grew: " + std::to_string(t.last_fds) + " at a quiet point, " +
                        std::to_string(*t.warm_fds) + " after the warm-up");
        if (t.last_rss_kib > rss_limit(t))
            state->fail(t.name + ": memory grew: RSS " + std::to_string(t.last_rss_kib) + " KiB at a quiet point, " +
                        std::to_string(t.warm_rss_kib) + " KiB after the warm-up (at most " + std::to_string(rss_limit(t)) +
                        " KiB allowed)");
    }
    // Stamped when printed: a quiet point waits for a burst in progress.
    std::printf("[%6.1fs]%s\n", state->elapsed(), line.c_str());
    std::fflush(stdout);
}

task<void> reporter() {
    const options& o = *state->opts;
    const std::stop_token stop = state->stop.get_token();
    const auto end = state->start + std::chrono::seconds(o.duration_s);
    for (int i = 1;; ++i) {
        const auto next = state->start + std::chrono::seconds(static_cast<long>(i) * o.report_s);
        if (next >= end) break;
        if (!co_await sleep_until(next, stop)) break;
        co_await report(false);
    }
    if (!stop.stop_requested()) (void)co_await sleep_until(end, stop);
    state->stop.request_stop();
}

task<void> soak() {
    const options& o = *state->opts;
    std::mt19937_64 seeds(o.seed);
    task_group all;
    for (auto& t : state->targets) {
        for (int i = 0; i < o.connections; ++i) all.spawn(worker(*t, seeds()), t->name + " worker");
        all.spawn(exhauster(*t), t->name + " bursts");
    }
    all.spawn(watch(state->stop.get_token()), "watch");
    co_await reporter();
    // Workers finish the session they are in; the final report waits for them.
    co_await report(true);
    co_await all.join();
}

void print_summary(const target& t) {
    const counters& c = t.count;
    std::printf("%s: %llu requests, %.1f MiB verified; sessions:", t.name.c_str(), static_cast<unsigned long long>(c.requests),
                static_cast<double>(c.bytes) / (1 << 20));
    const bool echo = t.proto == protocol::echo;
    for (std::size_t i = 0; i < kind_names.size(); ++i) {
        const auto k = static_cast<session_kind>(i);
        const bool echo_only = k == session_kind::exchange || k == session_kind::stream || k == session_kind::half_close;
        const bool http_only = k == session_kind::keep_alive || k == session_kind::closing || k == session_kind::http_half;
        if ((echo && http_only) || (!echo && echo_only)) continue;
        std::printf(" %s %llu", kind_names[i], static_cast<unsigned long long>(c.sessions[i]));
    }
    std::printf("; %llu bursts (%llu connections, %llu ran it out of descriptors); %s\n",
                static_cast<unsigned long long>(c.bursts), static_cast<unsigned long long>(c.burst_connections),
                static_cast<unsigned long long>(c.bursts_starved), errors_text(c).c_str());
    std::printf("%s: descriptors %d before any load, %s after the warm-up, %d at the end; RSS %ld KiB after the warm-up, "
                "%ld KiB at the end (limit %ld), peak %ld KiB\n",
                t.name.c_str(), t.idle_fds, t.warm_fds ? std::to_string(*t.warm_fds).c_str() : "-", t.last_fds, t.warm_rss_kib,
                t.last_rss_kib, t.warm_rss_kib >= 0 ? rss_limit(t) : -1L, t.hwm_kib);
}

}  // namespace

int main(int argc, char** argv) {
    const options o = parse(argc, argv);
    // SPINDLE_BACKEND would override the servers' --backend (they inherit it).
    ignore_backend_override("--backend names the servers' backend");
    // The bursts hold hundreds of connections per server on this side.
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
        lim.rlim_cur = lim.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &lim);
    }

    run_state run;
    run.opts = &o;
    state = &run;
    std::printf("spindle-soak --backend %s --duration %d --seed %llu --connections %d --fd-limit %d (warm-up %d s, "
                "report every %d s, bursts every %d s on average)\n",
                o.backend.c_str(), o.duration_s, static_cast<unsigned long long>(o.seed), o.connections, o.fd_limit, o.warmup_s,
                o.report_s, o.exhaust_every_s);

    std::mt19937_64 seeds(o.seed ^ 0x5eed5eed5eed5eedull);
    auto add = [&](const std::string& name, protocol proto, const std::string& path) {
        // A small descriptor limit, so that the bursts run the server out of them.
        std::optional<server_child> p = start_server(path, o.backend, spawn_options{.fd_limit = o.fd_limit});
        if (!p) return false;
        auto t = std::make_unique<target>();
        t->name = name;
        t->proto = proto;
        t->proc = *p;
        t->address = net::address::ipv4_loopback(p->port);
        t->rng.seed(seeds());
        // Let it settle before the idle count: a server creates what it needs before it listens.
        t->idle_fds = descriptor_count(p->pid);
        t->last_fds = t->idle_fds;
        t->last_rss_kib = memory_of(p->pid).rss_kib;
        std::printf("%s (pid %d) on 127.0.0.1:%u: %d descriptors, RSS %ld KiB before any load\n", name.c_str(), p->pid, p->port,
                    t->idle_fds, t->last_rss_kib);
        run.targets.push_back(std::move(t));
        return true;
    };
    bool started = (!o.echo || add("echo", protocol::echo, o.echo_server)) && (!o.http || add("http", protocol::http, o.http_server));
    std::fflush(stdout);

    if (started) {
        loop_options client;
        client.backend = *backend_from_string(o.client_backend);
        loop l(client);
        run.start = steady::now();
        l.block_on(soak());
    } else {
        run.failures.push_back("a server did not start");
    }

    // Every server must stop cleanly on SIGTERM.
    for (auto& t : run.targets) {
        if (t->exit_status) continue;
        const std::optional<int> status = stop_child(t->proc.pid, SIGTERM, 10s);
        if (!status)
            run.failures.push_back(t->name + " did not exit within 10 s of SIGTERM (killed)");
        else if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0)
            run.failures.push_back(t->name + " ended with " + describe_status(*status) + " on SIGTERM");
    }

    std::printf("\n");
    for (auto& t : run.targets) print_summary(*t);
    if (run.failures.empty()) {
        std::printf("PASSED: every byte verified, no growth after the warm-up, servers exited with status 0 (seed %llu)\n",
                    static_cast<unsigned long long>(o.seed));
        return 0;
    }
    std::printf("FAILED (seed %llu):\n", static_cast<unsigned long long>(o.seed));
    for (const std::string& f : run.failures) std::printf("  %s\n", f.c_str());
    return 1;
}
