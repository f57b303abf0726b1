#pragma once
/// Buffered reads over any byte_stream: lines (or any delimiter) and exact
/// counts. The buffer is allocated once; reads then cost no allocation.
///
///     net::buffered_reader reader(tcp);          // over a socket
///     net::basic_buffered_reader other(memory);  // over any byte_stream
///
///     auto lines = reader.lines("\r\n", 8192);   // every line, in turn
///     while (auto line = co_await lines.next()) {
///         if (!*line) break;                     // line_too_long, a failed read
///         handle(**line);
///     }

#include <spindle/async_generator.hpp>
#include <spindle/budget.hpp>
#include <spindle/net/byte_stream.hpp>
#include <spindle/net/error.hpp>
#include <spindle/net/stream.hpp>
#include <spindle/park.hpp>
#include <spindle/task.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string_view>

namespace spindle::net {

namespace detail {

/// The buffer of basic_buffered_reader and its delimiter search, which do not
/// depend on the stream: compiled once, in buffered_reader.cpp.
class read_buffer {
public:
    explicit read_buffer(std::size_t capacity);

    std::span<const std::byte> buffered() const noexcept { return {m_data.get() + m_begin, m_end - m_begin}; }
    void consume(std::size_t n) noexcept;

    /// One step of read_until: the line through `delimiter` (consumed; the
    /// view stays valid until the buffer is next written), or invalid_argument
    /// or line_too_long; nullopt when more bytes are needed, with room made
    /// for them.
    std::optional<result<std::string_view>> find_line(std::string_view delimiter, std::size_t max);
    /// Makes the next find_line search every buffered byte. Each read_until
    /// starts with it: a call that ended without a line (line_too_long, end
    /// of stream, an error, a cancellation) searched with its own delimiter
    /// and limit, and the next call need not share them.
    void restart_search() noexcept { m_scanned = 0; }
    /// Where the next read goes: at least one byte, after what is buffered.
    std::span<std::byte> space() {
        make_room(1);
        return {m_data.get() + m_end, m_capacity - m_end};
    }
    /// `n` bytes were read into space().
    void commit(std::size_t n) noexcept { m_end += n; }
    /// Moves buffered bytes to the front of `out`: the count moved.
    std::size_t take(std::span<std::byte> out) noexcept;

private:
    void make_room(std::size_t want);

    std::unique_ptr<std::byte[]> m_data;
    std::size_t m_capacity;
    std::size_t m_begin = 0;
    std::size_t m_end = 0;
    /// Bytes after m_begin already searched for the delimiter, within one
    /// read_until.
    std::size_t m_scanned = 0;
};

}  // namespace detail

template <byte_stream Stream>
class basic_buffered_reader {
public:
    /// Reads from `stream`, which must outlive the reader.
    explicit basic_buffered_reader(Stream& stream, std::size_t capacity = 16 * 1024)
        : m_stream(&stream), m_buffer(capacity) {}

    /// The bytes up to and including the next `delimiter`. The view is valid
    /// until the next call on this reader. line_too_long when `max` bytes
    /// arrive without a delimiter (they stay buffered); end_of_stream when the
    /// peer closes first (what arrived stays in buffered()).
    ///
    /// Served from the buffer, a call still spends the task's budget and
    /// stops a cancelled task (spindle/budget.hpp), as a read would.
    task<result<std::string_view>> read_until(std::string_view delimiter, std::size_t max, std::stop_token token = {}) {
        if (!m_buffer.buffered().empty()) {
            if (result<void> go_on = co_await consume_budget(token); !go_on) co_return go_on.error();
        }
        m_buffer.restart_search();
        for (;;) {
            if (std::optional<result<std::string_view>> found = m_buffer.find_line(delimiter, max)) co_return *found;
            // The stream's own read, awaited here rather than through fill(),
            // so a line costs no frame beyond this one.
            result<std::size_t> n = co_await m_stream->read_some(m_buffer.space(), token);
            if (!n) co_return n.error();
            if (*n == 0) co_return make_error_code(errc::end_of_stream);
            m_buffer.commit(*n);
        }
    }

    /// The longest line lines() takes unless told otherwise.
    static constexpr std::size_t default_line_limit = 64 * 1024;

    /// Every line through `delimiter`, in turn, as read_until(delimiter, max,
    /// token) would give them, without a task frame per line; each view is
    /// valid until the next next(). The stream ends at the peer's close
    /// (bytes after the last delimiter stay in buffered()) and at a
    /// cancellation (`token`, or the consumer's next(token), with_timeout or
    /// join_handle::cancel; what arrived stays buffered, and a new lines()
    /// goes on from there); any other failure (line_too_long, a failed read)
    /// is yielded once, then the stream ends. A buffered line spends the
    /// task's budget and stops a cancelled task, as read_until does.
    /// `delimiter` must outlive the generator (a literal, typically), as
    /// this reader must.
    async_generator<result<std::string_view>> lines(std::string_view delimiter = "\n",
                                                    std::size_t max = default_line_limit, std::stop_token token = {}) {
        for (;;) {
            // The budget is spent by the yield; the cancel check is what
            // read_until's consume_budget adds for a buffered line.
            if (!m_buffer.buffered().empty() && spindle::cancel_requested(token)) co_return;
            m_buffer.restart_search();
            for (;;) {
                if (std::optional<result<std::string_view>> found = m_buffer.find_line(delimiter, max)) {
                    const bool failed = !*found;
                    co_yield *found;
                    if (failed) co_return;
                    break;
                }
                result<std::size_t> n = co_await m_stream->read_some(m_buffer.space(), token);
                if (!n) {
                    if (n.error() != std::errc::operation_canceled) co_yield result<std::string_view>(n.error());
                    co_return;
                }
                if (*n == 0) co_return;
                m_buffer.commit(*n);
            }
        }
    }
    /// lines() of "\n" with a stop token.
    async_generator<result<std::string_view>> lines(std::stop_token token) {
        return lines("\n", default_line_limit, std::move(token));
    }

    /// Fills `out` from the buffer, then from the stream; end_of_stream when
    /// the peer closes first.
    task<result<void>> read_exact(std::span<std::byte> out, std::stop_token token = {}) {
        if (!m_buffer.buffered().empty()) {
            if (result<void> go_on = co_await consume_budget(token); !go_on) co_return go_on.error();
        }
        out = out.subspan(m_buffer.take(out));
        while (!out.empty()) {
            result<std::size_t> n = co_await m_stream->read_some(out, token);
            if (!n) co_return n.error();
            if (*n == 0) co_return make_error_code(errc::end_of_stream);
            out = out.subspan(*n);
        }
        co_return result<void>{};
    }

    /// Reads once more from the stream into the buffer: the count added, 0 at
    /// end of stream.
    task<result<std::size_t>> fill(std::stop_token token = {}) {
        result<std::size_t> n = co_await m_stream->read_some(m_buffer.space(), std::move(token));
        if (n) m_buffer.commit(*n);
        co_return n;
    }

    /// What is buffered and not yet consumed.
    std::span<const std::byte> buffered() const noexcept { return m_buffer.buffered(); }
    void consume(std::size_t n) noexcept { m_buffer.consume(n); }

private:
    Stream* m_stream;
    detail::read_buffer m_buffer;
};

/// The reader over a socket (a tcp_stream or unix_stream): compiled once, in
/// the library.
using buffered_reader = basic_buffered_reader<stream_socket>;
extern template class basic_buffered_reader<stream_socket>;

}  // namespace spindle::net
