// One error channel: an operation that cannot start completes with the error
// as its result, never as an exception out of co_await. And what a completed
// operation handed over is released when its task will never see it.

#include "net_support.hpp"
#include "support.hpp"

#include <spindle/spindle.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>

using namespace std::chrono_literals;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::test::error_of;
using spindle::test::pipe_pair;
using spindle::test::regular_file;
using spindle::test::run;
using spindle::test::socket_pair;
using spindle::test::tcp_listener;

namespace {


/// A blocking client connected to `addr` (the listener's backlog completes it).
int connect_client(const ::sockaddr_in& addr) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    REQUIRE(::connect(fd, reinterpret_cast<const ::sockaddr*>(&addr), sizeof addr) == 0);
    return fd;
}

/// 0 when the peer of `fd` closed (end of stream) within `limit`, -1 on timeout,
/// otherwise what recv returned.
long wait_for_end_of_stream(int fd, std::chrono::milliseconds limit) {
    ::pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) != 1) return -1;
    char c;
    return ::recv(fd, &c, 1, MSG_DONTWAIT);
}

/// Runs `l` until the task `id` is ready (its wait completed) but not resumed.
bool run_until_ready_not_resumed(loop& l, std::uint64_t id) {
    const auto give_up = spindle::clock::now() + 5s;
    while (spindle::clock::now() < give_up) {
        l.run_once(10ms);
        for (const spindle::task_info& t : l.tasks())
            if (t.id == id && t.state == spindle::task_info::state_kind::ready) return true;
    }
    return false;
}

/// While set, every io_uring loop made has a ring whose requests cannot be queued.
class io_uring_submit_fault {
public:
    io_uring_submit_fault() { ::setenv("SPINDLE_IO_URING_FAIL", "submit", 1); }
    ~io_uring_submit_fault() { ::unsetenv("SPINDLE_IO_URING_FAIL"); }
    io_uring_submit_fault(const io_uring_submit_fault&) = delete;
    io_uring_submit_fault& operator=(const io_uring_submit_fault&) = delete;
};

struct outcome {
    bool threw = false;
    std::string what;
    std::error_code error;
    bool has_value = false;
};

/// Awaits what `make()` returns (an awaiter is built in place: it cannot move).
template <class Make>
task<outcome> outcome_of(Make make) {
    outcome o;
    try {
        auto r = co_await make();
        o.has_value = r.has_value();
        o.error = r.error();
    } catch (const std::exception& e) {
        o.threw = true;
        o.what = e.what();
    }
    co_return o;
}

task<outcome> read_from(int fd) {
    // The buffer lives in the lambda, kept in outcome_of's frame while it runs.
    return outcome_of([fd, buf = std::array<std::byte, 16>{}]() mutable { return spindle::read(fd, buf); });
}

task<outcome> wait_readable_on(int fd) {
    return outcome_of([fd] { return spindle::wait_readable(fd); });
}

task<void> accept_once(int lfd, bool& resumed) {
    result<int> fd = co_await spindle::accept(lfd);
    resumed = true;
    if (fd) ::close(*fd);
}

/// One byte and room for one descriptor passed with SCM_RIGHTS.
struct fd_message {
    std::array<std::byte, 8> data{};
    ::iovec iov{};
    alignas(::cmsghdr) std::array<unsigned char, CMSG_SPACE(sizeof(int))> control{};
    ::msghdr msg{};
    explicit fd_message(std::size_t data_size) {
        iov = {data.data(), data_size};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.data();
        msg.msg_controllen = control.size();
    }
    fd_message(const fd_message&) = delete;
    fd_message& operator=(const fd_message&) = delete;
};

task<void> receive_fds(int fd, bool& resumed) {
    fd_message m(8);
    result<std::size_t> n = co_await spindle::recvmsg(fd, m.msg, MSG_CMSG_CLOEXEC);
    resumed = true;
    (void)n;
}

void send_fd(int sock, int fd_to_pass) {
    fd_message m(1);
    ::cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd_to_pass, sizeof(int));
    REQUIRE(::sendmsg(sock, &m.msg, MSG_NOSIGNAL) == 1);
}

struct no_default {
    explicit no_default(int v) : value(v) {}
    no_default(no_default&&) = default;
    no_default& operator=(no_default&&) = default;
    int value;
};

task<int> pass_no_default() {
    spindle::channel<no_default> ch(2);
    std::error_code sent = error_of(co_await ch.send(no_default(41)));
    if (sent) co_return -1;
    result<no_default> got = co_await ch.receive();
    if (!got) co_return -2;
    ch.close();
    result<no_default> after = co_await ch.receive();
    if (after || after.error() != spindle::errc::channel_closed) co_return -3;
    co_return got->value + 1;
}

}  // namespace

