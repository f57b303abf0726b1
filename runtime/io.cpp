// Descriptor I/O: the io_op the runtime hands to its backend, and the one
// error channel. A failure to start an operation (the backend throws: epoll
// refuses the descriptor, a ring that cannot be flushed, no memory) completes
// it with that error at once, so co_await on I/O returns it as a result and
// never throws.

#include "io_access.hpp"
#include "loop_core.hpp"

#include <spindle/io.hpp>
#include <spindle/log.hpp>
#include <spindle/reactor/buffer_pool.hpp>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <system_error>

namespace spindle::detail {


namespace {

constexpr std::size_t reactor_op_size = sizeof(reactor::operation);

io_kind kind_of(reactor::op_code code) noexcept {
    switch (code) {
        case reactor::op_code::read:
        case reactor::op_code::readv:
        case reactor::op_code::recv:
        case reactor::op_code::recvmsg: return io_kind::read;
        case reactor::op_code::write:
        case reactor::op_code::writev:
        case reactor::op_code::send:
        case reactor::op_code::sendmsg: return io_kind::write;
        case reactor::op_code::accept: return io_kind::accept;
        case reactor::op_code::connect: return io_kind::connect;
        case reactor::op_code::poll: return io_kind::poll;
        case reactor::op_code::recv_pooled: return io_kind::read;
        case reactor::op_code::read_at:
        case reactor::op_code::write_at:
        case reactor::op_code::readv_at:
        case reactor::op_code::writev_at:
        case reactor::op_code::fsync:
        case reactor::op_code::openat:
        case reactor::op_code::close:
        case reactor::op_code::statx:
        case reactor::op_code::renameat:
        case reactor::op_code::unlinkat:
        case reactor::op_code::mkdirat:
        case reactor::op_code::truncate:
        case reactor::op_code::openat2: return io_kind::file;
        case reactor::op_code::process_exit: return io_kind::poll;
    }
    return io_kind::poll;
}

relaxed<std::int64_t>& in_flight(loop_core& core, const reactor::operation& op) noexcept {
    return core.counters().io_in_flight[static_cast<std::size_t>(kind_of(op.code))];
}

void on_backend_complete(reactor::operation& op) noexcept {
    // Completions arrive on the loop's thread, inside its poll or a cancel or
    // close it makes: the running loop is the operation's. A persistent poll
    // stays pending, and in flight.
    if (!op.pending())
        if (loop_core* core = current_core_or_null()) --in_flight(*core, op);
    io_access::notify(io_access::owner(op));
}

/// epoll refuses a plain read or write of a regular file, which would wait
/// for the disk on the loop's thread: say once where to go instead.
void refused_regular_file(int fd) noexcept {
    static std::once_flag said;
    try {
        std::call_once(said, [fd] {
            logger()->warn(
                "a read or write of fd {} refused (operation_not_permitted): a regular file would block "
                "the loop on this backend; use spindle::file (docs/files.md)",
                fd);
        });
    } catch (...) {
    }
}

/// -errno for what a backend threw.
std::int64_t error_of(std::exception_ptr e) noexcept {
    try {
        std::rethrow_exception(e);
    } catch (const std::system_error& err) {
        if (err.code().category() == std::system_category() || err.code().category() == std::generic_category())
            return err.code().value() > 0 ? -err.code().value() : -EIO;
        return -EIO;
    } catch (const std::bad_alloc&) {
        return -ENOMEM;
    } catch (...) {
        return -EIO;
    }
}

}  // namespace

io_op::io_op(const io_request& request, complete_fn done) noexcept : m_done(done) {
    static_assert(reactor_op_size <= sizeof(m_backend), "io_op: room for the reactor's operation");
    static_assert(alignof(reactor::operation) <= 8, "io_op: alignment of the reactor's operation");
    auto* op = new (m_backend) reactor::operation{};
    op->complete = &on_backend_complete;
    op->owner = this;
    op->fd = request.fd;
    op->code = static_cast<reactor::op_code>(request.code);
    op->persistent = request.persistent;
    op->stream = request.stream;
    op->events = request.events;  // spindle::readiness and reactor::poll_events agree (io.cpp checks)
    op->flags = request.flags;
    static_assert(sizeof(op->args) == sizeof(request.args));
    std::memcpy(&op->args, &request.args, sizeof(op->args));
}

static_assert(static_cast<std::uint32_t>(readable) == reactor::readable && static_cast<std::uint32_t>(writable) == reactor::writable);
// io_code (public, so it cannot include the reactor) mirrors op_code: every
// value checked here, and the count.
#define SPINDLE_IO_CODE_MATCHES(code, name, direction) \
    static_assert(static_cast<int>(io_code::code) == static_cast<int>(reactor::op_code::code));
SPINDLE_REACTOR_OPERATIONS(SPINDLE_IO_CODE_MATCHES)
#undef SPINDLE_IO_CODE_MATCHES
static_assert(static_cast<std::size_t>(io_code::process_exit) + 1 == reactor::op_code_count);
// file_args mirrors the reactor's, whose pointer the operation carries.
#define SPINDLE_FILE_ARG_MATCHES(field)                                                \
    static_assert(offsetof(file_args, field) == offsetof(reactor::file_args, field) && \
                  sizeof(file_args::field) == sizeof(reactor::file_args::field));
SPINDLE_FILE_ARG_MATCHES(data)
SPINDLE_FILE_ARG_MATCHES(size)
SPINDLE_FILE_ARG_MATCHES(iov)
SPINDLE_FILE_ARG_MATCHES(count)
SPINDLE_FILE_ARG_MATCHES(mode)
SPINDLE_FILE_ARG_MATCHES(offset)
SPINDLE_FILE_ARG_MATCHES(path)
SPINDLE_FILE_ARG_MATCHES(path2)
#undef SPINDLE_FILE_ARG_MATCHES
static_assert(sizeof(file_args) == sizeof(reactor::file_args));
static_assert(reactor::datasync == 1);

bool submit_io(loop_core& core, io_op& o) noexcept {
    reactor::operation& op = io_access::op(o);
    try {
        if (core.backend().submit(op)) return true;
        ++in_flight(core, op);
        return false;
    } catch (...) {
        op.state = reactor::op_state::done;
        op.result = error_of(std::current_exception());
        const bool plain = op.code == reactor::op_code::read || op.code == reactor::op_code::write ||
                           op.code == reactor::op_code::readv || op.code == reactor::op_code::writev;
        if (op.result == -EPERM && plain) refused_regular_file(op.fd);
        return true;
    }
}

void cancel_io(loop_core& core, io_op& o) noexcept {
    if (o.pending()) core.backend().cancel(io_access::op(o));
}

void forget_io(loop_core& core, io_op& o) noexcept {
    if (!o.pending()) return;
    --in_flight(core, io_access::op(o));
    core.backend().forget(io_access::op(o));
}

bool io_op::pending() const noexcept { return io_access::op(*this).pending(); }
std::int64_t io_op::result() const noexcept { return io_access::op(*this).result; }

void give_back(void* lender, std::uint32_t id) noexcept { static_cast<reactor::buffer_pool*>(lender)->give_back(id); }

}  // namespace spindle::detail

namespace spindle {

using detail::io_access;

void io_wait::on_discard() noexcept {
    // An accepted descriptor, descriptors received with SCM_RIGHTS.
    if (!cancelled()) reactor::release_handed_over(io_access::op(*this));
}

spindle::result<borrowed_buffer> borrowed_read_wait::take() noexcept {
    const std::int64_t n = outcome();
    if (n < 0) return std::error_code(static_cast<int>(-n), std::system_category());
    if (n == 0) return borrowed_buffer{};
    const reactor::operation& op = io_access::op(operation());
    reactor::buffer_pool* pool = op.args.pooled.pool;
    pool->delivered();
    return borrowed_buffer(reinterpret_cast<detail::buffer_lender*>(pool), op.args.pooled.id,
                           pool->address(op.args.pooled.id), static_cast<std::uint32_t>(n));
}

void io_wait::describe(std::string& out) const {
    const reactor::operation& op = io_access::op(*this);
    out += reactor::to_string(op.code);
    out += op.code == reactor::op_code::process_exit ? " of pid " : " on fd ";
    out += std::to_string(op.fd);
}

}  // namespace spindle
