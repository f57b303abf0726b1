#include <spindle/net/udp.hpp>

#include <cerrno>
#include <sys/socket.h>

namespace spindle::net {

namespace {
std::error_code last_error() noexcept { return {errno, std::system_category()}; }
}  // namespace

result<udp_socket> udp_socket::bind(const address& at, const udp_options& options) {
    if (at.family() == address_family::none) return make_error_code(errc::invalid_address);
    result<unique_fd> fd = detail::open_socket(at.domain(), SOCK_DGRAM);
    if (!fd) return fd.error();
    udp_socket s(std::move(*fd));
    if (options.reuse_address)
        if (auto r = s.set_option(SOL_SOCKET, SO_REUSEADDR, 1); !r) return r.error();
    if (options.reuse_port)
        if (auto r = s.set_option(SOL_SOCKET, SO_REUSEPORT, 1); !r) return r.error();
    if (options.broadcast)
        if (auto r = s.set_option(SOL_SOCKET, SO_BROADCAST, 1); !r) return r.error();
    if (::bind(s.native_handle(), at.native(), at.size()) != 0) return last_error();
    return s;
}

result<udp_socket> udp_socket::open(address_family family) {
    int domain = family == address_family::ipv6 ? AF_INET6 : family == address_family::unix_path ? AF_UNIX : AF_INET;
    result<unique_fd> fd = detail::open_socket(domain, SOCK_DGRAM);
    if (!fd) return fd.error();
    return udp_socket(std::move(*fd));
}

result<void> udp_socket::connect(const address& peer) noexcept {
    // A datagram connect only records the peer; it never blocks.
    if (::connect(m_fd.get(), peer.native(), peer.size()) != 0) return last_error();
    return {};
}

}  // namespace spindle::net
