// The byte-stream seam (spindle/net/byte_stream.hpp): which types satisfy the
// concept, one body of checks run over every stream that does (memory_stream,
// unix_stream, tcp_stream on loopback), the in-memory double's own contract
// (spindle/net/memory_stream.hpp), a stream whose half-close is an operation
// (as an encrypted stream's is), the buffered reader over any of them, and
// the example services' connection loop over streams that are not sockets.

#include "net_support.hpp"
#include "service.hpp"
#include "stream_kinds.hpp"

#include <spindle/net/buffered_reader.hpp>
#include <spindle/net/byte_stream.hpp>
#include <spindle/net/memory_stream.hpp>
#include <spindle/net/tcp.hpp>
#include <spindle/net/udp.hpp>
#include <spindle/net/unix.hpp>
#include <spindle/testing.hpp>

#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::test::bytes_of;
using spindle::test::fill_pattern;
using spindle::test::pattern_mismatch;
using spindle::test::run;
using spindle::test::text_of;
namespace net = spindle::net;
using spindle::test::error_of;


namespace {

/// A stream whose half-close has to write first, as TLS sends close_notify:
/// shutdown_write(token) is an operation that writes "BYE\n", then ends the
/// stream. Everything else is the memory_stream underneath.
class goodbye_stream {
public:
    explicit goodbye_stream(net::memory_stream inner) : m_inner(std::move(inner)) {}

    auto read_some(std::span<std::byte> buf, std::stop_token token = {}) { return m_inner.read_some(buf, std::move(token)); }
    auto write_some(std::span<const std::byte> buf, std::stop_token token = {}) { return m_inner.write_some(buf, std::move(token)); }
    auto write_all(std::span<const std::byte> buf, std::stop_token token = {}) { return m_inner.write_all(buf, std::move(token)); }
    auto write_all(std::span<const ::iovec> bufs, std::stop_token token = {}) { return m_inner.write_all(bufs, std::move(token)); }
    task<result<void>> shutdown_write(std::stop_token token = {}) {
        if (result<void> w = co_await m_inner.write_all(bytes_of("BYE\n"), std::move(token)); !w) co_return w;
        co_return m_inner.shutdown_write();
    }
    void close() noexcept { m_inner.close(); }

private:
    net::memory_stream m_inner;
};

}  // namespace

// --- what satisfies the concept ---------------------------------------------------

static_assert(net::byte_stream<net::stream_socket>);
static_assert(net::byte_stream<net::tcp_stream>);
static_assert(net::byte_stream<net::unix_stream>);
static_assert(net::byte_stream<net::memory_stream>);
static_assert(net::byte_stream<goodbye_stream>);
static_assert(net::detail::shuts_down_at_once<net::tcp_stream>);
static_assert(net::detail::shuts_down_at_once<net::memory_stream>);
static_assert(net::detail::shuts_down_by_operation<goodbye_stream>);
static_assert(!net::detail::shuts_down_at_once<goodbye_stream>);
// Datagrams and listeners are not byte streams.
static_assert(!net::byte_stream<net::udp_socket>);
static_assert(!net::byte_stream<net::tcp_listener>);
static_assert(!net::byte_stream<int>);
// The reader over a socket is still the one type existing code names.
static_assert(std::is_same_v<net::buffered_reader, net::basic_buffered_reader<net::stream_socket>>);

