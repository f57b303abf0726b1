#pragma once
// The syscall behind each operation, shared by the readiness backends, and
// the direction an operation waits in. Every syscall function returns the
// syscall's value or -errno and never leaves errno as its only report.

#include <spindle/reactor/operation.hpp>

#include <cerrno>
#include <cstddef>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/syscall.h>
#endif

// glibc's read, recv, send and the rest are cancellation points: in a process
// with more than one thread (the stall monitor's, a pool's) each switches the
// thread's cancel type on before the system call and off after it, about 30
// instructions each way, for pthread_cancel, which spindle never uses.
// syscall(2) makes the same call without them. Sanitizer builds keep libc's
// wrappers, which the sanitizers intercept (buffer checks, the
// happens-before of a byte written on one thread and read on another), and
// sendmsg and recvmsg keep them everywhere: a program that interposes them
// (as the tests of gather writes do, to cut writes short) sees every call.
#if defined(__linux__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#if defined(__has_feature)
#if !__has_feature(address_sanitizer) && !__has_feature(thread_sanitizer) && !__has_feature(memory_sanitizer)
#define SPINDLE_RAW_SYSCALLS 1
#endif
#else
#define SPINDLE_RAW_SYSCALLS 1
#endif
#endif
#ifndef SPINDLE_RAW_SYSCALLS
#define SPINDLE_RAW_SYSCALLS 0
#endif

namespace spindle::reactor {

namespace sys {
#if SPINDLE_RAW_SYSCALLS
inline long read(int fd, void* buf, std::size_t n) noexcept { return ::syscall(SYS_read, fd, buf, n); }
inline long write(int fd, const void* buf, std::size_t n) noexcept { return ::syscall(SYS_write, fd, buf, n); }
inline long readv(int fd, const ::iovec* iov, int count) noexcept { return ::syscall(SYS_readv, fd, iov, count); }
inline long writev(int fd, const ::iovec* iov, int count) noexcept { return ::syscall(SYS_writev, fd, iov, count); }
inline long recv(int fd, void* buf, std::size_t n, int flags) noexcept {
    return ::syscall(SYS_recvfrom, fd, buf, n, flags, nullptr, nullptr);
}
inline long send(int fd, const void* buf, std::size_t n, int flags) noexcept {
    return ::syscall(SYS_sendto, fd, buf, n, flags, nullptr, 0);
}
#else
inline long read(int fd, void* buf, std::size_t n) noexcept { return ::read(fd, buf, n); }
inline long write(int fd, const void* buf, std::size_t n) noexcept { return ::write(fd, buf, n); }
inline long readv(int fd, const ::iovec* iov, int count) noexcept { return ::readv(fd, iov, count); }
inline long writev(int fd, const ::iovec* iov, int count) noexcept { return ::writev(fd, iov, count); }
inline long recv(int fd, void* buf, std::size_t n, int flags) noexcept { return ::recv(fd, buf, n, flags); }
inline long send(int fd, const void* buf, std::size_t n, int flags) noexcept { return ::send(fd, buf, n, flags); }
#endif
inline long recvmsg(int fd, ::msghdr* msg, int flags) noexcept { return ::recvmsg(fd, msg, flags); }
inline long sendmsg(int fd, const ::msghdr* msg, int flags) noexcept { return ::sendmsg(fd, msg, flags); }
}  // namespace sys

// The direction an operation waits in (op_code.hpp's list says which): the
// list a readiness backend parks it in, and what io_uring polls for when the
// kernel answers EAGAIN. Readiness waits for both directions count as readers.
inline bool is_reader(const operation& op) noexcept {
    switch (direction_of(op.code)) {
        case op_direction::reader: return true;
        case op_direction::writer: return false;
        case op_direction::by_events: return (op.events & readable) != 0;
        case op_direction::none:
        case op_direction::process: return false;
    }
    return false;
}

inline std::int64_t or_errno(long long r) noexcept { return r < 0 ? -static_cast<std::int64_t>(errno) : r; }

// Linux and the BSDs have MSG_NOSIGNAL; where it is missing (older macOS) a
// socket needs SO_NOSIGPIPE, set where it is created.
#if defined(MSG_NOSIGNAL)
inline constexpr int no_sigpipe = MSG_NOSIGNAL;
#else
inline constexpr int no_sigpipe = 0;
#endif

// The accepted descriptor is non-blocking and close-on-exec from the start.
inline std::int64_t accept_nonblocking(operation& op) noexcept {
#if defined(__APPLE__)
    // No accept4 on macOS: set the flags afterwards. A fork+exec on another
    // thread in between could inherit the descriptor; nothing closes that gap.
    const int fd = ::accept(op.fd, op.args.accept.addr, op.args.accept.len);
    if (fd < 0) return -static_cast<std::int64_t>(errno);
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || ::fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        const int err = errno;
        ::close(fd);
        return -static_cast<std::int64_t>(err);
    }
    return fd;
#else
    return or_errno(::accept4(op.fd, op.args.accept.addr, op.args.accept.len, SOCK_NONBLOCK | SOCK_CLOEXEC));
#endif
}

