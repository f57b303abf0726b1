// The reactor's contract (reactor/include/spindle/reactor/backend.hpp),
// checked on the backend itself, without the loop: every operation code,
// cancellation, forget, close_fd and the rules on when complete() is called.
// The program runs once per backend built, SPINDLE_BACKEND naming it. Only
// loopback, socket pairs and pipes; every wait is bounded by a count of polls
// and a deadline, so a backend that loses a completion fails, never hangs.

#include "catch.hpp"

#include <spindle/reactor/backend.hpp>
#include <spindle/reactor/buffer_pool.hpp>
#include <spindle/reactor/op_code.hpp>
#include <spindle/reactor/operation.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
namespace reactor = spindle::reactor;
using reactor::op_code;
using reactor::op_state;
using reactor::operation;

namespace {

using steady = std::chrono::steady_clock;

// How long a wait that must succeed may take, and how many polls it may make.
constexpr auto wait_limit = 5s;
constexpr int max_polls = 5000;
// How long a test watches an operation that must stay pending.
constexpr auto quiet_spell = 40ms;

// --- descriptors --------------------------------------------------------------

struct fd_pair {
    int a = -1;
    int b = -1;
};

fd_pair make_pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
    return {fds[0], fds[1]};
}

fd_pair make_socketpair(int type = SOCK_STREAM) {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0);
    return {fds[0], fds[1]};
}

// An address on loopback, IPv4 or IPv6.
struct address {
    ::sockaddr_storage storage{};
    ::socklen_t len = 0;
    const ::sockaddr* get() const { return reinterpret_cast<const ::sockaddr*>(&storage); }
    ::sockaddr* get() { return reinterpret_cast<::sockaddr*>(&storage); }
    int family() const { return storage.ss_family; }
};

address loopback(int family) {
    address a;
    if (family == AF_INET) {
        auto* in = reinterpret_cast<::sockaddr_in*>(&a.storage);
        in->sin_family = AF_INET;
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.len = sizeof(::sockaddr_in);
    } else {
        auto* in6 = reinterpret_cast<::sockaddr_in6*>(&a.storage);
        in6->sin6_family = AF_INET6;
        in6->sin6_addr = in6addr_loopback;
        a.len = sizeof(::sockaddr_in6);
    }
    return a;
}

std::uint16_t port_of(const address& a) {
    if (a.family() == AF_INET) return ntohs(reinterpret_cast<const ::sockaddr_in*>(&a.storage)->sin_port);
    return ntohs(reinterpret_cast<const ::sockaddr_in6*>(&a.storage)->sin6_port);
}

// A non-blocking socket bound to an ephemeral port of loopback, listening or
// not; -1 when the family is not available here (no IPv6).
int bound_socket(int family, int type, address& where, bool listening) {
    const int fd = ::socket(family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    where = loopback(family);
    if (::bind(fd, where.get(), where.len) != 0 || (listening && ::listen(fd, 16) != 0)) {
        ::close(fd);
        return -1;
    }
    where.len = sizeof where.storage;
    REQUIRE(::getsockname(fd, where.get(), &where.len) == 0);
    REQUIRE(port_of(where) != 0);
    return fd;
}

// A blocking connect of a new socket to `to`: the peer of an accept.
int connect_blocking(const address& to) {
    const int fd = ::socket(to.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    REQUIRE(::connect(fd, to.get(), to.len) == 0);
    return fd;
}

// Writes until the descriptor is full; returns how much went in.
std::size_t fill(int fd) {
    static char junk[65536];
    std::size_t total = 0;
    for (;;) {
        const auto n = ::write(fd, junk, sizeof junk);
        if (n < 0) {
            REQUIRE((errno == EAGAIN || errno == EWOULDBLOCK));
            return total;
        }
        total += static_cast<std::size_t>(n);
    }
}

// Reads what is there without waiting.
std::string drain(int fd) {
    std::string out;
    char buf[65536];
    for (;;) {
        const auto n = ::read(fd, buf, sizeof buf);
        if (n <= 0) return out;
        out.append(buf, static_cast<std::size_t>(n));
    }
}

void put(int fd, std::string_view bytes) {
    REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
}

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) >= 0; }

// The process's open descriptors, to see that nothing handed over leaked.
int open_descriptors() {
    int count = 0;
    DIR* dir = ::opendir("/proc/self/fd");
    REQUIRE(dir != nullptr);
    while (const ::dirent* e = ::readdir(dir))
        if (e->d_name[0] != '.') ++count;
    ::closedir(dir);
    return count - 1;  // the directory's own descriptor
}

// --- the harness ----------------------------------------------------------------

// One backend, the operations of one test and every completion they had, in
// order. Each completion is checked against the interface's rules when the
// harness goes: never from inside submit(), the result set before complete(),
// a one-shot operation no longer pending and a persistent poll still pending
// unless it ended, and poll() counting exactly the completions it made.
class harness {
public:
    struct record {
        const operation* op;
        std::int64_t result;
        bool pending;
        bool persistent;
        op_code code;
        std::uint32_t events;
        bool in_submit;
        bool in_poll;
    };

    harness() : m_backend(reactor::make_backend(reactor::backend_kind::automatic)) {}
    explicit harness(const reactor::backend_options& options) {
        std::string fallback, notes;
        m_backend = reactor::make_backend(reactor::backend_kind::automatic, options, fallback, notes);
    }
    harness(const harness&) = delete;
    harness& operator=(const harness&) = delete;

    ~harness() {
        // What a test left pending goes before its descriptors and buffers do.
        for (operation& op : m_ops) m_backend->forget(op);
        for (int fd : m_fds) ::close(fd);
        if (std::uncaught_exceptions() == 0) check_rules();
    }

    reactor::backend& backend() { return *m_backend; }
    bool completes_in_kernel() const { return m_backend->kind() == reactor::backend_kind::io_uring; }

    // A new operation whose completions this harness records.
    operation& op(op_code code, int fd) { return prepare(m_ops.emplace_back(), code, fd); }
    operation& prepare(operation& o, op_code code, int fd) {
        o.code = code;
        o.fd = fd;
        o.complete = &harness::on_complete;
        o.owner = this;
        return o;
    }
    // The same operation, done with, made ready for another use: its earlier
    // completions stay in the log (for the rules) but no longer count as its.
    operation& reuse(operation& o, op_code code, int fd) {
        REQUIRE_FALSE(o.pending());
        for (record& r : m_log)
            if (r.op == &o) r.op = nullptr;
        o.state = op_state::idle;
        return prepare(o, code, fd);
    }
    operation& read(op_code code, int fd, void* data, std::size_t size) {
        operation& o = op(code, fd);
        o.args.buf = {data, size};
        return o;
    }
    operation& write(op_code code, int fd, const void* data, std::size_t size) {
        return read(code, fd, const_cast<void*>(data), size);
    }
    operation& poll_op(int fd, std::uint32_t events, bool persistent = false) {
        operation& o = op(op_code::poll, fd);
        o.events = events;
        o.persistent = persistent;
        return o;
    }

    // Descriptors closed when the harness goes (after its operations).
    int own(int fd) {
        m_fds.push_back(fd);
        return fd;
    }
    fd_pair own(fd_pair p) {
        own(p.a);
        own(p.b);
        return p;
    }
    // The descriptor goes now, told to the backend first as the interface asks.
    void close_now(int fd) {
        m_backend->close_fd(fd);
        ::close(fd);
        m_fds.erase(std::remove(m_fds.begin(), m_fds.end(), fd), m_fds.end());
    }

    // True when it completed at once; then complete() must not have been called.
    bool submit(operation& o) {
        m_in_submit = true;
        bool now;
        try {
            now = m_backend->submit(o);
        } catch (...) {
            m_in_submit = false;
            throw;
        }
        m_in_submit = false;
        if (now) {
            CHECK(o.state == op_state::done);
            CHECK(completions(o) == 0);
        } else {
            CHECK(o.pending());
        }
        return now;
    }

    int poll(std::chrono::nanoseconds timeout) {
        m_in_poll = true;
        int n;
        try {
            n = m_backend->poll(timeout);
        } catch (...) {
            m_in_poll = false;
            throw;
        }
        m_in_poll = false;
        CHECK(n >= 0);
        m_poll_counted += n;
        return n;
    }

    // Polls until `done()` holds, at most wait_limit and max_polls polls.
    template <class Pred>
    bool poll_until(Pred done, std::chrono::nanoseconds limit = wait_limit) {
        const auto deadline = steady::now() + limit;
        for (int i = 0; i < max_polls; ++i) {
            if (done()) return true;
            if (steady::now() >= deadline) break;
            poll(5ms);
        }
        return done();
    }
    // Until the operation has completed `times` times in all.
    bool wait_for(const operation& o, int times = 1) {
        return poll_until([&] { return completions(o) >= times; });
    }
    // Polls for a while, for operations that must stay as they are.
    void idle(std::chrono::nanoseconds spell = quiet_spell) {
        const auto until = steady::now() + spell;
        for (int i = 0; i < 100 && steady::now() < until; ++i) poll(5ms);
    }