namespace {

// --- one body over every stream ----------------------------------------------------

using spindle::test::memory_kind;
using spindle::test::tcp_kind;
using spindle::test::unix_kind;

struct conformance_state {
    std::vector<std::string> lines;
    std::error_code timed_out;
    std::error_code stopped;
    std::error_code stopped_early;
    std::string late_line;
    std::error_code end_of_stream;
    std::string buffered_at_end;
    std::string backwards;
    std::error_code closed_under_read;
    bool closed_is_open = true;
    std::error_code read_after_close;
    std::error_code write_after_close;
};

template <class Kind>
task<void> conformance_main(conformance_state& s) {
    using stream = typename Kind::stream;
    auto [a, b] = co_await Kind::make();
    net::basic_buffered_reader reader(b);

    // Plain, then vectored writes, read back as lines.
    REQUIRE_OK(co_await a.write_all(bytes_of("one\ntwo\n"), {}));
    std::array<::iovec, 3> parts{{{const_cast<char*>("th"), 2}, {const_cast<char*>("r"), 1}, {const_cast<char*>("ee\n"), 3}}};
    REQUIRE_OK(co_await a.write_all(std::span<const ::iovec>(parts), {}));
    for (int i = 0; i < 3; ++i) {
        result<std::string_view> line = co_await reader.read_until("\n", 100);
        REQUIRE(line.has_value());
        s.lines.emplace_back(*line);
    }

    // A deadline ends a parked read with timed_out; the stream stays in step.
    result<std::string_view> timed = co_await spindle::with_timeout(20ms, reader.read_until("\n", 100));
    s.timed_out = timed.error();

    // A stop request ends a parked read with operation_canceled.
    std::stop_source stop;
    auto stopper = loop::current().spawn([](std::stop_source& stop) -> task<void> {
        (void)co_await spindle::sleep_for(5ms);
        stop.request_stop();
    }(stop));
    std::array<std::byte, 64> buf{};
    result<std::size_t> n = co_await b.read_some(buf, stop.get_token());
    s.stopped = n.error();
    co_await stopper;

    // A token already stopped fails at once, even with bytes waiting.
    REQUIRE_OK(co_await a.write_all(bytes_of("four\n"), {}));
    (void)co_await spindle::sleep_for(5ms);
    n = co_await b.read_some(buf, stop.get_token());
    s.stopped_early = n.error();
    result<std::string_view> late = co_await reader.read_until("\n", 100);
    REQUIRE(late.has_value());
    s.late_line = std::string(*late);

    // Half-close: the reader sees what was written, then end of stream; the
    // other direction still works.
    REQUIRE_OK(co_await a.write_all(bytes_of("tail"), {}));
    REQUIRE_OK(co_await net::shutdown_write(a));
    result<std::string_view> last = co_await reader.read_until("\n", 100);
    s.end_of_stream = last.error();
    s.buffered_at_end = text_of(reader.buffered());
    REQUIRE_OK(co_await b.write_all(bytes_of("back"), {}));
    n = co_await a.read_some(buf, {});
    REQUIRE(n.has_value());
    s.backwards = text_of(std::span(buf).first(*n));

    // Closing a stream completes the read parked on it with operation_canceled.
    auto parked = loop::current().spawn([](stream& a, std::error_code& e) -> task<void> {
        std::array<std::byte, 16> buf{};
        result<std::size_t> n = co_await a.read_some(buf, {});
        e = n.error();
    }(a, s.closed_under_read));
    (void)co_await spindle::sleep_for(5ms);
    a.close();
    co_await parked;
    s.closed_is_open = a.is_open();
    // (Named results: GCC 12 cannot parse `(co_await x).error()` in a template.)
    result<std::size_t> read_closed = co_await a.read_some(buf, {});
    s.read_after_close = read_closed.error();
    result<void> write_closed = co_await a.write_all(bytes_of("x"), {});
    s.write_after_close = write_closed.error();
    a.close();  // a second close does nothing
}

}  // namespace

TEMPLATE_TEST_CASE("byte_stream: the same body over every stream", "[stream]", memory_kind, unix_kind, tcp_kind) {
    INFO(TestType::name);
    conformance_state s;
    loop l;
    run(l, conformance_main<TestType>(s));
    CHECK(s.lines == std::vector<std::string>{"one\n", "two\n", "three\n"});
    CHECK(s.timed_out == std::errc::timed_out);
    CHECK(s.stopped == std::errc::operation_canceled);
    CHECK(s.stopped_early == std::errc::operation_canceled);
    CHECK(s.late_line == "four\n");
    CHECK(s.end_of_stream == net::errc::end_of_stream);
    CHECK(s.buffered_at_end == "tail");
    CHECK(s.backwards == "back");
    CHECK(s.closed_under_read == std::errc::operation_canceled);
    CHECK_FALSE(s.closed_is_open);
    CHECK(s.read_after_close == std::errc::bad_file_descriptor);
    CHECK(s.write_after_close == std::errc::bad_file_descriptor);
}

// --- memory_stream's own contract --------------------------------------------------

