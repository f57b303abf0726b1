#pragma once
/// byte_stream: what code that reads and writes a connection needs of it. A
/// socket (tcp_stream, unix_stream), the in-memory test double (memory_stream)
/// and an encrypted stream are all byte streams; code that reads lines or
/// serves requests takes one as a template parameter, never a tcp_stream&, so
/// any of them plugs in.
///
/// The contract, for `S& s` and a `std::stop_token token`:
///
/// - `co_await s.read_some(std::span<std::byte> buf, token)` yields
///   `result<std::size_t>`: at most buf.size() bytes, parking until at least
///   one is there. 0 means end of stream (the peer shut down its writing or
///   closed), never an error; an empty `buf` also yields 0.
/// - `co_await s.write_some(std::span<const std::byte> buf, token)` yields
///   `result<std::size_t>`: at most buf.size() bytes (a partial write is
///   possible), parking while none can be taken.
/// - `co_await s.write_all(std::span<const std::byte> buf, token)` and the
///   vectored `co_await s.write_all(std::span<const ::iovec> bufs, token)`
///   yield `result<void>`: everything, across partial writes, or an error.
/// - Optionally, a vectored `co_await s.write_some(std::span<const ::iovec>
///   bufs, token)` yielding `result<std::size_t>`: one write of at most the
///   buffers' total, possibly partial. Text and gather writes on any stream
///   (net::write_all, write.hpp) drive it when the stream has one, and go
///   through write_all(bufs) otherwise.
/// - Optionally, `co_await s.read_borrowed(token)` yielding
///   `result<borrowed_buffer>`: the bytes that arrived, in a buffer lent by
///   the loop only once they are there (borrowed_buffer.hpp), empty at end of
///   stream. Sockets offer it; code that serves many mostly idle connections
///   uses it when the stream has it (net::reads_borrowed), so that a waiting
///   connection holds no buffer.
/// - Half-close ends this side's writing: the peer reads end of stream after
///   everything written before; this side can still read. A stream whose
///   half-close completes at once (sockets, memory_stream) offers
///   `s.shutdown_write()` returning `result<void>`; one that has to write
///   first (an encrypted stream's close_notify) offers
///   `co_await s.shutdown_write(token)` yielding `result<void>`, an operation
///   like the others below. Generic code writes
///   `co_await net::shutdown_write(s, token)`, which takes either (and never
///   suspends for the first kind, whose half-close needs no token).
/// - `s.close()` (noexcept) releases the stream at once, saying no goodbye:
///   operations pending on it complete with operation_canceled, later ones
///   fail with bad_file_descriptor; safe to call twice. An orderly end is
///   shutdown_write, then reading to end of stream, then close. close stays
///   synchronous so that it can be called anywhere, destructors and stop
///   paths included.
///
/// Every awaitable operation:
/// - takes a stop token: a stop request completes a parked operation with
///   operation_canceled; a token already stopped fails it at once;
/// - honours with_timeout and with_deadline: it parks only on spindle's
///   cancellable waits (descriptor I/O, event, ...), so a deadline reaches it
///   at any depth and its operation_canceled becomes timed_out;
/// - when cancelled, read_some and write_some transferred nothing (the stream
///   stays in step); write_all may have written part of its buffers;
/// - refers to the caller's buffers until it completes; keep them alive;
/// - reports errors in the result, never by throwing: a reset peer is
///   connection_reset on a read, broken_pipe (or connection_reset) on a write;
///   no write raises SIGPIPE.
///
/// A stream belongs to the loop of the tasks that use it. One read and one
/// write may be in flight at the same time (a reader task and a writer task);
/// two reads, or two writes, at once have no defined order.

#include <spindle/borrowed_buffer.hpp>
#include <spindle/net/detail/awaitable.hpp>
#include <spindle/result.hpp>

#include <sys/uio.h>

#include <concepts>
#include <cstddef>
#include <span>
#include <stop_token>
#include <utility>

namespace spindle::net {

namespace detail {

/// Half-close completes at once: `s.shutdown_write()` is a result<void>.
template <class S>
concept shuts_down_at_once = requires(S& s) {
    { s.shutdown_write() } -> std::same_as<result<void>>;
};

/// Half-close is an operation: `co_await s.shutdown_write(token)`.
template <class S>
concept shuts_down_by_operation = requires(S& s, std::stop_token token) {
    { s.shutdown_write(token) } -> awaitable_of<result<void>>;
};

}  // namespace detail

template <class S>
concept byte_stream = requires(S& s, std::span<std::byte> in, std::span<const std::byte> out,
                               std::span<const ::iovec> bufs, std::stop_token token) {
    { s.read_some(in, token) } -> detail::awaitable_of<result<std::size_t>>;
    { s.write_some(out, token) } -> detail::awaitable_of<result<std::size_t>>;
    { s.write_all(out, token) } -> detail::awaitable_of<result<void>>;
    { s.write_all(bufs, token) } -> detail::awaitable_of<result<void>>;
    { s.close() } noexcept;
} && (detail::shuts_down_by_operation<S> || detail::shuts_down_at_once<S>);

/// The stream lends its reads' buffers: `co_await s.read_borrowed(token)`.
template <class S>
concept reads_borrowed = byte_stream<S> && requires(S& s, std::stop_token token) {
    { s.read_borrowed(token) } -> detail::awaitable_of<result<borrowed_buffer>>;
};

/// `co_await net::shutdown_write(s, token)`: the stream's half-close, whether
/// it is an operation (awaited, with the token) or completes at once (then
/// this never suspends and the token is not needed).
template <byte_stream S>
[[nodiscard]] auto shutdown_write(S& s, std::stop_token token = {}) {
    if constexpr (detail::shuts_down_by_operation<S>)
        return s.shutdown_write(std::move(token));
    else
        return detail::ready_awaiter<result<void>>{s.shutdown_write()};
}

}  // namespace spindle::net
