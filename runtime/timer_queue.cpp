#include <spindle/detail/timer_queue.hpp>

#include <algorithm>

namespace spindle::detail {

namespace {
constexpr std::size_t arity = 4;
// Purging costs O(n); waiting until dead entries outnumber live ones (and a
// floor, so small heaps never bother) keeps cancel amortised O(1).
constexpr std::size_t purge_floor = 256;
}  // namespace

std::uint32_t timer_queue::take_slot(timer_node& node) {
    if (!m_free_slots.empty()) {
        std::uint32_t s = m_free_slots.back();
        m_free_slots.pop_back();
        m_slots[s] = &node;
        return s;
    }
    m_slots.push_back(&node);
    // Keep room for every slot in the free list, so releasing one never allocates.
    if (m_free_slots.capacity() < m_slots.capacity()) m_free_slots.reserve(m_slots.capacity());
    return static_cast<std::uint32_t>(m_slots.size() - 1);
}

void timer_queue::insert(timer_node& node, std::int64_t deadline) {
    std::uint32_t slot = take_slot(node);
    node.m_slot = slot;
    m_heap.push_back(entry{deadline, m_seq++, slot});
    sift_up(m_heap.size() - 1);
    ++m_live;
}

void timer_queue::cancel(timer_node& node) noexcept {
    if (!node.armed()) return;
    m_slots[node.m_slot] = nullptr;
    node.m_slot = timer_node::no_slot;
    --m_live;
    ++m_dead;
    if (m_dead > purge_floor && m_dead > m_live) {
        purge();
    }
}

void timer_queue::sift_up(std::size_t i) noexcept {
    entry moving = m_heap[i];
    while (i > 0) {
        std::size_t parent = (i - 1) / arity;
        if (!before(moving, m_heap[parent])) break;
        m_heap[i] = m_heap[parent];
        i = parent;
    }
    m_heap[i] = moving;
}

void timer_queue::sift_down(std::size_t i) noexcept {
    const std::size_t n = m_heap.size();
    entry moving = m_heap[i];
    for (;;) {
        std::size_t first = i * arity + 1;
        if (first >= n) break;
        std::size_t last = std::min(first + arity, n);
        std::size_t best = first;
        for (std::size_t c = first + 1; c < last; ++c)
            if (before(m_heap[c], m_heap[best])) best = c;
        if (!before(m_heap[best], moving)) break;
        m_heap[i] = m_heap[best];
        i = best;
    }
    m_heap[i] = moving;
}

void timer_queue::pop_top() noexcept {
    m_heap.front() = m_heap.back();
    m_heap.pop_back();
    if (!m_heap.empty()) sift_down(0);
}

void timer_queue::drop_dead_top() noexcept {
    while (!m_heap.empty() && m_slots[m_heap.front().slot] == nullptr) {
        // Never allocates: take_slot keeps the free list's capacity >= m_slots'.
        m_free_slots.push_back(m_heap.front().slot);
        --m_dead;
        pop_top();
    }
}

std::int64_t timer_queue::next_deadline() noexcept {
    drop_dead_top();
    return m_heap.empty() ? no_deadline : m_heap.front().deadline;
}

std::size_t timer_queue::fire_expired(std::int64_t now) {
    const std::uint32_t first_new = m_seq;
    std::size_t fired = 0;
    while (!m_heap.empty()) {
        const entry top = m_heap.front();
        if (top.deadline > now || static_cast<std::int32_t>(top.seq - first_new) >= 0) break;
        pop_top();
        timer_node* node = m_slots[top.slot];
        m_slots[top.slot] = nullptr;
        m_free_slots.push_back(top.slot);
        if (!node) {
            --m_dead;
            continue;
        }
        node->m_slot = timer_node::no_slot;
        --m_live;
        ++fired;
        // The callback may arm or cancel any timer, this one included.
        node->m_fire(*node);
    }
    return fired;
}

void timer_queue::purge() noexcept {
    auto keep = std::remove_if(m_heap.begin(), m_heap.end(), [this](const entry& e) {
        if (m_slots[e.slot] != nullptr) return false;
        m_free_slots.push_back(e.slot);
        return true;
    });
    m_heap.erase(keep, m_heap.end());
    m_dead = 0;
    // Floyd's heapify: O(n).
    for (std::size_t i = m_heap.size() / arity + 1; i-- > 0;)
        if (i < m_heap.size()) sift_down(i);
}

void timer_queue::clear() noexcept {
    for (const entry& e : m_heap)
        if (timer_node* node = m_slots[e.slot]) node->m_slot = timer_node::no_slot;
    m_heap.clear();
    m_slots.clear();
    m_free_slots.clear();
    m_live = 0;
    m_dead = 0;
}

}  // namespace spindle::detail
