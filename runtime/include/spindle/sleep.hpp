#pragma once
/// Time and turn-taking inside a task: sleep_for, sleep_until, yield, idle.

#include <spindle/detail/engine.hpp>
#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/timer_node.hpp>
#include <spindle/park.hpp>

#include <chrono>
#include <limits>
#include <stop_token>
#include <string>
#include <system_error>

namespace spindle {

using clock = std::chrono::steady_clock;

namespace detail {

class sleep_wait : public waiter, private timer_node {
public:
    explicit sleep_wait(std::int64_t deadline_ns) noexcept : m_deadline(deadline_ns) {}

    void on_park() {
        m_fire = &on_fire;
        arm_timer(core(), *this, m_deadline);
    }
    void on_cancel() noexcept {
        disarm_timer(core(), *this);
        complete_cancelled();
    }
    void on_abandon() noexcept { disarm_timer(core(), *this); }
    void describe(std::string& out) const;

private:
    static void on_fire(timer_node& node) noexcept { static_cast<sleep_wait&>(node).complete(); }

    std::int64_t m_deadline;
};

/// result<void>: success, or operation_canceled when the token stopped the sleep.
using sleep_awaiter = parked<sleep_wait>;
/// The same without a token (cancel scopes and join_handle::cancel still
/// end it): a sleeping frame keeps no word for one.
using tokenless_sleep_awaiter = parked<sleep_wait, false>;

struct yield_awaiter {
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) {
        task_header& t = current_task();
        t.m_resume = h;
        schedule(t);
    }
    void await_resume() const noexcept {}
};

/// Waits for the loop to have nothing else to do.
class idle_wait : public waiter, public list_hook<> {
public:
    void on_park();
    void on_abandon() noexcept { unlink(); }
    void describe(std::string& out) const { out += "idle"; }
};

using idle_awaiter = parked<idle_wait>;

/// A deadline in nanoseconds. Anything before the clock's epoch is as past
/// as the epoch itself: deadlines stay non-negative, so the difference of a
/// deadline and the clock never overflows (time_point::min() included).
inline std::int64_t to_ns(clock::time_point t) noexcept {
    const std::int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
    return ns < 0 ? 0 : ns;
}

/// `d` in nanoseconds, saturating at the ends of std::int64_t, for any
/// representation and period: hours::max(), a picosecond count that would
/// overflow when scaled, a floating-point infinity. NaN counts as zero.
template <class Rep, class Period>
std::int64_t saturating_ns(std::chrono::duration<Rep, Period> d) noexcept {
    using limits = std::numeric_limits<std::int64_t>;
    // long double holds every count of every duration type without overflow;
    // the bounds keep clear of where it rounds (beyond 292 years: never).
    const long double ns = std::chrono::duration<long double, std::nano>(d).count();
    if (!(ns == ns)) return 0;
    if (ns >= 9.2e18L) return limits::max();
    if (ns <= -9.2e18L) return limits::min();
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

/// now + d in nanoseconds, saturating: sleep_for(nanoseconds::max()) means
/// never, a negative `d` now.
template <class Rep, class Period>
std::int64_t deadline_after(std::chrono::duration<Rep, Period> d) noexcept {
    const std::int64_t now = now_ns();
    const std::int64_t span = saturating_ns(d);
    if (span <= 0) return now;
    return span >= std::numeric_limits<std::int64_t>::max() - now ? std::numeric_limits<std::int64_t>::max() : now + span;
}

}  // namespace detail

// Each comes in two overloads, without and with a token, and takes its time by
// reference: GCC keeps the temporaries of a co_await's expression (a default
// argument's token, a copy of the duration) in the awaiting frame for as long
// as the task sleeps, 16 bytes of every sleeping frame.

/// Resumes the task once `d` has passed (steady clock). Gives result<void>:
/// success, or operation_canceled if `token` was stopped first (a loop that
/// sleeps must look: a cancelled sleep returns at once, every time).
template <class Rep, class Period>
[[nodiscard]] detail::sleep_awaiter sleep_for(const std::chrono::duration<Rep, Period>& d, std::stop_token token) {
    return detail::sleep_awaiter(std::move(token), detail::deadline_after(d));
}
template <class Rep, class Period>
[[nodiscard]] detail::tokenless_sleep_awaiter sleep_for(const std::chrono::duration<Rep, Period>& d) {
    return detail::tokenless_sleep_awaiter(std::in_place, detail::deadline_after(d));
}

/// Resumes the task at `t` (a deadline in the past fires in the next timer
/// phase); operation_canceled if `token` was stopped first.
[[nodiscard]] inline detail::sleep_awaiter sleep_until(const clock::time_point& t, std::stop_token token) {
    return detail::sleep_awaiter(std::move(token), detail::to_ns(t));
}
[[nodiscard]] inline detail::tokenless_sleep_awaiter sleep_until(const clock::time_point& t) {
    return detail::tokenless_sleep_awaiter(std::in_place, detail::to_ns(t));
}

/// Lets every other ready task run once before this one goes on.
[[nodiscard]] inline detail::yield_awaiter yield() noexcept { return {}; }

/// Resumes the task when the loop has nothing else to do (no ready task, no
/// post); at most loop_options::idle_batch idle waiters resume per tick.
[[nodiscard]] inline detail::idle_awaiter idle() noexcept { return detail::idle_awaiter(std::stop_token{}); }

}  // namespace spindle
