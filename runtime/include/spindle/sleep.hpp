#pragma once
/// Time and turn-taking inside a task: sleep_for, sleep_until, yield, idle.

#include <spindle/detail/cancel_hook.hpp>
#include <spindle/loop.hpp>
#include <spindle/result.hpp>

#include <chrono>
#include <limits>
#include <stop_token>
#include <system_error>

namespace spindle {

namespace detail {

class sleep_awaiter : timer_node {
public:
    sleep_awaiter(std::int64_t deadline_ns, std::stop_token token) noexcept
        : m_deadline(deadline_ns), m_token(std::move(token)) {}
    sleep_awaiter(const sleep_awaiter&) = delete;
    sleep_awaiter& operator=(const sleep_awaiter&) = delete;
    ~sleep_awaiter() {
        // Destroyed while parked (its task was aborted or its loop destroyed).
        if (armed()) m_loop->timers().cancel(*this);
    }

    bool await_ready() noexcept {
        m_cancelled = m_token.stop_requested();
        return m_cancelled;
    }
    void await_suspend(std::coroutine_handle<> h) {
        m_task = &current_task();
        m_loop = m_task->m_loop;
        m_task->m_resume = h;
        m_fire = &on_fire;
        m_loop->timers().insert(*this, m_deadline);
        m_cancel.arm(m_token, this);
        park_cancellable(*m_task, this);
    }
    /// Empty, or operation_canceled when the token stopped the sleep.
    std::error_code await_resume() noexcept {
        unpark(m_task);
        m_cancel.disarm();
        return m_cancelled ? cancelled_error() : std::error_code{};
    }

    void describe(std::string& out) const;
    void on_cancel() noexcept {
        if (!armed()) return;
        m_loop->timers().cancel(*this);
        m_cancelled = true;
        m_loop->schedule(*m_task);
    }

private:
    static void on_fire(timer_node& node) noexcept {
        auto& self = static_cast<sleep_awaiter&>(node);
        self.m_loop->schedule(*self.m_task);
    }

    std::int64_t m_deadline;
    std::stop_token m_token;
    loop* m_loop = nullptr;
    task_header* m_task = nullptr;
    bool m_cancelled = false;
    cancel_hook<sleep_awaiter> m_cancel;
};

struct yield_awaiter {
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) {
        task_header& t = current_task();
        t.m_resume = h;
        schedule(t);
    }
    void await_resume() const noexcept {}
};

struct idle_waiter : list_hook<> {
    task_header* m_task = nullptr;
};

class idle_awaiter : idle_waiter {
public:
    idle_awaiter() = default;
    idle_awaiter(const idle_awaiter&) = delete;
    idle_awaiter& operator=(const idle_awaiter&) = delete;
    ~idle_awaiter() { unlink(); }
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) {
        m_task = &current_task();
        m_task->m_resume = h;
        m_task->m_loop->add_idle_waiter(*this);
        park_uncancellable(*m_task, this);
    }
    void describe(std::string& out) const { out += "idle"; }
    void await_resume() const noexcept { unpark(m_task); }
};

inline std::int64_t to_ns(clock::time_point t) noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

/// now + d in nanoseconds, saturating: sleep_for(nanoseconds::max()) means never.
template <class Rep, class Period>
std::int64_t deadline_after(std::chrono::duration<Rep, Period> d) noexcept {
    using limits = std::numeric_limits<std::int64_t>;
    const std::int64_t now = loop::now_ns();
    if (d <= d.zero()) return now;
    if (d >= std::chrono::duration_cast<std::chrono::duration<Rep, Period>>(std::chrono::nanoseconds(limits::max() - now)))
        return limits::max();
    return now + std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

}  // namespace detail

/// Resumes the task once `d` has passed (steady clock). Returns an empty
/// error_code, or operation_canceled if `token` was stopped first.
template <class Rep, class Period>
[[nodiscard]] detail::sleep_awaiter sleep_for(std::chrono::duration<Rep, Period> d, std::stop_token token = {}) {
    return detail::sleep_awaiter(detail::deadline_after(d), std::move(token));
}

/// Resumes the task at `t` (a deadline in the past fires in the next timer phase).
[[nodiscard]] inline detail::sleep_awaiter sleep_until(clock::time_point t, std::stop_token token = {}) {
    return detail::sleep_awaiter(detail::to_ns(t), std::move(token));
}

/// Lets every other ready task run once before this one goes on.
[[nodiscard]] inline detail::yield_awaiter yield() noexcept { return {}; }

/// Resumes the task when the loop has nothing else to do (no ready task, no
/// post); at most loop_options::idle_batch idle waiters resume per tick.
[[nodiscard]] inline detail::idle_awaiter idle() noexcept { return {}; }

}  // namespace spindle
