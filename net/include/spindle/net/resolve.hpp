#pragma once
/// Name resolution. getaddrinfo(3) blocks, so it runs on the offload pool
/// (offload.hpp) as a lookup job: at most half the pool's threads resolve at
/// once, so slow DNS cannot starve file work. The awaiting task resumes on
/// its own loop. Numeric hosts are parsed in place, without the pool.
/// Failures are errc::resolve_failed, or the OS error for EAI_SYSTEM. A
/// cancelled resolution completes at once with operation_canceled; the
/// lookup's late answer is dropped.

#include <spindle/net/address.hpp>
#include <spindle/task.hpp>

#include <stop_token>
#include <string>
#include <vector>

namespace spindle::net {

struct resolve_hints {
    address_family family = address_family::none;  ///< none: IPv4 and IPv6
    bool datagram = false;                          ///< addresses for UDP rather than TCP
};

/// The addresses of `host` for `service` (a port number or a name such as "http").
task<result<std::vector<address>>> resolve(std::string host, std::string service, resolve_hints hints = {},
                                           std::stop_token token = {});

}  // namespace spindle::net
