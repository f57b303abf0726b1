#pragma once
// The syscall behind each operation, shared by the readiness backends.
// Every function returns the syscall's value or -errno and never leaves errno
// as its only report.

#include <spindle/reactor/operation.hpp>

#include <cerrno>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

namespace spindle::reactor {

inline std::int64_t or_errno(long long r) noexcept { return r < 0 ? -static_cast<std::int64_t>(errno) : r; }

inline std::int64_t perform(operation& op) noexcept {
    for (;;) {
        std::int64_t r;
        switch (op.code) {
            case op_code::read: r = or_errno(::read(op.fd, op.args.buf.data, op.args.buf.size)); break;
            case op_code::write: r = or_errno(::write(op.fd, op.args.buf.data, op.args.buf.size)); break;
            case op_code::readv: r = or_errno(::readv(op.fd, op.args.vec.iov, op.args.vec.count)); break;
            case op_code::writev: r = or_errno(::writev(op.fd, op.args.vec.iov, op.args.vec.count)); break;
            case op_code::recv: r = or_errno(::recv(op.fd, op.args.buf.data, op.args.buf.size, op.flags)); break;
            // MSG_NOSIGNAL: a closed peer is EPIPE, never a SIGPIPE that kills the process.
            case op_code::send:
                r = or_errno(::send(op.fd, op.args.buf.data, op.args.buf.size, op.flags | MSG_NOSIGNAL));
                break;
            case op_code::recvmsg: r = or_errno(::recvmsg(op.fd, op.args.msg, op.flags)); break;
            case op_code::sendmsg: r = or_errno(::sendmsg(op.fd, op.args.msg, op.flags | MSG_NOSIGNAL)); break;
            case op_code::accept:
                r = or_errno(::accept4(op.fd, op.args.accept.addr, op.args.accept.len, SOCK_NONBLOCK | SOCK_CLOEXEC));
                break;
            default: return -EINVAL;
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
