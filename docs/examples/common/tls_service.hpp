#pragma once
// TLS for the example services: --tls-cert FILE and --tls-key FILE, and a
// connection handler that does the server handshake before the service's own
// code runs on the encrypted stream. Built when spindle is built with TLS
// (SPINDLE_HAVE_TLS); without it, the flags say so and the program exits.

#include "service.hpp"

#if SPINDLE_HAVE_TLS
#include <spindle/tls.hpp>
#endif

#include <array>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace spindle::examples {

struct tls_flags {
    std::string certificate;
    std::string key;

    bool enabled() const noexcept { return !certificate.empty() || !key.empty(); }

    /// The two flags, for service_info::flags (with the program's own).
    std::array<service_flag, 2> flags() {
        return {
            service_flag{"--tls-cert", "FILE", "serve TLS with this certificate chain (PEM, leaf first); needs --tls-key",
                         [this](std::string_view v) { certificate = v; return std::string(); }},
            service_flag{"--tls-key", "FILE", "the certificate's private key (PEM)",
                         [this](std::string_view v) { key = v; return std::string(); }},
        };
    }
};

#if SPINDLE_HAVE_TLS

/// The server context of --tls-cert/--tls-key, offering `alpn`; says why on
/// stderr and returns an empty context when it cannot be made.
inline tls::context server_context(const tls_flags& flags, std::string_view name, std::vector<std::string> alpn) {
    const int n = static_cast<int>(name.size());
    if (flags.certificate.empty() || flags.key.empty()) {
        std::fprintf(stderr, "%.*s: --tls-cert and --tls-key go together\n", n, name.data());
        return {};
    }
    tls::context_options o;
    o.certificate_file = flags.certificate;
    o.private_key_file = flags.key;
    o.alpn = std::move(alpn);
    result<tls::context> ctx = tls::context::server(o);
    if (!ctx) {
        std::fprintf(stderr, "%.*s: TLS: %s\n", n, name.data(), ctx.error().message().c_str());
        return {};
    }
    return *ctx;
}

/// A connection handler for serve_tcp: the TLS handshake (bounded by the
/// context's handshake timeout, so a client that stalls cannot hold the
/// connection), then `serve(stream, stop)` on the encrypted stream, then
/// close_notify both ways.
template <class Serve>
struct tls_handler {
    tls::context ctx;
    Serve serve;

    task<void> operator()(net::tcp_stream tcp, std::stop_token stop) const { return run(ctx, std::move(tcp), std::move(stop), serve); }

private:
    static task<void> run(tls::context ctx, net::tcp_stream tcp, std::stop_token stop, Serve serve) {
        result<tls::tcp_stream> stream = tls::tcp_stream::server(ctx, std::move(tcp));
        if (!stream) {
            logger()->warn("tls: {}", stream.error().message());
            co_return;
        }
        // A failed handshake is the client's doing (a scanner, plain HTTP, a
        // certificate it refuses): debug, not a warning.
        if (result<void> h = co_await stream->handshake(stop); !h) {
            logger()->debug("tls handshake: {}", h.error().message());
            co_return;
        }
        co_await serve(*stream, stop);
        if (!stop.stop_requested()) (void)co_await stream->shutdown(stop);
    }
};

template <class Serve>
tls_handler<Serve> serve_tls(tls::context ctx, Serve serve) {
    return {std::move(ctx), std::move(serve)};
}

#endif

/// Says that this build has no TLS: the status to exit with.
inline int no_tls(std::string_view name) {
    std::fprintf(stderr, "%.*s: built without TLS (OpenSSL 3 not found, or -Dtls=disabled)\n", static_cast<int>(name.size()),
                 name.data());
    return 2;
}

}  // namespace spindle::examples
