#pragma once
// Helpers shared by the network tests: text and byte views, position-dependent
// byte patterns, a skip that works on Catch2 v2 and v3, the descriptor limit,
// raw sockets kept away from the loop (clients, and a listener for tests of
// the descriptor calls), and a listener whose accept queue is full (for
// connect timeouts).

#include "support.hpp"

#include <spindle/net/address.hpp>
#include <spindle/net/error.hpp>
#include <spindle/net/tcp.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

// Catch2 v3.3 has SKIP; v2 has not: there the case passes with a warning.
#ifdef SKIP
#define NET_SKIP(msg) SKIP(msg)
#else
#define NET_SKIP(msg)                 \
    do {                              \
        WARN("skipped: " << msg);     \
        return;                       \
    } while (false)
#endif

namespace spindle::test {

/// Byte `offset` of the stream `seed`: a function of the position, so a lost,
/// doubled or reordered chunk shows at the first byte it moved.
inline std::byte pattern_byte(std::uint64_t seed, std::uint64_t offset) noexcept {
    std::uint64_t x = (offset + 1) * 0x9E3779B97F4A7C15ull + seed * 0xC2B2AE3D27D4EB4Full;
    x ^= x >> 31;
    return static_cast<std::byte>(x >> 24);
}

inline void fill_pattern(std::span<std::byte> out, std::uint64_t seed, std::uint64_t offset) noexcept {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = pattern_byte(seed, offset + i);
}

/// Where `got` first differs from the pattern at `offset`; npos if nowhere.
inline std::size_t pattern_mismatch(std::span<const std::byte> got, std::uint64_t seed, std::uint64_t offset) noexcept {
    for (std::size_t i = 0; i < got.size(); ++i)
        if (got[i] != pattern_byte(seed, offset + i)) return i;
    return std::string::npos;
}

/// Raises the soft descriptor limit to the hard one if it is below `want`;
/// returns the soft limit in force afterwards.
inline rlim_t raise_fd_limit(rlim_t want) {
    ::rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
    if (lim.rlim_cur < want && lim.rlim_cur < lim.rlim_max) {
        lim.rlim_cur = lim.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &lim);
        ::getrlimit(RLIMIT_NOFILE, &lim);
    }
    return lim.rlim_cur;
}

/// SIGPIPE at its default action (end the process) and unblocked while alive:
/// a write that raised it would kill the test program. Restores the previous
/// disposition and mask.
class sigpipe_kills {
public:
    sigpipe_kills() {
        struct sigaction act {};
        act.sa_handler = SIG_DFL;
        sigemptyset(&act.sa_mask);
        REQUIRE(::sigaction(SIGPIPE, &act, &m_old) == 0);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, SIGPIPE);
        REQUIRE(::pthread_sigmask(SIG_UNBLOCK, &one, &m_old_mask) == 0);
    }
    ~sigpipe_kills() {
        ::sigaction(SIGPIPE, &m_old, nullptr);
        ::pthread_sigmask(SIG_SETMASK, &m_old_mask, nullptr);
    }
    sigpipe_kills(const sigpipe_kills&) = delete;
    sigpipe_kills& operator=(const sigpipe_kills&) = delete;

private:
    struct sigaction m_old {};
    sigset_t m_old_mask{};
};

/// A plain non-blocking TCP socket the loop never sees: closed plainly.
class raw_socket {
public:
    raw_socket() = default;
    explicit raw_socket(int fd) noexcept : m_fd(fd) {}
    raw_socket(raw_socket&& other) noexcept : m_fd(other.release()) {}
    raw_socket& operator=(raw_socket&& other) noexcept {
        if (this != &other) {
            reset();
            m_fd = other.release();
        }
        return *this;
    }
    ~raw_socket() { reset(); }
    int get() const noexcept { return m_fd; }
    int release() noexcept {
        int fd = m_fd;
        m_fd = -1;
        return fd;
    }
    void reset() noexcept {
        if (m_fd >= 0) ::close(m_fd);
        m_fd = -1;
    }

private:
    int m_fd = -1;
};

/// A non-blocking TCP listener on 127.0.0.1 with an ephemeral port, for the
/// descriptor calls (spindle::accept); `addr` receives its address.
inline int tcp_listener(::sockaddr_in& addr) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    REQUIRE(::bind(fd, reinterpret_cast<const ::sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd, SOMAXCONN) == 0);
    ::socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd, reinterpret_cast<::sockaddr*>(&addr), &len) == 0);
    REQUIRE(addr.sin_port != 0);
    return fd;
}

enum class connect_outcome { connected, pending, failed };

/// Starts a non-blocking connect of `s` (a new socket) to `to` and waits up
/// to `wait_ms` for it to complete.
inline connect_outcome raw_connect(const net::address& to, int wait_ms, raw_socket& s) {
    s = raw_socket(::socket(to.domain(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (s.get() < 0) return connect_outcome::failed;
    if (::connect(s.get(), to.native(), to.size()) == 0) return connect_outcome::connected;
    if (errno != EINPROGRESS) return connect_outcome::failed;
    ::pollfd p{s.get(), POLLOUT, 0};
    if (::poll(&p, 1, wait_ms) != 1) return connect_outcome::pending;
    int err = -1;
    ::socklen_t len = sizeof err;
    if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) return connect_outcome::failed;
    return connect_outcome::connected;
}

/// A listener on 127.0.0.1 whose accept queue is full: a connect to it stays
/// pending (the kernel drops its SYN). `ready` is false when the kernel kept
/// completing connections within the bounded number of attempts.
struct full_listener {
    net::tcp_listener listener;
    net::address addr;
    std::vector<raw_socket> clients;
    bool ready = false;

    full_listener() {
        net::listen_options options;
        options.backlog = 0;
        auto l = net::tcp_listener::bind(net::address::ipv4_loopback(0), options);
        REQUIRE(l.has_value());
        listener = std::move(*l);
        auto local = listener.local_address();
        REQUIRE(local.has_value());
        addr = *local;
        // A backlog of 0 admits one connection, sometimes a few; the first one
        // that does not complete shows that the queue is full.
        for (int attempt = 0; attempt < 64; ++attempt) {
            raw_socket s;
            const connect_outcome outcome = raw_connect(addr, 200, s);
            REQUIRE(outcome != connect_outcome::failed);
            clients.push_back(std::move(s));
            if (outcome == connect_outcome::pending) {
                ready = true;
                break;
            }
        }
    }
};

}  // namespace spindle::test

/// Failed checks print addresses as text.
template <>
struct Catch::StringMaker<spindle::net::address> {
    static std::string convert(const spindle::net::address& a) { return a.to_string(); }
};
