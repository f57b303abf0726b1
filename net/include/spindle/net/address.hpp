#pragma once
/// A socket address: IPv4, IPv6 or a Unix path, held by value (no allocation).

#include <spindle/result.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <sys/socket.h>

namespace spindle::net {

enum class address_family : std::uint8_t { none, ipv4, ipv6, unix_path };

class address {
public:
    /// An empty address (family none).
    address() noexcept;

    /// Parses "127.0.0.1:8080", "[::1]:8080", "[fe80::1%lo]:80" or "unix:/path"
    /// ("unix:@name" for Linux's abstract namespace). No name resolution.
    static result<address> parse(std::string_view text);
    /// Parses a numeric host without a port ("127.0.0.1", "::1") and sets `port`.
    static result<address> from_ip(std::string_view host, std::uint16_t port);
    /// A Unix socket path ('@' first for the abstract namespace).
    static result<address> from_unix_path(std::string_view path);
    /// Copies a native address (as returned by accept or getsockname).
    static address from_native(const ::sockaddr* addr, ::socklen_t len) noexcept;

    static address ipv4_loopback(std::uint16_t port = 0) noexcept;
    static address ipv6_loopback(std::uint16_t port = 0) noexcept;
    static address ipv4_any(std::uint16_t port = 0) noexcept;
    static address ipv6_any(std::uint16_t port = 0) noexcept;

    address_family family() const noexcept;
    /// The port of an IP address; 0 for others.
    std::uint16_t port() const noexcept;
    void set_port(std::uint16_t port) noexcept;
    /// The path of a Unix address. An abstract name comes as the kernel holds
    /// it, a NUL first ("\0name"); to_string() shows it as "unix:@name".
    std::string_view unix_path() const noexcept;
    bool is_loopback() const noexcept;

    /// The text form accepted by parse(): "127.0.0.1:8080", "[::1]:8080", "unix:/p".
    std::string to_string() const;

    const ::sockaddr* native() const noexcept { return reinterpret_cast<const ::sockaddr*>(&m_storage); }
    ::sockaddr* native() noexcept { return reinterpret_cast<::sockaddr*>(&m_storage); }
    ::socklen_t size() const noexcept { return m_size; }
    /// For calls that fill the address in (accept, recvfrom): the room there is,
    /// then set_size() with what the call reported.
    static constexpr ::socklen_t capacity() noexcept { return sizeof(::sockaddr_storage); }
    void set_size(::socklen_t size) noexcept { m_size = size; }
    /// The socket() domain of this address (AF_INET, AF_INET6, AF_UNIX).
    int domain() const noexcept { return m_storage.ss_family; }

    friend bool operator==(const address& a, const address& b) noexcept;

private:
    ::sockaddr_storage m_storage;
    ::socklen_t m_size = 0;
};

}  // namespace spindle::net
