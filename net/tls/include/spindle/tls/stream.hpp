#pragma once
/// tls::stream: an encrypted byte stream over any other (a tcp_stream, a
/// unix_stream, a memory_stream in a test), and itself a byte_stream, so
/// code written against the seam (a buffered_reader, a connection loop)
/// serves TLS unchanged.
///
///     result<tls::stream<net::tcp_stream>> tls = tls::stream<net::tcp_stream>::server(ctx, std::move(tcp));
///     if (result<void> h = co_await tls->handshake(stop); !h) ...   // bounded by the context's handshake_timeout
///     result<std::size_t> n = co_await tls->read_some(buf, stop);
///     co_await tls->write_all(reply, stop);
///     co_await tls->shutdown(stop);                                  // close_notify both ways, then close
///
/// OpenSSL encrypts and decrypts in memory; the stream's own reads and
/// writes of the stream underneath move the ciphertext, so the same code runs
/// on io_uring, epoll and kqueue. What that means for a user:
///
/// - Every operation takes a stop token and honours with_timeout; errors
///   come in the result (tls::errc, OpenSSL's reasons, the stream
///   underneath's errors unchanged), never by throwing.
/// - End of stream (a read of 0) is the peer's close_notify. A peer that
///   ends the connection without one is errc::truncated: what was read may
///   have been cut short.
/// - One read and one write may be in flight at once, from two tasks. TLS
///   1.3 writes while reading (a KeyUpdate answered, a session ticket): the
///   stream has one sender at a time, and a read never waits for a write
///   (whoever sends next takes what the read queued).
/// - A cancelled read transferred nothing. A write encrypts before it sends:
///   cancelled while sending, write_some still reports what it took (the
///   ciphertext goes out with the next operation that sends); a cancelled
///   write_all may have written part.
/// - An idle stream holds no buffer. The ciphertext buffer toward the peer
///   (33 KiB) is taken from a cache of the thread's while there is output,
///   OpenSSL's own record buffers only while records are in them, and over a
///   stream that lends its reads' buffers (a socket: net::reads_borrowed)
///   the peer's ciphertext arrives in the loop's buffer, given back after
///   the step that decrypts it. Over any other, a 16 KiB input buffer
///   lives as long as the stream. Reads and writes allocate nothing else:
///   each operation is a small pooled frame.
/// - Destroying (or closing) a stream with operations parked on it completes
///   them with operation_canceled, as on a socket; they hold the engine
///   until they have.
/// - The handshake happens on the first read or write if handshake() was not
///   called; call it to apply the handshake timeout and to see a failure
///   (a certificate that does not verify) at once.
///
/// Like the stream underneath, a stream belongs to one loop; it may be moved
/// while no operation is in flight.

#include <spindle/net/byte_stream.hpp>
#include <spindle/net/tcp.hpp>
#include <spindle/task.hpp>
#include <spindle/timeout.hpp>
#include <spindle/tls/context.hpp>
#include <spindle/tls/detail/session.hpp>
#include <spindle/tls/error.hpp>

#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace spindle::tls {

template <net::byte_stream Next>
class stream {
public:
    /// The client side of a connection already made: checks the server's
    /// certificate against `server_name` (the host name or IP address it
    /// connected to; needed unless verify_peer is off) and offers a session
    /// kept from an earlier connection to that name.
    static result<stream> client(const context& ctx, Next next, std::string_view server_name) {
        if (!ctx || ctx.is_server()) return make_error_code(errc::wrong_context);
        result<std::shared_ptr<detail::session>> s = detail::session::make(ctx, server_name);
        if (!s) return s.error();
        return stream(std::move(next), std::move(*s), ctx.options());
    }
    /// The server side of an accepted connection.
    static result<stream> server(const context& ctx, Next next) {
        if (!ctx || !ctx.is_server()) return make_error_code(errc::wrong_context);
        result<std::shared_ptr<detail::session>> s = detail::session::make(ctx, {});
        if (!s) return s.error();
        return stream(std::move(next), std::move(*s), ctx.options());
    }

    /// A closed stream.
    stream() noexcept = default;
    stream(stream&&) noexcept = default;
    stream& operator=(stream&& other) noexcept {
        if (this != &other) {
            if (m_session) m_session->stream_gone = true;
            m_next = std::move(other.m_next);
            m_session = std::move(other.m_session);
            m_handshake_timeout = other.m_handshake_timeout;
            m_shutdown_timeout = other.m_shutdown_timeout;
        }
        return *this;
    }

