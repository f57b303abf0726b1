#pragma once
// A circular doubly linked list with a sentinel. A node can unlink itself
// without knowing which list holds it, which is what makes "destroy a task or
// a waiter in the middle of a dispatch" safe and O(1).

namespace spindle::detail {

template <class Tag = void>
struct list_hook {
    list_hook* m_next = nullptr;
    list_hook* m_prev = nullptr;

    bool is_linked() const noexcept { return m_next != nullptr; }
    void unlink() noexcept {
        if (!m_next) return;
        m_prev->m_next = m_next;
        m_next->m_prev = m_prev;
        m_next = m_prev = nullptr;
    }
};

template <class T, class Tag = void>
class intrusive_list {
    using hook = list_hook<Tag>;

public:
    intrusive_list() noexcept { m_head.m_next = m_head.m_prev = &m_head; }
    intrusive_list(const intrusive_list&) = delete;
    intrusive_list& operator=(const intrusive_list&) = delete;
    ~intrusive_list() { clear(); }

    bool empty() const noexcept { return m_head.m_next == &m_head; }

    void push_back(T& item) noexcept {
        hook* h = &item;
        h->m_prev = m_head.m_prev;
        h->m_next = &m_head;
        m_head.m_prev->m_next = h;
        m_head.m_prev = h;
    }

    T* front() noexcept { return empty() ? nullptr : static_cast<T*>(m_head.m_next); }

    T* pop_front() noexcept {
        if (empty()) return nullptr;
        hook* h = m_head.m_next;
        h->unlink();
        return static_cast<T*>(h);
    }

    /// Moves every node of `other` to the end of this list.
    void splice_back(intrusive_list& other) noexcept {
        if (other.empty()) return;
        hook* first = other.m_head.m_next;
        hook* last = other.m_head.m_prev;
        first->m_prev = m_head.m_prev;
        m_head.m_prev->m_next = first;
        last->m_next = &m_head;
        m_head.m_prev = last;
        other.m_head.m_next = other.m_head.m_prev = &other.m_head;
    }

    /// Unlinks every node (without touching what they belong to otherwise).
    void clear() noexcept {
        while (pop_front()) {
        }
    }

    template <class F>
    void for_each(F&& f) {
        for (hook* h = m_head.m_next; h != &m_head; h = h->m_next) f(*static_cast<T*>(h));
    }
    template <class F>
    void for_each(F&& f) const {
        for (const hook* h = m_head.m_next; h != &m_head; h = h->m_next) f(*static_cast<const T*>(h));
    }

private:
    hook m_head;
};

}  // namespace spindle::detail
