#include "context_state.hpp"

#include <spindle/tls/detail/session.hpp>
#include <spindle/tls/error.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

namespace spindle::tls::detail {

namespace {

/// Per TLS record, the most that encryption adds (header, tag, MAC and
/// padding of any suite spoken); and room for a KeyUpdate OpenSSL may send
/// ahead of the data.
constexpr std::size_t record_overhead = 256;
constexpr std::size_t key_update_room = 64;

/// Buffers of `Size` bytes the thread's sessions are not using (output,
/// lent plaintext), so a connection that answers a request and then idles
/// takes one and gives it back without a trip to malloc. The list itself is
/// trivially destructible: a session destroyed after its thread's
/// thread_local objects (a stream in a static, say) frees its block plainly.
template <std::size_t Size>
class block_cache {
public:
    static std::byte* take() noexcept {
        if (t_state.count > 0) return t_state.free[--t_state.count];
        return new (std::nothrow) std::byte[Size];
    }
    static void give_back(std::byte* block) noexcept {
        if (t_state.gone || t_state.count == kept) {
            delete[] block;
            return;
        }
        static thread_local const reaper frees_at_exit;  // the thread's first block kept arms it
        (void)frees_at_exit;
        t_state.free[t_state.count++] = block;
    }

private:
    static constexpr std::size_t kept = 8;
    struct state {
        std::byte* free[kept];
        std::size_t count;
        bool gone;  // the thread is ending: keep nothing more
    };
    struct reaper {
        ~reaper() {
            while (t_state.count > 0) delete[] t_state.free[--t_state.count];
            t_state.gone = true;
        }
    };
    static constinit inline thread_local state t_state{};
};

using output_cache = block_cache<session::output_capacity>;
using plaintext_cache = block_cache<session::record_plaintext>;

/// Ends every step of the engine: see session::settle_input.
struct settle_after {
    session& s;
    ~settle_after() { s.settle_input(); }
};

bool is_ip_address(const std::string& name) {
    unsigned char scratch[sizeof(in6_addr)];
    return inet_pton(AF_INET, name.c_str(), scratch) == 1 || inet_pton(AF_INET6, name.c_str(), scratch) == 1;
}

}  // namespace

/// spindle's BIO: reads and writes the session's buffers, never a descriptor.
struct bio_method_holder {
    BIO_METHOD* method;
    bio_method_holder() : method(BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "spindle buffers")) {
        if (method == nullptr) return;
        BIO_meth_set_read_ex(method, session::bio_read);
        BIO_meth_set_write_ex(method, session::bio_write);
        BIO_meth_set_ctrl(method, session::bio_ctrl);
    }
    ~bio_method_holder() { BIO_meth_free(method); }
    static BIO_METHOD* get() {
        static const bio_method_holder holder;
        return holder.method;
    }
};

result<std::shared_ptr<session>> session::make(const context& ctx, std::string_view server_name) {
    if (!ctx) return make_error_code(errc::wrong_context);
    context_state& state = *ctx.state();
    std::shared_ptr<session> s(new session);
    s->m_context = ctx.state();
    ERR_clear_error();
    BIO_METHOD* method = bio_method_holder::get();
    if (method == nullptr) return take_openssl_error(make_error_code(std::errc::not_enough_memory));
    s->m_ssl = SSL_new(state.ctx);
    if (s->m_ssl == nullptr) return take_openssl_error(make_error_code(std::errc::not_enough_memory));
    BIO* bio = BIO_new(method);
    if (bio == nullptr) return take_openssl_error(make_error_code(std::errc::not_enough_memory));
    BIO_set_data(bio, s.get());
    BIO_set_init(bio, 1);
    SSL_set_bio(s->m_ssl, bio, bio);  // one BIO both ways: the SSL holds its one reference

    if (state.server) {
        SSL_set_accept_state(s->m_ssl);
    } else {
        SSL_set_connect_state(s->m_ssl);
        const std::string name(server_name);
        if (name.empty() && state.options.verify_peer) return make_error_code(errc::server_name_required);
        if (!name.empty()) {
            if (is_ip_address(name)) {
                // An address is checked against the certificate's IP entries
                // and never sent as SNI (RFC 6066).
                if (state.options.verify_peer && X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s->m_ssl), name.c_str()) != 1)
                    return take_openssl_error(make_error_code(std::errc::invalid_argument));
            } else {
                if (SSL_set_tlsext_host_name(s->m_ssl, name.c_str()) != 1)
                    return take_openssl_error(make_error_code(std::errc::invalid_argument));
                SSL_set_hostflags(s->m_ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
                if (state.options.verify_peer && SSL_set1_host(s->m_ssl, name.c_str()) != 1)
                    return take_openssl_error(make_error_code(std::errc::invalid_argument));
            }
        }
        s->m_cache_key = name;
        SSL_set_app_data(s->m_ssl, &s->m_cache_key);
        if (state.options.session_resumption && !name.empty()) {
            // A copy of its own: OpenSSL marks a connection's session not
            // resumable when the connection ends badly, and the cached one
            // must stay good for every other thread's next connection.
            if (SSL_SESSION* copy = state.session_copy_for(name)) {
                SSL_set_session(s->m_ssl, copy);
                SSL_SESSION_free(copy);
            }
        }
    }
    return s;
}

