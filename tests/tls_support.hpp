#pragma once
// Certificates for the TLS tests, made while they run (no key is committed):
// a CA, a server certificate it signs for localhost, 127.0.0.1 and ::1, an
// expired one, a client certificate, and a second CA nobody trusts. ECDSA
// P-256 throughout, as a modern server would use.

#include "catch.hpp"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace spindle::test {

struct pem_pair {
    std::string certificate;
    std::string key;
};

namespace detail {

inline std::string pem_of_bio(BIO* bio) {
    char* data = nullptr;
    const long size = BIO_get_mem_data(bio, &data);
    std::string out(data, static_cast<std::size_t>(size));
    BIO_free(bio);
    return out;
}

inline void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    REQUIRE(ext != nullptr);
    REQUIRE(X509_add_ext(cert, ext, -1) == 1);
    X509_EXTENSION_free(ext);
}

/// A certificate for `key`, signed by `issuer` (itself when null), valid
/// from `from` to `until` seconds from now.
inline X509* make_certificate(EVP_PKEY* key, const char* common_name, X509* issuer, EVP_PKEY* issuer_key, bool ca,
                              const char* alt_names, long from, long until) {
    X509* cert = X509_new();
    REQUIRE(cert != nullptr);
    X509_set_version(cert, 2);
    std::uint64_t serial = 0;
    REQUIRE(RAND_bytes(reinterpret_cast<unsigned char*>(&serial), sizeof serial) == 1);
    ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert), serial >> 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), from);
    X509_gmtime_adj(X509_getm_notAfter(cert), until);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name), -1, -1, 0);
    X509_set_issuer_name(cert, issuer != nullptr ? X509_get_subject_name(issuer) : name);
    X509* signer = issuer != nullptr ? issuer : cert;
    add_extension(cert, signer, NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
    add_extension(cert, signer, NID_key_usage, ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature");
    add_extension(cert, signer, NID_subject_key_identifier, "hash");
    if (issuer != nullptr) add_extension(cert, signer, NID_authority_key_identifier, "keyid");
    if (!ca) add_extension(cert, signer, NID_ext_key_usage, "serverAuth,clientAuth");
    if (alt_names != nullptr) add_extension(cert, signer, NID_subject_alt_name, alt_names);
    REQUIRE(X509_sign(cert, issuer_key != nullptr ? issuer_key : key, EVP_sha256()) > 0);
    return cert;
}

inline std::string certificate_pem(X509* cert) {
    BIO* bio = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(bio, cert);
    return pem_of_bio(bio);
}

inline std::string key_pem(EVP_PKEY* key) {
    BIO* bio = BIO_new(BIO_s_mem());
    PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
    return pem_of_bio(bio);
}

}  // namespace detail

struct test_pki {
    std::string ca;          ///< the trusted CA's certificate
    pem_pair server;         ///< localhost, 127.0.0.1, ::1; signed by ca
    pem_pair expired;        ///< as server, but expired yesterday
    pem_pair client;         ///< a client certificate signed by ca
    pem_pair stranger;       ///< localhost, signed by a CA nobody trusts
    std::string stranger_ca;

    /// Made once per test program.
    static const test_pki& get() {
        static const test_pki pki = make();
        return pki;
    }

private:
    static test_pki make() {
        using namespace detail;
        constexpr long day = 24 * 3600;
        constexpr const char* names = "DNS:localhost,IP:127.0.0.1,IP:::1";
        test_pki p;
        EVP_PKEY* ca_key = EVP_EC_gen("P-256");
        X509* ca = make_certificate(ca_key, "spindle test CA", nullptr, nullptr, true, nullptr, -day, 30 * day);
        p.ca = certificate_pem(ca);
        auto leaf = [&](const char* cn, const char* alt, long from, long until, X509* issuer, EVP_PKEY* issuer_key) {
            EVP_PKEY* key = EVP_EC_gen("P-256");
            X509* cert = make_certificate(key, cn, issuer, issuer_key, false, alt, from, until);
            pem_pair out{certificate_pem(cert), key_pem(key)};
            X509_free(cert);
            EVP_PKEY_free(key);
            return out;
        };
        p.server = leaf("localhost", names, -day, 30 * day, ca, ca_key);
        p.expired = leaf("localhost", names, -3 * day, -day, ca, ca_key);
        p.client = leaf("spindle test client", nullptr, -day, 30 * day, ca, ca_key);
        EVP_PKEY* other_key = EVP_EC_gen("P-256");
        X509* other = make_certificate(other_key, "untrusted CA", nullptr, nullptr, true, nullptr, -day, 30 * day);
        p.stranger_ca = certificate_pem(other);
        p.stranger = leaf("localhost", names, -day, 30 * day, other, other_key);
        X509_free(other);
        EVP_PKEY_free(other_key);
        X509_free(ca);
        EVP_PKEY_free(ca_key);
        return p;
    }
};

/// A temporary directory removed with this object, for files that tools
/// outside the process (openssl, curl) read.
class temp_dir {
public:
    temp_dir() {
        std::string pattern = (std::filesystem::temp_directory_path() / "spindle-tls-XXXXXX").string();
        REQUIRE(::mkdtemp(pattern.data()) != nullptr);
        m_path = pattern;
    }
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::remove_all(m_path, ec);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;

    /// Writes `text` to `name` in the directory: its path.
    std::string write(const std::string& name, const std::string& text) const {
        const std::filesystem::path file = m_path / name;
        std::ofstream out(file, std::ios::binary);
        out << text;
        REQUIRE(out.good());
        return file.string();
    }
    const std::filesystem::path& path() const noexcept { return m_path; }

private:
    std::filesystem::path m_path;
};

}  // namespace spindle::test
