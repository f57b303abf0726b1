#include <spindle/net/socket.hpp>

#include <cerrno>
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

result<unique_fd> open_socket(int domain, int type, int protocol) {
    int fd = ::socket(domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol);
    if (fd < 0) return last_error();
    return unique_fd(fd);
}

}  // namespace detail

}  // namespace spindle::net
