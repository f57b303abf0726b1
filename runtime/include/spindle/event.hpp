#pragma once
/// event: a flag tasks can wait for. set() wakes every task waiting at that
/// moment (each resumes in a later tick, never inside set()); while the flag
/// stays set, waits complete at once. reset() clears it for later waits; a
/// task already woken by set() still completes successfully.
///
/// Like everything in a loop, an event belongs to the loop's thread. Waiting
/// allocates nothing: the waiter lives in the awaiting frame.

#include <spindle/detail/cancel_hook.hpp>
#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/result.hpp>

#include <coroutine>
#include <cstdint>
#include <stop_token>
#include <string>
#include <system_error>

namespace spindle {

class event;

namespace detail {

struct event_waiter : list_hook<> {
    enum class state : std::uint8_t { idle, waiting, woken, cancelled };
    task_header* m_task = nullptr;
    state m_state = state::idle;
};

class event_awaiter;

}  // namespace detail

class event {
public:
    explicit event(bool initially_set = false) noexcept : m_set(initially_set) {}
    event(const event&) = delete;
    event& operator=(const event&) = delete;
    /// Tasks still waiting complete with operation_canceled.
    ~event() { wake_all(detail::event_waiter::state::cancelled); }

    /// Sets the flag and wakes every waiting task.
    void set() noexcept {
        m_set = true;
        wake_all(detail::event_waiter::state::woken);
    }
    void reset() noexcept { m_set = false; }
    bool is_set() const noexcept { return m_set; }

    /// `co_await ev.wait(token)`: an empty std::error_code once the flag is set,
    /// or operation_canceled (timed_out under with_timeout).
    [[nodiscard]] detail::event_awaiter wait(std::stop_token token = {}) noexcept;

private:
    friend class detail::event_awaiter;

    void wake_all(detail::event_waiter::state how) noexcept {
        while (detail::event_waiter* w = m_waiters.pop_front()) {
            w->m_state = how;
            detail::schedule(*w->m_task);
        }
    }

    bool m_set;
    detail::intrusive_list<detail::event_waiter> m_waiters;
};

namespace detail {

class event_awaiter : event_waiter {
public:
    event_awaiter(event& ev, std::stop_token token) noexcept : m_event(&ev), m_token(std::move(token)) {}
    event_awaiter(const event_awaiter&) = delete;
    event_awaiter& operator=(const event_awaiter&) = delete;
    // Destroyed while parked (task aborted, loop destroyed): just leave the queue.
    ~event_awaiter() { unlink(); }

    bool await_ready() noexcept {
        if (m_token.stop_requested()) {
            m_state = state::cancelled;
            return true;
        }
        return m_event->m_set;
    }
    void await_suspend(std::coroutine_handle<> h) {
        m_task = &current_task();  // throws outside a task, before anything is linked
        m_task->m_resume = h;
        m_state = state::waiting;
        m_event->m_waiters.push_back(*this);
        m_cancel.arm(m_token, this);
        park_cancellable(*m_task, this);
    }
    std::error_code await_resume() noexcept {
        unpark(m_task);
        m_cancel.disarm();
        return m_state == state::cancelled ? cancelled_error() : std::error_code{};
    }

    /// For the dump of parked tasks.
    void describe(std::string& out) const { out += "event"; }

    /// A waiter already woken by set() keeps its success.
    void on_cancel() noexcept {
        if (m_state != state::waiting) return;
        unlink();
        m_state = state::cancelled;
        schedule(*m_task);
    }

private:
    event* m_event;
    std::stop_token m_token;
    cancel_hook<event_awaiter> m_cancel;
};

}  // namespace detail

inline detail::event_awaiter event::wait(std::stop_token token) noexcept { return detail::event_awaiter(*this, std::move(token)); }

}  // namespace spindle
