#pragma once
/// Errors of the TLS layer, in their own category ("spindle.tls"), each with
/// OpenSSL's reason in its message:
///
/// - a certificate the peer sent that did not verify:
///   "certificate verify failed: self-signed certificate", equal to
///   `tls::errc::certificate_verify_failed` whatever the reason;
/// - an error OpenSSL raised (a malformed record, an alert from the peer, a
///   PEM file that is not one): its reason, e.g. "wrong version number",
///   "tlsv1 alert unknown ca", "PEM routines: no start line";
/// - spindle's own, below.
///
/// Compare with the enum, which names conditions (as std::errc does):
/// `r.error() == tls::errc::truncated`.
///
/// Errors of the stream underneath (connection_reset, broken_pipe) and of
/// the runtime (operation_canceled, timed_out) pass through unchanged.

#include <system_error>

namespace spindle::tls {

enum class errc {
    /// The peer ended the connection without close_notify, so what was read
    /// may have been cut short by an attacker (or a careless peer): not a
    /// clean end of stream.
    truncated = 1,
    /// Compares equal to every verification failure, whatever its reason.
    certificate_verify_failed,
    /// A client was given neither a server name to check the certificate
    /// against, nor verify_peer = false.
    server_name_required,
    /// The context cannot do what was asked of it: a server context without
    /// a certificate, a client stream made from a server context.
    wrong_context,
    /// context_options that do not fit together, each named:
    certificate_without_key,        ///< a certificate without its key, or a key alone
    file_and_pem,                   ///< one of certificate, key given as a file and in memory
    client_certificate_without_ca,  ///< require_client_certificate with no CA to check against
    no_version,                     ///< min_version above max_version
    bad_alpn_name,                  ///< an ALPN protocol name empty or over 255 bytes
};

const std::error_category& tls_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), tls_category()}; }
inline std::error_condition make_error_condition(errc e) noexcept { return {static_cast<int>(e), tls_category()}; }

namespace detail {

/// Codes of the category: spindle's own (errc: small positive numbers),
/// OpenSSL's packed error codes (library << 23 | reason: positive, at least
/// 1 << 23) and certificate verification results (X509_V_ERR_*, negated).
constexpr int verify_code(int x509_verify_result) noexcept { return -x509_verify_result; }
constexpr bool is_verify_code(int value) noexcept { return value < 0; }

/// The oldest error on this thread's OpenSSL queue as an error_code (the
/// queue is cleared), or `fallback` when it is empty.
std::error_code take_openssl_error(std::error_code fallback) noexcept;

}  // namespace detail

}  // namespace spindle::tls

template <>
struct std::is_error_condition_enum<spindle::tls::errc> : std::true_type {};
