#pragma once
/// A descriptor operation as a wait of the park protocol, for awaitables of
/// descriptor I/O outside the runtime (spindle::net's sendmsg and recvmsg
/// keep their msghdr in the awaiting frame this way):
///
///     class my_recvmsg_wait : public spindle::io_result_wait<std::size_t> {
///     public:
///         explicit my_recvmsg_wait(int fd) noexcept
///             : io_result_wait(spindle::message_request(fd, spindle::io_code::recvmsg, &m_msg, 0)) {}
///     private:
///         ::msghdr m_msg{};
///     };
///     co_await spindle::parked<my_recvmsg_wait>(token, fd);  // result<std::size_t>
///
/// An io_request names the operation (io_code) and its arguments; the
/// builders below make one. The operation lives in the wait, so it costs no
/// allocation. io_wait submits it when awaited (most complete there, without
/// parking), cancels it through the backend, and on a completion nobody sees
/// closes what it handed over (an accepted descriptor). outcome() is the
/// syscall-style answer: a count or a descriptor, or -errno (-ECANCELED when
/// cancelled). io_result_wait<R> answers result<R> from it.

#include <spindle/borrowed_buffer.hpp>
#include <spindle/detail/engine.hpp>
#include <spindle/detail/io_op.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace spindle {

/// What a descriptor operation does (read, write, recvmsg, accept, poll...).
using io_code = detail::io_code;
/// A descriptor operation and its arguments, as the builders below make it.
using io_request = detail::io_request;

/// A descriptor operation as a wait of the park protocol.
class io_wait : public waiter, private detail::io_op {
public:
    explicit io_wait(const io_request& request) noexcept : io_op(request, &on_complete) {}
    ~io_wait() {
        // Submitted but never parked (await_suspend threw outside a task).
        if (pending()) detail::forget_io(*m_core, *this);
    }

    /// Submits: most operations complete here, without parking.
    bool ready() {
        m_core = &detail::current_core();
        return detail::submit_io(*m_core, *this);
    }
    void on_park() noexcept {}
    void on_cancel() noexcept { detail::cancel_io(*m_core, *this); }
    void on_abandon() noexcept { detail::forget_io(*m_core, *this); }
    /// A completion nobody will see: close what it handed over (an accepted
    /// descriptor, descriptors received with SCM_RIGHTS).
    void on_discard() noexcept;
    void describe(std::string& out) const;

protected:
    /// The syscall-style outcome: a count or descriptor, or -errno.
    std::int64_t outcome() const noexcept { return cancelled() ? -ECANCELED : result(); }
    const detail::io_op& operation() const noexcept { return *this; }

private:
    static void on_complete(detail::io_op& op) noexcept { static_cast<io_wait&>(op).complete(); }

    detail::loop_core* m_core = nullptr;
};

/// Completes with a byte count (or a descriptor, or 0) as `R`.
template <class R>
class io_result_wait : public io_wait {
public:
    using io_wait::io_wait;
    spindle::result<R> take() noexcept { return spindle::result<R>::from_syscall(outcome()); }
};

template <class R>
using io_awaiter = parked<io_result_wait<R>>;

/// A pooled receive: completes with the buffer the loop lent for the data.
class borrowed_read_wait : public io_wait {
public:
    using io_wait::io_wait;
    spindle::result<borrowed_buffer> take() noexcept;
};

inline io_request buffer_request(int fd, io_code code, void* data, std::size_t size, int flags = 0) noexcept {
    io_request r;
    r.fd = fd;
    r.code = code;
    r.flags = flags;
    r.args.buf = {data, size};
    return r;
}

inline io_request vector_request(int fd, io_code code, std::span<const ::iovec> iov) noexcept {
    io_request r;
    r.fd = fd;
    r.code = code;
    r.args.vec = {iov.data(), static_cast<int>(iov.size())};
    return r;
}

inline io_request message_request(int fd, io_code code, ::msghdr* msg, int flags) noexcept {
    io_request r;
    r.fd = fd;
    r.code = code;
    r.flags = flags;
    r.args.msg = msg;
    return r;
}

/// `r` as a receive on a byte-stream socket (reactor::operation::stream):
/// for the stream types of spindle::net, which know what their socket is.
inline io_request on_stream(io_request r) noexcept {
    r.stream = true;
    return r;
}

inline io_request poll_request(int fd, std::uint32_t events, bool persistent = false) noexcept {
    io_request r;
    r.fd = fd;
    r.code = io_code::poll;
    r.events = events;
    r.persistent = persistent;
    return r;
}

}  // namespace spindle
