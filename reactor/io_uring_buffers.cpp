// Pooled receives on io_uring. Where the kernel has rings of provided
// buffers, a receive names the group and the kernel picks a buffer once data
// is there; when the ring runs dry (-ENOBUFS) it grows by a chunk, and beyond
// what it can hold a receive waits for readiness and takes one of the pool's
// other buffers, as it does on a kernel without such rings.

#include "io_uring_ring_pool.hpp"

#include <spindle/reactor/buffer_pool.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <sys/mman.h>

namespace spindle::reactor {

// --- the ring of provided buffers ----------------------------------------------

bool io_uring_backend::ring_pool::attach(::io_uring& ring, std::uint32_t entries) noexcept {
    const std::size_t bytes = std::size_t{entries} * sizeof(::io_uring_buf);
    void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return false;
    ::io_uring_buf_reg reg{};
    reg.ring_addr = reinterpret_cast<std::uint64_t>(memory);
    reg.ring_entries = entries;
    reg.bgid = group;
    if (::io_uring_register_buf_ring(&ring, &reg, 0) != 0) {
        ::munmap(memory, bytes);
        return false;
    }
    m_ring = static_cast<::io_uring_buf_ring*>(memory);
    m_entries = entries;
    m_mask = ::io_uring_buf_ring_mask(entries);
    ::io_uring_buf_ring_init(m_ring);
    grow_ring();
    return true;
}

void io_uring_backend::ring_pool::detach(::io_uring& ring) noexcept {
    if (!m_ring) return;
    ::io_uring_unregister_buf_ring(&ring, group);
    ::munmap(m_ring, std::size_t{m_entries} * sizeof(::io_uring_buf));
    m_ring = nullptr;
}

bool io_uring_backend::ring_pool::grow_ring() noexcept {
    std::uint32_t first;
    if (!m_ring || capacity() >= m_entries || !add_chunk(first)) return false;
    for (std::uint32_t i = 0; i < chunk_buffers; ++i) on_free(first + i);
    return true;
}

void io_uring_backend::ring_pool::on_free(std::uint32_t id) noexcept {
    if (m_ring && id < m_entries) {
        ::io_uring_buf_ring_add(m_ring, address(id), static_cast<unsigned>(m_buffer_size), static_cast<unsigned short>(id), m_mask, 0);
        ::io_uring_buf_ring_advance(m_ring, 1);
        ++m_in_ring;
    } else {
        m_free.push_back(id);
    }
}

// --- pooled receives -------------------------------------------------------------

void io_uring_backend::recycle_buffer(std::uint32_t flags) noexcept {
    if (flags & IORING_CQE_F_BUFFER) m_pool->recycle(flags >> IORING_CQE_BUFFER_SHIFT);
}

void io_uring_backend::start_pooled(std::uint32_t index) noexcept {
    // Without a ring the receive waits for readiness first, so that it takes
    // a buffer only when data is there.
    slot& s = m_slots[index];
    s.pooled_plain = !m_pool->has_ring();
    s.awaiting_readiness = s.pooled_plain;
    s.ring_was_dry = false;
}

void io_uring_backend::finish_pooled(std::uint32_t index, std::int32_t res, std::uint32_t flags) {
    slot& s = m_slots[index];
    operation& op = *s.op;
    const bool cancelled = s.cancel_requested;
    if (s.awaiting_readiness) {
        // Readable: receive, unless this poll has lent its batch already;
        // then the next poll comes back to it first. The batch counts the
        // receives sent back to the ring in this dispatch too.
        if (cancelled) return finish(index, -ECANCELED);
        if (res < 0) return finish(index, res);
        if (m_pool->in_transit() + m_plain_in_kernel + m_ring_claims >= m_read_buffer_batch) {
            m_postponed.push_back({user_data_of(index), res, 0});
            return;
        }
        s.awaiting_readiness = false;
        if (s.ring_was_dry && m_ring_claims < m_pool->in_ring()) {
            ++m_ring_claims;
            // Tasks gave buffers back into the ring since it ran dry for this
            // receive: the kernel picks one of those, and the pool maps no
            // other buffers for a burst that the ring can serve in turn.
            s.pooled_plain = s.ring_was_dry = false;
            if (!queue_request(index)) finish(index, -EIO);
            return;
        }
        if (!m_pool->take(op.args.pooled.id)) return finish(index, -ENOMEM);
        ++m_plain_in_kernel;
        if (!queue_request(index)) {
            --m_plain_in_kernel;
            m_pool->give_back(op.args.pooled.id);
            finish(index, -EIO);
        }
        return;
    }
    // The buffer the receive filled: the kernel's pick, or the one it was given.
    bool held = false;
    std::uint32_t id = 0;
    if (flags & IORING_CQE_F_BUFFER) {
        held = true;
        id = flags >> IORING_CQE_BUFFER_SHIFT;
        m_pool->lent_by_kernel();
    } else if (s.pooled_plain) {
        held = true;
        id = op.args.pooled.id;
        --m_plain_in_kernel;
    }
    if (res > 0) {
        op.args.pooled = {m_pool, id};
        m_pool->handed_over();
        return finish(index, res);  // closed meanwhile: finish gives it back
    }
    if (held) m_pool->give_back(id);
    const bool retry = res == -ENOBUFS || res == -EAGAIN || res == -EINTR;
    if (retry && cancelled) return finish(index, -ECANCELED);
    if (res == -ENOBUFS || res == -EAGAIN) {
        // ENOBUFS: the ring ran dry; another chunk for it while it has room.
        // One chunk serves this many receives of the same dispatch (a burst
        // of readable connections finds it dry all at once), not one each.
        // Beyond that, and on an EAGAIN (as for any operation the kernel
        // cannot wait on, finish_request), wait for readiness and take one of
        // the pool's other buffers.
        bool plain = res == -EAGAIN;
        if (!plain && ++m_dry_receives > m_ring_growths * buffer_pool::chunk_buffers) {
            plain = !m_pool->grow_ring();
            if (!plain) ++m_ring_growths;
        }
        if (plain) {
            s.pooled_plain = s.awaiting_readiness = true;
            s.ring_was_dry = res == -ENOBUFS;
        }
        if (!queue_request(index)) finish(index, -EIO);
        return;
    }
    if (res == -EINTR) {
        if (s.pooled_plain) {
            if (!m_pool->take(op.args.pooled.id)) return finish(index, -ENOMEM);
            ++m_plain_in_kernel;
        }
        if (!queue_request(index)) {
            if (s.pooled_plain) {
                --m_plain_in_kernel;
                m_pool->give_back(op.args.pooled.id);
            }
            finish(index, -EIO);
        }
        return;
    }
    finish(index, res);
}

}  // namespace spindle::reactor