inline std::int64_t perform(operation& op) noexcept {
    for (;;) {
        std::int64_t r = -EINVAL;
        switch (op.code) {
            case op_code::read: r = or_errno(sys::read(op.fd, op.args.buf.data, op.args.buf.size)); break;
            case op_code::write: r = or_errno(sys::write(op.fd, op.args.buf.data, op.args.buf.size)); break;
            case op_code::readv: r = or_errno(sys::readv(op.fd, op.args.vec.iov, op.args.vec.count)); break;
            case op_code::writev: r = or_errno(sys::writev(op.fd, op.args.vec.iov, op.args.vec.count)); break;
            case op_code::recv: r = or_errno(sys::recv(op.fd, op.args.buf.data, op.args.buf.size, op.flags)); break;
            // MSG_NOSIGNAL: a closed peer is EPIPE, never a SIGPIPE that kills the process.
            case op_code::send:
                r = or_errno(sys::send(op.fd, op.args.buf.data, op.args.buf.size, op.flags | no_sigpipe));
                break;
            case op_code::recvmsg: r = or_errno(sys::recvmsg(op.fd, op.args.msg, op.flags)); break;
            case op_code::sendmsg: r = or_errno(sys::sendmsg(op.fd, op.args.msg, op.flags | no_sigpipe)); break;
            case op_code::accept: r = accept_nonblocking(op); break;
            // Not single syscalls: the backends run these their own way.
            case op_code::connect:
            case op_code::poll:
            case op_code::recv_pooled:
            case op_code::process_exit: return -EINVAL;
            // File operations: never on a loop's thread (perform_blocking).
            case op_code::read_at:
            case op_code::write_at:
            case op_code::readv_at:
            case op_code::writev_at:
            case op_code::fsync:
            case op_code::openat:
            case op_code::openat2:
            case op_code::close:
            case op_code::statx:
            case op_code::renameat:
            case op_code::unlinkat:
            case op_code::mkdirat:
            case op_code::truncate: return -EOPNOTSUPP;
        }
        if (r != -EINTR) return r;
    }
}

inline std::int64_t start_connect(operation& op) noexcept {
    std::int64_t r = or_errno(::connect(op.fd, op.args.connect.addr, op.args.connect.len));
    // Interrupted, the connect goes on in the background: wait for it like EINPROGRESS.
    if (r == -EINTR || r == -EALREADY) return -EINPROGRESS;
    return r;
}

// A non-blocking connect is over when the socket turns writable, but writable
// does not mean connected: SO_ERROR holds the real outcome (ECONNREFUSED...).
// Reporting it here is what keeps a refused connect from surfacing later as EPIPE.
inline std::int64_t finish_connect(operation& op) noexcept {
    int err = 0;
    ::socklen_t len = sizeof err;
    if (::getsockopt(op.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) return -static_cast<std::int64_t>(errno);
    if (err == EINPROGRESS || err == EALREADY) return -EAGAIN;
    return -static_cast<std::int64_t>(err);
}

}  // namespace spindle::reactor
