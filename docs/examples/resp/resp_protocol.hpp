#pragma once
/// The protocol core of an example in-memory key-value server speaking RESP2,
/// the Redis protocol: request parsing, a string store, and command execution
/// into a reply buffer. It does no I/O. A connection keeps its unconsumed
/// input, a request_parser and an output_buffer, and per readiness does
///
///     read → handle_batch(unconsumed input) → write out.view() → drop `consumed`
///
/// so a batch of pipelined commands costs one read, one call and one write.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace spindle::examples::resp {

// The limits are Redis's (proto-max-bulk-len, PROTO_INLINE_MAX_SIZE), so a
// client cannot make the server buffer without bound before it sees an error.
/// Most arguments one command may declare in its `*<count>` line.
inline constexpr std::size_t max_multibulk_count = 1024 * 1024;
/// Longest bulk string a request may declare in a `$<length>` line.
inline constexpr std::size_t max_bulk_length = 512 * 1024 * 1024;
/// Longest inline command line, not counting its line ending.
inline constexpr std::size_t max_inline_length = 64 * 1024;

namespace detail {

/// A vector of trivially copyable values that keeps its first N in place and
/// its capacity when cleared: reused for every command, it stops allocating
/// once it has grown to the largest command seen.
template <class T, std::size_t N>
class small_vector {
    static_assert(std::is_trivially_copyable_v<T>);

public:
    small_vector() noexcept = default;
    small_vector(small_vector&& other) noexcept { take(other); }
    small_vector& operator=(small_vector&& other) noexcept {
        if (this != &other) take(other);
        return *this;
    }

    T* data() noexcept { return m_heap ? m_heap.get() : m_inline; }
    const T* data() const noexcept { return m_heap ? m_heap.get() : m_inline; }
    std::size_t size() const noexcept { return m_size; }
    std::size_t capacity() const noexcept { return m_capacity; }
    bool empty() const noexcept { return m_size == 0; }
    T& operator[](std::size_t i) noexcept { return data()[i]; }
    const T& operator[](std::size_t i) const noexcept { return data()[i]; }
    T* begin() noexcept { return data(); }
    T* end() noexcept { return data() + m_size; }
    const T* begin() const noexcept { return data(); }
    const T* end() const noexcept { return data() + m_size; }

    void clear() noexcept { m_size = 0; }

    void push_back(const T& value) {
        if (m_size == m_capacity) grow();
        data()[m_size++] = value;
    }

    /// Empties it and returns a heap block to the allocator.
    void release() noexcept {
        m_heap.reset();
        m_capacity = N;
        m_size = 0;
    }

private:
    void grow() {
        std::size_t capacity = m_capacity * 2;
        std::unique_ptr<T[]> heap(new T[capacity]);
        std::memcpy(static_cast<void*>(heap.get()), data(), m_size * sizeof(T));
        m_heap = std::move(heap);
        m_capacity = capacity;
    }

    void take(small_vector& other) noexcept {
        m_heap = std::move(other.m_heap);
        m_size = other.m_size;
        m_capacity = other.m_capacity;
        if (!m_heap) std::memcpy(static_cast<void*>(m_inline), other.m_inline, m_size * sizeof(T));
        other.m_size = 0;
        other.m_capacity = N;
    }

    T m_inline[N]{};
    std::unique_ptr<T[]> m_heap;
    std::size_t m_size = 0;
    std::size_t m_capacity = N;
};

} // namespace detail

enum class parse_status { complete, incomplete, error };

struct parse_result {
    parse_status status = parse_status::incomplete;
    /// complete: the length of the command in bytes; otherwise 0.
    std::size_t consumed = 0;
    /// error: why, in Redis's words and without the "ERR " of the reply, e.g.
    /// "Protocol error: invalid bulk length". Valid until the next parse().
    std::string_view error;
};

