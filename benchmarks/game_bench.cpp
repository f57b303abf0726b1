// spindle-game-bench: the example game server's frame time with many UDP
// clients on loopback. It starts spindle-game with --stats-every, joins the
// clients, lets them send input and read every snapshot, and reports the
// server's own tick-time statistics (p50, p99, max) of whole windows of
// frames in which every client was joined.
//
// The server runs as a child process pinned to one core, the clients in this
// process pinned to another, as in spindle-echo-bench. Everything is bounded:
// at most 10,000 clients, 60 s windows, 20 windows and 20 rounds, and each
// round has a deadline after which the server is killed.

#include "bench_support.hpp"

#include <spindle/net/udp.hpp>
#include <spindle/spindle.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <vector>

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::bench;

namespace {

// Both come from meson: the spindle-game built with this program, and the
// backends this build has (e.g. "epoll,io_uring").
#ifndef SPINDLE_GAME_SERVER
#define SPINDLE_GAME_SERVER "spindle-game"
#endif
#ifndef SPINDLE_BUILT_BACKENDS
#define SPINDLE_BUILT_BACKENDS "epoll"
#endif

struct options {
    std::vector<std::string> backends;
    long clients = 1000;
    long max_clients = 1024;  // the server's own default
    long window_s = 5;
    long windows = 2;
    long rounds = 3;
    long input_hz = 10;
    bool pinned = true;
    bool batch_reads = true;
    std::string server = SPINDLE_GAME_SERVER;
};

[[noreturn]] void usage(std::FILE* out, int status) {
    std::fprintf(out,
                 "usage: spindle-game-bench [--clients N] [--max-clients N] [--window SECONDS] [--windows N]\n"
                 "                          [--rounds N] [--input-hz N] [--read batch|wake] [--backends LIST]\n"
                 "                          [--unpinned] [--server PATH]\n"
                 "Runs spindle-game with N UDP clients on loopback and reports the server's frame statistics\n"
                 "(the tick: update and output; the send: until a frame's last snapshot went to the kernel)\n"
                 "over windows in which all of them were joined.\n\n"
                 "  --clients N        clients, 1..10000 (default 1000); those past --max-clients must be refused\n"
                 "  --max-clients N    the server's --max-clients, 1..16384 (default 1024, the server's own default)\n"
                 "  --window SECONDS   one statistics window, 1..60 (default 5)\n"
                 "  --windows N        windows measured per round, 1..20 (default 2)\n"
                 "  --rounds N         rounds, 1..20 (default 3); each starts the server afresh on every backend\n"
                 "  --input-hz N       datagrams each client sends per second, 0..60 (default 10; 0 sends only\n"
                 "                     a keep-alive every 2 s)\n"
                 "  --read batch|wake  batch (default): the clients' sockets are emptied every 8 ms, unwatched, so\n"
                 "                     that no datagram wakes a client; wake: each client waits on its socket, and\n"
                 "                     on loopback the server's sends pay for those wake-ups\n"
                 "  --backends LIST    the server's backends, comma-separated (default: the backends built, %s)\n"
                 "  --unpinned         let the scheduler place the server and the clients (default: the server\n"
                 "                     on the first core allowed, the clients on the second)\n"
                 "  --server PATH      the spindle-game to run (default: the one built with this program)\n",
                 SPINDLE_BUILT_BACKENDS);
    std::exit(status);
}

// The name in its error messages, and the usage text after them.
const program game_bench{"spindle-game-bench", usage};

options parse(int argc, char** argv) {
    options o;
    o.backends = split(SPINDLE_BUILT_BACKENDS);
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h") usage(stdout, 0);
        if (arg == "--unpinned") {
            o.pinned = false;
            continue;
        }
        if (i + 1 >= argc) usage(stderr, 2);
        const std::string_view value = argv[++i];
        if (arg == "--clients") {
            o.clients = number(game_bench, value, 1, 10000);
        } else if (arg == "--max-clients") {
            o.max_clients = number(game_bench, value, 1, 16384);
        } else if (arg == "--window") {
            o.window_s = number(game_bench, value, 1, 60);
        } else if (arg == "--windows") {
            o.windows = number(game_bench, value, 1, 20);
        } else if (arg == "--rounds") {
            o.rounds = number(game_bench, value, 1, 20);
        } else if (arg == "--input-hz") {
            o.input_hz = number(game_bench, value, 0, 60);
        } else if (arg == "--read") {
            if (value != "batch" && value != "wake") usage(stderr, 2);
            o.batch_reads = value == "batch";
        } else if (arg == "--backends") {
            o.backends = backend_list(game_bench, value);
        } else if (arg == "--server") {
            o.server = value;
        } else {
            usage(stderr, 2);
        }
    }
    if (o.backends.empty()) usage(stderr, 2);
    return o;
}

