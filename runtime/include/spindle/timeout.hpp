#pragma once
/// Deadlines on any operation: `co_await with_timeout(200ms, stream.read_some(buf))`.
///
/// The operation runs inside a cancel scope of the current task. When the
/// deadline passes first, the wait the task is parked on inside the operation
/// (an I/O, a sleep, a signal wait, at any depth of awaited tasks) is cancelled,
/// and later waits in the scope are cancelled at once (even a read that would
/// find data ready: a task past its deadline does not run on). What
/// `co_await with_timeout(d, op)` gives depends on what `op` gives:
///
/// - a `result<T>` (every wait of spindle's, `result<void>` for a sleep): the same type. If the
///   deadline passed, the operation's `operation_canceled` becomes `timed_out`
///   (std::errc::timed_out, ETIMEDOUT); any other outcome is kept, a value
///   that completed before the deadline included, even if the timer fired in
///   the same tick.
/// - nothing (`task<void>`, `task_group::join()`): `result<void>`.
/// - a plain value `T` (`task<int>`, `when_all`, `when_any`): `result<T>`
///   (`result<std::reference_wrapper<T>>` for a `T&`).
///
///   For these two, whose operation has no error to report, the outcome is
///   `timed_out` when this deadline passed and cut the operation short (it
///   cancelled a wait inside it); `operation_canceled` when an enclosing
///   deadline or join_handle::cancel() did (the enclosing with_timeout turns
///   it into timed_out); otherwise the operation's value, however late. A
///   value the operation returned after being cut short is dropped. An
///   exception the operation throws passes through, except a
///   `std::system_error` of `operation_canceled`, which becomes the result's
///   error the same way (`timed_out` if this deadline passed).
///
/// A timeout is therefore never thrown. Await the returned object in the
/// expression that creates it: it may refer to a temporary operation.

#include <spindle/detail/engine.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/detail/timer_node.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>
#include <spindle/sleep.hpp>
#include <spindle/task.hpp>

#include <chrono>
#include <functional>
#include <system_error>
#include <type_traits>
#include <utility>

namespace spindle {

/// The error an operation gets when its deadline passed first.
inline std::error_code timed_out_error() noexcept { return std::make_error_code(std::errc::timed_out); }

namespace detail {

template <class T>
concept has_member_co_await = requires(T&& t) { std::forward<T>(t).operator co_await(); };

template <class T>
decltype(auto) awaiter_of(T& t) {
    if constexpr (has_member_co_await<T>)
        return std::move(t).operator co_await();
    else
        return (t);
}

template <class R>
R timed_out_instead(R&& r) {
    if (!r.has_value() && r.error() == std::errc::operation_canceled) return R(timed_out_error());
    return std::forward<R>(r);
}

/// An operation that reports its own errors: a result.
template <class R>
concept reports_errors = requires(R r) {
    r.has_value();
    r.error();
};

/// What with_timeout gives for an operation yielding `R` that reports no
/// errors of its own: result<void>, result<T>, or result<reference_wrapper<T>>.
template <class R>
using timed_value_t = std::conditional_t<std::is_lvalue_reference_v<R>, std::reference_wrapper<std::remove_reference_t<R>>,
                                         std::remove_cvref_t<R>>;

template <class A>
class timeout_awaiter : timer_node {
    using operation_type = std::remove_reference_t<A>;
    // A temporary that cannot move is referred to; anything else is kept here.
    using stored_type = std::conditional_t<std::is_lvalue_reference_v<A> || !std::is_move_constructible_v<operation_type>,
                                           operation_type&, operation_type>;
    using awaiter_type = decltype(awaiter_of(std::declval<operation_type&>()));

public:
    timeout_awaiter(std::int64_t deadline_ns, A&& op)
        : m_deadline(deadline_ns), m_op(static_cast<std::conditional_t<std::is_reference_v<stored_type>, operation_type&, A&&>>(op)), m_awaiter(awaiter_of(m_op)) {}
    timeout_awaiter(const timeout_awaiter&) = delete;
    timeout_awaiter& operator=(const timeout_awaiter&) = delete;
    ~timeout_awaiter() { close_scope(); }

