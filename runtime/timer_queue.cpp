#include "timer_queue.hpp"

#include <algorithm>
#include <stdexcept>

namespace spindle::detail {

namespace {
// Purging costs O(n); waiting until dead entries outnumber live ones (and a
// floor, so small queues never bother) keeps cancel amortised O(1).
constexpr std::size_t purge_floor = 256;

// How far ahead of the timer being fired its successors are fetched: the slot
// table entry first, then (once that has arrived) the timer it points to.
constexpr std::size_t prefetch_slot_ahead = 32;
constexpr std::size_t prefetch_timer_ahead = 16;

constexpr std::size_t initial_slot_capacity = 4;

// A slot of this level or above gives its storage back when it empties: it
// comes round again only after 64^(level + 1) ns (68 s for level 5), and a
// crowd of timers that passed through it once (all of them, for a wheel
// whose first timers are far from its start) would keep it resident for
// nothing. The slots below cycle within a second and keep theirs, so a
// steady stream of timers allocates nothing.
constexpr int release_from_level = 5;
constexpr std::size_t released_above = 256;  // entries (4 KiB)

// A timer armed this many grid steps ahead or more gets slack of 1/1024 of its delay.
constexpr int scaled_slack_shift = 10;

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept {
    std::uint64_t sum;
    return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<std::uint64_t>::max() : sum;
}

bool seq_before(std::uint32_t a, std::uint32_t b) noexcept {
    // Sequence numbers wrap; compare them as a distance.
    return static_cast<std::int32_t>(a - b) < 0;
}
}  // namespace

void timer_queue::set_slack(std::int64_t grid_ns, bool scaled) noexcept {
    m_grid = grid_ns > 0 ? static_cast<std::uint64_t>(grid_ns) : 0;
    m_scaled_slack = scaled;
}

std::uint64_t timer_queue::wake_of(const entry& e) const noexcept {
    if (e.slack_log2 != 0) return saturating_add(e.key, std::uint64_t{1} << e.slack_log2);
    if (m_grid == 0) return e.key;
    // Up to the grid: late by less than one step, never early.
    const std::uint64_t up = saturating_add(e.key, m_grid - 1);
    return up == std::numeric_limits<std::uint64_t>::max() ? up : up / m_grid * m_grid;
}

std::uint32_t timer_queue::take_slot(timer_node& node) {
    if (!m_wheel) [[unlikely]] {
        // The first timer of this queue: the wheel, with room for a few
        // entries in every slot at once (56 KiB), so the clock moving on into
        // slots not used yet does not allocate, one slot at a time, long
        // after start-up.
        auto wheel = std::make_unique<wheel_slot[]>(wheel_size);
        for (std::size_t i = 0; i < wheel_size; ++i) wheel[i].items.reserve(initial_slot_capacity);
        m_wheel = std::move(wheel);
    }
    // Every slot free (the queue ran dry): start again from slot 0, so timers
    // armed one after another get neighbouring slots, not the scattered order
    // in which the last ones fired.
    if (m_free_count == m_slots.size()) {
        m_slots.clear();
        m_free_head = no_free_slot;
        m_free_count = 0;
    }
    if (m_free_head != no_free_slot) {
        const std::uint32_t s = m_free_head;
        m_free_head = static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(m_slots[s]) >> 1);
        --m_free_count;
        m_slots[s] = &node;
        return s;
    }
    if (m_slots.size() >= (std::size_t{1} << slot_bits) - 1)
        throw std::length_error("spindle: more than 16,777,215 timers armed on one loop");
    m_slots.push_back(&node);
    return static_cast<std::uint32_t>(m_slots.size() - 1);
}

inline void timer_queue::put(const entry& e) {
    // A timer already due (earlier than m_elapsed) goes to the level-0 slot
    // of m_elapsed, the next one taken out, with its own deadline: that slot
    // is sorted by (deadline, sequence) as it is taken out, so timers armed
    // late still fire in deadline order.
    const std::uint64_t at = e.key < m_elapsed ? m_elapsed : e.key;
    const int level = level_of(at, m_elapsed);
    const std::size_t index = index_of(at, level);
    wheel_slot& s = slot_at(level, index);
    s.items.push_back(e);
    if (e.key < s.min) s.min = e.key;
    const std::uint64_t wake = wake_of(e);
    if (wake < s.min_wake) s.min_wake = wake;
    m_occupied[static_cast<std::size_t>(level)] |= std::uint64_t{1} << index;
    m_levels |= 1u << level;
}