    /// Closes the stream underneath. Operations still parked on it complete
    /// with operation_canceled later; they hold the engine, not the stream.
    ~stream() {
        if (m_session) m_session->stream_gone = true;
    }

    /// The handshake, bounded by the context's handshake_timeout (timed_out).
    /// A failure is sent to the peer as an alert before it is returned.
    task<result<void>> handshake(std::stop_token token = {}) {
        if (!m_session) co_return std::make_error_code(std::errc::bad_file_descriptor);
        const std::shared_ptr<detail::session> keep = m_session;
        if (m_handshake_timeout.count() > 0) co_return co_await with_timeout(m_handshake_timeout, run_handshake(token));
        co_return co_await run_handshake(token);
    }

    /// At most buf.size() bytes of plaintext: the count, 0 at the peer's
    /// close_notify.
    task<result<std::size_t>> read_some(std::span<std::byte> buf, std::stop_token token = {}) {
        if (!m_session) co_return std::make_error_code(std::errc::bad_file_descriptor);
        if (buf.empty()) co_return std::size_t{0};
        // Every operation holds the engine: one whose stream is destroyed
        // while it is parked resumes (cancelled) into memory still there.
        const std::shared_ptr<detail::session> keep = m_session;
        co_return co_await read_plaintext(*keep, buf, token);
    }

    /// The plaintext that arrived, in a buffer lent only once it is there
    /// (at most one record's worth, 16 KiB), empty at the peer's
    /// close_notify: a connection waiting for its peer holds no buffer
    /// (net::reads_borrowed). Give it back soon, on the stream's thread.
    task<result<borrowed_buffer>> read_borrowed(std::stop_token token = {}) {
        if (!m_session) co_return std::make_error_code(std::errc::bad_file_descriptor);
        const std::shared_ptr<detail::session> keep = m_session;
        detail::session& s = *keep;
        // Waits until a byte is decrypted, holding nothing, then reads what
        // is there at once.
        result<std::size_t> there = co_await read_plaintext(s, {}, token);
        if (!there) co_return there.error();
        if (*there == 0) co_return borrowed_buffer{};
        std::byte* block = detail::session::take_plaintext();
        if (block == nullptr) co_return std::make_error_code(std::errc::not_enough_memory);
        borrowed_buffer lent(&detail::session::give_back_plaintext, block, 0, block,
                             static_cast<std::uint32_t>(detail::session::record_plaintext));
        result<std::size_t> n = co_await read_plaintext(s, lent.bytes(), token);
        if (!n) co_return n.error();
        if (*n == 0) co_return borrowed_buffer{};
        lent.shrink(*n);
        co_return lent;
    }

    /// Encrypts and sends at most buf.size() bytes (one record: 16 KiB).
    task<result<std::size_t>> write_some(std::span<const std::byte> buf, std::stop_token token = {}) {
        if (!m_session) co_return std::make_error_code(std::errc::bad_file_descriptor);
        if (buf.empty()) co_return std::size_t{0};
        if (token.stop_requested()) co_return std::make_error_code(std::errc::operation_canceled);
        const std::shared_ptr<detail::session> keep = m_session;
        detail::session& s = *keep;
        // What is queued (tickets, a KeyUpdate, what an earlier write left)
        // leaves with this record in one write; encrypt sends it first only
        // when the record has no room beside it.
        if (s.send_error) co_return s.send_error;
        result<std::size_t> taken = co_await encrypt(s, buf, token);
        if (!taken) co_return taken.error();
        // Taken is taken: a stop while sending leaves the rest for the next send.
        (void)co_await send_output(s, token);
        if (s.send_error) co_return s.send_error;
        co_return *taken;
    }

    /// Writes all of `buf`: records fill the output buffer, which is sent
    /// whenever it is full, and at the end.
    task<result<void>> write_all(std::span<const std::byte> buf, std::stop_token token = {}) {
        if (!m_session) co_return std::make_error_code(std::errc::bad_file_descriptor);
        const std::shared_ptr<detail::session> keep = m_session;
        while (!buf.empty()) {
            result<std::size_t> taken = co_await encrypt(*keep, buf, token);
            if (!taken) co_return taken.error();
            buf = buf.subspan(*taken);
        }
        co_return co_await send_output(*keep, token);
    }

