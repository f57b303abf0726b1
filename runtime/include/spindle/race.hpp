#pragma once
/// race: runs several tasks at once and gives the result of the first to finish.
///
/// race(task<T>...) and race(std::vector<task<T>>) run
/// the tasks concurrently and give the result of the first to finish; the
/// others are cancelled (join_handle::cancel: the wait each is parked on
/// completes with operation_canceled) and race returns only after every
/// one of them has finished, so no loser outlives the call.
///
/// The first to finish wins even if it failed: its exception is rethrown.
/// The losers' results are dropped. A loser whose operation completed before
/// the cancel reached it (a read that got bytes in the same tick) finishes
/// with that result, and it is dropped too: do not race operations whose
/// effects cannot be lost (two reads of one stream) — put a deadline on one
/// operation with with_timeout instead. Cancelling the awaiting task (a
/// timeout around race, or join_handle::cancel) cancels every child.
/// Destroying the awaiting task aborts the children.
///
/// To wait for the first of several waits (a receive, a sleep, a signal)
/// inside one task, with the losing waits withdrawn rather than cancelled and
/// joined, use when_any (when_any.hpp); a call mixes no tasks with waits.

#include <spindle/detail/race_engine.hpp>
#include <spindle/join_handle.hpp>
#include <spindle/loop.hpp>
#include <spindle/task.hpp>

#include <cstddef>
#include <stdexcept>
#include <utility>
#include <variant>
#include <vector>

namespace spindle {

/// The winner's result; variant::index() says which task won (a task<void>
/// gives std::monostate, a task<U&> a std::reference_wrapper<U>).
template <class... T>
task<std::variant<detail::joined_t<T>...>> race(task<T>... tasks) {
    static_assert(sizeof...(T) > 0, "spindle::race needs at least one task");
    using result_type = std::variant<detail::joined_t<T>...>;
    loop& l = loop::current();
    auto shared = std::make_shared<detail::race<result_type>>();
    detail::race<result_type>& race = *shared;
    std::vector<join_handle<void>> children;
    children.reserve(sizeof...(T));
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        (children.push_back(l.spawn(detail::race_entry<I>(std::move(tasks), shared), "race")), ...);
    }(std::index_sequence_for<T...>{});
    co_return co_await detail::settle_race(race, children);
}

/// The winner's index and result.
template <class T>
task<std::pair<std::size_t, detail::joined_t<T>>> race(std::vector<task<T>> tasks) {
    if (tasks.empty()) throw std::invalid_argument("spindle: race of no tasks");
    using result_type = detail::joined_t<T>;
    loop& l = loop::current();
    auto shared = std::make_shared<detail::race<result_type>>();
    detail::race<result_type>& race = *shared;
    std::vector<join_handle<void>> children;
    children.reserve(tasks.size());
    for (std::size_t i = 0; i < tasks.size(); ++i)
        children.push_back(l.spawn(detail::race_entry_at(std::move(tasks[i]), shared, i), "race"));
    result_type winner = co_await detail::settle_race(race, children);
    co_return std::pair<std::size_t, detail::joined_t<T>>(race.winner(), std::move(winner));
}

}  // namespace spindle