    // Submits and waits for the result, whichever way it comes.
    std::int64_t run(operation& o) {
        if (submit(o)) return o.result;
        REQUIRE(wait_for(o));
        REQUIRE(completions(o) == 1);
        REQUIRE(!o.pending());
        return o.result;
    }

    int completions(const operation& o) const {
        return static_cast<int>(std::count_if(m_log.begin(), m_log.end(), [&](const record& r) { return r.op == &o; }));
    }
    const std::vector<record>& log() const { return m_log; }
    std::vector<const operation*> order() const {
        std::vector<const operation*> out;
        for (const record& r : m_log) out.push_back(r.op);
        return out;
    }

private:
    static void on_complete(operation& o) noexcept {
        auto* self = static_cast<harness*>(o.owner);
        self->m_log.push_back(
            {&o, o.result, o.pending(), o.persistent, o.code, o.events, self->m_in_submit, self->m_in_poll});
    }

    void check_rules() const {
        int in_poll = 0;
        for (const record& r : m_log) {
            CHECK_FALSE(r.in_submit);
            if (r.in_poll) ++in_poll;
            if (r.persistent && r.result >= 0)
                CHECK(r.pending);  // stays armed
            else
                CHECK_FALSE(r.pending);
            // A readiness wait answers some of what it asked for, never nothing.
            if (r.code == op_code::poll && r.result >= 0) {
                CHECK(r.result != 0);
                CHECK((static_cast<std::uint32_t>(r.result) & ~r.events) == 0);
            }
        }
        CHECK(in_poll == m_poll_counted);
    }

    std::unique_ptr<reactor::backend> m_backend;
    std::deque<operation> m_ops;  // stable addresses
    std::vector<int> m_fds;
    std::vector<record> m_log;
    bool m_in_submit = false;
    bool m_in_poll = false;
    int m_poll_counted = 0;
};

}  // namespace

// --- the backend itself -------------------------------------------------------------

TEST_CASE("reactor contract: the backend is the one SPINDLE_BACKEND names", "[reactor]") {
    harness h;
    if (const char* name = std::getenv("SPINDLE_BACKEND"); name && *name && std::string_view(name) != "automatic") {
        const auto kind = reactor::backend_from_string(name);
        REQUIRE(kind);
        CHECK(h.backend().kind() == *kind);
    }
    INFO("backend: " << reactor::to_string(h.backend().kind()));
    CHECK(reactor::to_string(h.backend().kind()) != "automatic");
    // Only kqueue emulated by libkqueue has none.
    if (h.backend().kind() != reactor::backend_kind::kqueue) CHECK(h.backend().native_handle() >= 0);
    CHECK(h.backend().read_buffers().mapped == 0);
    CHECK(h.poll(0ns) == 0);
}

TEST_CASE("reactor contract: every operation code has a name and a direction", "[reactor]") {
    for (op_code code : reactor::all_op_codes) {
        CHECK(reactor::to_string(code) != "I/O");
        CHECK(reactor::to_string(code) != "");
    }
    CHECK(reactor::direction_of(op_code::read) == reactor::op_direction::reader);
    CHECK(reactor::direction_of(op_code::connect) == reactor::op_direction::writer);
    CHECK(reactor::direction_of(op_code::poll) == reactor::op_direction::by_events);
}

// --- each operation code -----------------------------------------------------------

TEST_CASE("reactor contract: read and write on a pipe", "[reactor]") {
    harness h;
    const fd_pair p = h.own(make_pipe());

    const char out[] = "hello";
    CHECK(h.run(h.write(op_code::write, p.b, out, 5)) == 5);
    char in[16] = {};
    CHECK(h.run(h.read(op_code::read, p.a, in, sizeof in)) == 5);
    CHECK(std::string_view(in, 5) == "hello");

    SECTION("a read waits for data, then completes once") {
        operation& r = h.read(op_code::read, p.a, in, sizeof in);
        REQUIRE_FALSE(h.submit(r));
        h.idle();
        CHECK(h.completions(r) == 0);
        CHECK(r.pending());
        put(p.b, "again");
        REQUIRE(h.wait_for(r));
        CHECK(r.result == 5);
        CHECK(std::string_view(in, 5) == "again");
        h.idle();
        CHECK(h.completions(r) == 1);
    }
    SECTION("a read at end of file answers 0, at once or later") {
        operation& r = h.read(op_code::read, p.a, in, sizeof in);
        const bool now = h.submit(r);
        h.close_now(p.b);
        if (!now) REQUIRE(h.wait_for(r));
        CHECK(r.result == 0);
        CHECK(h.run(h.read(op_code::read, p.a, in, sizeof in)) == 0);
    }
}

TEST_CASE("reactor contract: a write waits for room", "[reactor]") {
    harness h;
    const fd_pair s = h.own(make_socketpair());
    const std::size_t queued = fill(s.a);
    REQUIRE(queued > 0);
    const char out[] = "more";
    operation& w = h.write(op_code::write, s.a, out, 4);
    REQUIRE_FALSE(h.submit(w));
    h.idle();
    CHECK(h.completions(w) == 0);
    // Room again: the write goes, and its bytes come after everything before it.
    std::string got;
    REQUIRE(h.poll_until([&] {
        got += drain(s.b);
        return h.completions(w) == 1;
    }));
    CHECK(w.result == 4);
    got += drain(s.b);
    REQUIRE(got.size() == queued + 4);
    CHECK(got.substr(queued) == "more");
}

TEST_CASE("reactor contract: readv and writev", "[reactor]") {
    harness h;
    const fd_pair s = h.own(make_socketpair());

    char a[2] = {}, b[8] = {};
    ::iovec in[2] = {{a, sizeof a}, {b, sizeof b}};
    operation& r = h.op(op_code::readv, s.b);
    r.args.vec = {in, 2};
    const bool now = h.submit(r);
    CHECK_FALSE(now);  // nothing to read yet

    const char first[] = "ab", second[] = "cde";
    const ::iovec out[2] = {{const_cast<char*>(first), 2}, {const_cast<char*>(second), 3}};
    operation& w = h.op(op_code::writev, s.a);
    w.args.vec = {out, 2};
    CHECK(h.run(w) == 5);

    REQUIRE(h.wait_for(r));
    CHECK(r.result == 5);
    CHECK(std::string_view(a, 2) == "ab");
    CHECK(std::string_view(b, 3) == "cde");
}

TEST_CASE("reactor contract: recv and send pass their flags", "[reactor]") {
    harness h;
    const fd_pair s = h.own(make_socketpair());
    const char out[] = "peek";
    CHECK(h.run(h.write(op_code::send, s.a, out, 4)) == 4);

    char in[8] = {};
    operation& peek = h.read(op_code::recv, s.b, in, sizeof in);
    peek.flags = MSG_PEEK;
    CHECK(h.run(peek) == 4);
    char again[8] = {};
    CHECK(h.run(h.read(op_code::recv, s.b, again, sizeof again)) == 4);  // the peek left them there
    CHECK(std::string_view(again, 4) == "peek");

    SECTION("a recv waits, then gets what a send sent") {
        operation& r = h.read(op_code::recv, s.b, in, sizeof in);
        REQUIRE_FALSE(h.submit(r));
        const char more[] = "later";
        CHECK(h.run(h.write(op_code::send, s.a, more, 5)) == 5);
        REQUIRE(h.wait_for(r));
        CHECK(r.result == 5);
        CHECK(std::string_view(in, 5) == "later");
    }
    SECTION("send and sendmsg to a closed peer answer -EPIPE, never SIGPIPE") {
        // SIGPIPE's default action ends the process: getting here proves
        // MSG_NOSIGNAL was added.
        h.close_now(s.b);
        CHECK(h.run(h.write(op_code::send, s.a, out, 4)) == -EPIPE);
        ::iovec iov{const_cast<char*>(out), 4};
        ::msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        operation& m = h.op(op_code::sendmsg, s.a);
        m.args.msg = &msg;
        CHECK(h.run(m) == -EPIPE);
    }
    SECTION("recv answers 0 once the peer is gone") {
        operation& r = h.read(op_code::recv, s.b, in, sizeof in);
        REQUIRE_FALSE(h.submit(r));
        h.close_now(s.a);
        REQUIRE(h.wait_for(r));
        CHECK(r.result == 0);
    }
}

