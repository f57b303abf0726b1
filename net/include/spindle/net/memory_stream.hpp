#pragma once
/// memory_stream: a connected pair of in-memory byte streams, the test double
/// for code written against byte_stream (a protocol handler, a line reader).
/// No descriptors, no kernel: what one end writes, the other reads.
///
///     auto [client, server] = net::memory_stream::pair();
///     co_await client.write_all(request);
///     result<std::size_t> n = co_await server.read_some(buf);
///
/// It behaves like a connected socket pair, with a bounded buffer each way
/// (`capacity` bytes, 64 KiB by default):
/// - a read parks until bytes arrive, or until the peer shuts down its
///   writing or closes (then it reads what is left, then 0: end of stream);
/// - a write parks while the buffer toward the peer is full, and takes what
///   fits (write_some may be partial); writing after this end's
///   shutdown_write, or once the peer has closed, fails with broken_pipe;
/// - close() completes this end's pending operations with
///   operation_canceled; later operations fail with bad_file_descriptor.
///   What this end wrote stays readable, then the peer reads end of stream;
///   what the peer wrote and this end never read is dropped (where a socket
///   would answer with a reset);
/// - a stop token or with_timeout cancels a parked operation; a cancelled
///   read_some or write_some transferred nothing, a cancelled write_all may
///   have written part of its buffers.
///
/// Both ends belong to the loop of the tasks that use them (they wait on
/// spindle::event). Each operation is a task: one small frame from the
/// frame pool, nothing else allocated after pair().

#include <spindle/net/byte_stream.hpp>
#include <spindle/result.hpp>
#include <spindle/task.hpp>

#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <span>
#include <stop_token>
#include <utility>

namespace spindle::net {

namespace detail {
struct memory_link;
}  // namespace detail

class memory_stream {
public:
    /// Two connected ends; each direction buffers up to `capacity` bytes
    /// (at least 1).
    static std::pair<memory_stream, memory_stream> pair(std::size_t capacity = 64 * 1024);

    /// A closed stream.
    memory_stream() noexcept = default;
    memory_stream(memory_stream&& other) noexcept = default;
    memory_stream& operator=(memory_stream&& other) noexcept;
    memory_stream(const memory_stream&) = delete;
    memory_stream& operator=(const memory_stream&) = delete;
    /// Closes this end.
    ~memory_stream() { close(); }

    bool is_open() const noexcept { return static_cast<bool>(m_link); }

    /// Reads at most buf.size() bytes: the count, 0 at end of stream.
    [[nodiscard]] task<result<std::size_t>> read_some(std::span<std::byte> buf, std::stop_token token = {});
    /// Writes at most buf.size() bytes, as many as fit.
    [[nodiscard]] task<result<std::size_t>> write_some(std::span<const std::byte> buf, std::stop_token token = {});
    /// Writes all of `buf`, parking whenever the buffer is full.
    [[nodiscard]] task<result<void>> write_all(std::span<const std::byte> buf, std::stop_token token = {});
    /// Writes all of the buffers, in order.
    [[nodiscard]] task<result<void>> write_all(std::span<const ::iovec> bufs, std::stop_token token = {});

    /// Half-close: the peer reads end of stream after what was written; this
    /// end can still read. Completes at once; safe to call twice.
    result<void> shutdown_write() noexcept;
    /// Closes this end (see above). Safe to call twice.
    void close() noexcept;

    /// Bytes written by this end that the peer has not read yet.
    std::size_t unread_by_peer() const noexcept;

private:
    memory_stream(std::shared_ptr<detail::memory_link> link, int side) noexcept : m_link(std::move(link)), m_side(side) {}

    /// Shared by the two ends and by every operation in flight, so an
    /// operation still parked when both ends are gone finds it when it resumes.
    std::shared_ptr<detail::memory_link> m_link;
    int m_side = 0;
};

static_assert(byte_stream<memory_stream>);

}  // namespace spindle::net
