#pragma once
/// Writing text, and several pieces at once, to any byte_stream:
///
///     co_await net::write_all(stream, "PING\r\n");            // a string_view
///     co_await net::write_all(stream, reply);                 // a std::string
///     co_await net::write_all(stream, {head, body, "\r\n"});  // a gather write
///     co_await net::write_all(stream, pieces);                // a range of pieces
///
/// A piece (const_buffer) is text (anything a std::string_view is made from)
/// or bytes (a contiguous range of std::byte, char or unsigned char: a
/// std::span<const std::byte>, a std::vector<std::byte>). Pieces are viewed,
/// never copied: they must outlive the write, which holds when it is awaited
/// in the expression that makes it.
///
/// A gather write hands the pieces to the stream together: on a socket, one
/// vectored send (sendmsg, or one io_uring request) per attempt, carrying up
/// to 16 pieces. After a partial send it goes on from the first byte not
/// sent, inside a piece or at its start, topping the window up with the next
/// pieces; empty pieces are skipped; more than 16 pieces take one send per
/// 16. The window lives in the write's own frame: nothing is allocated per
/// call beyond that frame, which the frame pool recycles.
///
/// It uses the stream's vectored write_some(std::span<const ::iovec>, token)
/// when the stream has one (stream_socket does), and otherwise the
/// write_all(std::span<const ::iovec>, token) every byte_stream has (a
/// memory_stream, a test double). Like every stream operation it takes a stop
/// token, honours with_timeout, and reports errors in its result: a closed
/// peer is broken_pipe (or connection_reset), never a SIGPIPE. A cancelled
/// or failed gather write may have written some of its pieces.

#include <spindle/net/byte_stream.hpp>
#include <spindle/net/detail/awaitable.hpp>
#include <spindle/net/detail/gather.hpp>
#include <spindle/result.hpp>
#include <spindle/task.hpp>

#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <ranges>
#include <span>
#include <stop_token>
#include <string_view>
#include <type_traits>
#include <utility>

namespace spindle::net {

namespace detail {

template <class T>
concept byte_like = std::same_as<T, std::byte> || std::same_as<T, char> || std::same_as<T, unsigned char>;

/// A contiguous run of bytes that is not text (text goes by string_view, so
/// that a string literal does not take its terminating NUL along).
template <class R>
concept byte_range = !std::is_convertible_v<const R&, std::string_view> && std::ranges::contiguous_range<const R&> &&
                     std::ranges::sized_range<const R&> && byte_like<std::remove_cv_t<std::ranges::range_value_t<const R&>>>;

}  // namespace detail

/// One piece of a write: a view of bytes or text (not a copy).
class const_buffer {
public:
    const_buffer() noexcept = default;
    /// Text: a std::string_view, std::string, string literal, C string.
    template <class T>
        requires std::is_convertible_v<const T&, std::string_view>
    const_buffer(const T& text) noexcept(std::is_nothrow_convertible_v<const T&, std::string_view>) {
        const std::string_view view = text;
        m_data = reinterpret_cast<const std::byte*>(view.data());
        m_size = view.size();
    }
    /// Bytes: std::span<const std::byte>, std::vector<std::byte>, std::array<char, N>, ...
    template <detail::byte_range R>
    const_buffer(const R& bytes) noexcept
        : m_data(reinterpret_cast<const std::byte*>(std::ranges::data(bytes))), m_size(std::ranges::size(bytes)) {}

