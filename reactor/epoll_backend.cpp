#include "epoll_backend.hpp"

#include "syscall_op.hpp"

#include <algorithm>
#include <cerrno>
#include <limits>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <system_error>
#include <unistd.h>

namespace spindle::reactor {

namespace {

constexpr std::uint64_t wake_token = ~std::uint64_t{0};
constexpr int max_events = 256;
// operation::backend_tag: which list holds a pending operation.
constexpr std::uint8_t in_fd_list = 1;
constexpr std::uint8_t in_deferred = 2;

bool is_reader(const operation& op) noexcept {
    switch (op.code) {
        case op_code::read:
        case op_code::readv:
        case op_code::recv:
        case op_code::recvmsg:
        case op_code::accept: return true;
        case op_code::poll: return (op.events & readable) != 0;
        default: return false;
    }
}

std::uint64_t pack(int fd, std::uint32_t generation) noexcept {
    return (std::uint64_t{generation} << 32) | static_cast<std::uint32_t>(fd);
}

// Current readiness of one fd, without waiting: used where an edge-triggered
// registration cannot tell (a readiness wait on an fd already registered).
std::uint32_t ready_now(int fd, std::uint32_t events) noexcept {
    ::pollfd p{fd, 0, 0};
    if (events & readable) p.events |= POLLIN;
    if (events & writable) p.events |= POLLOUT;
    if (::poll(&p, 1, 0) <= 0) return 0;
    std::uint32_t got = 0;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) got |= readable;
    if (p.revents & (POLLOUT | POLLHUP | POLLERR)) got |= writable;
    return got & events;
}

}  // namespace

void epoll_backend::op_list::push_back(operation& op) noexcept {
    op.next = nullptr;
    op.prev = tail;
    if (tail)
        tail->next = &op;
    else
        head = &op;
    tail = &op;
}

void epoll_backend::op_list::erase(operation& op) noexcept {
    if (op.prev)
        op.prev->next = op.next;
    else
        head = op.next;
    if (op.next)
        op.next->prev = op.prev;
    else
        tail = op.prev;
    op.next = op.prev = nullptr;
}

epoll_backend::epoll_backend() {
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
    m_fds.resize(256);
}

epoll_backend::~epoll_backend() {
    ::close(m_wake_fd);
    ::close(m_epoll);
}

epoll_backend::fd_state& epoll_backend::state_of(int fd) {
    auto index = static_cast<std::size_t>(fd);
    if (index >= m_fds.size()) m_fds.resize(std::max(index + 1, m_fds.size() * 2));
    return m_fds[index];
}

epoll_backend::op_list& epoll_backend::list_for(operation& op) noexcept {
    fd_state& st = m_fds[static_cast<std::size_t>(op.fd)];
    return is_reader(op) ? st.readers : st.writers;
}

bool epoll_backend::ensure_registered(int fd, fd_state& st) {
    if (st.registered) return false;
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
    st.registered = true;
    return true;
}

void epoll_backend::wait_on(operation& op) {
    fd_state& st = state_of(op.fd);
    ensure_registered(op.fd, st);
    op.state = op_state::pending;
    (is_reader(op) ? st.readers : st.writers).push_back(op);
    op.backend_tag = in_fd_list;
}

bool epoll_backend::submit(operation& op) {
    if (op.fd < 0) {
        op.result = -EBADF;
        op.state = op_state::done;
        return true;
    }
    if (op.code == op_code::poll) {
        fd_state& st = state_of(op.fd);
        // A fresh edge-triggered registration reports the current readiness by
        // itself; an existing one only reports changes, so ask the kernel now.
        const bool fresh = ensure_registered(op.fd, st);
        std::uint32_t ready = fresh ? 0 : ready_now(op.fd, op.events);
        if (ready && !op.persistent) {
            op.result = static_cast<std::int64_t>(ready);
            op.state = op_state::done;
            return true;
        }
        op.state = op_state::pending;
        (is_reader(op) ? st.readers : st.writers).push_back(op);
        op.backend_tag = in_fd_list;
        if (ready) {
            // Persistent and ready already: complete it from the next poll().
            op.result = static_cast<std::int64_t>(ready);
            (is_reader(op) ? st.readers : st.writers).erase(op);
            m_deferred.push_back(op);
            op.backend_tag = in_deferred;
            // No event will come for it: make native_handle() readable so a host
            // polling that descriptor comes back to us.
            wake();
        }
        return false;
    }
    if (op.code == op_code::connect && !op.connect_started) {
        op.connect_started = true;
        std::int64_t r = start_connect(op);
        if (r != -EINPROGRESS) {
            op.result = r;
            op.state = op_state::done;
            return true;
        }
        wait_on(op);
        return false;
    }
    std::int64_t r = perform(op);
    if (r == -EAGAIN || r == -EWOULDBLOCK) {
        wait_on(op);
        return false;
    }
    op.result = r;
    op.state = op_state::done;
    return true;
}

