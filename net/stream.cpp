#include <spindle/net/detail/gather.hpp>
#include <spindle/net/error.hpp>
#include <spindle/net/stream.hpp>

#include <array>
#include <cerrno>
#include <sys/socket.h>

namespace spindle::net {

task<result<void>> stream_socket::read_exact(std::span<std::byte> buf, std::stop_token token) {
    while (!buf.empty()) {
        result<std::size_t> n = co_await read_some(buf, token);
        if (!n) co_return n.error();
        if (*n == 0) co_return make_error_code(errc::end_of_stream);
        buf = buf.subspan(*n);
    }
    co_return result<void>{};
}

task<result<void>> stream_socket::write_all(std::span<const std::byte> buf, std::stop_token token) {
    while (!buf.empty()) {
        result<std::size_t> n = co_await write_some(buf, token);
        if (!n) co_return n.error();
        buf = buf.subspan(*n);
    }
    co_return result<void>{};
}

task<result<void>> stream_socket::write_all(std::span<const ::iovec> bufs, std::stop_token token) {
    // The caller's buffers are copied into a window in this frame, so that a
    // partial send can advance the copy without touching the caller's array;
    // empty ones are skipped. Each send carries the whole window, topped up
    // from the caller's buffers after a partial send.
    std::array<::iovec, detail::gather_window> window;
    std::size_t count = 0;
    for (;;) {
        for (; !bufs.empty() && count < window.size(); bufs = bufs.subspan(1))
            if (bufs.front().iov_len != 0) window[count++] = bufs.front();
        if (count == 0) co_return result<void>{};
        result<std::size_t> n = co_await write_some(std::span<const ::iovec>(window.data(), count), token);
        if (!n) co_return n.error();
        count = detail::keep_unsent(std::span(window.data(), count), *n);
    }
}

result<void> stream_socket::shutdown_write() noexcept {
    if (::shutdown(m_fd.get(), SHUT_WR) != 0) return std::error_code(errno, std::system_category());
    return {};
}

result<address> stream_socket::peer_address() const {
    address a;
    ::socklen_t len = address::capacity();
    if (::getpeername(m_fd.get(), a.native(), &len) != 0) return std::error_code(errno, std::system_category());
    a.set_size(len);
    return a;
}

}  // namespace spindle::net