session::~session() {
    SSL_free(m_ssl);
    if (m_out) output_cache::give_back(m_out);
}

void session::settle_input() noexcept {
    const std::size_t left = m_loan.size() - m_loan_begin;
    if (left > 0) {
        // OpenSSL reads ahead as far as its buffer goes: a remainder is rare,
        // and only what it could not take yet.
        const std::size_t held = m_in_end - m_in_begin;
        if (!m_in || m_in_capacity - held < left) {
            const std::size_t capacity = std::max(input_capacity, held + left);
            std::unique_ptr<std::byte[]> bigger(new (std::nothrow) std::byte[capacity]);
            if (!bigger) return;  // the loan stays, and is read from next time
            if (held > 0) std::memcpy(bigger.get(), m_in.get() + m_in_begin, held);
            m_in = std::move(bigger);
            m_in_capacity = capacity;
        } else if (m_in_begin > 0) {
            std::memmove(m_in.get(), m_in.get() + m_in_begin, held);
        }
        m_in_begin = 0;
        m_in_end = held;
        std::memcpy(m_in.get() + m_in_end, m_loan.data() + m_loan_begin, left);
        m_in_end += left;
    }
    if (m_loan.data() != nullptr) {
        m_loan.reset();
        m_loan_begin = 0;
    }
    // Over a lending stream the input buffer only ever holds a remainder.
    if (m_lending && m_in && m_in_begin == m_in_end && !receiving) {
        m_in.reset();
        m_in_capacity = 0;
        m_in_begin = m_in_end = 0;
    }
}

step session::outcome(int r, std::size_t count) {
    switch (SSL_get_error(m_ssl, r)) {
        case SSL_ERROR_WANT_READ: return {need::input, count};
        case SSL_ERROR_WANT_WRITE: return {need::output_room, count};
        case SSL_ERROR_ZERO_RETURN:
            m_peer_closed = true;
            ERR_clear_error();
            return {need::closed, count};
        case SSL_ERROR_SYSCALL:
            // spindle's BIO sets no errno: an end of the stream underneath
            // without close_notify.
            if (ERR_peek_error() == 0) return {need::failed, count, make_error_code(errc::truncated)};
            return {need::failed, count, take_openssl_error(make_error_code(errc::truncated))};
        default: break;
    }
    const unsigned long code = ERR_peek_error();
    if (ERR_GET_LIB(code) == ERR_LIB_SSL && ERR_GET_REASON(code) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        ERR_clear_error();
        return {need::failed, count, make_error_code(errc::truncated)};
    }
    if (ERR_GET_LIB(code) == ERR_LIB_SSL && ERR_GET_REASON(code) == SSL_R_CERTIFICATE_VERIFY_FAILED) {
        ERR_clear_error();
        const long verdict = SSL_get_verify_result(m_ssl);
        if (verdict != X509_V_OK) return {need::failed, count, {verify_code(static_cast<int>(verdict)), tls_category()}};
        return {need::failed, count, make_error_code(errc::certificate_verify_failed)};
    }
    return {need::failed, count, take_openssl_error(make_error_code(std::errc::protocol_error))};
}

