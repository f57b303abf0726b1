#pragma once
/// UDP sockets. Datagrams larger than the buffer given are reported as
/// errc::datagram_truncated, never silently cut.

#include <spindle/net/detail/msg_awaiter.hpp>
#include <spindle/net/socket.hpp>

#include <span>
#include <stop_token>

namespace spindle::net {

struct udp_options {
    bool reuse_address = false;  ///< SO_REUSEADDR
    bool reuse_port = false;     ///< SO_REUSEPORT
    bool broadcast = false;      ///< SO_BROADCAST
};

class udp_socket : public socket_base {
public:
    udp_socket() noexcept = default;

    /// A socket bound to `at` (port 0 picks one).
    static result<udp_socket> bind(const address& at, const udp_options& options = {});
    /// An unbound socket of `family`; the kernel binds it on its first send.
    static result<udp_socket> open(address_family family);

    /// Sets the default peer: send()/recv() then need no address, and
    /// datagrams from anyone else are dropped by the kernel.
    result<void> connect(const address& peer) noexcept;

    [[nodiscard]] detail::send_msg_awaiter send_to(std::span<const std::byte> datagram, const address& to,
                                                   std::stop_token token = {}) {
        return detail::send_msg_awaiter(std::move(token), fd_for_io(), datagram, &to);
    }
    /// Receives one datagram into `buf` and its sender into `from`.
    [[nodiscard]] detail::recv_msg_awaiter recv_from(std::span<std::byte> buf, address& from, std::stop_token token = {}) {
        return detail::recv_msg_awaiter(std::move(token), fd_for_io(), buf, &from);
    }
    /// On a connected socket.
    [[nodiscard]] detail::send_msg_awaiter send(std::span<const std::byte> datagram, std::stop_token token = {}) {
        return detail::send_msg_awaiter(std::move(token), fd_for_io(), datagram, nullptr);
    }
    [[nodiscard]] detail::recv_msg_awaiter recv(std::span<std::byte> buf, std::stop_token token = {}) {
        return detail::recv_msg_awaiter(std::move(token), fd_for_io(), buf, nullptr);
    }

private:
    explicit udp_socket(unique_fd fd) noexcept : socket_base(std::move(fd)) {}
};

}  // namespace spindle::net
