#pragma once
// Timers ordered by (deadline, insertion sequence).
//
// A 4-ary implicit heap of 16-byte entries: the four children of a node share
// one cache line, so a sift touches about half the lines a binary heap does,
// and no entry points at its timer. The heap refers to timers through a slot
// table, which is what makes cancel O(1): it only clears the slot; the dead
// entry is dropped when it reaches the top, or by a purge once dead entries
// outnumber live ones. Nothing in the heap is ever written back into a timer,
// so a sift never misses the cache on timer memory.

#include <cstdint>
#include <limits>
#include <vector>

namespace spindle::detail {

struct timer_node {
    using fire_fn = void (*)(timer_node&) noexcept;
    static constexpr std::uint32_t no_slot = std::numeric_limits<std::uint32_t>::max();

    fire_fn m_fire = nullptr;
    std::uint32_t m_slot = no_slot;

    bool armed() const noexcept { return m_slot != no_slot; }
};

class timer_queue {
public:
    static constexpr std::int64_t no_deadline = std::numeric_limits<std::int64_t>::max();

    /// Arms `node` (which must not be armed) to fire at `deadline` (ns, steady clock).
    void insert(timer_node& node, std::int64_t deadline);

    /// Disarms `node`; it will not fire. No-op when not armed.
    void cancel(timer_node& node) noexcept;

    std::size_t size() const noexcept { return m_live; }
    bool empty() const noexcept { return m_live == 0; }

    /// The earliest live deadline, or no_deadline.
    std::int64_t next_deadline() noexcept;

    /// Fires, in (deadline, insertion) order, every timer due at `now` that was
    /// armed before this call; timers armed by the callbacks wait for the next call.
    /// Returns how many fired.
    std::size_t fire_expired(std::int64_t now);

    /// Disarms every timer without firing it.
    void clear() noexcept;

private:
    struct entry {
        std::int64_t deadline;
        std::uint32_t seq;
        std::uint32_t slot;
    };

    static bool before(const entry& a, const entry& b) noexcept {
        if (a.deadline != b.deadline) return a.deadline < b.deadline;
        // Sequence numbers wrap; compare them as a distance.
        return static_cast<std::int32_t>(a.seq - b.seq) < 0;
    }

    void pop_top() noexcept;
    void sift_up(std::size_t i) noexcept;
    void sift_down(std::size_t i) noexcept;
    void drop_dead_top() noexcept;
    void purge() noexcept;
    std::uint32_t take_slot(timer_node& node);

    std::vector<entry> m_heap;
    std::vector<timer_node*> m_slots;  // nullptr: free, or its timer was cancelled
    std::vector<std::uint32_t> m_free_slots;
    std::uint32_t m_seq = 0;
    std::size_t m_live = 0;
    std::size_t m_dead = 0;  // cancelled entries still in the heap
};

}  // namespace spindle::detail
