#include "kqueue_backend.hpp"

#include "syscall_op.hpp"

#include <sys/types.h>
#include <sys/event.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <poll.h>
#include <system_error>
#include <type_traits>
#include <unistd.h>
#include <utility>

namespace spindle::reactor {

namespace {

// EVFILT_USER identifiers are a namespace of their own: 0 clashes with no fd.
constexpr std::uintptr_t wake_ident = 0;
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

// The fd's generation rides in udata, as epoll's does in its data word:
// events collected for a descriptor closed since are recognised and dropped.
// udata is a pointer on FreeBSD, macOS and libkqueue, an intptr_t on older NetBSD.
using udata_t = decltype(std::declval<struct kevent&>().udata);

template <class U = udata_t>
U to_udata(std::uint32_t generation) noexcept {
    if constexpr (std::is_pointer_v<U>)
        return reinterpret_cast<U>(static_cast<std::uintptr_t>(generation));
    else
        return static_cast<U>(generation);
}

template <class U>
std::uint32_t from_udata(U udata) noexcept {
    if constexpr (std::is_pointer_v<U>)
        return static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(udata));
    else
        return static_cast<std::uint32_t>(udata);
}

std::uint32_t generation_of(const struct kevent& ev) noexcept { return from_udata(ev.udata); }

// EV_CLEAR: the filter reports a change of state (new data, new room) once and
// then resets, like EPOLLET. It stays armed, so a waiting operation costs no
// change at all once its fd has the filter. EV_ONESHOT or EV_DISPATCH would
// need an EV_ADD or EV_ENABLE per wait, and persistent polls want every edge.
struct kevent filter_change(int fd, std::uint32_t direction, unsigned short flags, std::uint32_t generation) noexcept {
    struct kevent ev {};
    EV_SET(&ev, static_cast<std::uintptr_t>(fd), direction == readable ? EVFILT_READ : EVFILT_WRITE, flags, 0, 0,
           to_udata(generation));
    return ev;
}

std::uint32_t direction_of(const struct kevent& ev) noexcept {
    if (ev.filter == EVFILT_READ) return readable;
    if (ev.filter == EVFILT_WRITE) return writable;
    return 0;
}

// Current readiness of one fd, without waiting, as poll(2) sees it: for
// readiness waits, which an EV_CLEAR filter only tells of changes.
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

// Sends `n` changes marked EV_RECEIPT with exactly `n` result slots: each
// change gets its result (data = 0 or an errno) and no slot is left over, so
// no pending event is taken out of the queue here. The array serves as both
// lists, which kevent(2) allows. Returns the number of results or -errno.
// (It never sleeps, so EINTR does not come up.)
int apply_with_receipts(int kq, struct kevent* changes, int n) noexcept {
    for (int i = 0; i < n; ++i) changes[i].flags |= EV_RECEIPT;
    const ::timespec zero{};
    const int r = ::kevent(kq, changes, n, changes, n, &zero);
    return r < 0 ? -errno : r;
}

// libkqueue reads SO_ERROR to fill in an event's fflags, and reading it
// clears it: the syscall that follows finds no error (a refused connect looks
// connected, a reset connection reads as end of file). So an error an event
// carried is returned by the next operation on that fd that finds nothing
// better (0 or EAGAIN). A native kqueue leaves SO_ERROR in place: there the
// syscall reports the error itself, which settles it.
std::int64_t with_reported_error(int& error, std::int64_t r) noexcept {
    if (error == 0 || r > 0) return r;
    if (r == 0 || r == -EAGAIN || r == -EWOULDBLOCK) r = -static_cast<std::int64_t>(error);
    error = 0;
    return r;
}

}  // namespace

void kqueue_backend::op_list::push_back(operation& op) noexcept {
    op.next = nullptr;
    op.prev = tail;
    if (tail)
        tail->next = &op;
    else
        head = &op;
    tail = &op;
}

