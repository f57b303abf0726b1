#pragma once
/// net::send_file: part of a file onto a byte stream, without a file syscall
/// on the loop's thread.
///
///     result<std::uint64_t> sent = co_await net::send_file(conn, f, 0, size, token);
///
/// Answers the bytes sent: `count`, or fewer when the file ends first.
/// - **A socket** (tcp_stream, unix_stream): sendfile(2), the kernel copying
///   from the page cache to the socket, run on the offload pool (kind
///   blocking) so that a page-cache miss never holds the loop, as nginx's
///   "aio threads" do. A full socket is waited for on the loop, as a write
///   waits. A closed peer is broken_pipe: the pool's threads block SIGPIPE.
/// - **Any other byte stream** (tls::stream, memory_stream): read_at into a
///   bounded buffer (64 KiB), then write_all, in turn.
/// When cancelled, part of the range may have been sent.

#include <spindle/file.hpp>
#include <spindle/net/byte_stream.hpp>
#include <spindle/net/stream.hpp>
#include <spindle/result.hpp>
#include <spindle/task.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stop_token>
#include <type_traits>

namespace spindle::net {

namespace detail {
/// sendfile(2) from `file` to the socket `socket`, on the pool.
task<result<std::uint64_t>> send_file_to_socket(int socket, int file, std::uint64_t offset, std::uint64_t count,
                                                std::stop_token token);
inline constexpr std::size_t send_file_buffer = 64 * 1024;
}  // namespace detail

template <byte_stream S>
[[nodiscard]] task<result<std::uint64_t>> send_file(S& stream, spindle::file& f, std::uint64_t offset,
                                                    std::uint64_t count, std::stop_token token = {}) {
    if constexpr (std::is_base_of_v<stream_socket, S>) {
        co_return co_await detail::send_file_to_socket(stream.native_handle(), f.fd(), offset, count, std::move(token));
    } else {
        const std::size_t size = static_cast<std::size_t>(std::min<std::uint64_t>(count, detail::send_file_buffer));
        auto buffer = std::make_unique<std::byte[]>(std::max<std::size_t>(size, 1));
        std::uint64_t sent = 0;
        while (sent < count) {
            const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(count - sent, size));
            result<std::size_t> n = co_await f.read_at(std::span<std::byte>(buffer.get(), want), offset + sent, token);
            if (!n) co_return n.error();
            if (*n == 0) break;  // the file ended first
            result<void> w = co_await stream.write_all(std::span<const std::byte>(buffer.get(), *n), token);
            if (!w) co_return w.error();
            sent += *n;
        }
        co_return sent;
    }
}

}  // namespace spindle::net
