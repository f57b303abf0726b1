#pragma once
// sendmsg/recvmsg awaiters that keep their msghdr in the awaiting frame, so a
// datagram or a vectored send costs no allocation and never raises SIGPIPE.

#include <spindle/io.hpp>
#include <spindle/net/address.hpp>
#include <spindle/net/error.hpp>

#include <span>

namespace spindle::net::detail {

class send_msg_awaiter : public spindle::detail::io_awaiter<std::size_t> {
public:
    send_msg_awaiter(int fd, std::span<const ::iovec> iov, const address* to, std::stop_token token) noexcept
        : io_awaiter(fd, reactor::op_code::sendmsg, std::move(token), [](reactor::operation&) {}) {
        init(iov, to);
    }
    send_msg_awaiter(int fd, std::span<const std::byte> buf, const address* to, std::stop_token token) noexcept
        : io_awaiter(fd, reactor::op_code::sendmsg, std::move(token), [](reactor::operation&) {}) {
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
        args.msg = &m_msg;
    }
    ::msghdr m_msg;
    ::iovec m_one{};
};

/// Completes with the datagram's size, or datagram_truncated when it did not
/// fit (the buffer then holds its first buf.size() bytes).
class recv_msg_awaiter : public spindle::detail::io_awaiter<std::size_t> {
public:
    recv_msg_awaiter(int fd, std::span<std::byte> buf, address* from, std::stop_token token) noexcept
        : io_awaiter(fd, reactor::op_code::recvmsg, std::move(token), [](reactor::operation&) {}), m_from(from) {
        m_one = {buf.data(), buf.size()};
        m_msg = {};
        m_msg.msg_iov = &m_one;
        m_msg.msg_iovlen = 1;
        if (from) {
            m_msg.msg_name = from->native();
            m_msg.msg_namelen = address::capacity();
        }
        args.msg = &m_msg;
    }
    spindle::result<std::size_t> await_resume() noexcept {
        spindle::result<std::size_t> r = io_awaiter::await_resume();
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

}  // namespace spindle::net::detail
