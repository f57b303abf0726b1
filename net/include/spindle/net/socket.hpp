#pragma once
/// What every spindle socket has: an owned non-blocking descriptor, its
/// addresses, options, and close().

#include <spindle/io.hpp>
#include <spindle/net/address.hpp>
#include <spindle/result.hpp>

#include <utility>

namespace spindle::net {

class socket_base {
public:
    socket_base() noexcept = default;
    explicit socket_base(unique_fd fd) noexcept : m_fd(std::move(fd)) {}
    socket_base(socket_base&&) noexcept = default;
    socket_base& operator=(socket_base&&) noexcept = default;

    bool is_open() const noexcept { return static_cast<bool>(m_fd); }
    int native_handle() const noexcept { return m_fd.get(); }
    /// Closes the socket; operations still pending on it complete with
    /// operation_canceled. Safe to call twice.
    void close() noexcept { m_fd.reset(); }

    result<address> local_address() const;
    /// setsockopt(2) for what the typed setters do not cover.
    result<void> set_option(int level, int name, int value) noexcept;
    result<int> get_option(int level, int name) const noexcept;

protected:
    /// The descriptor, after tying it to the loop of the calling task if it was
    /// made outside any loop.
    int fd_for_io() noexcept {
        m_fd.adopt_current_loop();
        return m_fd.get();
    }
    unique_fd m_fd;
};

namespace detail {
/// socket(2), non-blocking and close-on-exec, and where the platform has
/// SO_NOSIGPIPE (macOS, the BSDs) with it set.
result<unique_fd> open_socket(int domain, int type, int protocol = 0);
/// socketpair(2), both ends set up as open_socket sets up its socket.
result<std::pair<unique_fd, unique_fd>> open_socket_pair(int domain, int type, int protocol = 0);
}  // namespace detail

}  // namespace spindle::net