step session::handshake() {
    const settle_after settle{*this};
    ERR_clear_error();
    const int r = SSL_do_handshake(m_ssl);
    if (r == 1) return {need::nothing, 0};
    return outcome(r, 0);
}

step session::read(std::span<std::byte> out) {
    if (m_deferred.what == need::failed) return m_deferred;
    const settle_after settle{*this};
    std::size_t total = 0;
    // Everything decrypted already, record after record, while there is room:
    // a bulk reader gets up to its buffer per call.
    while (total < out.size()) {
        ERR_clear_error();
        std::size_t n = 0;
        const int r = SSL_read_ex(m_ssl, out.data() + total, out.size() - total, &n);
        if (r == 1) {
            total += n;
            continue;
        }
        step s = outcome(r, total);
        // Bytes in hand come first. A close is met again next time (OpenSSL
        // repeats it); an error is kept for the next read, which OpenSSL
        // would answer with a vaguer one.
        if (total > 0) {
            if (s.what == need::failed) m_deferred = {need::failed, 0, s.error};
            return {need::nothing, total};
        }
        return s;
    }
    return {need::nothing, total};
}

std::size_t session::write_limit() const noexcept {
    const std::size_t used = sending ? m_out_end : m_out_end - m_out_begin;
    const std::size_t room = output_capacity - used;
    const std::size_t records = room / record_plaintext + 1;
    const std::size_t reserve = records * record_overhead + key_update_room;
    return room > reserve ? room - reserve : 0;
}

step session::peek() {
    if (m_deferred.what == need::failed) return m_deferred;
    const settle_after settle{*this};
    ERR_clear_error();
    std::byte first;
    std::size_t n = 0;
    const int r = SSL_peek_ex(m_ssl, &first, 1, &n);
    if (r == 1) return {need::nothing, n};
    return outcome(r, 0);
}

std::byte* session::take_plaintext() noexcept { return plaintext_cache::take(); }
void session::give_back_plaintext(void* block, std::uint32_t) noexcept {
    plaintext_cache::give_back(static_cast<std::byte*>(block));
}

step session::write(std::span<const std::byte> in) {
    const settle_after settle{*this};
    ERR_clear_error();
    std::size_t n = 0;
    const int r = SSL_write_ex(m_ssl, in.data(), in.size(), &n);
    if (r == 1) return {need::nothing, n};
    return outcome(r, 0);
}

step session::close_notify() {
    if (!handshake_done() || m_close_notify_queued) return {need::nothing, 0};
    const settle_after settle{*this};
    ERR_clear_error();
    // Called again after output_room until OpenSSL has all of the alert in
    // our buffer (it marks close_notify sent before it has written it).
    const int r = SSL_shutdown(m_ssl);
    if (r >= 0) {  // 0: ours is queued, the peer's not seen yet
        m_close_notify_queued = true;
        return {need::nothing, 0};
    }
    return outcome(r, 0);
}

bool session::handshake_done() const noexcept { return SSL_is_init_finished(m_ssl) == 1; }
bool session::output_can_wait() const noexcept {
    return SSL_is_server(m_ssl) == 1 && SSL_version(m_ssl) == TLS1_3_VERSION && handshake_done();
}
bool session::close_notify_sent() const noexcept { return (SSL_get_shutdown(m_ssl) & SSL_SENT_SHUTDOWN) != 0; }

std::span<std::byte> session::input_space() noexcept {
    if (!m_in) {
        m_in.reset(new (std::nothrow) std::byte[input_capacity]);
        if (!m_in) return {};
        m_in_capacity = input_capacity;
    }
    if (!receiving) {
        if (m_in_begin == m_in_end) {
            m_in_begin = m_in_end = 0;
        } else if (m_in_begin > 0) {
            std::memmove(m_in.get(), m_in.get() + m_in_begin, m_in_end - m_in_begin);
            m_in_end -= m_in_begin;
            m_in_begin = 0;
        }
    }
    return {m_in.get() + m_in_end, m_in_capacity - m_in_end};
}

