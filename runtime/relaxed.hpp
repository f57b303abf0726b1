#pragma once
// A value written by one thread (a loop's own) and read by any other (a
// metrics scrape, the stall monitor). Relaxed loads and stores cost what
// plain ones do, and a read-modify-write is a load and a store, not a locked
// instruction: only the owner writes.

#include <atomic>

namespace spindle::detail {

template <class T>
class relaxed {
public:
    constexpr relaxed(T v = T{}) noexcept : m_value(v) {}
    relaxed(const relaxed&) = delete;
    relaxed& operator=(const relaxed&) = delete;

    T load() const noexcept { return m_value.load(std::memory_order_relaxed); }
    operator T() const noexcept { return load(); }
    relaxed& operator=(T v) noexcept {
        m_value.store(v, std::memory_order_relaxed);
        return *this;
    }
    void add(T n) noexcept { m_value.store(load() + n, std::memory_order_relaxed); }
    relaxed& operator++() noexcept { add(T{1}); return *this; }
    relaxed& operator--() noexcept { m_value.store(load() - T{1}, std::memory_order_relaxed); return *this; }
    /// Another thread's read-and-reset (ready_depth_max): the only writer
    /// besides the owner, so this one is a real exchange.
    T exchange(T v) noexcept { return m_value.exchange(v, std::memory_order_relaxed); }
    /// Another thread's conditional write (the stall monitor's), ordered
    /// after what it wrote before.
    bool compare_exchange_release(T expected, T v) noexcept {
        return m_value.compare_exchange_strong(expected, v, std::memory_order_release, std::memory_order_relaxed);
    }

private:
    std::atomic<T> m_value;
};

}  // namespace spindle::detail