    const std::byte* data() const noexcept { return m_data; }
    std::size_t size() const noexcept { return m_size; }
    std::span<const std::byte> bytes() const noexcept { return {m_data, m_size}; }

private:
    const std::byte* m_data = nullptr;
    std::size_t m_size = 0;
};

namespace detail {

/// The stream has a vectored write_some of its own (one system call).
template <class S>
concept writes_vectored = requires(S& s, std::span<const ::iovec> bufs, std::stop_token token) {
    { s.write_some(bufs, token) } -> awaitable_of<result<std::size_t>>;
};

/// What iterating a range of pieces gives: a piece, referring to memory that
/// outlives the element (a reference into the range, or a view such as a
/// string_view or a pointer, which may be a temporary itself).
template <class P>
concept piece_reference = std::convertible_to<P, const_buffer> &&
                          (std::is_reference_v<P> || std::same_as<std::remove_cv_t<P>, const_buffer> ||
                           std::is_pointer_v<std::remove_cv_t<P>> || std::ranges::borrowed_range<P>);

template <class R>
concept piece_range = std::ranges::input_range<const R&> && piece_reference<std::ranges::range_reference_t<const R&>>;

using iovec_window = std::array<::iovec, gather_window>;

/// Writes the `count` buffers at the front of `window`, then the pieces from
/// `it` to `end`, topping the window up as it empties.
template <class S, class It, class End>
task<result<void>> write_pieces(S& stream, iovec_window window, std::size_t count, It it, End end, std::stop_token token) {
    for (;;) {
        for (; it != end && count < window.size(); ++it) {
            const const_buffer piece(*it);
            if (piece.size() != 0) window[count++] = {const_cast<std::byte*>(piece.data()), piece.size()};
        }
        if (count == 0) co_return result<void>{};
        const std::span<const ::iovec> pending(window.data(), count);
        if constexpr (writes_vectored<S>) {
            result<std::size_t> n = co_await stream.write_some(pending, token);
            if (!n) co_return n.error();
            count = keep_unsent(std::span(window.data(), count), *n);
        } else {
            // No vectored write of its own: the stream's write_all over the
            // window (a memory_stream copies each piece into its buffer).
            result<void> w = co_await stream.write_all(pending, token);
            if (!w) co_return w;
            count = 0;
        }
    }
}

}  // namespace detail

/// Two to 16 pieces given in braces, `{head, body, "\r\n"}`: made into the
/// iovecs of one gather write at once (empty pieces left out). More pieces
/// go in a range.
class gather_list {
public:
    template <class... P>
        requires(sizeof...(P) >= 2 && sizeof...(P) <= detail::gather_window && (std::is_constructible_v<const_buffer, const P&> && ...))
    gather_list(const P&... pieces) noexcept {
        (append(const_buffer(pieces)), ...);
    }

    std::span<const ::iovec> iovecs() const noexcept { return {m_iovecs.data(), m_count}; }

private:
    void append(const_buffer piece) noexcept {
        if (piece.size() != 0) m_iovecs[m_count++] = {const_cast<std::byte*>(piece.data()), piece.size()};
    }

    detail::iovec_window m_iovecs;
    std::size_t m_count = 0;
};

/// Writes all of `bytes` (text or bytes), across partial writes: the stream's
/// own write_all, without spelling std::as_bytes.
template <byte_stream S>
[[nodiscard]] auto write_all(S& stream, const_buffer bytes, std::stop_token token = {}) {
    return stream.write_all(bytes.bytes(), std::move(token));
}

/// Writes the pieces in braces, in order, as one gather write:
/// `write_all(s, {head, body})`.
template <byte_stream S>
[[nodiscard]] task<result<void>> write_all(S& stream, const gather_list& pieces, std::stop_token token = {}) {
    detail::iovec_window window{};
    const std::span<const ::iovec> given = pieces.iovecs();
    std::copy(given.begin(), given.end(), window.begin());
    const const_buffer* none = nullptr;
    return detail::write_pieces(stream, window, given.size(), none, none, std::move(token));
}

/// Writes every piece of a range (a std::span<const std::string_view>, a
/// std::vector<std::span<const std::byte>>, an array of std::string...), in
/// order, as one gather write.
template <byte_stream S, class R>
    requires detail::piece_range<R>
[[nodiscard]] task<result<void>> write_all(S& stream, const R& pieces, std::stop_token token = {}) {
    return detail::write_pieces(stream, detail::iovec_window{}, 0, std::ranges::begin(pieces), std::ranges::end(pieces),
                                std::move(token));
}

}  // namespace spindle::net
