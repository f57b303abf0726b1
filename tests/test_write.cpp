// Writing text and gather writes (spindle/net/write.hpp): string views and
// strings without std::as_bytes, several pieces in one vectored send per
// attempt, partial sends that end inside a piece, empty pieces, more pieces
// than one send carries, a closed peer (an error, never SIGPIPE), and no
// allocation per call; over every kind of stream.

#include "counting_new.hpp"
#include "net_support.hpp"
#include "stream_kinds.hpp"

#include <spindle/detail/frame_pool.hpp>
#include <spindle/net/memory_stream.hpp>
#include <spindle/net/tcp.hpp>
#include <spindle/net/unix.hpp>
#include <spindle/net/write.hpp>

#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
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


// --- what the library sends ----------------------------------------------------------
//
// Every sendmsg of this program passes through here, the library's included:
// a definition in the executable comes before the C library's. So on the
// readiness backends (epoll, kqueue) a test can count the system calls a
// write makes, for one descriptor. io_uring's sends are requests on its ring
// and are not seen here.

namespace {

struct send_log {
    int fd = -1;  ///< the descriptor watched; -1: none
    int calls = 0;
    int partial = 0;  ///< calls that sent less than they were given
    std::size_t most_iovecs = 0;
    std::size_t gathered = 0;  ///< calls with more than one buffer
    void watch(int which) { *this = send_log{which}; }
};
send_log g_sends;

}  // namespace

extern "C" ssize_t sendmsg(int fd, const struct msghdr* msg, int flags) {
    using sendmsg_fn = ssize_t (*)(int, const struct msghdr*, int);
    static const auto next = reinterpret_cast<sendmsg_fn>(::dlsym(RTLD_NEXT, "sendmsg"));
    const ssize_t n = next(fd, msg, flags);
    if (fd == g_sends.fd) {
        std::size_t given = 0;
        for (std::size_t i = 0; i < static_cast<std::size_t>(msg->msg_iovlen); ++i) given += msg->msg_iov[i].iov_len;
        ++g_sends.calls;
        if (n >= 0 && static_cast<std::size_t>(n) < given) ++g_sends.partial;
        g_sends.most_iovecs = std::max(g_sends.most_iovecs, static_cast<std::size_t>(msg->msg_iovlen));
        if (msg->msg_iovlen > 1) ++g_sends.gathered;
    }
    return n;
}

// --- allocations ------------------------------------------------------------------------

#if SPINDLE_FRAME_POOL
using spindle::test::t_allocations;
using spindle::test::t_counting;
#endif