void epoll_backend::finish(operation& op, std::int64_t result) noexcept {
    op.backend_tag = 0;
    op.result = result;
    op.state = op_state::done;
    ++m_completed;
    op.complete(op);
}

void epoll_backend::unlink(operation& op) noexcept {
    if (op.backend_tag == in_deferred)
        m_deferred.erase(op);
    else
        list_for(op).erase(op);
    op.backend_tag = 0;
}

void epoll_backend::cancel(operation& op) noexcept {
    if (!op.pending()) return;
    unlink(op);
    finish(op, -ECANCELED);
}

void epoll_backend::forget(operation& op) noexcept {
    if (!op.pending()) return;
    unlink(op);
    op.state = op_state::idle;
}

void epoll_backend::close_fd(int fd) noexcept {
    auto index = static_cast<std::size_t>(fd);
    if (fd < 0 || index >= m_fds.size()) return;
    fd_state& st = m_fds[index];
    // Events already collected for this fd carry the old generation and are dropped.
    ++st.generation;
    st.registered = false;
    while (operation* op = st.readers.head) {
        st.readers.erase(*op);
        finish(*op, -ECANCELED);
    }
    while (operation* op = st.writers.head) {
        st.writers.erase(*op);
        finish(*op, -ECANCELED);
    }
    for (operation* op = m_deferred.head; op;) {
        operation* next = op->next;
        if (op->fd == fd) {
            m_deferred.erase(*op);
            finish(*op, -ECANCELED);
        }
        op = next;
    }
}

void epoll_backend::retry(op_list& list) { retry(list, readable | writable, false); }

void epoll_backend::retry(op_list& list, std::uint32_t got, bool polls_only) {
    // Retry in arrival order; stop at the first that must wait again, so
    // waiters are served FIFO and no syscall is wasted.
    operation* op = list.head;
    while (op) {
        operation* next = op->next;
        if (op->code == op_code::poll) {
            std::uint32_t ready = op->events & got;
            if (!ready) {
                op = next;
                continue;
            }
            if (op->persistent) {
                op->result = ready;
                ++m_completed;
                op->complete(*op);  // stays armed
            } else {
                list.erase(*op);
                finish(*op, ready);
            }
            op = next;
            continue;
        }
        if (polls_only) {
            op = next;
            continue;
        }
        std::int64_t r = op->code == op_code::connect ? finish_connect(*op) : perform(*op);
        if (r == -EAGAIN || r == -EWOULDBLOCK) {
            // The rest must wait too, but readiness waits further on (a readable|
            // writable watcher kept with the readers) still hear of this event.
            polls_only = true;
            op = next;
            continue;
        }
        list.erase(*op);
        finish(*op, r);
        op = next;
    }
}

int epoll_backend::poll(std::chrono::nanoseconds timeout) {
    m_completed = 0;
    if (!m_deferred.empty()) timeout = std::chrono::nanoseconds::zero();

    ::epoll_event events[max_events];
    int n;
    if (m_pwait2) {
        ::timespec ts{};
        ::timespec* tsp = nullptr;
        if (timeout >= std::chrono::nanoseconds::zero()) {
            ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
            ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
            tsp = &ts;
        }
        n = ::epoll_pwait2(m_epoll, events, max_events, tsp, nullptr);
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

    while (operation* op = m_deferred.head) {
        m_deferred.erase(*op);
        fd_state& st = m_fds[static_cast<std::size_t>(op->fd)];
        (is_reader(*op) ? st.readers : st.writers).push_back(*op);
        op->backend_tag = in_fd_list;
        ++m_completed;
        op->complete(*op);
    }

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
        if (static_cast<std::size_t>(fd) >= m_fds.size()) continue;
        fd_state& st = m_fds[static_cast<std::size_t>(fd)];
        if (st.generation != generation) continue;  // closed since this event was queued
        const std::uint32_t e = events[i].events;
        std::uint32_t got = 0;
        if (e & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) got |= readable;
        if (e & (EPOLLOUT | EPOLLERR | EPOLLHUP)) got |= writable;
        // Readiness waits for both directions are kept with the readers.
        if (got & readable) retry(st.readers, got, false);
        else if (got & writable) retry(st.readers, got, true);
        if (got & writable) retry(st.writers, got, false);
    }
    return m_completed;
}

void epoll_backend::wake() noexcept {
    const std::uint64_t one = 1;
    // EAGAIN means the counter is saturated: the loop is woken anyway.
    [[maybe_unused]] auto r = ::write(m_wake_fd, &one, sizeof one);
}

}  // namespace spindle::reactor