void timer_queue::insert(timer_node& node, std::int64_t deadline, std::int64_t now) {
    // An empty wheel starts again from now. Otherwise its first timers would
    // sit at the level where they differ from a start long past (the top
    // levels, for a loop's first timers), and a crowd armed together would
    // be moved down through every level once, holding memory at each.
    if (m_levels == 0 && now != no_deadline && now > 0 && static_cast<std::uint64_t>(now) > m_elapsed)
        m_elapsed = static_cast<std::uint64_t>(now);
    const std::uint64_t key = deadline < 0 ? 0 : static_cast<std::uint64_t>(deadline);
    std::uint32_t slack_log2 = 0;
    if (m_scaled_slack && now < deadline && now >= 0) {
        const std::uint64_t allowed = (static_cast<std::uint64_t>(deadline) - static_cast<std::uint64_t>(now)) >> scaled_slack_shift;
        // A power of two no larger than 1/1024 of the delay; only where it beats the grid.
        if (allowed > m_grid && allowed > 1) slack_log2 = static_cast<std::uint32_t>(63 - __builtin_clzll(allowed));
        if ((std::uint64_t{1} << slack_log2) <= m_grid) slack_log2 = 0;
    }
    std::uint32_t slot = take_slot(node);
    try {
        // Armed by a callback of fire_expired: it goes into the wheel, not into
        // the due run being fired, so it waits for the next call.
        entry e{key, m_seq, 0, 0};
        e.slot = slot & ((1u << slot_bits) - 1);
        e.slack_log2 = slack_log2;
        put(e);
    } catch (...) {
        free_slot(slot);
        throw;
    }
    ++m_seq;
    node.m_slot = slot;
    ++m_live;
}

void timer_queue::cancel(timer_node& node) noexcept {
    if (!node.armed()) return;
    m_slots[node.m_slot] = nullptr;
    node.m_slot = timer_node::no_slot;
    --m_live;
    ++m_dead;
    // Not while firing: the due run refers to slots by position.
    if (!m_firing && m_dead > purge_floor && m_dead > m_live) purge();
}

std::int64_t timer_queue::next_deadline() noexcept {
    // Only cancelled entries left: nothing would ever fire to drop them, and
    // their deadlines would make the loop wake (or spin) for nothing.
    if (m_live == 0) {
        if (m_dead > 0 && !m_firing) purge();
        return no_deadline;
    }
    if (!m_due.empty()) return static_cast<std::int64_t>(m_elapsed);  // left by a throw
    if (m_levels == 0) return no_deadline;
    // The lowest occupied slot of the lowest level holds the earliest deadline.
    const int level = __builtin_ctz(m_levels);
    const auto index = static_cast<std::size_t>(__builtin_ctzll(m_occupied[static_cast<std::size_t>(level)]));
    return static_cast<std::int64_t>(slot_at(level, index).min);
}

std::int64_t timer_queue::next_wake() noexcept {
    if (m_live == 0 || m_levels == 0 || !m_due.empty()) return next_deadline();
    // Slots in deadline order: a later slot can lower the answer only while it
    // starts before it. At most every occupied slot (704) is visited, once per
    // sleep of the loop, which costs a hundred times more.
    std::uint64_t best = std::numeric_limits<std::uint64_t>::max();
    for (std::uint32_t levels = m_levels; levels != 0; levels &= levels - 1) {
        const int level = __builtin_ctz(levels);
        for (std::uint64_t bits = m_occupied[static_cast<std::size_t>(level)]; bits != 0; bits &= bits - 1) {
            const auto index = static_cast<std::size_t>(__builtin_ctzll(bits));
            if (slot_start(level, index) >= best) return static_cast<std::int64_t>(best);
            best = std::min(best, slot_at(level, index).min_wake);
        }
    }
    return best >= static_cast<std::uint64_t>(no_deadline) ? no_deadline : static_cast<std::int64_t>(best);
}

void timer_queue::empty_slot(wheel_slot& s, int level) noexcept {
    if (level >= release_from_level && s.items.capacity() > released_above)
        std::vector<entry>().swap(s.items);
    else
        s.items.clear();
}

// Moves every entry due at `now` into m_due, in (deadline, sequence) order,
// by taking out occupied slots lowest first while they start no later than
// `now`: a slot that ends by `now` to the due run, one that straddles it a
// level or more down.
void timer_queue::collect_due(std::int64_t now) {
    if (now < 0) return;
    const auto t = static_cast<std::uint64_t>(now);
    while (m_levels != 0) {
        const int level = __builtin_ctz(m_levels);
        auto& occupied = m_occupied[static_cast<std::size_t>(level)];
        const auto index = static_cast<std::size_t>(__builtin_ctzll(occupied));
        const int shift = level * level_bits;
        const std::uint64_t start = slot_start(level, index);
        if (start > t) return;
        wheel_slot& s = slot_at(level, index);
        occupied &= ~(std::uint64_t{1} << index);
        if (occupied == 0) m_levels &= ~(1u << level);
        m_elapsed = start;
        s.min = std::numeric_limits<std::uint64_t>::max();
        s.min_wake = std::numeric_limits<std::uint64_t>::max();
        const std::uint64_t end = start + ((std::uint64_t{1} << shift) - 1);  // level 0: start
        if (end <= t) {
            // Due as a whole, and earlier than everything left: sorting it is
            // cheaper than moving its entries down level by level. (A slot of
            // level 0 holds one deadline, and timers armed after theirs had
            // passed: entries that came down from different slots may be out
            // of sequence order.)
            const std::size_t first = m_due.size();
            m_due.insert(m_due.end(), s.items.begin(), s.items.end());
            empty_slot(s, level);
            if (m_due.size() - first > 1)
                std::sort(m_due.begin() + static_cast<std::ptrdiff_t>(first), m_due.end(), [](const entry& a, const entry& b) {
                    return a.key != b.key ? a.key < b.key : seq_before(a.seq, b.seq);
                });
            continue;
        }
        // Every entry shares all bits above `shift` with `start`: it lands lower.
        std::size_t moved = 0;
        try {
            for (; moved < s.items.size(); ++moved) put(s.items[moved]);
        } catch (...) {
            // Out of memory: keep each entry exactly once, the rest where it was.
            s.items.erase(s.items.begin(), s.items.begin() + static_cast<std::ptrdiff_t>(moved));
            for (const entry& e : s.items) {
                s.min = std::min(s.min, e.key);
                s.min_wake = std::min(s.min_wake, wake_of(e));
            }
            occupied |= std::uint64_t{1} << index;
            m_levels |= 1u << level;
            throw;
        }
        empty_slot(s, level);
    }
}

