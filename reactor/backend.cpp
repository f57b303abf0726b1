#include "epoll_backend.hpp"

#include <spindle/reactor/backend.hpp>

#include <cerrno>
#include <system_error>

namespace spindle::reactor {

std::string_view to_string(backend_kind kind) noexcept {
    switch (kind) {
        case backend_kind::automatic: return "automatic";
        case backend_kind::epoll: return "epoll";
        case backend_kind::io_uring: return "io_uring";
        case backend_kind::kqueue: return "kqueue";
    }
    return "unknown";
}

std::optional<backend_kind> backend_from_string(std::string_view name) noexcept {
    for (backend_kind k : {backend_kind::automatic, backend_kind::epoll, backend_kind::io_uring, backend_kind::kqueue})
        if (name == to_string(k)) return k;
    return std::nullopt;
}

std::unique_ptr<backend> make_backend(backend_kind kind) {
    switch (kind) {
        case backend_kind::automatic:
        case backend_kind::epoll: return std::make_unique<epoll_backend>();
        case backend_kind::io_uring:
        case backend_kind::kqueue: break;
    }
    throw std::system_error(std::make_error_code(std::errc::function_not_supported),
                            "spindle: backend '" + std::string(to_string(kind)) + "' is not built in");
}

}  // namespace spindle::reactor