namespace {

struct bulk_state {
    std::size_t peak_unread = 0;
    bool writer_done_before_reading = true;
    std::uint64_t received = 0;
    std::size_t mismatch = std::string::npos;
    std::size_t reads = 0;
};

task<void> bulk_main(bulk_state& s) {
    constexpr std::size_t capacity = 4096;
    constexpr std::size_t total = 256 * 1024;
    auto [a, b] = net::memory_stream::pair(capacity);
    std::vector<std::byte> out(total);
    fill_pattern(out, 7, 0);
    auto writer = loop::current().spawn([](net::memory_stream& a, std::span<const std::byte> out) -> task<void> {
        REQUIRE_OK(co_await a.write_all(out, {}));
    }(a, out));
    (void)co_await spindle::sleep_for(5ms);
    s.writer_done_before_reading = writer.done();
    s.peak_unread = a.unread_by_peer();
    std::array<std::byte, 1000> buf{};
    for (int i = 0; i < 10'000 && s.received < total; ++i) {
        result<std::size_t> n = co_await b.read_some(buf, {});
        REQUIRE(n.has_value());
        REQUIRE(*n > 0);
        ++s.reads;
        s.peak_unread = std::max(s.peak_unread, a.unread_by_peer());
        std::size_t bad = pattern_mismatch(std::span(buf).first(*n), 7, s.received);
        if (bad != std::string::npos && s.mismatch == std::string::npos) s.mismatch = s.received + bad;
        s.received += *n;
    }
    co_await writer;
}

}  // namespace

TEST_CASE("memory_stream: a writer parks while the buffer is full and resumes as the reader drains", "[stream][memory]") {
    bulk_state s;
    loop l;
    run(l, bulk_main(s));
    CHECK_FALSE(s.writer_done_before_reading);
    CHECK(s.peak_unread == 4096u);  // never more than the capacity
    CHECK(s.received == 256u * 1024u);
    CHECK(s.mismatch == std::string::npos);
}

namespace {

struct partial_state {
    std::size_t first = 0;
    std::size_t second = 0;
    std::error_code full_timed_out;
    std::error_code full_stopped;
    std::size_t unread_after = 0;
    std::string read_back;
};

task<void> partial_main(partial_state& s) {
    auto [a, b] = net::memory_stream::pair(8);
    result<std::size_t> n = co_await a.write_some(bytes_of("12345"), {});
    REQUIRE(n.has_value());
    s.first = *n;
    n = co_await a.write_some(bytes_of("67890"), {});
    REQUIRE(n.has_value());
    s.second = *n;  // what fits
    // Full: the write parks; a deadline or a stop request ends it, having
    // written nothing.
    n = co_await spindle::with_timeout(10ms, a.write_some(bytes_of("x"), {}));
    s.full_timed_out = n.error();
    std::stop_source stop;
    auto stopper = loop::current().spawn([](std::stop_source& stop) -> task<void> {
        (void)co_await spindle::sleep_for(5ms);
        stop.request_stop();
    }(stop));
    result<void> w = co_await a.write_all(bytes_of("yz"), stop.get_token());
    s.full_stopped = w.error();
    co_await stopper;
    s.unread_after = a.unread_by_peer();
    std::array<std::byte, 16> buf{};
    n = co_await b.read_some(buf, {});
    REQUIRE(n.has_value());
    s.read_back = text_of(std::span(buf).first(*n));
}

}  // namespace

TEST_CASE("memory_stream: write_some takes what fits; a full buffer parks it until a deadline or a stop", "[stream][memory][cancel]") {
    partial_state s;
    loop l;
    run(l, partial_main(s));
    CHECK(s.first == 5u);
    CHECK(s.second == 3u);
    CHECK(s.full_timed_out == std::errc::timed_out);
    CHECK(s.full_stopped == std::errc::operation_canceled);
    CHECK(s.unread_after == 8u);
    CHECK(s.read_back == "12345678");
}

