// Feeds: the pooled receives of a byte stream share one multishot receive
// (IORING_RECV_MULTISHOT over the ring of provided buffers). The first
// receive arms it and it stays armed between receives, so a message costs
// the kernel one completion, with no request, no failed first attempt and no
// poll set up and torn down for it.
//
// What arrives while no receive waits is queued in the feed, in order. After
// feed_backlog such arrivals the feed retires (cancels its request), so a
// reader that falls behind leaves the rest in the socket and the peer feels
// TCP's backpressure, as with one-shot receives. A read of any other kind on
// the descriptor (recv into the caller's buffer, readv, recvmsg, a readiness
// poll) is served from the queue first, and the descriptor goes back to
// one-shot requests once the multishot has ended: two requests never read
// one stream at once, so bytes stay in order.

#include "io_uring_ring_pool.hpp"

#include "syscall_op.hpp"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <system_error>

namespace spindle::reactor {

io_uring_backend::feed& io_uring_backend::feed_of(int fd) {
    const auto i = static_cast<std::size_t>(fd);
    if (i >= m_feeds.size()) m_feeds.resize(std::max({i + 1, m_feeds.size() * 2, std::size_t{64}}));
    return m_feeds[i];
}

std::uint64_t io_uring_backend::feed_data(int fd) const noexcept {
    return feed_bit | (std::uint64_t{m_feeds[static_cast<std::size_t>(fd)].generation} << 32) |
           static_cast<std::uint32_t>(fd);
}

io_uring_backend::routed io_uring_backend::route_to_feed(operation& op) {
    const int fd = op.fd;
    const bool pooled = op.code == op_code::recv_pooled && op.stream && op.flags == 0 && m_recv_multishot &&
                        m_pool->has_ring();
    if (!pooled && (static_cast<std::size_t>(fd) >= m_feeds.size() || !m_feeds[static_cast<std::size_t>(fd)].busy()))
        return routed::alone;
    feed& f = feed_of(fd);
    if (!pooled) {
        // Another kind of read: the feed ends for good once its queue is taken.
        f.plain_only = true;
        retire_feed(fd);
        // A watcher is armed in the kernel at once; what the feed queued
        // is told to it by submit().
        if (op.code == op_code::poll && op.persistent) return routed::alone;
    }
    if (f.first_waiter == no_slot && f.has_arrivals()) {
        op.result = serve_at_once(fd, op);
        op.state = op_state::done;
        return routed::at_once;
    }
    const bool arms = pooled && !f.plain_only;
    if (f.stage == feed_stage::idle) {
        // Nothing in the kernel and nothing queued: a one-shot request, unless
        // this receive arms the feed. A dry ring grows first; beyond what it
        // can hold, the one-shot way waits for readiness and a pool buffer.
        if (!arms || f.first_waiter != no_slot) return routed::alone;
        if (m_pool->in_ring() == 0 && !m_pool->grow_ring()) return routed::alone;
    }
    const std::uint32_t index = allocate_slot(op);
    op.backend_slot = index;
    op.state = op_state::pending;
    park(fd, index);
    if (feed_of(fd).stage == feed_stage::idle && !arm_feed(fd)) {
        unpark(index);
        release_slot(index);
        op.state = op_state::idle;
        throw std::system_error(EBUSY, std::system_category(), "io_uring: the submission queue cannot be flushed");
    }
    return routed::parked;
}

bool io_uring_backend::arm_feed(int fd) noexcept {
    ::io_uring_sqe* sqe = get_sqe();
    if (!sqe) return false;
    ::io_uring_prep_recv_multishot(sqe, fd, nullptr, 0, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = ring_pool::group;
    // No such receive flag: the kernel answers EINVAL, as one before 6.0
    // answers a multishot receive.
    if (m_fail_multishot) sqe->ioprio |= 1u << 15;
    ::io_uring_sqe_set_data64(sqe, feed_data(fd));
    feed& f = m_feeds[static_cast<std::size_t>(fd)];
    f.stage = feed_stage::armed;
    f.delivered = false;
    f.sq_position = m_ring.sq.sqe_tail - 1;
    return true;
}

void io_uring_backend::retire_feed(int fd) noexcept {
    feed& f = m_feeds[static_cast<std::size_t>(fd)];
    if (f.stage != feed_stage::armed) return;
    // Without a free entry the feed stays armed; the next reason retries.
    if (queue_cancel_of(feed_data(fd))) m_feeds[static_cast<std::size_t>(fd)].stage = feed_stage::retiring;
}

void io_uring_backend::park(int fd, std::uint32_t index) noexcept {
    feed& f = m_feeds[static_cast<std::size_t>(fd)];
    slot& s = m_slots[index];
    s.state = slot_state::parked;
    s.next_waiter = no_slot;
    if (f.last_waiter == no_slot)
        f.first_waiter = index;
    else
        m_slots[f.last_waiter].next_waiter = index;
    f.last_waiter = index;
    link_fd(*s.op);
}

void io_uring_backend::unpark(std::uint32_t index) noexcept {
    slot& s = m_slots[index];
    feed& f = m_feeds[static_cast<std::size_t>(s.op->fd)];
    std::uint32_t previous = no_slot;
    for (std::uint32_t i = f.first_waiter; i != no_slot && i != index; i = m_slots[i].next_waiter) previous = i;
    if (previous == no_slot)
        f.first_waiter = s.next_waiter;
    else
        m_slots[previous].next_waiter = s.next_waiter;
    if (f.last_waiter == index) f.last_waiter = previous;
    s.next_waiter = no_slot;
    s.state = slot_state::in_kernel;
    unlink_fd(*s.op);
}

void io_uring_backend::send_alone(std::uint32_t index, bool ring_was_dry) {
    slot& s = m_slots[index];
    if (s.op->code == op_code::recv_pooled) {
        start_pooled(index);
        if (ring_was_dry) s.pooled_plain = s.awaiting_readiness = s.ring_was_dry = true;
    }
    if (!queue_request(index)) finish(index, -EIO);
}

void io_uring_backend::deliver(const completion& c) {
    const auto fd = static_cast<int>(static_cast<std::uint32_t>(c.user_data));
    const auto generation = static_cast<std::uint32_t>(c.user_data >> 32) & max_generation;
    if (static_cast<std::size_t>(fd) >= m_feeds.size() ||
        m_feeds[static_cast<std::size_t>(fd)].generation != generation)
        return recycle_buffer(c.flags);  // closed meanwhile
    {
        feed& f = m_feeds[static_cast<std::size_t>(fd)];
        if (c.res > 0) {
            m_pool->lent_by_kernel();
            f.delivered = true;
            try {
                f.arrivals.push_back({c.res, c.flags >> IORING_CQE_BUFFER_SHIFT});
            } catch (...) {
                m_pool->give_back(c.flags >> IORING_CQE_BUFFER_SHIFT);
                f.arrivals.clear();
                f.head = 0;
                f.arrivals.push_back({-ENOMEM, 0});  // fits: cleared, its capacity kept
                retire_feed(fd);
            }
        } else if (c.res == -EINVAL && !f.delivered) {
            m_recv_multishot = false;  // a kernel before 6.0: one-shot receives from now on
        } else if (c.res != -ENOBUFS && c.res != -ECANCELED && c.res != -EINTR && c.res != -EAGAIN) {
            // End of stream or an error, the feed's last word. ENOBUFS (the
            // ring ran dry) and ECANCELED (retired, or by the kernel when its
            // issuer went away) end it with nothing to tell: re-armed below
            // while receives wait.
            f.arrivals.push_back({c.res, 0});
        }
    }
    serve(fd);
    feed& f = m_feeds[static_cast<std::size_t>(fd)];
    if (f.first_waiter != no_slot && f.stage == feed_stage::idle) {
        bool arms = !f.plain_only && m_recv_multishot;
        bool ring_was_dry = false;
        // Feeds armed again in one dispatch claim a buffer of the ring each,
        // as one-shot receives sent back to it do (finish_pooled): a burst
        // beyond what it holds grows it by a chunk, and beyond what it can
        // hold waits for readiness and a buffer of the pool, in one batch.
        if (arms && m_ring_claims >= m_pool->in_ring()) {
            arms = m_pool->grow_ring();
            ring_was_dry = !arms;
        }
        if (arms) ++m_ring_claims;
        if (arms && arm_feed(fd)) return;
        // One-shot requests from here, each alone, in the kernel's order.
        while (m_feeds[static_cast<std::size_t>(fd)].first_waiter != no_slot) {
            const std::uint32_t index = m_feeds[static_cast<std::size_t>(fd)].first_waiter;
            unpark(index);
            if (arms)
                finish(index, -EIO);  // the ring refuses requests
            else
                send_alone(index, ring_was_dry);
        }
        return;
    }
    if (f.stage == feed_stage::armed && f.first_waiter == no_slot && f.arrivals.size() - f.head >= feed_backlog)
        retire_feed(fd);
}

void io_uring_backend::serve(int fd) {
    for (;;) {
        feed& f = m_feeds[static_cast<std::size_t>(fd)];
        if (f.first_waiter == no_slot || !f.has_arrivals()) return;
        const std::uint32_t index = f.first_waiter;
        operation& op = *m_slots[index].op;
        unpark(index);
        // finish() may start another operation on this descriptor at once:
        // the feed is looked up again.
        finish(index, serve_at_once(fd, op));
    }
}

std::int64_t io_uring_backend::serve_at_once(int fd, operation& op) noexcept {
    feed& f = m_feeds[static_cast<std::size_t>(fd)];
    if (op.code == op_code::poll) return readable;  // only a reader comes here
    if (op.code != op_code::recv_pooled) return copy_out(f, op);
    arrival& a = f.arrivals[f.head];
    const std::int32_t res = a.res;
    if (res <= 0) {
        pop_arrival(f);
        return res;
    }
    // Its buffer goes to the receive as it is, but for what a read of
    // another kind took from its front.
    const std::uint32_t size = static_cast<std::uint32_t>(res) - a.taken;
    if (a.taken > 0) std::memmove(m_pool->address(a.id), m_pool->address(a.id) + a.taken, size);
    op.args.pooled = {m_pool, a.id};
    m_pool->handed_over();
    a.res = 0;  // handed over: pop_arrival gives nothing back
    pop_arrival(f);
    return size;
}

std::int64_t io_uring_backend::copy_out(feed& f, const operation& op) noexcept {
    ::iovec one{};
    const ::iovec* iov = &one;
    std::size_t count = 1;
    bool peek = false;
    switch (op.code) {
        case op_code::recv: peek = (op.flags & MSG_PEEK) != 0; [[fallthrough]];
        case op_code::read: one = {op.args.buf.data, op.args.buf.size}; break;
        case op_code::readv:
            iov = op.args.vec.iov;
            count = static_cast<std::size_t>(std::max(op.args.vec.count, 0));
            break;
        case op_code::recvmsg: {
            // A stream carries no address, and the feed kept no ancillary data.
            ::msghdr& msg = *op.args.msg;
            iov = msg.msg_iov;
            count = msg.msg_iovlen;
            msg.msg_flags = 0;
            msg.msg_controllen = 0;
            if (msg.msg_name) msg.msg_namelen = 0;
            peek = (op.flags & MSG_PEEK) != 0;
            break;
        }
        default: return -EINVAL;  // accept and the like: no stream socket answers them
    }
    std::size_t copied = 0;
    std::size_t at = f.head;
    std::uint32_t taken = f.arrivals[at].taken;
    std::size_t v = 0;
    std::size_t in_vector = 0;
    while (at < f.arrivals.size() && v < count) {
        arrival& a = f.arrivals[at];
        if (a.res <= 0) break;
        const auto size = static_cast<std::uint32_t>(a.res);
        while (taken < size && v < count) {
            const std::size_t n = std::min<std::size_t>(size - taken, iov[v].iov_len - in_vector);
            std::memcpy(static_cast<std::byte*>(iov[v].iov_base) + in_vector, m_pool->address(a.id) + taken, n);
            taken += static_cast<std::uint32_t>(n);
            in_vector += n;
            copied += n;
            if (in_vector == iov[v].iov_len) {
                ++v;
                in_vector = 0;
            }
        }
        if (taken < size) break;  // the caller's buffers are full
        ++at;
        taken = 0;
    }
    if (copied == 0 && at < f.arrivals.size() && f.arrivals[at].res <= 0) {
        // Nothing before the feed's last word: it is this read's answer.
        const std::int32_t res = f.arrivals[at].res;
        if (!peek && count > 0) pop_arrival(f);
        return res;
    }
    if (!peek) {
        for (std::size_t consumed = at - f.head; consumed > 0; --consumed) pop_arrival(f);
        if (f.has_arrivals()) f.arrivals[f.head].taken = taken;
    }
    return static_cast<std::int64_t>(copied);
}

void io_uring_backend::pop_arrival(feed& f) noexcept {
    const arrival& a = f.arrivals[f.head];
    if (a.res > 0) m_pool->give_back(a.id);
    if (++f.head == f.arrivals.size()) {
        f.arrivals.clear();
        f.head = 0;
    }
}

void io_uring_backend::close_feed(int fd) noexcept {
    if (static_cast<std::size_t>(fd) >= m_feeds.size()) return;
    feed& f = m_feeds[static_cast<std::size_t>(fd)];
    if (!f.busy() && !f.plain_only) return;
    // The multishot's late completions carry the old generation: dropped,
    // their buffers back in the ring.
    if (f.stage == feed_stage::armed) queue_cancel_of(feed_data(fd));
    feed& g = m_feeds[static_cast<std::size_t>(fd)];
    while (g.first_waiter != no_slot) {
        const std::uint32_t index = g.first_waiter;
        unpark(index);
        slot& s = m_slots[index];
        s.cancel_requested = s.closed = true;
        s.state = slot_state::collected;
        m_collected.push_back({user_data_of(index), -ECANCELED, 0});
    }
    while (g.has_arrivals()) pop_arrival(g);
    g.stage = feed_stage::idle;
    g.plain_only = g.delivered = false;
    g.generation = next_generation(g.generation);
}

}  // namespace spindle::reactor
