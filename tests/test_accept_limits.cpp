// Accepting with no descriptors left (EMFILE). The server runs in a child
// process whose RLIMIT_NOFILE leaves it room for only a few connections; the
// clients are plain sockets in this process. The child never runs a Catch2
// assertion: it answers commands over one pipe and reports over another, and
// its exit status says whether its own setup went well.
//
// What is checked: the server keeps serving the connections it holds while
// more clients wait in the backlog; it does not spin while starved (its CPU
// time over a second of it stays small, since accept backs off from 1 ms to
// 100 ms); once it closes some connections, the waiting ones are accepted in
// order, as many as there is room for.

#include "net_support.hpp"

#include <spindle/net/tcp.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using spindle::join_handle;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::test::raw_socket;
using steady = std::chrono::steady_clock;
namespace net = spindle::net;

namespace {

/// Descriptors the child has room for once its limit is lowered.
constexpr int slots = 4;
/// Clients: `slots` served at once, the rest wait in the backlog.
constexpr int clients = 8;
/// How many connections the child closes to make room.
constexpr int freed = 2;

// --- the child ---------------------------------------------------------------------

/// What the child sends back, as raw bytes over a pipe (same program, same layout).
struct child_report {
    std::uint16_t port = 0;
    int fd_limit = 0;
    int accepted = 0;
    long long starved_cpu_us = -1;
    long long starved_wall_ms = -1;
    int warnings = 0;        // starts of starvation logged
    int recoveries = 0;      // and ends
    bool emfile_named = false;  // the warning names the cause
    std::uint64_t backoffs = 0;  // loop_metrics::accept_backoffs
};

enum child_exit : int { child_ok = 0, child_setup_failed = 2, child_limit_failed = 3, child_threw = 4, child_bad_command = 5 };

long long cpu_us() {
    ::rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    auto us = [](const ::timeval& t) { return static_cast<long long>(t.tv_sec) * 1'000'000 + t.tv_usec; };
    return us(ru.ru_utime) + us(ru.ru_stime);
}

bool send_report(int fd, const child_report& r) {
    return ::write(fd, &r, sizeof r) == static_cast<ssize_t>(sizeof r);
}

/// Lowers RLIMIT_NOFILE so that exactly `room` descriptor numbers stay free.
bool leave_room_for(int room, int& limit) {
    int seen = 0;
    for (int fd = 0; fd < 1 << 16; ++fd) {
        if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF && ++seen == room) {
            limit = fd + 1;
            ::rlimit lim{};
            if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
            lim.rlim_cur = static_cast<rlim_t>(limit);
            return ::setrlimit(RLIMIT_NOFILE, &lim) == 0;
        }
    }
    return false;
}

struct server_state {
    net::tcp_listener listener;
    std::vector<std::unique_ptr<net::tcp_stream>> connections;
    std::vector<join_handle<void>> echoes;
    std::stop_source stop;
};

task<void> echo(net::tcp_stream& s) {
    std::array<std::byte, 256> buf{};
    for (int i = 0; i < 100'000; ++i) {
        result<std::size_t> n = co_await s.read_some(buf);
        if (!n || *n == 0) co_return;
        result<void> w = co_await s.write_all(std::span(buf).first(*n));
        if (!w) co_return;
    }
}

task<void> acceptor(server_state& st) {
    loop& l = loop::current();
    for (int i = 0; i < 1000; ++i) {
        result<net::tcp_stream> c = co_await st.listener.accept(st.stop.get_token());
        if (!c) co_return;
        st.connections.push_back(std::make_unique<net::tcp_stream>(std::move(*c)));
        st.echoes.push_back(l.spawn(echo(*st.connections.back())));
    }
}

