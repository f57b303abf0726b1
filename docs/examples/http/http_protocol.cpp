#include "http_protocol.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <iterator>
#include <limits>

namespace spindle::examples::http {

namespace {

using byte_table = std::array<bool, 256>;

template <class Pred>
constexpr byte_table make_table(Pred pred) {
    byte_table table{};
    for (std::size_t c = 0; c < table.size(); ++c) table[c] = pred(static_cast<unsigned char>(c));
    return table;
}

constexpr bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
constexpr bool is_alpha(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// tchar (RFC 9110 §5.6.2): methods and field names.
constexpr byte_table token_chars = make_table([](unsigned char c) {
    return is_digit(c) || is_alpha(c) ||
           std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
});

// Field values (RFC 9110 §5.5): VCHAR, obs-text, SP and HTAB. Letting a CR,
// LF or NUL through is how a value smuggles a line break past a proxy that
// reads the header differently.
constexpr byte_table value_chars = make_table([](unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); });

// Targets: no controls and no SP. Bytes above 0x7f are not valid URI bytes,
// but they are routed by plain comparison and are harmless here; nginx
// accepts them too.
constexpr byte_table target_chars = make_table([](unsigned char c) { return c > 0x20 && c != 0x7f; });

/// The index of the first byte at or after `pos` that is not in `table`, or
/// the window's size. Each byte of a head passes through one such loop, once:
/// finding a delimiter and validating what precedes it is the same scan.
std::size_t skip(std::string_view window, std::size_t pos, const byte_table& table) noexcept {
    while (pos < window.size() && table[static_cast<unsigned char>(window[pos])]) ++pos;
    return pos;
}

// Targets and field values are most of a head's bytes, and most of their
// bytes are plain printable ASCII. Eight at a time, the arithmetic below asks
// whether a word holds any byte below a bound or a DEL (the bit tricks are
// the exact "hasless" and "haszero" tests of Sean Anderson's Bit Twiddling
// Hacks); only a word that does is looked at byte by byte. On a 234-byte
// browser request this took about a quarter off the parse time.
constexpr std::uint64_t every_byte = 0x0101010101010101;
constexpr std::uint64_t high_bits = 0x8080808080808080;

/// Whether a byte of `word` is below `bound` (at most 0x80) or is 0x7f.
constexpr bool has_byte_below_or_del(std::uint64_t word, std::uint8_t bound) noexcept {
    const std::uint64_t below = (word - every_byte * bound) & ~word & high_bits;
    const std::uint64_t del = word ^ (every_byte * 0x7f);
    return (below | ((del - every_byte) & ~del & high_bits)) != 0;
}

/// skip() for a table that holds every byte from `bound` up except 0x7f, and
/// perhaps some bytes below `bound`, which the bytewise tail then accepts.
std::size_t skip_printable(std::string_view window, std::size_t pos, std::uint8_t bound,
                           const byte_table& table) noexcept {
    while (window.size() - pos >= sizeof(std::uint64_t)) {
        std::uint64_t word;
        std::memcpy(&word, window.data() + pos, sizeof word);
        if (has_byte_below_or_del(word, bound)) break;
        pos += sizeof word;
    }
    return skip(window, pos, table);
}

/// Compares `text` with `lower`, which is lowercase ASCII, ignoring the case of `text`.
bool equals_lower(std::string_view text, std::string_view lower) noexcept {
    if (text.size() != lower.size()) return false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        char c = text[i];
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
        if (c != lower[i]) return false;
    }
    return true;
}

std::string_view trim_ows(std::string_view text) noexcept {
    while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
    while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
    return text;
}

/// Calls `each` with every element of a comma-separated list, OWS trimmed,
/// empty ones included, until `each` returns false. Returns false if it did.
template <class Each>
bool for_each_element(std::string_view list, Each each) {
    for (;;) {
        const std::size_t comma = list.find(',');
        if (!each(trim_ows(list.substr(0, comma)))) return false;
        if (comma == std::string_view::npos) return true;
        list.remove_prefix(comma + 1);
    }
}

// The steps below share parse_status: `complete` means this part is read and
// `pos` is past it, `incomplete` that the window ends first.

/// Reads a line end at `pos`. Both CRLF and a bare LF end a line: RFC 9112
/// §2.2 lets a recipient accept the bare LF, and clients typed by hand send
/// it. A CR followed by anything else is malformed (same section).
parse_status read_line_end(std::string_view window, std::size_t& pos) noexcept {
    if (pos >= window.size()) return parse_status::incomplete;
    if (window[pos] == '\n') {
        pos += 1;
        return parse_status::complete;
    }
    if (window[pos] != '\r') return parse_status::bad_request;
    if (pos + 1 >= window.size()) return parse_status::incomplete;
    if (window[pos + 1] != '\n') return parse_status::bad_request;
    pos += 2;
    return parse_status::complete;
}

/// Reads `token` up to `delimiter`, which must follow it, and moves past both.
parse_status read_token(std::string_view window, std::size_t& pos, char delimiter, std::string_view& token) noexcept {
    const std::size_t end = skip(window, pos, token_chars);
    if (end == window.size()) return parse_status::incomplete;
    // A byte that is neither a token byte nor the delimiter is wrong at once:
    // this refuses a TLS hello or binary noise at its first byte, not after 8 KiB.
    if (window[end] != delimiter || end == pos) return parse_status::bad_request;
    token = window.substr(pos, end - pos);
    pos = end + 1;
    return parse_status::complete;
}

parse_result with_status(parse_status status) noexcept {
    parse_result result;
    result.status = status;
    return result;
}

/// Reads `method SP target SP HTTP/d.d` and its line end, single spaces only:
/// the lenient whitespace splitting RFC 9112 §3 permits is what request
/// smuggling feeds on.
parse_status read_request_line(std::string_view window, std::size_t& pos, parse_result& out) noexcept {
    std::string_view method;
    if (const parse_status s = read_token(window, pos, ' ', method); s != parse_status::complete) return s;

    const std::size_t target_end = skip_printable(window, pos, 0x21, target_chars);
    if (target_end == window.size()) return parse_status::incomplete;
    if (window[target_end] != ' ' || target_end == pos) return parse_status::bad_request;
    const std::string_view target = window.substr(pos, target_end - pos);
    pos = target_end + 1;

    // HTTP-version is case-sensitive and has one digit on each side of the
    // dot (RFC 9112 §2.3); "HTTP/1.10" fails at the line end.
    constexpr std::size_t version_size = 8;
    if (window.size() - pos < version_size) return parse_status::incomplete;
    const std::string_view version = window.substr(pos, version_size);
    if (version.substr(0, 5) != "HTTP/" || !is_digit(static_cast<unsigned char>(version[5])) || version[6] != '.' ||
        !is_digit(static_cast<unsigned char>(version[7]))) {
        return parse_status::bad_request;
    }
    pos += version_size;
    if (const parse_status s = read_line_end(window, pos); s != parse_status::complete) return s;

    // Well formed but another major version (HTTP/0.9, the HTTP/2.0 preface,
    // HTTP/9.9): the framing that follows is not ours to guess.
    if (version[5] != '1') return parse_status::version_not_supported;

    out.method = method;
    out.target = target;
    out.version_minor = version[7] == '0' ? 0 : 1;
    return parse_status::complete;
}

/// Everything the header lines of one request decide.
struct header_facts {
    int host_count = 0;
    bool connection_close = false;
    bool connection_keep_alive = false;
    bool transfer_encoding = false;
    bool has_content_length = false;
    /// Digits of Content-Length without leading zeros. Comparing these, rather
    /// than values, also catches two differing values too long for 64 bits.
    std::string_view content_length_digits;
};

/// Takes one Content-Length line into `facts`. Repeats, as separate lines or
/// as a list, are accepted only when they all agree (RFC 9110 §8.6).
bool add_content_length(std::string_view value, header_facts& facts) {
    facts.has_content_length = true;
    return for_each_element(value, [&](std::string_view element) {
        if (element.empty() || !std::all_of(element.begin(), element.end(),
                                            [](char c) { return is_digit(static_cast<unsigned char>(c)); })) {
            return false;
        }
        while (element.size() > 1 && element.front() == '0') element.remove_prefix(1);
        if (facts.content_length_digits.empty()) facts.content_length_digits = element;
        return element == facts.content_length_digits;
    });
}

/// Takes what one header field says into `facts`; false if it is malformed.
bool add_field(std::string_view name, std::string_view value, header_facts& facts) {
    switch (name.size()) {
    case 4:
        if (equals_lower(name, "host")) ++facts.host_count;
        break;
    case 10:
        if (equals_lower(name, "connection")) {
            for_each_element(value, [&](std::string_view option) {
                if (equals_lower(option, "close")) facts.connection_close = true;
                if (equals_lower(option, "keep-alive")) facts.connection_keep_alive = true;
                return true;
            });
        }
        break;
    case 14:
        if (equals_lower(name, "content-length")) return add_content_length(value, facts);
        break;
    case 17:
        if (equals_lower(name, "transfer-encoding")) facts.transfer_encoding = true;
        break;
    default:
        break;
    }
    return true;
}

/// Reads header lines and the empty line after them. A name runs up to the
/// colon with no whitespace before it (RFC 9112 §5.1 asks for 400 otherwise),
/// which also refuses obsolete line folding, a line starting with SP or HTAB
/// (§5.2 allows the 400).
parse_status read_fields(std::string_view window, std::size_t& pos, header_facts& facts) noexcept {
    for (;;) {
        if (pos >= window.size()) return parse_status::incomplete;
        if (window[pos] == '\r' || window[pos] == '\n') return read_line_end(window, pos);

        std::string_view name;
        if (const parse_status s = read_token(window, pos, ':', name); s != parse_status::complete) return s;
        const std::size_t value_end = skip_printable(window, pos, 0x20, value_chars);
        // Values are read only as lists, whose elements are trimmed, so the
        // OWS around the whole value needs no pass of its own.
        const std::string_view value = window.substr(pos, value_end - pos);
        pos = value_end;
        if (const parse_status s = read_line_end(window, pos); s != parse_status::complete) return s;
        if (!add_field(name, value, facts)) return parse_status::bad_request;
    }
}

/// Content-Length digits as a number, saturated. At most 19 digits always fit.
std::uint64_t to_length(std::string_view digits) noexcept {
    if (digits.size() > 19) return std::numeric_limits<std::uint64_t>::max();
    std::uint64_t value = 0;
    for (const char c : digits) value = value * 10 + static_cast<std::uint64_t>(c - '0');
    return value;
}

struct error_reply {
    int status;
    std::string_view reason;
};

error_reply reply_for(parse_status status) noexcept {
    switch (status) {
    case parse_status::too_large: return {431, "Request Header Fields Too Large"};
    case parse_status::body_too_large: return {413, "Content Too Large"};
    case parse_status::not_implemented: return {501, "Not Implemented"};
    case parse_status::version_not_supported: return {505, "HTTP Version Not Supported"};
    // No default: a new status must get its reply here, and -Wswitch says so.
    case parse_status::bad_request:
    case parse_status::complete:
    case parse_status::incomplete: break;
    }
    return {400, "Bad Request"};
}

/// The largest /bytes/N answer: throughput tests download it.
constexpr std::size_t max_bulk = 1024 * 1024;

/// N of a path "/bytes/N" (decimal, at most max_bulk), or nothing.
std::optional<std::size_t> bulk_size(std::string_view path) noexcept {
    constexpr std::string_view prefix = "/bytes/";
    if (!path.starts_with(prefix) || path.size() == prefix.size() || path.size() > prefix.size() + 7) return std::nullopt;
    std::size_t n = 0;
    for (const char c : path.substr(prefix.size())) {
        if (c < '0' || c > '9') return std::nullopt;
        n = n * 10 + static_cast<std::size_t>(c - '0');
    }
    if (n > max_bulk) return std::nullopt;
    return n;
}

/// max_bulk bytes of a repeating alphabet, made on first use.
std::string_view bulk_body() {
    static const std::string body = [] {
        std::string b(max_bulk, '\0');
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>('a' + i % 26);
        return b;
    }();
    return body;
}

void respond(output_buffer& out, const parse_result& request, const route_table& routes) {
    response_options options;
    // An HTTP/1.0 client that asked to keep the connection closes it anyway
    // unless the response says keep-alive; ab -k waits for the close otherwise.
    options.announce_keep_alive = request.keep_alive && request.version_minor == 0;

    const bool is_head = request.method == "HEAD";
    if (request.method != "GET" && !is_head) {
        options.extra_headers = "Allow: GET, HEAD\r\n";
        append_response(out, 405, "Method Not Allowed", "Method Not Allowed", request.keep_alive, options);
        return;
    }
    options.head_only = is_head;
    // Route on the path: a query string does not name another resource here.
    const std::string_view path = request.target.substr(0, request.target.find('?'));
    for (const dynamic_route& route : routes.dynamic) {
        if (path != route.path) continue;
        options.content_type = route.content_type;
        // Rendered for HEAD too: its Content-Length is the body GET would get.
        append_response(out, 200, "OK", route.render(), request.keep_alive, options);
        return;
    }
    if (!routes.builtin) {
        append_response(out, 404, "Not Found", "Not Found", request.keep_alive, options);
    } else if (path == "/") {
        append_response(out, 200, "OK", "Hello, World!", request.keep_alive, options);
    } else if (std::optional<std::size_t> size = bulk_size(path)) {
        append_response(out, 200, "OK", bulk_body().substr(0, *size), request.keep_alive, options);
    } else {
        append_response(out, 404, "Not Found", "Not Found", request.keep_alive, options);
    }
}

}  // namespace

