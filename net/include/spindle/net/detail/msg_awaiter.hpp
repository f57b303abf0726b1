#pragma once
// sendmsg/recvmsg awaiters that keep their msghdr in the awaiting frame, so a
// datagram or a vectored send costs no allocation and never raises SIGPIPE.

#include <spindle/io_wait.hpp>
#include <spindle/net/address.hpp>
#include <spindle/net/error.hpp>

#include <span>

namespace spindle::net::detail {

class send_msg_wait : public spindle::io_result_wait<std::size_t> {
public:
    send_msg_wait(int fd, std::span<const ::iovec> iov, const address* to) noexcept
        : io_result_wait(spindle::message_request(fd, spindle::io_code::sendmsg, &m_msg, 0)) {
        init(iov, to);
    }
    send_msg_wait(int fd, std::span<const std::byte> buf, const address* to) noexcept
        : io_result_wait(spindle::message_request(fd, spindle::io_code::sendmsg, &m_msg, 0)) {
        m_one = {const_cast<std::byte*>(buf.data()), buf.size()};
        init({&m_one, 1}, to);
    }

private:
    void init(std::span<const ::iovec> iov, const address* to) noexcept {
        m_msg = {};
        m_msg.msg_iov = const_cast<::iovec*>(iov.data());
        m_msg.msg_iovlen = iov.size();
        if (to) {
            m_msg.msg_name = const_cast<::sockaddr*>(to->native());
            m_msg.msg_namelen = to->size();
        }
    }
    ::msghdr m_msg;
    ::iovec m_one{};
};

using send_msg_awaiter = spindle::parked<send_msg_wait>;

/// Completes with the datagram's size, or datagram_truncated when it did not
/// fit (the buffer then holds its first buf.size() bytes).
class recv_msg_wait : public spindle::io_wait {
public:
    recv_msg_wait(int fd, std::span<std::byte> buf, address* from) noexcept
        : io_wait(spindle::message_request(fd, spindle::io_code::recvmsg, &m_msg, 0)), m_from(from) {
        m_one = {buf.data(), buf.size()};
        m_msg = {};
        m_msg.msg_iov = &m_one;
        m_msg.msg_iovlen = 1;
        if (from) {
            m_msg.msg_name = from->native();
            m_msg.msg_namelen = address::capacity();
        }
    }
    spindle::result<std::size_t> take() noexcept {
        auto r = spindle::result<std::size_t>::from_syscall(outcome());
        if (!r) return r;
        if (m_from) m_from->set_size(m_msg.msg_namelen);
        if (m_msg.msg_flags & MSG_TRUNC) return make_error_code(errc::datagram_truncated);
        return r;
    }

private:
    ::msghdr m_msg;
    ::iovec m_one{};
    address* m_from;
};

using recv_msg_awaiter = spindle::parked<recv_msg_wait>;

}  // namespace spindle::net::detail
