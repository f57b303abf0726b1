#pragma once
/// The operations a backend performs, listed once. The enum, the array of
/// every code, their names and the direction each waits in are all made from
/// SPINDLE_REACTOR_OPERATIONS: a new operation is one line there, plus a case
/// in each backend's switch over op_code (the syscall, the kernel's request),
/// which the compiler asks for because those switches have no default.

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

namespace spindle::reactor {

/// The direction an operation waits in when it has to wait for readiness: the
/// list a readiness backend parks it in, what io_uring polls for on EAGAIN.
enum class op_direction : std::uint8_t {
    reader,     ///< waits to be readable
    writer,     ///< waits to be writable
    by_events,  ///< waits for what operation::events asks; both directions count as a reader
    none,       ///< never waits for readiness: a file operation (is_file_op)
    process,    ///< waits for a process to end, not for a descriptor (process_exit)
};

/// X(code, name, direction), one line per operation, in the order of op_code.
/// `name` is what a task waiting on it says in the task dump ("recv on fd 7").
/// recv_pooled receives into a buffer the backend lends from its pool only
/// once data is there: on a result > 0, args.pooled says which, and the owner
/// gives it back (buffer_pool::give_back); on 0 or an error, none.
#define SPINDLE_REACTOR_OPERATIONS(X)                                                                        \
    X(read, "read", reader)                  /* read(2) into buf */                                          \
    X(write, "write", writer)                /* write(2) from buf */                                         \
    X(readv, "readv", reader)                /* readv(2) over vec */                                         \
    X(writev, "writev", writer)              /* writev(2) over vec */                                        \
    X(recv, "recv", reader)                  /* recv(2) with flags */                                        \
    X(send, "send", writer)                  /* send(2) with flags | MSG_NOSIGNAL */                         \
    X(recvmsg, "recvmsg", reader)            /* recvmsg(2) with msg and flags */                             \
    X(sendmsg, "sendmsg", writer)            /* sendmsg(2) with msg and flags | MSG_NOSIGNAL */              \
    X(accept, "accept", reader)              /* accept4(2): non-blocking and close-on-exec */                \
    X(connect, "connect", writer)            /* connect(2): completes with 0 or SO_ERROR */                  \
    X(poll, "poll", by_events)               /* readiness of `events` (readable / writable) */               \
    X(recv_pooled, "borrowed recv", reader)  /* recv(2) with flags into a lent buffer (above) */             \
    X(read_at, "file read", none)            /* pread(2): args.file {data, size, offset} */                  \
    X(write_at, "file write", none)          /* pwrite(2): args.file {data, size, offset} */                 \
    X(readv_at, "file readv", none)          /* preadv(2): args.file {iov, count, offset} */                 \
    X(writev_at, "file writev", none)        /* pwritev(2): args.file {iov, count, offset} */                \
    X(fsync, "fsync", none)                  /* fsync(2), or fdatasync(2) with flags = datasync */           \
    X(openat, "open", none)                  /* openat(2) in fd: args.file {path, mode}, flags */            \
    X(close, "close", none)                  /* close(2) */                                                  \
    X(statx, "stat", none)                   /* statx(2) in fd: args.file {path, data, mode = mask} */       \
    X(renameat, "rename", none)              /* renameat(2) in fd: args.file {path, path2} */                \
    X(unlinkat, "remove", none)              /* unlinkat(2) in fd: args.file {path}, flags */                \
    X(mkdirat, "make directory", none)       /* mkdirat(2) in fd: args.file {path, mode} */                  \
    X(truncate, "truncate", none)            /* ftruncate(2) to args.file.offset */                          \
    X(openat2, "open beneath", none)         /* openat2(2) in fd: args.file {path, data = open_how, size} */ \
    X(process_exit, "process exit", process) /* fd is a child's pid: 0 once it has ended, unreaped */

/// process_exit is kqueue's EVFILT_PROC: there a child's end is an event of
/// the loop's own poll, where Linux has a pidfd to wait on instead. Only
/// kqueue performs it (backend::performs).

/// A path operation (openat, openat2, statx, renameat, unlinkat, mkdirat) takes
/// its directory in operation::fd, and AT_FDCWD (negative) is one.
/// fsync's flags: fdatasync(2) instead of fsync(2).
inline constexpr int datasync = 1;

enum class op_code : std::uint8_t {
#define SPINDLE_REACTOR_OP_ENUMERATOR(code, name, direction) code,
    SPINDLE_REACTOR_OPERATIONS(SPINDLE_REACTOR_OP_ENUMERATOR)
#undef SPINDLE_REACTOR_OP_ENUMERATOR
};

/// Every op_code, in order: for tables and checks that must cover them all.
inline constexpr op_code all_op_codes[] = {
#define SPINDLE_REACTOR_OP_ELEMENT(code, name, direction) op_code::code,
    SPINDLE_REACTOR_OPERATIONS(SPINDLE_REACTOR_OP_ELEMENT)
#undef SPINDLE_REACTOR_OP_ELEMENT
};
inline constexpr std::size_t op_code_count = std::size(all_op_codes);

/// The operation's name, as the task dump prints it; "I/O" for a value that
/// is no op_code.
constexpr std::string_view to_string(op_code code) noexcept {
    switch (code) {
#define SPINDLE_REACTOR_OP_NAME(code, name, direction) \
    case op_code::code: return name;
        SPINDLE_REACTOR_OPERATIONS(SPINDLE_REACTOR_OP_NAME)
#undef SPINDLE_REACTOR_OP_NAME
    }
    return "I/O";
}

constexpr op_direction direction_of(op_code code) noexcept {
    switch (code) {
#define SPINDLE_REACTOR_OP_DIRECTION(code, name, direction) \
    case op_code::code: return op_direction::direction;
        SPINDLE_REACTOR_OPERATIONS(SPINDLE_REACTOR_OP_DIRECTION)
#undef SPINDLE_REACTOR_OP_DIRECTION
    }
    return op_direction::by_events;
}

/// An operation on a file or a path rather than on a socket or pipe: no
/// readiness backend performs one on its loop's thread (backend::performs).
constexpr bool is_file_op(op_code code) noexcept { return direction_of(code) == op_direction::none; }

/// A path operation, whose fd is a directory and may be AT_FDCWD.
constexpr bool is_path_op(op_code code) noexcept {
    return code == op_code::openat || code == op_code::openat2 || code == op_code::statx || code == op_code::renameat ||
           code == op_code::unlinkat || code == op_code::mkdirat;
}

}  // namespace spindle::reactor