/// Commands, one byte each: 'm' starts the starved window and reports the
/// connections accepted so far; 'f' ends the window, reports its CPU time and
/// closes the first `freed` connections; 'q' reports the log and quits.
task<int> commands(int in, int out, server_state& st, child_report& report, const spindle::test::log_capture& logs) {
    long long cpu_start = 0;
    auto wall_start = steady::now();
    for (int i = 0; i < 100; ++i) {
        char c = 0;
        result<std::size_t> n = co_await spindle::read(in, std::as_writable_bytes(std::span(&c, 1)));
        if (!n || *n == 0) break;  // the parent went away
        switch (c) {
            case 'm':
                cpu_start = cpu_us();
                wall_start = steady::now();
                report.accepted = static_cast<int>(st.connections.size());
                break;
            case 'f':
                report.starved_cpu_us = cpu_us() - cpu_start;
                report.starved_wall_ms =
                    std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - wall_start).count();
                for (int k = 0; k < freed && k < static_cast<int>(st.connections.size()); ++k) st.connections[k]->close();
                break;
            case 'q':
                report.accepted = static_cast<int>(st.connections.size());
                for (const std::string& line : logs.lines()) {
                    if (line.find("retrying with back-off") != std::string::npos) ++report.warnings;
                    if (line.find("recovered") != std::string::npos) ++report.recoveries;
                }
                report.emfile_named = logs.contains(std::error_code(EMFILE, std::system_category()).message());
                report.backoffs = spindle::loop::current().metrics().accept_backoffs;
                if (!send_report(out, report)) co_return child_setup_failed;
                co_return child_ok;
            default: co_return child_bad_command;
        }
        if (!send_report(out, report)) co_return child_setup_failed;
    }
    co_return child_ok;
}

task<int> server_main(int in, int out, server_state& st, child_report& report, const spindle::test::log_capture& logs) {
    loop& l = loop::current();
    auto accepting = l.spawn(acceptor(st));
    int rc = co_await commands(in, out, st, report, logs);
    st.stop.request_stop();
    for (auto& c : st.connections) c->close();
    co_await accepting;
    for (auto& e : st.echoes) co_await e;
    co_return rc;
}

/// Runs, while descriptors are still free, the paths the child takes once it
/// has none. UBSan checks a dynamic type it meets for the first time by probing
/// memory through a new pipe; with no descriptor left that probe fails and it
/// reports a false "invalid vptr".
task<bool> warm_up(const spindle::test::log_capture& logs) {
    auto l = net::tcp_listener::bind(net::address::ipv4_loopback(0));
    if (!l) co_return false;
    auto to = l->local_address();
    if (!to) co_return false;
    result<net::tcp_stream> c = co_await net::tcp_stream::connect(*to);
    result<net::tcp_stream> s = co_await l->accept();
    if (!c || !s) co_return false;
    result<void> w = co_await c->write_all(spindle::test::bytes_of("w"));
    std::array<std::byte, 1> b{};
    result<std::size_t> n = co_await s->read_some(b);
    result<std::size_t> timed = co_await spindle::with_timeout(1ms, s->read_some(b));
    // (Any error but EMFILE: the test looks for that one in the log.)
    spindle::logger()->warn("warm-up: {}", std::error_code(ECONNREFUSED, std::system_category()).message());
    spindle::logger()->info("warm-up done");
    co_return w && n && timed.error() == std::errc::timed_out && logs.contains("warm-up done");
}

/// The children's loops do not watch for stalls. The monitor's thread makes its
/// first virtual call (through std::thread) whenever it is first scheduled,
/// which may be after the descriptors ran out, and then UBSan reports a false
/// "invalid vptr" (see warm_up); no warm-up can order that.
spindle::loop_options child_loop_options() {
    spindle::loop_options options;
    options.stall_threshold = std::chrono::nanoseconds::zero();
    return options;
}

int child_main(int in, int out) {
    ::alarm(60);  // the child's own watchdog: SIGALRM ends it
    spindle::test::log_capture logs;
    loop l(child_loop_options());
    if (!l.block_on(warm_up(logs))) return child_setup_failed;
    server_state st;
    child_report report;
    net::listen_options options;
    options.backlog = 64;
    auto bound = net::tcp_listener::bind(net::address::ipv4_loopback(0), options);
    if (!bound) return child_setup_failed;
    st.listener = std::move(*bound);
    auto local = st.listener.local_address();
    if (!local) return child_setup_failed;
    report.port = local->port();
    if (::fcntl(in, F_SETFL, O_NONBLOCK) != 0) return child_setup_failed;
    if (!leave_room_for(slots, report.fd_limit)) return child_limit_failed;
    if (!send_report(out, report)) return child_setup_failed;
    return l.block_on(server_main(in, out, st, report, logs));
}

// --- closing a starved listener (child) ---------------------------------------------