namespace {

static_assert(net::detail::writes_vectored<net::tcp_stream>);
static_assert(net::detail::writes_vectored<net::unix_stream>);
static_assert(!net::detail::writes_vectored<net::memory_stream>);  // falls back on its write_all(iovecs)

/// Reads everything until end of stream into `out`.
template <class Stream>
task<void> read_to_end(Stream& s, std::string& out) {
    std::array<std::byte, 4096> buf{};
    for (int i = 0; i < 1'000'000; ++i) {
        result<std::size_t> n = co_await s.read_some(buf, {});
        REQUIRE(n.has_value());
        if (*n == 0) co_return;
        out += text_of(std::span(buf).first(*n));
    }
    FAIL("read_to_end: no end of stream");
}

/// A memory_stream pair with a buffer of 7 bytes: every piece longer than
/// that, and many shorter ones, end up split across writes.
struct tiny_memory_kind {
    using stream = net::memory_stream;
    static constexpr const char* name = "memory_stream of 7 bytes";
    static task<std::pair<stream, stream>> make() { co_return net::memory_stream::pair(7); }
};

struct text_state {
    std::string received;
    std::string expected;
    std::error_code timed_out;
};

template <class Kind>
task<void> text_main(text_state& s) {
    auto [a, b] = co_await Kind::make();
    auto reader = loop::current().spawn(read_to_end(b, s.received));

    // Text, without std::as_bytes.
    const std::string owned = "a std::string\n";
    const std::string_view view = "a string_view\n";
    REQUIRE_OK(co_await net::write_all(a, "a literal\n"));
    REQUIRE_OK(co_await net::write_all(a, owned));
    REQUIRE_OK(co_await net::write_all(a, view));
    REQUIRE_OK(co_await net::write_all(a, std::string("a temporary\n")));
    s.expected += "a literal\na std::string\na string_view\na temporary\n";

    // Bytes, the same way.
    const std::vector<std::byte> raw{std::byte{'r'}, std::byte{'a'}, std::byte{'w'}, std::byte{'\n'}};
    const std::array<char, 4> chars{'a', 'r', 'r', '\n'};
    REQUIRE_OK(co_await net::write_all(a, raw));
    REQUIRE_OK(co_await net::write_all(a, std::span<const std::byte>(raw).first(3)));
    REQUIRE_OK(co_await net::write_all(a, chars));
    s.expected += "raw\nrawarr\n";

    // Gather writes of pieces of every kind, empty ones among them.
    const std::string head = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
    REQUIRE_OK(co_await net::write_all(a, {head, bytes_of("hello"), "", std::string_view("\n")}));
    REQUIRE_OK(co_await net::write_all(a, {}));
    REQUIRE_OK(co_await net::write_all(a, {"", std::string(), std::string_view()}));
    s.expected += head + "hello\n";

    const std::array<std::string_view, 3> views{"one ", "", "two\n"};
    REQUIRE_OK(co_await net::write_all(a, std::span<const std::string_view>(views)));
    const std::vector<std::span<const std::byte>> spans{bytes_of("three "), bytes_of("four\n")};
    REQUIRE_OK(co_await net::write_all(a, spans));
    s.expected += "one two\nthree four\n";

    // Many pieces: more than one send carries, of every length up to 300
    // bytes, every seventh one empty.
    std::vector<std::string> many;
    for (int i = 0; i < 200; ++i) many.push_back(i % 7 == 0 ? std::string() : std::string(static_cast<std::size_t>(i * 37 % 300), static_cast<char>('a' + i % 26)));
    REQUIRE_OK(co_await net::write_all(a, many));
    for (const std::string& piece : many) s.expected += piece;

    // The caller's stop token reaches the write.
    REQUIRE_OK(co_await net::write_all(a, {"with ", "a token\n"}, std::stop_token{}));
    s.expected += "with a token\n";

    REQUIRE_OK(co_await net::shutdown_write(a));
    co_await reader;

    // Nobody reads any more: a gather write larger than the stream can hold
    // parks, and a deadline ends it with timed_out.
    auto [c, d] = co_await Kind::make();
    const std::vector<std::byte> mebibyte(1 << 20);
    std::vector<std::span<const std::byte>> flood(64, std::span<const std::byte>(mebibyte));
    result<void> w = co_await spindle::with_timeout(50ms, net::write_all(c, flood));
    s.timed_out = w.error();
    (void)d;
}

}  // namespace

TEMPLATE_TEST_CASE("write: text, bytes and gather writes arrive in order over every stream", "[write]", spindle::test::memory_kind,
                   tiny_memory_kind, spindle::test::unix_kind, spindle::test::tcp_kind) {
    INFO(TestType::name);
    text_state s;
    loop l;
    run(l, text_main<TestType>(s), 30s);
    CHECK(s.received.size() == s.expected.size());
    CHECK(s.received == s.expected);
    CHECK(s.timed_out == std::errc::timed_out);
}

// --- one send per attempt, partial sends ---------------------------------------------

