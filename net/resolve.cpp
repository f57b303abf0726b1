#include <spindle/net/error.hpp>
#include <spindle/net/resolve.hpp>
#include <spindle/offload.hpp>

#include <netdb.h>

#include <charconv>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace spindle::net {

namespace {

using lookup_result = result<std::vector<address>>;

struct lookup {
    std::string host;
    std::string service;
    resolve_hints hints;
};

lookup_result run_lookup(const lookup& job) {
    addrinfo hints{};
    hints.ai_family = job.hints.family == address_family::ipv4   ? AF_INET
                      : job.hints.family == address_family::ipv6 ? AF_INET6
                                                                 : AF_UNSPEC;
    hints.ai_socktype = job.hints.datagram ? SOCK_DGRAM : SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    addrinfo* list = nullptr;
    int rc = ::getaddrinfo(job.host.c_str(), job.service.empty() ? nullptr : job.service.c_str(), &hints, &list);
    // AI_ADDRCONFIG hides loopback-only families on a host without other
    // addresses; ask again without it before giving up.
    if (rc == EAI_NONAME || rc == EAI_ADDRFAMILY) {
        hints.ai_flags = 0;
        rc = ::getaddrinfo(job.host.c_str(), job.service.empty() ? nullptr : job.service.c_str(), &hints, &list);
    }
    if (rc == EAI_SYSTEM) return std::error_code(errno, std::system_category());
    if (rc != 0) return make_error_code(errc::resolve_failed);
    std::vector<address> found;
    for (addrinfo* ai = list; ai; ai = ai->ai_next) {
        address a = address::from_native(ai->ai_addr, static_cast<socklen_t>(ai->ai_addrlen));
        bool seen = false;
        for (const address& b : found) seen = seen || a == b;
        if (!seen) found.push_back(a);
    }
    ::freeaddrinfo(list);
    if (found.empty()) return make_error_code(errc::resolve_failed);
    return found;
}

std::optional<address> numeric(const std::string& host, const std::string& service, address_family family) {
    unsigned port = 0;
    auto [end, ec] = std::from_chars(service.data(), service.data() + service.size(), port);
    if (service.empty() || ec != std::errc() || end != service.data() + service.size() || port > 65535) return std::nullopt;
    result<address> a = address::from_ip(host, static_cast<std::uint16_t>(port));
    if (!a) return std::nullopt;
    if (family != address_family::none && a->family() != family) return std::nullopt;
    return *a;
}

}  // namespace

task<result<std::vector<address>>> resolve(std::string host, std::string service, resolve_hints hints, std::stop_token token) {
    if (std::optional<address> a = numeric(host, service, hints.family)) co_return std::vector<address>{*a};
    // The job owns its strings, so a cancelled lookup can end at once and
    // leave getaddrinfo to finish alone (it cannot be interrupted).
    auto job = [l = lookup{std::move(host), std::move(service), hints}] { return run_lookup(l); };
    co_return co_await offload(std::move(job), job_options{.kind = job_kind::lookup, .detach_on_cancel = true},
                               std::move(token));
}

}  // namespace spindle::net
