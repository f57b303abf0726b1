#if SPINDLE_HAVE_EPOLL
#include "epoll_backend.hpp"
#endif
#if SPINDLE_HAVE_IO_URING
#include "io_uring_backend.hpp"
#endif
#if SPINDLE_HAVE_KQUEUE
#include "kqueue_backend.hpp"
#endif

#include <spindle/reactor/backend.hpp>
#include <spindle/reactor/buffer_pool.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sys/socket.h>
#include <unistd.h>
#include <stdexcept>
#include <system_error>

namespace spindle::reactor {

read_buffer_counts backend::read_buffers() const noexcept {
    const buffer_pool* pool = m_published_pool.load(std::memory_order_acquire);
    if (!pool) return {};
    return {pool->mapped(), pool->lent()};
}

void release_handed_over(const operation& op) noexcept {
    if (op.result < 0) return;
    if (op.code == op_code::recv_pooled) {
        if (op.result > 0) {
            op.args.pooled.pool->delivered();
            op.args.pooled.pool->give_back(op.args.pooled.id);
        }
    } else if (op.code == op_code::accept || op.code == op_code::openat || op.code == op_code::openat2) {
        ::close(static_cast<int>(op.result));
    } else if (op.code == op_code::recvmsg && op.args.msg) {
        ::msghdr* msg = op.args.msg;
        for (::cmsghdr* c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            const auto* fds = reinterpret_cast<const unsigned char*>(CMSG_DATA(c));
            for (std::size_t i = 0; i < count; ++i) {
                int fd;
                std::memcpy(&fd, fds + i * sizeof(int), sizeof(int));
                if (fd >= 0) ::close(fd);
            }
        }
    }
}

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

namespace {

struct environment_choice {
    bool set = false;
    std::optional<backend_kind> kind;
    std::string name;
};

// SPINDLE_BACKEND, read once: the environment is not meant to change under a
// running program, and getenv must not race with a setenv elsewhere later.
const environment_choice& environment_override() {
    static const environment_choice choice = [] {
        environment_choice c;
        if (const char* value = std::getenv("SPINDLE_BACKEND"); value && *value) {
            c.set = true;
            c.name = value;
            c.kind = backend_from_string(c.name);
        }
        return c;
    }();
    return choice;
}

[[noreturn]] void not_built_in(backend_kind kind, const char* why) {
    throw std::system_error(std::make_error_code(std::errc::function_not_supported),
                            "spindle: backend '" + std::string(to_string(kind)) + "' is not built in" + why);
}

}  // namespace

std::unique_ptr<backend> make_backend(backend_kind kind) {
    std::string ignored;
    return make_backend(kind, ignored);
}

std::unique_ptr<backend> make_backend(backend_kind kind, std::string& fallback_reason) {
    std::string notes;
    return make_backend(kind, backend_options{}, fallback_reason, notes);
}

std::unique_ptr<backend> make_backend(backend_kind kind, const backend_options& options, std::string& fallback_reason,
                                      std::string& notes) {
    fallback_reason.clear();
    notes.clear();
    if (const environment_choice& env = environment_override(); env.set) {
        if (!env.kind)
            throw std::invalid_argument("spindle: SPINDLE_BACKEND='" + env.name +
                                        "' is not a backend (automatic, epoll, io_uring or kqueue)");
        kind = *env.kind;
    }
    switch (kind) {
        case backend_kind::automatic:
#if SPINDLE_HAVE_EPOLL
#if SPINDLE_HAVE_IO_URING
            try {
                return std::make_unique<io_uring_backend>(options, notes);
            } catch (const std::system_error& e) {
                fallback_reason = std::string("io_uring unavailable, using epoll: ") + e.what();
            }
#else
            fallback_reason = "io_uring is not built in (configured without liburing), using epoll";
#endif
            return std::make_unique<epoll_backend>(options);
#elif SPINDLE_HAVE_KQUEUE
            // macOS and the BSDs: kqueue is the native choice, nothing was passed over.
            return std::make_unique<kqueue_backend>(options);
#else
            break;
#endif
        case backend_kind::epoll:
#if SPINDLE_HAVE_EPOLL
            return std::make_unique<epoll_backend>(options);
#else
            not_built_in(kind, " (Linux only)");
#endif
        case backend_kind::io_uring:
#if SPINDLE_HAVE_IO_URING
            return std::make_unique<io_uring_backend>(options, notes);
#else
            not_built_in(kind, " (configured without liburing)");
#endif
        case backend_kind::kqueue:
#if SPINDLE_HAVE_KQUEUE
            return std::make_unique<kqueue_backend>(options);
#else
#if defined(__linux__)
            not_built_in(kind, " (on Linux it needs libkqueue and -Dkqueue=enabled)");
#else
            not_built_in(kind, " (configured with -Dkqueue=disabled)");
#endif
#endif
    }
    not_built_in(kind, "");
}

}  // namespace spindle::reactor
