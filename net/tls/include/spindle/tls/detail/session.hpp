#pragma once
/// The TLS engine of one connection, apart from any stream: OpenSSL's SSL
/// object over a BIO of spindle's that reads ciphertext from `input` and
/// writes it to `output`, two buffers the stream fills from and drains to the
/// stream underneath. OpenSSL never touches a descriptor, so one engine
/// serves every backend (and a memory_stream in a test).
///
/// Each step runs OpenSSL once, synchronously, and says what it needs next:
/// more input from the peer, room in the output buffer, nothing (done). The
/// stream template (stream.hpp) awaits those needs. Compiled once, here and
/// in session.cpp, so the template stays small.

#include <spindle/borrowed_buffer.hpp>
#include <spindle/event.hpp>
#include <spindle/result.hpp>
#include <spindle/tls/context.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

struct ssl_st;
struct bio_st;

namespace spindle::tls::detail {

/// What a step of the engine needs before it can go on.
enum class need : std::uint8_t {
    nothing,      ///< done: `count` bytes (read or written)
    input,        ///< ciphertext from the peer
    output_room,  ///< the output buffer is full: send some of it
    closed,       ///< the peer's close_notify arrived: end of stream
    failed,       ///< `error` says why
};

struct step {
    need what = need::nothing;
    std::size_t count = 0;
    std::error_code error = {};
};

class session {
public:
    /// Ciphertext buffered from the peer, and toward it: two records' worth
    /// outbound, so one send carries up to 32 KiB of plaintext. Each is held
    /// only while bytes are in it (an idle connection holds neither): the
    /// output buffer comes from a small cache of the thread's, and over a
    /// stream that lends its reads' buffers the input arrives in the loop's
    /// buffer (input_lent), which goes back after the step that read it.
    static constexpr std::size_t input_capacity = 16 * 1024;
    static constexpr std::size_t output_capacity = 2 * (16 * 1024 + 256) + 512;
    /// The most plaintext one record carries.
    static constexpr std::size_t record_plaintext = 16 * 1024;

    /// A buffer for plaintext a borrowed read lends (one record's worth),
    /// from a small cache of the thread's; null without memory. It goes back
    /// through give_back_plaintext, as a borrowed_buffer's lender.
    static std::byte* take_plaintext() noexcept;
    static void give_back_plaintext(void* block, std::uint32_t) noexcept;

    /// An engine for one connection of `ctx`'s side. A client checks the
    /// server's certificate against `server_name` (a host name or an IP
    /// address) and sends it as SNI (unless it is an address).
    static result<std::shared_ptr<session>> make(const context& ctx, std::string_view server_name);
    ~session();
    session(const session&) = delete;
    session& operator=(const session&) = delete;

    step handshake();
    /// Plaintext into `out`: as much as is decrypted already, at least one
    /// byte, or what is needed for one.
    step read(std::span<std::byte> out);
    /// As read, but leaves the plaintext where it is: done (`count` 1) once
    /// at least one byte of it is decrypted.
    step peek();
    /// Encrypts `in` into the output buffer. The most it takes at once is
    /// write_limit(); a step that needed output_room must be repeated with
    /// the same bytes.
    step write(std::span<const std::byte> in);
    /// Plaintext bytes the output buffer has room for now (0: send first).
    std::size_t write_limit() const noexcept;
    /// Queues close_notify (once; done when it is in the output buffer).
    step close_notify();

    bool handshake_done() const noexcept;
    /// A TLS 1.3 server whose handshake is done: what it queues then (session
    /// tickets, the answer to a KeyUpdate) is nothing the client waits for,
    /// so it may wait to leave with the next write.
    bool output_can_wait() const noexcept;
    bool close_notify_sent() const noexcept;
    bool close_notify_received() const noexcept { return m_peer_closed; }

