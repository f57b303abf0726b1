#include "kqueue_backend.hpp"

#include "syscall_op.hpp"

#include <sys/types.h>
#include <sys/event.h>
#include <sys/time.h>

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

}  // namespace

kqueue_backend::kqueue_backend(const backend_options& options) : readiness_backend(options) {
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
    // Reserved once: queueing a change or a failure never allocates.
    m_changes.reserve(max_events);
    m_failed.reserve(max_events);
    m_touched.reserve(max_events);
}

kqueue_backend::~kqueue_backend() { ::close(m_kq); }

void kqueue_backend::queue_filters(int fd, fd_state& st, std::uint32_t wanted) {
    for (std::uint32_t direction : {readable, writable}) {
        if (!(wanted & direction) || (st.watched & direction)) continue;
        if (m_changes.size() == static_cast<std::size_t>(max_events)) flush_changes();
        m_changes.push_back(filter_change(fd, direction, EV_ADD | EV_CLEAR, st.generation));
        st.watched |= static_cast<std::uint8_t>(direction);
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
        if ((wanted & direction) && !(st.watched & direction))
            changes[n++] = filter_change(fd, direction, EV_ADD | EV_CLEAR, st.generation);
    if (n == 0) return;
    const int r = apply_with_receipts(m_kq, changes, n);
    if (r < 0) throw std::system_error(-r, std::system_category(), "kevent(EV_ADD)");
    int error = 0;
    for (int i = 0; i < r; ++i) {
        if (changes[i].data != 0)
            error = static_cast<int>(changes[i].data);
        else
            st.watched |= static_cast<std::uint8_t>(direction_of(changes[i]));
    }
    if (error) throw std::system_error(error, std::system_category(), "kevent(EV_ADD)");
}

void kqueue_backend::flush() noexcept {
    if (m_changes.empty()) return;
    try {
        flush_changes();
    } catch (...) {
        // No memory to record a failure: the changes stay queued for poll().
    }
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
    fd_state* st = known_state(static_cast<std::size_t>(ev.ident));
    if (!st || st->generation != generation_of(ev)) return;  // closed since: its waiters are gone
    const std::uint32_t direction = direction_of(ev);
    st->watched &= static_cast<std::uint8_t>(~direction);
    const std::int64_t result = -static_cast<std::int64_t>(ev.data);
    for (op_list* list : {&st->readers, &st->writers}) {
        for (operation* op = list->head; op;) {
            operation* next = op->next;
            const std::uint32_t needs = op->code == op_code::poll ? op->events : (list == &st->readers ? readable : writable);
            if (needs & direction) {
                list->erase(*op);
                finish(*op, result);
            }
            op = next;
        }
    }
}

// EV_ONESHOT: a process ends once. Added at once, with its receipt: a child
// that had already ended is answered now, not by a poll() that never comes.
bool kqueue_backend::watch_process(operation& op) {
    const int pid = op.fd;
    if (pid <= 0) return complete_now(op, -EINVAL);
    if (!watching_process(pid)) {
        struct kevent ev {};
        EV_SET(&ev, static_cast<std::uintptr_t>(pid), EVFILT_PROC, EV_ADD | EV_ONESHOT, NOTE_EXIT, 0, to_udata(0));
        const int r = apply_with_receipts(m_kq, &ev, 1);
        if (r < 0) throw std::system_error(-r, std::system_category(), "kevent(EVFILT_PROC)");
        // ESRCH: no such process to watch, which some kernels say of one that
        // has ended and waits to be reaped. The caller's waitid says which.
        if (r == 1 && ev.data == ESRCH) return complete_now(op, 0);
        if (r == 1 && ev.data != 0) return complete_now(op, -static_cast<std::int64_t>(ev.data));
    }
    park_process(op);
    return false;
}

void kqueue_backend::unwatch_process(int pid) noexcept {
    struct kevent ev {};
    EV_SET(&ev, static_cast<std::uintptr_t>(pid), EVFILT_PROC, EV_DELETE, 0, 0, to_udata(0));
    // ENOENT when its event fired (and EV_ONESHOT dropped it) in this poll: fine.
    apply_with_receipts(m_kq, &ev, 1);
}

bool kqueue_backend::submit(operation& op) {
    if (is_file_op(op.code)) return complete_now(op, -EOPNOTSUPP);  // never on the loop's thread
    if (op.code == op_code::process_exit) return watch_process(op);
    if (op.fd < 0) return complete_now(op, -EBADF);
    op.connect_started = false;  // an operation used again starts a new connect
    fd_state& st = state_of(op.fd);
    if (op.code == op_code::poll) {
        add_filters_now(op.fd, st, op.events);
        // A filter already there only reports changes, so ask the kernel now,
        // as epoll does. Asked even for a filter just added: EVFILT_READ on a
        // regular file counts the bytes left and stays silent at its end,
        // where poll(2) (and epoll, which refuses such files) says readable.
        return start_poll(op, st, ready_now(op.fd, op.events));
    }
    if (attempt(op, st)) return true;
    // Must wait. The filter, if this fd lacks it, goes with the next poll():
    // an operation is only submitted by a task, and a tick polls after its
    // tasks ran before anyone can sleep on native_handle().
    queue_filters(op.fd, st, is_reader(op) ? readable : writable);
    park(op, st);
    return false;
}

int kqueue_backend::native_handle() const noexcept {
#if defined(LIBKQUEUE)
    return -1;
#else
    return m_kq;
#endif
}

void kqueue_backend::close_fd(int fd) noexcept {
    fd_state* st = known_state(static_cast<std::size_t>(fd));
    if (!st) return;
    // Queued filters must not reach whatever reuses the number.
    std::erase_if(m_changes, [fd](const struct kevent& ev) { return ev.ident == static_cast<std::uintptr_t>(fd); });
#if defined(LIBKQUEUE)
    // A native kqueue drops an fd's filters when it is closed. libkqueue cannot
    // see the close and would keep them (with an epoll registration the kernel
    // has dropped), so a reused number would never report: delete them now.
    if (st->watched) {
        struct kevent changes[2];
        int n = 0;
        for (std::uint32_t direction : {readable, writable})
            if (st->watched & direction) changes[n++] = filter_change(fd, direction, EV_DELETE, 0);
        // A filter still queued when we erased it above was never added: ENOENT, fine.
        apply_with_receipts(m_kq, changes, n);
    }
#endif
    // The rest (a new generation, the waiters cancelled) is every readiness backend's.
    readiness_backend::close_fd(fd);
}

int kqueue_backend::poll(std::chrono::nanoseconds timeout) {
    m_completed = 0;
    if (has_deferred() || !m_failed.empty()) timeout = std::chrono::nanoseconds::zero();

    // One call adds the filters queued since the last poll and waits. A change
    // that fails takes an event slot (EV_ERROR); there are never more changes
    // than slots, so each failure finds one.
    struct kevent events[max_events];
    ::timespec ts{};
    const int n = ::kevent(m_kq, m_changes.data(), static_cast<int>(m_changes.size()), events, max_events,
                           to_timespec(timeout, ts));
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

    complete_deferred();

    // kqueue reports each filter apart; gather one fd's directions first so
    // its waiters are retried once with both, as epoll's single event does.
    for (int i = 0; i < n; ++i) {
        const struct kevent& ev = events[i];
        if (ev.filter == EVFILT_USER) continue;  // wake(): EV_CLEAR has reset it
        if (ev.filter == EVFILT_PROC) {
            process_ended(static_cast<int>(ev.ident));  // EV_ONESHOT: the filter is gone
            continue;
        }
        if (ev.flags & EV_ERROR) {
            filter_failed(ev);
            continue;
        }
        fd_state* st = known_state(static_cast<std::size_t>(ev.ident));
        if (!st || st->generation != generation_of(ev)) continue;  // closed since this event was queued
        if (st->got == 0) m_touched.push_back(static_cast<int>(ev.ident));
        st->got |= static_cast<std::uint8_t>(direction_of(ev));
        if ((ev.flags & EV_EOF) && ev.fflags != 0) st->error = static_cast<int>(ev.fflags);
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
        on_ready(st, got);
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
