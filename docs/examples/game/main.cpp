// spindle-game: a UDP game server whose main owns a fixed 60 Hz frame loop and
// drives the spindle loop from it, the way a game engine embeds an event loop,
// instead of handing the thread to loop::run().
//
// Protocol (UDP). Messages are whole datagrams, told apart by their size:
//   client -> server  any datagram joins, or keeps a joined client alive;
//                     "bye" (a trailing "\n" or "\r\n" allowed) leaves.
//                     A client silent for 5 s is dropped.
//   server -> client  one snapshot per frame, 16 bytes, big-endian:
//                       offset  0  u64  frame number (the first frame is 1)
//                       offset  8  u32  number of clients joined
//                       offset 12  u32  the recipient's own id (from 1, never reused)
//                     or, to a datagram that would join while --max-clients
//                     clients are joined already, the refusal: 4 bytes, the
//                     ASCII text "full". The sender has not joined; it may try
//                     again later. A refusal is never longer than what it
//                     answers (a datagram shorter than 4 bytes gets none), an
//                     address gets at most one a second, and the server sends
//                     at most refusals_per_second in all: a spoofed flood of
//                     joins cannot make it a reflector.
//
// stdout carries these lines, each flushed:
//   spindle-game listening on ADDRESS:PORT
//   spindle-game interval: frames=N mean_us=X p50_us=X p99_us=X max_us=X late=N
//     cpu_p50_us=X cpu_p99_us=X preempted=N
//     send_p50_us=X send_p99_us=X send_max_us=X unsent=N clients=N refused=N
//   spindle-game stats: (the same fields)
// each on one line: "interval" every --stats-every seconds if given, for the
// frames since the last such line; "stats" on SIGINT or SIGTERM, for the
// whole run, just before main returns 0. The times are microseconds with one
// decimal: mean_us to max_us of a frame's tick (wall time), cpu_* of the CPU
// time the thread spent in it, preempted= the ticks in which another process
// took the CPU, send_* of the time until a frame's last snapshot was sent; see
// run_frames() for what a tick and a send are, when a frame is late and when
// its snapshots are unsent. clients= is the number joined when the line
// is printed, refused= the datagrams turned away because the server was full
// (answered or not). Diagnostics go to stderr (SPDLOG_LEVEL=debug shows joins
// and leaves).

#include "service.hpp"

#include <spindle/net/udp.hpp>
#include <spindle/spindle.hpp>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

