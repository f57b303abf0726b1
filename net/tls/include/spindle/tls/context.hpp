#pragma once
/// tls::context: what every TLS connection of one side shares — its
/// certificate and key, whom it trusts, the protocol versions, ALPN, and
/// (for clients) the sessions kept for resumption.
///
///     tls::context_options o;
///     o.certificate_file = "server.pem";   // the chain, leaf first
///     o.private_key_file = "server.key";
///     o.alpn = {"http/1.1"};
///     result<tls::context> server = tls::context::server(o);
///
///     result<tls::context> client = tls::context::client({});  // system trust
///
/// Safe by default: a client verifies the server's certificate against the
/// system's trust store (or the CAs given) and checks it names the server it
/// connects to; TLS 1.2 is the oldest version spoken; renegotiation is
/// refused; session resumption (tickets) is on. A context is a shared handle:
/// copies refer to the same context, which lives while any stream made from
/// it does, and may be used from several threads (a loop group's loops).

#include <spindle/result.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct ssl_ctx_st;

namespace spindle::tls {

enum class version : std::uint8_t { tls1_2, tls1_3 };

struct context_options {
    /// This side's certificate chain (PEM, the leaf first) and private key
    /// (PEM), from files or given in memory: a server needs one pair, a
    /// client only for client authentication. Set the file or the text of
    /// each, not both.
    std::string certificate_file{};
    std::string certificate_pem{};
    std::string private_key_file{};
    std::string private_key_pem{};

    /// Certificates (PEM) to trust, from files or in memory. None given: a
    /// client trusts the system's store (Debian: /etc/ssl/certs).
    std::vector<std::string> ca_files{};
    std::string ca_pem{};

    /// Clients: verify the server's certificate and its name (on unless
    /// turned off; turn it off in tests only). Servers: verify a client's
    /// certificate when it sends one, against the CAs given.
    bool verify_peer = true;
    /// Servers: refuse a client that sends no certificate (client
    /// authentication; needs ca_files or ca_pem).
    bool require_client_certificate = false;

    /// Application protocols. A server picks the first of its list that the
    /// client offers, and refuses a client that offers only others; a client
    /// offers these, in order. Empty: no ALPN.
    std::vector<std::string> alpn{};

    version min_version = version::tls1_2;
    version max_version = version::tls1_3;

    /// Resumption: a server issues session tickets, a client keeps the
    /// sessions it was given (per server name) and offers them again.
    bool session_resumption = true;

    /// Bounds of a stream's handshake() and shutdown() (zero: none). A
    /// handshake past its bound fails with timed_out, so a client that
    /// stalls half-way cannot hold a server's connection open.
    std::chrono::milliseconds handshake_timeout{10'000};
    std::chrono::milliseconds shutdown_timeout{2'000};
};

namespace detail {
struct context_state;
}  // namespace detail

class context {
public:
    /// A context for clients. Fails with a clear error for a key or
    /// certificate that cannot be read or does not fit, a CA file missing...
    static result<context> client(const context_options& options);
    /// A context for servers: needs a certificate and its key.
    static result<context> server(const context_options& options);

    bool is_server() const noexcept;
    const context_options& options() const noexcept;
    /// OpenSSL's context, for settings spindle does not offer (ciphers,
    /// curves). Change it before any stream is made from it.
    ssl_ctx_st* native_handle() const noexcept;

    /// Sessions a client context keeps for resumption now.
    std::size_t cached_sessions() const;

    /// A context is made by client() or server(); the default one is empty.
    context() noexcept = default;
    explicit operator bool() const noexcept { return static_cast<bool>(m_state); }

    /// The shared state, for the streams made from it.
    const std::shared_ptr<detail::context_state>& state() const noexcept { return m_state; }

    /// What client() and server() build on.
    explicit context(std::shared_ptr<detail::context_state> state) noexcept : m_state(std::move(state)) {}

private:
    std::shared_ptr<detail::context_state> m_state;
};

}  // namespace spindle::tls
