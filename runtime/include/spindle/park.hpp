#pragma once
/// The park protocol: how a task waits for anything. Every awaiter of spindle
/// (sleeps, I/O, signals, locks, channels, joins...) is written on it, and so
/// can yours (docs/custom-awaiters.md).
///
/// Write a wait as a class derived from spindle::waiter with these public
/// members (the optional ones are found by name):
///
///   void on_park();                // required: start waiting. Call complete()
///                                  // when the wait is over, from here (it then
///                                  // does not suspend) or later, on the loop's
///                                  // thread (another thread: loop::post first).
///   void on_abandon() noexcept;    // required: the awaiting frame is destroyed
///                                  // while waiting (task aborted, loop
///                                  // destroyed): withdraw, never complete().
///   void on_cancel() noexcept;     // optional, makes the wait cancellable: stop
///                                  // the wait if you can, and call
///                                  // complete_cancelled() (or complete() later,
///                                  // when cancelling is asynchronous). May be
///                                  // called more than once while parked (a
///                                  // deadline, then the token): be idempotent.
///   static constexpr bool forwards_cancel = true;  // optional: see below
///   bool ready();                  // optional: true when there is no need to
///                                  // wait at all (no suspension). Runs before
///                                  // the task is known: owner() is not valid yet.
///   void on_discard() noexcept;    // optional: completed but destroyed before
///                                  // the task resumed: release what the
///                                  // completion handed over.
///   void describe(std::string&) const;  // optional: for loop::dump_tasks().
///   R take();                      // optional: what co_await gives back, a
///                                  // result<T>; default: result<void>, an
///                                  // error only when cancelled
///                                  // (operation_canceled).
///
/// and await it as spindle::parked<W>(stop_token, constructor arguments...).
/// parked<W> does the rest, the same way for every wait: the stop_token,
/// cancel scopes (with_timeout reaching the wait at any depth of awaited
/// tasks), join_handle::cancel(), the "waiting on" line of the task dump and
/// its timestamp, resumption through the loop (never inline), and the order of
/// withdrawal when the frame goes away.
///
/// A wait that completes without waiting (ready() true, or complete() called
/// from on_park()) spends one unit of the task's budget
/// (loop_options::task_budget); with none left, the task goes to the back of
/// the ready queue before it sees the result, so a task whose operations are
/// always ready cannot hold the loop.
///
/// A cancellable wait whose task is cancelled already (a stopped token, an
/// expired with_timeout, join_handle::cancel) completes with
/// operation_canceled before anything starts, even if it would not have had
/// to wait: ready() and on_park() are not called. A wait that passes
/// cancellation on to child tasks and waits for them (when_any, a task
/// group's join) says `static constexpr bool forwards_cancel = true;`: it is
/// started, then cancelled through on_cancel().
///
/// parked<W>::withdraw() gives a wait up before its frame goes, with the
/// same on_abandon / on_discard as the destruction: when_any drops its losing
/// branches that way.
///
/// Everything happens on the loop's thread; stop requests too (from another
/// thread, post() the request_stop() call). An answer that arrives on another
/// thread reaches the wait through a remote_answer (remote_answer.hpp), which
/// posts it to the loop and drops it when the wait is gone by then.

#include <spindle/detail/engine.hpp>
#include <spindle/detail/frame_pool.hpp>
#include <spindle/detail/stop_link.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/result.hpp>

#include <coroutine>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

namespace spindle {

template <class Wait, bool TakesToken = true>
class parked;
template <class T>
class remote_answer;

class waiter {
public:
    waiter(const waiter&) = delete;
    waiter& operator=(const waiter&) = delete;

    /// The wait is over: the task resumes in a later tick, never inside this
    /// call. Loop thread only. Does nothing once the wait completed.
    void complete() noexcept {
        if (m_wait_state == state::parked) {
            m_wait_state = state::done;
            detail::schedule(*m_wait_task);
        } else if (m_wait_state == state::parking) {
            m_wait_state = state::done;  // completed while starting: no suspension
        }
    }
    /// Completes the wait as cancelled: cancelled() turns true.
    void complete_cancelled() noexcept {
        if (m_wait_state != state::parked && m_wait_state != state::parking) return;
        m_wait_cancelled = true;
        complete();
    }

    /// Parked and not completed yet.
    bool waiting() const noexcept { return m_wait_state == state::parked; }
    /// Completed by cancellation (the stop_token, a deadline, a cancelled task).
    bool cancelled() const noexcept { return m_wait_cancelled; }

protected:
    waiter() noexcept = default;
    ~waiter() = default;