namespace {

using namespace spindle;
using namespace std::chrono_literals;
using spindle::examples::service_options;

constexpr std::uint64_t frame_rate = 60;
constexpr std::chrono::nanoseconds frame_period = std::chrono::nanoseconds(std::chrono::seconds(1)) / frame_rate;
/// A frame that starts this much after its due time counts as late: well above
/// the wake-up latency of an idle Linux machine (tens of microseconds plus the
/// 50 us timer slack), well below the 16.7 ms period.
constexpr std::chrono::nanoseconds late_threshold = 1ms;
constexpr clock::duration silence_limit = 5s;
constexpr std::size_t snapshot_size = 16;
/// What a client that cannot join is told. No longer than the shortest
/// datagram it is sent in reply to.
constexpr std::string_view refusal = "full";
/// The refusals the server sends in all, per second, however many addresses
/// ask: 400 bytes a second at most, whatever a flood of spoofed joins does.
constexpr std::uint32_t refusals_per_second = 100;

/// The program's own flags.
struct game_options {
    /// The joined clients at most; the joins beyond are refused. Each costs a
    /// snapshot per frame. 1024, a little above the 1,000 clients the frame
    /// loop is measured with (spindle-game-bench, docs/benchmarks.md): there,
    /// a 2-core virtual machine over loopback, a frame's tick took 65 us
    /// (p99 150 us) and its sends 2.5 ms of the 16.7 ms period, which leaves
    /// room for a busy machine and for a game with more to simulate.
    std::size_t max_clients = 1024;
    /// Print an "interval" statistics line this often (0: never).
    std::chrono::seconds stats_every{0};
};
/// Past this, even at 1 us a datagram (a network card; over loopback it is
/// about 2 us), sending a frame's snapshots would fill the 16.7 ms period.
constexpr std::size_t max_clients_limit = 16384;

// ---------------------------------------------------------------------------
// The simulated world: a frame counter and one moving point per client.

/// FNV-1a over the bytes net::address's operator== compares.
std::uint64_t hash_of(const net::address& a) noexcept {
    std::uint64_t h = 14695981039346656037ull;
    const auto* p = reinterpret_cast<const unsigned char*>(a.native());
    for (::socklen_t i = 0; i < a.size(); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

struct address_hash {
    std::size_t operator()(const net::address& a) const noexcept { return static_cast<std::size_t>(hash_of(a)); }
};

struct client {
    net::address from;
    std::uint32_t id = 0;
    clock::time_point last_heard;
    std::int32_t x = 0, y = 0;
    std::int32_t dx = 0, dy = 0;
};

class world {
public:
    static constexpr std::int32_t arena = 1000;  // positions stay in [0, arena]

    explicit world(std::size_t max_clients) : m_max_clients(max_clients) {}

    std::uint64_t frame() const noexcept { return m_frame; }
    const std::vector<client>& clients() const noexcept { return m_clients; }
    /// Datagrams turned away because the world was full.
    std::uint64_t refused() const noexcept { return m_refused; }

    enum class heard { known, joined, refused };

    /// A datagram other than "bye" arrived from `from`.
    heard heard_from(const net::address& from, clock::time_point now) {
        if (client* c = find(from)) {
            c->last_heard = now;
            return heard::known;
        }
        if (m_clients.size() >= m_max_clients) {
            ++m_refused;
            // Said once each time the world fills up, not per datagram.
            if (!m_full_reported) spdlog::warn("full ({} clients): refusing joins", m_max_clients);
            m_full_reported = true;
            spdlog::debug("full: refusing {}", from.to_string());
            return heard::refused;
        }
        client c;
        c.from = from;
        c.id = m_next_id++;
        c.last_heard = now;
        // Spread the start points and speeds by id so the points do not move as one.
        c.x = static_cast<std::int32_t>(c.id * 97 % arena);
        c.y = static_cast<std::int32_t>(c.id * 31 % arena);
        c.dx = static_cast<std::int32_t>(1 + c.id % 5);
        c.dy = static_cast<std::int32_t>(1 + c.id * 7 % 5);
        spdlog::debug("client {} joined from {}", c.id, from.to_string());
        m_index.emplace(from, m_clients.size());
        m_clients.push_back(c);
        return heard::joined;
    }

    void leave(const net::address& from) {
        auto at = m_index.find(from);
        if (at == m_index.end()) return;
        spdlog::debug("client {} left", m_clients[at->second].id);
        remove(at->second);
    }

    /// One frame of simulation.
    void advance(clock::time_point now) {
        ++m_frame;
        for (std::size_t i = 0; i < m_clients.size();) {
            if (now - m_clients[i].last_heard <= silence_limit) {
                ++i;
                continue;
            }
            spdlog::debug("client {} dropped after {} s of silence", m_clients[i].id,
                          std::chrono::duration_cast<std::chrono::seconds>(silence_limit).count());
            remove(i);  // the last client moves to i
        }
        for (client& c : m_clients) {
            bounce(c.x, c.dx);
            bounce(c.y, c.dy);
        }
    }

private:
    static void bounce(std::int32_t& p, std::int32_t& d) noexcept {
        p += d;
        if (p < 0 || p > arena) {
            d = -d;
            p = std::clamp(p, 0, arena);
        }
    }

    client* find(const net::address& from) noexcept {
        // Hashed: every datagram of every client looks its sender up, and a
        // linear search would cost a frame's worth of time per second at a
        // thousand clients sending at the frame rate.
        auto at = m_index.find(from);
        return at == m_index.end() ? nullptr : &m_clients[at->second];
    }

    /// Removes the client at `i` in constant time: the last one takes its place.
    void remove(std::size_t i) {
        m_index.erase(m_clients[i].from);
        if (i + 1 != m_clients.size()) {
            m_clients[i] = m_clients.back();
            m_index[m_clients[i].from] = i;
        }
        m_clients.pop_back();
        if (m_clients.size() < m_max_clients) m_full_reported = false;
    }

    std::size_t m_max_clients;
    std::uint64_t m_frame = 0;
    std::uint32_t m_next_id = 1;
    std::vector<client> m_clients;  // in no particular order
    std::unordered_map<net::address, std::size_t, address_hash> m_index;  // where each is in m_clients
    std::uint64_t m_refused = 0;
    bool m_full_reported = false;
};

/// Bounds the refusals sent: one per address per second, refusals_per_second
/// in all. An address is remembered by a hash in a small direct-mapped table,
/// so the memory is fixed; two addresses sharing a slot at worst delay each
/// other's refusal, and a flood of addresses only evicts entries, which the
/// limit in all still bounds.
class refusal_limiter {
public:
    bool allow(const net::address& from, clock::time_point now) noexcept {
        if (now - m_window_start >= 1s) {
            m_window_start = now;
            m_sent_in_window = 0;
        }
        const std::uint64_t h = hash_of(from);
        entry& e = m_recent[h % m_recent.size()];
        if (e.hash == h && e.used && now - e.at < 1s) return false;
        if (m_sent_in_window >= refusals_per_second) return false;
        ++m_sent_in_window;
        e = {h, now, true};
        return true;
    }

private:
    struct entry {
        std::uint64_t hash = 0;
        clock::time_point at;
        bool used = false;
    };
    std::array<entry, 256> m_recent{};
    clock::time_point m_window_start;
    std::uint32_t m_sent_in_window = 0;
};

bool is_bye(std::string_view text) noexcept {
    if (text.ends_with('\n')) text.remove_suffix(1);
    if (text.ends_with('\r')) text.remove_suffix(1);
    return text == "bye";
}

// ---------------------------------------------------------------------------
// Tasks on the loop: receiving joins and leaves, sending one frame's snapshots.

task<void> receive(net::udp_socket& socket, world& w, std::stop_token stop) {
    std::array<std::byte, 512> buffer;
    net::address from;
    refusal_limiter limiter;
    for (;;) {
        result<std::size_t> n = co_await socket.recv_from(buffer, from, stop);
        if (!n) {
            if (n.error() == std::errc::operation_canceled) co_return;
            // A datagram too large for the buffer still came from a client.
            if (n.error() != net::errc::datagram_truncated) {
                spdlog::debug("receive: {}", n.error().message());
                continue;
            }
        }
        const std::size_t size = n ? *n : buffer.size() + 1;  // truncated: longer than the buffer
        const std::string_view text(reinterpret_cast<const char*>(buffer.data()), std::min(size, buffer.size()));
        if (is_bye(text)) {
            w.leave(from);
            continue;
        }
        const clock::time_point now = clock::now();
        if (w.heard_from(from, now) != world::heard::refused) continue;
        // Never more bytes out than in, and rate-limited: see the protocol.
        if (size < refusal.size() || !limiter.allow(from, now)) continue;
        if (result<std::size_t> sent = co_await socket.send_to(std::as_bytes(std::span(refusal)), from, stop); !sent) {
            if (sent.error() == std::errc::operation_canceled) co_return;
            spdlog::debug("refusal to {}: {}", from.to_string(), sent.error().message());
        }
    }
}

void put_big_endian(std::span<std::byte> out, std::uint64_t value) noexcept {
    for (std::size_t i = out.size(); i-- > 0; value >>= 8) out[i] = static_cast<std::byte>(value & 0xff);
}

std::array<std::byte, snapshot_size> encode_snapshot(std::uint64_t frame, std::uint32_t clients, std::uint32_t id) noexcept {
    std::array<std::byte, snapshot_size> out;
    put_big_endian(std::span(out).subspan(0, 8), frame);
    put_big_endian(std::span(out).subspan(8, 4), clients);
    put_big_endian(std::span(out).subspan(12, 4), id);
    return out;
}

/// One frame's snapshots and their sending, with sendmmsg(2) on the socket's
/// descriptor: one system call per slice of datagrams instead of one per
/// datagram (the runtime has no batched send; its send_to is a sendmsg each).
/// The buffers are kept from frame to frame, so once the number of clients
/// stops growing a frame allocates nothing.
class outbox {
public:
    enum class progress { done, more, blocked };

    /// One snapshot for each client of `w`, for the frame that began at
    /// `frame_start`. The addresses are copied: the world may change (a
    /// client joins, leaves) while the snapshots are still being sent.
    void fill(const world& w, clock::time_point frame_start) {
        const std::size_t n = w.clients().size();
        const auto count = static_cast<std::uint32_t>(n);
        m_datagrams.resize(n);
        m_to.resize(n);
        m_iov.resize(n);
        m_headers.resize(n);
        for (std::size_t i = 0; i < n; ++i) {
            const client& c = w.clients()[i];
            m_datagrams[i] = encode_snapshot(w.frame(), count, c.id);
            // UDP peers are IPv4 or IPv6: a sockaddr_in6 holds either.
            const ::socklen_t size = std::min<::socklen_t>(c.from.size(), sizeof(::sockaddr_in6));
            std::memcpy(&m_to[i], c.from.native(), size);
            m_iov[i] = {m_datagrams[i].data(), m_datagrams[i].size()};
            m_headers[i] = {};
            m_headers[i].msg_hdr.msg_name = &m_to[i];
            m_headers[i].msg_hdr.msg_namelen = size;
            m_headers[i].msg_hdr.msg_iov = &m_iov[i];
            m_headers[i].msg_hdr.msg_iovlen = 1;
        }
        m_next = 0;
        m_started = frame_start;
        m_finished.reset();
    }

    /// Hands the kernel at most `limit` more snapshots, without waiting:
    /// done once every snapshot is sent (or dropped), blocked when the
    /// socket's buffer is full.
    progress send_some(int fd, std::size_t limit) {
        const std::size_t end = std::min(m_headers.size(), m_next + limit);
        while (m_next < end) {
            const int n = ::sendmmsg(fd, m_headers.data() + m_next, static_cast<unsigned>(end - m_next),
                                     MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n > 0) {
                m_next += static_cast<std::size_t>(n);
                continue;
            }
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return progress::blocked;
            // This one datagram cannot go (no kernel buffer, an address the
            // route refuses): a lost datagram, as UDP may lose any. After a
            // partial batch the kernel reports the error on the next call, so
            // it is always the first of a call that is dropped.
            spdlog::debug("snapshot {} of the frame: {}", m_next,
                          std::generic_category().message(n < 0 ? errno : EIO));
            ++m_next;
        }
        if (m_next < m_headers.size()) return progress::more;
        if (!m_finished) m_finished = clock::now();
        return progress::done;
    }

    /// From the frame's start until its last snapshot went to the kernel,
    /// once it did.
    std::optional<clock::duration> send_time() const noexcept {
        if (!m_finished) return std::nullopt;
        return *m_finished - m_started;
    }

private:
    std::vector<std::array<std::byte, snapshot_size>> m_datagrams;
    std::vector<::sockaddr_in6> m_to;
    std::vector<::iovec> m_iov;
    std::vector<::mmsghdr> m_headers;
    std::size_t m_next = 0;  // the first header not yet sent
    clock::time_point m_started;
    std::optional<clock::time_point> m_finished;
};

/// Snapshots per sendmmsg call, between which the task yields to the loop.
/// On loopback the kernel spends about 2 us per datagram on the sending core
/// (the receiving side's processing included: see docs/benchmarks.md), so a
/// slice is some 70 us: the loop's other tasks and its I/O never wait longer.
constexpr std::size_t send_slice = 32;

/// Sends the frame's snapshots a slice at a time, yielding between slices so
/// a join or a "bye" is not kept waiting behind a thousand sends. The frame
/// loop aborts it if it is still sending at the next frame, before `out` is
/// filled again.
task<void> send_snapshots(net::udp_socket& socket, outbox& out) {
    for (;;) {
        switch (out.send_some(socket.native_handle(), send_slice)) {
            case outbox::progress::done: co_return;
            case outbox::progress::more: co_await yield(); break;
            case outbox::progress::blocked:
                if (result<int> ready = co_await wait_writable(socket.native_handle()); !ready) {
                    spdlog::debug("snapshots: {}", ready.error().message());
                    co_return;
                }
                break;
        }
    }
}

// ---------------------------------------------------------------------------
// Statistics.

/// Tick times in nanoseconds, in a log-linear histogram: exact below 64 ns,
/// then 32 buckets per power of two. A percentile is within half a bucket
/// (1.6%) of the true value, in fixed memory (15 KiB) however long the server
/// runs; the count, mean, minimum and maximum are exact.
class tick_histogram {
public:
    void add(std::chrono::nanoseconds t) noexcept {
        const auto v = static_cast<std::uint64_t>(std::max<std::int64_t>(0, t.count()));
        ++m_buckets[index_of(v)];
        ++m_count;
        m_sum += v;
        m_min = std::min(m_min, v);
        m_max = std::max(m_max, v);
    }

    std::uint64_t count() const noexcept { return m_count; }
    double mean_ns() const noexcept { return m_count ? static_cast<double>(m_sum) / static_cast<double>(m_count) : 0.0; }
    double min_ns() const noexcept { return m_count ? static_cast<double>(m_min) : 0.0; }
    double max_ns() const noexcept { return static_cast<double>(m_max); }

    /// The nearest-rank percentile `q` (0 < q <= 1), as the middle of its
    /// bucket kept within the exact minimum and maximum.
    double percentile_ns(double q) const noexcept {
        if (m_count == 0) return 0.0;
        const auto wanted = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(m_count)));
        const std::uint64_t rank = std::clamp<std::uint64_t>(wanted, 1, m_count);
        std::uint64_t seen = 0;
        for (std::size_t i = 0; i < bucket_count; ++i) {
            seen += m_buckets[i];
            if (seen >= rank) return std::clamp(middle_of(i), min_ns(), max_ns());
        }
        return max_ns();
    }

private:
    static constexpr unsigned sub_bits = 5;
    static constexpr std::uint64_t sub_count = std::uint64_t{1} << sub_bits;
    static constexpr std::uint64_t exact_below = 2 * sub_count;
    // Values of 64 bits at most: shifts 1 to 58 above the exact range.
    static constexpr std::size_t bucket_count = exact_below + (64 - sub_bits - 1) * sub_count;

    static std::size_t index_of(std::uint64_t v) noexcept {
        if (v < exact_below) return static_cast<std::size_t>(v);
        const unsigned shift = static_cast<unsigned>(std::bit_width(v)) - 1 - sub_bits;
        return static_cast<std::size_t>(exact_below + (shift - 1) * sub_count + ((v >> shift) - sub_count));
    }
    static double middle_of(std::size_t i) noexcept {
        if (i < exact_below) return static_cast<double>(i);
        const std::uint64_t group = (i - exact_below) / sub_count;
        const unsigned shift = static_cast<unsigned>(group) + 1;
        const std::uint64_t low = ((i - exact_below) % sub_count + sub_count) << shift;
        return static_cast<double>(low) + static_cast<double>((std::uint64_t{1} << shift) - 1) / 2.0;
    }

    std::array<std::uint64_t, bucket_count> m_buckets{};
    std::uint64_t m_count = 0;
    std::uint64_t m_sum = 0;
    std::uint64_t m_min = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t m_max = 0;
};

/// The calling thread's CPU time and involuntary context switches: with the
/// wall time, they tell a tick that worked long from one that waited for the
/// CPU (on a busy machine, another process preempting the frame).
struct thread_time {
    std::chrono::nanoseconds cpu{};
    long involuntary_switches = 0;