    /// Writes all of the buffers, in order: each one record or more, sent
    /// together.
    task<result<void>> write_all(std::span<const ::iovec> bufs, std::stop_token token = {}) {
        if (!m_session) co_return std::make_error_code(std::errc::bad_file_descriptor);
        const std::shared_ptr<detail::session> keep = m_session;
        for (const ::iovec& piece : bufs) {
            std::span<const std::byte> rest(static_cast<const std::byte*>(piece.iov_base), piece.iov_len);
            while (!rest.empty()) {
                result<std::size_t> taken = co_await encrypt(*keep, rest, token);
                if (!taken) co_return taken.error();
                rest = rest.subspan(*taken);
            }
        }
        co_return co_await send_output(*keep, token);
    }

    /// Half-close: sends close_notify. The peer reads end of stream after
    /// everything written before; this side can still read (TLS 1.3; a TLS
    /// 1.2 peer usually answers with its own close_notify).
    task<result<void>> shutdown_write(std::stop_token token = {}) {
        if (!m_session) co_return std::make_error_code(std::errc::bad_file_descriptor);
        const std::shared_ptr<detail::session> keep = m_session;
        for (;;) {
            const detail::step st = keep->close_notify();
            if (st.what == detail::need::nothing) break;
            if (st.what == detail::need::failed) co_return st.error;
            if (result<void> sent = co_await send_output(*keep, token); !sent) co_return sent;
        }
        co_return co_await send_output(*keep, token);
    }

    /// The orderly end: sends close_notify, waits for the peer's (reading
    /// and dropping whatever it still sends) within the context's
    /// shutdown_timeout, then closes. timed_out if the peer never answered;
    /// a peer that closes instead of answering is taken as an answer. The
    /// stream is closed either way.
    task<result<void>> shutdown(std::stop_token token = {}) {
        if (!m_session) co_return std::make_error_code(std::errc::bad_file_descriptor);
        const std::shared_ptr<detail::session> keep = m_session;
        result<void> done = m_shutdown_timeout.count() > 0
                                ? co_await with_timeout(m_shutdown_timeout, exchange_close_notify(token))
                                : co_await exchange_close_notify(token);
        if (!keep->stream_gone) close();
        co_return done;
    }

    /// Closes the stream underneath at once, without close_notify: pending
    /// operations complete with operation_canceled. Safe to call twice.
    void close() noexcept { m_next.close(); }

    /// Asks for new traffic keys, sent with the next write; with `peer_too`,
    /// the peer renews its own as well (TLS 1.3 only).
    result<void> request_key_update(bool peer_too);

    /// The protocol ALPN chose ("" without one), once the handshake is done.
    std::string_view alpn() const noexcept { return m_session ? m_session->alpn() : std::string_view(); }
    /// The handshake resumed an earlier session (an abbreviated handshake).
    bool resumed() const noexcept { return m_session && m_session->resumed(); }
    /// "TLSv1.3" or "TLSv1.2".
    std::string_view protocol_version() const noexcept { return m_session ? m_session->protocol_version() : std::string_view(); }
    /// The cipher suite, e.g. "TLS_AES_256_GCM_SHA384".
    std::string_view cipher() const noexcept { return m_session ? m_session->cipher() : std::string_view(); }
    bool handshake_done() const noexcept { return m_session && m_session->handshake_done(); }
    /// Bytes of buffers the stream holds now for ciphertext (OpenSSL's own
    /// aside): 0 while idle over a stream that lends its reads' buffers.
    std::size_t buffers_held() const noexcept { return m_session ? m_session->buffers_held() : 0; }

    /// The stream underneath (its address, its options).
    Next& next_layer() noexcept { return m_next; }
    const Next& next_layer() const noexcept { return m_next; }
    /// OpenSSL's connection, for what spindle does not offer.
    ssl_st* native_handle() const noexcept { return m_session ? m_session->native_handle() : nullptr; }

private:
    stream(Next next, std::shared_ptr<detail::session> s, const context_options& o) noexcept
        : m_next(std::move(next)), m_session(std::move(s)), m_handshake_timeout(o.handshake_timeout),
          m_shutdown_timeout(o.shutdown_timeout) {}

    static bool is_cancellation(std::error_code ec) noexcept {
        return ec == std::errc::operation_canceled || ec == std::errc::timed_out;
    }