parse_result parse_request(std::string_view buffered, const parse_limits& limits) noexcept {
    // Only the first max_head bytes can hold the head; a terminator beyond
    // them makes the head too large whatever else is buffered.
    const std::string_view window = buffered.substr(0, std::min(buffered.size(), limits.max_head));
    const auto need_more = [&] {
        // With max_head bytes in hand and no end of head among them, more
        // bytes cannot help: the head would be longer than the limit.
        return with_status(!buffered.empty() && buffered.size() >= limits.max_head ? parse_status::too_large
                                                                                   : parse_status::incomplete);
    };

    // RFC 9112 §2.2: ignore empty lines before the request line; some clients
    // send a CRLF after a body, and it then leads the next pipelined request.
    std::size_t pos = 0;
    for (;;) {
        if (pos < window.size() && window[pos] == '\n') {
            pos += 1;
        } else if (pos < window.size() && window[pos] == '\r') {
            // A CR that ends the window may yet be the start of an empty line.
            if (pos + 1 == window.size()) return need_more();
            if (window[pos + 1] != '\n') return with_status(parse_status::bad_request);
            pos += 2;
        } else {
            break;
        }
    }

    parse_result result;
    if (const parse_status s = read_request_line(window, pos, result); s != parse_status::complete) {
        return s == parse_status::incomplete ? need_more() : with_status(s);
    }
    header_facts facts;
    if (const parse_status s = read_fields(window, pos, facts); s != parse_status::complete) {
        return s == parse_status::incomplete ? need_more() : with_status(s);
    }
    const std::size_t head_size = pos;

    // RFC 9112 §3.2: an HTTP/1.1 request without Host, or any request with
    // more than one, gets 400.
    if (facts.host_count > 1 || (facts.host_count == 0 && result.version_minor == 1)) {
        return with_status(parse_status::bad_request);
    }
    // Without chunked decoding the body's end is unknown, so nothing after it
    // can be read either: 501, as RFC 9112 §6.1 gives a coding the server
    // does not understand, and a close.
    if (facts.transfer_encoding) return with_status(parse_status::not_implemented);

    result.keep_alive = result.version_minor == 1 ? !facts.connection_close
                                                  : facts.connection_keep_alive && !facts.connection_close;
    std::uint64_t body_size = 0;
    if (facts.has_content_length) {
        body_size = to_length(facts.content_length_digits);
        result.content_length = body_size;
    }
    if (body_size > limits.max_body) {
        // Decided by the head alone: the caller need not buffer the body to refuse it.
        result.status = parse_status::body_too_large;
        result.keep_alive = false;
        return result;
    }
    if (buffered.size() - head_size < body_size) return with_status(parse_status::incomplete);

    const auto body_bytes = static_cast<std::size_t>(body_size);
    result.status = parse_status::complete;
    result.body = buffered.substr(head_size, body_bytes);
    result.consumed = head_size + body_bytes;
    return result;
}

