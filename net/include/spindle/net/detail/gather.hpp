#pragma once
// The window of a gather write: the iovecs one vectored send carries, kept in
// the writing frame, and how a partial send advances it.

#include <sys/uio.h>

#include <cstddef>
#include <span>

namespace spindle::net::detail {

/// Buffers one vectored send carries at most. The window lives in the
/// coroutine frame of the write, and 16 iovecs (256 bytes) keep that frame
/// within the frame pool's largest size class, so a gather write allocates
/// nothing; a write of more buffers takes one send per window (a partly sent
/// window is topped up before the next send). Far below every IOV_MAX.
inline constexpr std::size_t gather_window = 16;

/// Drops the first `sent` bytes from `window`: the buffers sent whole, then
/// the front of one sent in part. What is left to send.
inline std::span<::iovec> consume_sent(std::span<::iovec> window, std::size_t sent) noexcept {
    while (!window.empty() && sent >= window.front().iov_len) {
        sent -= window.front().iov_len;
        window = window.subspan(1);
    }
    if (!window.empty()) {
        window.front().iov_base = static_cast<std::byte*>(window.front().iov_base) + sent;
        window.front().iov_len -= sent;
    }
    return window;
}

/// After a partial send: moves what is left of the window to its front, so
/// the next buffers can join it; the count left.
inline std::size_t keep_unsent(std::span<::iovec> window, std::size_t sent) noexcept {
    const std::span<::iovec> rest = consume_sent(window, sent);
    // Forward copy into a lower or the same position: safe for overlap.
    for (std::size_t i = 0; i < rest.size(); ++i) window[i] = rest[i];
    return rest.size();
}

}  // namespace spindle::net::detail
