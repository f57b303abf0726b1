#pragma once
// What a tls::context shares among its copies and its streams (private to
// the TLS library).

#include <spindle/tls/context.hpp>

#include <openssl/ssl.h>

#include <mutex>
#include <string>
#include <unordered_map>

namespace spindle::tls::detail {

struct context_state {
    context_state() = default;
    context_state(const context_state&) = delete;
    context_state& operator=(const context_state&) = delete;
    ~context_state();

    SSL_CTX* ctx = nullptr;
    bool server = false;
    context_options options;
    /// ALPN protocols in wire format (length-prefixed).
    std::string alpn_wire;

    /// A client's sessions for resumption, by server name, each holding one
    /// reference. Streams of several loop threads share it, hence the lock;
    /// it is taken once per handshake and once per ticket, never per record.
    mutable std::mutex sessions_lock;
    std::unordered_map<std::string, SSL_SESSION*> sessions;
    static constexpr std::size_t max_sessions = 1024;

    /// Takes over `s` as the session to offer `key` next (true), or leaves it.
    bool keep_session(const std::string& key, SSL_SESSION* s);
    /// A copy of the session to offer `key`, the caller's own, or null. The
    /// copy is made under the lock: a cached session is only ever read or
    /// freed there, so no reference to it outlives the lock (OpenSSL's own
    /// reference counts are atomics a thread checker cannot see).
    SSL_SESSION* session_copy_for(const std::string& key) const;
};

}  // namespace spindle::tls::detail
