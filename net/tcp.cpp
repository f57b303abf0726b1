#include <spindle/net/resolve.hpp>
#include <spindle/net/tcp.hpp>
#include <spindle/timeout.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <algorithm>
#include <chrono>

namespace spindle::net {

task<result<tcp_stream>> tcp_stream::connect(address peer, std::stop_token token) {
    result<unique_fd> fd = detail::open_socket(peer.domain(), SOCK_STREAM);
    if (!fd) co_return fd.error();
    // The awaiter checks SO_ERROR once the socket is writable, so a refusal
    // surfaces here as connection_refused and not on a later write.
    result<int> connected = co_await spindle::connect(fd->get(), peer.native(), peer.size(), std::move(token));
    if (!connected) co_return connected.error();
    co_return tcp_stream(std::move(*fd), peer);
}

task<result<tcp_stream>> tcp_stream::connect(address peer, std::chrono::nanoseconds timeout) {
    co_return co_await with_timeout(timeout, connect(peer));
}

task<result<tcp_stream>> tcp_stream::connect(std::string host, std::string service, std::chrono::nanoseconds timeout_each) {
    result<std::vector<address>> addresses = co_await resolve(std::move(host), std::move(service));
    if (!addresses) co_return addresses.error();
    std::error_code last = make_error_code(errc::resolve_failed);
    for (const address& a : *addresses) {
        result<tcp_stream> s = co_await connect(a, timeout_each);
        if (s) co_return s;
        last = s.error();
    }
    co_return last;
}

result<void> tcp_stream::set_nodelay(bool on) noexcept { return set_option(IPPROTO_TCP, TCP_NODELAY, on ? 1 : 0); }

result<void> tcp_stream::set_keepalive(bool on, std::chrono::seconds idle) noexcept {
    if (result<void> r = set_option(SOL_SOCKET, SO_KEEPALIVE, on ? 1 : 0); !r) return r;
    // Linux refuses more than 32767 s (MAX_TCP_KEEPIDLE): saturate there
    // rather than let a large count wrap into a small one.
    constexpr std::chrono::seconds longest_idle(32767);
    if (on && idle.count() > 0) return set_option(IPPROTO_TCP, TCP_KEEPIDLE, static_cast<int>(std::min(idle, longest_idle).count()));
    return {};
}

result<tcp_listener> tcp_listener::bind(const address& at, const listen_options& options) {
    if (at.family() != address_family::ipv4 && at.family() != address_family::ipv6)
        return make_error_code(errc::invalid_address);
    result<unique_fd> fd = detail::listen_on(at, options);
    if (!fd) return fd.error();
    return tcp_listener(std::move(*fd));
}

task<result<tcp_stream>> tcp_listener::accept(std::stop_token token) {
    fd_for_io();
    result<detail::accepted> a = co_await detail::accept_from(m_fd, std::move(token));
    if (!a) co_return a.error();
    co_return tcp_stream(std::move(a->fd), a->peer);
}

}  // namespace spindle::net
