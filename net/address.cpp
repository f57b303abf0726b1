#include <spindle/net/address.hpp>
#include <spindle/net/error.hpp>

#include <arpa/inet.h>
#include <charconv>
#include <cstring>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/un.h>

namespace spindle::net {

namespace {

constexpr std::string_view unix_prefix = "unix:";

sockaddr_in* v4(sockaddr_storage& s) noexcept { return reinterpret_cast<sockaddr_in*>(&s); }
const sockaddr_in* v4(const sockaddr_storage& s) noexcept { return reinterpret_cast<const sockaddr_in*>(&s); }
sockaddr_in6* v6(sockaddr_storage& s) noexcept { return reinterpret_cast<sockaddr_in6*>(&s); }
const sockaddr_in6* v6(const sockaddr_storage& s) noexcept { return reinterpret_cast<const sockaddr_in6*>(&s); }
const sockaddr_un* un(const sockaddr_storage& s) noexcept { return reinterpret_cast<const sockaddr_un*>(&s); }

std::error_code invalid() noexcept { return make_error_code(errc::invalid_address); }

bool parse_port(std::string_view text, std::uint16_t& port) noexcept {
    if (text.empty() || text.size() > 5) return false;
    unsigned value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || value > 65535) return false;
    port = static_cast<std::uint16_t>(value);
    return true;
}

}  // namespace

address::address() noexcept { std::memset(&m_storage, 0, sizeof m_storage); }

