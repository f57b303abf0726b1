// The blocking syscall behind each file operation. Interrupted calls are made
// again, except close(2), whose descriptor is gone either way.

#include <spindle/reactor/blocking.hpp>

#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif
#include <sys/uio.h>
#include <unistd.h>

namespace spindle::reactor {

namespace {

std::int64_t or_errno(long long r) noexcept { return r < 0 ? -static_cast<std::int64_t>(errno) : r; }

std::int64_t stat_of(const operation& op, const file_args& a) noexcept {
#if defined(__linux__)
    return or_errno(::statx(op.fd, a.path, op.flags, a.mode, static_cast<struct statx*>(a.data)));
#else
    // No statx: the owner reads a struct stat instead (its buffer fits one).
    auto* st = static_cast<struct stat*>(a.data);
    if (!a.path || !*a.path) return or_errno(::fstat(op.fd, st));
    return or_errno(::fstatat(op.fd, a.path, st, op.flags));
#endif
}

std::int64_t sync_of(const operation& op) noexcept {
#if defined(__APPLE__)
    return or_errno(::fsync(op.fd));  // no fdatasync: fsync does both
#else
    return or_errno((op.flags & datasync) ? ::fdatasync(op.fd) : ::fsync(op.fd));
#endif
}

std::int64_t open_beneath([[maybe_unused]] const operation& op, [[maybe_unused]] const file_args& a) noexcept {
#if defined(__linux__) && defined(SYS_openat2)
    return or_errno(::syscall(SYS_openat2, op.fd, a.path, a.data, a.size));
#else
    return -ENOSYS;
#endif
}

}  // namespace

std::int64_t perform_blocking(const operation& op) noexcept {
    const file_args* a = op.args.file;
    const auto offset = [a] { return static_cast<::off_t>(a->offset); };
    for (;;) {
        std::int64_t r = -EINVAL;
        switch (op.code) {
            case op_code::read_at: r = or_errno(::pread(op.fd, a->data, a->size, offset())); break;
            case op_code::write_at: r = or_errno(::pwrite(op.fd, a->data, a->size, offset())); break;
            case op_code::readv_at: r = or_errno(::preadv(op.fd, a->iov, a->count, offset())); break;
            case op_code::writev_at: r = or_errno(::pwritev(op.fd, a->iov, a->count, offset())); break;
            case op_code::fsync: r = sync_of(op); break;
            case op_code::openat:
                return or_errno(::openat(op.fd, a->path, op.flags | O_CLOEXEC, static_cast<::mode_t>(a->mode)));
            case op_code::openat2: return open_beneath(op, *a);
            case op_code::close: return or_errno(::close(op.fd));
            case op_code::statx: r = stat_of(op, *a); break;
            case op_code::renameat: r = or_errno(::renameat(op.fd, a->path, op.fd, a->path2)); break;
            case op_code::unlinkat: r = or_errno(::unlinkat(op.fd, a->path, op.flags)); break;
            case op_code::mkdirat: r = or_errno(::mkdirat(op.fd, a->path, static_cast<::mode_t>(a->mode))); break;
            case op_code::truncate: r = or_errno(::ftruncate(op.fd, offset())); break;
            case op_code::read:
            case op_code::write:
            case op_code::readv:
            case op_code::writev:
            case op_code::recv:
            case op_code::send:
            case op_code::recvmsg:
            case op_code::sendmsg:
            case op_code::accept:
            case op_code::connect:
            case op_code::poll:
            case op_code::recv_pooled:
            case op_code::process_exit: return -EINVAL;
        }
        if (r != -EINTR) return r;
    }
}

}  // namespace spindle::reactor