    /// The waiting task's loop; valid from on_park() on.
    loop& owner() const noexcept { return detail::loop_of(detail::core_of(*m_wait_task)); }
    /// For spindle's own waits: the engine the task runs on.
    detail::loop_core& core() const noexcept { return detail::core_of(*m_wait_task); }

private:
    template <class, bool>
    friend class parked;
    template <class>
    friend class remote_answer;
    // requeued: done without waiting, and sent to the back of the ready
    // queue because the task's budget was spent.
    enum class state : std::uint8_t { idle, parking, parked, done, requeued, resumed };

    detail::task_header* m_wait_task = nullptr;
    state m_wait_state = state::idle;
    bool m_wait_cancelled = false;
    // parked<W> is linked to its token's list, in the words its token had
    // (in this class's padding: no room of its own).
    bool m_wait_stop_linked = false;
};

namespace detail {

template <class W>
concept cancellable_wait = requires(W& w) { w.on_cancel(); };
template <class W>
concept wait_with_ready = requires(W& w) { { w.ready() } -> std::convertible_to<bool>; };
template <class W>
concept wait_with_discard = requires(W& w) { w.on_discard(); };
template <class W>
concept wait_with_describe = requires(const W& w, std::string& out) { w.describe(out); };
template <class W>
concept wait_with_take = requires(W& w) { w.take(); };
/// A wait that passes a cancellation on (to child tasks) and goes on waiting
/// for them, instead of ending: `static constexpr bool forwards_cancel = true;`.
template <class W>
concept forwards_cancel = requires { requires W::forwards_cancel; };

/// on_cancel and on_discard run where nothing may throw.
template <class W>
constexpr bool hooks_noexcept() {
    bool ok = true;
    if constexpr (cancellable_wait<W>) ok = ok && noexcept(std::declval<W&>().on_cancel());
    if constexpr (wait_with_discard<W>) ok = ok && noexcept(std::declval<W&>().on_discard());
    return ok;
}

/// Records the wait a task is parked on and since when (for the dump, and so
/// that a cancel scope or join_handle::cancel can reach it).
inline void mark_parked(task_header& t, const wait_info* info, void* wait) noexcept {
    t.m_wait_info = info;
    t.m_wait = wait;
    t.m_parked_at = recent_ns(core_of(t));
}

inline void unmark_parked(task_header& t) noexcept { t.m_wait_info = nullptr; }

// --- the protocol's rules, one home each: parked<W> below, with_timeout,
// async_generator and the loop's join_handle::cancel use them.

/// True (and the cancel noted on the task's scopes) when the running task's
/// own cancellation (join_handle::cancel, a deadline) ends a wait before it
/// starts.
[[gnu::always_inline]] inline bool task_cancel_pending() noexcept {
    task_header* t = current_task_or_null();
    if (!t || !t->cancel_pending()) return false;
    t->note_cancel_reached();
    return true;
}

/// Cancels the wait task `t` is parked on, if that wait can be cancelled,
/// and marks the open scopes the cancel cut short; true if it reached a
/// wait. A running (or ready) task meets the cancel at its next wait instead.
inline bool cancel_parked_wait(task_header& t) noexcept {
    if (&t == current_task_or_null()) return false;
    const wait_info* info = t.m_wait_info;
    if (!info || !info->cancel || !info->cancel(t.m_wait)) return false;
    t.note_cancel_reached();
    return true;
}

/// Opens `scope` in task `t`: the innermost from now on.
inline void open_cancel_scope(task_header& t, cancel_scope& scope) noexcept {
    scope.m_parent = t.m_scope;
    t.m_scope = &scope;
}

/// Closes `scope` wherever it is in the chain of `t`: scopes do not always
/// close innermost first. with_timeout(a, with_timeout(b, op)) closes the
/// outer scope before it resumes the inner awaiter, and a destroyed frame
/// destroys an outer awaiter before the inner ones it holds; restoring the
/// parent blindly would leave the task pointing at a dead scope.
inline void close_cancel_scope(task_header& t, cancel_scope& scope) noexcept {
    cancel_scope** link = &t.m_scope;
    while (*link && *link != &scope) link = &(*link)->m_parent;
    if (*link) *link = scope.m_parent;
}

/// The scope's deadline passed or its stop came: every wait of `t` inside it
/// is cancelled from now on, and the one it is parked on now.
inline void cancel_within(task_header& t, cancel_scope& scope) noexcept {
    scope.m_cancelled = true;
    (void)cancel_parked_wait(t);
}

/// The budget rule's second half: an operation of `t` completed without
/// waiting when no budget was left (spend_budget() said false), so the task
/// goes to the back of the ready queue and resumes at `h`, the operation's
/// result kept for it. When it resumes, spend_requeued_turn().
inline void requeue_for_budget(task_header& t, std::coroutine_handle<> h) noexcept {
    t.m_resume = h;
    schedule(t);
}

/// A task requeued by requeue_for_budget resumed: the operation that found
/// the budget spent is the first of its new turn.
inline void spend_requeued_turn() noexcept { (void)spend_budget(); }

}  // namespace detail

/// A wait `Wait` run by the park protocol: what a task co_awaits. With
/// TakesToken false, it takes no stop token (an empty one only) and keeps
/// no word for one; cancel scopes and join_handle::cancel still reach it.
/// For an overload without a token, such as sleep_for(d): a frame holds its
/// wait for as long as the task waits.
template <class Wait, bool TakesToken>
class parked final : public Wait {
    static_assert(std::is_base_of_v<waiter, Wait>, "spindle::parked<W>: W must derive from spindle::waiter");
    static_assert(noexcept(std::declval<Wait&>().on_abandon()), "spindle::parked<W>: on_abandon() must be noexcept");
    using state = waiter::state;
    static constexpr bool cancellable = detail::cancellable_wait<Wait>;
    // Keeps the token, then its place in the list of the token's waits.
    static constexpr bool tokened = cancellable && TakesToken;
    static_assert(detail::hooks_noexcept<Wait>(), "spindle::parked<W>: on_cancel() and on_discard() must be noexcept");

public:
    /// Builds the wait from `args`; a stop requested on `token` cancels it
    /// (ignored by a wait without on_cancel()).
    template <class... Args>
    requires TakesToken explicit parked(std::stop_token token, Args&&... args)
        : Wait(std::forward<Args>(args)...), m_stop(std::move(token)) {}
    /// Builds a wait that takes no token from `args`.
    template <class... Args>
        requires(!TakesToken)
    explicit parked(std::in_place_t, Args&&... args) : Wait(std::forward<Args>(args)...), m_stop(std::stop_token{}) {}
    parked(const parked&) = delete;
    parked& operator=(const parked&) = delete;

