#include <spindle/net/unix.hpp>

#include <sys/socket.h>
#include <unistd.h>

namespace spindle::net {

task<result<unix_stream>> unix_stream::connect(address path, std::stop_token token) {
    if (path.family() != address_family::unix_path) co_return make_error_code(errc::invalid_address);
    result<unique_fd> fd = detail::open_socket(AF_UNIX, SOCK_STREAM);
    if (!fd) co_return fd.error();
    result<int> connected = co_await spindle::connect(fd->get(), path.native(), path.size(), std::move(token));
    if (!connected) co_return connected.error();
    co_return unix_stream(std::move(*fd));
}

result<std::pair<unix_stream, unix_stream>> unix_stream::pair() {
    result<std::pair<unique_fd, unique_fd>> fds = detail::open_socket_pair(AF_UNIX, SOCK_STREAM);
    if (!fds) return fds.error();
    return std::pair{unix_stream(std::move(fds->first)), unix_stream(std::move(fds->second))};
}

unix_listener& unix_listener::operator=(unix_listener&& other) noexcept {
    if (this != &other) {
        this->~unix_listener();
        new (this) unix_listener(std::move(other));
    }
    return *this;
}

unix_listener::~unix_listener() {
    // The path is emptied when moved from, so only the last owner unlinks.
    if (!m_path.empty()) ::unlink(m_path.c_str());
}

result<unix_listener> unix_listener::bind(const address& path, const listen_options& options) {
    if (path.family() != address_family::unix_path || path.unix_path().empty())
        return make_error_code(errc::invalid_address);
    result<unique_fd> fd = detail::listen_on(path, options);
    if (!fd) return fd.error();
    unix_listener l;
    l.m_fd = std::move(*fd);
    if (path.unix_path().front() != '\0') l.m_path = std::string(path.unix_path());
    return l;
}

task<result<unix_stream>> unix_listener::accept(std::stop_token token) {
    fd_for_io();
    result<detail::accepted> a = co_await detail::accept_from(m_fd, std::move(token));
    if (!a) co_return a.error();
    co_return unix_stream(std::move(a->fd));
}

}  // namespace spindle::net
