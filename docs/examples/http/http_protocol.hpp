#pragma once
/// The protocol core of the example HTTP/1.1 server, with no I/O in it.
///
/// A connection keeps one read buffer and one output_buffer. Per batch it does
/// one read, one handle_batch over everything buffered, one write of the
/// output, then drops `consumed` bytes from the front of the read buffer. Any
/// pipelined requests that arrived together are answered by that single write.
///
/// Nothing here allocates per request: parse results are views into the
/// caller's bytes, and responses are appended to a buffer whose capacity
/// survives clear(). (A dynamic_route's body is the exception: it is made
/// anew for each request of it.)

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace spindle::examples::http {

/// What a peer may send before we refuse it. The defaults follow nginx: its
/// large header buffers hold 8 KiB, and client_max_body_size is 1 MiB.
struct parse_limits {
    /// Bytes of the head, from the first byte through the empty line that ends it.
    std::size_t max_head = 8192;
    /// Largest Content-Length accepted.
    std::size_t max_body = 1024 * 1024;
};

enum class parse_status : std::uint8_t {
    complete,               ///< a whole request, its body included, is buffered
    incomplete,             ///< nothing wrong yet; read more, then parse all buffered bytes again
    bad_request,            ///< malformed: answer 400 and close
    too_large,              ///< the head is longer than max_head: answer 431 and close
    body_too_large,         ///< Content-Length above max_body: answer 413 and close
    not_implemented,        ///< Transfer-Encoding present (chunked bodies unsupported): answer 501 and close
    version_not_supported,  ///< HTTP major version other than 1: answer 505 and close
};

/// One parsed request. Every view points into the bytes given to parse_request
/// and is valid as long as they are.
struct parse_result {
    parse_status status = parse_status::incomplete;
    /// complete: bytes of this request, head and body; the next request starts here.
    /// Zero for every other status.
    std::size_t consumed = 0;
    /// Set for complete and body_too_large; empty otherwise.
    std::string_view method;
    std::string_view target;
    /// complete: the Content-Length bytes after the head (empty without a body).
    std::string_view body;
    /// 0 or 1. HTTP/1.2 and later minors are read as 1, as RFC 9110 §2.5 asks.
    int version_minor = 0;
    /// Whether the connection stays open after the response: HTTP/1.1 unless
    /// `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`.
    bool keep_alive = false;
    /// The request's Content-Length, if it sent one; saturates at UINT64_MAX.
    std::optional<std::uint64_t> content_length;
};

/// Parses the request at the start of `buffered`.
///
/// Stateless: after `incomplete`, call again with the same bytes plus the new
/// ones. Every proper prefix of a valid request is `incomplete`; malformed
/// input is reported at the first byte that shows it (a TLS hello at its
/// first byte), except that the version waits for all of its 8 bytes. Lines
/// may end in CRLF or in a bare LF, as in nginx; a CR anywhere else is
/// malformed. Empty lines before the request line are skipped and counted in
/// `consumed` (RFC 9112 §2.2). Also `bad_request`: an HTTP/1.1 request
/// without Host, any request with two (RFC 9112 §3.2), whitespace before a
/// header's colon, a folded header line, and a Content-Length that is not
/// digits or disagrees with another one.
///
/// The head is too large when no empty line ends it within the first
/// `max_head` bytes: a head of exactly `max_head` bytes is accepted, and
/// `too_large` comes as soon as `max_head` bytes are buffered without the end
/// of the head among them. A body is waited for only up to `max_body` bytes;
/// a larger Content-Length is refused from the head alone.
[[nodiscard]] parse_result parse_request(std::string_view buffered, const parse_limits& limits = {}) noexcept;

/// Response bytes for one connection, reused from batch to batch so that a
/// connection in steady state does not allocate.
class output_buffer {
public:
    output_buffer() = default;
    explicit output_buffer(std::size_t capacity) { m_bytes.reserve(capacity); }

    /// Forgets the contents and keeps the capacity.
    void clear() noexcept { m_bytes.clear(); }
    void reserve(std::size_t capacity) { m_bytes.reserve(capacity); }

    void append(std::string_view text) { m_bytes.append(text); }
    /// Appends `value` in decimal.
    void append_decimal(std::uint64_t value);

    [[nodiscard]] std::string_view view() const noexcept { return m_bytes; }
    /// The contents in the form spindle::write takes.
    [[nodiscard]] std::span<const std::byte> bytes() const noexcept {
        return std::as_bytes(std::span<const char>(m_bytes.data(), m_bytes.size()));
    }
    [[nodiscard]] std::size_t size() const noexcept { return m_bytes.size(); }
    [[nodiscard]] bool empty() const noexcept { return m_bytes.empty(); }
    [[nodiscard]] std::size_t capacity() const noexcept { return m_bytes.capacity(); }

private:
    std::string m_bytes;
};

/// What append_response writes besides the status line and the framing headers.
struct response_options {
    std::string_view content_type = "text/plain";
    /// Whole header lines, each ending in CRLF, written after the standard ones.
    std::string_view extra_headers;
    /// For HEAD: the headers GET would get, Content-Length included, and no body.
    bool head_only = false;
    /// Writes `Connection: keep-alive` on a kept connection. An HTTP/1.0
    /// client assumes the server closes unless it says this.
    bool announce_keep_alive = false;
};

/// Appends `HTTP/1.1 <status> <reason>`, then Server, Content-Length and
/// Content-Type, then `Connection: close` when `keep_alive` is false, then the
/// extra headers, the empty line and `body`.
/// Precondition: 100 <= status <= 999; `reason` and the extra headers hold no CR or LF.
void append_response(output_buffer& out, int status, std::string_view reason, std::string_view body,
                     bool keep_alive, const response_options& options = {});

/// A resource whose body the program makes when it is asked for (a metrics
/// page): GET and HEAD of exactly `path` answer 200 with what `render()`
/// returns, as `content_type`.
struct dynamic_route {
    std::string_view path;
    std::string_view content_type = "text/plain";
    std::function<std::string()> render;
};

/// What handle_batch serves.
struct route_table {
    /// `/` ("Hello, World!") and `/bytes/N`, the example server's own; a
    /// server that only shows its metrics turns them off.
    bool builtin = true;
    /// Looked at before the built-in resources, in order.
    std::span<const dynamic_route> dynamic;
};

struct batch_result {
    /// Bytes of the requests answered; drop them from the front of the read
    /// buffer. Bytes of a rejected request are not counted.
    std::size_t consumed = 0;
    /// Responses appended to the output buffer.
    std::size_t responses = 0;
    /// Write the output buffer, then close the connection.
    bool close = false;
};

/// Answers every complete request at the start of `input`, appending one
/// response per request to `out` (which it does not clear):
///   GET of a path in routes.dynamic (any query) → 200 with what it renders;
///   with routes.builtin, GET of `/` (any query) → 200 "Hello, World!", and
///   of `/bytes/N` → N bytes (at most 1 MiB);
///   GET of any other target → 404 "Not Found";
///   HEAD → the headers GET would get, without the body;
///   any other method → 405 with `Allow: GET, HEAD`.
/// Stops after a request that does not keep the connection alive, and after a
/// rejected request, which gets its error response with `Connection: close`.
/// A trailing incomplete request is left unconsumed for the next read.
batch_result handle_batch(std::string_view input, output_buffer& out, const parse_limits& limits = {},
                          const route_table& routes = {});

}  // namespace spindle::examples::http
