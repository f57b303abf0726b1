#include <spindle/event.hpp>
#include <spindle/net/memory_stream.hpp>

#include <algorithm>
#include <cstring>
#include <system_error>

namespace spindle::net {

namespace detail {

/// One direction: the bytes one end wrote and the other has not read yet, in
/// a ring of fixed capacity.
struct memory_pipe {
    explicit memory_pipe(std::size_t capacity) : data(new std::byte[capacity]), capacity(capacity) {}

    std::size_t put(std::span<const std::byte> in) noexcept {
        const std::size_t n = std::min(in.size(), capacity - size);
        const std::size_t tail = (head + size) % capacity;
        const std::size_t first = std::min(n, capacity - tail);
        std::memcpy(data.get() + tail, in.data(), first);
        std::memcpy(data.get(), in.data() + first, n - first);
        size += n;
        return n;
    }
    std::size_t take(std::span<std::byte> out) noexcept {
        const std::size_t n = std::min(out.size(), size);
        const std::size_t first = std::min(n, capacity - head);
        std::memcpy(out.data(), data.get() + head, first);
        std::memcpy(out.data() + first, data.get(), n - first);
        head = (head + n) % capacity;
        size -= n;
        return n;
    }

    std::unique_ptr<std::byte[]> data;
    std::size_t capacity;
    std::size_t head = 0;
    std::size_t size = 0;
    bool writer_done = false;  ///< shut down or closed: end of stream after the last byte
    bool reader_gone = false;  ///< the reading end closed: writes fail
    /// Set whenever a parked reader may make progress (bytes arrived, the
    /// writer is done, the reading end closed). Waiters reset it before they
    /// park and look again when woken: a wake is a hint, the state decides.
    event readable;
    /// The same for writers (room freed, the reader gone, the writing end
    /// shut down or closed).
    event writable;
};

struct memory_link {
    explicit memory_link(std::size_t capacity) : from_first(capacity), from_second(capacity) {}
    /// What `side` writes (and the other side reads).
    memory_pipe& written_by(int side) noexcept { return side == 0 ? from_first : from_second; }
    memory_pipe& read_by(int side) noexcept { return written_by(1 - side); }