void output_buffer::append_decimal(std::uint64_t value) {
    char digits[std::numeric_limits<std::uint64_t>::digits10 + 1];
    // Cannot fail: 20 characters hold every 64-bit value.
    const auto converted = std::to_chars(std::begin(digits), std::end(digits), value);
    m_bytes.append(digits, converted.ptr);
}

void append_response(output_buffer& out, int status, std::string_view reason, std::string_view body,
                     bool keep_alive, const response_options& options) {
    // No reserve() from here: libc++ reserves exactly what is asked, which
    // would turn a long pipelined batch quadratic; append grows geometrically.
    out.append("HTTP/1.1 ");
    out.append_decimal(static_cast<std::uint64_t>(status));
    out.append(" ");
    out.append(reason);
    out.append("\r\nServer: spindle\r\nContent-Length: ");
    out.append_decimal(body.size());
    out.append("\r\nContent-Type: ");
    out.append(options.content_type);
    out.append("\r\n");
    if (!keep_alive) {
        out.append("Connection: close\r\n");
    } else if (options.announce_keep_alive) {
        out.append("Connection: keep-alive\r\n");
    }
    out.append(options.extra_headers);
    out.append("\r\n");
    if (!options.head_only) out.append(body);
}

batch_result handle_batch(std::string_view input, output_buffer& out, const parse_limits& limits,
                          const route_table& routes) {
    batch_result batch;
    while (batch.consumed < input.size()) {
        const parse_result request = parse_request(input.substr(batch.consumed), limits);
        if (request.status == parse_status::incomplete) break;
        if (request.status != parse_status::complete) {
            // The stream cannot be resynchronised after a bad request: where
            // it ends is exactly what is in doubt. Answer and close.
            const error_reply reply = reply_for(request.status);
            response_options options;
            options.head_only = request.method == "HEAD";
            append_response(out, reply.status, reply.reason, reply.reason, false, options);
            ++batch.responses;
            batch.close = true;
            break;
        }
        respond(out, request, routes);
        ++batch.responses;
        batch.consumed += request.consumed;
        if (!request.keep_alive) {
            // Requests pipelined behind a close are not answered (RFC 9112 §9.6).
            batch.close = true;
            break;
        }
    }
    return batch;
}

}  // namespace spindle::examples::http