// --- the server ------------------------------------------------------------------

/// The server process and the lines it prints, read by a task of the loop.
class server_process {
public:
    server_process(const options& o, const std::string& backend, int cpu) {
        // Its output is read by a task of the loop, so the pipe never blocks.
        std::optional<spawned_child> child = spawn_with_output(
            {o.server, "--backend", backend, "--host", "127.0.0.1", "--port", "0", "--stats-every",
             std::to_string(o.window_s), "--max-clients", std::to_string(o.max_clients)},
            spawn_options{.cpu = cpu, .nonblocking_output = true});
        if (!child) return;
        m_pid = child->pid;
        m_out = child->output;
    }
    ~server_process() {
        if (m_pid > 0) reap(m_pid, 0ms);
        if (m_out >= 0) ::close(m_out);
    }
    server_process(const server_process&) = delete;
    server_process& operator=(const server_process&) = delete;

    bool started() const noexcept { return m_pid > 0; }

    /// Collects the server's lines until end of file or `stop`.
    task<void> read_lines(std::stop_token stop) {
        std::string partial;
        char buf[4096];
        for (;;) {
            const ssize_t n = ::read(m_out, buf, sizeof buf);
            if (n == 0) co_return;
            if (n < 0) {
                if (errno != EAGAIN && errno != EINTR) co_return;
                if (!co_await wait_readable(m_out, stop)) co_return;
                continue;
            }
            partial.append(buf, static_cast<std::size_t>(n));
            for (auto at = partial.find('\n'); at != std::string::npos; at = partial.find('\n')) {
                lines.push_back(partial.substr(0, at));
                partial.erase(0, at + 1);
            }
        }
    }

    /// SIGINT, then at most 10 s for the exit. True if it exited with status 0.
    bool stop() {
        if (m_pid <= 0) return false;
        const std::optional<int> status = stop_child(m_pid, SIGINT, 10s);
        m_pid = -1;
        return exited_with_zero(status);
    }

    std::vector<std::string> lines;

private:
    pid_t m_pid = -1;
    int m_out = -1;
};

/// One "interval" or "stats" line of the server.
struct server_stats {
    double frames = 0, p50_us = 0, p99_us = 0, max_us = 0, late = 0;
    double cpu_p50_us = 0, cpu_p99_us = 0, preempted = 0;
    double send_p50_us = 0, send_p99_us = 0, send_max_us = 0, unsent = 0;
    double clients = 0, refused = 0;
};

std::optional<server_stats> parse_stats(std::string_view line, std::string_view label) {
    if (!line.starts_with("spindle-game ") || line.find(label) != 13) return std::nullopt;
    server_stats s;
    auto field = [&](std::string_view name, double& out) {
        const auto at = line.find(" " + std::string(name) + "=");
        if (at == std::string_view::npos) return false;
        out = std::atof(std::string(line.substr(at + name.size() + 2)).c_str());
        return true;
    };
    if (!field("frames", s.frames) || !field("p50_us", s.p50_us) || !field("p99_us", s.p99_us) ||
        !field("max_us", s.max_us) || !field("late", s.late) || !field("clients", s.clients) || !field("refused", s.refused))
        return std::nullopt;
    // Not printed by a server from before the sends left the tick (--server
    // to compare with one): its tick held the sends.
    for (auto [name, out] : {std::pair{"cpu_p50_us", &s.cpu_p50_us}, {"cpu_p99_us", &s.cpu_p99_us},
                             {"preempted", &s.preempted}, {"send_p50_us", &s.send_p50_us},
                             {"send_p99_us", &s.send_p99_us}, {"send_max_us", &s.send_max_us}, {"unsent", &s.unsent}})
        if (!field(name, *out)) *out = -1;
    return s;
}

