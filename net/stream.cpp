#include <spindle/net/error.hpp>
#include <spindle/net/stream.hpp>

#include <algorithm>
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
    // A window of the caller's buffers is copied so a partial send can advance
    // it without touching the caller's array; 64 stays under every IOV_MAX.
    std::array<::iovec, 64> window;
    while (!bufs.empty()) {
        std::size_t count = std::min(bufs.size(), window.size());
        std::copy_n(bufs.begin(), count, window.begin());
        bufs = bufs.subspan(count);
        std::size_t first = 0;
        while (first < count) {
            result<std::size_t> n = co_await write_some(std::span<const ::iovec>(window.data() + first, count - first), token);
            if (!n) co_return n.error();
            std::size_t sent = *n;
            while (first < count && sent >= window[first].iov_len) {
                sent -= window[first].iov_len;
                ++first;
            }
            if (first < count) {
                window[first].iov_base = static_cast<std::byte*>(window[first].iov_base) + sent;
                window[first].iov_len -= sent;
            }
        }
    }
    co_return result<void>{};
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