struct close_report {
    bool first_parked = false;   // the accept was in its back-off when the listener closed
    bool first_has_value = true;
    int first_error = 0;
    bool second_parked = false;
    bool number_reused = false;  // the next listener got the closed one's descriptor number
    bool second_has_value = true;
    int second_error = 0;
    bool next_listener_got_client = false;
    bool third_caught_ready = false;  // closed between the back-off's end and the resumption
    bool third_has_value = true;
    int third_error = 0;
};

/// Whether `h`'s task is in the loop's ready queue: woken, not yet resumed.
bool is_scheduled(const join_handle<void>& h) {
    const spindle::detail::list_hook<spindle::detail::ready_tag>& hook = h.header();
    return hook.is_linked();
}

/// Lowers RLIMIT_NOFILE to the lowest free descriptor number: none left.
bool no_room_left(::rlimit& saved) {
    if (::getrlimit(RLIMIT_NOFILE, &saved) != 0) return false;
    for (int fd = 0; fd < 1 << 16; ++fd) {
        if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
            ::rlimit lim = saved;
            lim.rlim_cur = static_cast<rlim_t>(fd);
            return ::setrlimit(RLIMIT_NOFILE, &lim) == 0;
        }
    }
    return false;
}

task<void> accept_once(net::tcp_listener& l, bool& has_value, int& error) {
    result<net::tcp_stream> c = co_await l.accept();
    has_value = c.has_value();
    error = c.error().value();
}

task<int> close_starved_main(close_report& r) {
    loop& l = loop::current();
    net::listen_options options;
    options.backlog = 16;
    ::rlimit saved{};

    // 1. Closed during the back-off, nothing else opened.
    auto first = net::tcp_listener::bind(net::address::ipv4_loopback(0), options);
    if (!first) co_return child_setup_failed;
    if (!no_room_left(saved)) co_return child_limit_failed;
    auto a1 = l.spawn(accept_once(*first, r.first_has_value, r.first_error));
    (void)co_await spindle::sleep_for(20ms);  // accept hit EMFILE and backs off
    r.first_parked = !a1.done();
    first->close();
    co_await a1;

    // 2. Closed during the back-off, and its number taken at once by a new
    // listener with a client waiting.
    auto second = net::tcp_listener::bind(net::address::ipv4_loopback(0), options);
    if (!second) co_return child_setup_failed;
    const int number = second->native_handle();
    auto a2 = l.spawn(accept_once(*second, r.second_has_value, r.second_error));
    (void)co_await spindle::sleep_for(20ms);
    r.second_parked = !a2.done();
    if (::setrlimit(RLIMIT_NOFILE, &saved) != 0) co_return child_limit_failed;
    second->close();
    auto next = net::tcp_listener::bind(net::address::ipv4_loopback(0), options);
    if (!next) co_return child_setup_failed;
    r.number_reused = next->native_handle() == number;
    spindle::test::raw_socket client;
    if (spindle::test::raw_connect(*next->local_address(), 2000, client) != spindle::test::connect_outcome::connected)
        co_return child_setup_failed;
    co_await a2;
    result<net::tcp_stream> got = co_await spindle::with_timeout(500ms, next->accept());
    r.next_listener_got_client = got.has_value();

    // 3. Closed after a back-off ended but before the accepting task resumed:
    // there is nothing pending to cancel at that moment. This task yields in
    // a loop, so it runs ahead of a task that a timer wakes in the same tick.
    auto third = net::tcp_listener::bind(net::address::ipv4_loopback(0), options);
    if (!third) co_return child_setup_failed;
    if (!no_room_left(saved)) co_return child_limit_failed;
    auto a3 = l.spawn(accept_once(*third, r.third_has_value, r.third_error));
    const auto give_up = steady::now() + 5s;
    bool parked = false;
    for (long i = 0; i < 100'000'000 && steady::now() < give_up && !a3.done(); ++i) {
        co_await spindle::yield();
        if (!is_scheduled(a3)) {
            parked = true;
        } else if (parked) {
            r.third_caught_ready = true;
            third->close();
            break;
        }
    }
    if (!r.third_caught_ready) third->close();
    co_await a3;
    if (::setrlimit(RLIMIT_NOFILE, &saved) != 0) co_return child_limit_failed;
    co_return child_ok;
}

