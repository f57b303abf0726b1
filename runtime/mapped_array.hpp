#pragma once
// A growable array of trivially copyable values for the timer wheel, whose
// slots and tables swell to tens of thousands of entries when a crowd of
// timers is armed. A std::vector would double by copying into a new heap
// block and free the old one: the old blocks stay resident as heap free
// space, and the unused half of the last one is resident where the heap
// already touched it. Here an array of a page or more is a mapping of its own,
// grown with mremap: nothing copied, nothing left behind, and its pages past
// the last entry written are never made resident. Smaller arrays (most of
// them) live in the heap as before.
//
// Under AddressSanitizer every array stays in the heap, so that reads past
// the end are still reported.

#include <cstddef>
#include <cstring>
#include <new>
#include <type_traits>

namespace spindle::detail {

/// Storage of `new_bytes`, keeping the first `used_bytes` of `old` (of
/// `old_bytes`, 0 for none), which is gone afterwards. Throws std::bad_alloc
/// and then leaves `old` as it was. new_bytes is rounded up to a whole number
/// of pages from mapped_array_page on; returns the size it got in `new_bytes`.
void* grow_array_storage(void* old, std::size_t old_bytes, std::size_t used_bytes, std::size_t& new_bytes);
/// Gives storage of `bytes` back (a null `p`: nothing).
void free_array_storage(void* p, std::size_t bytes) noexcept;
inline constexpr std::size_t mapped_array_page = 4096;

template <class T>
class mapped_array {
    static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
    // So that a mapping's size is always a whole number of entries.
    static_assert(mapped_array_page % sizeof(T) == 0);

public:
    mapped_array() noexcept = default;
    mapped_array(const mapped_array&) = delete;
    mapped_array& operator=(const mapped_array&) = delete;
    ~mapped_array() { free_array_storage(m_data, m_capacity * sizeof(T)); }

    T* data() noexcept { return m_data; }
    const T* data() const noexcept { return m_data; }
    T* begin() noexcept { return m_data; }
    T* end() noexcept { return m_data + m_size; }
    const T* begin() const noexcept { return m_data; }
    const T* end() const noexcept { return m_data + m_size; }
    std::size_t size() const noexcept { return m_size; }
    std::size_t capacity() const noexcept { return m_capacity; }
    bool empty() const noexcept { return m_size == 0; }
    T& operator[](std::size_t i) noexcept { return m_data[i]; }
    const T& operator[](std::size_t i) const noexcept { return m_data[i]; }
    T& back() noexcept { return m_data[m_size - 1]; }

    /// Room for `n` entries in all; throws std::bad_alloc (nothing changed).
    void reserve(std::size_t n) {
        if (n > m_capacity) grow_to(n);
    }
    void push_back(const T& v) {
        if (m_size == m_capacity) [[unlikely]]
            grow_to(m_capacity < 4 ? 4 : m_capacity * 2);
        m_data[m_size++] = v;
    }
    /// Appends [first, last), which must not lie inside this array.
    void append(const T* first, const T* last) {
        const auto n = static_cast<std::size_t>(last - first);
        if (m_size + n > m_capacity) grow_to(m_size + n > m_capacity * 2 ? m_size + n : m_capacity * 2);
        if (n) std::memcpy(static_cast<void*>(m_data + m_size), first, n * sizeof(T));
        m_size += n;
    }
    void pop_back() noexcept { --m_size; }
    /// Keeps the first `n` entries (n <= size()).
    void truncate(std::size_t n) noexcept { m_size = n; }
    /// Drops the first `n` entries (n <= size()).
    void erase_front(std::size_t n) noexcept {
        std::memmove(static_cast<void*>(m_data), m_data + n, (m_size - n) * sizeof(T));
        m_size -= n;
    }
    /// Drops every entry; the storage stays for the next ones.
    void clear() noexcept { m_size = 0; }
    /// Drops every entry and, when the storage is over `keep_bytes`, gives
    /// it back too: an array that swelled once need not stay resident.
    void clear_and_shrink(std::size_t keep_bytes) noexcept {
        m_size = 0;
        if (m_capacity * sizeof(T) <= keep_bytes) return;
        free_array_storage(m_data, m_capacity * sizeof(T));
        m_data = nullptr;
        m_capacity = 0;
    }

private:
    void grow_to(std::size_t n) {
        if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
        std::size_t bytes = n * sizeof(T);
        m_data = static_cast<T*>(grow_array_storage(m_data, m_capacity * sizeof(T), m_size * sizeof(T), bytes));
        m_capacity = bytes / sizeof(T);
    }

    T* m_data = nullptr;
    std::size_t m_size = 0;
    std::size_t m_capacity = 0;
};

}  // namespace spindle::detail
