#pragma once
/// The rules of spindle-http's static files (--root), with no I/O in them:
/// which path a target names, which byte range a Range header asks for,
/// HTTP dates, content types, a request header's value, and SHA-256 (for
/// POST /sha256).

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace spindle::examples::http {

/// The file a request target names, relative to the root, or nothing when
/// the target is refused: not starting with '/', a bad or percent-encoded
/// NUL, dot or slash (%00, %2e, %2f, %5c), a "." or ".." segment. The query
/// is dropped; a target ending in '/' names its index.html.
[[nodiscard]] std::optional<std::string> file_of_target(std::string_view target);

/// The value of header `name` (any case) in a request head, without the
/// spaces around it; nothing when it is absent.
[[nodiscard]] std::optional<std::string_view> header_value(std::string_view head, std::string_view name) noexcept;

struct byte_range {
    std::uint64_t first = 0;
    std::uint64_t length = 0;
};
enum class range_answer : std::uint8_t { whole, partial, unsatisfiable };
/// What `Range: <value>` asks of a file of `size` bytes: one range
/// (bytes=a-b, a-, -n), clipped to the file; whole for anything else (no
/// header, several ranges, another unit), as RFC 9110 allows.
[[nodiscard]] range_answer parse_range(std::optional<std::string_view> value, std::uint64_t size,
                                       byte_range& out) noexcept;

/// "Sun, 06 Nov 1994 08:49:37 GMT" (IMF-fixdate), and back.
[[nodiscard]] std::string http_date(std::chrono::system_clock::time_point t);
[[nodiscard]] std::optional<std::chrono::system_clock::time_point> parse_http_date(std::string_view text);

/// By the file name's extension; application/octet-stream when unknown.
[[nodiscard]] std::string_view content_type_of(std::string_view path) noexcept;

/// SHA-256 of `data`, in lower-case hex.
[[nodiscard]] std::string sha256_hex(std::string_view data);

}  // namespace spindle::examples::http
