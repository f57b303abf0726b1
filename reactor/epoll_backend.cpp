#include "epoll_backend.hpp"

#include <algorithm>
#include <cerrno>
#include <limits>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <system_error>
#include <unistd.h>

namespace spindle::reactor {

namespace {

constexpr std::uint64_t wake_token = ~std::uint64_t{0};
constexpr int max_events = 256;

std::uint64_t pack(int fd, std::uint32_t generation) noexcept {
    return (std::uint64_t{generation} << 32) | static_cast<std::uint32_t>(fd);
}

}  // namespace

epoll_backend::epoll_backend(const backend_options& options) : readiness_backend(options) {
    m_epoll = ::epoll_create1(EPOLL_CLOEXEC);
    if (m_epoll < 0) throw std::system_error(errno, std::system_category(), "epoll_create1");
    m_wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (m_wake_fd < 0) {
        int err = errno;
        ::close(m_epoll);
        throw std::system_error(err, std::system_category(), "eventfd");
    }
    ::epoll_event ev{};
    ev.events = EPOLLIN | EPOLLET;
    ev.data.u64 = wake_token;
    if (::epoll_ctl(m_epoll, EPOLL_CTL_ADD, m_wake_fd, &ev) < 0) {
        int err = errno;
        ::close(m_wake_fd);
        ::close(m_epoll);
        throw std::system_error(err, std::system_category(), "epoll_ctl(eventfd)");
    }
}

epoll_backend::~epoll_backend() {
    ::close(m_wake_fd);
    ::close(m_epoll);
}

bool epoll_backend::ensure_registered(int fd, fd_state& st) {
    if (st.watched) return false;
    ::epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = pack(fd, st.generation);
    if (::epoll_ctl(m_epoll, EPOLL_CTL_ADD, fd, &ev) < 0) {
        if (errno != EEXIST) throw std::system_error(errno, std::system_category(), "epoll_ctl(ADD)");
        // Still registered from before a close we were not told about, or a dup:
        // take it over with our generation.
        if (::epoll_ctl(m_epoll, EPOLL_CTL_MOD, fd, &ev) < 0)
            throw std::system_error(errno, std::system_category(), "epoll_ctl(MOD)");
    }
    st.watched = readable | writable;
    return true;
}

bool epoll_backend::submit(operation& op) {
    // File operations never run on the loop's thread; a child's end is its pidfd's readiness here.
    if (is_file_op(op.code) || op.code == op_code::process_exit) return complete_now(op, -EOPNOTSUPP);
    if (op.fd < 0) return complete_now(op, -EBADF);
    op.connect_started = false;  // an operation used again starts a new connect
    fd_state& st = state_of(op.fd);
    if (op.code == op_code::poll) {
        // A fresh edge-triggered registration reports the current readiness by
        // itself; an existing one only reports changes, so ask the kernel now.
        const bool fresh = ensure_registered(op.fd, st);
        return start_poll(op, st, fresh ? 0 : ready_now(op.fd, op.events));
    }
    if (!st.watched && (op.code == op_code::read || op.code == op_code::write || op.code == op_code::readv ||
                        op.code == op_code::writev)) {
        // Maybe a regular file, which is always ready: the syscall would wait
        // for the disk on the loop's thread. epoll refuses to watch one
        // (EPERM), so registering first tells, once per descriptor; sockets
        // and pipes wait through this registration anyway. Any other error
        // (a closed descriptor) is the syscall's to report.
        try {
            ensure_registered(op.fd, st);
        } catch (const std::system_error& e) {
            if (e.code().value() == EPERM) throw;
        }
    }
    if (!drained_for(op, st) && attempt(op, st)) return true;
    ensure_registered(op.fd, st);
    park(op, st);
    return false;
}

int epoll_backend::poll(std::chrono::nanoseconds timeout) {
    m_completed = 0;
    if (has_deferred()) timeout = std::chrono::nanoseconds::zero();

    ::epoll_event events[max_events];
    int n;
    if (m_pwait2) {
        ::timespec ts{};
        n = ::epoll_pwait2(m_epoll, events, max_events, to_timespec(timeout, ts), nullptr);
        if (n < 0 && errno == ENOSYS) {
            m_pwait2 = false;
            return poll(timeout);
        }
    } else {
        // Milliseconds, rounded up: waking before the deadline would only make
        // the loop spin through zero-timeout polls until it arrives.
        int ms = -1;
        if (timeout >= std::chrono::nanoseconds::zero()) {
            constexpr std::int64_t max_ms = std::numeric_limits<int>::max();
            const std::int64_t whole_ms = timeout.count() / 1'000'000 + (timeout.count() % 1'000'000 != 0);
            ms = static_cast<int>(std::min(whole_ms, max_ms));
        }
        n = ::epoll_wait(m_epoll, events, max_events, ms);
    }
    if (n < 0) {
        if (errno == EINTR) return 0;
        throw std::system_error(errno, std::system_category(), "epoll_wait");
    }

    complete_deferred();

    for (int i = 0; i < n; ++i) {
        const std::uint64_t data = events[i].data.u64;
        if (data == wake_token) {
            std::uint64_t drained;
            while (::read(m_wake_fd, &drained, sizeof drained) > 0) {
            }
            continue;
        }
        const int fd = static_cast<int>(data & 0xffffffffu);
        const auto generation = static_cast<std::uint32_t>(data >> 32);
        fd_state* st = known_state(static_cast<std::size_t>(fd));
        if (!st || st->generation != generation) continue;  // closed since this event was queued
        const std::uint32_t e = events[i].events;
        std::uint32_t got = 0;
        if (e & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) got |= readable;
        if (e & (EPOLLRDHUP | EPOLLERR | EPOLLHUP)) st->read_closed = true;
        if (e & (EPOLLOUT | EPOLLERR | EPOLLHUP)) got |= writable;
        on_ready(*st, got);
    }
    return m_completed;
}

void epoll_backend::wake() noexcept {
    const std::uint64_t one = 1;
    // EAGAIN means the counter is saturated: the loop is woken anyway.
    [[maybe_unused]] auto r = ::write(m_wake_fd, &one, sizeof one);
}

}  // namespace spindle::reactor