TEST_CASE("reactor contract: recvmsg and sendmsg carry datagrams and their addresses", "[reactor]") {
    harness h;
    for (int family : {AF_INET, AF_INET6}) {
        address to, from;
        const int receiver = bound_socket(family, SOCK_DGRAM, to, false);
        if (receiver < 0) {
            REQUIRE(family == AF_INET6);  // IPv4 loopback must be there
            WARN("no IPv6 loopback here: ::1 not tested");
            continue;
        }
        h.own(receiver);
        const int sender = h.own(bound_socket(family, SOCK_DGRAM, from, false));
        REQUIRE(sender >= 0);
        INFO("family " << (family == AF_INET ? "IPv4" : "IPv6"));

        char in[16] = {};
        ::iovec in_iov{in, sizeof in};
        address source;
        ::msghdr in_msg{};
        in_msg.msg_name = &source.storage;
        in_msg.msg_namelen = sizeof source.storage;
        in_msg.msg_iov = &in_iov;
        in_msg.msg_iovlen = 1;
        operation& r = h.op(op_code::recvmsg, receiver);
        r.args.msg = &in_msg;
        REQUIRE_FALSE(h.submit(r));

        char out[] = "datagram";
        ::iovec out_iov{out, 8};
        ::msghdr out_msg{};
        out_msg.msg_name = &to.storage;
        out_msg.msg_namelen = to.len;
        out_msg.msg_iov = &out_iov;
        out_msg.msg_iovlen = 1;
        operation& s = h.op(op_code::sendmsg, sender);
        s.args.msg = &out_msg;
        CHECK(h.run(s) == 8);

        REQUIRE(h.wait_for(r));
        CHECK(r.result == 8);
        CHECK(std::string_view(in, 8) == "datagram");
        REQUIRE(in_msg.msg_namelen > 0);
        CHECK(source.storage.ss_family == family);
        source.len = in_msg.msg_namelen;
        CHECK(port_of(source) == port_of(from));
    }
}