TEST_CASE("error channel: an operation on a closed descriptor completes with EBADF", "[io][errors]") {
    loop l;
    pipe_pair p;
    const int closed = p.give_r();
    ::close(closed);
    ::close(p.give_w());
    outcome o = run(l, read_from(closed));
    CHECK_FALSE(o.threw);
    CHECK_FALSE(o.has_value);
    CHECK(o.error == std::errc::bad_file_descriptor);
    outcome n = run(l, read_from(-1));
    CHECK_FALSE(n.threw);
    CHECK(n.error == std::errc::bad_file_descriptor);
}

TEST_CASE("error channel: a descriptor the backend refuses is an error result, not an exception", "[io][errors]") {
    loop l;
    const int file = regular_file();
    // epoll refuses a regular file (EPERM) when the wait registers it; io_uring
    // and kqueue report such a file as always readable.
    outcome o = run(l, wait_readable_on(file));
    CHECK_FALSE(o.threw);
    CAPTURE(o.what);
    if (l.backend() == spindle::backend_kind::epoll) {
        CHECK_FALSE(o.has_value);
        CHECK(o.error == std::errc::operation_not_permitted);
    } else {
        CHECK(o.has_value);
    }
    ::close(file);
    // The loop is intact: a real wait still works.
    socket_pair p;
    REQUIRE(::write(p.b, "x", 1) == 1);
    outcome ok = run(l, read_from(p.a));
    CHECK(ok.has_value);
}

TEST_CASE("error channel: a request the ring cannot queue completes with its error", "[io][errors]") {
    std::optional<io_uring_submit_fault> fault(std::in_place);
    loop l;
    fault.reset();
    if (l.backend() != spindle::backend_kind::io_uring) {
        SUCCEED("only io_uring queues requests; epoll and kqueue try the syscall first");
        return;
    }
    socket_pair p;
    // Nothing to read: the read must be queued, and queueing fails.
    outcome r = run(l, read_from(p.a));
    CHECK_FALSE(r.threw);
    CAPTURE(r.what);
    CHECK_FALSE(r.has_value);
    CHECK(r.error == std::errc::device_or_resource_busy);
    ::sockaddr_in addr{};
    const int lfd = tcp_listener(addr);
    outcome a = run(l, outcome_of([lfd] { return spindle::accept(lfd); }));
    CHECK_FALSE(a.threw);
    CHECK(a.error == std::errc::device_or_resource_busy);
    outcome w = run(l, outcome_of([fd = p.a] { return spindle::wait_writable(fd); }));
    CHECK_FALSE(w.threw);
    CHECK(w.error == std::errc::device_or_resource_busy);
    // Time does not need the ring: a sleep still completes.
    std::error_code slept =
        run(l, []() -> task<std::error_code> { co_return error_of(co_await spindle::sleep_for(1ms)); }());
    CHECK_FALSE(slept);
    // A signal wait whose source cannot be watched reports that as its error too.
    outcome sig = run(l, outcome_of([] { return spindle::wait_signal(SIGUSR2); }));
    CHECK_FALSE(sig.threw);
    CAPTURE(sig.what);
    CHECK(sig.error == std::errc::device_or_resource_busy);
    ::close(lfd);
}

TEST_CASE("error channel: a completed accept whose task is aborted before it resumes closes the descriptor",
          "[io][errors][lifetime]") {
    ::sockaddr_in addr{};
    loop l;
    spindle::unique_fd lfd(tcp_listener(addr), &l);
    bool resumed = false;
    auto h = l.spawn(accept_once(lfd.get(), resumed));
    for (int i = 0; i < 3; ++i) l.run_once(0ns);  // parked in accept
    REQUIRE_FALSE(h.done());
    const int client = connect_client(addr);
    REQUIRE(run_until_ready_not_resumed(l, h.id()));
    h.abort();
    CHECK_FALSE(resumed);
    // The accepted descriptor was closed: the client reads end of stream.
    CHECK(wait_for_end_of_stream(client, 2s) == 0);
    ::close(client);
}

TEST_CASE("error channel: a completed accept whose loop is destroyed before it resumes closes the descriptor",
          "[io][errors][lifetime]") {
    ::sockaddr_in addr{};
    int client = -1;
    bool resumed = false;
    const int lfd = tcp_listener(addr);
    {
        loop l;
        auto h = l.spawn(accept_once(lfd, resumed));
        for (int i = 0; i < 3; ++i) l.run_once(0ns);
        client = connect_client(addr);
        REQUIRE(run_until_ready_not_resumed(l, h.id()));
    }
    CHECK_FALSE(resumed);
    CHECK(wait_for_end_of_stream(client, 2s) == 0);
    ::close(client);
    ::close(lfd);
}

