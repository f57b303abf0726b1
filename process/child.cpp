#include "reaper.hpp"
#include "wait_status.hpp"

#include <spindle/loop.hpp>
#include <spindle/process.hpp>
#include <spindle/signal.hpp>

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

namespace spindle::process {

namespace {

std::error_code os_error(int e) noexcept { return {e, std::system_category()}; }

#ifdef __linux__
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif
int send_by_pidfd(int pidfd, int signo) noexcept {
    return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, signo, nullptr, 0));
}
#else
int send_by_pidfd(int, int) noexcept {
    errno = ENOSYS;
    return -1;
}
#endif

}  // namespace

child::child(child&& other) noexcept
    : m_pid(std::exchange(other.m_pid, -1)),
      m_pidfd(std::move(other.m_pidfd)),
      m_waiting(other.m_waiting),
      m_kill_on_destroy(other.m_kill_on_destroy),
      m_group(other.m_group),
      m_status(std::exchange(other.m_status, std::nullopt)),
      m_stdin(std::move(other.m_stdin)),
      m_stdout(std::move(other.m_stdout)),
      m_stderr(std::move(other.m_stderr)) {}

child& child::operator=(child&& other) noexcept {
    if (this != &other) {
        release();
        m_pid = std::exchange(other.m_pid, -1);
        m_pidfd = std::move(other.m_pidfd);
        m_waiting = other.m_waiting;
        m_kill_on_destroy = other.m_kill_on_destroy;
        m_group = other.m_group;
        m_status = std::exchange(other.m_status, std::nullopt);
        m_stdin = std::move(other.m_stdin);
        m_stdout = std::move(other.m_stdout);
        m_stderr = std::move(other.m_stderr);
    }
    return *this;
}

child::~child() { release(); }

void child::release() noexcept {
    // The pipes first: a child blocked writing to a full pipe, or reading
    // one, then sees the end of it (EPIPE, or end of input) and may end.
    m_stdin.close();
    m_stdout.close();
    m_stderr.close();
    if (m_pid > 0 && !m_status) {
        result<std::optional<exit_status>> now = detail::reap_if_ended(m_pidfd.get(), m_pid);
        if (now && !*now) {
            if (m_kill_on_destroy) (void)kill(SIGKILL);
            // The reaper gets a descriptor of its own: ours is closed
            // through the loop that may be watching it.
            const int handed = m_pidfd ? ::fcntl(m_pidfd.get(), F_DUPFD_CLOEXEC, 3) : -1;
            // Without a copy (EMFILE) the reaper looks for it by pid.
            detail::hand_to_reaper(handed, m_pid);
        }
    }
    m_pidfd.reset();
    m_pid = -1;
    m_status.reset();
}

result<std::optional<exit_status>> child::try_wait() {
    if (m_status) return m_status;
    if (m_pid <= 0) return make_error_code(std::errc::invalid_argument);
    result<std::optional<exit_status>> now = detail::reap_if_ended(m_pidfd.get(), m_pid);
    if (now && *now) m_status = *now;
    return now;
}

task<result<exit_status>> child::wait(std::stop_token token) {
    if (m_status) co_return *m_status;
    if (m_pid <= 0) co_return make_error_code(std::errc::invalid_argument);
    // By SIGCHLD: the loop catches it before the first look, so that a child
    // ending between that look and the wait leaves the signal kept. Every
    // waiter wakes on each delivery and looks for its own child only
    // (waitid by pid): deliveries coalesce, and children that the
    // application started itself are never reaped here.
    // A kqueue sees the end itself (EVFILT_PROC): no signal, no race, since
    // a filter added for a child that has already ended fires at once.
    const bool on_kqueue = loop::current().backend() == backend_kind::kqueue;
    const bool by_filter = !m_pidfd &&
                           (m_waiting == wait_method::kqueue || (m_waiting == wait_method::automatic && on_kqueue));
    if (by_filter && !on_kqueue) co_return make_error_code(std::errc::operation_not_supported);
    if (!m_pidfd && !by_filter) loop::current().catch_signal(SIGCHLD);
    m_pidfd.adopt_current_loop();
    for (;;) {
        result<std::optional<exit_status>> now = try_wait();
        if (!now) co_return now.error();
        if (*now) co_return **now;
        if (m_pidfd) {
            // A pidfd is readable once its process has ended.
            result<int> ready = co_await wait_readable(m_pidfd.get(), token);
            if (!ready) co_return ready.error();
        } else if (by_filter) {
            spindle::detail::io_request ended;
            ended.fd = m_pid;
            ended.code = spindle::detail::io_code::process_exit;
            result<int> exited = co_await io_awaiter<int>(token, ended);
            if (!exited) co_return exited.error();
        } else {
            result<int> signalled = co_await wait_signal(SIGCHLD, token);
            if (!signalled) co_return signalled.error();
        }
    }
}

result<void> child::kill(int signo) {
    if (m_pid <= 0) return make_error_code(std::errc::invalid_argument);
    if (m_status) return make_error_code(std::errc::no_such_process);
    if (m_pidfd) {
        if (send_by_pidfd(m_pidfd.get(), signo) != 0) return os_error(errno);
        return {};
    }
    // Unreaped, so the pid is still this child's.
    if (::kill(m_pid, signo) != 0) return os_error(errno);
    return {};
}

result<void> child::kill_group(int signo) {
    if (m_pid <= 0 || !m_group) return make_error_code(std::errc::invalid_argument);
    if (m_status) return make_error_code(std::errc::no_such_process);
    // The group outlives its leader's end only until the leader is reaped;
    // unreaped, its pgid cannot have been reused.
    if (::killpg(m_pid, signo) != 0) return os_error(errno);
    return {};
}

}  // namespace spindle::process
