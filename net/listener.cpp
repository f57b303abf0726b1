#include <spindle/log.hpp>
#include <spindle/metrics.hpp>
#include <spindle/net/listener.hpp>
#include <spindle/sleep.hpp>
#include <spindle/timeout.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace spindle::net::detail {

namespace {
std::error_code last_error() noexcept { return {errno, std::system_category()}; }

bool out_of_resources(int error) noexcept {
    return error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM;
}
// Failures of the one connection at the head of the queue; the next may succeed.
bool connection_gone(int error) noexcept { return error == ECONNABORTED || error == EPROTO || error == EINTR; }
}  // namespace

result<unique_fd> listen_on(const address& at, const listen_options& options) {
    result<unique_fd> fd = open_socket(at.domain(), SOCK_STREAM);
    if (!fd) return fd;
    const int on = 1;
    const bool ip = at.family() == address_family::ipv4 || at.family() == address_family::ipv6;
    if (ip && options.reuse_address && ::setsockopt(fd->get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0)
        return last_error();
    if (ip && options.reuse_port && ::setsockopt(fd->get(), SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) != 0)
        return last_error();
    if (ip && options.no_delay && ::setsockopt(fd->get(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof on) != 0)
        return last_error();
    if (::bind(fd->get(), at.native(), at.size()) != 0) return last_error();
    if (::listen(fd->get(), options.backlog) != 0) return last_error();
    return fd;
}

result<void> probe_port(const address& at) noexcept {
    const bool ip = at.family() == address_family::ipv4 || at.family() == address_family::ipv6;
    if (!ip || at.port() == 0) return {};
    result<unique_fd> fd = open_socket(at.domain(), SOCK_STREAM);
    if (!fd) return fd.error();
    // SO_REUSEADDR as the real sockets have it: connections of an earlier
    // server lingering in TIME_WAIT do not count as a holder, a listener does.
    const int on = 1;
    if (::setsockopt(fd->get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0) return last_error();
    if (::bind(fd->get(), at.native(), at.size()) != 0) return last_error();
    return {};
}

task<result<accepted>> accept_from(const unique_fd& listener, std::stop_token token) {
    using namespace std::chrono_literals;
    const int listen_fd = listener.get();
    constexpr auto first_backoff = 1ms;
    constexpr auto max_backoff = 100ms;
    auto backoff = std::chrono::milliseconds(first_backoff);
    bool starved = false;
    for (;;) {
        accepted a;
        ::socklen_t len = address::capacity();
        result<int> fd = co_await spindle::accept(listen_fd, a.peer.native(), &len, token);
        if (fd) {
            if (starved) logger()->info("accept on fd {} recovered", listen_fd);
            a.peer.set_size(len);
            a.fd = unique_fd(*fd);
            co_return a;
        }
        const int error = fd.error().value();
        if (connection_gone(error)) continue;
        if (!out_of_resources(error)) co_return fd.error();
        // A completion backend may report the failure after the listener was
        // closed (and its number reused): never wait on that number.
        if (listener.get() != listen_fd) co_return cancelled_error();
        // Out of descriptors: the listening socket stays readable, so trying
        // again at once would spin. Wait, then try again; the backlog holds
        // the waiting connections meanwhile.
        if (!starved) logger()->warn("accept on fd {}: {}; retrying with back-off", listen_fd, fd.error().message());
        starved = true;
        spindle::count_accept_backoff();
        // The back-off is a wait for writability on the listening socket, which
        // never becomes writable: closing the listener cancels it at once, as it
        // cancels a pending accept. After a plain sleep we would call accept on
        // a number that may have been closed and handed to another socket since.
        result<int> woke = co_await with_timeout(backoff, spindle::wait_writable(listen_fd, token));
        if (woke) {
            // Not expected of a listening socket; keep the pace all the same.
            if (result<void> slept = co_await sleep_for(backoff, token); !slept) co_return slept.error();
        } else if (woke.error() != std::errc::timed_out) {
            co_return woke.error();
        }
        // The back-off may have ended just before the listener was closed, with
        // this task not yet resumed: the close found nothing to cancel, and the
        // number may belong to another socket by now.
        if (listener.get() != listen_fd) co_return cancelled_error();
        backoff = std::min<std::chrono::milliseconds>(backoff * 2, max_backoff);
    }
}

}  // namespace spindle::net::detail
