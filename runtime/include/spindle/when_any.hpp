#pragma once
/// when_any: waits for the first of several operations and gives its result.
///
/// Over tasks, when_any(task<T>...) and when_any(std::vector<task<T>>), runs
/// the tasks concurrently and gives the result of the first to finish; the
/// others are cancelled (join_handle::cancel: the wait each is parked on
/// completes with operation_canceled) and when_any returns only after every
/// one of them has finished, so no loser outlives the call.
///
/// The first to finish wins even if it failed: its exception is rethrown.
/// The losers' results are dropped. A loser whose operation completed before
/// the cancel reached it (a read that got bytes in the same tick) finishes
/// with that result, and it is dropped too: do not race operations whose
/// effects cannot be lost (two reads of one stream) — put a deadline on one
/// operation with with_timeout instead. Cancelling the awaiting task (a
/// timeout around when_any, or join_handle::cancel) cancels every child.
/// Destroying the awaiting task aborts the children.
///
/// Over awaitables, when_any(ch.receive(), sleep_for(5ms), wait_signal(SIGINT))
/// (any mix of waits and tasks, at least one of them not a task) waits on
/// every branch at once, inside the awaiting task, and gives a std::variant
/// whose index() says which branch completed first and which holds its result
/// (the result of its co_await: result<T>, std::error_code...; std::monostate
/// for void). A branch is:
///   - a wait on the park protocol (parked<W>: what spindle's operations and
///     custom awaiters return), or with_timeout of one;
///   - an object whose co_await gives one (a join_handle);
///   - a task<T>, moved in.
/// The branches start in argument order, each until it first waits; one that
/// completes without waiting wins at once, and those after it never start.
///
/// The losers are given up the moment the winner completes, the way their
/// frame's destruction would give them up (parked<W>::withdraw): a wait still
/// parked is withdrawn (on_abandon), and one that completed in the same tick
/// but was not resumed releases what it was handed (on_discard): a channel
/// value goes back to the front of its channel, permits to their semaphore, a
/// signal is kept again, a broadcast receive had taken nothing. So no loser's
/// value is lost. The winner's result itself stays in its wait until the
/// awaiting task resumes; if that task is destroyed first, the winner is
/// released the same way. A losing task is destroyed where it waits (as by
/// join_handle::abort): its locals are destroyed but its own code after that
/// wait does not run — to let losers run their own cleanup, race tasks only.
///
/// Cancelling the awaiting task (a stop, a deadline around when_any,
/// join_handle::cancel) cancels every branch; the first to complete, with
/// its cancellation, wins. An exception from a branch (a task that throws, a
/// wait that cannot start) wins the same way and is rethrown.
///
/// Costs: nothing spawned and no frame per branch: each branch is a task
/// header inside the awaiter (the loop resumes it but does not list it: the
/// dump shows the awaiting task with every branch's wait), and every branch's
/// wait resumes one coroutine per thread, made once. A task branch is its own
/// frame, from the frame pool like any task. Await the awaiter in the
/// expression that creates it: it refers to the waits it was given.

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

class race_base {
public:
    static constexpr std::size_t no_winner = std::numeric_limits<std::size_t>::max();

    bool decided() const noexcept { return m_winner != no_winner; }
    std::size_t winner() const noexcept { return m_winner; }
    void rethrow_if_failed() const {
        if (m_error) std::rethrow_exception(m_error);
    }
    void lose_with(std::exception_ptr e, std::size_t index) noexcept {
        m_error = std::move(e);
        decide(index);
    }
    void add_child(task_header* child) { m_children.push_back(child); }
    void cancel_others() noexcept {
        for (std::size_t i = 0; i < m_children.size(); ++i)
            if (i != m_winner) cancel_task(*m_children[i]);
    }

    // The awaiting task parks on this until a child decides the race.
    class decided_wait : public waiter {
    public:
        explicit decided_wait(race_base& race) noexcept : m_race(race) {}
        static constexpr bool forwards_cancel = true;
        bool ready() const noexcept { return m_race.decided(); }
        void on_park() noexcept { m_race.m_waiter = this; }
        // The parent is cancelled: so are the children; the first of them to
        // finish (with its cancellation) decides the race.
        void on_cancel() noexcept {
            for (task_header* child : m_race.m_children) cancel_task(*child);
        }
        // The awaiting task was aborted: a child that runs on must not wake it.
        void on_abandon() noexcept {
            if (m_race.m_waiter == this) m_race.m_waiter = nullptr;
        }
        void describe(std::string& out) const { out += "when_any of " + std::to_string(m_race.m_children.size()) + " tasks"; }
        void take() noexcept { m_race.m_waiter = nullptr; }

    private:
        race_base& m_race;
    };
    using wait = parked<decided_wait>;

protected:
    void decide(std::size_t index) noexcept {
        m_winner = index;
        if (m_waiter) m_waiter->complete();
    }

private:
    std::size_t m_winner = no_winner;
    std::exception_ptr m_error;
    waiter* m_waiter = nullptr;
    std::vector<task_header*> m_children;  // kept alive by the awaiting frame's join handles
};

template <class R>
class race : public race_base {
public:
    template <std::size_t I, class T>
    void win(T&& value) {
        m_value.emplace(std::in_place_index<I>, std::forward<T>(value));
        decide(I);
    }
    template <class T>
    void win_at(std::size_t index, T&& value) {
        m_value.emplace(std::forward<T>(value));
        decide(index);
    }
    R take() { return std::move(*m_value); }

private:
    std::optional<R> m_value;
};