namespace {

struct close_state {
    std::string peer_read;
    std::size_t peer_eof = 99;
    std::error_code peer_write;
    std::error_code parked_peer_write;
    std::error_code own_read;
    std::error_code own_shutdown;
    std::size_t dropped_unread = 99;
    std::error_code write_after_shutdown;
    std::error_code parked_own_write;
    bool shutdown_twice = false;
};

task<void> close_main(close_state& s) {
    {
        auto [a, b] = net::memory_stream::pair(4);
        REQUIRE_OK(co_await b.write_all(bytes_of("zz"), {}));  // never read by a
        REQUIRE_OK(co_await a.write_all(bytes_of("bye"), {}));
        // b fills its way toward a and parks; a's close wakes it.
        REQUIRE_OK(co_await b.write_all(bytes_of("zz"), {}));
        auto parked = loop::current().spawn([](net::memory_stream& b, std::error_code& e) -> task<void> {
            result<void> w = co_await b.write_all(bytes_of("more"), {});
            e = w.error();
        }(b, s.parked_peer_write));
        (void)co_await spindle::sleep_for(5ms);
        a.close();
        co_await parked;
        s.dropped_unread = b.unread_by_peer();
        std::array<std::byte, 16> buf{};
        result<std::size_t> n = co_await b.read_some(buf, {});
        REQUIRE(n.has_value());
        s.peer_read = text_of(std::span(buf).first(*n));
        n = co_await b.read_some(buf, {});
        REQUIRE(n.has_value());
        s.peer_eof = *n;
        s.peer_write = error_of(co_await b.write_some(bytes_of("x"), {}));
        s.own_read = error_of(co_await a.read_some(buf, {}));
        s.own_shutdown = a.shutdown_write().error();
    }
    {
        auto [a, b] = net::memory_stream::pair(2);
        REQUIRE_OK(co_await a.write_all(bytes_of("ab"), {}));
        auto parked = loop::current().spawn([](net::memory_stream& a, std::error_code& e) -> task<void> {
            result<void> w = co_await a.write_all(bytes_of("c"), {});
            e = w.error();
        }(a, s.parked_own_write));
        (void)co_await spindle::sleep_for(5ms);
        s.shutdown_twice = a.shutdown_write().has_value() && a.shutdown_write().has_value();
        co_await parked;
        s.write_after_shutdown = error_of(co_await a.write_some(bytes_of("d"), {}));
    }
}

}  // namespace

TEST_CASE("memory_stream: close and shutdown_write behave as on a socket pair", "[stream][memory]") {
    close_state s;
    loop l;
    run(l, close_main(s));
    CHECK(s.parked_peer_write == std::errc::broken_pipe);
    CHECK(s.dropped_unread == 0u);  // what a never read is gone
    CHECK(s.peer_read == "bye");    // what a wrote before closing still arrives
    CHECK(s.peer_eof == 0u);
    CHECK(s.peer_write == std::errc::broken_pipe);
    CHECK(s.own_read == std::errc::bad_file_descriptor);
    CHECK(s.own_shutdown == std::errc::bad_file_descriptor);
    CHECK(s.shutdown_twice);
    CHECK(s.parked_own_write == std::errc::broken_pipe);
    CHECK(s.write_after_shutdown == std::errc::broken_pipe);
}

namespace {

task<void> read_into(net::memory_stream* stream, std::error_code& e) {
    std::array<std::byte, 16> buf{};
    // The operation is made before the stream goes away; it holds what it needs.
    task<result<std::size_t>> op = stream->read_some(buf, {});
    result<std::size_t> n = co_await std::move(op);
    e = n.error();
}

task<void> destroyed_main(std::error_code& e) {
    std::optional<net::memory_stream> a;
    std::optional<net::memory_stream> b;
    {
        auto p = net::memory_stream::pair();
        a.emplace(std::move(p.first));
        b.emplace(std::move(p.second));
    }
    auto reader = loop::current().spawn(read_into(&*b, e));
    (void)co_await spindle::sleep_for(5ms);
    b.reset();
    a.reset();
    co_await reader;
}

}  // namespace

TEST_CASE("memory_stream: destroying both ends under a parked read completes it with operation_canceled", "[stream][memory][lifetime]") {
    std::error_code e;
    loop l;
    run(l, destroyed_main(e));
    CHECK(e == std::errc::operation_canceled);
}

TEST_CASE("memory_stream: a default-constructed or moved-from stream is closed", "[stream][memory]") {
    loop l;
    auto check = []() -> task<void> {
        net::memory_stream none;
        CHECK_FALSE(none.is_open());
        std::array<std::byte, 4> buf{};
        CHECK_ERROR(co_await none.read_some(buf, {}), std::errc::bad_file_descriptor);
        CHECK_ERROR(co_await none.write_all(bytes_of("x"), {}), std::errc::bad_file_descriptor);
        auto [a, b] = net::memory_stream::pair();
        net::memory_stream moved = std::move(a);
        CHECK_FALSE(a.is_open());
        CHECK(moved.is_open());
        REQUIRE_OK(co_await moved.write_all(bytes_of("hi"), {}));
        result<std::size_t> n = co_await b.read_some(buf, {});
        REQUIRE(n.has_value());
        CHECK(text_of(std::span(buf).first(*n)) == "hi");
        // Move-assigning over an open end closes it: its peer reads end of stream.
        moved = net::memory_stream();
        n = co_await b.read_some(buf, {});
        REQUIRE(n.has_value());
        CHECK(*n == 0u);
    };
    run(l, check());
}

