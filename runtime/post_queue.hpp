#pragma once
// The queue of a loop's posts (private to the runtime): many threads push,
// the loop's thread pops. Dmitry Vyukov's intrusive MPSC queue: a push is
// one atomic exchange and one store; it never blocks.

#include <spindle/detail/post_node.hpp>

#include <atomic>
#include <cstdint>

namespace spindle::detail {

class post_queue {
public:
    post_queue() noexcept : m_tail(&m_stub), m_head(&m_stub) {}
    post_queue(const post_queue&) = delete;
    post_queue& operator=(const post_queue&) = delete;

    /// Any thread.
    void push(post_node* node) noexcept {
        node->m_next.store(nullptr, std::memory_order_relaxed);
        // seq_cst pairs with the loop's "about to sleep" flag: either the loop
        // sees this node before it sleeps, or the pusher sees the flag and wakes it.
        post_node* prev = m_tail.exchange(node, std::memory_order_seq_cst);
        prev->m_next.store(node, std::memory_order_release);
    }

    /// Loop thread. Returns nullptr when empty, or when a push is half done (the
    /// pusher then finishes in a moment; empty() stays false meanwhile).
    post_node* pop() noexcept {
        post_node* head = m_head;
        post_node* next = head->m_next.load(std::memory_order_acquire);
        if (head == &m_stub) {
            if (!next) return nullptr;
            m_head = next;
            head = next;
            next = next->m_next.load(std::memory_order_acquire);
        }
        if (next) {
            m_head = next;
            return head;
        }
        if (head != m_tail.load(std::memory_order_acquire)) return nullptr;
        push(&m_stub);
        next = head->m_next.load(std::memory_order_acquire);
        if (next) {
            m_head = next;
            return head;
        }
        return nullptr;
    }

    /// Loop thread.
    bool empty() const noexcept { return m_head == &m_stub && m_tail.load(std::memory_order_seq_cst) == &m_stub; }

private:
    alignas(64) std::atomic<post_node*> m_tail;
    alignas(64) post_node* m_head;
    post_node m_stub;
};

}  // namespace spindle::detail