int close_child_main(int out) {
    ::alarm(60);
    spindle::test::log_capture quiet;  // the warnings stay in the child
    loop l(child_loop_options());
    if (!l.block_on(warm_up(quiet))) return child_setup_failed;
    close_report r;
    int rc = l.block_on(close_starved_main(r));
    if (rc == child_ok && ::write(out, &r, sizeof r) != static_cast<ssize_t>(sizeof r)) rc = child_setup_failed;
    return rc;
}

// --- the parent --------------------------------------------------------------------

/// Kills and reaps the child unless the test reaped it already.
struct child_process {
    pid_t pid = -1;
    ~child_process() {
        if (pid > 0) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
    }
    /// The child's exit status, or -1 if it did not exit within `limit`.
    int wait_exit(std::chrono::milliseconds limit) {
        const auto give_up = steady::now() + limit;
        while (steady::now() < give_up) {
            int status = 0;
            pid_t r = ::waitpid(pid, &status, WNOHANG);
            if (r == pid) {
                pid = -1;
                if (WIFEXITED(status)) return WEXITSTATUS(status);
                return 1000 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
            }
            std::this_thread::sleep_for(5ms);
        }
        return -1;
    }
};

/// Bytes from `fd` within `ms`: nullopt on timeout, empty at end of stream.
std::optional<std::string> read_within(int fd, std::size_t want, int ms) {
    std::string got;
    const auto give_up = steady::now() + std::chrono::milliseconds(ms);
    while (got.size() < want) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - steady::now()).count();
        if (left <= 0) return std::nullopt;
        ::pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(left)) != 1) return std::nullopt;
        char buf[256];
        ssize_t n = ::recv(fd, buf, std::min(sizeof buf, want - got.size()), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) return got;
        got.append(buf, static_cast<std::size_t>(n));
    }
    return got;
}

bool send_text(int fd, const std::string& text) {
    return ::send(fd, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size());
}

bool read_report(int fd, child_report& r, int ms) {
    ::pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) return false;
    return ::read(fd, &r, sizeof r) == static_cast<ssize_t>(sizeof r);
}

bool command(int fd, char c) { return ::write(fd, &c, 1) == 1; }

std::string message(int i) { return "client-" + std::to_string(i) + "\n"; }

}  // namespace

// =====================================================================================

