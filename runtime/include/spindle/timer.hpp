#pragma once
/// Callback timers (one-shot and fixed-rate) and `interval`, the fixed-rate
/// clock for tasks (a game's 60 Hz tick).
///
/// Fixed rate means no drift: the next deadline is the previous deadline plus
/// the period, not "now" plus the period. When the loop falls a whole period
/// or more behind, the missed ticks are skipped, not replayed in a burst, and
/// their number is reported (timer::missed, interval's tick result).

#include <spindle/detail/engine.hpp>
#include <spindle/detail/timer_node.hpp>
#include <spindle/sleep.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>

namespace spindle {

namespace detail {
/// a + b, or the largest deadline (never) where it would overflow: a period
/// of duration::max() means "once, then never".
inline std::int64_t saturating_add(std::int64_t a, std::int64_t b) noexcept {
    std::int64_t sum;
    if (__builtin_add_overflow(a, b, &sum)) return b > 0 ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
    return sum;
}

/// Advances a fixed-rate deadline past `now`; returns the ticks skipped.
inline std::uint64_t advance_fixed_rate(std::int64_t& deadline, std::int64_t period, std::int64_t now) noexcept {
    deadline = saturating_add(deadline, period);
    if (deadline > now) return 0;
    auto behind = static_cast<std::uint64_t>((now - deadline) / period) + 1;
    deadline = saturating_add(deadline, static_cast<std::int64_t>(behind) * period);
    return behind;
}

/// A timer callback that threw: logged, and the loop goes on.
void log_timer_failure() noexcept;
}  // namespace detail

class timer : detail::timer_node {
public:
    using callback = void (*)(void* context);

    explicit timer(loop& owner) noexcept : m_loop(&detail::core_of(owner)) { m_fire = &on_fire; }
    timer(const timer&) = delete;
    timer& operator=(const timer&) = delete;
    /// Must be destroyed before its loop.
    ~timer() { stop(); }

    /// Calls fn(context) once, `delay` from now (any duration type; it
    /// saturates: hours::max() is never, a negative delay the next timer phase).
    template <class Rep, class Period>
    void start(std::chrono::duration<Rep, Period> delay, callback fn, void* context) {
        arm(detail::deadline_after(delay), 0, fn, context);
    }
    /// Calls fn(context) every `period`, first after `period`.
    template <class Rep, class Period>
    void start_repeating(std::chrono::duration<Rep, Period> period, callback fn, void* context) {
        const std::int64_t p = detail::saturating_ns(period);
        if (p <= 0) throw std::invalid_argument("spindle::timer: period must be positive");
        arm(detail::saturating_add(detail::now_ns(), p), p, fn, context);
    }
    void stop() noexcept { detail::disarm_timer(*m_loop, *this); }
    bool active() const noexcept { return armed(); }
    /// Ticks skipped before the latest callback because the loop fell behind.
    std::uint64_t missed() const noexcept { return m_missed; }
    clock::time_point deadline() const noexcept { return clock::time_point(std::chrono::nanoseconds(m_deadline)); }

private:
    void arm(std::int64_t deadline, std::int64_t period, callback fn, void* context) {
        stop();
        m_deadline = deadline;
        m_period = period;
        m_fn = fn;
        m_context = context;
        m_missed = 0;
        detail::arm_timer(*m_loop, *this, m_deadline);
    }
    static void on_fire(timer_node& node) noexcept {
        auto& self = static_cast<timer&>(node);
        if (self.m_period > 0) {
            // Re-arm first, so the callback may stop() or restart the timer.
            self.m_missed = detail::advance_fixed_rate(self.m_deadline, self.m_period, detail::now_ns());
            try {
                detail::arm_timer(*self.m_loop, self, self.m_deadline);
            } catch (...) {
                // Out of memory while growing the heap: the timer stops.
            }
        }
        try {
            self.m_fn(self.m_context);
        } catch (...) {
            detail::log_timer_failure();
        }
    }

    detail::loop_core* m_loop;
    callback m_fn = nullptr;
    void* m_context = nullptr;
    std::int64_t m_deadline = 0;
    std::int64_t m_period = 0;
    std::uint64_t m_missed = 0;
};

/// A fixed-rate clock for a task: `co_await iv.tick()` resumes at start + k·period.
class interval {
public:
    /// `first` defaults to the loop's now (its virtual clock under virtual time).
    template <class Rep, class Period>
    explicit interval(std::chrono::duration<Rep, Period> period,
                      clock::time_point first = clock::time_point(std::chrono::nanoseconds(detail::now_ns())))
        : m_period(detail::saturating_ns(period)), m_next(detail::to_ns(first)) {
        if (m_period <= 0) throw std::invalid_argument("spindle::interval: period must be positive");
    }

    class awaiter {
    public:
        awaiter(interval& iv, std::stop_token token) : m_interval(iv), m_sleep(std::move(token), iv.m_next) {}
        bool await_ready() noexcept { return m_sleep.await_ready(); }
        bool await_suspend(std::coroutine_handle<> h) { return m_sleep.await_suspend(h); }
        /// How many periods this tick stands for: 1, or more when ticks were
        /// skipped because the task came back late; or operation_canceled.
        result<std::uint64_t> await_resume() noexcept {
            if (result<void> slept = m_sleep.await_resume(); !slept) return slept.error();
            std::uint64_t skipped = detail::advance_fixed_rate(m_interval.m_next, m_interval.m_period, detail::now_ns());
            return 1 + skipped;
        }

    private:
        interval& m_interval;
        detail::sleep_awaiter m_sleep;
    };

    /// The first tick completes at `first`.
    [[nodiscard]] awaiter tick(std::stop_token token = {}) { return awaiter(*this, std::move(token)); }
    clock::duration period() const noexcept { return std::chrono::nanoseconds(m_period); }

private:
    std::int64_t m_period;
    std::int64_t m_next;
};

}  // namespace spindle