// --- the clients ---------------------------------------------------------------------

std::uint64_t big_endian(const std::byte* p, int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
    return v;
}

struct client {
    net::udp_socket socket;
    std::uint32_t id = 0;            // from the snapshots; 0 until the first
    std::uint32_t clients_seen = 0;  // the client count of the last snapshot
    std::uint64_t snapshots = 0;
    std::uint64_t first_frame = 0, last_frame = 0;
    bool refused = false;
    std::uint64_t malformed = 0;
};

/// One datagram from the server to `c`.
void take(client& c, const std::byte* data, std::size_t size) {
    if (size == 4 && std::memcmp(data, "full", 4) == 0) {
        c.refused = true;
    } else if (size == 16) {
        const std::uint64_t frame = big_endian(data, 8);
        c.clients_seen = static_cast<std::uint32_t>(big_endian(data + 8, 4));
        const auto id = static_cast<std::uint32_t>(big_endian(data + 12, 4));
        if ((c.id != 0 && id != c.id) || frame <= c.last_frame) ++c.malformed;
        c.id = id;
        if (c.snapshots++ == 0) c.first_frame = frame;
        c.last_frame = frame;
    } else {
        ++c.malformed;
    }
}

/// --read wake: the client waits on its socket and takes each datagram as it comes.
task<void> receive(client& c, std::stop_token stop) {
    std::array<std::byte, 64> buf;
    for (;;) {
        result<std::size_t> n = co_await c.socket.recv(buf, stop);
        if (!n) {
            if (n.error() == std::errc::operation_canceled) co_return;
            ++c.malformed;
            continue;
        }
        take(c, buf.data(), *n);
    }
}

/// --read batch: every client's socket is emptied every 8 ms with recvmmsg,
/// without ever waiting on it. No socket is watched, so a datagram arriving
/// wakes nobody: on loopback the sender's system call does the receiver's
/// kernel work, a wake-up of the receiving thread included, which a server
/// does not pay for clients across a network.
task<void> receive_in_batches(std::vector<client>& clients, std::stop_token stop) {
    constexpr std::size_t batch = 16;
    std::array<std::array<std::byte, 64>, batch> bufs;
    std::array<::iovec, batch> iov;
    std::array<::mmsghdr, batch> msgs;
    while (!stop.stop_requested()) {
        for (client& c : clients) {
            for (;;) {
                for (std::size_t i = 0; i < batch; ++i) {
                    iov[i] = {bufs[i].data(), bufs[i].size()};
                    msgs[i] = {};
                    msgs[i].msg_hdr.msg_iov = &iov[i];
                    msgs[i].msg_hdr.msg_iovlen = 1;
                }
                const int n = ::recvmmsg(c.socket.native_handle(), msgs.data(), batch, MSG_DONTWAIT, nullptr);
                if (n <= 0) break;  // EAGAIN: empty
                for (int i = 0; i < n; ++i) take(c, bufs[static_cast<std::size_t>(i)].data(), msgs[static_cast<std::size_t>(i)].msg_len);
                if (static_cast<std::size_t>(n) < batch) break;
            }
        }
        (void)co_await sleep_for(8ms, stop);
    }
}

