#pragma once
/// Waiting for a count to reach zero.
///
/// wait_group, as in Go: add(n) before starting n pieces of work, done() as
/// each finishes, `co_await wg.wait(token)` until the count is zero. It can be
/// reused: add() after the count reached zero starts a new round.
///
/// latch: a count fixed at construction, counted down to zero once.
///
/// Waits give an empty std::error_code when the count is (or reaches) zero, or
/// operation_canceled (timed_out under with_timeout); a waiter already woken
/// ignores a cancel. Every task waiting when the count reaches zero resumes in
/// a later tick, never inside done()/count_down(). Destroying a wait_group or
/// latch completes the waits still pending with operation_canceled.

#include <spindle/detail/cancel_hook.hpp>
#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/result.hpp>

#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>

namespace spindle {

namespace detail {

struct count_waiter : list_hook<> {
    enum class state : std::uint8_t { idle, waiting, woken, cancelled };
    task_header* m_task = nullptr;
    state m_state = state::idle;
};

/// A count and the tasks waiting for it to be zero.
class zero_count {
public:
    explicit zero_count(std::size_t n) noexcept : m_count(n) {}
    zero_count(const zero_count&) = delete;
    zero_count& operator=(const zero_count&) = delete;
    ~zero_count() { wake_all(count_waiter::state::cancelled); }

    void add(std::size_t n) noexcept { m_count += n; }
    void subtract(std::size_t n, const char* what) {
        if (n > m_count) throw std::logic_error(what);
        m_count -= n;
        if (m_count == 0) wake_all(count_waiter::state::woken);
    }
    std::size_t count() const noexcept { return m_count; }
    void push(count_waiter& w) noexcept { m_waiters.push_back(w); }

private:
    void wake_all(count_waiter::state how) noexcept {
        while (count_waiter* w = m_waiters.pop_front()) {
            w->m_state = how;
            schedule(*w->m_task);
        }
    }

    std::size_t m_count;
    intrusive_list<count_waiter> m_waiters;
};

class zero_awaiter : count_waiter {
public:
    zero_awaiter(zero_count& c, std::stop_token token) noexcept : m_counter(&c), m_token(std::move(token)) {}
    zero_awaiter(const zero_awaiter&) = delete;
    zero_awaiter& operator=(const zero_awaiter&) = delete;
    ~zero_awaiter() { unlink(); }

    bool await_ready() noexcept {
        if (m_token.stop_requested()) {
            m_state = state::cancelled;
            return true;
        }
        return m_counter->count() == 0;
    }
    void await_suspend(std::coroutine_handle<> h) {
        m_task = &current_task();
        m_task->m_resume = h;
        m_state = state::waiting;
        m_counter->push(*this);
        m_cancel.arm(m_token, this);
        park_cancellable(*m_task, this);
    }
    std::error_code await_resume() noexcept {
        unpark(m_task);
        m_cancel.disarm();
        return m_state == state::cancelled ? cancelled_error() : std::error_code{};
    }

    /// For the dump of parked tasks.
    void describe(std::string& out) const {
        out += "count to reach zero (";
        out += std::to_string(m_counter->count());
        out += " left)";
    }

    void on_cancel() noexcept {
        if (m_state != state::waiting) return;
        unlink();
        m_state = state::cancelled;
        schedule(*m_task);
    }

private:
    zero_count* m_counter;
    std::stop_token m_token;
    cancel_hook<zero_awaiter> m_cancel;
};

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

    /// `co_await wg.wait(token)` → std::error_code.
    [[nodiscard]] detail::zero_awaiter wait(std::stop_token token = {}) noexcept { return {m_count, std::move(token)}; }

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

    /// `co_await l.wait(token)` → std::error_code.
    [[nodiscard]] detail::zero_awaiter wait(std::stop_token token = {}) noexcept { return {m_count, std::move(token)}; }

private:
    detail::zero_count m_count;
};

}  // namespace spindle