namespace {

bool readiness_backend(const loop& l) { return l.backend() != spindle::backend_kind::io_uring; }

struct one_send_state {
    send_log log;
    std::string received;
};

task<void> one_send_main(one_send_state& s) {
    auto [a, b] = co_await spindle::test::tcp_kind::make();
    const std::string head = "HEAD ";
    const std::vector<std::byte> body(1000, std::byte{'b'});
    g_sends.watch(a.native_handle());
    REQUIRE_OK(co_await net::write_all(a, {head, body, "", "\r\n"}));
    s.log = g_sends;
    g_sends.watch(-1);
    REQUIRE_OK(co_await net::shutdown_write(a));
    co_await read_to_end(b, s.received);
}

struct partial_state {
    send_log log;
    std::size_t pieces = 0;
    std::uint64_t total = 0;
    std::uint64_t received = 0;
    std::size_t mismatch = std::string::npos;
    bool eof = false;
};

/// Reads slowly, in small reads with pauses, checking every byte.
task<void> slow_reader(net::tcp_stream& r, partial_state& s) {
    (void)co_await spindle::sleep_for(20ms);  // let the writer fill the buffers first
    std::array<std::byte, 1500> buf{};
    for (int i = 0; i < 1'000'000; ++i) {
        result<std::size_t> n = co_await r.read_some(buf, {});
        REQUIRE(n.has_value());
        if (*n == 0) {
            s.eof = true;
            co_return;
        }
        if (s.mismatch == std::string::npos) {
            const std::size_t m = pattern_mismatch(std::span(buf).first(*n), 5, s.received);
            if (m != std::string::npos) s.mismatch = s.received + m;
        }
        s.received += *n;
        if (i % 64 == 0) (void)co_await spindle::sleep_for(1ms);
    }
}

task<void> partial_main(partial_state& s) {
    auto [a, b] = co_await spindle::test::tcp_kind::make();
    // Small kernel buffers on both sides: sends end inside pieces all the time.
    REQUIRE(a.set_option(SOL_SOCKET, SO_SNDBUF, 4096).has_value());
    REQUIRE(b.set_option(SOL_SOCKET, SO_RCVBUF, 16384).has_value());

    // One pattern, cut into pieces of awkward sizes (empty ones too), more
    // than one window of them.
    constexpr std::array<std::size_t, 12> sizes{0, 1, 4095, 7, 0, 20'000, 3, 30'000, 2, 0, 8191, 513};
    std::vector<std::byte> data;
    std::vector<std::span<const std::byte>> pieces;
    std::vector<std::size_t> lengths;
    for (int round = 0; round < 4; ++round)
        for (std::size_t size : sizes) lengths.push_back(size);
    std::size_t total = 0;
    for (std::size_t n : lengths) total += n;
    data.resize(total);
    fill_pattern(data, 5, 0);
    std::size_t at = 0;
    for (std::size_t n : lengths) {
        pieces.push_back(std::span<const std::byte>(data).subspan(at, n));
        at += n;
    }
    s.pieces = pieces.size();
    s.total = total;

    auto reader = loop::current().spawn(slow_reader(b, s));
    g_sends.watch(a.native_handle());
    REQUIRE_OK(co_await net::write_all(a, pieces));
    s.log = g_sends;
    g_sends.watch(-1);
    REQUIRE_OK(co_await net::shutdown_write(a));
    co_await reader;
}

}  // namespace

TEST_CASE("write: a gather write reaches the kernel as one vectored send", "[write][vectored]") {
    one_send_state s;
    loop l;
    run(l, one_send_main(s));
    CHECK(s.received == "HEAD " + std::string(1000, 'b') + "\r\n");
    if (!readiness_backend(l)) {
        // One request on the ring; what the kernel does with it is not seen here.
        CHECK(s.log.calls == 0);
        return;
    }
    CHECK(s.log.calls == 1);
    CHECK(s.log.most_iovecs == 3);  // the empty piece is not sent
    CHECK(s.log.partial == 0);
}

TEST_CASE("write: pieces crossing partial sends to a slow reader on small buffers arrive intact", "[write][vectored]") {
    partial_state s;
    loop l;
    run(l, partial_main(s), 60s);
    CHECK(s.pieces == 48u);
    CHECK(s.received == s.total);
    CHECK(s.mismatch == std::string::npos);
    CHECK(s.eof);
    if (readiness_backend(l)) {
        CHECK(s.log.partial > 0);  // sends did end inside the pieces
        CHECK(s.log.gathered > 0);
        CHECK(s.log.most_iovecs <= net::detail::gather_window);
    }
}

