#include "context_state.hpp"

#include <spindle/tls/error.hpp>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <fstream>
#include <sstream>

namespace spindle::tls {

namespace detail {

context_state::~context_state() {
    for (auto& [key, s] : sessions) SSL_SESSION_free(s);
    SSL_CTX_free(ctx);
}

bool context_state::keep_session(const std::string& key, SSL_SESSION* s) {
    const std::lock_guard lock(sessions_lock);
    auto it = sessions.find(key);
    if (it != sessions.end()) {
        SSL_SESSION_free(it->second);
        it->second = s;
        return true;
    }
    // Bounded: a client talking to many servers forgets one at random (each
    // is only a saved handshake).
    if (sessions.size() >= max_sessions) {
        SSL_SESSION_free(sessions.begin()->second);
        sessions.erase(sessions.begin());
    }
    sessions.emplace(key, s);
    return true;
}

SSL_SESSION* context_state::session_copy_for(const std::string& key) const {
    const std::lock_guard lock(sessions_lock);
    auto it = sessions.find(key);
    return it == sessions.end() ? nullptr : SSL_SESSION_dup(it->second);
}

}  // namespace detail

namespace {

using detail::context_state;

std::error_code failed(std::error_code fallback = make_error_code(std::errc::invalid_argument)) {
    return detail::take_openssl_error(fallback);
}

result<std::string> read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::error_code(errno != 0 ? errno : ENOENT, std::system_category());
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

/// The PEM text of an option given as a file or in memory.
result<std::string> pem_of(const std::string& file, const std::string& pem) {
    if (!file.empty() && !pem.empty()) return make_error_code(errc::file_and_pem);
    if (!file.empty()) return read_file(file);
    return pem;
}

struct bio_deleter {
    void operator()(BIO* b) const noexcept { BIO_free(b); }
};
using bio_ptr = std::unique_ptr<BIO, bio_deleter>;

bio_ptr memory_bio(const std::string& text) { return bio_ptr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size()))); }

// An encrypted key would make OpenSSL ask for a passphrase on the terminal:
// refuse instead.
int no_passphrase(char*, int, int, void*) { return 0; }

result<void> use_certificate_and_key(SSL_CTX* ctx, const std::string& cert_pem, const std::string& key_pem) {
    bio_ptr certs = memory_bio(cert_pem);
    X509* leaf = PEM_read_bio_X509_AUX(certs.get(), nullptr, no_passphrase, nullptr);
    if (leaf == nullptr) return failed();
    X509_check_purpose(leaf, -1, 0);  // its extension cache filled before threads share it (see add_trusted)
    const int used = SSL_CTX_use_certificate(ctx, leaf);
    X509_free(leaf);
    if (used != 1) return failed();
    // The rest of the file is the chain toward the root.
    SSL_CTX_clear_chain_certs(ctx);
    while (X509* link = PEM_read_bio_X509(certs.get(), nullptr, no_passphrase, nullptr)) {
        X509_check_purpose(link, -1, 0);
        if (SSL_CTX_add0_chain_cert(ctx, link) != 1) {
            X509_free(link);
            return failed();
        }
    }
    ERR_clear_error();  // the end of the text, which the loop above read to

    bio_ptr key_text = memory_bio(key_pem);
    EVP_PKEY* key = PEM_read_bio_PrivateKey(key_text.get(), nullptr, no_passphrase, nullptr);
    if (key == nullptr) return failed();
    const int key_used = SSL_CTX_use_PrivateKey(ctx, key);
    EVP_PKEY_free(key);
    if (key_used != 1 || SSL_CTX_check_private_key(ctx) != 1) return failed();
    return {};
}

result<void> add_trusted(SSL_CTX* ctx, const std::string& pem) {
    bio_ptr text = memory_bio(pem);
    STACK_OF(X509_INFO)* infos = PEM_X509_INFO_read_bio(text.get(), nullptr, no_passphrase, nullptr);
    if (infos == nullptr) return failed();
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    int added = 0;
    for (int i = 0; i < sk_X509_INFO_num(infos); ++i) {
        X509_INFO* info = sk_X509_INFO_value(infos, i);
        if (info->x509 == nullptr) continue;
        // OpenSSL caches a certificate's extensions on first use, writing
        // into the shared certificate while another loop's thread may read
        // them: fill the cache now, before any thread shares it.
        X509_check_purpose(info->x509, -1, 0);
        if (X509_STORE_add_cert(store, info->x509) == 1) ++added;
    }
    sk_X509_INFO_pop_free(infos, X509_INFO_free);
    if (added == 0) return failed();
    return {};
}

int to_openssl(version v) { return v == version::tls1_3 ? TLS1_3_VERSION : TLS1_2_VERSION; }

// The server's choice: the first of its protocols that the client offers.
int select_alpn(SSL*, const unsigned char** out, unsigned char* out_size, const unsigned char* offered,
                unsigned int offered_size, void* arg) {
    const auto* state = static_cast<const context_state*>(arg);
    unsigned char* chosen = nullptr;
    const auto* ours = reinterpret_cast<const unsigned char*>(state->alpn_wire.data());
    if (SSL_select_next_proto(&chosen, out_size, ours, static_cast<unsigned int>(state->alpn_wire.size()), offered,
                              offered_size) != OPENSSL_NPN_NEGOTIATED) {
        // RFC 7301: no protocol in common is a no_application_protocol alert.
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    }
    *out = chosen;
    return SSL_TLSEXT_ERR_OK;
}

