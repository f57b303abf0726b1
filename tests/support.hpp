#pragma once
// Helpers shared by the tests: the runner (a watchdog so a hung coroutine
// fails instead of hanging the suite, and a leak check), a log capture,
// non-blocking pipes and socket pairs, and a lifetime counter.

#include "catch.hpp"

#include <spindle/spindle.hpp>

#include <spdlog/sinks/ringbuffer_sink.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
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

namespace detail {
template <class T>
T run_task(loop& l, task<T> t, std::chrono::milliseconds limit, bool may_leave_tasks) {
    const std::size_t alive_before = l.task_count();
    auto handle = l.spawn(std::move(t), "test");
    const auto give_up = clock::now() + limit;
    while (!handle.done()) {
        if (clock::now() > give_up) FAIL("watchdog: the task did not finish in time\n" << l.dump_tasks());
        l.run_once(std::chrono::milliseconds(10));
    }
    if (!may_leave_tasks && l.task_count() > alive_before)
        FAIL_CHECK("leak: the task finished but left tasks alive (" << alive_before << " before it)\n"
                                                                    << l.dump_tasks());
    // The task is done: awaiting its handle completes without suspending.
    auto result = handle.operator co_await();
    return result.await_resume();
}
}  // namespace detail

/// Runs `t` on `l` until it finishes and returns its value (or rethrows its
/// exception): the one way a test runs its task. The test fails if the task
/// has not finished within `limit` of wall time (a hung coroutine, not a hung
/// suite), and, once it has, if it left more tasks alive than there were
/// before it started: a child it detached and forgot, still parked, is a leak.
/// Tasks the test spawned itself beforehand (a server it runs against) are
/// its own and may live on.
template <class T>
T run(loop& l, task<T> t, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    return detail::run_task(l, std::move(t), limit, false);
}

/// run() for a task whose purpose is to start tasks that outlive it (into a
/// task group the test joins later): no leak check.
template <class T>
T run_leaving_tasks(loop& l, task<T> t, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    return detail::run_task(l, std::move(t), limit, true);
}

/// A string's bytes, and bytes as a string.
inline std::span<const std::byte> bytes_of(std::string_view s) noexcept {
    return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

inline std::string text_of(std::span<const std::byte> b) {
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
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
/// An end may be handed over (to a unique_fd, to a task, to be closed early):
/// then it is no longer ours to close.
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
        if (r >= 0) ::close(r);
        if (w >= 0) ::close(w);
    }
    pipe_pair(const pipe_pair&) = delete;
    pipe_pair& operator=(const pipe_pair&) = delete;
    int give_r() { return std::exchange(r, -1); }
    int give_w() { return std::exchange(w, -1); }
    bool put(char c = 'x') const { return ::write(w, &c, 1) == 1; }
};

/// A connected pair of non-blocking stream sockets, closed after the loop that
/// used them (declare it first). An end may be handed over, as a pipe's.
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
        if (b >= 0) ::close(b);
    }
    socket_pair(const socket_pair&) = delete;
    socket_pair& operator=(const socket_pair&) = delete;
    int give_a() { return std::exchange(a, -1); }
    int give_b() { return std::exchange(b, -1); }
    /// recv on `b`: 0 once `a` is closed; -EAGAIN while `a` is open and silent.
    long peek_b() const {
        char c;
        const ssize_t n = ::recv(b, &c, 1, MSG_DONTWAIT | MSG_PEEK);
        return n < 0 ? -errno : static_cast<long>(n);
    }
};

/// A regular file (epoll refuses those with EPERM), already unlinked; the
/// caller closes it.
inline int regular_file() {
    std::string path = "/tmp/spindle-test-XXXXXX";
    const int fd = ::mkostemp(path.data(), O_CLOEXEC);
    REQUIRE(fd >= 0);
    ::unlink(path.c_str());
    return fd;
}

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

/// counted for any thread: a capture copied to a loop group's thread, a
/// value an offload job makes and a pool thread destroys.
struct tracked {
    static inline std::atomic<int> alive{0};
    tracked() noexcept { ++alive; }
    tracked(const tracked&) noexcept { ++alive; }
    tracked(tracked&&) noexcept { ++alive; }
    ~tracked() { --alive; }
    tracked& operator=(const tracked&) = default;
    int value() const noexcept { return 7; }
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