// --- a closed peer ----------------------------------------------------------------------

namespace {

struct closed_state {
    std::error_code error;
    int attempts = 0;
};

template <class Kind>
task<void> closed_peer_main(closed_state& s) {
    auto [a, b] = co_await Kind::make();
    b.close();
    const std::vector<std::byte> chunk(64 * 1024, std::byte{'x'});
    // The first writes may still be taken (TCP learns of the close from the
    // peer's reset); a later one fails.
    for (; s.attempts < 1000; ++s.attempts) {
        result<void> w = co_await net::write_all(a, {std::span<const std::byte>(chunk), std::span<const std::byte>(chunk), "tail"});
        if (!w) {
            s.error = w.error();
            co_return;
        }
        (void)co_await spindle::sleep_for(1ms);
    }
}

}  // namespace

TEMPLATE_TEST_CASE("write: a gather write to a closed peer is broken_pipe or connection_reset, and no SIGPIPE", "[write][reset]",
                   spindle::test::memory_kind, spindle::test::unix_kind, spindle::test::tcp_kind) {
    INFO(TestType::name);
    spindle::test::sigpipe_kills dfl;  // a SIGPIPE would end this program
    closed_state s;
    loop l;
    run(l, closed_peer_main<TestType>(s));
    CAPTURE(s.error.message(), s.attempts);
    CHECK((s.error == std::errc::broken_pipe || s.error == std::errc::connection_reset));
}

// --- no allocation per call -----------------------------------------------------------

namespace {

struct allocation_state {
    std::size_t allocations = 0;
    bool all_written = true;
    bool all_read = true;
    std::string received;
};

task<void> allocation_main(allocation_state& s) {
    auto [a, b] = co_await spindle::test::unix_kind::make();
    const std::string head = "head ";
    const std::string_view tail = "tail\n";
    std::array<std::byte, 64> buf{};
    const std::array<std::string_view, 8> eight{"1", "2", "3", "4", "5", "6", "7", "\n"};
    s.received.reserve(buf.size());
    // The first round fills the frame pool; the others must not allocate.
    // Nothing in the counted rounds allocates on its own: no assertion (Catch
    // may allocate), no string that grows.
    for (int round = 0; round < 101; ++round) {
#if SPINDLE_FRAME_POOL
        t_counting = round > 0;
#endif
        result<void> w = co_await net::write_all(a, {head, bytes_of("body "), tail});
        s.all_written = s.all_written && w.has_value();
        w = co_await net::write_all(a, eight);
        s.all_written = s.all_written && w.has_value();
        w = co_await net::write_all(a, "text\n");
        s.all_written = s.all_written && w.has_value();
        for (std::size_t want = 28; want > 0;) {
            result<std::size_t> n = co_await b.read_some(std::span(buf).first(want), {});
            if (!n || *n == 0) {
                s.all_read = false;
                break;
            }
            if (round == 100) s.received.append(reinterpret_cast<const char*>(buf.data()), *n);
            want -= *n;
        }
    }
#if SPINDLE_FRAME_POOL
    t_counting = false;
    s.allocations = t_allocations;
#endif
}

}  // namespace

TEST_CASE("write: gather writes of a few pieces allocate nothing once the frame pool is warm", "[write][allocation]") {
    allocation_state s;
    loop l;
    run(l, allocation_main(s));
    CHECK(s.all_written);
    CHECK(s.all_read);
    CHECK(s.received == "head body tail\n1234567\ntext\n");
#if SPINDLE_FRAME_POOL
    CHECK(s.allocations == 0u);
#else
    WARN("the frame pool is off in this build (AddressSanitizer): allocations not counted");
#endif
}