// A client's new session (a TLS 1.3 ticket arrives after the handshake):
// kept under the server name of the connection that received it.
int keep_new_session(SSL* ssl, SSL_SESSION* s) {
    auto* state = static_cast<context_state*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
    const auto* key = static_cast<const std::string*>(SSL_get_app_data(ssl));
    if (state == nullptr || key == nullptr || key->empty()) return 0;
    // A copy: OpenSSL marks the connection's own session not resumable when
    // the connection is freed without close_notify, which must not cost
    // the next connection its resumption.
    SSL_SESSION* copy = SSL_SESSION_dup(s);
    if (copy == nullptr) return 0;
    state->keep_session(*key, copy);
    return 0;  // `s` stays OpenSSL's
}

result<context> make_context(const context_options& o, bool server) {
    auto state = std::make_shared<context_state>();
    state->server = server;
    state->options = o;
    ERR_clear_error();
    state->ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (state->ctx == nullptr) return failed(make_error_code(std::errc::not_enough_memory));
    SSL_CTX* ctx = state->ctx;
    SSL_CTX_set_app_data(ctx, state.get());

    if (o.min_version > o.max_version) return make_error_code(errc::no_version);
    if (SSL_CTX_set_min_proto_version(ctx, to_openssl(o.min_version)) != 1 ||
        SSL_CTX_set_max_proto_version(ctx, to_openssl(o.max_version)) != 1)
        return failed();
    // Renegotiation is how TLS 1.2 attacks and stalls begin; nothing needs it.
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    // A write takes what fits and says so; the stream may move its bytes
    // between retries. OpenSSL reads ahead from spindle's BIO: whole
    // buffers, not header then body. OpenSSL's own record buffers (16 KiB
    // each way) go back while nothing is in them: an idle connection holds
    // none.
    SSL_CTX_set_mode(ctx,
                     SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_read_ahead(ctx, 1);

    result<std::string> cert = pem_of(o.certificate_file, o.certificate_pem);
    if (!cert) return cert.error();
    result<std::string> key = pem_of(o.private_key_file, o.private_key_pem);
    if (!key) return key.error();
    if (cert->empty() != key->empty()) return make_error_code(errc::certificate_without_key);
    if (!cert->empty()) {
        if (result<void> used = use_certificate_and_key(ctx, *cert, *key); !used) return used.error();
    } else if (server) {
        return make_error_code(errc::wrong_context);
    }

    bool trust_given = !o.ca_pem.empty();
    if (!o.ca_pem.empty()) {
        if (result<void> added = add_trusted(ctx, o.ca_pem); !added) return added.error();
    }
    for (const std::string& file : o.ca_files) {
        result<std::string> pem = read_file(file);
        if (!pem) return pem.error();
        if (result<void> added = add_trusted(ctx, *pem); !added) return added.error();
        trust_given = true;
    }

    if (server) {
        if (o.require_client_certificate && !trust_given) return make_error_code(errc::client_certificate_without_ca);
        int mode = SSL_VERIFY_NONE;
        if (o.require_client_certificate) mode = SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
        else if (o.verify_peer && trust_given) mode = SSL_VERIFY_PEER;
        SSL_CTX_set_verify(ctx, mode, nullptr);
        // Sessions resumed across this context only (and needed at all once
        // client certificates are verified).
        static constexpr unsigned char id_context[] = "spindle";
        SSL_CTX_set_session_id_context(ctx, id_context, sizeof id_context - 1);
        if (o.session_resumption) {
            // One ticket per handshake: enough to resume once, and each one
            // costs the server an encryption.
            SSL_CTX_set_num_tickets(ctx, 1);
        } else {
            SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
            SSL_CTX_set_num_tickets(ctx, 0);
            SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
        }
    } else {
        if (o.verify_peer) {
            if (!trust_given && SSL_CTX_set_default_verify_paths(ctx) != 1) return failed();
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
        } else {
            SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
        }
        if (o.session_resumption) {
            // The cache is spindle's, by server name (OpenSSL's own client
            // cache does not look sessions up by itself).
            SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
            SSL_CTX_sess_set_new_cb(ctx, keep_new_session);
        } else {
            SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
            SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
        }
    }

    for (const std::string& protocol : o.alpn) {
        if (protocol.empty() || protocol.size() > 255) return make_error_code(errc::bad_alpn_name);
        state->alpn_wire += static_cast<char>(protocol.size());
        state->alpn_wire += protocol;
    }
    if (!state->alpn_wire.empty()) {
        if (server) {
            SSL_CTX_set_alpn_select_cb(ctx, select_alpn, state.get());
        } else if (SSL_CTX_set_alpn_protos(ctx, reinterpret_cast<const unsigned char*>(state->alpn_wire.data()),
                                           static_cast<unsigned int>(state->alpn_wire.size())) != 0) {
            // (set_alpn_protos returns 0 on success)
            return failed();
        }
    }
    return context(std::move(state));
}

}  // namespace

result<context> context::client(const context_options& options) { return make_context(options, false); }
result<context> context::server(const context_options& options) { return make_context(options, true); }

bool context::is_server() const noexcept { return m_state && m_state->server; }
const context_options& context::options() const noexcept { return m_state->options; }
ssl_ctx_st* context::native_handle() const noexcept { return m_state ? m_state->ctx : nullptr; }

std::size_t context::cached_sessions() const {
    if (!m_state) return 0;
    const std::lock_guard lock(m_state->sessions_lock);
    return m_state->sessions.size();
}

}  // namespace spindle::tls