void session::output_sent(std::size_t n) noexcept {
    m_out_begin += n;
    if (m_out_begin == m_out_end && !sending) m_out_begin = m_out_end = 0;
}

void session::release_idle_output() noexcept {
    if (!m_out || sending || m_out_begin != m_out_end) return;
    output_cache::give_back(std::exchange(m_out, nullptr));
    m_out_begin = m_out_end = 0;
}

std::string_view session::alpn() const noexcept {
    const unsigned char* data = nullptr;
    unsigned int size = 0;
    SSL_get0_alpn_selected(m_ssl, &data, &size);
    return {reinterpret_cast<const char*>(data), size};
}

bool session::resumed() const noexcept { return SSL_session_reused(m_ssl) == 1; }
std::string_view session::protocol_version() const noexcept { return SSL_get_version(m_ssl); }
std::string_view session::cipher() const noexcept {
    const char* name = SSL_get_cipher_name(m_ssl);
    return name != nullptr ? name : "";
}

int session::bio_read(BIO* bio, char* data, std::size_t size, std::size_t* done) {
    auto* s = static_cast<session*>(BIO_get_data(bio));
    BIO_clear_retry_flags(bio);
    // A remainder of an earlier loan is older than the loan now.
    if (const std::size_t held = s->m_in_end - s->m_in_begin; held > 0) {
        const std::size_t n = std::min(size, held);
        std::memcpy(data, s->m_in.get() + s->m_in_begin, n);
        s->m_in_begin += n;
        *done = n;
        return 1;
    }
    if (const std::size_t lent = s->m_loan.size() - s->m_loan_begin; lent > 0) {
        const std::size_t n = std::min(size, lent);
        std::memcpy(data, s->m_loan.data() + s->m_loan_begin, n);
        s->m_loan_begin += n;
        *done = n;
        return 1;
    }
    *done = 0;
    // Without the retry flag, OpenSSL takes 0 as the end of the stream.
    if (!s->m_in_eof) BIO_set_retry_read(bio);
    return 0;
}

int session::bio_write(BIO* bio, const char* data, std::size_t size, std::size_t* done) {
    auto* s = static_cast<session*>(BIO_get_data(bio));
    BIO_clear_retry_flags(bio);
    if (!s->m_out) {
        s->m_out = output_cache::take();
        if (!s->m_out) {
            *done = 0;
            return -1;  // no memory: the step fails
        }
    }
    // While a send is in flight its bytes stay where they are; otherwise
    // what is still unsent moves to the front to make room.
    if (!s->sending && s->m_out_begin > 0 && output_capacity - s->m_out_end < size) {
        std::memmove(s->m_out, s->m_out + s->m_out_begin, s->m_out_end - s->m_out_begin);
        s->m_out_end -= s->m_out_begin;
        s->m_out_begin = 0;
    }
    const std::size_t room = output_capacity - s->m_out_end;
    if (room == 0) {
        *done = 0;
        BIO_set_retry_write(bio);
        return 0;
    }
    const std::size_t n = std::min(size, room);
    std::memcpy(s->m_out + s->m_out_end, data, n);
    s->m_out_end += n;
    *done = n;
    return 1;
}

long session::bio_ctrl(BIO* bio, int cmd, long, void*) {
    auto* s = static_cast<session*>(BIO_get_data(bio));
    switch (cmd) {
        case BIO_CTRL_FLUSH: return 1;  // the stream sends; nothing to do here
        case BIO_CTRL_EOF: return s->m_in_eof && s->input_empty() ? 1 : 0;
        case BIO_CTRL_PENDING:
            return static_cast<long>(s->m_in_end - s->m_in_begin + s->m_loan.size() - s->m_loan_begin);
        case BIO_CTRL_WPENDING: return static_cast<long>(s->m_out_end - s->m_out_begin);
        default: return 0;
    }
}

}  // namespace spindle::tls::detail