std::size_t timer_queue::fire_due() noexcept {
    // Callbacks may arm (into the wheel) or cancel (clearing a slot) any timer,
    // but never touch m_due, so it is read in place.
    const entry* due = m_due.data();
    const std::size_t n = m_due.size();
    std::size_t fired = 0;
    for (std::size_t i = 0; i < n; ++i) {
        if (i + prefetch_slot_ahead < n) __builtin_prefetch(&m_slots[due[i + prefetch_slot_ahead].slot]);
        if (i + prefetch_timer_ahead < n)
            if (const timer_node* next = node_in(due[i + prefetch_timer_ahead].slot)) {
                // The node and what follows it (a timer's callback and context),
                // which may lie on the next cache line.
                __builtin_prefetch(next, 1);
                __builtin_prefetch(reinterpret_cast<const char*>(next) + 56);
            }
        const std::uint32_t slot = due[i].slot;
        timer_node* node = node_in(slot);
        free_slot(slot);
        if (!node) {
            --m_dead;
            continue;
        }
        node->m_slot = timer_node::no_slot;
        --m_live;
        ++fired;
        node->m_fire(*node);
    }
    m_due.clear();
    return fired;
}

std::size_t timer_queue::fire_expired(std::int64_t now) {
    if (m_firing) return 0;
    collect_due(now);
    if (m_due.empty()) return 0;
    m_firing = true;
    const std::size_t fired = fire_due();
    m_firing = false;
    if (m_dead > purge_floor && m_dead > m_live) purge();
    return fired;
}

void timer_queue::purge() noexcept {
    // Drop dead entries everywhere; slot minimums are recomputed from the living.
    auto dead = [this](const entry& e) {
        if (m_slots[e.slot] != nullptr) return false;
        free_slot(e.slot);
        return true;
    };
    m_due.erase(std::remove_if(m_due.begin(), m_due.end(), dead), m_due.end());
    for (int level = 0; level < level_count; ++level) {
        auto& occupied = m_occupied[static_cast<std::size_t>(level)];
        for (std::uint64_t bits = occupied; bits != 0; bits &= bits - 1) {
            const auto index = static_cast<std::size_t>(__builtin_ctzll(bits));
            wheel_slot& s = slot_at(level, index);
            s.items.erase(std::remove_if(s.items.begin(), s.items.end(), dead), s.items.end());
            s.min = std::numeric_limits<std::uint64_t>::max();
            s.min_wake = std::numeric_limits<std::uint64_t>::max();
            for (const entry& e : s.items) {
                s.min = std::min(s.min, e.key);
                s.min_wake = std::min(s.min_wake, wake_of(e));
            }
            if (s.items.empty()) occupied &= ~(std::uint64_t{1} << index);
        }
        if (occupied == 0) m_levels &= ~(1u << level);
    }
    m_dead = 0;
}

std::size_t timer_queue::reserved_entries(int level) const noexcept {
    std::size_t n = 0;
    if (!m_wheel) return 0;
    for (std::size_t i = static_cast<std::size_t>(level) * slots_per_level; i < wheel_size; ++i) n += m_wheel[i].items.capacity();
    return n;
}

void timer_queue::clear() noexcept {
    auto disarm = [this](const entry& e) {
        if (timer_node* node = node_in(e.slot)) node->m_slot = timer_node::no_slot;
    };
    for (const entry& e : m_due) disarm(e);
    m_due.clear();
    for (int level = 0; level < level_count; ++level) {
        for (std::uint64_t bits = m_occupied[static_cast<std::size_t>(level)]; bits != 0; bits &= bits - 1) {
            wheel_slot& s = slot_at(level, static_cast<std::size_t>(__builtin_ctzll(bits)));
            for (const entry& e : s.items) disarm(e);
            s.items.clear();
            s.min = std::numeric_limits<std::uint64_t>::max();
            s.min_wake = std::numeric_limits<std::uint64_t>::max();
        }
        m_occupied[static_cast<std::size_t>(level)] = 0;
    }
    m_levels = 0;
    m_slots.clear();
    m_free_head = no_free_slot;
    m_free_count = 0;
    m_live = 0;
    m_dead = 0;
}

}  // namespace spindle::detail
