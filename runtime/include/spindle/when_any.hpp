#pragma once
/// when_any: waits for the first of several waits and gives its result.
///
/// when_any(ch.receive(), sleep_for(5ms), wait_signal(SIGINT)) waits on
/// every branch at once, inside the awaiting task, and gives a std::variant
/// whose index() says which branch completed first and which holds its result
/// (the result of its co_await: result<T>, result<void>...; std::monostate
/// for void). A branch is:
///   - a wait on the park protocol (parked<W>: what spindle's operations and
///     custom awaiters return), or with_timeout of one;
///   - an object whose co_await gives one (a join_handle).
/// A task is not a branch: race(tasks...) (race.hpp) runs tasks, cancels the
/// losers and joins them. Passing one here does not compile.
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
/// released the same way.
///
/// Cancelling the awaiting task (a stop, a deadline around when_any,
/// join_handle::cancel) cancels every branch; the first to complete, with
/// its cancellation, wins. An exception from a branch (a wait that cannot
/// start) wins the same way and is rethrown.
///
/// Costs: nothing spawned and no frame per branch: each branch is a task
/// header inside the awaiter (the loop resumes it but does not list it: the
/// dump shows the awaiting task with every branch's wait), and every branch's
/// wait resumes one coroutine per thread, made once. Await the awaiter in the
/// expression that creates it: it refers to the waits it was given.

#include <spindle/detail/any_wait.hpp>
#include <spindle/park.hpp>

#include <stop_token>
#include <type_traits>
#include <utility>

namespace spindle {

/// Waits on every branch at once (see the file comment): `co_await
/// when_any(ch.receive(), sleep_for(5ms))` gives std::variant<result<T>,
/// result<void>>, index() the branch that completed first.
template <class... A>
    requires(sizeof...(A) > 0 && (!detail::is_task<std::remove_cvref_t<A>>::value && ...))
[[nodiscard]] parked<detail::any_wait<A...>> when_any(A&&... branches) {
    return parked<detail::any_wait<A...>>(std::stop_token{}, std::forward<A>(branches)...);
}

/// A task is no branch of when_any: race(tasks...) (race.hpp) runs tasks,
/// cancels the losers and joins them; when_any withdraws waits.
template <class... A>
    requires(detail::is_task<std::remove_cvref_t<A>>::value || ...)
void when_any(A&&...) = delete;

}  // namespace spindle