    memory_pipe from_first;
    memory_pipe from_second;
    bool closed[2] = {false, false};
};

}  // namespace detail

namespace {

using detail::memory_link;
using detail::memory_pipe;

std::error_code not_open() noexcept { return std::make_error_code(std::errc::bad_file_descriptor); }
std::error_code broken_pipe() noexcept { return std::make_error_code(std::errc::broken_pipe); }

// The operations are coroutines of their own, not members: each holds the
// link by value, and takes the side rather than the stream, which may be
// moved or destroyed while they are parked.

task<result<std::size_t>> read_from(std::shared_ptr<memory_link> link, int side, std::span<std::byte> buf,
                                    std::stop_token token) {
    if (!link) co_return not_open();
    if (token.stop_requested()) co_return cancelled_error();
    memory_pipe& in = link->read_by(side);
    for (;;) {
        // Checked on every pass: close() wakes the operations of its end.
        if (link->closed[side]) co_return cancelled_error();
        if (buf.empty()) co_return std::size_t{0};
        if (in.size > 0) {
            const std::size_t n = in.take(buf);
            in.writable.set();
            co_return n;
        }
        if (in.writer_done) co_return std::size_t{0};
        in.readable.reset();
        // Nothing was taken before the wait, so a cancelled read moved nothing.
        if (result<void> data = co_await in.readable.wait(token); !data) co_return data.error();
    }
}

/// One write: at most buf.size() bytes, as many as fit once there is room.
task<result<std::size_t>> write_to(std::shared_ptr<memory_link> link, int side, std::span<const std::byte> buf,
                                   std::stop_token token) {
    if (!link) co_return not_open();
    if (token.stop_requested()) co_return cancelled_error();
    memory_pipe& out = link->written_by(side);
    for (;;) {
        if (link->closed[side]) co_return cancelled_error();
        if (out.writer_done || out.reader_gone) co_return broken_pipe();
        if (buf.empty()) co_return std::size_t{0};
        if (out.size < out.capacity) {
            const std::size_t n = out.put(buf);
            out.readable.set();
            co_return n;
        }
        out.writable.reset();
        if (result<void> room = co_await out.writable.wait(token); !room) co_return room.error();
    }
}

/// Writes `first`, then each of `rest`: one frame for write_all in both forms
/// (a single buffer is passed by value, so it lives in this frame).
task<result<void>> write_all_to(std::shared_ptr<memory_link> link, int side, std::span<const std::byte> first,
                                std::span<const ::iovec> rest, std::stop_token token) {
    if (!link) co_return not_open();
    if (token.stop_requested()) co_return cancelled_error();
    memory_pipe& out = link->written_by(side);
    std::size_t next = 0;
    std::span<const std::byte> buf = first;
    for (;;) {
        while (buf.empty()) {
            if (next == rest.size()) co_return result<void>{};
            buf = {static_cast<const std::byte*>(rest[next].iov_base), rest[next].iov_len};
            ++next;
        }
        if (link->closed[side]) co_return cancelled_error();
        if (out.writer_done || out.reader_gone) co_return broken_pipe();
        if (out.size < out.capacity) {
            buf = buf.subspan(out.put(buf));
            out.readable.set();
            continue;
        }
        out.writable.reset();
        if (result<void> room = co_await out.writable.wait(token); !room) co_return room.error();
    }
}

}  // namespace

std::pair<memory_stream, memory_stream> memory_stream::pair(std::size_t capacity) {
    auto link = std::make_shared<memory_link>(std::max<std::size_t>(capacity, 1));
    return {memory_stream(link, 0), memory_stream(link, 1)};
}

memory_stream& memory_stream::operator=(memory_stream&& other) noexcept {
    if (this != &other) {
        close();
        m_link = std::move(other.m_link);
        m_side = other.m_side;
    }
    return *this;
}

task<result<std::size_t>> memory_stream::read_some(std::span<std::byte> buf, std::stop_token token) {
    return read_from(m_link, m_side, buf, std::move(token));
}

task<result<std::size_t>> memory_stream::write_some(std::span<const std::byte> buf, std::stop_token token) {
    return write_to(m_link, m_side, buf, std::move(token));
}

task<result<void>> memory_stream::write_all(std::span<const std::byte> buf, std::stop_token token) {
    return write_all_to(m_link, m_side, buf, {}, std::move(token));
}

task<result<void>> memory_stream::write_all(std::span<const ::iovec> bufs, std::stop_token token) {
    return write_all_to(m_link, m_side, {}, bufs, std::move(token));
}

result<void> memory_stream::shutdown_write() noexcept {
    if (!m_link) return not_open();
    memory_pipe& out = m_link->written_by(m_side);
    out.writer_done = true;
    out.readable.set();  // the peer's parked reads see end of stream
    out.writable.set();  // this end's parked writes fail with broken_pipe
    return {};
}

void memory_stream::close() noexcept {
    if (!m_link) return;
    m_link->closed[m_side] = true;
    memory_pipe& out = m_link->written_by(m_side);
    memory_pipe& in = m_link->read_by(m_side);
    // What this end wrote stays readable, then the peer reads end of stream.
    out.writer_done = true;
    // What the peer wrote and this end never read is dropped; its writes fail.
    in.reader_gone = true;
    in.size = 0;
    in.head = 0;
    // Wake everyone whose outcome changed: this end's reads and writes
    // (operation_canceled), the peer's reads (end of stream) and writes
    // (broken_pipe). The wakes run in later ticks, and each operation holds
    // the link, so dropping this end's share now is safe.
    out.readable.set();
    out.writable.set();
    in.readable.set();
    in.writable.set();
    m_link.reset();
}

std::size_t memory_stream::unread_by_peer() const noexcept { return m_link ? m_link->written_by(m_side).size : 0; }

}  // namespace spindle::net