// The race is shared with the entries: a child that aborts the awaiting task
// cannot be aborted itself while it runs, so it finishes after the awaiting
// frame is gone and must still find the race alive.
template <std::size_t I, class R, class T>
task<void> race_entry(task<T> t, std::shared_ptr<race<R>> shared) {
    race<R>& r = *shared;
    try {
        if constexpr (std::is_void_v<T>) {
            co_await std::move(t);
            if (!r.decided()) r.template win<I>(std::monostate{});
        } else if constexpr (std::is_reference_v<T>) {
            T value = co_await std::move(t);
            if (!r.decided()) r.template win<I>(std::ref(value));
        } else {
            T value = co_await std::move(t);
            if (!r.decided()) r.template win<I>(std::move(value));
        }
    } catch (...) {
        if (!r.decided()) r.lose_with(std::current_exception(), I);
    }
}

template <class R, class T>
task<void> race_entry_at(task<T> t, std::shared_ptr<race<R>> shared, std::size_t index) {
    race<R>& r = *shared;
    try {
        if constexpr (std::is_void_v<T>) {
            co_await std::move(t);
            if (!r.decided()) r.win_at(index, std::monostate{});
        } else if constexpr (std::is_reference_v<T>) {
            T value = co_await std::move(t);
            if (!r.decided()) r.win_at(index, std::ref(value));
        } else {
            T value = co_await std::move(t);
            if (!r.decided()) r.win_at(index, std::move(value));
        }
    } catch (...) {
        if (!r.decided()) r.lose_with(std::current_exception(), index);
    }
}

}  // namespace detail

/// The winner's result; variant::index() says which task won (a task<void>
/// gives std::monostate, a task<U&> a std::reference_wrapper<U>).
template <class... T>
task<std::variant<detail::joined_t<T>...>> when_any(task<T>... tasks) {
    static_assert(sizeof...(T) > 0, "when_any needs at least one task");
    using result_type = std::variant<detail::joined_t<T>...>;
    loop& l = loop::current();
    auto shared = std::make_shared<detail::race<result_type>>();
    detail::race<result_type>& race = *shared;
    std::vector<join_handle<void>> children;
    children.reserve(sizeof...(T));
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        (children.push_back(l.spawn(detail::race_entry<I>(std::move(tasks), shared), "when_any")), ...);
    }(std::index_sequence_for<T...>{});
    detail::when_all_children guard(children.size());
    for (auto& child : children) {
        guard.add(child.header_ptr());
        race.add_child(child.header_ptr());
    }
    co_await detail::race_base::wait(std::stop_token{}, race);
    race.cancel_others();
    for (auto& child : children) co_await child;
    race.rethrow_if_failed();
    co_return race.take();
}

/// The winner's index and result.
template <class T>
task<std::pair<std::size_t, detail::joined_t<T>>> when_any(std::vector<task<T>> tasks) {
    if (tasks.empty()) throw std::invalid_argument("spindle: when_any of no tasks");
    using result_type = detail::joined_t<T>;
    loop& l = loop::current();
    auto shared = std::make_shared<detail::race<result_type>>();
    detail::race<result_type>& race = *shared;
    std::vector<join_handle<void>> children;
    children.reserve(tasks.size());
    for (std::size_t i = 0; i < tasks.size(); ++i)
        children.push_back(l.spawn(detail::race_entry_at(std::move(tasks[i]), shared, i), "when_any"));
    detail::when_all_children guard(children.size());
    for (auto& child : children) {
        guard.add(child.header_ptr());
        race.add_child(child.header_ptr());
    }
    co_await detail::race_base::wait(std::stop_token{}, race);
    race.cancel_others();
    for (auto& child : children) co_await child;
    race.rethrow_if_failed();
    const std::size_t index = race.winner();
    co_return std::pair<std::size_t, detail::joined_t<T>>(index, race.take());
}

// --- when_any over awaitables ---------------------------------------------------

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

/// A branch that is a task: the when_any owns it; giving it up destroys its
/// frame, with the waits in it.
template <class Task>
class task_branch {
public:
    using awaiter_type = typename Task::awaiter;
    using result = decltype(std::declval<awaiter_type&>().await_resume());

    explicit task_branch(Task&& t) noexcept : m_task(std::move(t)) {}
    void prepare() noexcept { m_awaiter = m_task.operator co_await(); }
    awaiter_type& awaiter() noexcept { return m_awaiter; }
    void withdraw() noexcept { m_task = Task{}; }

private:
    Task m_task;
    awaiter_type m_awaiter{};
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
    static_assert(is_task<P>::value || withdrawable_awaiter<P> || awaits_withdrawable<P>,
                  "spindle::when_any: a branch is a task, a wait on the park protocol (spindle::parked<W>: what "
                  "spindle's operations return), with_timeout of one, or a join_handle");
    static_assert(!is_task<P>::value || !std::is_lvalue_reference_v<A>, "spindle::when_any: move a task in (std::move)");
    using type = std::conditional_t<is_task<P>::value, task_branch<P>,
                                    std::conditional_t<withdrawable_awaiter<P>, ref_branch<P>, co_await_branch<P>>>;
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

/// Waits on every branch at once (see the file comment): `co_await
/// when_any(ch.receive(), sleep_for(5ms))` gives std::variant<result<T>,
/// std::error_code>, index() the branch that completed first. At least one
/// branch is not a task (tasks alone take the overload above).
template <class... A>
    requires(sizeof...(A) > 0 && !(detail::is_task<std::remove_cvref_t<A>>::value && ...))
[[nodiscard]] parked<detail::any_wait<A...>> when_any(A&&... branches) {
    return parked<detail::any_wait<A...>>(std::stop_token{}, std::forward<A>(branches)...);
}

}  // namespace spindle
