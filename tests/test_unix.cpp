// Unix stream sockets (spindle/net/unix.hpp): listeners on a path in a fresh
// temporary directory and in the abstract namespace, socketpairs, and the
// socket file's lifetime.

#include "net_support.hpp"

#include <spindle/net/unix.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <fcntl.h>
#include <string>
#include <system_error>

using namespace std::chrono_literals;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::test::bytes_of;
using spindle::test::run;
using spindle::test::text_of;
namespace net = spindle::net;

namespace {

/// A fresh directory (mkdtemp), removed with what is left in it.
class temp_dir {
public:
    temp_dir() {
        const char* base = std::getenv("TMPDIR");
        std::string pattern = std::string(base && *base ? base : "/tmp") + "/spindle-unix-XXXXXX";
        REQUIRE(::mkdtemp(pattern.data()) != nullptr);
        m_path = pattern;
    }
    ~temp_dir() {
        for (const char* name : {"sock", "moved", "file", "again"}) ::unlink((m_path + "/" + name).c_str());
        ::rmdir(m_path.c_str());
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    std::string file(const char* name) const { return m_path + "/" + name; }
    /// rmdir succeeds only when the directory is empty.
    bool remove_if_empty() const { return ::rmdir(m_path.c_str()) == 0; }

private:
    std::string m_path;
};

/// "@spindle-test-<pid>-<n>": unique within the machine's abstract namespace.
std::string abstract_name() {
    static std::atomic<int> next{0};
    return "@spindle-test-" + std::to_string(::getpid()) + "-" + std::to_string(next++);
}

enum class file_kind { missing, socket, other };

file_kind kind_of(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? file_kind::missing : file_kind::other;
    return S_ISSOCK(st.st_mode) ? file_kind::socket : file_kind::other;
}

net::address unix_address(const std::string& path) {
    auto a = net::address::from_unix_path(path);
    REQUIRE(a.has_value());
    return *a;
}

net::unix_listener bind_at(const net::address& a) {
    auto l = net::unix_listener::bind(a);
    REQUIRE(l.has_value());
    return std::move(*l);
}

struct round_trip_state {
    std::string server_got;
    std::string client_got;
    std::size_t eof = 99;
};

/// Connects to `to`, sends "ping", gets "pong" back, then sees end of stream.
task<void> round_trip_main(net::unix_listener& l, net::address to, round_trip_state& s) {
    auto server = loop::current().spawn([](net::unix_listener& l, round_trip_state& s) -> task<void> {
        result<net::unix_stream> c = co_await l.accept();
        REQUIRE(c.has_value());
        std::array<std::byte, 4> in{};
        result<void> r = co_await c->read_exact(in);
        REQUIRE(r.has_value());
        s.server_got = text_of(in);
        r = co_await c->write_all(bytes_of("pong"));
        REQUIRE(r.has_value());
    }(l, s));
    result<net::unix_stream> c = co_await net::unix_stream::connect(to);
    REQUIRE(c.has_value());
    result<void> w = co_await c->write_all(bytes_of("ping"));
    REQUIRE(w.has_value());
    std::array<std::byte, 4> in{};
    result<void> r = co_await c->read_exact(in);
    REQUIRE(r.has_value());
    s.client_got = text_of(in);
    co_await server;  // the server's stream is closed when its task ends
    std::array<std::byte, 4> more{};
    result<std::size_t> n = co_await c->read_some(more);
    REQUIRE(n.has_value());
    s.eof = *n;
}

struct pair_state {
    std::string a_got;
    std::string b_got;
    std::string after_half_close;
    std::size_t eof = 99;
    std::error_code cancelled;
};

task<void> pair_main(net::unix_stream& a, net::unix_stream& b, pair_state& s) {
    std::array<std::byte, 16> buf{};
    result<void> w = co_await a.write_all(bytes_of("to b"));
    REQUIRE(w.has_value());
    result<std::size_t> n = co_await b.read_some(buf);
    REQUIRE(n.has_value());
    s.b_got = text_of(std::span(buf).first(*n));
    w = co_await b.write_all(bytes_of("to a"));
    REQUIRE(w.has_value());
    n = co_await a.read_some(buf);
    REQUIRE(n.has_value());
    s.a_got = text_of(std::span(buf).first(*n));
    // Half-close a's side: b reads end of stream and can still answer.
    REQUIRE(a.shutdown_write().has_value());
    n = co_await b.read_some(buf);
    REQUIRE(n.has_value());
    s.eof = *n;
    w = co_await b.write_all(bytes_of("still here"));
    REQUIRE(w.has_value());
    n = co_await a.read_some(buf);
    REQUIRE(n.has_value());
    s.after_half_close = text_of(std::span(buf).first(*n));
    // Closing a stream completes its pending read with operation_canceled.
    auto reader = loop::current().spawn([](net::unix_stream& a, pair_state& s) -> task<void> {
        std::array<std::byte, 16> buf{};
        result<std::size_t> n = co_await a.read_some(buf);
        s.cancelled = n.error();
    }(a, s));
    (void)co_await spindle::sleep_for(10ms);
    a.close();
    co_await reader;
}

task<void> connect_error(net::address to, std::error_code& e) {
    result<net::unix_stream> c = co_await net::unix_stream::connect(to);
    e = c.error();
}

}  // namespace

// =====================================================================================

TEST_CASE("unix: listener and stream round trip on a path in a fresh directory", "[unix]") {
    temp_dir dir;
    const std::string path = dir.file("sock");
    round_trip_state s;
    {
        loop l;
        net::unix_listener listener = bind_at(unix_address(path));
        CHECK(kind_of(path) == file_kind::socket);
        auto local = listener.local_address();
        REQUIRE(local.has_value());
        CHECK(local->family() == net::address_family::unix_path);
        CHECK(local->unix_path() == path);
        CHECK(local->to_string() == "unix:" + path);
        run(l, round_trip_main(listener, unix_address(path), s));
    }
    CHECK(s.server_got == "ping");
    CHECK(s.client_got == "pong");
    CHECK(s.eof == 0u);
    // The listener is gone, and so is its socket file.
    CHECK(kind_of(path) == file_kind::missing);
    CHECK(dir.remove_if_empty());
}

TEST_CASE("unix: listener and stream round trip on an abstract name", "[unix]") {
    const std::string name = abstract_name();
    round_trip_state s;
    {
        loop l;
        net::unix_listener listener = bind_at(unix_address(name));
        auto local = listener.local_address();
        REQUIRE(local.has_value());
        CHECK(local->to_string() == "unix:" + name);
        CHECK(local->unix_path().front() == '\0');
        run(l, round_trip_main(listener, unix_address(name), s));
    }
    CHECK(s.server_got == "ping");
    CHECK(s.client_got == "pong");
    CHECK(s.eof == 0u);
    // The name went with the listener: it can be bound again.
    auto again = net::unix_listener::bind(unix_address(name));
    CHECK(again.has_value());
}

TEST_CASE("unix: pair() gives two connected streams", "[unix]") {
    pair_state s;
    loop l;
    auto pair = net::unix_stream::pair();
    REQUIRE(pair.has_value());
    run(l, pair_main(pair->first, pair->second, s));
    CHECK(s.b_got == "to b");
    CHECK(s.a_got == "to a");
    CHECK(s.eof == 0u);
    CHECK(s.after_half_close == "still here");
    CHECK(s.cancelled == std::errc::operation_canceled);
    CHECK_FALSE(pair->first.is_open());
}

TEST_CASE("unix: the socket file is removed when the listener is destroyed, once, by its last owner", "[unix]") {
    temp_dir dir;
    const std::string path = dir.file("sock");
    const std::string other = dir.file("moved");
    {
        net::unix_listener outer;
        {
            net::unix_listener first = bind_at(unix_address(path));
            REQUIRE(kind_of(path) == file_kind::socket);
            net::unix_listener second(std::move(first));
            CHECK_FALSE(first.is_open());
            CHECK(second.is_open());
            // Move assignment over a listener with a file of its own removes that file.
            outer = bind_at(unix_address(other));
            REQUIRE(kind_of(other) == file_kind::socket);
            outer = std::move(second);
            CHECK(kind_of(other) == file_kind::missing);
            CHECK(kind_of(path) == file_kind::socket);
        }
        // The moved-from listeners went without touching the file.
        CHECK(kind_of(path) == file_kind::socket);
        CHECK(outer.is_open());
    }
    CHECK(kind_of(path) == file_kind::missing);
    CHECK(dir.remove_if_empty());
}

TEST_CASE("unix: a listener closed before it is destroyed still removes its socket file", "[unix]") {
    temp_dir dir;
    const std::string path = dir.file("sock");
    {
        net::unix_listener listener = bind_at(unix_address(path));
        REQUIRE(kind_of(path) == file_kind::socket);
        listener.close();
    }
    CHECK(kind_of(path) == file_kind::missing);
    // So the path can be bound again.
    auto again = net::unix_listener::bind(unix_address(path));
    CHECK(again.has_value());
}

TEST_CASE("unix: binding a path that exists is address_in_use and leaves that file alone", "[unix]") {
    temp_dir dir;
    const std::string path = dir.file("sock");
    round_trip_state s;
    {
        loop l;
        net::unix_listener listener = bind_at(unix_address(path));
        auto taken = net::unix_listener::bind(unix_address(path));
        REQUIRE_FALSE(taken.has_value());
        CHECK(taken.error() == std::errc::address_in_use);
        // The failed bind did not remove the first listener's file.
        CHECK(kind_of(path) == file_kind::socket);
        run(l, round_trip_main(listener, unix_address(path), s));
        CHECK(s.client_got == "pong");
    }
    const std::string file = dir.file("file");
    int fd = ::open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    ::close(fd);
    auto over_file = net::unix_listener::bind(unix_address(file));
    REQUIRE_FALSE(over_file.has_value());
    CHECK(over_file.error() == std::errc::address_in_use);
    CHECK(kind_of(file) == file_kind::other);
}

TEST_CASE("unix: connect and bind errors", "[unix]") {
    temp_dir dir;
    std::error_code missing, not_unix, no_listener;
    loop l;
    run(l, connect_error(unix_address(dir.file("sock")), missing));
    CHECK(missing == std::errc::no_such_file_or_directory);
    run(l, connect_error(net::address::ipv4_loopback(1), not_unix));
    CHECK(not_unix == net::errc::invalid_address);
    run(l, connect_error(unix_address(abstract_name()), no_listener));
    CHECK(no_listener == std::errc::connection_refused);

    auto tcp = net::unix_listener::bind(net::address::ipv4_loopback(0));
    REQUIRE_FALSE(tcp.has_value());
    CHECK(tcp.error() == net::errc::invalid_address);
    auto empty = net::unix_listener::bind(net::address());
    REQUIRE_FALSE(empty.has_value());
    CHECK(empty.error() == net::errc::invalid_address);
}