TEST_CASE("error channel: descriptors received with SCM_RIGHTS by a task aborted before it resumes are closed",
          "[io][errors][lifetime]") {
    loop l;
    socket_pair sp;
    spindle::unique_fd receiver(sp.give_a(), &l);
    bool resumed = false;
    auto h = l.spawn(receive_fds(receiver.get(), resumed));
    for (int i = 0; i < 3; ++i) l.run_once(0ns);  // parked in recvmsg
    pipe_pair passed;
    send_fd(sp.b, passed.w);
    ::close(passed.give_w());  // the only write end left is the one in flight
    REQUIRE(run_until_ready_not_resumed(l, h.id()));
    h.abort();
    CHECK_FALSE(resumed);
    // The received copy was closed too: the pipe's reader sees end of file.
    ::pollfd p{passed.r, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 2000) == 1);
    char c;
    CHECK(::read(passed.r, &c, 1) == 0);
}

TEST_CASE("result<T> and channel<T> work for a T without a default constructor", "[errors][channel]") {
    result<no_default> ok(no_default(3));
    REQUIRE(ok.has_value());
    CHECK(ok->value == 3);
    result<no_default> err(std::make_error_code(std::errc::timed_out));
    CHECK_FALSE(err.has_value());
    CHECK_THROWS_AS(err.value(), std::system_error);
    result<no_default> moved(std::move(ok));
    CHECK(moved->value == 3);
    moved = std::move(err);
    CHECK_FALSE(moved.has_value());
    CHECK(moved.error() == std::errc::timed_out);
    CHECK_THROWS_AS(result<int>(std::error_code{}), std::logic_error);
    loop l;
    CHECK(run(l, pass_no_default()) == 42);
}

namespace {

task<void> read_into_error(int fd, std::error_code& error, bool& done) {
    std::array<std::byte, 8> buf{};
    result<std::size_t> r = co_await spindle::read(fd, buf);
    error = r ? std::error_code{} : r.error();
    done = true;
}

task<void> accept_into_error(int lfd, std::error_code& error, bool& done) {
    result<int> r = co_await spindle::accept(lfd);
    if (r) ::close(*r);
    error = r ? std::error_code{} : r.error();
    done = true;
}

void run_until_flag(loop& l, const bool& flag) {
    const auto give_up = spindle::clock::now() + 5s;
    while (!flag && spindle::clock::now() < give_up) l.run_once(10ms);
}

}  // namespace

TEST_CASE("close_fd: a pending read completes with operation_canceled even if its data arrived first",
          "[io][errors][close]") {
    loop l;
    socket_pair sp;
    std::error_code error;
    bool done = false;
    auto h = l.spawn(read_into_error(sp.a, error, done));
    for (int i = 0; i < 3; ++i) l.run_once(0ns);  // parked in the read
    REQUIRE_FALSE(done);
    REQUIRE(::write(sp.b, "x", 1) == 1);
    // Time for a completion-based backend to finish the read in the kernel.
    std::this_thread::sleep_for(10ms);
    l.close_fd(sp.give_a());
    run_until_flag(l, done);
    REQUIRE(done);
    CHECK(error == std::errc::operation_canceled);
}

TEST_CASE("close_fd: a pending accept completes with operation_canceled and its connection is closed",
          "[io][errors][close]") {
    ::sockaddr_in addr{};
    loop l;
    const int lfd = tcp_listener(addr);
    std::error_code error;
    bool done = false;
    auto h = l.spawn(accept_into_error(lfd, error, done));
    for (int i = 0; i < 3; ++i) l.run_once(0ns);  // parked in the accept
    REQUIRE_FALSE(done);
    const int client = connect_client(addr);
    std::this_thread::sleep_for(10ms);
    l.close_fd(lfd);
    run_until_flag(l, done);
    REQUIRE(done);
    CHECK(error == std::errc::operation_canceled);
    // Accepted in the kernel or not, nobody holds the connection: end of stream
    // (or a reset, if the listener's close dropped it from the backlog).
    ::pollfd p{client, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 2000) == 1);  // not a timeout: the client saw the close
    char c;
    const ssize_t n = ::recv(client, &c, 1, MSG_DONTWAIT);
    const int err = errno;
    CHECK((n == 0 || (n < 0 && err == ECONNRESET)));
    ::close(client);
}