TEST_CASE("reactor contract: recvmsg hands over descriptors; release_handed_over closes them", "[reactor]") {
    harness h;
    const fd_pair s = h.own(make_socketpair(SOCK_DGRAM));
    const fd_pair passed = h.own(make_pipe());

    char out[] = "fd";
    ::iovec out_iov{out, 2};
    alignas(::cmsghdr) char out_control[CMSG_SPACE(sizeof(int))] = {};
    ::msghdr out_msg{};
    out_msg.msg_iov = &out_iov;
    out_msg.msg_iovlen = 1;
    out_msg.msg_control = out_control;
    out_msg.msg_controllen = sizeof out_control;
    ::cmsghdr* c = CMSG_FIRSTHDR(&out_msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &passed.b, sizeof(int));

    for (int round = 0; round < 2; ++round) {
        operation& send = h.op(op_code::sendmsg, s.a);
        send.args.msg = &out_msg;
        CHECK(h.run(send) == 2);
    }

    char in[8];
    ::iovec iov{in, sizeof in};
    alignas(::cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    ::msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;

    // The first: the descriptor works.
    operation& r1 = h.op(op_code::recvmsg, s.b);
    r1.args.msg = &msg;
    REQUIRE(h.run(r1) == 2);
    const ::cmsghdr* got = CMSG_FIRSTHDR(&msg);
    REQUIRE(got != nullptr);
    REQUIRE(got->cmsg_type == SCM_RIGHTS);
    int fd1;
    std::memcpy(&fd1, CMSG_DATA(got), sizeof fd1);
    REQUIRE(is_open(fd1));
    put(fd1, "x");
    ::close(fd1);
    CHECK(drain(passed.a) == "x");

    // The second, as if nobody would see the completion: closed for us.
    msg.msg_controllen = sizeof control;
    operation& r2 = h.op(op_code::recvmsg, s.b);
    r2.args.msg = &msg;
    REQUIRE(h.run(r2) == 2);
    got = CMSG_FIRSTHDR(&msg);
    REQUIRE(got != nullptr);
    int fd2;
    std::memcpy(&fd2, CMSG_DATA(got), sizeof fd2);
    REQUIRE(is_open(fd2));
    reactor::release_handed_over(r2);
    CHECK_FALSE(is_open(fd2));
}

TEST_CASE("reactor contract: accept gives a non-blocking, close-on-exec descriptor and the peer's address",
          "[reactor]") {
    harness h;
    for (int family : {AF_INET, AF_INET6}) {
        address where;
        const int listener = bound_socket(family, SOCK_STREAM, where, true);
        if (listener < 0) {
            REQUIRE(family == AF_INET6);
            WARN("no IPv6 loopback here: ::1 not tested");
            continue;
        }
        h.own(listener);
        INFO("family " << (family == AF_INET ? "IPv4" : "IPv6"));

        address peer;
        peer.len = sizeof peer.storage;
        operation& a = h.op(op_code::accept, listener);
        a.args.accept = {peer.get(), &peer.len};
        REQUIRE_FALSE(h.submit(a));  // nobody connected yet
        h.idle();
        CHECK(h.completions(a) == 0);

        const int client = h.own(connect_blocking(where));
        REQUIRE(h.wait_for(a));
        REQUIRE(a.result >= 0);
        const int accepted = h.own(static_cast<int>(a.result));
        CHECK((::fcntl(accepted, F_GETFL) & O_NONBLOCK) != 0);
        CHECK((::fcntl(accepted, F_GETFD) & FD_CLOEXEC) != 0);
        CHECK(peer.storage.ss_family == family);
        address local;
        local.len = sizeof local.storage;
        REQUIRE(::getsockname(client, local.get(), &local.len) == 0);
        CHECK(port_of(peer) == port_of(local));

        // The accepted descriptor works with the backend like any other.
        put(client, "hi");
        char in[4] = {};
        CHECK(h.run(h.read(op_code::recv, accepted, in, sizeof in)) == 2);
    }
}

TEST_CASE("reactor contract: connect completes with 0, or with the refusal", "[reactor]") {
    harness h;
    for (int family : {AF_INET, AF_INET6}) {
        address listening, closed;
        const int listener = bound_socket(family, SOCK_STREAM, listening, true);
        if (listener < 0) {
            REQUIRE(family == AF_INET6);
            WARN("no IPv6 loopback here: ::1 not tested");
            continue;
        }
        h.own(listener);
        // Bound but not listening: the port is ours and refuses connections.
        h.own(bound_socket(family, SOCK_STREAM, closed, false));
        INFO("family " << (family == AF_INET ? "IPv4" : "IPv6"));

        const int good = h.own(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        operation& c = h.op(op_code::connect, good);
        c.args.connect = {listening.get(), listening.len};
        CHECK(h.run(c) == 0);
        const char out[] = "ok";
        CHECK(h.run(h.write(op_code::send, good, out, 2)) == 2);

        const int refused = h.own(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        operation& r = h.op(op_code::connect, refused);
        r.args.connect = {closed.get(), closed.len};
        CHECK(h.run(r) == -ECONNREFUSED);

        // One operation used again for a connect of another socket starts afresh.
        const int again = h.own(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        h.reuse(r, op_code::connect, again);
        r.args.connect = {listening.get(), listening.len};
        CHECK(h.run(r) == 0);
    }
}

TEST_CASE("reactor contract: poll answers readiness, only of what was asked", "[reactor]") {
    harness h;
    const fd_pair p = h.own(make_pipe());
    const fd_pair s = h.own(make_socketpair());
    using reactor::readable;
    using reactor::writable;

    SECTION("writable at once") { CHECK(h.run(h.poll_op(p.b, writable)) == writable); }
    SECTION("readable once data comes") {
        operation& r = h.poll_op(p.a, readable);
        REQUIRE_FALSE(h.submit(r));
        h.idle();
        CHECK(h.completions(r) == 0);
        put(p.b, "x");
        REQUIRE(h.wait_for(r));
        CHECK(r.result == readable);
        CHECK(drain(p.a) == "x");  // a poll reads nothing
    }
    SECTION("both asked, one there") { CHECK(h.run(h.poll_op(s.a, readable | writable)) == writable); }
    SECTION("both asked, both there") {
        put(s.b, "x");
        CHECK(h.run(h.poll_op(s.a, readable | writable)) == (readable | writable));
    }
    SECTION("a hang-up is readable") {
        operation& r = h.poll_op(s.a, readable);
        REQUIRE_FALSE(h.submit(r));
        h.close_now(s.b);
        REQUIRE(h.wait_for(r));
        CHECK((r.result & readable) != 0);
    }
    SECTION("a second poll of a descriptor already watched sees its readiness now") {
        // A readiness backend may watch a descriptor edge-triggered: the second
        // poll must not wait for an edge that already went by.
        put(p.b, "x");
        CHECK(h.run(h.poll_op(p.a, readable)) == readable);
        CHECK(h.run(h.poll_op(p.a, readable)) == readable);
        char in[1];
        operation& r = h.read(op_code::read, p.a, in, 1);
        CHECK(h.run(r) == 1);
        operation& w = h.poll_op(p.a, readable);
        REQUIRE_FALSE(h.submit(w));
        h.idle();
        CHECK(h.completions(w) == 0);
    }
}

TEST_CASE("reactor contract: a persistent poll completes on each readiness and stays armed", "[reactor]") {
    harness h;
    const fd_pair p = h.own(make_pipe());
    operation& w = h.poll_op(p.a, reactor::readable, true);
    REQUIRE_FALSE(h.submit(w));
    h.idle();
    CHECK(h.completions(w) == 0);

    for (int round = 1; round <= 3; ++round) {
        put(p.b, "x");
        REQUIRE(h.wait_for(w, round));
        CHECK(w.result == reactor::readable);
        CHECK(w.pending());
        CHECK(drain(p.a) == "x");
    }
    const int before = h.completions(w);

    h.backend().cancel(w);
    REQUIRE(h.poll_until([&] { return !w.pending(); }));
    CHECK(h.completions(w) == before + 1);
    CHECK(w.result == -ECANCELED);
    put(p.b, "x");
    h.idle();
    CHECK(h.completions(w) == before + 1);
}

TEST_CASE("reactor contract: a persistent poll ready at submit completes from the next poll", "[reactor]") {
    harness h;
    const fd_pair s = h.own(make_socketpair());
    operation& w = h.poll_op(s.a, reactor::writable, true);
    // Still armed after it completes: it cannot have completed at once.
    REQUIRE_FALSE(h.submit(w));
    CHECK(h.completions(w) == 0);
    REQUIRE(h.wait_for(w));
    CHECK(w.result == reactor::writable);
    CHECK(w.pending());
    h.backend().forget(w);
    CHECK_FALSE(w.pending());
}

TEST_CASE("reactor contract: a pooled receive is lent a buffer only for data", "[reactor]") {
    harness h;
    const fd_pair s = h.own(make_socketpair());
    operation& r = h.op(op_code::recv_pooled, s.b);
    r.stream = true;
    REQUIRE_FALSE(h.submit(r));
    h.idle();
    CHECK(h.completions(r) == 0);
    CHECK(h.backend().read_buffers().lent == 0);  // waiting holds none

    put(s.a, "pooled");
    REQUIRE(h.wait_for(r));
    REQUIRE(r.result == 6);
    reactor::buffer_pool* pool = r.args.pooled.pool;
    REQUIRE(pool != nullptr);
    CHECK(std::string_view(reinterpret_cast<const char*>(pool->address(r.args.pooled.id)), 6) == "pooled");
    CHECK(h.backend().read_buffers().lent == 1);
    CHECK(h.backend().read_buffers().mapped >= 1);
    reactor::release_handed_over(r);  // delivered and given back
    CHECK(h.backend().read_buffers().lent == 0);

    // End of stream: 0, and no buffer.
    operation& end = h.op(op_code::recv_pooled, s.b);
    end.stream = true;
    const bool now = h.submit(end);
    h.close_now(s.a);
    if (!now) REQUIRE(h.wait_for(end));
    CHECK(end.result == 0);
    CHECK(h.backend().read_buffers().lent == 0);
}

TEST_CASE("reactor contract: a short stream receive loses neither the next data nor the end", "[reactor]") {
    harness h;
    const fd_pair s = h.own(make_socketpair());
    char in[64];
    for (op_code code : {op_code::recv, op_code::read}) {
        INFO(reactor::to_string(code));
        operation& first = h.read(code, s.b, in, sizeof in);
        first.stream = true;
        REQUIRE_FALSE(h.submit(first));
        put(s.a, "short");
        REQUIRE(h.wait_for(first));
        CHECK(first.result == 5);
        // The socket is empty now; data that comes later must still be seen.
        operation& second = h.read(code, s.b, in, sizeof in);
        second.stream = true;
        const bool now = h.submit(second);
        CHECK_FALSE(now);
        put(s.a, "next");
        if (!now) REQUIRE(h.wait_for(second));
        CHECK(second.result == 4);
        // Data sent together with the end: a short receive, then 0 at once.
        put(s.a, "bye");
        operation& third = h.read(code, s.b, in, sizeof in);
        third.stream = true;
        if (code == op_code::read) {
            ::shutdown(s.a, SHUT_WR);
            if (!h.submit(third)) REQUIRE(h.wait_for(third));
            CHECK(third.result == 3);
            operation& last = h.read(code, s.b, in, sizeof in);
            last.stream = true;
            if (!h.submit(last)) REQUIRE(h.wait_for(last));
            CHECK(last.result == 0);
        } else {
            if (!h.submit(third)) REQUIRE(h.wait_for(third));
            CHECK(third.result == 3);
        }
    }
}

// --- poll(), wake(), native_handle() --------------------------------------------

TEST_CASE("reactor contract: process_exit on kqueue completes when the child ends; others refuse it", "[reactor]") {
    harness h;
    pid_t pid = -1;
    char sleep_name[] = "sleep";
    char thirty[] = "30";
    char* argv[] = {sleep_name, thirty, nullptr};
    char* envp[] = {nullptr};
    REQUIRE(::posix_spawnp(&pid, "sleep", nullptr, nullptr, argv, envp) == 0);
    const bool performs = h.backend().performs(op_code::process_exit);
    CHECK(performs == (h.backend().kind() == reactor::backend_kind::kqueue));
    if (!performs) {
        operation& refused = h.op(op_code::process_exit, pid);
        REQUIRE(h.submit(refused));
        CHECK(refused.result == -EOPNOTSUPP);
    } else {
        // Two waits for one pid: withdrawing one leaves the other armed.
        operation& first = h.op(op_code::process_exit, pid);
        operation& second = h.op(op_code::process_exit, pid);
        REQUIRE_FALSE(h.submit(first));
        REQUIRE_FALSE(h.submit(second));
        h.idle();
        CHECK(h.completions(first) == 0);
        h.backend().cancel(first);
        REQUIRE(h.wait_for(first));
        CHECK(first.result == -ECANCELED);
        h.idle();
        CHECK(h.completions(second) == 0);
        REQUIRE(::kill(pid, SIGTERM) == 0);
        REQUIRE(h.wait_for(second));
        CHECK(second.result == 0);
        CHECK(h.completions(second) == 1);
    }
    // Not reaped by the backend: the exit status is still there to take.
    if (!performs) REQUIRE(::kill(pid, SIGTERM) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGTERM);
}

TEST_CASE("reactor contract: poll's timeout bounds the wait", "[reactor]") {
    harness h;
    auto start = steady::now();
    CHECK(h.poll(0ns) == 0);
    CHECK(steady::now() - start < 1s);

    start = steady::now();
    CHECK(h.poll(50ms) == 0);
    const auto waited = steady::now() - start;
    CHECK(waited >= 40ms);  // at most a clock tick early
    CHECK(waited < 3s);

    // Pending operations that stay pending do not end the wait early.
    const fd_pair p = h.own(make_pipe());
    char in[4];
    operation& r = h.read(op_code::read, p.a, in, sizeof in);
    REQUIRE_FALSE(h.submit(r));
    start = steady::now();
    int seen = 0;
    while (steady::now() - start < 30ms) seen += h.poll(10ms);
    CHECK(seen == 0);
    CHECK(r.pending());
}

TEST_CASE("reactor contract: wake interrupts a poll in progress or the next one", "[reactor]") {
    harness h;
    for (int round = 0; round < 3; ++round) {
        h.backend().wake();
        const auto start = steady::now();
        CHECK(h.poll(5s) == 0);  // woken, nothing completed
        CHECK(steady::now() - start < 2s);
    }
    for (int round = 0; round < 3; ++round) {
        std::thread waker([&] {
            std::this_thread::sleep_for(30ms);
            h.backend().wake();
        });
        const auto start = steady::now();
        const int n = h.poll(10s);
        const auto waited = steady::now() - start;
        waker.join();
        CHECK(n == 0);
        CHECK(waited < 5s);
    }
    // Several wakes before one poll: they do not keep later polls from waiting.
    h.backend().wake();
    h.backend().wake();
    h.poll(1s);
    h.poll(0ns);
    const auto start = steady::now();
    h.poll(30ms);
    CHECK(steady::now() - start >= 20ms);
}

TEST_CASE("reactor contract: native_handle turns readable when poll has work", "[reactor]") {
    harness h;
    const int handle = h.backend().native_handle();
    if (handle < 0) {
        WARN("this backend has no pollable descriptor");
        return;
    }
    const auto readable_within = [handle](int ms) {
        ::pollfd p{handle, POLLIN, 0};
        return ::poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
    };
    const fd_pair p = h.own(make_pipe());
    char in[4];
    operation& r = h.read(op_code::read, p.a, in, sizeof in);
    REQUIRE_FALSE(h.submit(r));
    h.backend().flush();  // what a host does before it sleeps on the handle
    put(p.b, "x");
    CHECK(readable_within(2000));
    REQUIRE(h.wait_for(r));
    CHECK(r.result == 1);

    h.poll(0ns);
    h.backend().wake();
    CHECK(readable_within(2000));
    h.poll(0ns);
}

// --- cancel -----------------------------------------------------------------------

TEST_CASE("reactor contract: cancel of a pending operation answers -ECANCELED", "[reactor]") {
    harness h;
    const fd_pair p = h.own(make_pipe());
    const fd_pair s = h.own(make_socketpair());
    address where;
    const int listener = h.own(bound_socket(AF_INET, SOCK_STREAM, where, true));
    REQUIRE(listener >= 0);
    fill(s.a);

    char in[8];
    address peer;
    peer.len = sizeof peer.storage;
    std::vector<operation*> ops;
    ops.push_back(&h.read(op_code::read, p.a, in, sizeof in));
    const fd_pair quiet = h.own(make_socketpair());
    ops.push_back(&h.read(op_code::recv, quiet.a, in, sizeof in));
    ops.push_back(&h.write(op_code::send, s.a, "x", 1));
    ops.push_back(&h.poll_op(p.a, reactor::readable));
    ops.push_back(&h.poll_op(p.a, reactor::readable, true));
    ops.push_back(&h.op(op_code::recv_pooled, quiet.a));
    operation& a = h.op(op_code::accept, listener);
    a.args.accept = {peer.get(), &peer.len};
    ops.push_back(&a);

    for (operation* o : ops) REQUIRE_FALSE(h.submit(*o));
    h.idle(10ms);  // in the kernel by now, where that applies
    for (operation* o : ops) {
        INFO(reactor::to_string(o->code));
        CHECK(h.completions(*o) == 0);
        h.backend().cancel(*o);
    }
    REQUIRE(h.poll_until(
        [&] { return std::all_of(ops.begin(), ops.end(), [&](operation* o) { return h.completions(*o) > 0; }); }));
    h.idle();
    for (operation* o : ops) {
        INFO(reactor::to_string(o->code));
        CHECK(h.completions(*o) == 1);
        CHECK(o->result == -ECANCELED);
        CHECK(o->state == op_state::done);
    }
    CHECK(h.backend().read_buffers().lent == 0);

    // The descriptors go on working.
    put(p.b, "y");
    CHECK(h.run(h.read(op_code::read, p.a, in, sizeof in)) == 1);
    const int client = h.own(connect_blocking(where));
    (void)client;
    operation& again = h.op(op_code::accept, listener);
    const std::int64_t fd = h.run(again);
    REQUIRE(fd >= 0);
    h.own(static_cast<int>(fd));
}

TEST_CASE("reactor contract: cancel racing a completion gives one answer and loses nothing", "[reactor]") {
    harness h;
    const fd_pair p = h.own(make_pipe());
    int cancelled = 0, won = 0;
    for (int round = 0; round < 100; ++round) {
        char in[4] = {};
        operation& r = h.read(op_code::read, p.a, in, sizeof in);
        REQUIRE_FALSE(h.submit(r));
        if (round % 2) h.poll(0ns);  // half of them in the kernel before the data
        put(p.b, "z");
        if (round % 3 == 0) h.poll(0ns);
        h.backend().cancel(r);
        h.backend().cancel(r);  // twice: still one answer
        REQUIRE(h.poll_until([&] { return h.completions(r) > 0; }));
        h.poll(0ns);
        REQUIRE(h.completions(r) == 1);
        if (r.result == -ECANCELED) {
            ++cancelled;
            CHECK(drain(p.a) == "z");  // the byte is still there
        } else {
            ++won;
            CHECK(r.result == 1);
            CHECK(in[0] == 'z');
            CHECK(drain(p.a).empty());
        }
    }
    INFO("cancelled " << cancelled << ", completed " << won);
    CHECK(cancelled + won == 100);
}

TEST_CASE("reactor contract: cancel of an operation that is not pending does nothing", "[reactor]") {
    harness h;
    const fd_pair p = h.own(make_pipe());
    char in[4];
    operation& never = h.read(op_code::read, p.a, in, sizeof in);
    h.backend().cancel(never);
    CHECK(never.state == op_state::idle);
    h.idle(10ms);
    CHECK(h.completions(never) == 0);

    put(p.b, "ab");
    operation& done = h.read(op_code::read, p.a, in, 1);
    CHECK(h.run(done) == 1);
    const int seen = h.completions(done);
    h.backend().cancel(done);
    h.idle(10ms);
    CHECK(done.result == 1);
    CHECK(done.state == op_state::done);
    CHECK(h.completions(done) == seen);

    // A cancelled one, cancelled again once done.
    operation& r = h.read(op_code::read, h.own(make_pipe()).a, in, sizeof in);
    REQUIRE_FALSE(h.submit(r));
    h.backend().cancel(r);
    REQUIRE(h.wait_for(r));
    h.backend().cancel(r);
    h.idle(10ms);
    CHECK(h.completions(r) == 1);
    CHECK(r.result == -ECANCELED);
}

// --- forget ------------------------------------------------------------------------

TEST_CASE("reactor contract: a forgotten operation is never touched again", "[reactor]") {
    harness h;
    const fd_pair p = h.own(make_pipe());
    const fd_pair s = h.own(make_socketpair());
    using reactor::readable;

    // Each kind of wait, forgotten, its memory then scribbled over and freed:
    // a backend that still wrote to it or called it back would be caught
    // here (or by AddressSanitizer).
    const auto forget_and_free = [&](std::unique_ptr<operation> o, char* buffer) {
        REQUIRE_FALSE(h.submit(*o));
        h.idle(10ms);
        h.backend().forget(*o);
        CHECK_FALSE(o->pending());
        std::memset(static_cast<void*>(o.get()), 0xa5, sizeof(operation));
        if (buffer) std::memset(buffer, 0, 8);
        o.reset();
    };
    char in[8] = {};
    {
        auto o = std::make_unique<operation>();
        h.prepare(*o, op_code::read, p.a);
        o->args.buf = {in, sizeof in};
        forget_and_free(std::move(o), in);
    }
    {
        auto o = std::make_unique<operation>();
        h.prepare(*o, op_code::poll, p.a);
        o->events = readable;
        o->persistent = true;
        forget_and_free(std::move(o), nullptr);
    }
    {
        auto o = std::make_unique<operation>();
        h.prepare(*o, op_code::recv_pooled, s.a);
        forget_and_free(std::move(o), nullptr);
    }
    put(p.b, "data");
    put(s.b, "data");
    h.idle();
    CHECK(h.log().empty());
    CHECK(std::string_view(in, 1) == std::string_view("\0", 1));
    CHECK(drain(p.a) == "data");  // forgotten before it came: nobody took it
    CHECK(drain(s.a) == "data");
    CHECK(h.backend().read_buffers().lent == 0);
}

TEST_CASE("reactor contract: forget racing a completion calls nobody and leaks nothing", "[reactor]") {
    harness h;
    address where;
    const int listener = h.own(bound_socket(AF_INET, SOCK_STREAM, where, true));
    REQUIRE(listener >= 0);
    const fd_pair p = h.own(make_pipe());
    const int descriptors = open_descriptors();
    for (int round = 0; round < 20; ++round) {
        address peer;
        peer.len = sizeof peer.storage;
        auto a = std::make_unique<operation>();
        h.prepare(*a, op_code::accept, listener);
        a->args.accept = {peer.get(), &peer.len};
        REQUIRE_FALSE(h.submit(*a));
        if (round % 2) h.poll(0ns);
        const int client = connect_blocking(where);
        char in[4];
        auto r = std::make_unique<operation>();
        h.prepare(*r, op_code::read, p.a);
        r->args.buf = {in, sizeof in};
        REQUIRE_FALSE(h.submit(*r));
        put(p.b, "q");
        h.backend().forget(*a);
        h.backend().forget(*r);
        a.reset();
        r.reset();
        h.idle(5ms);
        // An accept the kernel made anyway is closed, or the connection still
        // waits in the backlog: either way no descriptor was given to nobody.
        const int left = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (left >= 0) ::close(left);
        ::close(client);
        drain(p.a);
        CHECK(open_descriptors() == descriptors);
    }
    CHECK(h.log().empty());
}

TEST_CASE("reactor contract: forget of an operation that is not pending does nothing", "[reactor]") {
    harness h;
    const fd_pair p = h.own(make_pipe());
    char in[4];
    operation& never = h.read(op_code::read, p.a, in, sizeof in);
    h.backend().forget(never);
    CHECK(never.state == op_state::idle);
    put(p.b, "a");
    operation& done = h.read(op_code::read, p.a, in, sizeof in);
    CHECK(h.run(done) == 1);
    const int seen = h.completions(done);  // 0 when it completed at once
    h.backend().forget(done);
    CHECK(done.result == 1);
    CHECK(done.state == op_state::done);
    h.idle(10ms);
    CHECK(h.completions(done) == seen);
    CHECK(h.completions(never) == 0);
}

// --- close_fd -----------------------------------------------------------------------

TEST_CASE("reactor contract: close_fd completes what waits on the descriptor with -ECANCELED", "[reactor]") {
    harness h;
    const fd_pair s = h.own(make_socketpair());
    const fd_pair other = h.own(make_pipe());
    fill(s.a);

    char in[8], elsewhere[8];
    std::vector<operation*> on_fd = {
        &h.read(op_code::recv, s.a, in, sizeof in), &h.write(op_code::send, s.a, "x", 1),
        &h.poll_op(s.a, reactor::readable),         &h.poll_op(s.a, reactor::readable, true),
        &h.op(op_code::recv_pooled, s.a),
    };
    for (operation* o : on_fd) REQUIRE_FALSE(h.submit(*o));
    operation& unrelated = h.read(op_code::read, other.a, elsewhere, sizeof elsewhere);
    REQUIRE_FALSE(h.submit(unrelated));
    h.idle(10ms);

    // complete() may be called from close_fd() itself or from a later poll().
    h.close_now(s.a);
    REQUIRE(h.poll_until(
        [&] { return std::all_of(on_fd.begin(), on_fd.end(), [&](operation* o) { return h.completions(*o) > 0; }); }));
    h.idle();
    for (operation* o : on_fd) {
        INFO(reactor::to_string(o->code) << (o->persistent ? " (persistent)" : ""));
        CHECK(h.completions(*o) == 1);
        CHECK(o->result == -ECANCELED);
        CHECK_FALSE(o->pending());
    }
    CHECK(unrelated.pending());
    CHECK(h.completions(unrelated) == 0);
    put(other.b, "ok");
    REQUIRE(h.wait_for(unrelated));
    CHECK(unrelated.result == 2);
    CHECK(h.backend().read_buffers().lent == 0);
}

TEST_CASE("reactor contract: close_fd answers -ECANCELED even when the result was already there", "[reactor]") {
    harness h;
    address where;
    const int descriptors = open_descriptors();
    for (int round = 0; round < 10; ++round) {
        const int listener = bound_socket(AF_INET, SOCK_STREAM, where, true);
        REQUIRE(listener >= 0);
        const fd_pair p = make_pipe();
        address peer;
        peer.len = sizeof peer.storage;
        operation& a = h.op(op_code::accept, listener);
        a.args.accept = {peer.get(), &peer.len};
        char in[4];
        operation& r = h.read(op_code::read, p.a, in, sizeof in);
        REQUIRE_FALSE(h.submit(a));
        REQUIRE_FALSE(h.submit(r));
        if (round % 2) h.poll(0ns);
        const int client = connect_blocking(where);
        put(p.b, "w");
        h.close_now(listener);
        h.close_now(p.a);
        REQUIRE(h.poll_until([&] { return h.completions(a) > 0 && h.completions(r) > 0; }));
        CHECK(a.result == -ECANCELED);
        CHECK(r.result == -ECANCELED);
        ::close(client);
        ::close(p.b);
        // An accepted descriptor nobody will see was closed, not leaked.
        CHECK(open_descriptors() == descriptors);
    }
}

TEST_CASE("reactor contract: close_fd after a cancel still answers -ECANCELED", "[reactor]") {
    // A cancel asked for first must not let the close's answer slip: an accept
    // the kernel had finished would otherwise hand over a descriptor.
    harness h;
    address where;
    const int descriptors = open_descriptors();
    for (int round = 0; round < 10; ++round) {
        const int listener = bound_socket(AF_INET, SOCK_STREAM, where, true);
        REQUIRE(listener >= 0);
        address peer;
        peer.len = sizeof peer.storage;
        operation& a = h.op(op_code::accept, listener);
        a.args.accept = {peer.get(), &peer.len};
        REQUIRE_FALSE(h.submit(a));
        if (round % 2) h.poll(0ns);
        const int client = connect_blocking(where);
        if (round % 3 == 0) std::this_thread::sleep_for(1ms);  // let the kernel finish it, sometimes
        h.backend().cancel(a);
        h.close_now(listener);
        REQUIRE(h.poll_until([&] { return h.completions(a) > 0; }));
        h.idle();
        CHECK(a.result == -ECANCELED);
        CHECK(h.completions(a) == 1);
        ::close(client);
        CHECK(open_descriptors() == descriptors);
    }
}

TEST_CASE("reactor contract: close_fd of a descriptor with nothing pending does nothing", "[reactor]") {
    harness h;
    const fd_pair p = h.own(make_pipe());
    char in[4];
    operation& r = h.read(op_code::read, p.a, in, sizeof in);
    REQUIRE_FALSE(h.submit(r));
    h.backend().close_fd(p.b);     // known to nobody here
    h.backend().close_fd(100000);  // never seen
    h.idle(10ms);
    CHECK(r.pending());
    CHECK(h.log().empty());
    put(p.b, "ok");
    REQUIRE(h.wait_for(r));
    CHECK(r.result == 2);
}

TEST_CASE("reactor contract: a descriptor number used again after close_fd starts afresh", "[reactor]") {
    harness h;
    for (int round = 0; round < 10; ++round) {
        fd_pair s = make_socketpair();
        char in[8];
        operation& r = h.read(op_code::recv, s.a, in, sizeof in);
        REQUIRE_FALSE(h.submit(r));
        if (round % 2) h.poll(0ns);
        put(s.b, "old");  // readiness of the old file, perhaps still queued
        const int number = s.a;
        h.close_now(s.a);
        ::close(s.b);
        REQUIRE(h.poll_until([&] { return h.completions(r) > 0; }));
        CHECK(r.result == -ECANCELED);

        const fd_pair fresh = make_pipe();
        INFO("old number " << number << ", new " << fresh.a);
        operation& again = h.read(op_code::read, fresh.a, in, sizeof in);
        REQUIRE_FALSE(h.submit(again));
        operation& ready = h.poll_op(fresh.a, reactor::readable);
        REQUIRE_FALSE(h.submit(ready));
        h.idle(20ms);
        CHECK(h.completions(again) == 0);
        CHECK(h.completions(ready) == 0);
        put(fresh.b, "new");
        REQUIRE(h.poll_until([&] { return h.completions(again) > 0 && h.completions(ready) > 0; }));
        CHECK(again.result == 3);
        CHECK(std::string_view(in, 3) == "new");
        h.close_now(fresh.a);
        ::close(fresh.b);
    }
}

// --- the rules on results and order -----------------------------------------------

TEST_CASE("reactor contract: a bad descriptor answers -EBADF", "[reactor]") {
    harness h;
    char in[4];
    operation& negative = h.read(op_code::read, -1, in, sizeof in);
    CHECK(h.run(negative) == -EBADF);

    fd_pair gone = make_pipe();
    ::close(gone.a);
    ::close(gone.b);
    CHECK(h.run(h.read(op_code::read, gone.a, in, sizeof in)) == -EBADF);
    CHECK(h.run(h.write(op_code::write, gone.b, in, sizeof in)) == -EBADF);
    CHECK(h.run(h.poll_op(-1, reactor::readable)) == -EBADF);

    // A readiness wait on a closed number: epoll cannot watch it and throws.
    // (The call stays outside CHECK, which would catch the exception itself.)
    operation& w = h.poll_op(gone.a, reactor::readable);
    int answer = 0;
    bool refused = false;
    try {
        answer = h.run(w);
    } catch (const std::system_error& e) {
        refused = true;
        CHECK(e.code().value() == EBADF);
        CHECK_FALSE(w.pending());
    }
    if (refused)
        CHECK(h.backend().kind() != reactor::backend_kind::io_uring);
    else
        CHECK(answer == -EBADF);
}

TEST_CASE("reactor contract: several waiters on one descriptor, nothing lost or given twice", "[reactor]") {
    harness h;
    const fd_pair p = h.own(make_pipe());
    char in[3] = {};
    std::vector<operation*> readers;
    for (char& c : in) {
        readers.push_back(&h.read(op_code::read, p.a, &c, 1));
        REQUIRE_FALSE(h.submit(*readers.back()));
    }
    put(p.b, "abc");
    REQUIRE(h.poll_until([&] {
        return std::all_of(readers.begin(), readers.end(), [&](operation* o) { return h.completions(*o) == 1; });
    }));
    std::string got;
    for (std::size_t i = 0; i < readers.size(); ++i) {
        CHECK(readers[i]->result == 1);
        got += in[i];
    }
    std::string sorted = got;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == "abc");
    // The order is the backend's (docs/backends.md): epoll and kqueue serve
    // waiters in the order they came, io_uring in the kernel's.
    if (!h.completes_in_kernel()) {
        CHECK(got == "abc");
        CHECK(h.order() == std::vector<const operation*>(readers.begin(), readers.end()));
    }

    // Two accepts, two connections: two descriptors, one each.
    address where;
    const int listener = h.own(bound_socket(AF_INET, SOCK_STREAM, where, true));
    REQUIRE(listener >= 0);
    operation& a1 = h.op(op_code::accept, listener);
    operation& a2 = h.op(op_code::accept, listener);
    REQUIRE_FALSE(h.submit(a1));
    REQUIRE_FALSE(h.submit(a2));
    h.own(connect_blocking(where));
    h.own(connect_blocking(where));
    REQUIRE(h.poll_until([&] { return h.completions(a1) == 1 && h.completions(a2) == 1; }));
    REQUIRE(a1.result >= 0);
    REQUIRE(a2.result >= 0);
    CHECK(a1.result != a2.result);
    h.own(static_cast<int>(a1.result));
    h.own(static_cast<int>(a2.result));
}

TEST_CASE("reactor contract: poll counts the completions it made", "[reactor]") {
    harness h;
    std::vector<operation*> ops;
    std::vector<fd_pair> pipes;
    char in[8][4];
    for (int i = 0; i < 8; ++i) {
        pipes.push_back(h.own(make_pipe()));
        ops.push_back(&h.read(op_code::read, pipes.back().a, in[i], sizeof in[i]));
        REQUIRE_FALSE(h.submit(*ops.back()));
    }
    for (const fd_pair& p : pipes) put(p.b, "n");
    REQUIRE(h.poll_until([&] { return static_cast<int>(h.log().size()) == 8; }));
    // The harness checks, when it goes, that poll() counted each of them.
    for (operation* o : ops) CHECK(o->result == 1);
}

TEST_CASE("reactor contract: a regular file is read at once or refused when submitted", "[reactor]") {
    harness h;
    std::string path = "/tmp/spindle-reactor-XXXXXX";
    const int fd = h.own(::mkostemp(path.data(), O_CLOEXEC));
    REQUIRE(fd >= 0);
    ::unlink(path.c_str());
    put(fd, "file");
    REQUIRE(::lseek(fd, 0, SEEK_SET) == 0);
    char in[8];
    if (h.backend().kind() == reactor::backend_kind::epoll) {
        // The read would wait for the disk on the loop's thread: refused, as
        // epoll refuses to watch the file (docs/files.md).
        operation& r = h.read(op_code::read, fd, in, sizeof in);
        bool read_refused = false;
        try {
            (void)h.submit(r);
        } catch (const std::system_error& e) {
            read_refused = e.code().value() == EPERM;
        }
        CHECK(read_refused);
        CHECK_FALSE(r.pending());
    } else {
        CHECK(h.run(h.read(op_code::read, fd, in, sizeof in)) == 4);  // from the file's own position
        CHECK(std::string_view(in, 4) == "file");
        CHECK(h.run(h.read(op_code::read, fd, in, sizeof in)) == 0);
    }

    // A readiness wait: a regular file is always ready, but epoll cannot
    // watch one and refuses it by throwing; the operation is then not pending.
    operation& w = h.poll_op(fd, reactor::readable);
    bool refused = false;
    try {
        if (!h.submit(w)) REQUIRE(h.wait_for(w));
    } catch (const std::system_error& e) {
        refused = true;
        CHECK(e.code().value() == EPERM);
        CHECK_FALSE(w.pending());
        CHECK(h.completions(w) == 0);
    }
    if (!refused) CHECK(w.result == reactor::readable);
    // The backends differ here (docs/backends.md): epoll refuses, io_uring answers.
    if (h.backend().kind() == reactor::backend_kind::epoll) CHECK(refused);
    if (h.backend().kind() == reactor::backend_kind::io_uring) CHECK_FALSE(refused);
}

TEST_CASE("reactor contract: cancel, forget and close_fd after the result is in", "[reactor]") {
    harness h;
    using reactor::readable;
    SECTION("a persistent poll ready at submit, cancelled or closed before the next poll") {
        const fd_pair s = h.own(make_socketpair());
        operation& cancelled = h.poll_op(s.a, reactor::writable, true);
        operation& closed = h.poll_op(s.b, reactor::writable, true);
        REQUIRE_FALSE(h.submit(cancelled));
        REQUIRE_FALSE(h.submit(closed));
        h.backend().cancel(cancelled);
        h.close_now(s.b);
        REQUIRE(h.poll_until([&] { return !cancelled.pending() && !closed.pending(); }));
        h.idle();
        // It may have been heard of before the cancel took: then a readiness
        // first, and the cancel's answer last.
        for (const operation* o : {&cancelled, &closed}) {
            CHECK(o->result == -ECANCELED);
            CHECK(h.completions(*o) >= 1);
        }
    }
    SECTION("the result reached the backend while it waited on another operation") {
        // io_uring's forget() waits in the kernel and keeps what else it
        // reaps for the next poll(): those operations may then be cancelled,
        // forgotten or closed before they are dispatched.
        const fd_pair p = h.own(make_pipe());
        const fd_pair q = h.own(make_pipe());
        const fd_pair r = h.own(make_pipe());
        const fd_pair t = h.own(make_pipe());
        char a[4], b[4], c[4], d[4];
        operation& to_cancel = h.read(op_code::read, p.a, a, sizeof a);
        auto to_forget = std::make_unique<operation>();
        h.prepare(*to_forget, op_code::read, q.a);
        to_forget->args.buf = {b, sizeof b};
        operation& to_close = h.read(op_code::read, r.a, c, sizeof c);
        operation& waiting = h.read(op_code::read, t.a, d, sizeof d);
        for (operation* o : {&to_cancel, to_forget.get(), &to_close, &waiting}) REQUIRE_FALSE(h.submit(*o));
        h.poll(0ns);
        put(p.b, "1");
        put(q.b, "2");
        put(r.b, "3");
        h.backend().forget(waiting);
        h.backend().cancel(to_cancel);
        h.backend().forget(*to_forget);
        to_forget.reset();
        h.close_now(r.a);
        REQUIRE(h.poll_until([&] { return h.completions(to_cancel) == 1 && h.completions(to_close) == 1; }));
        h.idle();
        CHECK((to_cancel.result == 1 || to_cancel.result == -ECANCELED));
        if (to_cancel.result == -ECANCELED) CHECK(drain(p.a) == "1");
        CHECK(to_close.result == -ECANCELED);
        CHECK(h.completions(waiting) == 0);
        CHECK(h.log().size() == 2);
    }
    SECTION("pooled receives give their buffers back") {
        const fd_pair s1 = h.own(make_socketpair());
        const fd_pair s2 = h.own(make_socketpair());
        const fd_pair s3 = h.own(make_socketpair());
        operation& cancelled = h.op(op_code::recv_pooled, s1.a);
        operation& closed = h.op(op_code::recv_pooled, s2.a);
        auto forgotten = std::make_unique<operation>();
        h.prepare(*forgotten, op_code::recv_pooled, s3.a);
        for (operation* o : {&cancelled, &closed, forgotten.get()}) {
            o->stream = true;
            REQUIRE_FALSE(h.submit(*o));
        }
        h.poll(0ns);
        for (const fd_pair& s : {s1, s2, s3}) put(s.b, "data");
        std::this_thread::sleep_for(5ms);  // the kernel may have filled some by now
        h.backend().cancel(cancelled);
        h.close_now(s2.a);
        h.backend().forget(*forgotten);
        forgotten.reset();
        REQUIRE(h.poll_until([&] { return h.completions(cancelled) == 1 && h.completions(closed) == 1; }));
        h.idle();
        CHECK(closed.result == -ECANCELED);
        if (cancelled.result > 0) {
            CHECK(cancelled.result == 4);
            reactor::release_handed_over(cancelled);
        } else {
            CHECK(cancelled.result == -ECANCELED);
        }
        // What arrived after a cancel or a forget may be kept for the
        // descriptor's next read (io_uring's feed, below): it is given back
        // when the descriptor is closed.
        h.close_now(s1.a);
        h.close_now(s3.a);
        h.idle();
        CHECK(h.backend().read_buffers().lent == 0);
        CHECK(h.log().size() == 2);
    }
}

TEST_CASE("reactor contract: a poll without a time limit ends on wake", "[reactor]") {
    harness h;
    std::atomic<bool> over{false};
    // A first wake after 30 ms; should that be lost, later ones every second
    // keep a broken backend from hanging the test (it then fails on time).
    std::thread waker([&] {
        std::this_thread::sleep_for(30ms);
        for (int i = 0; i < 30 && !over.load(); ++i) {
            h.backend().wake();
            std::this_thread::sleep_for(1s);
        }
    });
    const auto start = steady::now();
    const int n = h.poll(-1ns);
    const auto waited = steady::now() - start;
    over = true;
    waker.join();
    CHECK(n == 0);
    CHECK(waited < 900ms);
}

// --- pooled receives: the batch and the buffers' lifetime --------------------------

TEST_CASE("reactor contract: one poll lends at most a batch of buffers, the rest wait", "[reactor]") {
    reactor::backend_options options;
    options.read_buffer_batch = 2;
    options.read_buffer_size = 1024;
    harness h(options);
    constexpr int receives = 6;
    std::vector<fd_pair> sockets;
    std::vector<operation*> ops;
    for (int i = 0; i < receives; ++i) {
        sockets.push_back(h.own(make_socketpair()));
        ops.push_back(&h.op(op_code::recv_pooled, sockets.back().a));
        ops.back()->stream = true;
        REQUIRE_FALSE(h.submit(*ops.back()));
    }
    h.poll(0ns);
    for (const fd_pair& s : sockets) put(s.b, "burst");

    const auto completed = [&] {
        return static_cast<int>(
            std::count_if(ops.begin(), ops.end(), [&](operation* o) { return h.completions(*o) > 0; }));
    };
    std::vector<operation*> delivered;
    // Buffers on their way to owners that have not taken them yet hold the
    // others back; each one taken lets one more through.
    REQUIRE(h.poll_until([&] { return completed() >= 2; }));
    h.idle();
    CHECK(completed() == 2);
    for (int round = 0; completed() < receives && round < receives; ++round) {
        for (operation* o : ops) {
            if (h.completions(*o) == 0 || std::find(delivered.begin(), delivered.end(), o) != delivered.end()) continue;
            REQUIRE(o->result == 5);
            o->args.pooled.pool->delivered();  // taken, and held on to
            delivered.push_back(o);
        }
        const int before = completed();
        REQUIRE(h.poll_until([&] { return completed() > before; }));
        h.idle(10ms);
        CHECK(completed() - before <= 2);
    }
    CHECK(completed() == receives);
    // Held buffers do not count against the batch; all of them are lent now.
    CHECK(h.backend().read_buffers().lent == static_cast<std::uint32_t>(receives));
    for (operation* o : ops) {
        if (std::find(delivered.begin(), delivered.end(), o) == delivered.end()) {
            reactor::release_handed_over(*o);
        } else {
            o->args.pooled.pool->give_back(o->args.pooled.id);
        }
    }
    CHECK(h.backend().read_buffers().lent == 0);
}

TEST_CASE("reactor contract: a lent buffer outlives its backend", "[reactor]") {
    const fd_pair s = make_socketpair();
    reactor::buffer_pool* pool = nullptr;
    std::uint32_t id = 0;
    {
        harness h;
        operation& r = h.op(op_code::recv_pooled, s.a);
        r.stream = true;
        put(s.b, "kept");
        if (!h.submit(r)) REQUIRE(h.wait_for(r));
        REQUIRE(r.result == 4);
        pool = r.args.pooled.pool;
        id = r.args.pooled.id;
        pool->delivered();
    }
    // The backend is gone; its pool stays until this last buffer comes back.
    CHECK(std::string_view(reinterpret_cast<const char*>(pool->address(id)), 4) == "kept");
    pool->give_back(id);
    ::close(s.a);
    ::close(s.b);
}

namespace {

// What a pooled receive got, given back to its pool.
std::string take_pooled(operation& o) {
    if (o.result <= 0) return {};
    std::string out(reinterpret_cast<const char*>(o.args.pooled.pool->address(o.args.pooled.id)),
                    static_cast<std::size_t>(o.result));
    reactor::release_handed_over(o);
    return out;
}

}  // namespace

TEST_CASE("reactor contract: a stream read by pooled receives and reads of other kinds keeps its bytes in order",
          "[reactor]") {
    // io_uring serves a stream's pooled receives from one multishot receive,
    // whose data may be queued when no receive waits: a read of another kind
    // must still get the bytes that come next, and a readiness poll must see them.
    harness h;
    const fd_pair s = h.own(make_socketpair());
    std::string got;
    const auto pooled = [&] {
        operation& r = h.op(op_code::recv_pooled, s.b);
        r.stream = true;
        REQUIRE(h.run(r) > 0);
        got += take_pooled(r);
    };
    operation& first = h.op(op_code::recv_pooled, s.b);
    first.stream = true;
    REQUIRE_FALSE(h.submit(first));  // nothing sent yet
    put(s.a, "ab");
    REQUIRE(h.wait_for(first));
    got += take_pooled(first);
    // Sent while no receive waits; a few polls let a feed queue it.
    put(s.a, "cdefgh");
    h.idle(20ms);
    char small[2];
    operation& r1 = h.read(op_code::recv, s.b, small, sizeof small);
    r1.stream = true;
    REQUIRE(h.run(r1) == 2);
    got.append(small, 2);
    char v1[1], v2[8];
    ::iovec vec[2] = {{v1, sizeof v1}, {v2, sizeof v2}};
    operation& r2 = h.op(op_code::readv, s.b);
    r2.args.vec = {vec, 2};
    const std::int64_t n2 = h.run(r2);
    REQUIRE(n2 >= 1);
    got.append(v1, 1);
    got.append(v2, static_cast<std::size_t>(n2 - 1));
    while (got.size() < 8) {
        char rest[8];
        operation& r = h.read(op_code::recv, s.b, rest, sizeof rest);
        const std::int64_t n = h.run(r);
        REQUIRE(n > 0);
        got.append(rest, static_cast<std::size_t>(n));
    }
    CHECK(got == "abcdefgh");
    // Readiness, then a recvmsg, then pooled receives again.
    put(s.a, "ij");
    operation& ready = h.poll_op(s.b, reactor::readable);
    CHECK(h.run(ready) == reactor::readable);
    char m[4];
    ::iovec mv{m, sizeof m};
    ::msghdr msg{};
    msg.msg_iov = &mv;
    msg.msg_iovlen = 1;
    operation& r3 = h.op(op_code::recvmsg, s.b);
    r3.args.msg = &msg;
    const std::int64_t n3 = h.run(r3);
    REQUIRE(n3 == 2);
    got.append(m, 2);
    put(s.a, "kl");
    pooled();
    CHECK(got == "abcdefghijkl");
    // The end of the stream, to a pooled receive and to a plain one.
    h.close_now(s.a);
    operation& end = h.op(op_code::recv_pooled, s.b);
    end.stream = true;
    CHECK(h.run(end) == 0);
    char last[4];
    operation& end2 = h.read(op_code::recv, s.b, last, sizeof last);
    CHECK(h.run(end2) == 0);
    CHECK(h.backend().read_buffers().lent == 0);
}

TEST_CASE("reactor contract: a stream nobody reads holds few of the pool's buffers", "[reactor]") {
    // One pooled receive, then the reader stops while the peer writes all it
    // can: the rest stays in the socket (the peer feels backpressure), not in
    // lent buffers. io_uring's multishot receive may have taken a few before
    // it stopped; the others take none.
    reactor::backend_options options;
    options.read_buffer_size = 4096;
    harness h(options);
    const fd_pair s = h.own(make_socketpair());
    operation& r = h.op(op_code::recv_pooled, s.b);
    r.stream = true;
    REQUIRE_FALSE(h.submit(r));
    put(s.a, "first");
    REQUIRE(h.wait_for(r));
    CHECK(take_pooled(r) == "first");
    const std::string chunk(4096, 'x');
    std::size_t sent = 0;
    for (int round = 0; round < 200; ++round) {
        const auto n = ::send(s.a, chunk.data(), chunk.size(), MSG_NOSIGNAL);
        if (n > 0) {
            sent += static_cast<std::size_t>(n);
        } else {
            REQUIRE(errno == EAGAIN);
            h.poll(1ms);
            if (::send(s.a, chunk.data(), 1, MSG_NOSIGNAL) < 0) break;  // still full after a poll
            ++sent;
        }
        h.poll(0ns);
    }
    h.idle(20ms);
    INFO("sent " << sent << " bytes");
    CHECK(h.backend().read_buffers().lent <= 40);
    CHECK(h.backend().read_buffers().lent * std::size_t{4096} < sent / 2);
    // Every byte is still there, in order, for the next reads.
    std::size_t read = 0;
    for (int i = 0; i < 10000 && read < sent; ++i) {
        operation& next = h.op(op_code::recv_pooled, s.b);
        next.stream = true;
        const std::int64_t n = h.run(next);
        REQUIRE(n > 0);
        read += static_cast<std::size_t>(n);
        const std::string bytes = take_pooled(next);
        REQUIRE(bytes.find_first_not_of('x') == std::string::npos);
    }
    CHECK(read == sent);
    CHECK(h.backend().read_buffers().lent == 0);
}
