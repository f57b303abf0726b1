#pragma once
/// Unix stream sockets: unix_stream and unix_listener.

#include <spindle/net/listener.hpp>
#include <spindle/net/stream.hpp>

#include <string>
#include <utility>

namespace spindle::net {

class unix_stream : public stream_socket {
public:
    using stream_socket::stream_socket;

    static task<result<unix_stream>> connect(address path, std::stop_token token = {});
    /// Two connected streams (socketpair(2)).
    static result<std::pair<unix_stream, unix_stream>> pair();
};

class unix_listener : public socket_base {
public:
    unix_listener() noexcept = default;
    unix_listener(unix_listener&& other) noexcept
        : socket_base(std::move(other)), m_path(std::exchange(other.m_path, {})) {}
    unix_listener& operator=(unix_listener&& other) noexcept;
    /// Closes, and removes the socket file this listener created (also when
    /// close() was called first).
    ~unix_listener();

    /// Binds to a filesystem path (which must not exist yet) or an abstract
    /// name ("@name"), and listens.
    static result<unix_listener> bind(const address& path, const listen_options& options = {});

    task<result<unix_stream>> accept(std::stop_token token = {});

private:
    std::string m_path;  ///< removed on close; empty for an abstract name
};

}  // namespace spindle::net
