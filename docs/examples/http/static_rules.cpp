#include "static_rules.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace spindle::examples::http {

namespace {

bool iequals(std::string_view a, std::string_view b) noexcept {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
}

int hex_digit(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

std::string_view trim(std::string_view s) noexcept {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}

std::optional<std::uint64_t> number(std::string_view s) noexcept {
    if (s.empty()) return std::nullopt;
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
    return v;
}

}  // namespace

std::optional<std::string> file_of_target(std::string_view target) {
    target = target.substr(0, target.find('?'));
    if (target.empty() || target.front() != '/') return std::nullopt;
    std::string path;
    for (std::size_t i = 1; i < target.size(); ++i) {
        char c = target[i];
        if (c == '%') {
            if (i + 2 >= target.size()) return std::nullopt;  // cut short
            const int hi = hex_digit(target[i + 1]), lo = hex_digit(target[i + 2]);
            if (hi < 0 || lo < 0) return std::nullopt;
            c = static_cast<char>(hi * 16 + lo);
            // An encoded NUL, dot or slash only ever serves to get round
            // the checks below.
            if (c == '\0' || c == '.' || c == '/' || c == '\\') return std::nullopt;
            i += 2;
        } else if (c == '\0') {
            return std::nullopt;
        }
        path += c;
    }
    // Every segment a name: no "." or "..", no empty one but the last.
    std::size_t start = 0;
    while (start <= path.size()) {
        const std::size_t end = std::min(path.find('/', start), path.size());
        const std::string_view segment(path.data() + start, end - start);
        if (segment == "." || segment == "..") return std::nullopt;
        if (segment.empty() && end != path.size()) return std::nullopt;
        start = end + 1;
    }
    if (path.empty() || path.back() == '/') path += "index.html";
    return path;
}

std::optional<std::string_view> header_value(std::string_view head, std::string_view name) noexcept {
    std::size_t at = head.find('\n');  // past the request line
    while (at != std::string_view::npos && at + 1 < head.size()) {
        const std::size_t start = at + 1;
        const std::size_t end = std::min(head.find('\n', start), head.size());
        const std::string_view line = head.substr(start, end - start);
        const std::size_t colon = line.find(':');
        if (colon != std::string_view::npos && iequals(line.substr(0, colon), name))
            return trim(line.substr(colon + 1));
        at = end < head.size() ? end : std::string_view::npos;
    }
    return std::nullopt;
}

range_answer parse_range(std::optional<std::string_view> value, std::uint64_t size, byte_range& out) noexcept {
    if (!value) return range_answer::whole;
    std::string_view v = trim(*value);
    if (v.size() < 6 || !iequals(v.substr(0, 6), "bytes=")) return range_answer::whole;
    v = trim(v.substr(6));
    if (v.find(',') != std::string_view::npos) return range_answer::whole;  // several: the whole file
    const std::size_t dash = v.find('-');
    if (dash == std::string_view::npos) return range_answer::whole;
    const std::optional<std::uint64_t> a = number(trim(v.substr(0, dash)));
    const std::optional<std::uint64_t> b = number(trim(v.substr(dash + 1)));
    if (!a) {
        // bytes=-n: the last n bytes.
        if (!b) return range_answer::whole;
        if (*b == 0 || size == 0) return range_answer::unsatisfiable;
        out.length = std::min(*b, size);
        out.first = size - out.length;
        return range_answer::partial;
    }
    if (!trim(v.substr(dash + 1)).empty() && !b) return range_answer::whole;
    if (b && *b < *a) return range_answer::whole;  // invalid: ignored
    if (*a >= size) return range_answer::unsatisfiable;
    const std::uint64_t last = b ? std::min(*b, size - 1) : size - 1;
    out.first = *a;
    out.length = last - *a + 1;
    return range_answer::partial;
}

std::string http_date(std::chrono::system_clock::time_point t) {
    const std::time_t secs = std::chrono::system_clock::to_time_t(t);
    std::tm tm{};
    ::gmtime_r(&secs, &tm);
    static constexpr const char* days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static constexpr const char* months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                             "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    char buf[40];
    std::snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday % 7], tm.tm_mday,
                  months[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
    return buf;
}

std::optional<std::chrono::system_clock::time_point> parse_http_date(std::string_view text) {
    // IMF-fixdate only (the form every client sends today).
    text = trim(text);
    if (text.size() != 29 || text.substr(25) != " GMT") return std::nullopt;
    static constexpr std::string_view months = "JanFebMarAprMayJunJulAugSepOctNovDec";
    const auto num = [&](std::size_t at, std::size_t len) { return number(text.substr(at, len)); };
    const std::size_t month = months.find(text.substr(8, 3));
    const auto day = num(5, 2), year = num(12, 4), hour = num(17, 2), minute = num(20, 2), second = num(23, 2);
    if (month == std::string_view::npos || month % 3 || !day || !year || !hour || !minute || !second)
        return std::nullopt;
    std::tm tm{};
    tm.tm_mday = static_cast<int>(*day);
    tm.tm_mon = static_cast<int>(month / 3);
    tm.tm_year = static_cast<int>(*year) - 1900;
    tm.tm_hour = static_cast<int>(*hour);
    tm.tm_min = static_cast<int>(*minute);
    tm.tm_sec = static_cast<int>(*second);
    const std::time_t secs = ::timegm(&tm);
    if (secs == static_cast<std::time_t>(-1)) return std::nullopt;
    return std::chrono::system_clock::from_time_t(secs);
}

std::string_view content_type_of(std::string_view path) noexcept {
    static constexpr std::pair<std::string_view, std::string_view> types[] = {
        {"html", "text/html; charset=utf-8"},
        {"htm", "text/html; charset=utf-8"},
        {"css", "text/css; charset=utf-8"},
        {"js", "text/javascript; charset=utf-8"},
        {"json", "application/json"},
        {"txt", "text/plain; charset=utf-8"},
        {"xml", "application/xml"},
        {"svg", "image/svg+xml"},
        {"png", "image/png"},
        {"jpg", "image/jpeg"},
        {"jpeg", "image/jpeg"},
        {"gif", "image/gif"},
        {"webp", "image/webp"},
        {"ico", "image/x-icon"},
        {"wasm", "application/wasm"},
        {"pdf", "application/pdf"},
        {"mp4", "video/mp4"},
        {"woff2", "font/woff2"},
    };
    const std::size_t dot = path.rfind('.');
    const std::size_t slash = path.rfind('/');
    if (dot == std::string_view::npos || (slash != std::string_view::npos && dot < slash))
        return "application/octet-stream";
    const std::string_view ext = path.substr(dot + 1);
    for (const auto& [e, type] : types)
        if (iequals(e, ext)) return type;
    return "application/octet-stream";
}

// --- SHA-256 (FIPS 180-4) ------------------------------------------------------

namespace {

constexpr std::array<std::uint32_t, 64> round_constants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

constexpr std::uint32_t rotr(std::uint32_t x, int n) noexcept { return (x >> n) | (x << (32 - n)); }

void compress(std::array<std::uint32_t, 8>& h, const unsigned char* block) noexcept {
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i)
        w[i] = (std::uint32_t(block[4 * i]) << 24) | (std::uint32_t(block[4 * i + 1]) << 16) |
               (std::uint32_t(block[4 * i + 2]) << 8) | std::uint32_t(block[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
        const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; ++i) {
        const std::uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                                 round_constants[static_cast<std::size_t>(i)] + w[i];
        const std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

}  // namespace

std::string sha256_hex(std::string_view data) {
    std::array<std::uint32_t, 8> h = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
    std::size_t whole = data.size() / 64 * 64;
    for (std::size_t i = 0; i < whole; i += 64) compress(h, bytes + i);
    unsigned char tail[128] = {};
    const std::size_t left = data.size() - whole;
    std::memcpy(tail, bytes + whole, left);
    tail[left] = 0x80;
    const std::size_t tail_size = left + 1 + 8 <= 64 ? 64 : 128;
    const std::uint64_t bits = static_cast<std::uint64_t>(data.size()) * 8;
    for (int i = 0; i < 8; ++i)
        tail[tail_size - 1 - static_cast<std::size_t>(i)] = static_cast<unsigned char>(bits >> (8 * i));
    for (std::size_t i = 0; i < tail_size; i += 64) compress(h, tail + i);
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(64);
    for (std::uint32_t word : h)
        for (int shift = 28; shift >= 0; shift -= 4) out += digits[(word >> shift) & 0xf];
    return out;
}

}  // namespace spindle::examples::http
