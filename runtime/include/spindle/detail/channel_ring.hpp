#pragma once
// The buffer of a channel<T> (channel.hpp).

#include <bit>
#include <cstddef>
#include <limits>
#include <memory>
#include <stdexcept>
#include <utility>

namespace spindle::detail {

/// A ring of raw slots, power-of-two sized. It grows (doubling) only when a
/// value must go in while it is full: never for a bounded channel in steady
/// state, amortised for an unbounded one.
template <class T>
class channel_ring {
public:
    explicit channel_ring(std::size_t slots) : m_mask(rounded(slots) - 1) {
        m_slots = std::allocator<T>().allocate(m_mask + 1);
    }
    channel_ring(const channel_ring&) = delete;
    channel_ring& operator=(const channel_ring&) = delete;
    ~channel_ring() {
        while (m_size) pop_front();
        std::allocator<T>().deallocate(m_slots, m_mask + 1);
    }

    std::size_t size() const noexcept { return m_size; }
    bool empty() const noexcept { return m_size == 0; }
    T& front() noexcept { return m_slots[m_head]; }

    template <class U>
    void push_back(U&& v) {
        if (m_size == m_mask + 1) grow();
        std::construct_at(m_slots + ((m_head + m_size) & m_mask), std::forward<U>(v));
        ++m_size;
    }
    void push_front(T&& v) {
        if (m_size == m_mask + 1) grow();
        const std::size_t at = (m_head - 1) & m_mask;
        std::construct_at(m_slots + at, std::move(v));
        m_head = at;
        ++m_size;
    }
    /// Puts `v` at position `at` from the front (at <= size()), shifting the
    /// values before it forward: O(at).
    void insert(std::size_t at, T&& v) {
        push_front(std::move(v));
        for (std::size_t i = 0; i < at; ++i) {
            using std::swap;
            swap(slot(i), slot(i + 1));
        }
    }
    void pop_front() noexcept {
        std::destroy_at(m_slots + m_head);
        m_head = (m_head + 1) & m_mask;
        --m_size;
    }

private:
    T& slot(std::size_t i) noexcept { return m_slots[(m_head + i) & m_mask]; }

    static std::size_t rounded(std::size_t slots) {
        if (slots > std::numeric_limits<std::size_t>::max() / 2)
            throw std::length_error("spindle: channel capacity too large");
        return std::bit_ceil(slots < 2 ? std::size_t{2} : slots);
    }

    void grow() {
        const std::size_t slots = (m_mask + 1) * 2;
        T* fresh = std::allocator<T>().allocate(slots);
        std::size_t moved = 0;
        try {
            for (; moved < m_size; ++moved)
                std::construct_at(fresh + moved, std::move_if_noexcept(m_slots[(m_head + moved) & m_mask]));
        } catch (...) {
            std::destroy_n(fresh, moved);
            std::allocator<T>().deallocate(fresh, slots);
            throw;
        }
        for (std::size_t i = 0; i < m_size; ++i) std::destroy_at(m_slots + ((m_head + i) & m_mask));
        std::allocator<T>().deallocate(m_slots, m_mask + 1);
        m_slots = fresh;
        m_mask = slots - 1;
        m_head = 0;
    }

    T* m_slots = nullptr;
    std::size_t m_mask;
    std::size_t m_head = 0;
    std::size_t m_size = 0;
};

}  // namespace spindle::detail
