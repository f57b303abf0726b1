#include <spindle/tls/error.hpp>

#include <openssl/err.h>
#include <openssl/x509.h>

#include <string>

namespace spindle::tls {

namespace {

using detail::is_verify_code;

class category final : public std::error_category {
public:
    const char* name() const noexcept override { return "spindle.tls"; }

    std::string message(int value) const override {
        if (is_verify_code(value)) {
            return std::string("certificate verify failed: ") +
                   X509_verify_cert_error_string(static_cast<long>(-value));
        }
        switch (static_cast<errc>(value)) {
            case errc::truncated: return "the peer closed the connection without close_notify (truncated)";
            case errc::certificate_verify_failed: return "certificate verify failed";
            case errc::server_name_required:
                return "a client that verifies its peer needs the server's name (or verify_peer = false)";
            case errc::wrong_context: return "the TLS context does not fit this use";
            case errc::certificate_without_key: return "a certificate needs its private key, and a key its certificate";
            case errc::file_and_pem: return "a certificate or key given both as a file and in memory";
            case errc::client_certificate_without_ca:
                return "require_client_certificate needs CAs (ca_files or ca_pem) to check client certificates against";
            case errc::no_version: return "min_version is above max_version";
            case errc::bad_alpn_name: return "an ALPN protocol name must be 1 to 255 bytes";
        }
        const auto code = static_cast<unsigned long>(value);
        const char* reason = ERR_reason_error_string(code);
        const char* library = ERR_lib_error_string(code);
        if (reason == nullptr) return "OpenSSL error " + std::to_string(ERR_GET_LIB(code)) + ":" + std::to_string(ERR_GET_REASON(code));
        // The SSL library's reasons speak for themselves; others (PEM, X509,
        // EVP) say more with their library's name.
        if (ERR_GET_LIB(code) == ERR_LIB_SSL || library == nullptr) return reason;
        return std::string(library) + ": " + reason;
    }

    bool equivalent(int value, const std::error_condition& condition) const noexcept override {
        if (condition.category() == *this && condition.value() == static_cast<int>(errc::certificate_verify_failed)) {
            return is_verify_code(value) || value == static_cast<int>(errc::certificate_verify_failed);
        }
        return std::error_category::equivalent(value, condition);
    }
};

}  // namespace

const std::error_category& tls_category() noexcept {
    static const category instance;
    return instance;
}

namespace detail {

std::error_code take_openssl_error(std::error_code fallback) noexcept {
    const unsigned long code = ERR_get_error();
    ERR_clear_error();
    if (code == 0) return fallback;
    if (ERR_SYSTEM_ERROR(code)) return {ERR_GET_REASON(code), std::system_category()};
    // Keep the library and the reason; both fit in 31 bits.
    const int packed = static_cast<int>(ERR_PACK(ERR_GET_LIB(code), 0, ERR_GET_REASON(code)));
    return {packed, tls_category()};
}

}  // namespace detail

}  // namespace spindle::tls