    /// At most buf.size() bytes of plaintext into `buf`, 0 at the peer's
    /// close_notify; with an empty `buf`, 1 once a byte is decrypted, left
    /// where it is.
    task<result<std::size_t>> read_plaintext(detail::session& s, std::span<std::byte> buf, std::stop_token token) {
        for (;;) {
            const detail::step st = buf.empty() ? s.peek() : s.read(buf);
            switch (st.what) {
                case detail::need::nothing:
                    // What reading made OpenSSL write (a KeyUpdate answered,
                    // a ticket acknowledged, a server's tickets when this read
                    // did the handshake) goes now, unless a writer is sending:
                    // it takes it along. A read never waits for one. A TLS 1.3
                    // server's waits for its next write (see run_handshake).
                    if (s.has_output() && !s.sending && !s.output_can_wait()) (void)co_await send_output(s, token);
                    co_return st.count;
                case detail::need::closed: co_return std::size_t{0};
                case detail::need::failed:
                    if (s.has_output() && !s.sending) (void)co_await send_output(s, token);  // the alert
                    co_return st.error;
                case detail::need::output_room:
                    if (result<void> sent = co_await send_output(s, token); !sent) co_return sent.error();
                    break;
                case detail::need::input:
                    // Our side of the handshake (or a reply) goes before we
                    // wait for the peer's. A send that failed does not fail
                    // the read: what the peer sent may still be there.
                    if (s.has_output() && !s.sending) {
                        result<void> sent = co_await send_output(s, token);
                        if (!sent && is_cancellation(sent.error())) co_return sent.error();
                    }
                    if (result<void> got = co_await receive_input(s, token); !got) co_return got.error();
                    break;
            }
        }
    }

    task<result<void>> run_handshake(std::stop_token token) {
        const std::shared_ptr<detail::session> keep = m_session;
        detail::session& s = *keep;
        for (;;) {
            const detail::step st = s.handshake();
            switch (st.what) {
                case detail::need::nothing:
                    // A TLS 1.3 server's tickets wait for its first write, to
                    // leave in one write with the reply: sent alone, the reply
                    // would wait under Nagle's rule for the client's delayed
                    // ACK of them (40 ms). A read that has to wait for the
                    // client sends them first. A client's Finished, which the
                    // server waits for, goes now.
                    if (s.output_can_wait()) co_return result<void>{};
                    co_return co_await send_output(s, token);
                case detail::need::closed: co_return make_error_code(errc::truncated);
                case detail::need::failed:
                    if (s.has_output() && !s.sending) (void)co_await send_output(s, token);  // the alert
                    co_return st.error;
                case detail::need::output_room:
                    if (result<void> sent = co_await send_output(s, token); !sent) co_return sent;
                    break;
                case detail::need::input:
                    if (result<void> sent = co_await send_output(s, token); !sent) co_return sent;
                    if (result<void> got = co_await receive_input(s, token); !got) co_return got;
                    break;
            }
        }
    }

    /// Encrypts one record's worth of `in` into the output buffer (sending
    /// first when it has no room for a whole record): the count taken, at
    /// least one byte.
    task<result<std::size_t>> encrypt(detail::session& s, std::span<const std::byte> in, std::stop_token token) {
        const std::span<const std::byte> chunk = in.first(std::min(in.size(), detail::session::record_plaintext));
        // Full records only: a record cut to fit what is left of the buffer
        // would cost the peer a record's overhead for a few bytes.
        while (s.write_limit() < chunk.size()) {
            if (!s.has_output()) break;  // room for less than a record only when something is queued
            if (result<void> sent = co_await send_output(s, token); !sent) co_return sent.error();
        }
        for (;;) {
            // The limit leaves room for every record of the chunk, so
            // OpenSSL takes it whole; should it not, it must be offered the
            // same bytes again once there is room.
            const detail::step st = s.write(chunk);
            if (st.what == detail::need::nothing) co_return st.count;
            if (st.what == detail::need::failed) co_return st.error;
            if (st.what == detail::need::closed) co_return std::make_error_code(std::errc::broken_pipe);
            if (st.what == detail::need::output_room) {
                if (result<void> sent = co_await send_output(s, token); !sent) co_return sent.error();
            } else {
                // OpenSSL needs the peer's bytes first (a handshake not done
                // yet): ours go before we wait for them.
                if (s.has_output()) {
                    result<void> sent = co_await send_output(s, token);
                    if (!sent) co_return sent.error();
                }
                if (result<void> got = co_await receive_input(s, token); !got) co_return got.error();
            }
        }
    }

    /// Marks a send or a receive of the stream underneath in flight; when it
    /// ends, however it ends (a frame destroyed mid-wait included), clears
    /// the mark and wakes whoever waits for it.
    struct in_flight {
        bool& flag;
        event& done;
        explicit in_flight(bool& f, event& d) noexcept : flag(f), done(d) { flag = true; }
        ~in_flight() {
            flag = false;
            done.set();
        }
        in_flight(const in_flight&) = delete;
        in_flight& operator=(const in_flight&) = delete;
    };

