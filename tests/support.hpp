#pragma once
// Helpers shared by the tests: a watchdog so a hung coroutine fails instead of
// hanging the suite, a log capture, and a lifetime counter.

#include "catch.hpp"

#include <spindle/spindle.hpp>

#include <spdlog/sinks/ringbuffer_sink.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace spindle::test {

/// Whether the loop offers a pollable descriptor to fold into a host's poller.
/// Every backend does except kqueue emulated on Linux by libkqueue, whose
/// descriptor never turns readable: there it is -1 and the test says so.
inline bool has_native_handle(const spindle::loop& l) {
    if (l.native_handle() >= 0) return true;
    CHECK(l.backend() == spindle::backend_kind::kqueue);
    WARN("this backend has no pollable descriptor (libkqueue); nothing to check");
    return false;
}

/// Runs `t` on `l` until it finishes; fails the test (and returns) if it has
/// not finished within `limit` of wall time.
template <class T>
T run_with_watchdog(loop& l, task<T> t, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    auto handle = l.spawn(std::move(t), "test");
    const auto give_up = clock::now() + limit;
    while (!handle.done()) {
        if (clock::now() > give_up) FAIL("watchdog: the task did not finish in time");
        l.run_once(std::chrono::milliseconds(10));
    }
    return l.block_on([](join_handle<T>& h) -> task<T> { co_return co_await h; }(handle));
}

/// Captures what the library logs while alive.
class log_capture {
public:
    log_capture() : m_sink(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)) {
        auto logger = std::make_shared<spdlog::logger>("spindle", m_sink);
        logger->set_level(spdlog::level::info);
        m_previous = spindle::logger();
        spindle::set_logger(logger);
    }
    ~log_capture() { spindle::set_logger(m_previous); }
    log_capture(const log_capture&) = delete;
    log_capture& operator=(const log_capture&) = delete;

    std::vector<std::string> lines() const { return m_sink->last_formatted(); }
    bool contains(const std::string& needle) const {
        for (const auto& line : lines())
            if (line.find(needle) != std::string::npos) return true;
        return false;
    }

private:
    std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> m_sink;
    std::shared_ptr<spdlog::logger> m_previous;
};

/// A non-blocking pipe, closed after the loop that used it (declare it first).
struct pipe_pair {
    int r = -1;
    int w = -1;
    pipe_pair() {
        int fds[2];
        REQUIRE(::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
        r = fds[0];
        w = fds[1];
    }
    ~pipe_pair() {
        ::close(r);
        ::close(w);
    }
    pipe_pair(const pipe_pair&) = delete;
    pipe_pair& operator=(const pipe_pair&) = delete;
    bool put(char c = 'x') const { return ::write(w, &c, 1) == 1; }
};

/// A connected pair of non-blocking stream sockets, closed after the loop that
/// used them (declare it first). `a` may be handed to a task (then it is no
/// longer ours to close).
struct socket_pair {
    int a = -1;
    int b = -1;
    socket_pair() {
        int fds[2];
        REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0);
        a = fds[0];
        b = fds[1];
    }
    ~socket_pair() {
        if (a >= 0) ::close(a);
        ::close(b);
    }
    socket_pair(const socket_pair&) = delete;
    socket_pair& operator=(const socket_pair&) = delete;
    int give_a() { return std::exchange(a, -1); }
    /// recv on `b`: 0 once `a` is closed; -EAGAIN while `a` is open and silent.
    long peek_b() const {
        char c;
        const ssize_t n = ::recv(b, &c, 1, MSG_DONTWAIT | MSG_PEEK);
        return n < 0 ? -errno : static_cast<long>(n);
    }
};

/// The error a result holds, empty on success: for tests that record an
/// outcome as an error code. (A function, not `(co_await x).error()`, which
/// g++ 12 rejects inside templates: docs/runtime.md.)
template <class R>
std::error_code error_of(const R& r) noexcept {
    return r.error();
}

/// Counts live instances, to prove frames and their locals were destroyed.
struct counted {
    static inline int alive = 0;
    static inline int constructed = 0;
    counted() noexcept {
        ++alive;
        ++constructed;
    }
    counted(const counted&) noexcept {
        ++alive;
        ++constructed;
    }
    ~counted() { --alive; }
};

/// Runs ticks until `done()` holds; false if it does not within `limit`.
template <class F>
bool run_until(loop& l, F done, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    const auto give_up = clock::now() + limit;
    while (!done()) {
        if (clock::now() > give_up) return false;
        l.run_once(std::chrono::milliseconds(1));
    }
    return true;
}

/// A few ticks without waiting: lets every ready task run to its next wait.
inline void settle(loop& l, int ticks = 4) {
    for (int i = 0; i < ticks; ++i) l.run_once(std::chrono::nanoseconds(0));
}

}  // namespace spindle::test