    static thread_time now() noexcept {
        thread_time t;
        ::timespec ts{};
        if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0)
            t.cpu = std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
        ::rusage usage{};
        if (::getrusage(RUSAGE_THREAD, &usage) == 0) t.involuntary_switches = usage.ru_nivcsw;
        return t;
    }
};

struct frame_stats {
    tick_histogram ticks;     // wall time
    tick_histogram tick_cpu;  // the thread's CPU time in the tick
    tick_histogram sends;     // frame start to its last snapshot sent
    std::uint64_t late = 0;
    std::uint64_t preempted = 0;  // ticks in which the thread was switched out involuntarily
    std::uint64_t unsent = 0;     // frames whose snapshots were not all sent by the next
    std::uint64_t refused_before = 0;  // world::refused() when these stats began

    /// `label` is "stats" or "interval" (see the top of this file).
    void print(const char* label, const world& w) const {
        std::printf("spindle-game %s: frames=%llu mean_us=%.1f p50_us=%.1f p99_us=%.1f max_us=%.1f late=%llu "
                    "cpu_p50_us=%.1f cpu_p99_us=%.1f preempted=%llu "
                    "send_p50_us=%.1f send_p99_us=%.1f send_max_us=%.1f unsent=%llu clients=%zu refused=%llu\n",
                    label, static_cast<unsigned long long>(ticks.count()), ticks.mean_ns() / 1e3,
                    ticks.percentile_ns(0.50) / 1e3, ticks.percentile_ns(0.99) / 1e3, ticks.max_ns() / 1e3,
                    static_cast<unsigned long long>(late), tick_cpu.percentile_ns(0.50) / 1e3,
                    tick_cpu.percentile_ns(0.99) / 1e3, static_cast<unsigned long long>(preempted),
                    sends.percentile_ns(0.50) / 1e3, sends.percentile_ns(0.99) / 1e3, sends.max_ns() / 1e3,
                    static_cast<unsigned long long>(unsent), w.clients().size(),
                    static_cast<unsigned long long>(w.refused() - refused_before));
        std::fflush(stdout);
    }
};

