#pragma once
/// Descriptor I/O inside a task: read, write, vectored forms, readiness waits,
/// and unique_fd. The operation lives in the awaiting frame; the backend tries
/// the syscall first and parks the task only when the descriptor is not ready.

#include <spindle/detail/cancel_hook.hpp>
#include <spindle/loop.hpp>
#include <spindle/reactor/operation.hpp>
#include <spindle/result.hpp>

#include <cstddef>
#include <span>
#include <stop_token>
#include <utility>

namespace spindle {

namespace detail {

class io_awaiter_base : protected reactor::operation {
public:
    io_awaiter_base(const io_awaiter_base&) = delete;
    io_awaiter_base& operator=(const io_awaiter_base&) = delete;

    bool await_ready() {
        if (m_token.stop_requested()) {
            result = -ECANCELED;
            return true;
        }
        m_loop = &loop::current();
        complete = &on_complete;
        return m_loop->io().submit(*this);
    }
    void await_suspend(std::coroutine_handle<> h) {
        m_task = &current_task();
        m_task->m_resume = h;
        m_cancel.arm(m_token, this);
        park_cancellable(*m_task, this);
    }
    void on_cancel() noexcept { m_loop->io().cancel(*this); }
    void describe(std::string& out) const;

protected:
    explicit io_awaiter_base(std::stop_token token) noexcept : m_token(std::move(token)) {}
    ~io_awaiter_base() {
        // Destroyed while parked: the backend must forget the operation.
        if (pending()) m_loop->io().forget(*this);
    }
    std::int64_t finish() noexcept {
        unpark(m_task);
        m_cancel.disarm();
        return result;
    }

private:
    static void on_complete(reactor::operation& op) noexcept {
        auto& self = static_cast<io_awaiter_base&>(op);
        schedule(*self.m_task);
    }

