#pragma once
/// Errors of the network layer that the OS does not name. Everything else is
/// the OS's own errno (std::system_category), compared with std::errc:
/// `r.error() == std::errc::connection_refused`.

#include <system_error>

namespace spindle::net {

enum class errc {
    end_of_stream = 1,   ///< the peer closed before the bytes asked for arrived
    line_too_long,       ///< read_until found no delimiter within its limit
    datagram_truncated,  ///< a datagram was larger than the buffer given for it
    resolve_failed,      ///< name resolution failed (see the message)
    invalid_address,     ///< text that is not an address of the expected form
};

const std::error_category& net_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), net_category()}; }

}  // namespace spindle::net

template <>
struct std::is_error_code_enum<spindle::net::errc> : std::true_type {};
