#pragma once
/// Descriptor I/O inside a task: read, write, vectored forms, readiness waits,
/// and unique_fd. The operation lives in the awaiting frame; the backend tries
/// the syscall first and parks the task only when the descriptor is not ready.
///
/// Every failure arrives as the result's error, a failure to start the
/// operation too (ENOMEM, EBADF, a descriptor epoll refuses...): co_await on
/// I/O never throws.
///
/// Several operations of one direction parked on one descriptor (two reads of
/// a socket, two accepts of a listener) each get whole results, nothing lost
/// or given twice, but which of them is served first is not specified: epoll
/// and kqueue serve them in the order they were made; io_uring in the
/// kernel's order, often the last made first. A protocol that needs an order
/// reads from one task.

#include <spindle/borrowed_buffer.hpp>
#include <spindle/io_wait.hpp>
#include <spindle/park.hpp>
#include <spindle/readiness.hpp>
#include <spindle/result.hpp>

#include <cerrno>
#include <cstddef>
#include <span>
#include <stop_token>
#include <string>
#include <utility>

namespace spindle {

class loop;

/// Reads at most buf.size() bytes; 0 means end of file.
[[nodiscard]] inline io_awaiter<std::size_t> read(int fd, std::span<std::byte> buf, std::stop_token token = {}) {
    return io_awaiter<std::size_t>(std::move(token), buffer_request(fd, io_code::read, buf.data(), buf.size()));
}

/// Writes at most buf.size() bytes (a partial write is possible).
[[nodiscard]] inline io_awaiter<std::size_t> write(int fd, std::span<const std::byte> buf, std::stop_token token = {}) {
    return io_awaiter<std::size_t>(std::move(token),
                                   buffer_request(fd, io_code::write, const_cast<std::byte*>(buf.data()), buf.size()));
}

[[nodiscard]] inline io_awaiter<std::size_t> readv(int fd, std::span<const ::iovec> iov, std::stop_token token = {}) {
    return io_awaiter<std::size_t>(std::move(token), vector_request(fd, io_code::readv, iov));
}

[[nodiscard]] inline io_awaiter<std::size_t> writev(int fd, std::span<const ::iovec> iov, std::stop_token token = {}) {
    return io_awaiter<std::size_t>(std::move(token), vector_request(fd, io_code::writev, iov));
}

/// recv(2); `flags` as for recv.
[[nodiscard]] inline io_awaiter<std::size_t> recv(int fd, std::span<std::byte> buf, int flags = 0,
                                                  std::stop_token token = {}) {
    return io_awaiter<std::size_t>(std::move(token), buffer_request(fd, io_code::recv, buf.data(), buf.size(), flags));
}

/// recv(2) into a buffer the loop lends once data has arrived (see
/// borrowed_buffer.hpp): the buffer holds at least one byte, at most
/// loop_options::read_buffer_size; an empty one means end of stream. A
/// receive waiting for data holds no buffer. `flags` as for recv.
[[nodiscard]] inline parked<borrowed_read_wait> recv_borrowed(int fd, int flags = 0, std::stop_token token = {}) {
    return parked<borrowed_read_wait>(std::move(token), buffer_request(fd, io_code::recv_pooled, nullptr, 0, flags));
}

/// send(2); never raises SIGPIPE (MSG_NOSIGNAL is always added).
[[nodiscard]] inline io_awaiter<std::size_t> send(int fd, std::span<const std::byte> buf, int flags = 0,
                                                  std::stop_token token = {}) {
    return io_awaiter<std::size_t>(
        std::move(token), buffer_request(fd, io_code::send, const_cast<std::byte*>(buf.data()), buf.size(), flags));
}

[[nodiscard]] inline io_awaiter<std::size_t> recvmsg(int fd, ::msghdr& msg, int flags = 0, std::stop_token token = {}) {
    return io_awaiter<std::size_t>(std::move(token), message_request(fd, io_code::recvmsg, &msg, flags));
}

[[nodiscard]] inline io_awaiter<std::size_t> sendmsg(int fd, const ::msghdr& msg, int flags = 0,
                                                     std::stop_token token = {}) {
    return io_awaiter<std::size_t>(std::move(token),
                                   message_request(fd, io_code::sendmsg, const_cast<::msghdr*>(&msg), flags));
}

/// Accepts a connection; the new descriptor is non-blocking and close-on-exec.
/// If the awaiting task is destroyed after the accept completed but before it
/// resumed, the new descriptor is closed: it never leaks.
[[nodiscard]] inline io_awaiter<int> accept(int fd, ::sockaddr* addr = nullptr, ::socklen_t* len = nullptr,
                                            std::stop_token token = {}) {
    io_request r;
    r.fd = fd;
    r.code = io_code::accept;
    r.args.accept = {addr, len};
    return io_awaiter<int>(std::move(token), r);
}

/// Connects a non-blocking socket. Completes with 0, or with the socket's own
/// error (SO_ERROR), e.g. connection_refused, never a later EPIPE.
[[nodiscard]] inline io_awaiter<int> connect(int fd, const ::sockaddr* addr, ::socklen_t len,
                                             std::stop_token token = {}) {
    io_request r;
    r.fd = fd;
    r.code = io_code::connect;
    r.args.connect = {addr, len};
    return io_awaiter<int>(std::move(token), r);
}

/// One-shot readiness waits; complete with the readiness flags seen.
[[nodiscard]] inline io_awaiter<int> wait_readable(int fd, std::stop_token token = {}) {
    return io_awaiter<int>(std::move(token), poll_request(fd, readable));
}
[[nodiscard]] inline io_awaiter<int> wait_writable(int fd, std::stop_token token = {}) {
    return io_awaiter<int>(std::move(token), poll_request(fd, writable));
}

/// Owns a descriptor; closing it through its loop completes any operation still
/// pending on it with operation_canceled.
class unique_fd {
public:
    unique_fd() noexcept = default;
    explicit unique_fd(int fd) noexcept;
    unique_fd(int fd, loop* owner) noexcept : m_fd(fd), m_loop(owner) {}
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
    void adopt_current_loop() noexcept;

private:
    int m_fd = -1;
    loop* m_loop = nullptr;
};

}  // namespace spindle