    ~parked() {
        withdraw();
        if constexpr (tokened) m_stop.token.~stop_token();
    }

    /// Gives the wait up now, as the destruction of its frame would: parked,
    /// it is withdrawn (on_abandon); completed but not resumed, what the
    /// completion handed over is released (on_discard). Then it is over:
    /// nothing resumes it, its destruction does nothing more, and it must not
    /// be awaited again. For what awaits a wait on a task's behalf and may
    /// drop it (when_any).
    void withdraw() noexcept {
        if (this->m_wait_state == state::parked) {
            // Withdraw, wake nobody.
            detail::unmark_parked(*this->m_wait_task);
            Wait::on_abandon();
        } else if (this->m_wait_state == state::done || this->m_wait_state == state::requeued) {
            // Completed, but the task will never see the result.
            if constexpr (detail::wait_with_discard<Wait>) Wait::on_discard();
        }
        this->m_wait_state = state::resumed;
        if constexpr (tokened) unlink_stop();
    }

    bool await_ready() {
        if constexpr (cancellable) {
            // Every way of cancelling stops the next wait, even one that would
            // not have to wait (data already buffered, a value in a channel):
            // a cancelled task must not run on through ready operations.
            bool stopped = false;
            if constexpr (tokened) stopped = m_stop.token.stop_requested();
            if (stopped || (!detail::forwards_cancel<Wait> && detail::task_cancel_pending())) {
                this->m_wait_cancelled = true;
                this->m_wait_state = state::done;
                return true;
            }
        }
        if constexpr (detail::wait_with_ready<Wait>) {
            if (Wait::ready()) {
                this->m_wait_state = state::done;
                // Done without waiting: that spends the task's budget. With
                // none left, the task still goes to the back of the ready
                // queue (await_suspend), its result kept for when it returns.
                return detail::spend_budget();
            }
        }
        return false;
    }

