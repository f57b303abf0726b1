#pragma once
/// event: a flag tasks can wait for. set() wakes every task waiting at that
/// moment (each resumes in a later tick, never inside set()); while the flag
/// stays set, waits complete at once. reset() clears it for later waits; a
/// task already woken by set() still completes successfully.
///
/// Like everything in a loop, an event belongs to the loop's thread. Waiting
/// allocates nothing: the waiter lives in the awaiting frame.

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/queued_wait.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>

#include <stop_token>
#include <string>
#include <system_error>

namespace spindle {

class event;

namespace detail {

class event_wait : public queued_wait {
public:
    explicit event_wait(event& ev) noexcept : m_event(&ev) {}

    bool ready() const noexcept;
    void on_park() noexcept;
    void describe(std::string& out) const { out += "event"; }

private:
    event* m_event;
};

using event_awaiter = parked<event_wait>;

}  // namespace detail

class event {
public:
    explicit event(bool initially_set = false) noexcept : m_set(initially_set) {}
    event(const event&) = delete;
    event& operator=(const event&) = delete;
    /// Tasks still waiting complete with operation_canceled.
    ~event() {
        while (detail::event_wait* w = m_waiters.pop_front()) w->complete_cancelled();
    }

    /// Sets the flag and wakes every waiting task.
    void set() noexcept {
        m_set = true;
        while (detail::event_wait* w = m_waiters.pop_front()) w->complete();
    }
    void reset() noexcept { m_set = false; }
    bool is_set() const noexcept { return m_set; }

    /// `co_await ev.wait(token)` → result<void>: success once the flag is set,
    /// or operation_canceled (timed_out under with_timeout).
    [[nodiscard]] detail::event_awaiter wait(std::stop_token token = {}) noexcept {
        return detail::event_awaiter(std::move(token), *this);
    }

private:
    friend class detail::event_wait;

    bool m_set;
    detail::intrusive_list<detail::event_wait> m_waiters;
};

namespace detail {
inline bool event_wait::ready() const noexcept { return m_event->m_set; }
inline void event_wait::on_park() noexcept { m_event->m_waiters.push_back(*this); }
}  // namespace detail

}  // namespace spindle
