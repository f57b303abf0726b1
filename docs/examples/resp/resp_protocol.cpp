#include "resp_protocol.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>

namespace spindle::examples::resp {

namespace {

// --- bytes and numbers -----------------------------------------------------------

char to_lower_ascii(char c) noexcept { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

/// Whether `text` equals `lower` (all lower case) ignoring ASCII case. Command
/// names are compared with this rather than lowered into a copy, which would
/// allocate for every command.
bool equals_ignoring_case(std::string_view text, std::string_view lower) noexcept {
    if (text.size() != lower.size()) return false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (to_lower_ascii(text[i]) != lower[i]) return false;
    }
    return true;
}

/// Redis's string2ll: canonical decimal only (no '+', no leading zeros or
/// blanks, no "-0", at most 20 characters), so what INCR accepts reads back
/// unchanged and the same text is a number everywhere in the protocol.
bool parse_int64(std::string_view text, std::int64_t& value) noexcept {
    if (text.empty() || text.size() > 20) return false;
    if (text.size() == 1 && text[0] == '0') {
        value = 0;
        return true;
    }
    const bool negative = text[0] == '-';
    std::size_t i = negative ? 1 : 0;
    if (i == text.size() || text[i] < '1' || text[i] > '9') return false;
    std::uint64_t v = 0;
    for (; i < text.size(); ++i) {
        const unsigned digit = static_cast<unsigned char>(text[i]) - unsigned{'0'};
        if (digit > 9) return false;
        if (v > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) return false;
        v = v * 10 + digit;
    }
    constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    if (negative) {
        if (v > max + 1) return false;
        value = static_cast<std::int64_t>(~v + 1); // two's complement: -v, INT64_MIN included
    } else {
        if (v > max) return false;
        value = static_cast<std::int64_t>(v);
    }
    return true;
}

/// C's isspace in the "C" locale, which is what Redis skips between inline words.
bool is_blank(char c) noexcept { return c == ' ' || (c >= '\t' && c <= '\r'); }

/// What ends an unquoted inline word in Redis: a narrower set than is_blank,
/// so "a\vb" is one word.
bool ends_word(char c) noexcept { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

int hex_value(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/// Appends client-supplied text to an error line with '\r' and '\n' turned
/// into spaces, as Redis does: they would end the line and let a client
/// inject a reply of its own.
void append_sanitized(output_buffer& out, std::string_view text) {
    while (!text.empty()) {
        const std::size_t cut = std::min(text.find('\r'), text.find('\n'));
        out.append_raw(text.substr(0, cut));
        if (cut == std::string_view::npos) return;
        out.append_raw(" ");
        text.remove_prefix(cut + 1);
    }
}

enum class line_status { ok, incomplete, invalid };

/// Reads the number of a "*<n>\r\n" or "$<n>\r\n" line whose digits start at
/// `pos`, leaving `pos` past the line on success. The rules are parse_int64's,
/// applied in the same pass that looks for the line ending (this is the
/// hottest loop of the parser), and a byte that cannot belong to a number
/// fails at once rather than after waiting for a line ending.
line_status read_length_line(std::string_view input, std::size_t& pos, std::int64_t& value) noexcept {
    constexpr std::size_t max_chars = 20; // "-9223372036854775808"
    const std::size_t size = input.size();
    std::size_t i = pos;
    const bool negative = i < size && input[i] == '-';
    if (negative) ++i;
    const std::size_t first_digit = i;
    std::uint64_t v = 0;
    for (; i < size; ++i) {
        const unsigned digit = static_cast<unsigned char>(input[i]) - unsigned{'0'};
        if (digit > 9) break;
        if (i - pos == max_chars) return line_status::invalid;
        if (v > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) return line_status::invalid;
        v = v * 10 + digit;
    }
    if (i == size) return line_status::incomplete;
    if (input[i] != '\r') return line_status::invalid;
    const std::size_t digits = i - first_digit;
    if (digits == 0 || (input[first_digit] == '0' && (digits > 1 || negative))) return line_status::invalid;
    if (i + 1 == size) return line_status::incomplete;
    if (input[i + 1] != '\n') return line_status::invalid;
    constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    if (v > (negative ? max + 1 : max)) return line_status::invalid;
    value = static_cast<std::int64_t>(negative ? ~v + 1 : v);
    pos = i + 2;
    return line_status::ok;
}

// Above this many arguments a parser gives its vectors back after the
// command: one giant command should not pin megabytes for the rest of the
// connection, and commands that large are rare enough to pay for a new block.
constexpr std::size_t retained_argument_capacity = 4096;

} // namespace

// --- request_parser --------------------------------------------------------------

void request_parser::reset() noexcept {
    m_state = state::idle;
    m_offset = 0;
    m_seen = 0;
    m_expected = 0;
    m_refs.clear();
}

parse_result request_parser::fail(std::string_view message) noexcept {
    reset();
    // An inline line may have split words before its bad quote.
    m_args.clear();
    return {parse_status::error, 0, message};
}

parse_result request_parser::fail_expected_dollar(char got) noexcept {
    constexpr std::string_view head = "Protocol error: expected '$', got '";
    static_assert(head.size() + 2 <= sizeof(m_error));
    std::memcpy(m_error, head.data(), head.size());
    m_error[head.size()] = got == '\r' || got == '\n' ? ' ' : got;
    m_error[head.size() + 1] = '\'';
    return fail({m_error, head.size() + 2});
}

parse_result request_parser::parse(std::string_view input) {
    m_args.clear();
    // The bytes of an incomplete command can only grow. Fewer means the caller
    // dropped them, and offsets kept from before could point past the input.
    if (m_state != state::idle && input.size() < m_seen) reset();
    m_seen = input.size();
    switch (m_state) {
    case state::idle:
        if (m_args.capacity() > retained_argument_capacity) {
            m_args.release();
            m_refs.release();
        }
        if (input.empty()) return {};
        if (input[0] == '*') return start_multibulk(input);
        m_state = state::in_inline;
        return parse_inline(input);
    case state::in_multibulk:
        return parse_bulks(input);
    case state::in_inline:
        return parse_inline(input);
    }
    return {};
}

parse_result request_parser::start_multibulk(std::string_view input) {
    std::size_t pos = 1;
    std::int64_t count = 0;
    switch (read_length_line(input, pos, count)) {
    case line_status::incomplete:
        return {}; // at most 23 bytes, read again next time
    case line_status::invalid:
        return fail("Protocol error: invalid multibulk length");
    case line_status::ok:
        break;
    }
    if (count > static_cast<std::int64_t>(max_multibulk_count)) return fail("Protocol error: invalid multibulk length");
    if (count <= 0) return {parse_status::complete, pos, {}};
    // Capacity follows the arguments that arrive, not the count declared: a
    // client declaring a million must send them before it costs any memory.
    m_expected = static_cast<std::size_t>(count);
    m_offset = pos;
    m_refs.clear();
    m_state = state::in_multibulk;
    return parse_bulks(input);
}

parse_result request_parser::parse_bulks(std::string_view input) {
    while (m_refs.size() < m_expected) {
        std::size_t pos = m_offset;
        if (pos >= input.size()) return {};
        if (input[pos] != '$') return fail_expected_dollar(input[pos]);
        ++pos;
        std::int64_t length = 0;
        switch (read_length_line(input, pos, length)) {
        case line_status::incomplete:
            return {};
        case line_status::invalid:
            return fail("Protocol error: invalid bulk length");
        case line_status::ok:
            break;
        }
        if (length < 0 || length > static_cast<std::int64_t>(max_bulk_length))
            return fail("Protocol error: invalid bulk length");
        const auto n = static_cast<std::size_t>(length);
        // Only the length is checked until the whole payload is here; it is
        // never scanned, so a large value costs nothing per partial read.
        if (input.size() - pos < n + 2) return {};
        // Redis skips these two bytes unchecked; checking them catches a
        // client whose lengths are wrong before its data is taken as commands.
        if (input[pos + n] != '\r' || input[pos + n + 1] != '\n')
            return fail("Protocol error: expected '\\r\\n' after bulk data");
        m_refs.push_back({pos, n});
        m_offset = pos + n + 2;
    }
    for (const arg_ref& ref : m_refs) m_args.push_back(input.substr(ref.offset, ref.length));
    const std::size_t consumed = m_offset;
    reset();
    return {parse_status::complete, consumed, {}};
}

parse_result request_parser::parse_inline(std::string_view input) {
    // A line longer than the limit fails whether or not its end has arrived,
    // so the outcome does not depend on how the bytes were split into reads.
    const std::size_t window = std::min(input.size(), max_inline_length + 2);
    const void* newline = m_offset < window ? std::memchr(input.data() + m_offset, '\n', window - m_offset) : nullptr;
    if (!newline) {
        if (input.size() > max_inline_length + 1) return fail("Protocol error: too big inline request");
        m_offset = window;
        return {};
    }
    std::size_t end = static_cast<std::size_t>(static_cast<const char*>(newline) - input.data());
    const std::size_t consumed = end + 1;
    if (end > 0 && input[end - 1] == '\r') --end;
    if (end > max_inline_length) return fail("Protocol error: too big inline request");
    if (!split_inline(input.substr(0, end))) return fail("Protocol error: unbalanced quotes in request");
    reset();
    return {parse_status::complete, consumed, {}};
}

// Redis's sdssplitargs, on a view: plain words become views into the line,
// and only words with quotes are decoded into m_scratch.
bool request_parser::split_inline(std::string_view line) {
    m_scratch.clear();
    const std::size_t n = line.size();
    std::size_t i = 0;
    while (true) {
        while (i < n && is_blank(line[i])) ++i;
        if (i == n) return true;

        std::size_t j = i;
        while (j < n && !ends_word(line[j]) && line[j] != '"' && line[j] != '\'') ++j;
        if (j == n || ends_word(line[j])) {
            m_args.push_back(line.substr(i, j - i));
            i = j;
            continue;
        }

        // Decoded text is never longer than the line, so with this reserve no
        // append below reallocates under views already taken.
        if (m_scratch.capacity() < n) m_scratch.reserve(n);
        const std::size_t begin = m_scratch.size();
        m_scratch.append(line.substr(i, j - i));
        i = j;
        bool in_double = false;
        bool in_single = false;
        bool done = false;
        while (!done) {
            if (in_double) {
                if (i == n) return false;
                const char c = line[i];
                if (c == '\\' && i + 3 < n && line[i + 1] == 'x' && hex_value(line[i + 2]) >= 0 &&
                    hex_value(line[i + 3]) >= 0) {
                    m_scratch.push_back(static_cast<char>(hex_value(line[i + 2]) * 16 + hex_value(line[i + 3])));
                    i += 4;
                } else if (c == '\\' && i + 1 < n) {
                    char decoded = line[i + 1];
                    switch (decoded) {
                    case 'n': decoded = '\n'; break;
                    case 'r': decoded = '\r'; break;
                    case 't': decoded = '\t'; break;
                    case 'b': decoded = '\b'; break;
                    case 'a': decoded = '\a'; break;
                    default: break;
                    }
                    m_scratch.push_back(decoded);
                    i += 2;
                } else if (c == '"') {
                    // A closing quote must end the word.
                    if (i + 1 < n && !is_blank(line[i + 1])) return false;
                    done = true;
                    ++i;
                } else {
                    m_scratch.push_back(c);
                    ++i;
                }
            } else if (in_single) {
                if (i == n) return false;
                const char c = line[i];
                if (c == '\\' && i + 1 < n && line[i + 1] == '\'') {
                    m_scratch.push_back('\'');
                    i += 2;
                } else if (c == '\'') {
                    if (i + 1 < n && !is_blank(line[i + 1])) return false;
                    done = true;
                    ++i;
                } else {
                    m_scratch.push_back(c);
                    ++i;
                }
            } else if (i == n) {
                done = true;
            } else {
                const char c = line[i++];
                if (ends_word(c)) done = true;
                else if (c == '"') in_double = true;
                else if (c == '\'') in_single = true;
                else m_scratch.push_back(c);
            }
        }
        m_args.push_back(std::string_view(m_scratch).substr(begin));
    }
}

// --- output_buffer ---------------------------------------------------------------

void output_buffer::consume(std::size_t n) noexcept {
    m_head += std::min(n, size());
    if (m_head == m_data.size()) {
        clear();
    } else if (m_head >= 64 * 1024 && m_head * 2 >= m_data.size()) {
        // Compact only once the dead front outweighs the rest, so the bytes
        // moved stay proportional to the bytes written.
        m_data.erase(0, m_head);
        m_head = 0;
    }
}

void output_buffer::append_number(char prefix, std::int64_t n) {
    char text[1 + 20 + 2];
    text[0] = prefix;
    char* end = std::to_chars(text + 1, text + 21, n).ptr;
    *end++ = '\r';
    *end++ = '\n';
    m_data.append(text, static_cast<std::size_t>(end - text));
}

void output_buffer::append_simple(std::string_view text) {
    m_data.push_back('+');
    m_data.append(text);
    m_data.append("\r\n");
}

void output_buffer::append_error(std::string_view message) {
    m_data.push_back('-');
    m_data.append(message);
    m_data.append("\r\n");
}

void output_buffer::append_integer(std::int64_t n) { append_number(':', n); }

void output_buffer::append_bulk(std::string_view bytes) {
    append_number('$', static_cast<std::int64_t>(bytes.size()));
    m_data.append(bytes);
    m_data.append("\r\n");
}

void output_buffer::append_null() { m_data.append("$-1\r\n"); }

void output_buffer::append_array(std::size_t count) { append_number('*', static_cast<std::int64_t>(count)); }

// --- store -----------------------------------------------------------------------

store::time_ms store::now() noexcept {
    using namespace std::chrono;
    return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

store::entry* store::find(std::string_view key) {
    const auto it = m_entries.find(key);
    if (it == m_entries.end()) return nullptr;
    // The clock is read only for keys with a deadline, so a store used
    // without expiry never pays for it.
    if (it->second.deadline != no_deadline && now() > it->second.deadline) {
        m_entries.erase(it);
        return nullptr;
    }
    return &it->second;
}

store::entry& store::insert(std::string_view key, std::string_view value, time_ms deadline) {
    entry& e = m_entries.try_emplace(std::string(key)).first->second;
    e.value.assign(value);
    e.deadline = deadline;
    return e;
}

bool store::erase(std::string_view key) {
    const auto it = m_entries.find(key);
    if (it == m_entries.end()) return false;
    const bool live = it->second.deadline == no_deadline || now() <= it->second.deadline;
    m_entries.erase(it);
    return live;
}

// --- commands --------------------------------------------------------------------

namespace {

using arguments = std::span<const std::string_view>;
using command_function = connection_action (*)(arguments, store&, output_buffer&);

constexpr std::string_view not_an_integer = "ERR value is not an integer or out of range";
constexpr std::string_view syntax_error = "ERR syntax error";

void reply_arity_error(output_buffer& out, std::string_view full_name) {
    out.append_raw("-ERR wrong number of arguments for '");
    out.append_raw(full_name);
    out.append_raw("' command\r\n");
}

/// Redis 7's reply to a subcommand it does not have:
/// "ERR unknown subcommand 'foo'. Try CONFIG HELP."
void reply_unknown_subcommand(output_buffer& out, std::string_view subcommand, std::string_view upper_name) {
    out.append_raw("-ERR unknown subcommand '");
    append_sanitized(out, subcommand.substr(0, 128));
    out.append_raw("'. Try ");
    out.append_raw(upper_name);
    out.append_raw(" HELP.\r\n");
}

/// Redis 7's reply to an unknown command, quoting its arguments until 128
/// characters of them have been quoted.
void reply_unknown_command(output_buffer& out, arguments args) {
    out.append_raw("-ERR unknown command '");
    append_sanitized(out, args[0].substr(0, 128));
    out.append_raw("', with args beginning with: ");
    std::size_t quoted = 0;
    for (std::size_t i = 1; i < args.size() && quoted < 128; ++i) {
        const std::string_view arg = args[i].substr(0, 128 - quoted);
        out.append_raw("'");
        append_sanitized(out, arg);
        out.append_raw("' ");
        quoted += arg.size() + 3;
    }
    out.append_raw("\r\n");
}

connection_action run_get(arguments args, store& db, output_buffer& out) {
    if (const store::entry* e = db.find(args[1])) out.append_bulk(e->value);
    else out.append_null();
    return connection_action::keep_open;
}

/// SET's options, parsed as Redis 7.0 does: each may repeat, and the
/// exclusions below are its, so the same options fail with the same error.
connection_action run_set(arguments args, store& db, output_buffer& out) {
    enum : unsigned { nx = 1, xx = 2, get = 4, keep_ttl = 8, ex = 16, px = 32, exat = 64, pxat = 128 };
    unsigned flags = 0;
    std::string_view expire_text;
    for (std::size_t j = 3; j < args.size(); ++j) {
        const std::string_view option = args[j];
        const bool has_next = j + 1 < args.size();
        if (equals_ignoring_case(option, "nx") && !(flags & xx)) {
            flags |= nx;
        } else if (equals_ignoring_case(option, "xx") && !(flags & nx)) {
            flags |= xx;
        } else if (equals_ignoring_case(option, "get")) {
            flags |= get;
        } else if (equals_ignoring_case(option, "keepttl") && !(flags & (ex | px | exat | pxat))) {
            flags |= keep_ttl;
        } else if (equals_ignoring_case(option, "ex") && !(flags & (keep_ttl | px | exat | pxat)) && has_next) {
            flags |= ex;
            expire_text = args[++j];
        } else if (equals_ignoring_case(option, "px") && !(flags & (keep_ttl | ex | exat | pxat)) && has_next) {
            flags |= px;
            expire_text = args[++j];
        } else if (equals_ignoring_case(option, "exat") && !(flags & (keep_ttl | ex | px | pxat)) && has_next) {
            flags |= exat;
            expire_text = args[++j];
        } else if (equals_ignoring_case(option, "pxat") && !(flags & (keep_ttl | ex | px | exat)) && has_next) {
            flags |= pxat;
            expire_text = args[++j];
        } else {
            out.append_error(syntax_error);
            return connection_action::keep_open;
        }
    }

    store::time_ms deadline = store::no_deadline;
    if (flags & (ex | px | exat | pxat)) {
        constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
        std::int64_t ms = 0;
        if (!parse_int64(expire_text, ms)) {
            out.append_error(not_an_integer);
            return connection_action::keep_open;
        }
        const bool seconds = flags & (ex | exat);
        if (ms <= 0 || (seconds && ms > max / 1000)) {
            out.append_error("ERR invalid expire time in 'set' command");
            return connection_action::keep_open;
        }
        if (seconds) ms *= 1000;
        // Redis keeps deadlines as Unix milliseconds and rejects one that
        // overflows them; check the same, then count on the steady clock.
        using namespace std::chrono;
        const std::int64_t unix_now = duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
        std::int64_t remaining = ms;
        if (flags & (ex | px)) {
            if (ms > max - unix_now) {
                out.append_error("ERR invalid expire time in 'set' command");
                return connection_action::keep_open;
            }
        } else {
            remaining = ms - unix_now; // in the past: the key expires at once
        }
        const store::time_ms now = store::now();
        deadline = remaining >= store::no_deadline - 1 - now ? store::no_deadline - 1 : now + remaining;
    }

    store::entry* existing = db.find(args[1]);
    if (flags & get) {
        if (existing) out.append_bulk(existing->value);
        else out.append_null();
    }
    if (((flags & nx) && existing) || ((flags & xx) && !existing)) {
        if (!(flags & get)) out.append_null();
        return connection_action::keep_open;
    }
    if (existing) {
        // Assigning reuses the value's capacity: overwriting a key with a
        // value no longer than before does not allocate.
        existing->value.assign(args[2]);
        if (!(flags & keep_ttl)) existing->deadline = deadline;
    } else {
        db.insert(args[1], args[2], deadline);
    }
    if (!(flags & get)) out.append_raw("+OK\r\n");
    return connection_action::keep_open;
}

connection_action run_del(arguments args, store& db, output_buffer& out) {
    std::int64_t removed = 0;
    for (std::size_t i = 1; i < args.size(); ++i) removed += db.erase(args[i]) ? 1 : 0;
    out.append_integer(removed);
    return connection_action::keep_open;
}

connection_action run_exists(arguments args, store& db, output_buffer& out) {
    // A key named twice counts twice, as in Redis.
    std::int64_t found = 0;
    for (std::size_t i = 1; i < args.size(); ++i) found += db.find(args[i]) ? 1 : 0;
    out.append_integer(found);
    return connection_action::keep_open;
}

connection_action run_incr(arguments args, store& db, output_buffer& out) {
    store::entry* e = db.find(args[1]);
    std::int64_t value = 0;
    if (e && !parse_int64(e->value, value)) {
        out.append_error(not_an_integer);
        return connection_action::keep_open;
    }
    if (value == std::numeric_limits<std::int64_t>::max()) {
        out.append_error("ERR increment or decrement would overflow");
        return connection_action::keep_open;
    }
    ++value;
    char text[20];
    const char* end = std::to_chars(text, text + sizeof(text), value).ptr;
    const std::string_view digits(text, static_cast<std::size_t>(end - text));
    // An existing key keeps its deadline, as INCR does in Redis.
    if (e) e->value.assign(digits);
    else db.insert(args[1], digits);
    out.append_integer(value);
    return connection_action::keep_open;
}

connection_action run_ping(arguments args, store&, output_buffer& out) {
    if (args.size() > 2) reply_arity_error(out, "ping");
    else if (args.size() == 2) out.append_bulk(args[1]);
    else out.append_raw("+PONG\r\n");
    return connection_action::keep_open;
}

connection_action run_echo(arguments args, store&, output_buffer& out) {
    out.append_bulk(args[1]);
    return connection_action::keep_open;
}

connection_action run_quit(arguments, store&, output_buffer& out) {
    out.append_raw("+OK\r\n");
    return connection_action::close;
}

connection_action run_command(arguments args, store&, output_buffer& out);
connection_action run_config(arguments args, store&, output_buffer& out);

struct command_spec {
    /// Lower case, as Redis names the command in its errors.
    std::string_view name;
    /// Redis's convention: n means exactly n words (name included), -n at least n.
    int arity;
    command_function run;
};

// The commands a benchmark sends most come first: lookup is a linear scan,
// faster than hashing for this few.
constexpr command_spec commands[] = {
    {"get", 2, run_get},         {"set", -3, run_set},     {"incr", 2, run_incr},     {"ping", -1, run_ping},
    {"echo", 2, run_echo},       {"del", -2, run_del},     {"exists", -2, run_exists}, {"command", -1, run_command},
    {"config", -2, run_config},  {"quit", -1, run_quit},
};

bool arity_ok(int arity, std::size_t argc) noexcept {
    return arity >= 0 ? argc == static_cast<std::size_t>(arity) : argc >= static_cast<std::size_t>(-arity);
}

// Redis 7 answers COMMAND with the whole command table and redis-cli asks for
// COMMAND DOCS at start to offer hints; an empty table is a valid answer to
// both, and makes redis-cli simply go without hints.
connection_action run_command(arguments args, store&, output_buffer& out) {
    if (args.size() == 1) {
        out.append_array(0);
        return connection_action::keep_open;
    }
    const std::string_view sub = args[1];
    if (equals_ignoring_case(sub, "count")) {
        if (args.size() != 2) reply_arity_error(out, "command|count");
        else out.append_integer(static_cast<std::int64_t>(std::size(commands)));
    } else if (equals_ignoring_case(sub, "docs") || equals_ignoring_case(sub, "info") ||
               equals_ignoring_case(sub, "list")) {
        out.append_array(0);
    } else {
        reply_unknown_subcommand(out, sub, "COMMAND");
    }
    return connection_action::keep_open;
}

// redis-benchmark asks for `save` and `appendonly` before it starts, and with
// anything but an array of at least a name and a value it prints "WARNING:
// Could not fetch server CONFIG". Other names match nothing (an empty array,
// as Redis answers a pattern that matches nothing); patterns are not expanded.
connection_action run_config(arguments args, store&, output_buffer& out) {
    const std::string_view sub = args[1];
    if (!equals_ignoring_case(sub, "get")) {
        reply_unknown_subcommand(out, sub, "CONFIG");
        return connection_action::keep_open;
    }
    if (args.size() < 3) {
        reply_arity_error(out, "config|get");
        return connection_action::keep_open;
    }
    struct parameter {
        std::string_view name;
        std::string_view value;
    };
    // No persistence: no save points, no append-only file.
    constexpr parameter parameters[] = {{"save", ""}, {"appendonly", "no"}};
    // Each parameter once however often it is asked for, as Redis does.
    bool asked[std::size(parameters)] = {};
    for (std::size_t i = 2; i < args.size(); ++i) {
        for (std::size_t p = 0; p < std::size(parameters); ++p) {
            if (equals_ignoring_case(args[i], parameters[p].name)) asked[p] = true;
        }
    }
    std::size_t found = 0;
    for (const bool a : asked) found += a ? 1 : 0;
    out.append_array(found * 2);
    for (std::size_t p = 0; p < std::size(parameters); ++p) {
        if (!asked[p]) continue;
        out.append_bulk(parameters[p].name);
        out.append_bulk(parameters[p].value);
    }
    return connection_action::keep_open;
}

} // namespace

connection_action execute(std::span<const std::string_view> args, store& db, output_buffer& out) {
    if (args.empty()) return connection_action::keep_open;
    for (const command_spec& command : commands) {
        if (!equals_ignoring_case(args[0], command.name)) continue;
        if (!arity_ok(command.arity, args.size())) {
            reply_arity_error(out, command.name);
            return connection_action::keep_open;
        }
        return command.run(args, db, out);
    }
    reply_unknown_command(out, args);
    return connection_action::keep_open;
}

batch_result handle_batch(std::string_view input, store& db, output_buffer& out, request_parser& parser) {
    std::size_t pos = 0;
    while (pos < input.size()) {
        const parse_result parsed = parser.parse(input.substr(pos));
        if (parsed.status == parse_status::incomplete) break;
        if (parsed.status == parse_status::error) {
            // Commands before the bad one have run and keep their replies;
            // nothing after it can be trusted to start where it seems to.
            out.append_raw("-ERR ");
            out.append_raw(parsed.error);
            out.append_raw("\r\n");
            return {pos, true};
        }
        pos += parsed.consumed;
        if (parser.args().empty()) continue;
        if (execute(parser.args(), db, out) == connection_action::close) return {pos, true};
    }
    return {pos, false};
}

batch_result handle_batch(std::string_view input, store& db, output_buffer& out) {
    request_parser parser;
    return handle_batch(input, db, out, parser);
}

} // namespace spindle::examples::resp
