#pragma once
// The engine of spindle::when_any (when_any.hpp): the branches, each a task
// header inside the awaiter, and the wait that starts them and completes
// with the first.

#include <spindle/park.hpp>
#include <spindle/loop.hpp>
#include <spindle/when_all.hpp>

#include <array>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <stop_token>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>
namespace spindle {

namespace detail {

/// The coroutine handle every branch's awaitable is given to resume: it
/// tells the running branch that its awaitable completed. The loop resumes
/// it with the branch as the running task (the branch's wait completed), or
/// a task branch's end transfers to it. It only calls m_arrive, which never
/// resumes anything, so it is never resumed while it runs and one frame per
/// thread serves every branch of every when_any.
struct branch_resumer {
    struct promise_type {
        branch_resumer get_return_object() noexcept {
            return {std::coroutine_handle<promise_type>::from_promise(*this)};
        }
        std::suspend_always initial_suspend() const noexcept { return {}; }
        std::suspend_always final_suspend() const noexcept { return {}; }
        void return_void() const noexcept {}
        void unhandled_exception() const noexcept { std::terminate(); }
    };
    std::coroutine_handle<promise_type> m_handle;
};

inline branch_resumer run_branch_resumer() {
    for (;;) {
        if (task_header* t = current_task_or_null()) {
            auto& branch = static_cast<branch_header&>(*t);
            branch.m_arrive(branch);
        }
        co_await std::suspend_always{};
    }
}

inline std::coroutine_handle<> branch_resume_point() {
    struct holder {
        std::coroutine_handle<branch_resumer::promise_type> m_handle = run_branch_resumer().m_handle;
        holder() = default;
        holder(const holder&) = delete;
        holder& operator=(const holder&) = delete;
        ~holder() { m_handle.destroy(); }
    };
    thread_local holder resumer;
    return resumer.m_handle;
}

/// An awaiter that can be given up before it completes or is resumed.
template <class A>
concept withdrawable_awaiter = requires(A& a) {
    a.await_ready();
    a.withdraw();
};
/// An object whose co_await gives such an awaiter (join_handle).
template <class A>
concept awaits_withdrawable = requires(A& a) {
    { a.operator co_await() } -> withdrawable_awaiter;
};

/// A branch that is a wait (or with_timeout of one): referred to, since a
/// wait cannot move; it lives in the awaiting frame until the end of the
/// expression that awaits the when_any.
template <class W>
class ref_branch {
public:
    using result = decltype(std::declval<W&>().await_resume());

    template <class U>
    explicit ref_branch(U&& w) noexcept : m_awaiter(w) {}
    void prepare() noexcept {}
    W& awaiter() noexcept { return m_awaiter; }
    void withdraw() noexcept { m_awaiter.withdraw(); }

private:
    W& m_awaiter;
};

/// A branch whose co_await makes its awaiter (join_handle): the awaiter is
/// made here when the branch starts.
template <class S>
class co_await_branch {
    using awaiter_type = decltype(std::declval<S&>().operator co_await());

public:
    using result = decltype(std::declval<awaiter_type&>().await_resume());

    template <class U>
    explicit co_await_branch(U&& s) noexcept : m_source(s) {}
    co_await_branch(const co_await_branch&) = delete;
    co_await_branch& operator=(const co_await_branch&) = delete;
    ~co_await_branch() { withdraw(); }

    void prepare() {
        // A prvalue initializer: the awaiter (which cannot move) is made in place.
        ::new (static_cast<void*>(m_storage)) awaiter_type(m_source.operator co_await());
        m_made = true;
    }
    awaiter_type& awaiter() noexcept { return *std::launder(reinterpret_cast<awaiter_type*>(m_storage)); }
    void withdraw() noexcept {
        if (!m_made) return;
        m_made = false;
        awaiter().withdraw();
        awaiter().~awaiter_type();
    }

private:
    S& m_source;
    alignas(awaiter_type) std::byte m_storage[sizeof(awaiter_type)];
    bool m_made = false;
};

template <class A, class P = std::remove_cvref_t<A>>
struct branch_kind {
    static_assert(!is_task<P>::value,
                  "spindle::when_any: a task is no branch of when_any. race(tasks...) runs tasks and cancels and "
                  "joins the losers; when_any waits on waits (a receive, a sleep) and withdraws the losers");
    static_assert(withdrawable_awaiter<P> || awaits_withdrawable<P>,
                  "spindle::when_any: a branch is a wait on the park protocol (spindle::parked<W>: what "
                  "spindle's operations return), with_timeout of one, or a join_handle");
    using type = std::conditional_t<withdrawable_awaiter<P>, ref_branch<P>, co_await_branch<P>>;
};
template <class A>
using branch_for = typename branch_kind<A>::type;

/// What the variant holds for a branch whose co_await gives R.
template <class R>
using any_joined_t = std::conditional_t<std::is_rvalue_reference_v<R>, std::remove_reference_t<R>, joined_t<R>>;

/// The wait of a task awaiting a when_any over awaitables: it starts the
/// branches, and completes when the first of them does.
template <class... A>
class any_wait : public waiter {
    static constexpr std::size_t count = sizeof...(A);
    static constexpr std::size_t no_winner = std::numeric_limits<std::size_t>::max();
    using branches = std::tuple<branch_for<A>...>;

