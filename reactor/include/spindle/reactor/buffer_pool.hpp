#pragma once
/// The buffers a backend lends to pooled receives (op_code::recv_pooled), so
/// that a connection waiting for input holds no buffer of its own: one is
/// chosen only when data has arrived.
///
/// Every buffer has the same size and an id; buffers are carved from chunks
/// mapped as the pool grows (a chunk's pages become resident only once used)
/// and never unmapped while the pool lives. A free buffer sits on a LIFO list,
/// so a busy loop keeps reusing the few that are warm in the cache. io_uring
/// hands its free buffers to the kernel instead (io_uring_backend), through
/// give_back() overridden.
///
/// Lent buffers may outlive their backend (a task keeps one past its loop's
/// end): the backend calls retire() instead of deleting the pool, and the last
/// buffer given back frees it. Not thread-safe: a pool and its buffers belong
/// to the loop's thread, or after retire() to whichever one thread holds them;
/// only mapped() and lent() may be read from any thread (a metrics scrape).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace spindle::reactor {

class buffer_pool {
public:
    /// Buffers are carved this many at a time (a chunk).
    static constexpr std::uint32_t chunk_buffers = 16;

    explicit buffer_pool(std::size_t buffer_size) noexcept;
    buffer_pool(const buffer_pool&) = delete;
    buffer_pool& operator=(const buffer_pool&) = delete;

    std::size_t buffer_size() const noexcept { return m_buffer_size; }
    std::byte* address(std::uint32_t id) const noexcept {
        return m_chunks[id / chunk_buffers] + static_cast<std::size_t>(id % chunk_buffers) * m_buffer_size;
    }
    /// Buffers mapped so far (the pool never unmaps one), and of those the
    /// ones lent out now (taken, or handed over by the kernel). Any thread.
    std::uint32_t mapped() const noexcept { return m_mapped.load(std::memory_order_relaxed); }
    std::uint32_t lent() const noexcept { return m_lent.load(std::memory_order_relaxed); }

    /// A completion carries a lent buffer to its task, which has not resumed
    /// yet; delivered() when it has, or when the buffer comes back unseen
    /// (release_handed_over). What is in transit is what a burst of readable
    /// connections would pile up before any task could give one back: the
    /// backends hold receives back while it reaches their batch.
    void handed_over() noexcept { ++m_in_transit; }
    void delivered() noexcept { --m_in_transit; }
    std::uint32_t in_transit() const noexcept { return m_in_transit; }

    /// Lends a free buffer, mapping a new chunk when none is left. False when
    /// no memory can be had.
    bool take(std::uint32_t& id) noexcept;
    /// A lent buffer comes back.
    void give_back(std::uint32_t id) noexcept;
    /// The backend goes away: frees the pool now if nothing is lent, or when
    /// the last lent buffer comes back.
    void retire() noexcept;

protected:
    virtual ~buffer_pool();
    /// Where a free buffer goes: the free list here, the kernel's ring for io_uring.
    virtual void on_free(std::uint32_t id) noexcept { m_free.push_back(id); }
    /// Maps one more chunk; its buffers' ids are returned in [first, first +
    /// chunk_buffers). False when no memory can be had.
    bool add_chunk(std::uint32_t& first) noexcept;
    std::uint32_t capacity() const noexcept { return static_cast<std::uint32_t>(m_chunks.size()) * chunk_buffers; }

    std::size_t m_buffer_size;
    std::vector<std::byte*> m_chunks;
    std::vector<std::uint32_t> m_free;  // reserved for every buffer: pushing never allocates
    // Written by the pool's thread only, read by any: a load and a store, no
    // locked instruction.
    void add_lent(std::uint32_t n) noexcept { m_lent.store(m_lent.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
    std::atomic<std::uint32_t> m_mapped{0};
    std::atomic<std::uint32_t> m_lent{0};
    std::uint32_t m_in_transit = 0;
    bool m_retired = false;
};

}  // namespace spindle::reactor