/// Every client sends a datagram `hz` times a second (every 2 s if 0, to stay
/// joined), spread over the period rather than all at once.
task<void> send_input(std::vector<client>& clients, long hz, std::stop_token stop) {
    const clock::duration period = hz > 0 ? clock::duration(1s) / hz : clock::duration(2s);
    const std::size_t slices = 10;
    const std::array<std::byte, 5> input{std::byte{'i'}, std::byte{'n'}, std::byte{'p'}, std::byte{'u'}, std::byte{'t'}};
    for (clock::time_point next = clock::now(); !stop.stop_requested();) {
        for (std::size_t s = 0; s < slices && !stop.stop_requested(); ++s) {
            for (std::size_t i = s; i < clients.size(); i += slices) (void)co_await clients[i].socket.send(input, stop);
            next += period / slices;
            (void)co_await sleep_until(next, stop);
        }
    }
}

struct round_result {
    bool ok = false;
    std::vector<server_stats> windows;
    double delivered = 0;  // snapshots received / frames the clients were joined for
    std::uint64_t refused_clients = 0;
};

task<round_result> drive(const options& o, server_process& server, std::uint16_t port, std::size_t expected_joined) {
    round_result r;
    std::stop_source stop;
    std::vector<client> clients(static_cast<std::size_t>(o.clients));
    const net::address to = net::address::ipv4_loopback(port);
    std::vector<join_handle<void>> receivers;
    if (o.batch_reads) receivers.push_back(loop::current().spawn(receive_in_batches(clients, stop.get_token()), "receive"));
    for (client& c : clients) {
        result<net::udp_socket> s = net::udp_socket::bind(net::address::ipv4_loopback(0));
        if (!s || !s->connect(to)) {
            std::printf("  cannot open a client socket: %s\n", s ? "connect failed" : s.error().message().c_str());
            co_return r;
        }
        c.socket = std::move(*s);
        if (!o.batch_reads) receivers.push_back(loop::current().spawn(receive(c, stop.get_token()), "receive"));
    }
    const std::array<std::byte, 4> join{std::byte{'j'}, std::byte{'o'}, std::byte{'i'}, std::byte{'n'}};
    for (client& c : clients) (void)co_await c.socket.send(join, stop.get_token());
    join_handle<void> input = loop::current().spawn(send_input(clients, o.input_hz, stop.get_token()), "input");

    // Joined: every client has its snapshot with the full count, or its refusal.
    auto settled = [&] {
        std::size_t joined = 0, refused = 0;
        for (const client& c : clients) {
            if (c.refused) ++refused;
            else if (c.id != 0 && c.clients_seen == expected_joined) ++joined;
        }
        return joined == expected_joined && joined + refused == clients.size();
    };
    const auto join_deadline = clock::now() + 10s;
    while (!settled() && clock::now() < join_deadline) (void)co_await sleep_for(10ms);
    if (!settled()) std::printf("  the clients did not all join (or get refused) within 10 s\n");

    // The next line spans the joins: the windows are the ones after it.
    const std::size_t first = server.lines.size() + 1;
    const auto windows_deadline = clock::now() + std::chrono::seconds(o.window_s * (o.windows + 2)) + 5s;
    std::vector<std::uint64_t> before(clients.size());
    bool counting = false;
    while (settled() && server.lines.size() < first + static_cast<std::size_t>(o.windows) && clock::now() < windows_deadline) {
        if (!counting && server.lines.size() >= first) {
            for (std::size_t i = 0; i < clients.size(); ++i) before[i] = clients[i].snapshots;
            counting = true;
        }
        (void)co_await sleep_for(10ms);
    }
    bool complete = server.lines.size() >= first + static_cast<std::size_t>(o.windows);
    for (std::size_t i = first; complete && i < first + static_cast<std::size_t>(o.windows); ++i) {
        std::optional<server_stats> s = parse_stats(server.lines[i], "interval:");
        if (!s || s->clients != static_cast<double>(expected_joined)) {
            std::printf("  unexpected line: %s\n", server.lines[i].c_str());
            complete = false;
            break;
        }
        r.windows.push_back(*s);
    }
    if (!complete) {
        std::size_t behind = 0;
        for (const client& c : clients)
            if (!c.refused && c.clients_seen != expected_joined) ++behind;
        std::printf("  the windows were not all measured with every client joined: %zu of %zu lines, "
                    "%zu clients not seeing %zu joined\n",
                    server.lines.size() >= first ? server.lines.size() - first : 0, static_cast<std::size_t>(o.windows),
                    behind, expected_joined);
    }

    // Delivery over the windows: snapshots received against frames sent.
    double frames = 0, received = 0;
    std::uint64_t malformed = 0;
    for (const server_stats& s : r.windows) frames += s.frames * static_cast<double>(expected_joined);
    for (std::size_t i = 0; i < clients.size(); ++i) {
        received += static_cast<double>(clients[i].snapshots - before[i]);
        malformed += clients[i].malformed;
        if (clients[i].refused) ++r.refused_clients;
    }
    r.delivered = frames > 0 ? received / frames : 0;
    if (malformed) std::printf("  %llu malformed or out-of-order datagrams\n", static_cast<unsigned long long>(malformed));

    const std::array<std::byte, 3> bye{std::byte{'b'}, std::byte{'y'}, std::byte{'e'}};
    for (client& c : clients) (void)co_await c.socket.send(bye);
    stop.request_stop();
    co_await std::move(input);
    for (join_handle<void>& h : receivers) co_await std::move(h);
    r.ok = complete && malformed == 0 && r.refused_clients == clients.size() - expected_joined;
    co_return r;
}

