#pragma once
// A bounded single-producer single-consumer ring of fixed-size cells, the
// link between two loops of a group (private to the runtime). Items are
// built in place in their cell and handled in place by the consumer:
// nothing is moved, nothing allocated.
// Each side caches the other's index, so a push or a pop touches the shared
// line of the other side only when its cached view says full or empty.

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace spindle::detail {

/// `Cell` is the fixed-size unit items are built in (cross_loop.hpp's ring_cell).
template <class Cell>
class spsc_ring {
public:
    /// `capacity` is rounded up to a power of two.
    explicit spsc_ring(std::size_t capacity)
        : m_cells(new Cell[std::bit_ceil(capacity < 2 ? std::size_t{2} : capacity)]),
          m_mask(std::bit_ceil(capacity < 2 ? std::size_t{2} : capacity) - 1) {}
    spsc_ring(const spsc_ring&) = delete;
    spsc_ring& operator=(const spsc_ring&) = delete;

    std::size_t capacity() const noexcept { return m_mask + 1; }

    // --- producer thread
    /// The next free cell, or null when the ring is full. Build the item in
    /// it, then commit().
    Cell* reserve() noexcept {
        const std::uint64_t tail = m_tail.load(std::memory_order_relaxed);
        if (tail - m_head_cache > m_mask) {
            m_head_cache = m_head.load(std::memory_order_acquire);
            if (tail - m_head_cache > m_mask) return nullptr;
        }
        return &m_cells[tail & m_mask];
    }
    /// Publishes the cell reserve() gave.
    void commit() noexcept { m_tail.store(m_tail.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

    // --- consumer thread
    /// The oldest item, or null when none is published.
    Cell* front() noexcept {
        const std::uint64_t head = m_head.load(std::memory_order_relaxed);
        if (head == m_tail_cache) {
            m_tail_cache = m_tail.load(std::memory_order_acquire);
            if (head == m_tail_cache) return nullptr;
        }
        return &m_cells[head & m_mask];
    }
    /// Frees the cell front() gave, once its item is handled and destroyed.
    void pop() noexcept { m_head.store(m_head.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

    /// Any thread: whether an item is published and not popped (a snapshot).
    bool empty() const noexcept {
        return m_head.load(std::memory_order_acquire) == m_tail.load(std::memory_order_acquire);
    }

private:
    std::unique_ptr<Cell[]> m_cells;
    std::size_t m_mask;
    // The producer's line: its index and its view of the consumer's.
    alignas(64) std::atomic<std::uint64_t> m_tail{0};
    std::uint64_t m_head_cache = 0;
    // The consumer's line.
    alignas(64) std::atomic<std::uint64_t> m_head{0};
    std::uint64_t m_tail_cache = 0;
};

}  // namespace spindle::detail
