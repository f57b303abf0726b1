// libFuzzer target: address parsing (spindle/net/address.hpp) on any text,
// and from_native on any bytes. Besides what the sanitizers catch, it checks
// that an accepted address reads back: to_string() gives text that parse()
// accepts as the same address, and the text accepted had no byte that the
// parse did not look at (a NUL, where a C string stops).

#include "fuzz_check.hpp"

#include <spindle/net/address.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace net = spindle::net;

namespace {

void check_reads_back(const net::address& a) {
    FUZZ_CHECK(a.family() != net::address_family::none);
    FUZZ_CHECK(a.size() > 0 && a.size() <= net::address::capacity());
    const std::string text = a.to_string();
    const spindle::result<net::address> again = net::address::parse(text);
    FUZZ_CHECK(again.has_value());
    FUZZ_CHECK(*again == a);
    FUZZ_CHECK(again->to_string() == text);
}

bool is_ip(const net::address& a) {
    return a.family() == net::address_family::ipv4 || a.family() == net::address_family::ipv6;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const bool has_nul = text.find('\0') != std::string_view::npos;

    if (const spindle::result<net::address> a = net::address::parse(text)) {
        FUZZ_CHECK(!has_nul);
        check_reads_back(*a);
    }

    // A host and a port: the first two bytes are the port.
    if (size >= 2) {
        const auto port = static_cast<std::uint16_t>(data[0] << 8 | data[1]);
        const std::string_view host = text.substr(2);
        if (const spindle::result<net::address> a = net::address::from_ip(host, port)) {
            FUZZ_CHECK(host.find('\0') == std::string_view::npos);
            FUZZ_CHECK(is_ip(*a));
            FUZZ_CHECK(a->port() == port);
            check_reads_back(*a);
        }
    }

    if (const spindle::result<net::address> a = net::address::from_unix_path(text)) {
        FUZZ_CHECK(!has_nul);
        FUZZ_CHECK(a->family() == net::address_family::unix_path);
        std::string kernel_form(text);
        if (kernel_form.front() == '@') kernel_form.front() = '\0';
        FUZZ_CHECK(a->unix_path() == kernel_form);
        FUZZ_CHECK(a->port() == 0 && !a->is_loopback());
        check_reads_back(*a);
    }

    // The same bytes as what accept() or recvfrom() might have filled in.
    if (size > 0) {
        net::address a = net::address::from_native(reinterpret_cast<const ::sockaddr*>(data), static_cast<::socklen_t>(size));
        FUZZ_CHECK(a.size() == std::min<std::size_t>(size, net::address::capacity()));
        (void)a.to_string();
        (void)a.unix_path();
        (void)a.is_loopback();
        a.set_port(static_cast<std::uint16_t>(a.port() + 1));
        if (is_ip(a)) {
            // What the kernel fills in beyond the host, port and scope (the
            // flow label, padding) has no text form: compare texts.
            const std::string text_now = a.to_string();
            const spindle::result<net::address> again = net::address::parse(text_now);
            FUZZ_CHECK(again.has_value());
            FUZZ_CHECK(again->to_string() == text_now);
            FUZZ_CHECK(again->port() == a.port());
            FUZZ_CHECK(again->is_loopback() == a.is_loopback());
        }
    }
    return 0;
}