    /// Sends the output buffer until it is empty. With another task sending,
    /// waits for it instead, then sends whatever is left.
    task<result<void>> send_output(detail::session& s, std::stop_token token) {
        while (s.has_output()) {
            if (s.send_error) co_return s.send_error;
            if (s.sending) {
                s.output_drained.reset();
                if (result<void> drained = co_await s.output_drained.wait(token); !drained) co_return drained;
                continue;
            }
            result<std::size_t> n = std::make_error_code(std::errc::operation_canceled);
            {
                const in_flight mark(s.sending, s.output_drained);
                n = co_await m_next.write_some(s.output(), token);
            }
            if (!n) {
                // A cancelled send sent nothing; a failed one fails every
                // later send as well.
                if (!is_cancellation(n.error())) s.send_error = n.error();
                co_return n.error();
            }
            s.output_sent(*n);
        }
        s.release_idle_output();
        s.output_drained.set();
        co_return result<void>{};
    }

    /// Reads ciphertext from the stream underneath. With another task
    /// reading, waits for what it reads instead.
    task<result<void>> receive_input(detail::session& s, std::stop_token token) {
        if (s.receive_error) co_return s.receive_error;
        if (s.receiving) {
            s.input_arrived.reset();
            if (result<void> arrived = co_await s.input_arrived.wait(token); !arrived) co_return arrived;
            co_return result<void>{};
        }
        if constexpr (net::reads_borrowed<Next>) {
            // Nothing buffered (an idle connection): the ciphertext arrives
            // in a buffer the loop lends only once it is there.
            if (s.input_empty()) {
                result<borrowed_buffer> got = std::make_error_code(std::errc::operation_canceled);
                {
                    const in_flight mark(s.receiving, s.input_arrived);
                    got = co_await m_next.read_borrowed(token);
                    if (got && got->size() == 0)
                        s.input_ended();
                    else if (got)
                        s.input_lent(std::move(*got));
                }
                if (!got) {
                    if (!is_cancellation(got.error())) s.receive_error = got.error();
                    co_return got.error();
                }
                co_return result<void>{};
            }
        }
        const std::span<std::byte> space = s.input_space();  // before `receiving`: it may compact
        if (space.data() == nullptr) co_return std::make_error_code(std::errc::not_enough_memory);
        if (space.empty()) co_return result<void>{};
        result<std::size_t> n = std::make_error_code(std::errc::operation_canceled);
        {
            const in_flight mark(s.receiving, s.input_arrived);
            n = co_await m_next.read_some(space, token);
            // Counted before the mark goes, so a woken waiter finds the bytes.
            if (n && *n == 0) s.input_ended();
            else if (n) s.input_received(*n);
        }
        if (!n) {
            if (!is_cancellation(n.error())) s.receive_error = n.error();
            co_return n.error();
        }
        co_return result<void>{};
    }

    task<result<void>> exchange_close_notify(std::stop_token token) {
        if (result<void> sent = co_await shutdown_write(token); !sent) co_return sent;
        std::array<std::byte, 512> scratch;
        for (;;) {
            result<std::size_t> n = co_await read_some(scratch, token);
            if (!n) {
                // A peer that closes instead of answering leaves nothing
                // unsaid: our side had finished.
                if (n.error() == errc::truncated) co_return result<void>{};
                co_return n.error();
            }
            if (*n == 0) co_return result<void>{};
        }
    }

    Next m_next;
    /// Shared with the operations in flight (see read_some).
    std::shared_ptr<detail::session> m_session;
    std::chrono::milliseconds m_handshake_timeout{0};
    std::chrono::milliseconds m_shutdown_timeout{0};
};

namespace detail {
result<void> request_key_update(session& s, bool peer_too);
}  // namespace detail

template <net::byte_stream Next>
result<void> stream<Next>::request_key_update(bool peer_too) {
    if (!m_session) return std::make_error_code(std::errc::bad_file_descriptor);
    return detail::request_key_update(*m_session, peer_too);
}

/// TLS over TCP: compiled once, in the library.
using tcp_stream = stream<net::tcp_stream>;
extern template class stream<net::tcp_stream>;

/// Connects to `peer` over TCP (TCP_NODELAY set) and does the client
/// handshake, checking the certificate against `server_name`.
task<result<tcp_stream>> connect(context ctx, net::address peer, std::string server_name, std::stop_token token = {});
/// Resolves `host`, connects to it (each address in turn) and does the
/// client handshake, checking the certificate against `host`.
task<result<tcp_stream>> connect(context ctx, std::string host, std::uint16_t port, std::stop_token token = {});

}  // namespace spindle::tls
