#pragma once
// Timers ordered by (deadline, insertion sequence).
//
// A radix heap: deadlines leave the queue in non-decreasing order (the clock
// only moves forward), so a timer can sit in the bucket named by the highest
// bit in which its deadline differs from the last deadline taken out. Arming
// appends a 16-byte entry to a bucket (O(1), no comparison with other timers);
// taking timers out empties the lowest bucket into lower ones, moving each
// entry a few times in all, always by sequential reads and appends. A binary or
// 4-ary heap instead touches one entry per level on every pop, and at a million
// timers the lower levels miss the cache every time.
//
// Entries refer to timers through a slot table, which is what makes cancel
// O(1): it only clears the slot; the dead entry is dropped when it is reached,
// or by a purge once dead entries outnumber live ones. Nothing here is ever
// written back into a timer but its slot.

#include "relaxed.hpp"

#include <spindle/detail/timer_node.hpp>

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

namespace spindle::detail {

class timer_queue {
public:
    static constexpr std::int64_t no_deadline = std::numeric_limits<std::int64_t>::max();

    /// Arms `node` (which must not be armed) to fire at `deadline` (ns, steady
    /// clock). A deadline earlier than one already fired counts as that one.
    void insert(timer_node& node, std::int64_t deadline);

    /// Disarms `node`; it will not fire. No-op when not armed.
    void cancel(timer_node& node) noexcept;

    std::size_t size() const noexcept { return m_live; }
    bool empty() const noexcept { return m_live == 0; }

    /// The earliest deadline, or no_deadline. May be a cancelled timer's
    /// deadline (an early wake-up, never a late one).
    std::int64_t next_deadline() noexcept;

    /// Fires, in (deadline, insertion) order, every timer due at `now` that was
    /// armed before this call; timers armed by the callbacks wait for the next
    /// call. Returns how many fired.
    std::size_t fire_expired(std::int64_t now);

    /// Disarms every timer without firing it.
    void clear() noexcept;

private:
    struct entry {
        std::uint64_t key;  // deadline
        std::uint32_t seq;
        std::uint32_t slot;
    };
    struct bucket {
        std::vector<entry> items;
        std::uint64_t min = std::numeric_limits<std::uint64_t>::max();
    };
    static constexpr int bucket_count = 65;  // 0: key == m_last; i: highest differing bit is i-1

    int bucket_of(std::uint64_t key) const noexcept {
        return key == m_last ? 0 : 64 - __builtin_clzll(key ^ m_last);
    }
    void put(const entry& e);
    bool refill_bucket0(std::int64_t now);
    void drop_dead_front() noexcept;
    void purge() noexcept;
    std::size_t fire_due(std::int64_t now);
    std::uint32_t take_slot(timer_node& node);
    void free_slot(std::uint32_t slot) noexcept { m_free_slots.push_back(slot); }

    std::array<bucket, bucket_count> m_buckets;
    std::size_t m_front = 0;          // next entry of bucket 0 to take
    std::uint64_t m_nonempty = 0;     // bit i-1 set: bucket i (1..64) has entries
    std::uint64_t m_last = 0;         // the last deadline taken out
    std::vector<entry> m_scratch;     // a bucket being emptied
    std::vector<entry> m_staged;      // armed during fire_expired: queued after it
    bool m_firing = false;
    std::vector<timer_node*> m_slots;  // nullptr: free, or its timer was cancelled
    std::vector<std::uint32_t> m_free_slots;
    std::uint32_t m_seq = 0;
    relaxed<std::size_t> m_live{0};  // read by metrics() on any thread
    std::size_t m_dead = 0;  // cancelled entries still queued
};

}  // namespace spindle::detail
