#include <spindle/net/socket.hpp>

#include <cerrno>
#include <fcntl.h>
#include <sys/socket.h>

namespace spindle::net {

namespace {
std::error_code last_error() noexcept { return {errno, std::system_category()}; }
}  // namespace

result<address> socket_base::local_address() const {
    address a;
    ::socklen_t len = address::capacity();
    if (::getsockname(m_fd.get(), a.native(), &len) != 0) return last_error();
    a.set_size(len);
    return a;
}

result<void> socket_base::set_option(int level, int name, int value) noexcept {
    if (::setsockopt(m_fd.get(), level, name, &value, sizeof value) != 0) return last_error();
    return {};
}

result<int> socket_base::get_option(int level, int name) const noexcept {
    int value = 0;
    ::socklen_t len = sizeof value;
    if (::getsockopt(m_fd.get(), level, name, &value, &len) != 0) return last_error();
    return value;
}

namespace detail {

namespace {

// Where socket(2) takes them, the flags are set atomically with the creation:
// a fork and exec on another thread cannot inherit the descriptor in between.
#if defined(SOCK_NONBLOCK) && defined(SOCK_CLOEXEC)
constexpr int creation_flags = SOCK_NONBLOCK | SOCK_CLOEXEC;
constexpr bool flags_at_creation = true;
#else
constexpr int creation_flags = 0;
constexpr bool flags_at_creation = false;
#endif

/// Makes a new socket what every spindle socket is: non-blocking,
/// close-on-exec (unless set at creation) and, where the option exists, never
/// raising SIGPIPE (MSG_NOSIGNAL does that per send elsewhere).
std::error_code set_up(int fd) noexcept {
    if constexpr (!flags_at_creation) {
        // Without the creation flags (macOS) there is a window before
        // FD_CLOEXEC is set; the platform offers nothing better.
        const int fl = ::fcntl(fd, F_GETFL);
        if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || ::fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return last_error();
    }
#ifdef SO_NOSIGPIPE
    const int on = 1;
    if (::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &on, sizeof on) != 0) return last_error();
#endif
    return {};
}

}  // namespace

result<unique_fd> open_socket(int domain, int type, int protocol) {
    const int raw = ::socket(domain, type | creation_flags, protocol);
    if (raw < 0) return last_error();
    unique_fd fd(raw);  // closed if the set-up fails
    if (std::error_code e = set_up(raw)) return e;
    return fd;
}

result<std::pair<unique_fd, unique_fd>> open_socket_pair(int domain, int type, int protocol) {
    int raw[2];
    if (::socketpair(domain, type | creation_flags, protocol, raw) != 0) return last_error();
    std::pair<unique_fd, unique_fd> fds{unique_fd(raw[0]), unique_fd(raw[1])};
    if (std::error_code e = set_up(raw[0])) return e;
    if (std::error_code e = set_up(raw[1])) return e;
    return fds;
}

}  // namespace detail

}  // namespace spindle::net