// ---------------------------------------------------------------------------
// The frame loop.

/// Runs frames until `stop` is requested.
///
/// A frame is input, update, output. Input needs no step of its own: the
/// datagrams are received by the loop while main waits for the frame (below).
/// Update advances the world. Output fills the outbox with the frame's
/// snapshots and spawns the task that sends them. The loop runs it in the
/// ticks of the wait that follows, a slice at a time, seeing to its other
/// tasks and its I/O in between; a send the kernel cannot take now parks the
/// task, never the frame. A send still unfinished at the next frame is
/// dropped, its snapshots being stale by then (counted as unsent).
///
/// Two times are measured. The tick: update and output, the frame's own work
/// on this thread, which decides whether the next frame can start on time and
/// must stay well inside the period. The send: from the frame's start until
/// its last snapshot went to the kernel, which grows with the clients (on
/// loopback about 2 us each, the receivers' processing included, see
/// docs/benchmarks.md) and must stay under the period. The wait is in neither.
///
/// The wait is loop.run_once(time to the next frame) rather than
/// std::this_thread::sleep_until: a join, a "bye" or a signal arriving
/// mid-frame is handled when it arrives, not up to a frame later, and the
/// socket buffer does not fill while main sleeps. run_once returns after each
/// batch of events, so the wait repeats until the deadline.
///
/// Frames are due at fixed times from a start (no drift). A frame that starts
/// more than late_threshold after its due time is late; one that starts a whole
/// period or more late restarts the schedule from itself, so a stall is not
/// followed by a burst of catch-up frames sending stale snapshots.
///
/// With `stats_every` above zero, an "interval" line is printed that often,
/// between frames (its output is not in any tick time).
void run_frames(loop& host, net::udp_socket& socket, world& w, const std::stop_token& stop, frame_stats& stats,
                std::chrono::seconds stats_every) {
    clock::time_point anchor = clock::now();
    std::uint64_t index = 0;  // frames since anchor
    auto due = [&] { return anchor + std::chrono::duration_cast<clock::duration>(frame_period * index); };
    outbox out;
    join_handle<void> sending;  // the current frame's send_snapshots
    frame_stats interval;
    clock::time_point interval_start = anchor;

    while (!stop.stop_requested()) {
        const clock::time_point start = clock::now();
        const thread_time cpu_start = thread_time::now();
        const clock::duration lateness = start - due();
        if (lateness > late_threshold) {
            ++stats.late;
            ++interval.late;
        }
        if (lateness >= frame_period) {
            anchor = start;
            index = 0;
        }

        // The previous frame's snapshots: all sent (their time is counted), or
        // still going and dropped now, before the outbox is filled again.
        if (sending.valid()) {
            if (!sending.done()) {
                spdlog::debug("frame {}: the previous snapshots are still being sent; the rest dropped", w.frame());
                sending.abort();
            }
            if (std::optional<clock::duration> sent = out.send_time()) {
                stats.sends.add(*sent);
                interval.sends.add(*sent);
            } else {
                ++stats.unsent;
                ++interval.unsent;
            }
            sending = {};
        }

        w.advance(start);
        if (!w.clients().empty()) {
            out.fill(w, start);
            sending = host.spawn(send_snapshots(socket, out), "snapshots");
        }
        const thread_time cpu_end = thread_time::now();
        const clock::duration tick = clock::now() - start;
        const std::chrono::nanoseconds tick_cpu = cpu_end.cpu - cpu_start.cpu;
        const bool preempted = cpu_end.involuntary_switches != cpu_start.involuntary_switches;
        for (frame_stats* f : {&stats, &interval}) {
            f->ticks.add(tick);
            f->tick_cpu.add(tick_cpu);
            if (preempted) ++f->preempted;
        }

        if (stats_every > clock::duration::zero() && start - interval_start >= stats_every) {
            interval.print("interval", w);
            interval = frame_stats{};
            interval.refused_before = w.refused();
            interval_start = start;
        }

        ++index;
        const clock::time_point next = due();
        for (clock::time_point now = clock::now(); now < next && !stop.stop_requested(); now = clock::now()) {
            // run_once does not wait when the loop has nothing that could wake
            // it (not so while the receiver runs): then sleep, never spin.
            if (!host.run_once(next - now)) std::this_thread::sleep_until(next);
        }
    }
    if (sending.valid() && !sending.done()) sending.abort();
}

