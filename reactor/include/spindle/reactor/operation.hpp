#pragma once
/// One I/O operation handed to a backend. It lives in the awaiting coroutine's
/// frame (or wherever its owner keeps it), so submitting one allocates nothing.

#include <spindle/reactor/op_code.hpp>

#include <cstddef>
#include <cstdint>
#include <sys/socket.h>
#include <sys/uio.h>

namespace spindle::reactor {

/// Readiness bits for op_code::poll; backend-neutral on purpose.
enum poll_events : std::uint32_t { readable = 1u, writable = 2u };

enum class op_state : std::uint8_t { idle, pending, done };

class buffer_pool;
struct operation;

/// The arguments of a file operation (is_file_op), kept by the operation's
/// owner for as long as it is pending. The runtime mirrors this layout.
struct file_args {
    void* data = nullptr;  ///< read_at, write_at: the buffer; statx: a struct statx
    std::size_t size = 0;
    const ::iovec* iov = nullptr;  ///< readv_at, writev_at
    int count = 0;
    unsigned mode = 0;         ///< openat, mkdirat: the mode; statx: the mask
    std::uint64_t offset = 0;  ///< positional I/O; truncate: the length
    const char* path = nullptr;
    const char* path2 = nullptr;  ///< renameat: the new name
};
/// Called by the backend when an operation completes (from poll() or cancel()).
/// It must not resume a coroutine inline: it only schedules.
using complete_fn = void (*)(operation&) noexcept;

struct operation {
    complete_fn complete = nullptr;
    /// The owner's own pointer, for its completion function; never touched here.
    void* owner = nullptr;
    int fd = -1;
    op_code code = op_code::read;
    op_state state = op_state::idle;
    /// A persistent poll stays armed after it completes and completes again on
    /// the next readiness; a one-shot one completes once.
    bool persistent = false;
    /// A receive on a byte stream (TCP, Unix stream): one that returns less
    /// than it asked for has emptied the socket, so an edge-triggered backend
    /// may wait for the next edge instead of trying the next receive first.
    bool stream = false;
    std::uint32_t events = 0;  ///< op_code::poll: readable | writable
    int flags = 0;             ///< recv/send/recvmsg/sendmsg flags

    union {
        struct { void* data; std::size_t size; } buf;
        struct { const ::iovec* iov; int count; } vec;
        ::msghdr* msg;
        struct { ::sockaddr* addr; ::socklen_t* len; } accept;
        struct { const ::sockaddr* addr; ::socklen_t len; } connect;
        struct { buffer_pool* pool; std::uint32_t id; } pooled;
        const file_args* file;
    } args{};

    /// Bytes transferred, a new descriptor, 0, or -errno. Set before complete().
    std::int64_t result = 0;

    // Owned by the backend while the operation is pending.
    operation* next = nullptr;
    operation* prev = nullptr;
    bool connect_started = false;
    std::uint8_t backend_tag = 0;
    std::uint32_t backend_slot = 0;  // completion backends: index in their table

    bool pending() const noexcept { return state == op_state::pending; }
};

/// Closes what a successful completion of `op` handed over (an accepted or
/// opened descriptor in op.result; descriptors received with SCM_RIGHTS in a
/// recvmsg's control buffer; a pooled receive's buffer, given back): for a
/// completion nobody will see.
void release_handed_over(const operation& op) noexcept;

}  // namespace spindle::reactor