    bool await_ready() {
        m_task = &current_task();
        open_cancel_scope(*m_task, m_scope);
        m_fire = &on_fire;
        arm_timer(core_of(*m_task), *this, m_deadline);
        return m_awaiter.await_ready();
    }
    template <class H>
    auto await_suspend(H h) {
        return m_awaiter.await_suspend(h);
    }
    /// Gives the operation up, as the destruction of the frame awaiting it
    /// would (a wait is withdrawn, a task it owns destroyed), and closes the
    /// scope: for when_any, which drops its losing branches.
    void withdraw() noexcept
        requires(requires(awaiter_type& a) { a.withdraw(); } ||
                 (!std::is_reference_v<stored_type> && is_task<operation_type>::value))
    {
        if constexpr (requires(awaiter_type& a) { a.withdraw(); })
            m_awaiter.withdraw();
        else
            m_op = operation_type{};  // a task it owns: its frame, with its waits, goes now
        close_scope();
    }

    decltype(auto) await_resume() {
        const bool expired = m_scope.m_cancelled;
        const bool cut_short = m_scope.m_reached;
        close_scope();
        using R = decltype(m_awaiter.await_resume());
        if constexpr (reports_errors<R>) {
            R r = m_awaiter.await_resume();
            return expired ? timed_out_instead(std::move(r)) : std::move(r);
        } else {
            return resume_value(expired, cut_short);
        }
    }

private:
    using resumed_type = decltype(std::declval<awaiter_type&>().await_resume());

    // An operation that reports no error: its outcome gets an error channel.
    result<timed_value_t<resumed_type>> resume_value(bool expired, bool cut_short) {
        using V = timed_value_t<resumed_type>;
        // Cut short by this deadline, or by an enclosing cancel passing through.
        const std::error_code stopped = expired ? timed_out_error() : cancelled_error();
        try {
            if constexpr (std::is_void_v<resumed_type>) {
                m_awaiter.await_resume();
                if (cut_short) return stopped;
                return {};
            } else {
                // Taken before the check, so that what the operation made is
                // destroyed here and whatever it throws still passes.
                result<V> r(V(m_awaiter.await_resume()));
                if (cut_short) return stopped;
                return r;
            }
        } catch (const std::system_error& e) {
            if (e.code() != std::errc::operation_canceled) throw;
            return stopped;
        }
    }

    void close_scope() noexcept {
        if (!m_task) return;
        disarm_timer(core_of(*m_task), *this);
        close_cancel_scope(*m_task, m_scope);
        m_task = nullptr;
    }

    static void on_fire(timer_node& node) noexcept {
        auto& self = static_cast<timeout_awaiter&>(node);
        // The task can only be parked inside this operation while the scope is
        // open; a wait that completed already ignores the cancel.
        cancel_within(*self.m_task, self.m_scope);
    }

    std::int64_t m_deadline;
    stored_type m_op;
    awaiter_type m_awaiter;
    task_header* m_task = nullptr;
    cancel_scope m_scope;
};

}  // namespace detail

/// Runs `op` (an awaitable or a task) with a deadline `d` from now.
template <class Rep, class Period, class A>
[[nodiscard]] detail::timeout_awaiter<A> with_timeout(std::chrono::duration<Rep, Period> d, A&& op) {
    return detail::timeout_awaiter<A>(detail::deadline_after(d), std::forward<A>(op));
}

/// Runs `op` with the absolute deadline `t` (steady clock).
template <class A>
[[nodiscard]] detail::timeout_awaiter<A> with_deadline(clock::time_point t, A&& op) {
    return detail::timeout_awaiter<A>(detail::to_ns(t), std::forward<A>(op));
}

}  // namespace spindle