void kqueue_backend::op_list::erase(operation& op) noexcept {
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

kqueue_backend::kqueue_backend() {
    m_kq = ::kqueue();
    if (m_kq < 0) throw std::system_error(errno, std::system_category(), "kqueue");
    // A kqueue is not inherited by fork(), but its descriptor would survive exec().
    ::fcntl(m_kq, F_SETFD, FD_CLOEXEC);
    // wake(): a user event, EV_CLEAR so that retrieving it resets it (nothing
    // to drain, unlike epoll's eventfd).
    struct kevent ev {};
    EV_SET(&ev, wake_ident, EVFILT_USER, EV_ADD | EV_CLEAR, 0, 0, to_udata(0));
    if (::kevent(m_kq, &ev, 1, nullptr, 0, nullptr) < 0) {
        const int err = errno;
        ::close(m_kq);
        throw std::system_error(err, std::system_category(), "kevent(EVFILT_USER)");
    }
    m_fds.resize(256);
    // Reserved once: queueing a change or a failure never allocates.
    m_changes.reserve(max_events);
    m_failed.reserve(max_events);
    m_touched.reserve(max_events);
}

kqueue_backend::~kqueue_backend() { ::close(m_kq); }

kqueue_backend::fd_state& kqueue_backend::state_of(int fd) {
    auto index = static_cast<std::size_t>(fd);
    if (index >= m_fds.size()) m_fds.resize(std::max(index + 1, m_fds.size() * 2));
    return m_fds[index];
}

kqueue_backend::op_list& kqueue_backend::list_for(operation& op) noexcept {
    fd_state& st = m_fds[static_cast<std::size_t>(op.fd)];
    return is_reader(op) ? st.readers : st.writers;
}

void kqueue_backend::queue_filters(int fd, fd_state& st, std::uint32_t wanted) {
    for (std::uint32_t direction : {readable, writable}) {
        if (!(wanted & direction) || (st.filters & direction)) continue;
        if (m_changes.size() == static_cast<std::size_t>(max_events)) flush_changes();
        m_changes.push_back(filter_change(fd, direction, EV_ADD | EV_CLEAR, st.generation));
        st.filters |= static_cast<std::uint8_t>(direction);
    }
}

// Readiness waits add their filters at once: a watcher is often made outside
// any tick by a host that then sleeps on native_handle(), and a change still
// queued here would leave its first readiness unseen. A failure is reported
// to the caller, as epoll_ctl's is.
void kqueue_backend::add_filters_now(int fd, fd_state& st, std::uint32_t wanted) {
    struct kevent changes[2];
    int n = 0;
    for (std::uint32_t direction : {readable, writable})
        if ((wanted & direction) && !(st.filters & direction))
            changes[n++] = filter_change(fd, direction, EV_ADD | EV_CLEAR, st.generation);
    if (n == 0) return;
    const int r = apply_with_receipts(m_kq, changes, n);
    if (r < 0) throw std::system_error(-r, std::system_category(), "kevent(EV_ADD)");
    int error = 0;
    for (int i = 0; i < r; ++i) {
        if (changes[i].data != 0)
            error = static_cast<int>(changes[i].data);
        else
            st.filters |= static_cast<std::uint8_t>(direction_of(changes[i]));
    }
    if (error) throw std::system_error(error, std::system_category(), "kevent(EV_ADD)");
}

// The queue is full (max_events fds had to wait for the first time in one
// tick): send it now. Failures wait in m_failed for poll() to report.
void kqueue_backend::flush_changes() {
    const int r = apply_with_receipts(m_kq, m_changes.data(), static_cast<int>(m_changes.size()));
    if (r < 0) {
        // Nothing says which changes were made: report every one as failed.
        for (struct kevent& ev : m_changes) ev.data = -r;
        m_failed.insert(m_failed.end(), m_changes.begin(), m_changes.end());
    } else {
        for (int i = 0; i < r; ++i)
            if (m_changes[static_cast<std::size_t>(i)].data != 0) m_failed.push_back(m_changes[static_cast<std::size_t>(i)]);
    }
    m_changes.clear();
}

// A filter could not be added (the fd was closed behind our back, or the
// kernel refuses that kind of file): whoever waits on that direction would
// wait forever, so complete them with the error.
void kqueue_backend::filter_failed(const struct kevent& ev) noexcept {
    const auto index = static_cast<std::size_t>(ev.ident);
    if (index >= m_fds.size()) return;
    fd_state& st = m_fds[index];
    if (st.generation != generation_of(ev)) return;  // closed since: its waiters are gone
    const std::uint32_t direction = direction_of(ev);
    st.filters &= static_cast<std::uint8_t>(~direction);
    const std::int64_t result = -static_cast<std::int64_t>(ev.data);
    for (op_list* list : {&st.readers, &st.writers}) {
        for (operation* op = list->head; op;) {
            operation* next = op->next;
            const std::uint32_t needs = op->code == op_code::poll ? op->events : (list == &st.readers ? readable : writable);
            if (needs & direction) {
                list->erase(*op);
                finish(*op, result);
            }
            op = next;
        }
    }
}

bool kqueue_backend::submit(operation& op) {
    if (op.fd < 0) {
        op.result = -EBADF;
        op.state = op_state::done;
        return true;
    }
    if (op.code == op_code::poll) {
        fd_state& st = state_of(op.fd);
        add_filters_now(op.fd, st, op.events);
        // A filter already there only reports changes, so ask the kernel now,
        // as epoll does. Asked even for a filter just added: EVFILT_READ on a
        // regular file counts the bytes left and stays silent at its end,
        // where poll(2) (and epoll, which refuses such files) says readable.
        const std::uint32_t ready = ready_now(op.fd, op.events);
        if (ready && !op.persistent) {
            op.result = static_cast<std::int64_t>(ready);
            op.state = op_state::done;
            return true;
        }
        op.state = op_state::pending;
        if (ready) {
            // Persistent and ready already: complete it from the next poll().
            op.result = static_cast<std::int64_t>(ready);
            m_deferred.push_back(op);
            op.backend_tag = in_deferred;
            // No event will come for it: make native_handle() readable so a host
            // polling that descriptor comes back to us.
            wake();
        } else {
            (is_reader(op) ? st.readers : st.writers).push_back(op);
            op.backend_tag = in_fd_list;
        }
        return false;
    }
    fd_state& st = state_of(op.fd);
    if (op.code == op_code::connect && !op.connect_started) {
        op.connect_started = true;
        const std::int64_t r = start_connect(op);
        if (r != -EINPROGRESS) {
            op.result = r;
            op.state = op_state::done;
            return true;
        }
    } else {
        const std::int64_t r = with_reported_error(st.error, perform(op));
        if (r != -EAGAIN && r != -EWOULDBLOCK) {
            op.result = r;
            op.state = op_state::done;
            return true;
        }
    }
    // Must wait. The filter, if this fd lacks it, goes with the next poll():
    // an operation is only submitted by a task, and a tick polls after its
    // tasks ran before anyone can sleep on native_handle().
    const bool reader = is_reader(op);
    queue_filters(op.fd, st, reader ? readable : writable);
    op.state = op_state::pending;
    (reader ? st.readers : st.writers).push_back(op);
    op.backend_tag = in_fd_list;
    return false;
}

int kqueue_backend::native_handle() const noexcept {
#if defined(LIBKQUEUE)
    return -1;
#else
    return m_kq;
#endif
}

void kqueue_backend::finish(operation& op, std::int64_t result) noexcept {
    op.backend_tag = 0;
    op.result = result;
    op.state = op_state::done;
    ++m_completed;
    op.complete(op);
}

void kqueue_backend::unlink(operation& op) noexcept {
    if (op.backend_tag == in_deferred)
        m_deferred.erase(op);
    else
        list_for(op).erase(op);
    op.backend_tag = 0;
}

void kqueue_backend::cancel(operation& op) noexcept {
    if (!op.pending()) return;
    unlink(op);
    finish(op, -ECANCELED);
}

void kqueue_backend::forget(operation& op) noexcept {
    if (!op.pending()) return;
    unlink(op);
    op.state = op_state::idle;
}

void kqueue_backend::close_fd(int fd) noexcept {
    auto index = static_cast<std::size_t>(fd);
    if (fd < 0 || index >= m_fds.size()) return;
    fd_state& st = m_fds[index];
    // Events already collected for this fd carry the old generation and are dropped.
    ++st.generation;
    st.got = 0;
    st.error = 0;
    const std::uint8_t had = st.filters;
    st.filters = 0;
    // Queued filters must not reach whatever reuses the number.
    std::erase_if(m_changes, [fd](const struct kevent& ev) { return ev.ident == static_cast<std::uintptr_t>(fd); });
#if defined(LIBKQUEUE)
    // A native kqueue drops an fd's filters when it is closed. libkqueue cannot
    // see the close and would keep them (with an epoll registration the kernel
    // has dropped), so a reused number would never report: delete them now.
    if (had) {
        struct kevent changes[2];
        int n = 0;
        for (std::uint32_t direction : {readable, writable})
            if (had & direction) changes[n++] = filter_change(fd, direction, EV_DELETE, 0);
        // A filter still queued when we erased it above was never added: ENOENT, fine.
        apply_with_receipts(m_kq, changes, n);
    }
#else
    (void)had;
#endif
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

void kqueue_backend::retry(fd_state& st, op_list& list, std::uint32_t got, bool polls_only) {
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
        const std::int64_t r = with_reported_error(st.error, op->code == op_code::connect ? finish_connect(*op) : perform(*op));
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

int kqueue_backend::poll(std::chrono::nanoseconds timeout) {
    m_completed = 0;
    if (!m_deferred.empty() || !m_failed.empty()) timeout = std::chrono::nanoseconds::zero();

    ::timespec ts{};
    ::timespec* tsp = nullptr;
    if (timeout >= std::chrono::nanoseconds::zero()) {
        ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
        ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
        tsp = &ts;
    }
    // One call adds the filters queued since the last poll and waits. A change
    // that fails takes an event slot (EV_ERROR); there are never more changes
    // than slots, so each failure finds one.
    struct kevent events[max_events];
    const int n = ::kevent(m_kq, m_changes.data(), static_cast<int>(m_changes.size()), events, max_events, tsp);
    if (n < 0) {
        // EINTR comes from the wait, after the changes were made.
        if (errno == EINTR) {
            m_changes.clear();
            return 0;
        }
        throw std::system_error(errno, std::system_category(), "kevent");
    }
    m_changes.clear();

    for (const struct kevent& ev : m_failed) filter_failed(ev);
    m_failed.clear();

    while (operation* op = m_deferred.head) {
        m_deferred.erase(*op);
        fd_state& st = m_fds[static_cast<std::size_t>(op->fd)];
        (is_reader(*op) ? st.readers : st.writers).push_back(*op);
        op->backend_tag = in_fd_list;
        ++m_completed;
        op->complete(*op);
    }

    // kqueue reports each filter apart; gather one fd's directions first so
    // its waiters are retried once with both, as epoll's single event does.
    for (int i = 0; i < n; ++i) {
        const struct kevent& ev = events[i];
        if (ev.filter == EVFILT_USER) continue;  // wake(): EV_CLEAR has reset it
        if (ev.flags & EV_ERROR) {
            filter_failed(ev);
            continue;
        }
        const auto index = static_cast<std::size_t>(ev.ident);
        if (index >= m_fds.size()) continue;
        fd_state& st = m_fds[index];
        if (st.generation != generation_of(ev)) continue;  // closed since this event was queued
        if (st.got == 0) m_touched.push_back(static_cast<int>(ev.ident));
        st.got |= static_cast<std::uint8_t>(direction_of(ev));
        if ((ev.flags & EV_EOF) && ev.fflags != 0) st.error = static_cast<int>(ev.fflags);
    }
#if defined(LIBKQUEUE)
    // libkqueue takes up to `max_events` epoll events and turns each into one
    // kevent per filter; when they do not fit, it drops the rest, and with
    // EV_CLEAR (EPOLLET) nothing reports them again. A full array may hide
    // such a loss: ask poll(2) about every fd that has waiters. A native kqueue
    // leaves what did not fit queued for the next call.
    if (n == max_events) recheck_waiting_fds();
#endif
    for (int fd : m_touched) {
        fd_state& st = m_fds[static_cast<std::size_t>(fd)];
        const std::uint32_t got = std::exchange(st.got, std::uint8_t{0});
        if (!got) continue;  // closed while an earlier fd was served
        // Readiness waits for both directions are kept with the readers.
        if (got & readable)
            retry(st, st.readers, got, false);
        else if (got & writable)
            retry(st, st.readers, got, true);
        if (got & writable) retry(st, st.writers, got, false);
    }
    m_touched.clear();
    return m_completed;
}

#if defined(LIBKQUEUE)
void kqueue_backend::recheck_waiting_fds() {
    std::vector<::pollfd> fds;
    for (std::size_t fd = 0; fd < m_fds.size(); ++fd) {
        const fd_state& st = m_fds[fd];
        short events = 0;
        if (!st.readers.empty()) events |= POLLIN | POLLOUT;  // readable|writable polls wait with the readers
        if (!st.writers.empty()) events |= POLLOUT;
        if (events) fds.push_back({static_cast<int>(fd), events, 0});
    }
    if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return;
    for (const ::pollfd& p : fds) {
        std::uint8_t got = 0;
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) got |= readable;
        if (p.revents & (POLLOUT | POLLHUP | POLLERR)) got |= writable;
        if (!got) continue;
        fd_state& st = m_fds[static_cast<std::size_t>(p.fd)];
        if (st.got == 0) m_touched.push_back(p.fd);
        st.got |= got;
    }
}
#endif

void kqueue_backend::wake() noexcept {
    // A plain syscall on a native kqueue, so it is safe in a signal handler.
    // (libkqueue emulates kevent() in user space behind a mutex: there, call
    // wake() from threads, not from signal handlers.)
    struct kevent ev {};
    EV_SET(&ev, wake_ident, EVFILT_USER, 0, NOTE_TRIGGER, 0, to_udata(0));
    [[maybe_unused]] const int r = ::kevent(m_kq, &ev, 1, nullptr, 0, nullptr);
}

}  // namespace spindle::reactor