TEST_CASE("memory_stream: needs no descriptor, so an hour's deadline passes at once under virtual time", "[stream][memory][timeout]") {
    const auto started = std::chrono::steady_clock::now();
    std::error_code e = spindle::testing::run([]() -> task<std::error_code> {
        auto [a, b] = net::memory_stream::pair();
        std::array<std::byte, 4> buf{};
        result<std::size_t> n = co_await spindle::with_timeout(1h, b.read_some(buf, {}));
        co_return n.error();
    }());
    CHECK(e == std::errc::timed_out);
    CHECK(std::chrono::steady_clock::now() - started < 5s);
}

// --- a half-close that is an operation --------------------------------------------

namespace {

struct goodbye_state {
    std::string peer_got;
    std::error_code full_timed_out;
    std::error_code full_stopped;
};

task<void> goodbye_main(goodbye_state& s) {
    {
        auto [a, b] = net::memory_stream::pair();
        goodbye_stream g(std::move(a));
        REQUIRE_OK(co_await g.write_all(bytes_of("last words\n"), {}));
        REQUIRE_OK(co_await net::shutdown_write(g));
        std::array<std::byte, 64> buf{};
        for (int i = 0; i < 100; ++i) {
            result<std::size_t> n = co_await b.read_some(buf, {});
            REQUIRE(n.has_value());
            if (*n == 0) break;
            s.peer_got += text_of(std::span(buf).first(*n));
        }
    }
    {
        // Toward a peer that does not read, the goodbye parks like any write:
        // a deadline or a stop ends it.
        auto [a, b] = net::memory_stream::pair(2);
        goodbye_stream g(std::move(a));
        REQUIRE_OK(co_await g.write_all(bytes_of("xx"), {}));
        s.full_timed_out = error_of(co_await spindle::with_timeout(10ms, net::shutdown_write(g)));
        std::stop_source stop;
        stop.request_stop();
        s.full_stopped = error_of(co_await net::shutdown_write(g, stop.get_token()));
    }
}

}  // namespace

TEST_CASE("byte_stream: a half-close that writes first is awaited through net::shutdown_write", "[stream][cancel]") {
    goodbye_state s;
    loop l;
    run(l, goodbye_main(s));
    CHECK(s.peer_got == "last words\nBYE\n");
    CHECK(s.full_timed_out == std::errc::timed_out);
    CHECK(s.full_stopped == std::errc::operation_canceled);
}

// --- the buffered reader over memory ------------------------------------------------

namespace {

struct reader_state {
    std::vector<std::string> lines;
    std::error_code too_long;
    std::string exact;
    std::error_code timed_out;
    std::string buffered_then;
    std::string completed;
    std::error_code eos;
    std::string eos_buffered;
};

task<void> reader_main(reader_state& s) {
    // A small buffer each way, so lines arrive in pieces.
    auto [a, b] = net::memory_stream::pair(3);
    net::basic_buffered_reader reader(b, 4);
    static_assert(std::is_same_v<decltype(reader), net::basic_buffered_reader<net::memory_stream>>);
    auto writer = loop::current().spawn([](net::memory_stream& a) -> task<void> {
        for (std::string_view part : {"0123456789\r\n", "x\r\n", "aaaaaaaaaaaaaaaaaaaa\n", "ABCDEFGHIJ"}) {
            REQUIRE_OK(co_await a.write_all(bytes_of(part), {}));
        }
    }(a));
    for (int i = 0; i < 2; ++i) {
        result<std::string_view> line = co_await reader.read_until("\r\n", 64);
        REQUIRE(line.has_value());
        s.lines.emplace_back(*line);
    }
    s.too_long = error_of(co_await reader.read_until("\n", 8));
    result<std::string_view> line = co_await reader.read_until("\n", 64);
    REQUIRE(line.has_value());
    s.lines.emplace_back(*line);
    std::array<std::byte, 10> ten{};
    REQUIRE_OK(co_await reader.read_exact(ten));
    s.exact = text_of(ten);
    co_await writer;

    REQUIRE_OK(co_await a.write_all(bytes_of("par"), {}));
    s.timed_out = error_of(co_await spindle::with_timeout(20ms, reader.read_until("\n", 64)));
    s.buffered_then = text_of(reader.buffered());
    // More than the 3-byte buffer holds: written while the reader reads,
    // then the writer closes.
    auto closer = loop::current().spawn([](net::memory_stream& a) -> task<void> {
        REQUIRE_OK(co_await a.write_all(bytes_of("tial\nrest"), {}));
        a.close();
    }(a));
    line = co_await reader.read_until("\n", 64);
    REQUIRE(line.has_value());
    s.completed = std::string(*line);
    s.eos = error_of(co_await reader.read_until("\n", 64));
    s.eos_buffered = text_of(reader.buffered());
    co_await closer;
}

}  // namespace