    std::stop_token m_token;
    loop* m_loop = nullptr;
    task_header* m_task = nullptr;
    cancel_hook<io_awaiter_base> m_cancel;
};

/// Completes with a byte count (or a descriptor, or 0) as `R`.
template <class R>
class io_awaiter : public io_awaiter_base {
public:
    template <class Setup>
    io_awaiter(int fd, reactor::op_code code, std::stop_token token, Setup&& setup) noexcept
        : io_awaiter_base(std::move(token)) {
        this->fd = fd;
        this->code = code;
        setup(static_cast<reactor::operation&>(*this));
    }
    spindle::result<R> await_resume() noexcept { return spindle::result<R>::from_syscall(finish()); }
};

}  // namespace detail

/// Reads at most buf.size() bytes; 0 means end of file.
[[nodiscard]] inline detail::io_awaiter<std::size_t> read(int fd, std::span<std::byte> buf, std::stop_token token = {}) {
    return {fd, reactor::op_code::read, std::move(token), [&](reactor::operation& op) {
                op.args.buf = {buf.data(), buf.size()};
            }};
}

/// Writes at most buf.size() bytes (a partial write is possible).
[[nodiscard]] inline detail::io_awaiter<std::size_t> write(int fd, std::span<const std::byte> buf, std::stop_token token = {}) {
    return {fd, reactor::op_code::write, std::move(token), [&](reactor::operation& op) {
                op.args.buf = {const_cast<std::byte*>(buf.data()), buf.size()};
            }};
}

[[nodiscard]] inline detail::io_awaiter<std::size_t> readv(int fd, std::span<const ::iovec> iov, std::stop_token token = {}) {
    return {fd, reactor::op_code::readv, std::move(token), [&](reactor::operation& op) {
                op.args.vec = {iov.data(), static_cast<int>(iov.size())};
            }};
}

[[nodiscard]] inline detail::io_awaiter<std::size_t> writev(int fd, std::span<const ::iovec> iov, std::stop_token token = {}) {
    return {fd, reactor::op_code::writev, std::move(token), [&](reactor::operation& op) {
                op.args.vec = {iov.data(), static_cast<int>(iov.size())};
            }};
}

/// recv(2); `flags` as for recv.
[[nodiscard]] inline detail::io_awaiter<std::size_t> recv(int fd, std::span<std::byte> buf, int flags = 0, std::stop_token token = {}) {
    return {fd, reactor::op_code::recv, std::move(token), [&](reactor::operation& op) {
                op.args.buf = {buf.data(), buf.size()};
                op.flags = flags;
            }};
}

/// send(2); never raises SIGPIPE (MSG_NOSIGNAL is always added).
[[nodiscard]] inline detail::io_awaiter<std::size_t> send(int fd, std::span<const std::byte> buf, int flags = 0, std::stop_token token = {}) {
    return {fd, reactor::op_code::send, std::move(token), [&](reactor::operation& op) {
                op.args.buf = {const_cast<std::byte*>(buf.data()), buf.size()};
                op.flags = flags;
            }};
}

[[nodiscard]] inline detail::io_awaiter<std::size_t> recvmsg(int fd, ::msghdr& msg, int flags = 0, std::stop_token token = {}) {
    return {fd, reactor::op_code::recvmsg, std::move(token), [&](reactor::operation& op) {
                op.args.msg = &msg;
                op.flags = flags;
            }};
}

[[nodiscard]] inline detail::io_awaiter<std::size_t> sendmsg(int fd, const ::msghdr& msg, int flags = 0, std::stop_token token = {}) {
    return {fd, reactor::op_code::sendmsg, std::move(token), [&](reactor::operation& op) {
                op.args.msg = const_cast<::msghdr*>(&msg);
                op.flags = flags;
            }};
}

/// Accepts a connection; the new descriptor is non-blocking and close-on-exec.
[[nodiscard]] inline detail::io_awaiter<int> accept(int fd, ::sockaddr* addr = nullptr, ::socklen_t* len = nullptr,
                                                    std::stop_token token = {}) {
    return {fd, reactor::op_code::accept, std::move(token), [&](reactor::operation& op) {
                op.args.accept = {addr, len};
            }};
}

/// Connects a non-blocking socket. Completes with 0, or with the socket's own
/// error (SO_ERROR), e.g. connection_refused, never a later EPIPE.
[[nodiscard]] inline detail::io_awaiter<int> connect(int fd, const ::sockaddr* addr, ::socklen_t len, std::stop_token token = {}) {
    return {fd, reactor::op_code::connect, std::move(token), [&](reactor::operation& op) {
                op.args.connect = {addr, len};
            }};
}

/// One-shot readiness waits.
[[nodiscard]] inline detail::io_awaiter<int> wait_readable(int fd, std::stop_token token = {}) {
    return {fd, reactor::op_code::poll, std::move(token), [](reactor::operation& op) { op.events = reactor::readable; }};
}
[[nodiscard]] inline detail::io_awaiter<int> wait_writable(int fd, std::stop_token token = {}) {
    return {fd, reactor::op_code::poll, std::move(token), [](reactor::operation& op) { op.events = reactor::writable; }};
}

/// Owns a descriptor; closing it through its loop completes any operation still
/// pending on it with operation_canceled.
class unique_fd {
public:
    unique_fd() noexcept = default;
    explicit unique_fd(int fd, loop* owner = loop::current_or_null()) noexcept : m_fd(fd), m_loop(owner) {}
    unique_fd(unique_fd&& other) noexcept
        : m_fd(std::exchange(other.m_fd, -1)), m_loop(other.m_loop) {}
    unique_fd& operator=(unique_fd&& other) noexcept {
        if (this != &other) {
            reset();
            m_fd = std::exchange(other.m_fd, -1);
            m_loop = other.m_loop;
        }
        return *this;
    }
    unique_fd(const unique_fd&) = delete;
    unique_fd& operator=(const unique_fd&) = delete;
    ~unique_fd() { reset(); }

    int get() const noexcept { return m_fd; }
    explicit operator bool() const noexcept { return m_fd >= 0; }
    int release() noexcept { return std::exchange(m_fd, -1); }
    /// Closes the descriptor: through its loop when that loop is still alive
    /// (pending operations complete with operation_canceled), plainly otherwise.
    void reset() noexcept;
    loop* owner() const noexcept { return m_loop; }
    /// A descriptor made outside any loop belongs to the first loop that uses it.
    void adopt_current_loop() noexcept {
        if (!m_loop) m_loop = loop::current_or_null();
    }

private:
    int m_fd = -1;
    loop* m_loop = nullptr;
};

}  // namespace spindle