task<round_result> run_round(const options& o, const std::string& backend, int cpu) {
    server_process server(o, backend, cpu);
    if (!server.started()) co_return round_result{};
    std::stop_source reading;
    join_handle<void> reader = loop::current().spawn(server.read_lines(reading.get_token()), "server output");

    round_result r;
    const auto start_deadline = clock::now() + 10s;
    while (server.lines.empty() && clock::now() < start_deadline) (void)co_await sleep_for(10ms);
    const std::string said = server.lines.empty() ? "" : server.lines.front();
    if (const std::optional<std::uint16_t> port = announced_port(said); !port) {
        std::printf("  %s --backend %s did not start (said: '%s')\n", o.server.c_str(), backend.c_str(), said.c_str());
    } else {
        const auto max_joined = static_cast<std::size_t>(o.max_clients);
        r = co_await drive(o, server, *port, std::min(static_cast<std::size_t>(o.clients), max_joined));
    }
    const bool clean = server.stop();
    // The reader ends at end of file, once the server's last line is in;
    // stopped after 2 s if something else holds the pipe open.
    const auto read_deadline = clock::now() + 2s;
    while (!reader.done() && clock::now() < read_deadline) (void)co_await sleep_for(10ms);
    reading.request_stop();
    co_await std::move(reader);
    if (!clean) std::printf("  the server did NOT exit with status 0 on SIGINT\n");
    bool final_line = false;
    for (const std::string& line : server.lines) final_line = final_line || parse_stats(line, "stats:").has_value();
    if (!final_line) std::printf("  no final statistics line\n");
    r.ok = r.ok && clean && final_line;
    co_return r;
}

}  // namespace

