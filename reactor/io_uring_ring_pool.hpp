#pragma once
// The pool of pooled receives, its free buffers handed to the kernel as a
// ring of provided buffers: a receive then names only the group, and the
// kernel picks a buffer once data has arrived. Buffer ids below the ring's
// size live in the ring when free; the rest (lent while the ring is full, or
// all of them without a ring) on the free list.

#include "io_uring_backend.hpp"

#include <spindle/reactor/buffer_pool.hpp>

#include <liburing.h>

#include <cstddef>
#include <cstdint>

namespace spindle::reactor {

class io_uring_backend::ring_pool final : public buffer_pool {
public:
    static constexpr std::uint16_t group = 0;

    explicit ring_pool(std::size_t buffer_size) noexcept : buffer_pool(buffer_size) {}

    // Registers a ring of `entries` (a power of two) with its first chunk.
    // False when the kernel has no rings of provided buffers (before 5.19):
    // every receive then takes the plain way.
    bool attach(::io_uring& ring, std::uint32_t entries) noexcept;
    void detach(::io_uring& ring) noexcept;
    bool has_ring() const noexcept { return m_ring != nullptr; }

    // The ring ran dry: one more chunk for it. False once it holds all it can.
    bool grow_ring() noexcept;
    // A completion handed the kernel's pick over to its operation.
    void lent_by_kernel() noexcept {
        --m_in_ring;
        add_lent(1);
    }
    // The kernel's pick for a completion that hands it to nobody: straight back.
    void recycle(std::uint32_t id) noexcept {
        --m_in_ring;
        on_free(id);
    }
    // Buffers in the ring for the kernel to pick, as the completions seen so
    // far tell: a pick whose completion is not collected yet still counts.
    std::uint32_t in_ring() const noexcept { return m_in_ring; }

private:
    void on_free(std::uint32_t id) noexcept override;

    ::io_uring_buf_ring* m_ring = nullptr;
    std::uint32_t m_entries = 0;
    std::uint32_t m_in_ring = 0;
    int m_mask = 0;
};

}  // namespace spindle::reactor