    bool await_suspend(std::coroutine_handle<> h) {
        detail::task_header& t = detail::current_task();
        this->m_wait_task = &t;
        t.m_resume = h;
        if (this->m_wait_state == state::done) {
            // Completed in await_ready, with the task's budget spent.
            this->m_wait_state = state::requeued;
            detail::requeue_for_budget(t, h);
            return true;
        }
        // A token that can stop is heard through its loop's entry for it
        // (detail/stop_link.hpp), found before parking, so running out of
        // memory leaves the wait unstarted.
        detail::stop_entry* stop_entry = nullptr;
        if constexpr (tokened)
            if (m_stop.token.stop_possible()) stop_entry = &detail::stop_entry_for(detail::core_of(t), m_stop.token);
        this->m_wait_state = state::parking;
        try {
            Wait::on_park();
        } catch (...) {
            this->m_wait_state = state::idle;
            throw;
        }
        if (this->m_wait_state == state::done) {
            // Completed at once: as in await_ready, that spends the budget.
            if (detail::spend_budget()) return false;
            this->m_wait_state = state::requeued;
            detail::requeue_for_budget(t, h);
            return true;
        }
        this->m_wait_state = state::parked;
        detail::mark_parked(t, &info, this);
        if constexpr (tokened) {
            if (stop_entry) {
                // The entry holds the token's state: the token is not needed
                // any more, and its word goes to the link.
                const bool stopped = m_stop.token.stop_requested();
                m_stop.token.~stop_token();
                ::new (&m_stop.link) detail::stop_link();
                m_stop.link.m_task = &t;
                this->m_wait_stop_linked = true;
                detail::link_stop(*stop_entry, m_stop.link);
                // A stop requested since await_ready (from another thread):
                // as a callback registered now would, cancel at once.
                if (stopped) {
                    unlink_stop();
                    Wait::on_cancel();
                }
            }
        }
        if constexpr (cancellable) {
            if (this->m_wait_state == state::parked && t.cancel_pending()) {
                Wait::on_cancel();
                t.note_cancel_reached();
            }
        }
        return true;
    }

    decltype(auto) await_resume() {
        if (this->m_wait_state == state::parked || this->m_wait_state == state::done) {
            if (this->m_wait_task) detail::unmark_parked(*this->m_wait_task);
        } else if (this->m_wait_state == state::requeued) {
            detail::spend_requeued_turn();
        }
        this->m_wait_state = state::resumed;
        if constexpr (tokened) unlink_stop();
        if constexpr (detail::wait_with_take<Wait>)
            return Wait::take();
        else
            return this->cancelled() ? result<void>(cancelled_error()) : result<void>();
    }

private:
    bool cancel() noexcept {
        if constexpr (cancellable) {
            if (this->m_wait_state == state::parked) {
                Wait::on_cancel();
                return true;
            }
        }
        return false;
    }

    static bool cancel_thunk(void* p) noexcept { return static_cast<parked*>(p)->cancel(); }
    static void describe_thunk(const void* p, std::string& out) {
        if constexpr (detail::wait_with_describe<Wait>)
            static_cast<const parked*>(p)->describe(out);
        else
            out += "a wait";
    }
    static constexpr detail::wait_info info{cancellable ? &cancel_thunk : nullptr, &describe_thunk};

    void unlink_stop() noexcept {
        if constexpr (tokened) {
            if (!this->m_wait_stop_linked) return;
            m_stop.link.unlink();
            m_stop.link.~stop_link();
            ::new (&m_stop.token) std::stop_token();  // the words are a (spent) token again
            this->m_wait_stop_linked = false;
        }
    }

    // A frame holds a wait for as long as its task waits: a wait that takes
    // a token keeps it until the wait parks, then its place in the list of
    // the token's waits on its loop, in the same words (while the waiter says
    // it is linked); one that takes none keeps neither.
    union stop_word {
        explicit stop_word(std::stop_token t) noexcept : token(std::move(t)) {}
        ~stop_word() {}
        std::stop_token token;
        detail::stop_link link;
    };
    struct no_stop_word {
        explicit no_stop_word(std::stop_token) noexcept {}
    };
    [[no_unique_address]] std::conditional_t<tokened, stop_word, no_stop_word> m_stop;
};

/// For an operation served without a wait (a line already buffered): true
/// when a wait started now would be cancelled at once, as parked<W> checks
/// first. That is when `token` is stopped, or the running task is cancelled
/// or past a with_timeout deadline; the cancel is then noted on the task's
/// scopes, so a with_timeout around the call reports that it cut it short.
inline bool cancel_requested(const std::stop_token& token) noexcept {
    return token.stop_requested() || detail::task_cancel_pending();
}

}  // namespace spindle
