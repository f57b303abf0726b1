#pragma once
// One descriptor operation as the runtime hands it to its backend. It lives in
// the awaiting frame (or a watcher), so an I/O costs no allocation; the
// backend's own bookkeeping sits in m_backend, opaque here (runtime/io.cpp
// places the reactor's operation there and checks that it fits).

#include <cstddef>
#include <cstdint>
#include <sys/socket.h>
#include <sys/uio.h>

namespace spindle::detail {

enum class io_code : std::uint8_t {
    read,         // read(2) into buf
    write,        // write(2) from buf
    readv,        // readv(2) over vec
    writev,       // writev(2) over vec
    recv,         // recv(2) with flags
    send,         // send(2) with flags | MSG_NOSIGNAL
    recvmsg,      // recvmsg(2) with msg and flags
    sendmsg,      // sendmsg(2) with msg and flags | MSG_NOSIGNAL
    accept,       // accept(2): the new descriptor is non-blocking and close-on-exec
    connect,      // connect(2): completes with 0 or the socket's SO_ERROR
    poll,         // readiness (spindle::readiness flags in `events`)
    recv_pooled,  // recv(2) with flags into a buffer the loop lends once data is there
    // File operations (spindle/file.hpp): args.file, on the ring or the pool.
    read_at,    // pread(2)
    write_at,   // pwrite(2)
    readv_at,   // preadv(2)
    writev_at,  // pwritev(2)
    fsync,      // fsync(2), fdatasync(2) with flags = 1
    openat,     // openat(2) in fd (AT_FDCWD too), always close-on-exec
    close,      // close(2)
    statx,      // statx(2) in fd
    renameat,   // renameat(2) in fd
    unlinkat,   // unlinkat(2) in fd
    mkdirat,    // mkdirat(2) in fd
    truncate,   // ftruncate(2)
    openat2,    // openat2(2) in fd: data points to a struct open_how
    // fd is a child's pid: completes with 0 once it has ended (kqueue only).
    process_exit,
};

/// The arguments of a file operation, kept by its wait (the reactor's
/// file_args, field for field: runtime/io.cpp checks).
struct file_args {
    void* data = nullptr;  // read_at, write_at: the buffer; statx: its result
    std::size_t size = 0;
    const ::iovec* iov = nullptr;  // readv_at, writev_at
    int count = 0;
    unsigned mode = 0;         // openat, mkdirat: the mode; statx: the mask
    std::uint64_t offset = 0;  // positional I/O; truncate: the length
    const char* path = nullptr;
    const char* path2 = nullptr;  // renameat: the new name
};

struct io_request {
    int fd = -1;
    io_code code = io_code::read;
    /// A persistent poll completes again on every readiness until withdrawn.
    bool persistent = false;
    /// A receive on a byte-stream socket (see reactor::operation::stream).
    bool stream = false;
    std::uint32_t events = 0;
    int flags = 0;
    union {
        struct { void* data; std::size_t size; } buf;
        struct { const ::iovec* iov; int count; } vec;
        ::msghdr* msg;
        struct { ::sockaddr* addr; ::socklen_t* len; } accept;
        struct { const ::sockaddr* addr; ::socklen_t len; } connect;
        const file_args* file;
    } args{};
};

class io_op {
public:
    /// Called when a pending operation completes (from the loop's poll, or from
    /// a cancel or close): it only schedules, never resumes inline.
    using complete_fn = void (*)(io_op&) noexcept;

    io_op(const io_request& request, complete_fn done) noexcept;
    io_op(const io_op&) = delete;
    io_op& operator=(const io_op&) = delete;
    ~io_op() = default;

    /// Submitted and not completed yet (a persistent poll stays pending).
    bool pending() const noexcept;
    /// Bytes transferred, a new descriptor, 0, or -errno; valid once completed.
    std::int64_t result() const noexcept;

private:
    friend struct io_access;
    complete_fn m_done;
    // The reactor's operation, state and result included: read through the
    // accessors above, so the frame holds no second copy.
    alignas(8) std::byte m_backend[80];
};

}  // namespace spindle::detail