int main(int argc, char** argv) {
    const options o = parse(argc, argv);
    ignore_backend_override("each run names its backend");
    rlimit files{};
    ::getrlimit(RLIMIT_NOFILE, &files);
    if (files.rlim_cur != RLIM_INFINITY && files.rlim_cur < static_cast<rlim_t>(o.clients) + 64) {
        files.rlim_cur = std::min<rlim_t>(files.rlim_max, static_cast<rlim_t>(o.clients) + 64);
        ::setrlimit(RLIMIT_NOFILE, &files);
        if (files.rlim_cur < static_cast<rlim_t>(o.clients) + 64) {
            std::fprintf(stderr, "spindle-game-bench: %ld clients need more descriptors than the limit allows\n", o.clients);
            return 2;
        }
    }

    // Two cores of those we may use: the server on the first, the clients on the second.
    const std::vector<int> cpus = first_cpus(allowed_cpus(), 2);
    int server_cpu = -1;
    if (!o.pinned) {
        std::printf("server and clients unpinned\n");
    } else if (cpus.size() >= 2) {
        server_cpu = cpus[0];
        pin_to_cpu(cpus[1]);
        std::printf("server pinned to CPU %d, clients to CPU %d\n", cpus[0], cpus[1]);
    } else {
        std::printf("only 1 core available: server and clients run unpinned, sharing it\n");
    }
    std::printf("%ld clients, input %ld Hz each, reads: %s, %ld windows of %ld s per round, %ld rounds, loopback, server %s\n\n",
                o.clients, o.input_hz, o.batch_reads ? "batch" : "wake", o.windows, o.window_s, o.rounds, o.server.c_str());
    std::fflush(stdout);

    std::vector<std::vector<server_stats>> windows(o.backends.size());
    bool all_ok = true;
    for (long round = 1; round <= o.rounds; ++round) {
        for (std::size_t i = 0; i < o.backends.size(); ++i) {
            // The order flips every round, so a slow phase of the machine
            // favours no backend over the rounds.
            const std::size_t b = round % 2 ? i : o.backends.size() - 1 - i;
            // The clients always use epoll, so only the server changes.
            loop l(loop_options{.backend = backend_kind::epoll});
            const round_result r = l.block_on(run_round(o, o.backends[b], server_cpu));
            for (std::size_t w = 0; w < r.windows.size(); ++w) {
                const server_stats& s = r.windows[w];
                std::printf("round %ld %-9s window %zu: frames=%.0f tick p50_us=%.1f p99_us=%.1f max_us=%.1f late=%.0f",
                            round, o.backends[b].c_str(), w + 1, s.frames, s.p50_us, s.p99_us, s.max_us, s.late);
                if (s.send_p50_us >= 0)
                    std::printf("  cpu p50_us=%.1f p99_us=%.1f preempted=%.0f  send p50_us=%.1f p99_us=%.1f max_us=%.1f unsent=%.0f",
                                s.cpu_p50_us, s.cpu_p99_us, s.preempted, s.send_p50_us, s.send_p99_us, s.send_max_us,
                                s.unsent);
                std::printf("  clients=%.0f\n", s.clients);
                windows[b].push_back(s);
            }
            std::printf("round %ld %-9s snapshots delivered %.2f%%, %llu clients refused%s\n", round, o.backends[b].c_str(),
                        r.delivered * 100, static_cast<unsigned long long>(r.refused_clients), r.ok ? "" : "  FAILED");
            std::fflush(stdout);
            all_ok = all_ok && r.ok;
        }
    }

    std::printf("\nmedians over the windows (each %ld s, about %ld frames):\n", o.window_s, o.window_s * 60);
    for (std::size_t b = 0; b < o.backends.size(); ++b) {
        auto med = [&](double server_stats::*field) {
            std::vector<double> v;
            for (const server_stats& s : windows[b]) v.push_back(s.*field);
            return median(v);
        };
        double worst_p99 = 0, unsent = 0;
        for (const server_stats& s : windows[b]) {
            worst_p99 = std::max(worst_p99, s.p99_us);
            unsent += s.unsent;
        }
        std::printf("%-9s %zu windows: tick p50_us=%.1f p99_us=%.1f max_us=%.1f (worst window p99_us=%.1f)",
                    o.backends[b].c_str(), windows[b].size(), med(&server_stats::p50_us), med(&server_stats::p99_us),
                    med(&server_stats::max_us), worst_p99);
        if (med(&server_stats::send_p50_us) >= 0)
            std::printf("  cpu p50_us=%.1f p99_us=%.1f  send p50_us=%.1f p99_us=%.1f max_us=%.1f, %.0f frames unsent",
                        med(&server_stats::cpu_p50_us), med(&server_stats::cpu_p99_us), med(&server_stats::send_p50_us),
                        med(&server_stats::send_p99_us), med(&server_stats::send_max_us), unsent);
        std::printf("\n");
    }
    std::printf("\n%s\n", all_ok ? "every round: all clients joined or refused as expected, snapshots well-formed, "
                                   "server exited with status 0"
                                 : "FAILED: see the rounds marked FAILED");
    return all_ok ? 0 : 1;
}
