#include <spindle/channel.hpp>
#include <spindle/errc.hpp>
#include <spindle/log.hpp>
#include <spindle/loop.hpp>
#include <spindle/loop_group.hpp>
#include <spindle/net/error.hpp>
#include <spindle/net/shared_listener.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <limits>
#include <utility>
#include <vector>

namespace spindle::net {

namespace {

// An accepted descriptor on its way to the loop that will own it, counted
// among that loop's live connections from the moment it was chosen. If it
// never gets there (the call cancelled before it was sent, the loop's inbox
// closed, the group gone) it is closed and uncounted here. It was never used
// with the accepting loop's backend, so a plain close is right.
class handoff {
public:
    handoff(int fd, const address& peer, std::atomic<std::int64_t>* live) noexcept : m_fd(fd), m_peer(peer), m_live(live) {}
    handoff(handoff&& other) noexcept
        : m_fd(std::exchange(other.m_fd, -1)), m_peer(other.m_peer), m_live(std::exchange(other.m_live, nullptr)) {}
    handoff& operator=(handoff&& other) noexcept {
        if (this != &other) {
            reset();
            m_fd = std::exchange(other.m_fd, -1);
            m_peer = other.m_peer;
            m_live = std::exchange(other.m_live, nullptr);
        }
        return *this;
    }
    handoff(const handoff&) = delete;
    handoff& operator=(const handoff&) = delete;
    ~handoff() { reset(); }

    /// The descriptor and its count, for the stream that takes both over.
    int release() noexcept {
        m_live = nullptr;
        return std::exchange(m_fd, -1);
    }
    const address& peer() const noexcept { return m_peer; }

private:
    void reset() noexcept {
        if (m_fd >= 0) ::close(std::exchange(m_fd, -1));
        if (m_live) std::exchange(m_live, nullptr)->fetch_sub(1, std::memory_order_relaxed);
    }
    int m_fd;
    address m_peer;
    std::atomic<std::int64_t>* m_live;
};

}  // namespace

struct shared_listener::state {
    struct per_loop {
        // Read by the accepting loop, written by this one: a line of its own.
        alignas(64) std::atomic<std::int64_t> live{0};
        std::atomic<bool> accepting{false};
        unique_fd socket;  // reuseport: this loop's listening socket
        // least_loaded: what the accepting loop handed over. Made, used and
        // emptied on this loop's thread (destroyed after the loops are gone).
        std::optional<channel<handoff>> inbox;
    };