    struct header : branch_header {
        any_wait* m_race = nullptr;
        std::size_t m_index = 0;
    };

public:
    using result_type = std::variant<any_joined_t<typename branch_for<A>::result>...>;
    /// A cancellation of the awaiting task goes to every branch.
    static constexpr bool forwards_cancel = true;

    explicit any_wait(A&&... a) : m_branches(std::forward<A>(a)...) {}
    any_wait(const any_wait&) = delete;
    any_wait& operator=(const any_wait&) = delete;
    ~any_wait() { teardown(std::index_sequence_for<A...>{}); }

    void on_park() {
        task_header& task = current_task();
        for (std::size_t i = 0; i < count; ++i) {
            header& h = m_headers[i];
            h.m_loop = task.m_loop;
            h.m_outer = &task;
            // The branch is inside whatever scopes the task is in: a
            // deadline around when_any reaches waits the branches start
            // later, and one that passed already cancels them at once.
            h.m_scope = task.m_scope;
            h.m_cancel_requested = task.m_cancel_requested;
            h.m_unbudgeted = task.m_unbudgeted;
            h.m_arrive = &arrive;
            h.m_race = this;
            h.m_index = i;
        }
        start_all(std::index_sequence_for<A...>{});
    }
    void on_cancel() noexcept {
        for (std::size_t i = 0; i < m_started; ++i) cancel_task(m_headers[i]);
    }
    // The awaiting frame goes while the branches wait, or after one won but
    // before the task resumed: every branch is given up, the winner too.
    void on_abandon() noexcept { teardown(std::index_sequence_for<A...>{}); }
    void on_discard() noexcept { teardown(std::index_sequence_for<A...>{}); }
    void describe(std::string& out) const {
        out += "when_any of ";
        out += std::to_string(count);
        out += ':';
        for (std::size_t i = 0; i < m_started; ++i) {
            out += i ? " | " : " ";
            const header& h = m_headers[i];
            if (h.m_wait_info)
                h.m_wait_info->describe(h.m_wait, out);
            else
                out += "ready";
        }
    }
    /// The winner's result, taken from its awaiter now.
    result_type take() {
        if (m_error) std::rethrow_exception(m_error);
        return (this->*takers(std::index_sequence_for<A...>{})[m_winner])();
    }

private:
    using taker = result_type (any_wait::*)();

    template <std::size_t... I>
    static constexpr std::array<taker, count> takers(std::index_sequence<I...>) noexcept {
        return {&any_wait::template take_branch<I>...};
    }

    template <std::size_t I>
    result_type take_branch() {
        auto& aw = std::get<I>(m_branches).awaiter();
        using R = typename std::tuple_element_t<I, branches>::result;
        if constexpr (std::is_void_v<R>) {
            aw.await_resume();
            return result_type(std::in_place_index<I>);
        } else if constexpr (std::is_lvalue_reference_v<R>) {
            return result_type(std::in_place_index<I>, std::ref(aw.await_resume()));
        } else {
            return result_type(std::in_place_index<I>, aw.await_resume());
        }
    }

    template <std::size_t... I>
    void start_all(std::index_sequence<I...>) {
        (start<I>(), ...);
    }

    /// Runs branch I until it first waits, as its own header; a branch that
    /// completes (or fails) on the way wins, and the later ones never start.
    template <std::size_t I>
    void start() {
        if (m_winner != no_winner) return;
        task_header* previous = exchange_running_task(&m_headers[I]);
        m_started = I + 1;
        try {
            auto& branch = std::get<I>(m_branches);
            branch.prepare();
            auto& aw = branch.awaiter();
            if (aw.await_ready()) {
                decide(I);
            } else {
                const std::coroutine_handle<> resume_point = branch_resume_point();
                using S = decltype(aw.await_suspend(resume_point));
                if constexpr (std::is_void_v<S>) {
                    aw.await_suspend(resume_point);
                } else if constexpr (std::is_same_v<S, bool>) {
                    if (!aw.await_suspend(resume_point)) decide(I);
                } else {
                    // A task: it runs now until it waits; if it ends, its
                    // end transfers to the resume point, which decides.
                    aw.await_suspend(resume_point).resume();
                }
            }
        } catch (...) {
            if (m_winner == no_winner) {
                m_error = std::current_exception();
                decide(I);
            }
        }
        exchange_running_task(previous);
    }

    static void arrive(branch_header& b) noexcept {
        auto& h = static_cast<header&>(b);
        h.m_race->decide(h.m_index);
    }

    void decide(std::size_t index) noexcept {
        if (m_winner != no_winner) return;
        m_winner = index;
        drop_losers(std::index_sequence_for<A...>{});
        complete();
    }

    template <std::size_t I>
    void drop() noexcept {
        // A branch whose wait completed in this tick is in the ready queue:
        // it leaves it, and is given up.
        m_headers[I].ready_hook().unlink();
        std::get<I>(m_branches).withdraw();
    }
    template <std::size_t... I>
    void drop_losers(std::index_sequence<I...>) noexcept {
        ((I != m_winner ? drop<I>() : void()), ...);
    }
    template <std::size_t... I>
    void teardown(std::index_sequence<I...>) noexcept {
        (drop<I>(), ...);
    }

    std::array<header, count> m_headers;
    branches m_branches;
    std::size_t m_started = 0;
    std::size_t m_winner = no_winner;
    std::exception_ptr m_error;
};

}  // namespace detail

}  // namespace spindle
