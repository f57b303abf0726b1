#pragma once
/// when_all: runs tasks concurrently on the current loop and waits for every
/// one of them. If any fails, the first failure (in argument order) is rethrown
/// once all have finished. Destroying the awaiting task aborts the children.

#include <spindle/loop.hpp>

#include <exception>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace spindle {

namespace detail {

template <class T>
using non_void_t = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

template <class T, class Slot>
task<void> store_into(task<T> t, Slot& slot) {
    if constexpr (std::is_void_v<T>) {
        co_await std::move(t);
        slot.emplace();
    } else {
        slot.emplace(co_await std::move(t));
    }
}

inline task<void> when_all_tasks(std::vector<task<void>> tasks) {
    struct children {
        std::vector<join_handle<void>> handles;
        ~children() {
            for (auto& h : handles)
                if (!h.done()) h.abort();
        }
    } spawned;
    loop& l = loop::current();
    spawned.handles.reserve(tasks.size());
    for (auto& t : tasks) spawned.handles.push_back(l.spawn(std::move(t), "when_all"));
    std::exception_ptr first;
    for (auto& h : spawned.handles) {
        try {
            co_await h;
        } catch (...) {
            if (!first) first = std::current_exception();
        }
    }
    if (first) std::rethrow_exception(first);
}

}  // namespace detail

/// Results in argument order; a task<void> gives std::monostate.
template <class... T>
task<std::tuple<detail::non_void_t<T>...>> when_all(task<T>... tasks) {
    std::tuple<std::optional<detail::non_void_t<T>>...> slots;
    std::vector<task<void>> wrapped;
    wrapped.reserve(sizeof...(T));
    {
        auto args = std::forward_as_tuple(std::move(tasks)...);
        [&]<std::size_t... I>(std::index_sequence<I...>) {
            (wrapped.push_back(detail::store_into(std::move(std::get<I>(args)), std::get<I>(slots))), ...);
        }(std::index_sequence_for<T...>{});
    }
    co_await detail::when_all_tasks(std::move(wrapped));
    co_return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::tuple<detail::non_void_t<T>...>(std::move(*std::get<I>(slots))...);
    }(std::index_sequence_for<T...>{});
}

/// Results in the vector's order.
template <class T>
task<std::vector<detail::non_void_t<T>>> when_all(std::vector<task<T>> tasks) {
    std::vector<std::optional<detail::non_void_t<T>>> slots(tasks.size());
    std::vector<task<void>> wrapped;
    wrapped.reserve(tasks.size());
    for (std::size_t i = 0; i < tasks.size(); ++i) wrapped.push_back(detail::store_into(std::move(tasks[i]), slots[i]));
    co_await detail::when_all_tasks(std::move(wrapped));
    std::vector<detail::non_void_t<T>> out;
    out.reserve(slots.size());
    for (auto& s : slots) out.push_back(std::move(*s));
    co_return out;
}

}  // namespace spindle