result<address> address::from_ip(std::string_view host, std::uint16_t port) {
    // inet_pton needs a terminated string; hosts are short. A NUL inside the
    // host would end that string early and leave the rest unread.
    char text[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    if (host.empty() || host.size() >= sizeof text || host.find('\0') != std::string_view::npos) return invalid();
    std::memcpy(text, host.data(), host.size());
    text[host.size()] = '\0';

    address a;
    if (::inet_pton(AF_INET, text, &v4(a.m_storage)->sin_addr) == 1) {
        v4(a.m_storage)->sin_family = AF_INET;
        v4(a.m_storage)->sin_port = htons(port);
        a.m_size = sizeof(sockaddr_in);
        return a;
    }
    // An IPv6 literal may carry a zone: fe80::1%eth0 or fe80::1%2.
    std::uint32_t scope = 0;
    if (char* percent = std::strchr(text, '%')) {
        *percent = '\0';
        const char* zone = percent + 1;
        if (*zone == '\0') return invalid();
        std::string_view z(zone);
        if (auto [end, ec] = std::from_chars(z.data(), z.data() + z.size(), scope); ec != std::errc() || end != z.data() + z.size()) {
            scope = ::if_nametoindex(zone);
            if (scope == 0) return invalid();
        }
    }
    if (::inet_pton(AF_INET6, text, &v6(a.m_storage)->sin6_addr) == 1) {
        v6(a.m_storage)->sin6_family = AF_INET6;
        v6(a.m_storage)->sin6_port = htons(port);
        v6(a.m_storage)->sin6_scope_id = scope;
        a.m_size = sizeof(sockaddr_in6);
        return a;
    }
    return invalid();
}

result<address> address::from_unix_path(std::string_view path) {
    address a;
    auto* sun = reinterpret_cast<sockaddr_un*>(&a.m_storage);
    // The path must fit with its terminator (an abstract name needs none).
    if (path.empty() || path.size() >= sizeof sun->sun_path) return invalid();
    if (path.find('\0') != std::string_view::npos) return invalid();
    sun->sun_family = AF_UNIX;
    std::memcpy(sun->sun_path, path.data(), path.size());
    if (path.front() == '@') {
        sun->sun_path[0] = '\0';
        a.m_size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
    } else {
        a.m_size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
    }
    return a;
}

result<address> address::parse(std::string_view text) {
    if (text.starts_with(unix_prefix)) return from_unix_path(text.substr(unix_prefix.size()));
    std::string_view host;
    std::string_view port;
    if (text.starts_with('[')) {
        auto close = text.find(']');
        if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') return invalid();
        host = text.substr(1, close - 1);
        port = text.substr(close + 2);
        if (host.find(':') == std::string_view::npos) return invalid();
    } else {
        auto colon = text.rfind(':');
        if (colon == std::string_view::npos) return invalid();
        host = text.substr(0, colon);
        port = text.substr(colon + 1);
        // An unbracketed IPv6 literal with a port is ambiguous.
        if (host.find(':') != std::string_view::npos) return invalid();
    }
    std::uint16_t number = 0;
    if (!parse_port(port, number)) return invalid();
    return from_ip(host, number);
}

address address::from_native(const sockaddr* addr, socklen_t len) noexcept {
    address a;
    if (addr && len > 0) {
        a.m_size = std::min<socklen_t>(len, sizeof a.m_storage);
        std::memcpy(&a.m_storage, addr, a.m_size);
    }
    return a;
}

address address::ipv4_loopback(std::uint16_t port) noexcept {
    address a;
    v4(a.m_storage)->sin_family = AF_INET;
    v4(a.m_storage)->sin_port = htons(port);
    v4(a.m_storage)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.m_size = sizeof(sockaddr_in);
    return a;
}

address address::ipv6_loopback(std::uint16_t port) noexcept {
    address a;
    v6(a.m_storage)->sin6_family = AF_INET6;
    v6(a.m_storage)->sin6_port = htons(port);
    v6(a.m_storage)->sin6_addr = in6addr_loopback;
    a.m_size = sizeof(sockaddr_in6);
    return a;
}

address address::ipv4_any(std::uint16_t port) noexcept {
    address a;
    v4(a.m_storage)->sin_family = AF_INET;
    v4(a.m_storage)->sin_port = htons(port);
    v4(a.m_storage)->sin_addr.s_addr = htonl(INADDR_ANY);
    a.m_size = sizeof(sockaddr_in);
    return a;
}

address address::ipv6_any(std::uint16_t port) noexcept {
    address a;
    v6(a.m_storage)->sin6_family = AF_INET6;
    v6(a.m_storage)->sin6_port = htons(port);
    v6(a.m_storage)->sin6_addr = in6addr_any;
    a.m_size = sizeof(sockaddr_in6);
    return a;
}

address_family address::family() const noexcept {
    if (m_size == 0) return address_family::none;
    switch (m_storage.ss_family) {
        case AF_INET: return address_family::ipv4;
        case AF_INET6: return address_family::ipv6;
        case AF_UNIX: return address_family::unix_path;
        default: return address_family::none;
    }
}

std::uint16_t address::port() const noexcept {
    switch (family()) {
        case address_family::ipv4: return ntohs(v4(m_storage)->sin_port);
        case address_family::ipv6: return ntohs(v6(m_storage)->sin6_port);
        default: return 0;
    }
}

void address::set_port(std::uint16_t port) noexcept {
    switch (family()) {
        case address_family::ipv4: v4(m_storage)->sin_port = htons(port); break;
        case address_family::ipv6: v6(m_storage)->sin6_port = htons(port); break;
        default: break;
    }
}

std::string_view address::unix_path() const noexcept {
    if (family() != address_family::unix_path) return {};
    const auto offset = offsetof(sockaddr_un, sun_path);
    if (m_size <= offset) return {};  // an unnamed socket
    const char* path = un(m_storage)->sun_path;
    std::size_t len = m_size - offset;
    if (path[0] == '\0') return {path, len};  // abstract: "\0name", shown as "@name" by to_string
    return {path, ::strnlen(path, len)};
}

bool address::is_loopback() const noexcept {
    switch (family()) {
        case address_family::ipv4: return (ntohl(v4(m_storage)->sin_addr.s_addr) >> 24) == 127;
        case address_family::ipv6: return IN6_IS_ADDR_LOOPBACK(&v6(m_storage)->sin6_addr);
        default: return false;
    }
}

std::string address::to_string() const {
    char host[INET6_ADDRSTRLEN];
    switch (family()) {
        case address_family::ipv4:
            ::inet_ntop(AF_INET, &v4(m_storage)->sin_addr, host, sizeof host);
            return std::string(host) + ':' + std::to_string(port());
        case address_family::ipv6: {
            ::inet_ntop(AF_INET6, &v6(m_storage)->sin6_addr, host, sizeof host);
            std::string text = std::string("[") + host;
            if (auto scope = v6(m_storage)->sin6_scope_id) text += '%' + std::to_string(scope);
            return text + "]:" + std::to_string(port());
        }
        case address_family::unix_path: {
            std::string path(unix_path());
            if (!path.empty() && path[0] == '\0') path[0] = '@';
            return std::string(unix_prefix) + path;
        }
        case address_family::none: break;
    }
    return {};
}

bool operator==(const address& a, const address& b) noexcept {
    return a.m_size == b.m_size && std::memcmp(&a.m_storage, &b.m_storage, a.m_size) == 0;
}

}  // namespace spindle::net
