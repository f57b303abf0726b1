#pragma once
/// TCP: tcp_stream (connect, read, write) and tcp_listener (bind, accept).

#include <spindle/net/listener.hpp>
#include <spindle/net/stream.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

namespace spindle::net {

class shared_listener;

namespace detail {
/// Counts a connection among its loop's live connections (shared_listener)
/// until it is closed or destroyed.
class live_connection {
public:
    live_connection() noexcept = default;
    explicit live_connection(std::atomic<std::int64_t>* counter) noexcept : m_counter(counter) {}
    live_connection(live_connection&& other) noexcept : m_counter(std::exchange(other.m_counter, nullptr)) {}
    live_connection& operator=(live_connection&& other) noexcept {
        if (this != &other) {
            release();
            m_counter = std::exchange(other.m_counter, nullptr);
        }
        return *this;
    }
    ~live_connection() { release(); }
    void release() noexcept {
        if (std::atomic<std::int64_t>* c = std::exchange(m_counter, nullptr)) c->fetch_sub(1, std::memory_order_relaxed);
    }

private:
    std::atomic<std::int64_t>* m_counter = nullptr;
};
}  // namespace detail

class tcp_stream : public stream_socket {
public:
    tcp_stream() noexcept = default;
    tcp_stream(unique_fd fd, const address& peer) noexcept : stream_socket(std::move(fd)), m_peer(peer) {}

    /// Connects to `peer`. A refused connection is connection_refused (the
    /// socket's SO_ERROR after the non-blocking connect), never a later EPIPE.
    static task<result<tcp_stream>> connect(address peer, std::stop_token token = {});
    /// As above, failing with timed_out when `timeout` passes first.
    static task<result<tcp_stream>> connect(address peer, std::chrono::nanoseconds timeout);
    /// Resolves `host` (off the loop thread) and tries each address in turn
    /// until one connects; each attempt gets `timeout_each`.
    static task<result<tcp_stream>> connect(std::string host, std::string service,
                                            std::chrono::nanoseconds timeout_each = std::chrono::seconds(10));

    /// The address this stream is connected to.
    const address& peer() const noexcept { return m_peer; }

    /// Closes the stream (see socket_base::close); a connection a
    /// shared_listener gave stops counting as live.
    void close() noexcept {
        stream_socket::close();
        m_live.release();
    }

    /// TCP_NODELAY: send small writes at once instead of coalescing them.
    result<void> set_nodelay(bool on) noexcept;
    /// SO_KEEPALIVE, and with a non-zero `idle`, TCP_KEEPIDLE in seconds
    /// (at most the kernel's 32767: more saturates there).
    result<void> set_keepalive(bool on, std::chrono::seconds idle = std::chrono::seconds(0)) noexcept;

private:
    friend class shared_listener;
    address m_peer;
    detail::live_connection m_live;
};

class tcp_listener : public socket_base {
public:
    tcp_listener() noexcept = default;

    /// Binds and listens. Port 0 picks a free port (see local_address()).
    static result<tcp_listener> bind(const address& at, const listen_options& options = {});

    /// The next connection (see listener.hpp for how errors are handled).
    task<result<tcp_stream>> accept(std::stop_token token = {});

private:
    explicit tcp_listener(unique_fd fd) noexcept : socket_base(std::move(fd)) {}
};

}  // namespace spindle::net