    distribution mode;
    address at;
    std::vector<std::unique_ptr<per_loop>> loops;
    unique_fd socket;  // least_loaded: the one listening socket
    std::atomic<bool> pump_claimed{false};
    std::atomic<std::size_t> pump_index{~std::size_t{0}};  // the accepting loop
    std::atomic<bool> closed{false};
};

std::string_view to_string(distribution d) noexcept { return d == distribution::reuseport ? "reuseport" : "least-loaded"; }

std::optional<distribution> distribution_from_string(std::string_view name) noexcept {
    if (name == "reuseport") return distribution::reuseport;
    if (name == "least-loaded" || name == "least_loaded") return distribution::least_loaded;
    return std::nullopt;
}

result<shared_listener> shared_listener::bind(const loop_group& group, const address& at, distribution d,
                                              listen_options options) {
    auto s = std::make_shared<state>();
    s->mode = d;
    for (std::size_t i = 0; i < group.size(); ++i) s->loops.push_back(std::make_unique<state::per_loop>());
    if (d == distribution::least_loaded) {
        result<unique_fd> fd = detail::listen_on(at, options);
        if (!fd) return fd.error();
        s->socket = std::move(*fd);
    } else {
        // SO_REUSEPORT lets any socket of the same user join the port, a
        // second server as much as this group's other loops. A socket bound
        // without it first finds out whether anyone holds the port now: the
        // group's sockets are then the only ones to share it (a server that
        // binds in the instant between the probe and our first bind still
        // gets in; the kernel offers no way to close that window).
        if (result<void> free = detail::probe_port(at); !free) return free.error();
        options.reuse_port = true;
        address where = at;
        for (auto& l : s->loops) {
            result<unique_fd> fd = detail::listen_on(where, options);
            if (!fd) return fd.error();
            l->socket = std::move(*fd);
            // The first socket picked the port (for port 0): the others share it.
            if (where.port() == 0) {
                ::socklen_t len = address::capacity();
                if (::getsockname(l->socket.get(), where.native(), &len) != 0)
                    return std::error_code(errno, std::system_category());
                where.set_size(len);
            }
        }
    }
    // The address as bound, for port 0.
    const int fd = d == distribution::least_loaded ? s->socket.get() : s->loops.front()->socket.get();
    address bound;
    ::socklen_t len = address::capacity();
    if (::getsockname(fd, bound.native(), &len) != 0) return std::error_code(errno, std::system_category());
    bound.set_size(len);
    s->at = bound;
    return shared_listener(std::move(s));
}

namespace {

// The loop with the fewest live connections among those accepting; ties go
// to the one after the last choice, so equal loads take turns.
std::size_t least_loaded(shared_listener::state& s, std::size_t& turn) {
    const std::size_t n = s.loops.size();
    std::size_t best = n;
    std::int64_t fewest = std::numeric_limits<std::int64_t>::max();
    for (std::size_t k = 0; k < n; ++k) {
        const std::size_t i = (turn + k) % n;
        const auto& l = *s.loops[i];
        if (!l.accepting.load(std::memory_order_acquire)) continue;
        const std::int64_t live = l.live.load(std::memory_order_relaxed);
        if (live < fewest) {
            fewest = live;
            best = i;
        }
    }
    if (best == n) best = loop_group::current_index();
    turn = best + 1;
    return best;
}

}  // namespace

// The accepting loop of least_loaded: accepts and hands each connection over.
static task<void> pump(std::shared_ptr<shared_listener::state> s, std::stop_token stop) {
    const std::size_t me = loop_group::current_index();
    std::size_t turn = 0;
    for (;;) {
        result<detail::accepted> a = co_await detail::accept_from(s->socket, stop);
        if (!a) {
            if (stop.stop_requested() || s->closed.load() || a.error() == std::errc::operation_canceled ||
                a.error() == std::errc::bad_file_descriptor)
                break;
            logger()->warn("shared_listener: accept: {}", a.error().message());
            continue;
        }
        const std::size_t target = least_loaded(*s, turn);
        // Counted at once, so the next choice already sees it; the handoff
        // uncounts it if it never arrives.
        s->loops[target]->live.fetch_add(1, std::memory_order_relaxed);
        handoff h(a->fd.release(), a->peer, &s->loops[target]->live);
        if (target == me) {
            (void)s->loops[me]->inbox->try_send(std::move(h));
            continue;
        }
        // The capture is named apart from `h`: g++ 12 inside a coroutine
        // leaves `h = std::move(h)` unmoved.
        auto hand_over = [s, target, connection = std::move(h)]() mutable {
            auto& inbox = s->loops[target]->inbox;
            // The target's inbox exists: it called accept() before it was chosen.
            if (inbox) (void)inbox->try_send(std::move(connection));
        };
        result<void> sent = co_await submit_to(target, std::move(hand_over));
        // Cancelled (the group stops): the handoff, wherever it was, closes
        // and uncounts the connection if it was not delivered.
        if (!sent && stop.stop_requested()) break;
    }
}

task<result<tcp_stream>> shared_listener::accept(std::stop_token token) {
    const std::size_t me = loop_group::current_index();
    state& s = *m_state;
    auto& mine = *s.loops.at(me);
    if (s.mode == distribution::reuseport) {
        mine.accepting.store(true, std::memory_order_release);
        result<detail::accepted> a = co_await detail::accept_from(mine.socket, std::move(token));
        if (!a) co_return a.error();
        tcp_stream stream(std::move(a->fd), a->peer);
        mine.live.fetch_add(1, std::memory_order_relaxed);
        stream.m_live = detail::live_connection(&mine.live);
        co_return stream;
    }
    if (!mine.inbox) mine.inbox.emplace(unbounded_channel);
    mine.accepting.store(true, std::memory_order_release);
    if (!s.pump_claimed.exchange(true)) {
        s.pump_index.store(me, std::memory_order_release);
        loop::current().spawn(pump(m_state, token), "shared_listener accept").detach();
    }
    result<handoff> h = co_await mine.inbox->receive(std::move(token));
    if (!h) co_return h.error() == spindle::errc::channel_closed ? cancelled_error() : h.error();
    // Counted when the accepting loop chose this one: the stream takes it over.
    const address peer = h->peer();
    tcp_stream stream(unique_fd(h->release()), peer);
    stream.m_live = detail::live_connection(&mine.live);
    co_return stream;
}

const address& shared_listener::local_address() const noexcept { return m_state->at; }
distribution shared_listener::mode() const noexcept { return m_state->mode; }

std::size_t shared_listener::live(std::size_t index) const noexcept {
    if (index >= m_state->loops.size()) return 0;
    return static_cast<std::size_t>(std::max<std::int64_t>(0, m_state->loops[index]->live.load(std::memory_order_relaxed)));
}

double shared_listener::imbalance() const noexcept {
    std::size_t total = 0, most = 0;
    for (std::size_t i = 0; i < m_state->loops.size(); ++i) {
        total += live(i);
        most = std::max(most, live(i));
    }
    if (total == 0) return 0;
    return static_cast<double>(most) * static_cast<double>(m_state->loops.size()) / static_cast<double>(total);
}

void shared_listener::close() noexcept {
    state& s = *m_state;
    if (!loop_group::current_or_null()) return;
    const std::size_t me = loop_group::current_index();
    // A socket is closed through this loop, so an accept waiting on it here
    // completes (cancelled) on every backend: it was bound outside any loop.
    auto close_here = [](unique_fd& fd) {
        if (fd) unique_fd(fd.release(), &loop::current()).reset();
    };
    auto& mine = *s.loops.at(me);
    mine.accepting.store(false, std::memory_order_release);  // least_loaded chooses it no more
    close_here(mine.socket);
    if (mine.inbox) mine.inbox->close();
    // The one socket of least_loaded is closed by the accepting loop only:
    // its accept waits on it.
    if (s.pump_index.load(std::memory_order_acquire) == me) {
        s.closed.store(true);
        close_here(s.socket);
    }
}

}  // namespace spindle::net
