// The core of the io_uring backend: slots, requests and their cancels, the
// backend interface and the dispatch of completions. Making the ring is in
// io_uring_setup.cpp, pooled receives and their buffer ring in
// io_uring_buffers.cpp.

#include "io_uring_backend.hpp"
#include "io_uring_ring_pool.hpp"

#include "syscall_op.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <fcntl.h>
#include <poll.h>
#include <stdexcept>
#include <sys/socket.h>
#include <sys/stat.h>
#include <system_error>
#include <thread>
#include <unistd.h>
#include <vector>

namespace spindle::reactor {

namespace {

// read(2) and write(2) never move more than this in one call (MAX_RW_COUNT);
// a request's length is 32 bits, so larger spans are cut the same way.
constexpr std::size_t max_rw = 0x7ffff000;

unsigned file_size(const operation& op) noexcept { return static_cast<unsigned>(std::min(op.args.file->size, max_rw)); }

unsigned poll_mask(std::uint32_t events) noexcept {
    unsigned mask = 0;
    if (events & readable) mask |= POLLIN | POLLRDHUP;
    if (events & writable) mask |= POLLOUT;
    return mask;
}

// A poll completion's mask as the backend-neutral bits the operation asked for.
std::int64_t poll_result(const operation& op, std::int32_t res) noexcept {
    const auto mask = static_cast<std::uint32_t>(res);
    std::uint32_t got = 0;
    if (mask & (POLLIN | POLLPRI | POLLRDHUP | POLLERR | POLLHUP)) got |= readable;
    if (mask & (POLLOUT | POLLERR | POLLHUP)) got |= writable;
    got &= op.events;
    // The kernel reports only what was asked, plus errors and hang-ups, which
    // count for both directions, so `got` is never empty; were it ever, 0
    // would read as "not ready" to the owner, so report what was asked.
    return got ? got : op.events;
}

bool transient(int r) noexcept { return r == -EINTR || r == -EAGAIN || r == -EBUSY; }

}  // namespace

// --- slots -------------------------------------------------------------------

std::uint32_t io_uring_backend::allocate_slot(operation& op) {
    std::uint32_t index = m_free_head;
    if (index == no_slot) {
        m_slots.emplace_back();
        index = static_cast<std::uint32_t>(m_slots.size() - 1);
    } else {
        m_free_head = m_slots[index].next_free;
    }
    slot& s = m_slots[index];
    s.op = &op;
    s.state = slot_state::in_kernel;
    s.cancel_requested = false;
    s.awaiting_readiness = false;
    s.pooled_plain = false;
    s.ring_was_dry = false;
    s.closed = false;
    s.next_waiter = no_slot;
    return index;
}

void io_uring_backend::release_slot(std::uint32_t index) noexcept {
    slot& s = m_slots[index];
    s.op = nullptr;
    s.state = slot_state::free;
    s.cancel_requested = false;
    s.awaiting_readiness = false;
    s.pooled_plain = false;
    s.ring_was_dry = false;
    s.closed = false;
    // A completion still travelling under the old generation will not match.
    s.generation = next_generation(s.generation);
    s.next_free = m_free_head;
    m_free_head = index;
}

std::uint64_t io_uring_backend::user_data_of(std::uint32_t index) const noexcept {
    return (std::uint64_t{m_slots[index].generation} << 32) | index;
}

bool io_uring_backend::lookup(const operation& op, std::uint32_t& index) const noexcept {
    index = op.backend_slot;
    return index < m_slots.size() && m_slots[index].op == &op && m_slots[index].state != slot_state::free;
}

void io_uring_backend::link_fd(operation& op) noexcept {
    // A path operation in AT_FDCWD waits on no descriptor: close_fd never
    // cancels it.
    if (op.fd < 0) return;
    // submit() made room for this descriptor number.
    operation*& head = m_by_fd[static_cast<std::size_t>(op.fd)];
    op.prev = nullptr;
    op.next = head;
    if (head) head->prev = &op;
    head = &op;
}

void io_uring_backend::unlink_fd(operation& op) noexcept {
    if (op.fd < 0) return;
    if (op.prev)
        op.prev->next = op.next;
    else
        m_by_fd[static_cast<std::size_t>(op.fd)] = op.next;
    if (op.next) op.next->prev = op.prev;
    op.next = op.prev = nullptr;
}

// --- requests ----------------------------------------------------------------

::io_uring_sqe* io_uring_backend::get_sqe() noexcept {
    // A full submission queue is sent at once and reused, never dropped. The
    // bound only guards against a ring that keeps refusing.
    for (int attempt = 0; attempt < 64; ++attempt) {
        if (::io_uring_sqe* sqe = ::io_uring_get_sqe(&m_ring)) return sqe;
        const int r = ::io_uring_submit(&m_ring);
        if (r == -EBUSY || r == -EAGAIN)
            collect();  // completions are backing up: take them out to make room
        else if (r < 0 && r != -EINTR)
            return nullptr;
    }
    return nullptr;
}

bool io_uring_backend::queue_request(std::uint32_t index) noexcept {
    slot& s = m_slots[index];
    operation& op = *s.op;
    ::io_uring_sqe* sqe = get_sqe();
    if (!sqe) return false;
    const int fd = op.fd;
    if (s.awaiting_readiness) {
        ::io_uring_prep_poll_add(sqe, fd, is_reader(op) ? POLLIN | POLLRDHUP : POLLOUT);
    } else {
        // Offset -1: the file's own position, as read(2) and write(2) use it.
        constexpr auto current_position = static_cast<std::uint64_t>(-1);
        const auto size = [&op] { return static_cast<unsigned>(std::min(op.args.buf.size, max_rw)); };
        switch (op.code) {
            case op_code::read: ::io_uring_prep_read(sqe, fd, op.args.buf.data, size(), current_position); break;
            case op_code::write: ::io_uring_prep_write(sqe, fd, op.args.buf.data, size(), current_position); break;
            case op_code::readv:
                ::io_uring_prep_readv(sqe, fd, op.args.vec.iov, static_cast<unsigned>(op.args.vec.count), current_position);
                break;
            case op_code::writev:
                ::io_uring_prep_writev(sqe, fd, op.args.vec.iov, static_cast<unsigned>(op.args.vec.count), current_position);
                break;
            case op_code::recv: ::io_uring_prep_recv(sqe, fd, op.args.buf.data, size(), op.flags); break;
            case op_code::recv_pooled:
                if (s.pooled_plain) {
                    ::io_uring_prep_recv(sqe, fd, m_pool->address(op.args.pooled.id), m_pool->buffer_size(), op.flags);
                } else {
                    ::io_uring_prep_recv(sqe, fd, nullptr, m_pool->buffer_size(), op.flags);
                    sqe->flags |= IOSQE_BUFFER_SELECT;
                    sqe->buf_group = ring_pool::group;
                }
                break;
            // MSG_NOSIGNAL: a closed peer is EPIPE, never a SIGPIPE that kills the process.
            case op_code::send: ::io_uring_prep_send(sqe, fd, op.args.buf.data, size(), op.flags | MSG_NOSIGNAL); break;
            case op_code::recvmsg: ::io_uring_prep_recvmsg(sqe, fd, op.args.msg, static_cast<unsigned>(op.flags)); break;
            case op_code::sendmsg:
                ::io_uring_prep_sendmsg(sqe, fd, op.args.msg, static_cast<unsigned>(op.flags | MSG_NOSIGNAL));
                break;
            case op_code::accept:
                ::io_uring_prep_accept(sqe, fd, op.args.accept.addr, op.args.accept.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
                break;
            // The completion is the connect's own outcome (0, -ECONNREFUSED...):
            // the kernel reads SO_ERROR for us.
            case op_code::connect: ::io_uring_prep_connect(sqe, fd, op.args.connect.addr, op.args.connect.len); break;
            case op_code::read_at:
                ::io_uring_prep_read(sqe, fd, op.args.file->data, file_size(op), op.args.file->offset);
                break;
            case op_code::write_at:
                ::io_uring_prep_write(sqe, fd, op.args.file->data, file_size(op), op.args.file->offset);
                break;
            case op_code::readv_at:
                ::io_uring_prep_readv(sqe, fd, op.args.file->iov, static_cast<unsigned>(op.args.file->count),
                                      op.args.file->offset);
                break;
            case op_code::writev_at:
                ::io_uring_prep_writev(sqe, fd, op.args.file->iov, static_cast<unsigned>(op.args.file->count),
                                       op.args.file->offset);
                break;
            case op_code::fsync:
                ::io_uring_prep_fsync(sqe, fd, (op.flags & datasync) ? IORING_FSYNC_DATASYNC : 0);
                break;
            case op_code::openat:
                ::io_uring_prep_openat(sqe, fd, op.args.file->path, op.flags | O_CLOEXEC, op.args.file->mode);
                break;
            case op_code::openat2:
                // The caller's open_how asks for O_CLOEXEC itself (file.cpp).
                ::io_uring_prep_openat2(sqe, fd, op.args.file->path, static_cast<::open_how*>(op.args.file->data));
                break;
            case op_code::close: ::io_uring_prep_close(sqe, fd); break;
            case op_code::statx:
                ::io_uring_prep_statx(sqe, fd, op.args.file->path, op.flags, op.args.file->mode,
                                      static_cast<struct statx*>(op.args.file->data));
                break;
            case op_code::renameat:
                ::io_uring_prep_renameat(sqe, fd, op.args.file->path, fd, op.args.file->path2, 0);
                break;
            case op_code::unlinkat: ::io_uring_prep_unlinkat(sqe, fd, op.args.file->path, op.flags); break;
            case op_code::mkdirat: ::io_uring_prep_mkdirat(sqe, fd, op.args.file->path, op.args.file->mode); break;
            case op_code::truncate:
                // IORING_OP_FTRUNCATE: the length in off, every other field zero.
                ::io_uring_prep_rw(io_uring_op_ftruncate, sqe, fd, nullptr, 0, op.args.file->offset);
                break;
            case op_code::poll:
                // A persistent poll stays armed in the kernel (multishot, 5.13)
                // and completes with IORING_CQE_F_MORE on each readiness.
                if (op.persistent && m_multishot)
                    ::io_uring_prep_poll_multishot(sqe, fd, poll_mask(op.events));
                else
                    ::io_uring_prep_poll_add(sqe, fd, poll_mask(op.events));
                break;
            case op_code::process_exit: ::io_uring_prep_nop(sqe); break;  // never: performs() refuses it
        }
    }
    ::io_uring_sqe_set_data64(sqe, user_data_of(index));
    s.issuer_epoch = m_issuer_epoch;
    s.sq_position = m_ring.sq.sqe_tail - 1;  // io_uring_get_sqe just advanced the tail past it
    s.state = slot_state::in_kernel;
    link_fd(op);
    return true;
}

bool io_uring_backend::queue_cancel(std::uint32_t index) noexcept {
    // Keyed by user_data, generation included: it cannot hit a later
    // operation that reuses the slot, whenever the kernel gets to it.
    return queue_cancel_of(user_data_of(index));
}

bool io_uring_backend::queue_cancel_of(std::uint64_t target) noexcept {
    ::io_uring_sqe* sqe = get_sqe();
    if (!sqe) return false;
    ::io_uring_prep_cancel64(sqe, target, 0);
    ::io_uring_sqe_set_data64(sqe, cancel_data);
    // Only failures (ENOENT: already done; EALREADY: running) would post a
    // completion; they are ignored, the target's own completion is what counts.
    if (m_cqe_skip) sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
    return true;
}

void io_uring_backend::arm_wake() noexcept {
    ::io_uring_sqe* sqe = get_sqe();
    if (!sqe) return;  // the next poll() tries again
    // A multishot poll on an eventfd that is never read: each write() wakes
    // the eventfd's waiters and so posts one completion, at no cost to the
    // loop beyond reaping it. The counter only grows; it would take 2^64
    // wake-ups to saturate it (and then write() fails with EAGAIN, harmless).
    if (m_multishot)
        ::io_uring_prep_poll_multishot(sqe, m_wake_fd, POLLIN);
    else
        ::io_uring_prep_poll_add(sqe, m_wake_fd, POLLIN);
    ::io_uring_sqe_set_data64(sqe, m_wake_data);
    m_wake_armed = true;
}

void io_uring_backend::adopt_calling_thread() noexcept {
    // io_uring completes a request through task work of the thread that made
    // it, and under COOP_TASKRUN that work waits until the thread next enters
    // the kernel. Requests made on a thread that does not run the loop (it
    // was built there, or run there before) would complete only when that
    // thread makes a syscall: perhaps milliseconds later, perhaps never. Make
    // again from here, at once, what only waits for readiness: the wake-up
    // and the polls. They write nothing into memory of ours, so the old
    // requests are left to their cancels, their completions ignored (another
    // user_data). Requests that move data finish where they were made.
    m_issuer = std::this_thread::get_id();
    ++m_issuer_epoch;
    if (m_wake_armed) {
        queue_cancel_of(m_wake_data);
        m_wake_data = m_wake_data == wake_data ? wake_data_alt : wake_data;
        arm_wake();
    }
    // A feed moves data, so it is not made again: retired, it is armed
    // again from here once its last completion is in.
    for (std::size_t fd = 0; fd < m_feeds.size(); ++fd) retire_feed(static_cast<int>(fd));
    for (std::uint32_t index = 0; index < m_slots.size(); ++index) {
        slot& s = m_slots[index];
        if (s.state != slot_state::in_kernel || !s.op || s.cancel_requested) continue;
        if (s.op->code != op_code::poll && !s.awaiting_readiness) continue;
        queue_cancel(index);
        unlink_fd(*s.op);
        s.generation = next_generation(s.generation);
        if (!queue_request(index)) {
            // The ring refuses requests: the next dispatch reports it.
            s.state = slot_state::collected;
            m_collected.push_back({user_data_of(index), -EIO, 0});
        }
    }
}

void io_uring_backend::flush() noexcept {
    if (::io_uring_sq_ready(&m_ring) == 0) return;  // nothing queued: no syscall
    // Errors are not lost: the requests stay queued and the next poll() reports.
    [[maybe_unused]] const int r = ::io_uring_submit(&m_ring);
}

// --- the backend interface ----------------------------------------------------

bool io_uring_backend::performs(op_code code) const noexcept {
    if (code == op_code::process_exit) return false;  // a pidfd's poll instead
    return !is_file_op(code) || (m_file_ops & (1u << static_cast<unsigned>(code))) != 0;
}

bool io_uring_backend::submit(operation& op) {
    if ((op.fd < 0 && !is_path_op(op.code)) || !performs(op.code)) {
        op.result = op.fd < 0 ? -EBADF : -EOPNOTSUPP;
        op.state = op_state::done;
        return true;
    }
    if (op.fd >= 0) {
        const auto fd_index = static_cast<std::size_t>(op.fd);
        if (fd_index >= m_by_fd.size()) m_by_fd.resize(std::max(fd_index + 1, m_by_fd.size() * 2));
    }
    if (op.code == op_code::recv_pooled && !m_pool) {
        auto* pool = new ring_pool(m_read_buffer_size);
        pool->attach(m_ring, m_read_buffer_batch);
        m_pool = pool;
        publish(*pool);
    }
    if (m_fail_submit)
        throw std::system_error(EBUSY, std::system_category(), "io_uring: the submission queue cannot be flushed");
    if (op.fd >= 0 && is_reader(op)) {
        const routed route = route_to_feed(op);
        if (route == routed::at_once) return true;
        if (route == routed::parked) return false;
    }
    const std::uint32_t index = allocate_slot(op);
    op.backend_slot = index;
    op.state = op_state::pending;
    if (op.code == op_code::recv_pooled) start_pooled(index);
    if (!queue_request(index)) {
        release_slot(index);
        op.state = op_state::idle;
        throw std::system_error(EBUSY, std::system_category(), "io_uring: the submission queue cannot be flushed");
    }
    // Everything else waits for the next poll(), where one io_uring_enter sends
    // the tick's batch. A watcher is often made outside any tick, by a host
    // that then sleeps on native_handle(): send it now, or its first readiness
    // would stay unseen in the submission queue.
    if (op.code == op_code::poll && op.persistent) {
        // A watcher set up while the descriptor's feed holds data hears of it
        // once, from the next poll(): the kernel sees an empty socket.
        const auto fd_index = static_cast<std::size_t>(op.fd);
        if (fd_index < m_feeds.size() && m_feeds[fd_index].has_arrivals() && is_reader(op))
            m_collected.push_back({user_data_of(index), POLLIN, IORING_CQE_F_MORE});
        flush();
    }
    return false;
}

void io_uring_backend::cancel(operation& op) noexcept {
    std::uint32_t index;
    if (!op.pending() || !lookup(op, index)) return;
    slot& s = m_slots[index];
    if (s.cancel_requested) return;
    s.cancel_requested = true;
    if (s.state == slot_state::parked) {
        // Waiting in a feed, with no request of its own: what the feed
        // delivers by the next poll() is still its answer, as a one-shot
        // receive's data may win over its cancel; if nothing, it leaves the
        // feed (armed for the next receive) with -ECANCELED then.
        m_withdrawn.push_back(user_data_of(index));
        return;
    }
    // Collected already: the next poll() completes it with its real result
    // (or with -ECANCELED where it would have been retried or re-armed).
    if (s.state == slot_state::in_kernel) queue_cancel(index);
}

void io_uring_backend::forget(operation& op) noexcept {
    if (!op.pending()) return;
    std::uint32_t index;
    if (!lookup(op, index)) {
        op.state = op_state::idle;
        return;
    }
    if (m_slots[index].state == slot_state::parked) {
        unpark(index);
        release_slot(index);
        op.state = op_state::idle;
        return;
    }
    if (m_slots[index].state == slot_state::in_kernel) {
        // The kernel may still write into the operation's buffers (a read's
        // data, accept's address): cancel, then wait for the final completion.
        // Completions of other operations reaped meanwhile are kept for the
        // next poll(); complete() is never called from here.
        bool waiting = true;
        if (!m_slots[index].cancel_requested) {
            m_slots[index].cancel_requested = true;
            waiting = queue_cancel(index);
        }
        while (waiting && m_slots[index].state == slot_state::in_kernel) {
            const int r = ::io_uring_submit_and_wait(&m_ring, 1);
            if (r < 0 && !transient(r)) waiting = false;
            collect();
        }
        if (m_slots[index].state == slot_state::in_kernel) {
            // The ring refuses to work (it should not happen): the least harm
            // is to keep the slot out of use until its completion ever comes,
            // and never to touch the operation again.
            unlink_fd(op);
            m_slots[index].op = nullptr;
            op.state = op_state::idle;
            return;
        }
    }
    // A pooled receive's buffer goes back: the one it was given, or the
    // kernel's pick in a completion nobody will dispatch now.
    if (op.code == op_code::recv_pooled) {
        const slot& s = m_slots[index];
        if (s.pooled_plain && !s.awaiting_readiness) {
            --m_plain_in_kernel;
            m_pool->give_back(op.args.pooled.id);
        }
        const std::uint64_t data = user_data_of(index);
        for (completion& c : m_collected) {
            if (c.user_data != data) continue;
            recycle_buffer(c.flags);
            c.flags &= ~IORING_CQE_F_BUFFER;
        }
    }
    // An accept (or open) that won the race made a descriptor nobody will
    // ever see.
    if (op.code == op_code::accept || op.code == op_code::openat || op.code == op_code::openat2) {
        const std::uint64_t data = user_data_of(index);
        for (completion& c : m_collected) {
            if (c.user_data == data && c.res >= 0) {
                ::close(c.res);
                c.res = -ECANCELED;
            }
        }
    }
    // Its collected completions now carry a stale generation and are skipped.
    release_slot(index);
    op.state = op_state::idle;
}

void io_uring_backend::close_fd(int fd) noexcept {
    if (fd < 0 || static_cast<std::size_t>(fd) >= m_by_fd.size()) return;
    // A request still in the submission queue would look the number up only
    // when sent, after the runtime closed it, perhaps under a new file: it must
    // reach the kernel now, while the number still names the file being
    // closed. Requests already sent hold their own reference to the file, so
    // the close that follows does not disturb them; their cancels do.
    const unsigned sent = IO_URING_READ_ONCE(*m_ring.sq.khead);
    bool unsent = false;
    for (operation* op = m_by_fd[static_cast<std::size_t>(fd)]; op; op = op->next)
        if (m_slots[op->backend_slot].state != slot_state::parked &&
            static_cast<std::int32_t>(m_slots[op->backend_slot].sq_position - sent) >= 0)
            unsent = true;
    if (static_cast<std::size_t>(fd) < m_feeds.size()) {
        const feed& f = m_feeds[static_cast<std::size_t>(fd)];
        if (f.stage != feed_stage::idle && static_cast<std::int32_t>(f.sq_position - sent) >= 0) unsent = true;
    }
    if (unsent) flush();
    // Receives parked in its feed complete from the next poll().
    close_feed(fd);
    // Each cancel is keyed by user_data, not by descriptor: IORING_ASYNC_CANCEL_FD
    // matches the open file, so it would also cancel requests made through a
    // dup() of it, and it would have to reach the kernel before the close,
    // costing an io_uring_enter here; these ride with the next poll()'s batch.
    // Every operation answers the close, those cancelled before it too: their
    // cancel is already queued, but a result the kernel made (an accepted
    // descriptor) must still be given back, not handed over.
    for (operation* op = m_by_fd[static_cast<std::size_t>(fd)]; op; op = op->next)
        m_slots[op->backend_slot].closed = true;
    // Restart from the head each time: queueing may reap completions, which
    // unlinks operations from this very list.
    for (;;) {
        operation* op = m_by_fd[static_cast<std::size_t>(fd)];
        while (op && m_slots[op->backend_slot].cancel_requested) op = op->next;
        if (!op) break;
        m_slots[op->backend_slot].cancel_requested = true;
        queue_cancel(op->backend_slot);
    }
    // Completions already collected (or held back for the next poll) must
    // not lead to a retry or a re-armed poll on a number that may soon name
    // another file.
    for (const std::vector<completion>* list : {&m_collected, &m_postponed}) {
        for (const completion& c : *list) {
            const auto index = static_cast<std::uint32_t>(c.user_data);
            if ((c.user_data >> 32) == 0 || index >= m_slots.size()) continue;
            slot& s = m_slots[index];
            if (s.generation == (c.user_data >> 32) && s.op && s.op->fd == fd) s.cancel_requested = s.closed = true;
        }
    }
}

int io_uring_backend::poll(std::chrono::nanoseconds timeout) {
    m_completed = 0;
    if (std::this_thread::get_id() != m_issuer) [[unlikely]] {
        // A single-issuer ring refuses every enter from another thread
        // (EEXIST), and a registered descriptor means nothing there: the
        // loop checks this first, so only a misuse of the backend gets here.
        if (m_single_thread)
            throw std::logic_error("spindle: a single-thread io_uring backend polled from another thread");
        adopt_calling_thread();
    }
    if (!m_collected.empty() || !m_postponed.empty() || !m_withdrawn.empty() || ::io_uring_cq_ready(&m_ring) > 0)
        timeout = std::chrono::nanoseconds::zero();
    if (timeout == std::chrono::nanoseconds::zero()) {
        // Enter only to send requests or to run completions the kernel holds
        // for us (IORING_SQ_TASKRUN) or could not fit in the queue; otherwise
        // the completion queue is read without a syscall.
        //
        // Under DEFER_TASKRUN nothing reaches the completion queue until we
        // enter with GETEVENTS (io_uring_submit_and_get_events always asks
        // for it), and the kernel raises IORING_SQ_TASKRUN for deferred work
        // as for cooperative work: the same test finds it, with no enter
        // while nothing completed. A recent kernel runs at most 20 items of
        // deferred work per enter and leaves the flag raised while any are
        // left, so a burst larger than that takes one enter per 20, each
        // tick's poll() picking up where the last stopped (checked on 6.18).
        const unsigned kernel_flags = IO_URING_READ_ONCE(*m_ring.sq.kflags);
        if (::io_uring_sq_ready(&m_ring) > 0 || (kernel_flags & (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW))) {
            const int r = ::io_uring_submit_and_get_events(&m_ring);
            if (r < 0 && !transient(r)) throw std::system_error(-r, std::system_category(), "io_uring_enter");
        }
    } else {
        // One io_uring_enter sends the tick's requests and waits: the whole
        // cost of a tick in the kernel, in steady state.
        ::__kernel_timespec ts{};
        ::__kernel_timespec* tsp = nullptr;
        if (timeout > std::chrono::nanoseconds::zero()) {
            ts.tv_sec = static_cast<long long>(timeout.count() / 1'000'000'000);
            ts.tv_nsec = static_cast<long long>(timeout.count() % 1'000'000'000);
            tsp = &ts;
        }
        ::io_uring_cqe* first = nullptr;
        const int r = ::io_uring_submit_and_wait_timeout(&m_ring, &first, 1, tsp, nullptr);
        if (r < 0 && r != -ETIME && !transient(r)) throw std::system_error(-r, std::system_category(), "io_uring_enter");
    }
    collect();
    if (!m_wake_armed) {
        // The kernel ended the wake-up poll (or has only one-shot polls): empty
        // the eventfd, which a one-shot poll would otherwise find ready forever,
        // and re-arm at once, so a host waiting on native_handle() still hears
        // wake() before we run again.
        std::uint64_t drained;
        [[maybe_unused]] const auto n = ::read(m_wake_fd, &drained, sizeof drained);
        arm_wake();
        flush();
    }
    // Pooled receives the last poll held back go first.
    if (!m_postponed.empty()) {
        m_collected.insert(m_collected.begin(), m_postponed.begin(), m_postponed.end());
        m_postponed.clear();
    }
    dispatch();
    if (!m_postponed.empty()) wake();  // a host polling native_handle() comes back for the rest
    return m_completed;
}

void io_uring_backend::wake() noexcept {
    const std::uint64_t one = 1;
    // EAGAIN means the counter is saturated: the loop is woken anyway.
    [[maybe_unused]] const auto r = ::write(m_wake_fd, &one, sizeof one);
}

// --- completions -----------------------------------------------------------------

void io_uring_backend::collect() noexcept {
    for (;;) {
        unsigned head;
        unsigned seen = 0;
        ::io_uring_cqe* cqe;
        io_uring_for_each_cqe(&m_ring, head, cqe) {
            note(*cqe);
            ++seen;
        }
        ::io_uring_cq_advance(&m_ring, seen);
        if (!::io_uring_cq_has_overflow(&m_ring)) break;
        // The kernel kept completions that did not fit: have it move them in.
        const int r = ::io_uring_get_events(&m_ring);
        if (r < 0 && !transient(r)) break;
    }
}

void io_uring_backend::note(const ::io_uring_cqe& cqe) noexcept {
    const std::uint64_t data = cqe.user_data;
    if (data & feed_bit) {
        const auto fd = static_cast<std::uint32_t>(data);
        if (fd >= m_feeds.size() || m_feeds[fd].generation != ((data >> 32) & max_generation))
            return recycle_buffer(cqe.flags);
        if (!(cqe.flags & IORING_CQE_F_MORE)) m_feeds[fd].stage = feed_stage::idle;
        m_collected.push_back({data, cqe.res, cqe.flags});
        return;
    }
    const auto index = static_cast<std::uint32_t>(data);
    const auto generation = static_cast<std::uint32_t>(data >> 32);
    if (generation == 0) {
        if (data == m_wake_data && !(cqe.flags & IORING_CQE_F_MORE)) {
            m_wake_armed = false;
            if (cqe.res == -EINVAL) m_multishot = false;  // a kernel before 5.13
        }
        return;
    }
    if (index >= m_slots.size()) return recycle_buffer(cqe.flags);
    slot& s = m_slots[index];
    if (s.generation != generation || s.state != slot_state::in_kernel) return recycle_buffer(cqe.flags);  // forgotten
    if (!(cqe.flags & IORING_CQE_F_MORE)) {
        // The kernel is done with the operation's memory from here on.
        s.state = slot_state::collected;
        if (s.op) unlink_fd(*s.op);
    }
    m_collected.push_back({data, cqe.res, cqe.flags});
}

void io_uring_backend::dispatch() {
    // By index: a completion handler may (against the contract, but safely)
    // call forget(), which appends what it reaps while waiting.
    m_dry_receives = m_ring_growths = m_ring_claims = 0;
    for (std::size_t i = 0; i < m_collected.size(); ++i) {
        const completion c = m_collected[i];
        if (c.user_data & feed_bit) {
            deliver(c);
            continue;
        }
        const auto index = static_cast<std::uint32_t>(c.user_data);
        if (index >= m_slots.size() || m_slots[index].generation != (c.user_data >> 32)) {
            recycle_buffer(c.flags);
            continue;
        }
        slot& s = m_slots[index];
        if (!s.op) {
            // Forgotten while the ring was failing: its last completion frees it.
            recycle_buffer(c.flags);
            if (!(c.flags & IORING_CQE_F_MORE)) release_slot(index);
            continue;
        }
        if (c.flags & IORING_CQE_F_MORE) {
            // A persistent poll's readiness; the request stays armed. After a
            // cancel, only the final completion is of interest.
            if (s.cancel_requested) continue;
            operation& op = *s.op;
            op.result = poll_result(op, c.res);
            ++m_completed;
            op.complete(op);
            continue;
        }
        finish_request(index, c.res, c.flags);
    }
    m_collected.clear();
    for (std::size_t i = 0; i < m_withdrawn.size(); ++i) {
        const auto index = static_cast<std::uint32_t>(m_withdrawn[i]);
        const slot& s = m_slots[index];
        if (s.generation != (m_withdrawn[i] >> 32) || s.state != slot_state::parked) continue;
        unpark(index);
        finish(index, -ECANCELED);
    }
    m_withdrawn.clear();
}

void io_uring_backend::finish_request(std::uint32_t index, std::int32_t res, std::uint32_t flags) {
    slot& s = m_slots[index];
    operation& op = *s.op;
    const bool cancelled = s.cancel_requested;

    if (res == -ECANCELED && !cancelled && s.issuer_epoch != m_issuer_epoch && op.code != op_code::connect &&
        op.code != op_code::close) {
        // The kernel cancelled it, not we: it was made by a thread that no
        // longer runs the loop (adopt_calling_thread), or that thread exited.
        // Nothing was done; make it again from this thread. Not a connect,
        // which may have left the socket connecting.
        if (!queue_request(index)) finish(index, -EIO);
        return;
    }

    if (op.code == op_code::recv_pooled) return finish_pooled(index, res, flags);

    if (op.code == op_code::poll) {
        if (op.persistent && !cancelled) {
            if (res == -EINVAL && m_multishot) {
                // A kernel without multishot polls: one-shot polls, re-armed
                // after each completion, from now on.
                m_multishot = false;
                if (!queue_request(index)) finish(index, -EIO);
                return;
            }
            if (res >= 0) {
                // The kernel ended the multishot by itself (a full completion
                // queue, say) or it was one-shot: re-arm first, so the
                // operation is still pending when its owner hears of it.
                if (!queue_request(index)) {
                    finish(index, -EIO);
                    return;
                }
                op.result = poll_result(op, res);
                ++m_completed;
                op.complete(op);
                return;
            }
            // Errors end it, -ECANCELED included: without a cancel of ours
            // (and from this thread's own request) it means the ring is going
            // away.
        }
        finish(index, res >= 0 ? poll_result(op, res) : res);
        return;
    }

    if (s.awaiting_readiness) {
        // The readiness poll of an operation that hit EAGAIN came back.
        s.awaiting_readiness = false;
        if (cancelled) {
            finish(index, -ECANCELED);
            return;
        }
        if (res >= 0) {
            if (!queue_request(index)) finish(index, -EIO);
            return;
        }
        finish(index, res);
        return;
    }

    if (is_file_op(op.code)) {
        // Never waits for readiness. A kernel worker our cancel interrupted
        // (an open of a FIFO nobody writes) answers EINTR, or the kernel's
        // own restart codes (ERESTARTSYS, 512 to 516), which no program knows.
        const bool interrupted = res == -EINTR || (res <= -512 && res >= -516);
        finish(index, interrupted ? (cancelled ? -ECANCELED : -EINTR) : res);
        return;
    }

    // EAGAIN reaches us when the kernel cannot wait on the file for us (a
    // non-blocking descriptor of a driver without that support, MSG_DONTWAIT):
    // wait for readiness and try again, as the epoll backend would. Not for
    // connect, whose EAGAIN (a full Unix listener backlog) is its answer.
    if ((res == -EAGAIN || res == -EINTR) && op.code != op_code::connect) {
        if (cancelled) {
            finish(index, -ECANCELED);
            return;
        }
        s.awaiting_readiness = res == -EAGAIN;
        if (!queue_request(index)) finish(index, res);
        return;
    }
    finish(index, res);
}

void io_uring_backend::finish(std::uint32_t index, std::int64_t result) {
    operation& op = *m_slots[index].op;
    const bool closed = m_slots[index].closed;
    // Free the slot first: complete() may start another operation at once.
    release_slot(index);
    op.result = result;
    if (closed && result != -ECANCELED) {
        // Its descriptor was closed while the kernel finished it: as on every
        // backend, it completes with -ECANCELED, and what it handed over (an
        // accepted descriptor) is closed rather than lost.
        release_handed_over(op);
        op.result = -ECANCELED;
    }
    op.state = op_state::done;
    ++m_completed;
    op.complete(op);
}

}  // namespace spindle::reactor
