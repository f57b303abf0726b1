#pragma once
// Timers ordered by (deadline, insertion sequence).
//
// A hierarchical timing wheel, as in the Linux kernel and Tokio, kept in
// arrays: 11 levels of 64 slots, level L's slots each spanning 64^L ns, so
// 1 ns at level 0 and the whole int64 range at the top. A timer sits at the
// level of the highest 6-bit group in which its deadline differs from
// `m_elapsed`, the start of the last slot taken out (or, once the wheel ran
// empty, the time it was armed again); so every timer of a level is earlier
// than every timer of the levels above, and slots of a level are in deadline
// order. A timer already due when armed goes to the level-0 slot of
// `m_elapsed`, the next one taken out. Arming appends a 16-byte entry to one
// slot (O(1), no comparison with other timers). Taking timers out visits only
// occupied slots (found by bit scans): a due slot of level 0 holds one
// deadline, and those armed late, and goes to the due run as it is (sorted
// by deadline and sequence when it has several); a due slot above moves its
// entries down a level or more. An entry moves at most once
// per level, always by sequential reads and appends.
//
// The due run is then fired in order with its slots and timers prefetched a
// few entries ahead: a million timers with random deadlines are a million
// random memory accesses, and this way they overlap instead of queueing.
//
// Wake-ups: the loop sleeps until next_wake(), the earliest time by which
// some timer must have fired. Each timer may be late by its slack: up to the
// next step of a grid (timer_slack, 50 us by default), or, for a timer armed
// more than 1024 grid steps ahead, up to 1/1024 of its delay, as Linux allows
// for poll and select timeouts. So a dense crowd of long timers shares
// wake-ups instead of waking the loop every grid step, and a short one is
// still on time. Never early: a timer fires only once its deadline passed.
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
#include <memory>
#include <vector>

namespace spindle::detail {

class timer_queue {
public:
    static constexpr std::int64_t no_deadline = std::numeric_limits<std::int64_t>::max();

    /// The wake-up grid step (ns, 0: none) and whether long timers' slack
    /// grows with their delay. Before the first insert.
    void set_slack(std::int64_t grid_ns, bool scaled) noexcept;

    /// Arms `node` (which must not be armed) to fire at `deadline` (ns, steady
    /// clock), armed at `now` (which sets its slack; by default it has only the
    /// grid's). A deadline already passed fires at the next call, in
    /// (deadline, insertion) order with the others due then.
    void insert(timer_node& node, std::int64_t deadline, std::int64_t now = no_deadline);

    /// Disarms `node`; it will not fire. No-op when not armed.
    void cancel(timer_node& node) noexcept;

    std::size_t size() const noexcept { return m_live; }
    bool empty() const noexcept { return m_live == 0; }

    /// The earliest deadline, or no_deadline. May be a cancelled timer's
    /// deadline (an early wake-up, never a late one).
    std::int64_t next_deadline() noexcept;

    /// When the loop must wake for the timers: no later than any timer's
    /// deadline plus its slack, possibly earlier; no_deadline when empty.
    std::int64_t next_wake() noexcept;

    /// Fires, in (deadline, insertion) order, every timer due at `now` that was
    /// armed before this call; timers armed by the callbacks wait for the next
    /// call. Returns how many fired.
    std::size_t fire_expired(std::int64_t now);

    /// Disarms every timer without firing it.
    void clear() noexcept;

    /// Entries the slots of `level` and above have room for (for tests of
    /// what the wheel keeps resident).
    std::size_t reserved_entries(int level) const noexcept;

private:
    static constexpr std::uint32_t slot_bits = 24;  // 16,777,215 timers armed at once per loop
    struct entry {
        std::uint64_t key;  // deadline
        std::uint32_t seq;
        std::uint32_t slot : slot_bits;
        std::uint32_t slack_log2 : 32 - slot_bits;  // slack 2^slack_log2 ns; 0: the grid's
    };
    struct wheel_slot {
        std::vector<entry> items;
        std::uint64_t min = std::numeric_limits<std::uint64_t>::max();       // earliest deadline
        std::uint64_t min_wake = std::numeric_limits<std::uint64_t>::max();  // earliest deadline + slack
    };
    static constexpr int level_bits = 6;
    static constexpr int slots_per_level = 1 << level_bits;
    static constexpr int level_count = (64 + level_bits - 1) / level_bits;  // 11

    static int level_of(std::uint64_t key, std::uint64_t elapsed) noexcept {
        const std::uint64_t differ = key ^ elapsed;
        return differ == 0 ? 0 : (63 - __builtin_clzll(differ)) / level_bits;
    }
    static std::size_t index_of(std::uint64_t key, int level) noexcept {
        return static_cast<std::size_t>((key >> (level * level_bits)) & (slots_per_level - 1));
    }
    wheel_slot& slot_at(int level, std::size_t index) noexcept {
        return m_wheel[static_cast<std::size_t>(level) * slots_per_level + index];
    }
    std::uint64_t slot_start(int level, std::size_t index) const noexcept {
        const int shift = level * level_bits;
        // The bits a slot of this level shares with m_elapsed: all above the level.
        const std::uint64_t within = shift + level_bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << (shift + level_bits)) - 1;
        return (m_elapsed & ~within) | (static_cast<std::uint64_t>(index) << shift);
    }
    std::uint64_t wake_of(const entry& e) const noexcept;
    [[gnu::always_inline]] inline void put(const entry& e);
    void collect_due(std::int64_t now);
    void empty_slot(wheel_slot& s, int level) noexcept;
    std::size_t fire_due() noexcept;
    void purge() noexcept;
    std::uint32_t take_slot(timer_node& node);
    // A slot of the table holds its timer, null once that timer was
    // cancelled (its entry still queued), or, free, the next free slot as
    // (next << 1) | 1: a list threaded through the table itself, so freeing a
    // slot writes only where the timer's entry pointed anyway. Kept as
    // pointers, which no store of an integer may alias.
    static constexpr std::uint32_t no_free_slot = 0xffffffff;
    timer_node* node_in(std::uint32_t slot) const noexcept { return m_slots[slot]; }
    void free_slot(std::uint32_t slot) noexcept {
        m_slots[slot] = reinterpret_cast<timer_node*>((std::uintptr_t{m_free_head} << 1) | 1);
        m_free_head = slot;
        ++m_free_count;
    }

    static constexpr std::size_t wheel_size = static_cast<std::size_t>(level_count) * slots_per_level;
    // Allocated with the first timer: a loop that never arms one does not
    // carry the wheel's 28 KiB.
    std::unique_ptr<wheel_slot[]> m_wheel;
    std::array<std::uint64_t, level_count> m_occupied{};  // bit i: slot i of the level has entries
    std::uint32_t m_levels = 0;                           // bit L: level L has entries
    // The start of the last slot taken out, or the time the wheel was last
    // armed while empty; only entries already due when armed are earlier.
    // Only moves forward.
    std::uint64_t m_elapsed = 0;
    std::uint64_t m_grid = 0;     // wake-up grid step, ns
    bool m_scaled_slack = false;
    std::vector<entry> m_due;     // taken out by fire_expired, fired in order
    bool m_firing = false;
    std::vector<timer_node*> m_slots;  // see free_slot
    std::uint32_t m_free_head = no_free_slot;
    std::uint32_t m_free_count = 0;
    std::uint32_t m_seq = 0;
    relaxed<std::size_t> m_live{0};  // read by metrics() on any thread
    std::size_t m_dead = 0;  // cancelled entries still queued
};

}  // namespace spindle::detail
