#include "readiness_backend.hpp"

#include "syscall_op.hpp"

#include <spindle/reactor/buffer_pool.hpp>

#include <algorithm>
#include <cerrno>
#include <new>
#include <poll.h>

namespace spindle::reactor {

namespace {

// operation::backend_tag: which list holds a pending operation.
constexpr std::uint8_t in_fd_list = 1;
constexpr std::uint8_t in_deferred = 2;
constexpr std::uint8_t in_postponed = 3;
constexpr std::uint8_t in_processes = 4;

// libkqueue reads SO_ERROR to fill in an event's fflags, and reading it
// clears it: the syscall that follows finds no error (a refused connect looks
// connected, a reset connection reads as end of file). So an error an event
// carried is returned by the next operation on that fd that finds nothing
// better (0 or EAGAIN). A native kqueue leaves SO_ERROR in place: there the
// syscall reports the error itself, which settles it. (epoll's events carry
// no error: there it stays 0.)
std::int64_t with_reported_error(int& error, std::int64_t r) noexcept {
    if (error == 0 || r > 0) return r;
    if (r == 0 || r == -EAGAIN || r == -EWOULDBLOCK) r = -static_cast<std::int64_t>(error);
    error = 0;
    return r;
}

}  // namespace

void readiness_backend::op_list::push_back(operation& op) noexcept {
    op.next = nullptr;
    op.prev = tail;
    if (tail)
        tail->next = &op;
    else
        head = &op;
    tail = &op;
}

void readiness_backend::op_list::erase(operation& op) noexcept {
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

readiness_backend::readiness_backend(const backend_options& options)
    : m_read_buffer_size(options.read_buffer_size), m_read_buffer_batch(std::max<std::uint32_t>(options.read_buffer_batch, 1)) {
    m_fds.resize(256);
}

readiness_backend::~readiness_backend() {
    if (m_pool) m_pool->retire();
}

std::int64_t readiness_backend::receive_pooled(operation& op) noexcept {
    // A buffer is taken for the attempt and put back at once when nothing
    // was there: a receive waiting for readiness holds none.
    if (!m_pool) {
        m_pool = new (std::nothrow) buffer_pool(m_read_buffer_size);
        if (!m_pool) return -ENOMEM;
        publish(*m_pool);
    }
    std::uint32_t id;
    if (!m_pool->take(id)) return -ENOMEM;
    std::int64_t r;
    do {
        r = or_errno(sys::recv(op.fd, m_pool->address(id), m_pool->buffer_size(), op.flags));
    } while (r == -EINTR);
    if (r > 0) {
        op.args.pooled = {m_pool, id};
        m_pool->handed_over();
        return r;
    }
    m_pool->give_back(id);
    return r;
}

bool readiness_backend::batch_lent() const noexcept { return m_pool && m_pool->in_transit() >= m_read_buffer_batch; }

std::int64_t readiness_backend::transfer(operation& op) noexcept {
    return op.code == op_code::recv_pooled ? receive_pooled(op) : perform(op);
}

void readiness_backend::note_received(const operation& op, fd_state& st, std::int64_t r) const noexcept {
    // Only a receive that got some bytes but fewer than it had room for: end
    // of stream and errors stay sticky and must be found by the next receive
    // too, and a peek leaves the bytes where they were.
    if (!op.stream || r <= 0 || (op.flags & MSG_PEEK) || st.read_closed) return;
    std::size_t room;
    if (op.code == op_code::recv_pooled)
        room = m_pool->buffer_size();
    else if (op.code == op_code::recv || op.code == op_code::read)
        room = op.args.buf.size;
    else
        return;
    if (static_cast<std::size_t>(r) < room) st.drained = true;
}

readiness_backend::fd_state& readiness_backend::state_of(int fd) {
    auto index = static_cast<std::size_t>(fd);
    if (index >= m_fds.size()) m_fds.resize(std::max(index + 1, m_fds.size() * 2));
    return m_fds[index];
}

readiness_backend::op_list& readiness_backend::list_for(operation& op) noexcept {
    fd_state& st = m_fds[static_cast<std::size_t>(op.fd)];
    return is_reader(op) ? st.readers : st.writers;
}

bool readiness_backend::complete_now(operation& op, std::int64_t result) noexcept {
    op.result = result;
    op.state = op_state::done;
    return true;
}

bool readiness_backend::attempt(operation& op, fd_state& st) noexcept {
    std::int64_t r;
    if (op.code == op_code::connect && !op.connect_started) {
        op.connect_started = true;
        r = start_connect(op);
        if (r == -EINPROGRESS) return false;
    } else {
        r = with_reported_error(st.error, transfer(op));
        if (r == -EAGAIN || r == -EWOULDBLOCK) return false;
        note_received(op, st, r);
    }
    return complete_now(op, r);
}

void readiness_backend::park(operation& op, fd_state& st) noexcept {
    op.state = op_state::pending;
    (is_reader(op) ? st.readers : st.writers).push_back(op);
    op.backend_tag = in_fd_list;
}

bool readiness_backend::start_poll(operation& op, fd_state& st, std::uint32_t ready) noexcept {
    if (ready && !op.persistent) return complete_now(op, static_cast<std::int64_t>(ready));
    if (!ready) {
        park(op, st);
        return false;
    }
    // Persistent and ready already: complete it from the next poll().
    op.state = op_state::pending;
    op.result = static_cast<std::int64_t>(ready);
    m_deferred.push_back(op);
    op.backend_tag = in_deferred;
    // No event will come for it: make native_handle() readable so a host
    // polling that descriptor comes back to us.
    wake();
    return false;
}

void readiness_backend::complete_deferred() noexcept {
    // Pooled receives held back by the last poll go first, as far as the
    // tasks that ran since have taken their buffers.
    for (operation* op = m_postponed.head; op && !batch_lent();) {
        operation* next = op->next;
        m_postponed.erase(*op);
        fd_state& st = m_fds[static_cast<std::size_t>(op->fd)];
        const std::int64_t r = with_reported_error(st.error, receive_pooled(*op));
        if (r == -EAGAIN || r == -EWOULDBLOCK) {
            park(*op, st);
        } else {
            note_received(*op, st, r);
            finish(*op, r);
        }
        op = next;
    }
    if (!m_postponed.empty()) wake();  // a host polling native_handle() comes back for the rest
    while (operation* op = m_deferred.head) {
        m_deferred.erase(*op);
        park(*op, m_fds[static_cast<std::size_t>(op->fd)]);  // stays armed, with the fd's waiters
        ++m_completed;
        op->complete(*op);
    }
}

void readiness_backend::finish(operation& op, std::int64_t result) noexcept {
    op.backend_tag = 0;
    op.result = result;
    op.state = op_state::done;
    ++m_completed;
    op.complete(op);
}

void readiness_backend::unlink(operation& op) noexcept {
    if (op.backend_tag == in_deferred) {
        m_deferred.erase(op);
    } else if (op.backend_tag == in_postponed) {
        m_postponed.erase(op);
    } else if (op.backend_tag == in_processes) {
        m_processes.erase(op);
        if (!watching_process(op.fd)) unwatch_process(op.fd);
    } else {
        list_for(op).erase(op);
    }
    op.backend_tag = 0;
}

void readiness_backend::park_process(operation& op) noexcept {
    op.state = op_state::pending;
    m_processes.push_back(op);
    op.backend_tag = in_processes;
}

bool readiness_backend::watching_process(int pid) const noexcept {
    for (const operation* op = m_processes.head; op; op = op->next)
        if (op->fd == pid) return true;
    return false;
}

void readiness_backend::process_ended(int pid) noexcept {
    for (operation* op = m_processes.head; op;) {
        operation* next = op->next;
        if (op->fd == pid) {
            m_processes.erase(*op);
            finish(*op, 0);
        }
        op = next;
    }
}

void readiness_backend::cancel(operation& op) noexcept {
    if (!op.pending()) return;
    unlink(op);
    finish(op, -ECANCELED);
}

void readiness_backend::forget(operation& op) noexcept {
    if (!op.pending()) return;
    unlink(op);
    op.state = op_state::idle;
}

void readiness_backend::close_fd(int fd) noexcept {
    fd_state* st = known_state(static_cast<std::size_t>(fd));
    if (!st) return;
    // Events already collected for this fd carry the old generation and are dropped.
    ++st->generation;
    st->watched = 0;
    st->got = 0;
    st->error = 0;
    st->drained = false;
    st->read_closed = false;
    while (operation* op = st->readers.head) {
        st->readers.erase(*op);
        finish(*op, -ECANCELED);
    }
    while (operation* op = st->writers.head) {
        st->writers.erase(*op);
        finish(*op, -ECANCELED);
    }
    for (op_list* list : {&m_deferred, &m_postponed}) {
        for (operation* op = list->head; op;) {
            operation* next = op->next;
            if (op->fd == fd) {
                list->erase(*op);
                finish(*op, -ECANCELED);
            }
            op = next;
        }
    }
}

void readiness_backend::on_ready(fd_state& st, std::uint32_t got) {
    // Readiness waits for both directions are kept with the readers.
    if (got & readable) {
        st.drained = false;  // a new edge: data (or an end, an error) arrived since
        retry(st, st.readers, got, false);
    }
    else if (got & writable)
        retry(st, st.readers, got, true);
    if (got & writable) retry(st, st.writers, got, false);
}

void readiness_backend::retry(fd_state& st, op_list& list, std::uint32_t got, bool polls_only) {
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
        if (op->code == op_code::recv_pooled && batch_lent()) {
            // A batch of buffers is on its way to tasks that have not run
            // yet: the receive waits for the next poll, where it goes first.
            // Readers behind it wait too.
            list.erase(*op);
            m_postponed.push_back(*op);
            op->backend_tag = in_postponed;
            polls_only = true;
            op = next;
            continue;
        }
        const std::int64_t r = with_reported_error(st.error, op->code == op_code::connect ? finish_connect(*op) : transfer(*op));
        if (r == -EAGAIN || r == -EWOULDBLOCK) {
            // The rest must wait too, but readiness waits further on (a readable|
            // writable watcher kept with the readers) still hear of this event.
            polls_only = true;
            op = next;
            continue;
        }
        note_received(*op, st, r);
        list.erase(*op);
        finish(*op, r);
        op = next;
    }
}

// Current readiness of one fd, as poll(2) sees it, without waiting: for
// readiness waits, which an edge-triggered registration (EPOLLET, EV_CLEAR)
// only tells of changes.
std::uint32_t readiness_backend::ready_now(int fd, std::uint32_t events) noexcept {
    ::pollfd p{fd, 0, 0};
    if (events & readable) p.events |= POLLIN;
    if (events & writable) p.events |= POLLOUT;
    if (::poll(&p, 1, 0) <= 0) return 0;
    std::uint32_t got = 0;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) got |= readable;
    if (p.revents & (POLLOUT | POLLHUP | POLLERR)) got |= writable;
    return got & events;
}

::timespec* readiness_backend::to_timespec(std::chrono::nanoseconds timeout, ::timespec& ts) noexcept {
    if (timeout < std::chrono::nanoseconds::zero()) return nullptr;
    ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
    ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
    return &ts;
}

}  // namespace spindle::reactor
