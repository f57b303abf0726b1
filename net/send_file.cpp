// sendfile(2) on the offload pool: the kernel copies from the page cache to
// the socket, and a page-cache miss holds a pool thread, never the loop. The
// socket is non-blocking, so a call takes what its buffer has room for;
// EAGAIN sends the task to wait for writability on its loop.

#include <spindle/io.hpp>
#include <spindle/net/send_file.hpp>
#include <spindle/offload.hpp>

#include <cerrno>
#include <sys/types.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/sendfile.h>
#else
#include <sys/socket.h>
#include <sys/uio.h>
#endif

namespace spindle::net::detail {

namespace {

/// One sendfile(2): the bytes it moved, or -errno. At most `max` bytes.
long long send_once(int socket, int file, std::uint64_t offset, std::uint64_t max) noexcept {
    for (;;) {
#if defined(__linux__)
        auto at = static_cast<::off_t>(offset);
        const ssize_t n = ::sendfile(socket, file, &at, static_cast<std::size_t>(max));
        if (n >= 0) return n;
#elif defined(__APPLE__)
        ::off_t len = static_cast<::off_t>(max);
        const int r = ::sendfile(file, socket, static_cast<::off_t>(offset), &len, nullptr, 0);
        if (r == 0 || (len > 0 && (errno == EAGAIN || errno == EINTR))) return len;
#else
        ::off_t moved = 0;
        const int r =
            ::sendfile(file, socket, static_cast<::off_t>(offset), static_cast<std::size_t>(max), nullptr, &moved, 0);
        if (r == 0 || (moved > 0 && (errno == EAGAIN || errno == EINTR))) return moved;
#endif
        if (errno != EINTR) return -static_cast<long long>(errno);
    }
}

}  // namespace

task<result<std::uint64_t>> send_file_to_socket(int socket, int file, std::uint64_t offset, std::uint64_t count,
                                                std::stop_token token) {
    // One call moves at most this much, so a cancel is seen between calls.
    constexpr std::uint64_t max_call = std::uint64_t(1) << 24;
    std::uint64_t sent = 0;
    while (sent < count) {
        const std::uint64_t at = offset + sent;
        const std::uint64_t want = std::min(count - sent, max_call);
        auto call = [socket, file, at, want] { return send_once(socket, file, at, want); };
        result<long long> n = co_await spindle::offload(call, token);
        if (!n) co_return n.error();
        if (*n == -EAGAIN || *n == -EWOULDBLOCK) {
            result<int> ready = co_await spindle::wait_writable(socket, token);
            if (!ready) co_return ready.error();
            continue;
        }
        if (*n < 0) co_return std::error_code(static_cast<int>(-*n), std::system_category());
        if (*n == 0) break;  // the file ended first
        sent += static_cast<std::uint64_t>(*n);
    }
    co_return sent;
}

}  // namespace spindle::net::detail