TEST_CASE("buffered_reader: over a memory_stream, lines, limits, exact reads, deadlines and end of stream", "[stream][buffered]") {
    reader_state s;
    loop l;
    run(l, reader_main(s));
    REQUIRE(s.lines.size() == 3u);
    CHECK(s.lines[0] == "0123456789\r\n");
    CHECK(s.lines[1] == "x\r\n");
    CHECK(s.too_long == net::errc::line_too_long);
    CHECK(s.lines[2] == "aaaaaaaaaaaaaaaaaaaa\n");
    CHECK(s.exact == "ABCDEFGHIJ");
    CHECK(s.timed_out == std::errc::timed_out);
    CHECK(s.buffered_then == "par");
    CHECK(s.completed == "partial\n");
    CHECK(s.eos == net::errc::end_of_stream);
    CHECK(s.eos_buffered == "rest");
}

namespace {

struct research_state {
    std::error_code too_long;
    std::string line;
    std::error_code too_long_again;
    std::string other_delimiter;
    std::string rest;
};

task<void> research_main(research_state& s) {
    auto [a, b] = net::memory_stream::pair();
    REQUIRE_OK(co_await a.write_all(bytes_of("ab\ncd;ef\n"), {}));
    REQUIRE_OK(a.shutdown_write());
    net::basic_buffered_reader reader(b);
    // The delimiter arrives, but beyond the limit: refused, the bytes kept.
    s.too_long = error_of(co_await reader.read_until("\n", 1));
    // A larger limit takes the same line from what is buffered.
    result<std::string_view> line = co_await reader.read_until("\n", 4);
    REQUIRE(line.has_value());
    s.line = *line;
    s.too_long_again = error_of(co_await reader.read_until("\n", 2));
    // Another delimiter, already buffered before the refused search's.
    line = co_await reader.read_until(";", 8);
    REQUIRE(line.has_value());
    s.other_delimiter = *line;
    line = co_await reader.read_until("\n", 8);
    REQUIRE(line.has_value());
    s.rest = *line;
}

}  // namespace

// Found by fuzzing (tests/fuzz/fuzz_buffered_reader.cpp): a refused search
// left its progress behind, and the next call resumed after bytes it had
// never searched with its own delimiter and limit.
TEST_CASE("buffered_reader: a call after line_too_long searches every buffered byte", "[stream][buffered]") {
    research_state s;
    loop l;
    run(l, research_main(s));
    CHECK(s.too_long == net::errc::line_too_long);
    CHECK(s.line == "ab\n");
    CHECK(s.too_long_again == net::errc::line_too_long);
    CHECK(s.other_delimiter == "cd;");
    CHECK(s.rest == "ef\n");
}

// --- the example services over streams that are not sockets --------------------------