TEST_CASE("accept under EMFILE: the server keeps serving, does not spin, and accepts the waiting clients once descriptors free up",
          "[accept][emfile]") {
    int to_child[2];
    int from_child[2];
    REQUIRE(::pipe2(to_child, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(from_child, O_CLOEXEC) == 0);
    child_process child;
    child.pid = ::fork();
    REQUIRE(child.pid >= 0);
    if (child.pid == 0) {
        ::close(to_child[1]);
        ::close(from_child[0]);
        int rc = child_threw;
        try {
            rc = child_main(to_child[0], from_child[1]);
        } catch (...) {
        }
        ::_exit(rc);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    raw_socket commands_out(to_child[1]);
    raw_socket reports_in(from_child[0]);

    child_report report;
    REQUIRE(read_report(reports_in.get(), report, 10'000));
    REQUIRE(report.port != 0);
    CAPTURE(report.fd_limit);
    const net::address server = net::address::ipv4_loopback(report.port);

    // The first `slots` clients are accepted and echoed.
    std::vector<raw_socket> c(clients);
    for (int i = 0; i < slots; ++i) {
        CAPTURE(i);
        REQUIRE(spindle::test::raw_connect(server, 5000, c[i]) == spindle::test::connect_outcome::connected);
        REQUIRE(send_text(c[i].get(), message(i)));
        CHECK(read_within(c[i].get(), message(i).size(), 5000) == message(i));
    }
    // The rest connect (the kernel completes the handshake from its backlog)
    // and send, but nobody reads them: the server has no descriptor left.
    for (int i = slots; i < clients; ++i) {
        CAPTURE(i);
        REQUIRE(spindle::test::raw_connect(server, 5000, c[i]) == spindle::test::connect_outcome::connected);
        REQUIRE(send_text(c[i].get(), message(i)));
    }
    for (int i = slots; i < clients; ++i) CHECK_FALSE(read_within(c[i].get(), 1, 100).has_value());

    // A second of starvation, during which the held connections still echo.
    REQUIRE(command(commands_out.get(), 'm'));
    REQUIRE(read_report(reports_in.get(), report, 10'000));
    CHECK(report.accepted == slots);
    for (int round = 0; round < 4; ++round) {
        std::this_thread::sleep_for(250ms);
        for (int i = 0; i < slots; ++i) {
            CAPTURE(round, i);
            const std::string again = "again-" + std::to_string(round) + "\n";
            REQUIRE(send_text(c[i].get(), again));
            CHECK(read_within(c[i].get(), again.size(), 5000) == again);
        }
    }
    REQUIRE(command(commands_out.get(), 'f'));
    REQUIRE(read_report(reports_in.get(), report, 10'000));
    CAPTURE(report.starved_cpu_us, report.starved_wall_ms);
    CHECK(report.starved_wall_ms >= 1000);
    // Generous (the back-off costs a few milliseconds a second), yet well
    // below what retrying without a delay costs: even a zero-length sleep
    // between attempts burns a large part of the second.
    CHECK(report.starved_cpu_us < 50'000);

    // The server closed the first `freed` connections...
    for (int i = 0; i < freed; ++i) {
        CAPTURE(i);
        CHECK(read_within(c[i].get(), 1, 5000) == std::string());
    }
    // ...and the clients that waited longest are accepted in their place and
    // get the echo of what they sent long ago.
    for (int i = slots; i < slots + freed; ++i) {
        CAPTURE(i);
        CHECK(read_within(c[i].get(), message(i).size(), 5000) == message(i));
    }
    // There is no room for the others yet.
    for (int i = slots + freed; i < clients; ++i) CHECK_FALSE(read_within(c[i].get(), 1, 300).has_value());
    // The connections held all along still work.
    for (int i = freed; i < slots; ++i) {
        REQUIRE(send_text(c[i].get(), "still\n"));
        CHECK(read_within(c[i].get(), 6, 5000) == "still\n");
    }

    REQUIRE(command(commands_out.get(), 'q'));
    REQUIRE(read_report(reports_in.get(), report, 10'000));
    CHECK(report.accepted == slots + freed);
    // Logged once per episode, not once per attempt: the starvation, its end
    // when the first waiting client got in, and the new one after the second.
    CHECK(report.warnings == 2);
    CHECK(report.recoveries == 1);
    CHECK(report.emfile_named);
    // Each retry counted: several over the second of starvation, with the
    // back-off doubling up to 100 ms, and nowhere near a spin's count.
    CAPTURE(report.backoffs);
    CHECK(report.backoffs >= 4);
    CHECK(report.backoffs <= 1000);
    c.clear();
    commands_out.reset();
    CHECK(child.wait_exit(10s) == child_ok);
}

TEST_CASE("accept under EMFILE: closing the listener during the back-off ends the accept with operation_canceled, "
          "never on a reused descriptor number",
          "[accept][emfile][cancel]") {
    int from_child[2];
    REQUIRE(::pipe2(from_child, O_CLOEXEC) == 0);
    child_process child;
    child.pid = ::fork();
    REQUIRE(child.pid >= 0);
    if (child.pid == 0) {
        ::close(from_child[0]);
        int rc = child_threw;
        try {
            rc = close_child_main(from_child[1]);
        } catch (...) {
        }
        ::_exit(rc);
    }
    ::close(from_child[1]);
    raw_socket reports_in(from_child[0]);
    const int status = child.wait_exit(30s);
    REQUIRE(status == child_ok);
    close_report r;
    REQUIRE(::read(reports_in.get(), &r, sizeof r) == static_cast<ssize_t>(sizeof r));

    CHECK(r.first_parked);
    CHECK_FALSE(r.first_has_value);
    CHECK(std::error_code(r.first_error, std::system_category()) == std::errc::operation_canceled);

    CHECK(r.second_parked);
    CHECK(r.number_reused);  // (else the case below proves less)
    CHECK_FALSE(r.second_has_value);
    CHECK(std::error_code(r.second_error, std::system_category()) == std::errc::operation_canceled);
    // The client of the new listener was not taken by the old accept.
    CHECK(r.next_listener_got_client);

    REQUIRE(r.third_caught_ready);
    CHECK_FALSE(r.third_has_value);
    CHECK(std::error_code(r.third_error, std::system_category()) == std::errc::operation_canceled);
}