/// Parses client requests: RESP arrays of bulk strings, and inline commands
/// (a line of words separated by blanks, ending in "\r\n" or a bare "\n",
/// with Redis's quoting: "double quotes" taking \n \r \t \b \a \\ \" and \xHH
/// escapes, 'single quotes' taking \'). A NUL is an ordinary byte here, where
/// Redis ends an inline line at it.
///
/// Keep one per connection. It is incremental: on `incomplete` it keeps what
/// it has parsed, and the next call must pass the same unconsumed bytes (they
/// may have moved) followed by whatever arrived since, so a command arriving
/// over many reads is scanned once. Passing fewer bytes than before makes it
/// start over.
class request_parser {
public:
    request_parser() = default;
    request_parser(request_parser&&) noexcept = default;
    request_parser& operator=(request_parser&&) noexcept = default;

    /// Parses the command at the front of `input`.
    /// - complete: args() holds its arguments and `consumed` its length. The
    ///   arguments are empty for an empty inline line or "*0\r\n", which
    ///   Redis skips without a reply.
    /// - incomplete: call again once more bytes have arrived.
    /// - error: the stream cannot be resynchronised; Redis replies
    ///   "-ERR <error>" and closes the connection.
    parse_result parse(std::string_view input);

    /// The arguments of the last complete command: views into the input given
    /// to parse(), or into this parser for inline arguments that had quotes;
    /// empty after a parse() that was incomplete or an error. Valid until the
    /// next parse(), reset() or move, and only while those input bytes stay
    /// where they are.
    std::span<const std::string_view> args() const noexcept { return {m_args.data(), m_args.size()}; }

    /// Forgets a partly parsed command, e.g. when its bytes were discarded.
    void reset() noexcept;

private:
    enum class state : std::uint8_t { idle, in_multibulk, in_inline };

    /// Where a bulk argument lies, relative to the start of its command: the
    /// input may move between calls, so a partial command cannot hold views.
    struct arg_ref {
        std::size_t offset;
        std::size_t length;
    };

    parse_result start_multibulk(std::string_view input);
    parse_result parse_bulks(std::string_view input);
    parse_result parse_inline(std::string_view input);
    bool split_inline(std::string_view line);
    parse_result fail(std::string_view message) noexcept;
    parse_result fail_expected_dollar(char got) noexcept;

    state m_state = state::idle;
    /// in_multibulk: where the next `$` header begins. in_inline: how far the
    /// search for the line's '\n' has got.
    std::size_t m_offset = 0;
    /// The size of the input last parsed.
    std::size_t m_seen = 0;
    /// in_multibulk: how many arguments the `*` line declared.
    std::size_t m_expected = 0;
    detail::small_vector<arg_ref, 16> m_refs;
    detail::small_vector<std::string_view, 16> m_args;
    /// Decoded quoted inline arguments; reserved to the line's length before
    /// the first is written, so it never moves under the views in m_args.
    std::string m_scratch;
    /// The one error message that quotes the input.
    char m_error[48] = {};
};

/// Replies in RESP2, appended to a buffer that keeps its capacity when it is
/// emptied, so a connection's steady state does not allocate.
class output_buffer {
public:
    /// The bytes appended and not yet consumed, ready for one write.
    std::string_view view() const noexcept { return {m_data.data() + m_head, m_data.size() - m_head}; }
    std::size_t size() const noexcept { return m_data.size() - m_head; }
    bool empty() const noexcept { return m_head == m_data.size(); }
    std::size_t capacity() const noexcept { return m_data.capacity(); }

    /// Drops the first `n` bytes of view(), after a write took them.
    void consume(std::size_t n) noexcept;
    /// Drops everything, keeping the capacity.
    void clear() noexcept {
        m_data.clear();
        m_head = 0;
    }

