#pragma once
/// Errors of the runtime that neither the OS nor std::errc names, in their own
/// category, "spindle". Compare with the enum:
/// `if (r.error() == spindle::errc::channel_closed) ...`.

#include <string>
#include <system_error>

namespace spindle {

enum class errc {
    /// The channel was closed: a send after (or blocked at) the close, or a
    /// receive once everything sent before the close was received.
    channel_closed = 1,
    /// A broadcast receiver fell so far behind that values it had not read
    /// were overwritten; broadcast_result::missed() says how many. The next
    /// receive gives the oldest value still held.
    receiver_lagged = 2,
    /// The offload pool was destroyed before the job could run.
    pool_closed = 3,
};

namespace detail {

class runtime_error_category final : public std::error_category {
public:
    const char* name() const noexcept override { return "spindle"; }
    std::string message(int value) const override {
        switch (static_cast<errc>(value)) {
            case errc::channel_closed: return "channel closed";
            case errc::receiver_lagged: return "receiver lagged: values were overwritten before it read them";
            case errc::pool_closed: return "offload pool closed before the job ran";
        }
        return "unknown spindle error";
    }
};

}  // namespace detail

/// The category of spindle::errc. Header-only: an inline function's static is
/// one object in the whole program, so codes compare equal across libraries.
inline const std::error_category& runtime_category() noexcept {
    static const detail::runtime_error_category instance;
    return instance;
}

inline std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), runtime_category()}; }

}  // namespace spindle

template <>
struct std::is_error_code_enum<spindle::errc> : std::true_type {};
