#pragma once
/// Waiting for a count to reach zero.
///
/// wait_group, as in Go: add(n) before starting n pieces of work, done() as
/// each finishes, `co_await wg.wait(token)` until the count is zero. It can be
/// reused: add() after the count reached zero starts a new round.
///
/// latch: a count fixed at construction, counted down to zero once.
///
/// Waits give result<void>: success when the count is (or reaches) zero, or
/// operation_canceled (timed_out under with_timeout); a waiter already woken
/// ignores a cancel. Every task waiting when the count reaches zero resumes in
/// a later tick, never inside done()/count_down(). Destroying a wait_group or
/// latch completes the waits still pending with operation_canceled.

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/queued_wait.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>

#include <cstddef>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>

namespace spindle {

namespace detail {

class zero_count;

class zero_wait : public queued_wait {
public:
    explicit zero_wait(zero_count& c) noexcept : m_counter(&c) {}

    bool ready() const noexcept;
    void on_park() noexcept;
    void describe(std::string& out) const;

private:
    zero_count* m_counter;
};

using zero_awaiter = parked<zero_wait>;

/// A count and the tasks waiting for it to be zero.
class zero_count {
public:
    explicit zero_count(std::size_t n) noexcept : m_count(n) {}
    zero_count(const zero_count&) = delete;
    zero_count& operator=(const zero_count&) = delete;
    ~zero_count() {
        while (zero_wait* w = m_waiters.pop_front()) w->complete_cancelled();
    }

    void add(std::size_t n) noexcept { m_count += n; }
    void subtract(std::size_t n, const char* what) {
        if (n > m_count) throw std::logic_error(what);
        m_count -= n;
        if (m_count == 0)
            while (zero_wait* w = m_waiters.pop_front()) w->complete();
    }
    std::size_t count() const noexcept { return m_count; }
    void push(zero_wait& w) noexcept { m_waiters.push_back(w); }

private:
    std::size_t m_count;
    intrusive_list<zero_wait> m_waiters;
};

inline bool zero_wait::ready() const noexcept { return m_counter->count() == 0; }
inline void zero_wait::on_park() noexcept { m_counter->push(*this); }
inline void zero_wait::describe(std::string& out) const {
    out += "count to reach zero (";
    out += std::to_string(m_counter->count());
    out += " left)";
}

}  // namespace detail

class wait_group {
public:
    wait_group() noexcept = default;

    /// Counts `n` more pieces of work.
    void add(std::size_t n = 1) noexcept { m_count.add(n); }
    /// One piece finished; at zero, every waiter wakes. Throws std::logic_error
    /// when the count is already zero.
    void done() { m_count.subtract(1, "spindle: wait_group::done() without a matching add()"); }
    std::size_t count() const noexcept { return m_count.count(); }

    /// `co_await wg.wait(token)` → result<void>.
    [[nodiscard]] detail::zero_awaiter wait(std::stop_token token = {}) noexcept { return detail::zero_awaiter(std::move(token), m_count); }

private:
    detail::zero_count m_count{0};
};

class latch {
public:
    explicit latch(std::size_t count) noexcept : m_count(count) {}

    /// Throws std::logic_error when `n` exceeds what is left.
    void count_down(std::size_t n = 1) { m_count.subtract(n, "spindle: latch counted down below zero"); }
    bool try_wait() const noexcept { return m_count.count() == 0; }
    std::size_t count() const noexcept { return m_count.count(); }

    /// `co_await l.wait(token)` → result<void>.
    [[nodiscard]] detail::zero_awaiter wait(std::stop_token token = {}) noexcept { return detail::zero_awaiter(std::move(token), m_count); }

private:
    detail::zero_count m_count;
};

}  // namespace spindle