    // Ciphertext from the peer: the stream reads into input_space(), then
    // says how much arrived (0: the stream underneath ended); or, over a
    // stream that lends its buffers, hands over what a borrowed read got
    // while nothing else is buffered (input_empty()). An empty span:
    // no memory for the buffer.
    std::span<std::byte> input_space() noexcept;
    void input_received(std::size_t n) noexcept { m_in_end += n; }
    void input_ended() noexcept { m_in_eof = true; }
    bool input_empty() const noexcept { return m_in_begin == m_in_end && m_loan.size() == m_loan_begin; }
    void input_lent(borrowed_buffer bytes) noexcept {
        m_loan = std::move(bytes);
        m_loan_begin = 0;
        m_lending = true;
    }
    /// Ends every step: what OpenSSL left of a loan moves into the input
    /// buffer and the loan goes back; over a lending stream, an input buffer
    /// left empty goes back too.
    void settle_input() noexcept;

    // Ciphertext toward the peer: the stream sends from output(), then says
    // how much went.
    std::span<const std::byte> output() const noexcept { return {m_out + m_out_begin, m_out_end - m_out_begin}; }
    bool has_output() const noexcept { return m_out_end != m_out_begin; }
    void output_sent(std::size_t n) noexcept;
    /// Nothing is queued or being sent: the output buffer goes back.
    void release_idle_output() noexcept;
    /// Bytes of ciphertext buffers held now (OpenSSL's own aside).
    std::size_t buffers_held() const noexcept {
        return (m_in ? m_in_capacity : 0) + (m_out ? output_capacity : 0) + (m_loan.data() ? m_loan.size() : 0);
    }

    /// A read of the stream underneath into input_space() is in flight (the
    /// buffer is not moved meanwhile); `input_arrived` is set when it ends.
    bool receiving = false;
    /// A write of the stream underneath from output() is in flight; the
    /// output buffer is then only appended to, and `output_drained` is set
    /// when the sender finds it empty or fails.
    bool sending = false;
    event input_arrived;
    event output_drained;
    /// The first failure of the stream underneath while sending (receiving),
    /// which later sends (receives) report too.
    std::error_code send_error;
    std::error_code receive_error;
    /// The stream this engine belongs to is gone (destroyed, or moved over):
    /// an operation finishing late must not touch it.
    bool stream_gone = false;

    /// The protocol ALPN chose ("" without one).
    std::string_view alpn() const noexcept;
    /// The handshake resumed an earlier session.
    bool resumed() const noexcept;
    /// "TLSv1.3", "TLSv1.2".
    std::string_view protocol_version() const noexcept;
    /// The cipher suite, e.g. "TLS_AES_256_GCM_SHA384".
    std::string_view cipher() const noexcept;
    ssl_st* native_handle() const noexcept { return m_ssl; }

private:
    session() = default;
    /// The step for OpenSSL's return `r` of an SSL_* call.
    step outcome(int r, std::size_t count);

    static int bio_read(bio_st* bio, char* data, std::size_t size, std::size_t* done);
    static int bio_write(bio_st* bio, const char* data, std::size_t size, std::size_t* done);
    static long bio_ctrl(bio_st* bio, int cmd, long larg, void* parg);
    friend struct bio_method_holder;

    std::shared_ptr<context_state> m_context;  // keeps SSL_CTX and the session cache alive
    ssl_st* m_ssl = nullptr;
    std::string m_cache_key;                   // the server name a client's sessions are kept under
    std::unique_ptr<std::byte[]> m_in;
    std::size_t m_in_capacity = 0;
    std::size_t m_in_begin = 0;
    std::size_t m_in_end = 0;
    bool m_in_eof = false;
    bool m_peer_closed = false;
    bool m_close_notify_queued = false;
    /// A failure met after plaintext in the same read: reported by the next.
    step m_deferred;
    borrowed_buffer m_loan;
    std::size_t m_loan_begin = 0;
    bool m_lending = false;      // the stream underneath lends its reads' buffers
    std::byte* m_out = nullptr;  // output_capacity bytes from the thread's cache, while in use
    std::size_t m_out_begin = 0;
    std::size_t m_out_end = 0;

    friend struct context_state;
};

}  // namespace spindle::tls::detail