int serve(const service_options& options, const game_options& game) {
    std::optional<loop> opened;
    if (!spindle::examples::open_loop(opened, loop_options{.backend = options.backend})) return 1;
    loop& host = *opened;
    // Caught from now on: a signal that arrives before the first wait is kept
    // for it rather than killing the process.
    host.catch_signal(SIGINT);
    host.catch_signal(SIGTERM);

    result<net::address> at = net::address::from_ip(options.host, options.port);
    if (!at) {
        std::fprintf(stderr, "spindle-game: bad host '%s': %s\n", options.host.c_str(), at.error().message().c_str());
        return 2;
    }
    result<net::udp_socket> socket = net::udp_socket::bind(*at);
    if (!socket) {
        std::fprintf(stderr, "spindle-game: cannot bind %s: %s\n", at->to_string().c_str(), socket.error().message().c_str());
        return 1;
    }
    result<net::address> bound = socket->local_address();
    if (!bound) {
        std::fprintf(stderr, "spindle-game: getsockname: %s\n", bound.error().message().c_str());
        return 1;
    }

    std::stop_source stop;
    world w(game.max_clients);
    join_handle<void> signals = host.spawn(examples::stop_on_signals(stop), "signals");
    join_handle<void> receiver = host.spawn(receive(*socket, w, stop.get_token()), "receive");
    std::printf("spindle-game listening on %s\n", bound->to_string().c_str());
    std::fflush(stdout);

    frame_stats stats;
    run_frames(host, *socket, w, stop.get_token(), stats, game.stats_every);

    // The receiver and the signal waits were given the stop token: they end
    // within a tick or two. Both reference locals of this function.
    while (!(receiver.done() && signals.done()) && host.run_once(100ms)) {
    }
    stats.print("stats", w);
    return 0;
}