namespace {

/// A line protocol for serve_batches: "ok <line>" for each complete line;
/// "quit" closes after its reply.
struct line_protocol {
    std::string* out;
    spindle::examples::batch_outcome operator()(std::string_view input) const {
        out->clear();
        spindle::examples::batch_outcome batch;
        for (std::size_t at; (at = input.find('\n', batch.consumed)) != std::string_view::npos;) {
            std::string_view line = input.substr(batch.consumed, at - batch.consumed);
            *out += "ok ";
            *out += line;
            *out += '\n';
            batch.consumed = at + 1;
            if (line == "quit") {
                batch.close = true;
                break;
            }
        }
        batch.reply = *out;
        return batch;
    }
};

template <class Stream>
task<void> serve(Stream server, std::stop_token stop) {
    std::string out;
    co_await spindle::examples::serve_batches(server, stop, line_protocol{&out}, /*linger=*/true);
}

/// Sends the requests in two pieces, then reads to end of stream.
task<std::string> client(net::memory_stream& c) {
    REQUIRE_OK(co_await c.write_all(bytes_of("hello\nwor"), {}));
    (void)co_await spindle::sleep_for(2ms);
    REQUIRE_OK(co_await c.write_all(bytes_of("ld\nquit\n"), {}));
    std::string got;
    std::array<std::byte, 64> buf{};
    for (int i = 0; i < 1000; ++i) {
        result<std::size_t> n = co_await c.read_some(buf, {});
        REQUIRE(n.has_value());
        if (*n == 0) break;
        got += text_of(std::span(buf).first(*n));
    }
    // The server lingers until this end goes.
    c.close();
    co_return got;
}

template <class Wrap>
task<void> service_main(std::string& got, Wrap wrap) {
    auto [c, s] = net::memory_stream::pair(16);
    std::stop_source stop;
    auto server = loop::current().spawn(serve(wrap(std::move(s)), stop.get_token()));
    got = co_await client(c);
    co_await server;
}

}  // namespace

TEST_CASE("examples: serve_batches and its graceful close run over any byte_stream", "[stream][examples]") {
    loop l;
    std::string plain;
    run(l, service_main(plain, [](net::memory_stream s) { return s; }));
    CHECK(plain == "ok hello\nok world\nok quit\n");
    // A stream whose half-close writes a goodbye: close_gracefully awaits it.
    std::string with_goodbye;
    run(l, service_main(with_goodbye, [](net::memory_stream s) { return goodbye_stream(std::move(s)); }));
    CHECK(with_goodbye == "ok hello\nok world\nok quit\nBYE\n");
}

namespace {

/// Answers "big" with 8 MiB, more than loopback's socket buffers take: the
/// write waits until the client reads.
struct big_reply_protocol {
    const std::string* big;
    spindle::examples::batch_outcome operator()(std::string_view input) const {
        spindle::examples::batch_outcome batch;
        if (const std::size_t at = input.find('\n'); at != std::string_view::npos) {
            batch.consumed = at + 1;
            batch.reply = *big;
        }
        return batch;
    }
};

}  // namespace

TEST_CASE("examples: serve_batches gives a read's borrowed buffer back before a reply that waits", "[stream][examples]") {
    loop l;
    auto bound = net::tcp_listener::bind(net::address::ipv4_loopback(0));
    REQUIRE(bound.has_value());
    net::tcp_listener listener = std::move(*bound);
    const std::string big(8 << 20, 'x');
    std::uint64_t lent_while_writing = 99;
    std::size_t received = 0;
    run(l,
        [](net::tcp_listener& listener, const std::string& big, std::uint64_t& lent,
           std::size_t& received) -> task<void> {
            result<net::address> to = listener.local_address();
            REQUIRE(to.has_value());
            result<net::tcp_stream> client = co_await net::tcp_stream::connect(*to);
            REQUIRE(client.has_value());
            result<net::tcp_stream> accepted = co_await listener.accept();
            REQUIRE(accepted.has_value());
            std::stop_source stop;
            auto server = loop::current().spawn(
                [](net::tcp_stream s, std::stop_token stop, const std::string& big) -> task<void> {
                    co_await spindle::examples::serve_batches(s, stop, big_reply_protocol{&big}, /*linger=*/false);
                }(std::move(*accepted), stop.get_token(), big));
            REQUIRE_OK(co_await client->write_all(bytes_of("big\n"), {}));
            (void)co_await spindle::sleep_for(50ms);  // the server read, and its write waits for us
            lent = loop::current().metrics().read_buffers_lent;
            std::array<std::byte, 65536> buf{};
            while (received < big.size()) {
                result<std::size_t> n = co_await client->read_some(buf, {});
                REQUIRE(n.has_value());
                REQUIRE(*n > 0);
                received += *n;
            }
            client->close();
            co_await server;
        }(listener, big, lent_while_writing, received));
    CHECK(received == big.size());
    CHECK(lent_while_writing == 0);
}
