#pragma once
/// semaphore: a count of permits shared by the tasks of one loop.
///
/// Strictly FIFO: an acquire waits while anyone waits before it, even if
/// enough permits are free for it, so a large request at the head of the
/// queue is never starved by a stream of small ones. release() hands permits
/// to the waiters in order, as long as the first one's request fits; the
/// permits are theirs from that moment, before they run.
///
/// `co_await s.acquire(n, token)` gives an empty std::error_code, or
/// operation_canceled (timed_out under with_timeout) if the wait was cancelled
/// before permits were handed to it; a waiter that already got its permits
/// ignores the cancel.
///
/// Lifetimes: a waiter whose frame is destroyed while queued leaves the queue
/// (and the waiters behind it are served if they now fit); one destroyed after
/// its permits were handed over, before it resumed, releases them again.
/// Destroying the semaphore completes every wait that has not resumed with
/// operation_canceled.

#include <spindle/detail/cancel_hook.hpp>
#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/result.hpp>

#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <stop_token>
#include <string>
#include <system_error>

namespace spindle {

class semaphore;

namespace detail {

struct semaphore_waiter : list_hook<> {
    enum class state : std::uint8_t { idle, waiting, granted, cancelled, done };
    task_header* m_task = nullptr;
    semaphore* m_semaphore = nullptr;
    std::size_t m_count = 0;
    state m_state = state::idle;
};

class semaphore_awaiter;

}  // namespace detail

class semaphore {
public:
    explicit semaphore(std::size_t initial = 0) noexcept : m_available(initial) {}
    semaphore(const semaphore&) = delete;
    semaphore& operator=(const semaphore&) = delete;
    ~semaphore() {
        while (detail::semaphore_waiter* w = m_waiters.pop_front()) {
            w->m_semaphore = nullptr;
            w->m_state = detail::semaphore_waiter::state::cancelled;
            detail::schedule(*w->m_task);
        }
        // Granted, already scheduled: the permits go with the semaphore.
        while (detail::semaphore_waiter* w = m_granted.pop_front()) {
            w->m_semaphore = nullptr;
            w->m_state = detail::semaphore_waiter::state::cancelled;
        }
    }

    /// Takes `n` permits if they are free and nobody waits.
    [[nodiscard]] bool try_acquire(std::size_t n = 1) noexcept {
        if (!m_waiters.empty() || m_available < n) return false;
        m_available -= n;
        return true;
    }

    /// Adds `n` permits and hands them to the waiters in order.
    void release(std::size_t n = 1) noexcept {
        m_available += n;
        grant();
    }

    /// Free permits (not yet handed to any waiter).
    std::size_t available() const noexcept { return m_available; }
    /// Tasks are queued for permits (a new acquire queues behind them).
    bool has_waiters() const noexcept { return !m_waiters.empty(); }

    /// `co_await s.acquire(n, token)` → std::error_code. acquire(0) completes at once.
    [[nodiscard]] detail::semaphore_awaiter acquire(std::size_t n = 1, std::stop_token token = {}) noexcept;

private:
    friend class detail::semaphore_awaiter;

    // Serves the head of the queue while its request fits; stops at the first
    // that does not, so nobody overtakes it.
    void grant() noexcept {
        while (detail::semaphore_waiter* w = m_waiters.front()) {
            if (w->m_count > m_available) break;
            m_waiters.pop_front();
            m_available -= w->m_count;
            w->m_state = detail::semaphore_waiter::state::granted;
            m_granted.push_back(*w);
            detail::schedule(*w->m_task);
        }
    }

    std::size_t m_available;
    detail::intrusive_list<detail::semaphore_waiter> m_waiters;
    // Granted, not resumed yet: they give their permits back if destroyed first.
    detail::intrusive_list<detail::semaphore_waiter> m_granted;
};

namespace detail {

class semaphore_awaiter : semaphore_waiter {
public:
    semaphore_awaiter(semaphore& s, std::size_t n, std::stop_token token) noexcept : m_token(std::move(token)) {
        m_semaphore = &s;
        m_count = n;
    }
    semaphore_awaiter(const semaphore_awaiter&) = delete;
    semaphore_awaiter& operator=(const semaphore_awaiter&) = delete;
    ~semaphore_awaiter() {
        if (!m_semaphore) return;
        if (m_state == state::waiting) {
            unlink();
            // It may have been the head that held the others back.
            m_semaphore->grant();
        } else if (m_state == state::granted) {
            unlink();
            m_semaphore->release(m_count);
        }
    }

    bool await_ready() noexcept {
        if (m_token.stop_requested()) {
            m_state = state::cancelled;
            return true;
        }
        if (!m_semaphore->try_acquire(m_count)) return false;
        m_state = state::done;
        return true;
    }
    void await_suspend(std::coroutine_handle<> h) {
        m_task = &current_task();
        m_task->m_resume = h;
        m_state = state::waiting;
        m_semaphore->m_waiters.push_back(*this);
        m_cancel.arm(m_token, this);
        park_cancellable(*m_task, this);
    }
    std::error_code await_resume() noexcept {
        unpark(m_task);
        m_cancel.disarm();
        if (m_state == state::cancelled) return cancelled_error();
        unlink();  // from the granted list
        m_state = state::done;
        return {};
    }

    /// For the dump of parked tasks.
    void describe(std::string& out) const {
        out += "semaphore acquire of ";
        out += std::to_string(m_count);
        if (m_semaphore) {
            out += " (";
            out += std::to_string(m_semaphore->available());
            out += " free)";
        }
    }

    /// Only a queued waiter can be cancelled; one that got its permits keeps them.
    void on_cancel() noexcept {
        if (m_state != state::waiting) return;
        unlink();
        m_state = state::cancelled;
        schedule(*m_task);
        m_semaphore->grant();
    }

private:
    std::stop_token m_token;
    cancel_hook<semaphore_awaiter> m_cancel;
};

}  // namespace detail

inline detail::semaphore_awaiter semaphore::acquire(std::size_t n, std::stop_token token) noexcept {
    return detail::semaphore_awaiter(*this, n, std::move(token));
}

}  // namespace spindle