/// A whole decimal number in [lo, hi], or why not.
std::string parse_number(std::string_view text, std::size_t lo, std::size_t hi, std::size_t& out) {
    std::size_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec == std::errc() && end == text.data() + text.size() && v >= lo && v <= hi) {
        out = v;
        return {};
    }
    return "not a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
}

}  // namespace

int main(int argc, char** argv) {
    game_options game;
    const std::string max_clients_help = "at most N clients joined, 1 to " + std::to_string(max_clients_limit) +
                                         " (default " + std::to_string(game.max_clients) + "); others are told \"full\"";
    const std::array flags{
        examples::service_flag{"--max-clients", "N", max_clients_help,
                               [&](std::string_view text) { return parse_number(text, 1, max_clients_limit, game.max_clients); }},
        examples::service_flag{"--stats-every", "SECONDS",
                               "also print tick-time statistics every SECONDS, 1 to 3600 (default: on exit only)",
                               [&](std::string_view text) {
                                   std::size_t seconds = 0;
                                   std::string why = parse_number(text, 1, 3600, seconds);
                                   game.stats_every = std::chrono::seconds(seconds);
                                   return why;
                               }},
    };
    const service_options options = examples::parse_service_options(
        argc, argv,
        {.name = "spindle-game",
         .description = "UDP game server: a 60 Hz frame loop sending each joined client a snapshot per frame.",
         .default_port = 7008,
         .extra_help = "\nClients join by sending any datagram, leave with \"bye\", and are dropped after 5 s of\n"
                       "silence. Each frame a client gets 16 bytes, big-endian: u64 frame, u32 client count,\n"
                       "u32 its own id. A datagram that would join a full server is answered (if it is 4 bytes\n"
                       "or longer; at most once a second per address) with the 4 bytes \"full\". On exit,\n"
                       "tick-time statistics are printed to stdout.\n",
         .flags = flags});

    try {
        return serve(options, game);
    } catch (const std::exception& e) {
        // A backend not built in, or the loop's own resources failing.
        std::fprintf(stderr, "spindle-game: %s\n", e.what());
        return 1;
    }
}