    /// "+text\r\n". `text` must not contain '\r' or '\n'.
    void append_simple(std::string_view text);
    /// "-message\r\n", e.g. append_error("ERR syntax error"). `message` must not
    /// contain '\r' or '\n'.
    void append_error(std::string_view message);
    /// ":n\r\n".
    void append_integer(std::int64_t n);
    /// "$length\r\nbytes\r\n"; any bytes.
    void append_bulk(std::string_view bytes);
    /// "$-1\r\n", RESP2's null.
    void append_null();
    /// "*count\r\n", followed by `count` replies.
    void append_array(std::size_t count);
    /// Bytes as they are, for replies built piecewise.
    void append_raw(std::string_view bytes) { m_data.append(bytes); }

private:
    void append_number(char prefix, std::int64_t n);

    std::string m_data;
    /// Written bytes at the front, dropped in bulk so a partial write does not
    /// move the rest every time.
    std::size_t m_head = 0;
};

/// A map of binary-safe string keys to string values, with Redis's lazy
/// expiry: a key past its deadline is removed when it is next looked up. Keys
/// that expire and are never looked up again stay until erase() or clear().
class store {
public:
    /// Milliseconds on std::chrono::steady_clock, so changes to the wall
    /// clock neither expire keys early nor keep them late.
    using time_ms = std::int64_t;
    static constexpr time_ms no_deadline = std::numeric_limits<time_ms>::max();

    struct entry {
        std::string value;
        /// Live while now() <= deadline.
        time_ms deadline = no_deadline;
    };

    /// The live entry of `key`, or null; looking up an expired key removes it.
    /// Does not allocate. Valid until the store is next modified.
    entry* find(std::string_view key);
    /// Stores `value` under `key`, replacing any entry. Meant for a key find()
    /// has just reported absent: it builds the key string up front.
    entry& insert(std::string_view key, std::string_view value, time_ms deadline = no_deadline);
    /// Removes `key`; whether it was live.
    bool erase(std::string_view key);
    /// Keys held, counting expired ones not yet looked up.
    std::size_t size() const noexcept { return m_entries.size(); }
    void clear() noexcept { m_entries.clear(); }

    static time_ms now() noexcept;

private:
    // Transparent, so a lookup by string_view needs no std::string.
    struct key_hash {
        using is_transparent = void;
        std::size_t operator()(std::string_view key) const noexcept { return std::hash<std::string_view>{}(key); }
    };

    std::unordered_map<std::string, entry, key_hash, std::equal_to<>> m_entries;
};

/// What a connection does once the replies so far are written.
enum class connection_action { keep_open, close };

/// Runs one command, `args` being its name and arguments (at least the name),
/// and appends its reply to `out`. Commands: PING [message], ECHO message,
/// GET key, SET key value [NX|XX] [GET] [EX s|PX ms|EXAT unix-s|PXAT unix-ms|KEEPTTL],
/// DEL key..., EXISTS key..., INCR key, COMMAND [COUNT|DOCS|INFO|LIST ...]
/// (replying an empty array, or the count of commands), CONFIG GET name...
/// (knowing `save` and `appendonly`), QUIT. Names are case-insensitive; error
/// replies carry Redis 7's texts.
connection_action execute(std::span<const std::string_view> args, store& db, output_buffer& out);

struct batch_result {
    /// Bytes at the front of the input that were handled; drop them. A
    /// trailing incomplete command is not counted.
    std::size_t consumed = 0;
    /// Write `out`, then close: after QUIT or a protocol error (whose
    /// "-ERR Protocol error: ..." reply is the last thing in `out`).
    bool close = false;
};

/// Executes every complete command at the front of `input` (a pipeline)
/// against `db`, appending all their replies to `out`. `parser` belongs to
/// the connection and remembers a trailing incomplete command, so the next
/// call must get the same unconsumed bytes followed by new ones.
batch_result handle_batch(std::string_view input, store& db, output_buffer& out, request_parser& parser);

/// As above with a parser of its own, which a trailing incomplete command
/// does not outlive: the next call parses it again from its start.
batch_result handle_batch(std::string_view input, store& db, output_buffer& out);

} // namespace spindle::examples::resp
