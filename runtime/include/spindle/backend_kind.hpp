#pragma once
/// Which OS backend a loop runs on, and how it catches signals: the only
/// backend words an application sees (see docs/backends.md).

#include <optional>
#include <string_view>

namespace spindle {

/// `automatic` tries io_uring, then epoll on Linux, and is kqueue elsewhere.
/// The environment variable SPINDLE_BACKEND (one of the names below; read once
/// per process) replaces the kind for every loop.
enum class backend_kind { automatic, epoll, io_uring, kqueue };

/// signalfd on Linux, the self-pipe trick elsewhere; either on request.
enum class signal_mechanism { automatic, signalfd, self_pipe };

/// "automatic", "epoll", "io_uring" or "kqueue".
std::string_view to_string(backend_kind kind) noexcept;
/// The kind with that name, or nullopt.
std::optional<backend_kind> backend_from_string(std::string_view name) noexcept;

}  // namespace spindle
