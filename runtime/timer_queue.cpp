#include "timer_queue.hpp"

#include <algorithm>

namespace spindle::detail {

namespace {
// Purging costs O(n); waiting until dead entries outnumber live ones (and a
// floor, so small queues never bother) keeps cancel amortised O(1).
constexpr std::size_t purge_floor = 256;

bool seq_before(std::uint32_t a, std::uint32_t b) noexcept {
    // Sequence numbers wrap; compare them as a distance.
    return static_cast<std::int32_t>(a - b) < 0;
}
}  // namespace

std::uint32_t timer_queue::take_slot(timer_node& node) {
    if (!m_free_slots.empty()) {
        std::uint32_t s = m_free_slots.back();
        m_free_slots.pop_back();
        m_slots[s] = &node;
        return s;
    }
    // Keep room for every slot in the free list, so releasing one never
    // allocates; grow both before changing either, so a throw changes nothing.
    if (m_slots.size() == m_slots.capacity()) m_slots.reserve(m_slots.size() * 2 + 16);
    if (m_free_slots.capacity() < m_slots.capacity()) m_free_slots.reserve(m_slots.capacity());
    m_slots.push_back(&node);
    return static_cast<std::uint32_t>(m_slots.size() - 1);
}

void timer_queue::put(const entry& e) {
    const int b = bucket_of(e.key);
    bucket& bk = m_buckets[static_cast<std::size_t>(b)];
    bk.items.push_back(e);
    if (b > 0) {
        bk.min = std::min(bk.min, e.key);
        m_nonempty |= std::uint64_t{1} << (b - 1);
    }
}

void timer_queue::insert(timer_node& node, std::int64_t deadline) {
    std::uint64_t key = deadline < 0 ? 0 : static_cast<std::uint64_t>(deadline);
    if (key < m_last) key = m_last;  // already due: the queue only moves forward
    std::uint32_t slot = take_slot(node);
    try {
        // Bucket 0 is kept in sequence order; a new entry has the highest sequence.
        // Armed by a callback of fire_expired: kept aside until it returns, so it
        // neither fires in this call nor holds back what is due.
        if (m_firing)
            m_staged.push_back(entry{key, m_seq, slot});
        else
            put(entry{key, m_seq, slot});
    } catch (...) {
        m_slots[slot] = nullptr;
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
    if (m_dead > purge_floor && m_dead > m_live) purge();
}

void timer_queue::drop_dead_front() noexcept {
    auto& front = m_buckets[0].items;
    while (m_front < front.size() && m_slots[front[m_front].slot] == nullptr) {
        free_slot(front[m_front].slot);
        --m_dead;
        ++m_front;
    }
    if (m_front == front.size()) {
        front.clear();
        m_front = 0;
    }
}

std::int64_t timer_queue::next_deadline() noexcept {
    // Only cancelled entries left: nothing would ever fire to drop them, and
    // their deadlines would make the loop wake (or spin) for nothing.
    if (m_live == 0) {
        if (m_dead > 0) purge();
        return no_deadline;
    }
    drop_dead_front();
    if (!m_buckets[0].items.empty()) return static_cast<std::int64_t>(m_last);
    if (m_nonempty == 0) return no_deadline;
    const int b = __builtin_ctzll(m_nonempty) + 1;
    return static_cast<std::int64_t>(m_buckets[static_cast<std::size_t>(b)].min);
}

// Bucket 0 is empty: if the lowest bucket holds a deadline due at `now`, move
// its entries down, so bucket 0 gets every entry with the smallest deadline.
bool timer_queue::refill_bucket0(std::int64_t now) {
    if (m_nonempty == 0) return false;
    const int b = __builtin_ctzll(m_nonempty) + 1;
    bucket& bk = m_buckets[static_cast<std::size_t>(b)];
    if (static_cast<std::int64_t>(bk.min) > now) return false;
    m_last = bk.min;  // never beyond `now`, so later deadlines are never below it
    // Copied out rather than swapped, so every bucket keeps its capacity and a
    // steady state allocates nothing.
    m_scratch.assign(bk.items.begin(), bk.items.end());
    bk.items.clear();
    bk.min = std::numeric_limits<std::uint64_t>::max();
    m_nonempty &= ~(std::uint64_t{1} << (b - 1));
    // Every entry lands in a lower bucket: they all share bit b-1 with m_last now.
    for (const entry& e : m_scratch) put(e);
    m_scratch.clear();
    // Entries with equal deadlines may have reached bucket 0 from different
    // buckets; restore insertion order among them.
    auto& front = m_buckets[0].items;
    if (front.size() > 1)
        std::sort(front.begin(), front.end(), [](const entry& a, const entry& c) { return seq_before(a.seq, c.seq); });
    return true;
}

std::size_t timer_queue::fire_expired(std::int64_t now) {
    struct firing_scope {
        bool& flag;
        explicit firing_scope(bool& f) : flag(f) { flag = true; }
        ~firing_scope() { flag = false; }
    };
    std::size_t fired;
    {
        firing_scope scope(m_firing);
        fired = fire_due(now);
    }
    for (const entry& e : m_staged) put(entry{std::max(e.key, m_last), e.seq, e.slot});
    m_staged.clear();
    return fired;
}

std::size_t timer_queue::fire_due(std::int64_t now) {
    std::size_t fired = 0;
    for (;;) {
        auto& front = m_buckets[0].items;
        if (m_front == front.size()) {
            front.clear();
            m_front = 0;
            if (!refill_bucket0(now)) return fired;
            continue;
        }
        const entry e = front[m_front];
        if (static_cast<std::int64_t>(e.key) > now) return fired;
        ++m_front;
        timer_node* node = m_slots[e.slot];
        m_slots[e.slot] = nullptr;
        free_slot(e.slot);
        if (!node) {
            --m_dead;
            continue;
        }
        node->m_slot = timer_node::no_slot;
        --m_live;
        ++fired;
        // The callback may arm or cancel any timer, this one included (an
        // append to bucket 0 may move its storage: `front` is re-read above).
        node->m_fire(*node);
    }
}

void timer_queue::purge() noexcept {
    // Drop dead entries everywhere; bucket minimums are recomputed from the living.
    auto& front = m_buckets[0].items;
    front.erase(front.begin(), front.begin() + static_cast<std::ptrdiff_t>(m_front));
    m_front = 0;
    m_nonempty = 0;
    for (std::size_t b = 0; b < m_buckets.size(); ++b) {
        bucket& bk = m_buckets[b];
        bk.min = std::numeric_limits<std::uint64_t>::max();
        auto keep = std::remove_if(bk.items.begin(), bk.items.end(), [this](const entry& e) {
            if (m_slots[e.slot] != nullptr) return false;
            free_slot(e.slot);
            return true;
        });
        bk.items.erase(keep, bk.items.end());
        if (b > 0 && !bk.items.empty()) {
            for (const entry& e : bk.items) bk.min = std::min(bk.min, e.key);
            m_nonempty |= std::uint64_t{1} << (b - 1);
        }
    }
    auto keep = std::remove_if(m_staged.begin(), m_staged.end(), [this](const entry& e) {
        if (m_slots[e.slot] != nullptr) return false;
        free_slot(e.slot);
        return true;
    });
    m_staged.erase(keep, m_staged.end());
    m_dead = 0;
}

void timer_queue::clear() noexcept {
    for (const entry& e : m_staged)
        if (timer_node* node = m_slots[e.slot]) node->m_slot = timer_node::no_slot;
    m_staged.clear();
    for (bucket& bk : m_buckets) {
        for (const entry& e : bk.items)
            if (timer_node* node = m_slots[e.slot]) node->m_slot = timer_node::no_slot;
        bk.items.clear();
        bk.min = std::numeric_limits<std::uint64_t>::max();
    }
    m_front = 0;
    m_nonempty = 0;
    m_slots.clear();
    m_free_slots.clear();
    m_live = 0;
    m_dead = 0;
}

}  // namespace spindle::detail
