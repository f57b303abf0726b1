#pragma once
/// A connected byte stream (TCP or Unix): reads, writes, half-close.
///
/// End of stream is a successful read of 0 bytes, never an error; read_exact
/// reports it as errc::end_of_stream. A reset peer is connection_reset (on a
/// read) or broken_pipe (on a write); no write raises SIGPIPE.
///
/// A stream_socket (so tcp_stream and unix_stream) is a byte_stream
/// (byte_stream.hpp): its shutdown_write completes at once.

#include <spindle/net/byte_stream.hpp>
#include <spindle/net/detail/msg_awaiter.hpp>
#include <spindle/net/socket.hpp>
#include <spindle/task.hpp>

#include <span>
#include <stop_token>

namespace spindle::net {

class stream_socket : public socket_base {
public:
    using socket_base::socket_base;

    /// Reads at most buf.size() bytes: the count, 0 at end of stream.
    [[nodiscard]] auto read_some(std::span<std::byte> buf, std::stop_token token = {}) {
        return spindle::io_awaiter<std::size_t>(
            std::move(token),
            spindle::on_stream(spindle::buffer_request(fd_for_io(), spindle::io_code::recv, buf.data(), buf.size())));
    }
    /// Reads into a buffer the loop lends once data has arrived
    /// (borrowed_buffer.hpp): at least one byte, empty at end of stream. While
    /// it waits, the connection holds no read buffer.
    [[nodiscard]] auto read_borrowed(std::stop_token token = {}) {
        return parked<spindle::borrowed_read_wait>(
            std::move(token),
            spindle::on_stream(spindle::buffer_request(fd_for_io(), spindle::io_code::recv_pooled, nullptr, 0)));
    }
    /// Writes at most buf.size() bytes (a partial write is possible).
    [[nodiscard]] auto write_some(std::span<const std::byte> buf, std::stop_token token = {}) {
        return spindle::send(fd_for_io(), buf, 0, std::move(token));
    }
    /// One vectored send (sendmsg) of at most the buffers' total size; a
    /// partial send may end inside any buffer. The buffers and the iovec
    /// array must outlive the operation.
    [[nodiscard]] detail::send_msg_awaiter write_some(std::span<const ::iovec> bufs, std::stop_token token = {}) {
        return detail::send_msg_awaiter(std::move(token), fd_for_io(), bufs, nullptr);
    }

    /// Fills `buf` completely, or fails (end_of_stream if the peer closed first;
    /// what arrived before stays in buf).
    task<result<void>> read_exact(std::span<std::byte> buf, std::stop_token token = {});
    /// Writes all of `buf`, across partial writes.
    task<result<void>> write_all(std::span<const std::byte> buf, std::stop_token token = {});
    /// Writes all of the buffers, in order, across partial sends: one sendmsg
    /// per attempt carrying up to 16 buffers (detail::gather_window), empty
    /// ones skipped; more buffers take one send per 16. The caller's iovecs
    /// are not modified. Allocates nothing beyond the operation's frame.
    task<result<void>> write_all(std::span<const ::iovec> bufs, std::stop_token token = {});

    /// Half-close: the peer reads end of stream; this side can still read.
    result<void> shutdown_write() noexcept;
    result<address> peer_address() const;
};

static_assert(byte_stream<stream_socket>);
static_assert(reads_borrowed<stream_socket>);

}  // namespace spindle::net
