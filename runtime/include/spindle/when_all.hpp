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

// Children keep their results in their own task headers, never in the parent's
// frame: a child may outlive the parent (when it is the very task that aborted
// it, it cannot be destroyed while it runs).
class abort_children {
public:
    explicit abort_children(std::size_t n) { m_children.reserve(n); }
    abort_children(const abort_children&) = delete;
    abort_children& operator=(const abort_children&) = delete;
    void add(task_header* child) { m_children.push_back(child); }
    ~abort_children() {
        for (task_header* child : m_children)
            if (child->m_status == task_status::running && child != running_task(*child->m_loop)) abort_task(*child);
    }

private:
    std::vector<task_header*> m_children;  // kept alive by the join handles declared before us
};

template <class T>
task<void> join_into(join_handle<T>& child, std::optional<non_void_t<T>>& slot, std::exception_ptr& first) {
    try {
        if constexpr (std::is_void_v<T>) {
            co_await child;
            slot.emplace();
        } else {
            slot.emplace(co_await child);
        }
    } catch (...) {
        if (!first) first = std::current_exception();
    }
}

}  // namespace detail

/// Results in argument order; a task<void> gives std::monostate.
template <class... T>
task<std::tuple<detail::non_void_t<T>...>> when_all(task<T>... tasks) {
    loop& l = loop::current();
    std::tuple<join_handle<T>...> children{l.spawn(std::move(tasks), "when_all")...};
    detail::abort_children guard(sizeof...(T));
    std::tuple<std::optional<detail::non_void_t<T>>...> slots;
    std::exception_ptr first;
    std::vector<task<void>> joins;
    joins.reserve(sizeof...(T));
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        (guard.add(std::get<I>(children).header_ptr()), ...);
        (joins.push_back(detail::join_into(std::get<I>(children), std::get<I>(slots), first)), ...);
    }(std::index_sequence_for<T...>{});
    for (auto& join : joins) co_await std::move(join);
    if (first) std::rethrow_exception(first);
    co_return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::tuple<detail::non_void_t<T>...>(std::move(*std::get<I>(slots))...);
    }(std::index_sequence_for<T...>{});
}

/// Results in the vector's order.
template <class T>
task<std::vector<detail::non_void_t<T>>> when_all(std::vector<task<T>> tasks) {
    loop& l = loop::current();
    std::vector<join_handle<T>> children;
    children.reserve(tasks.size());
    for (auto& t : tasks) children.push_back(l.spawn(std::move(t), "when_all"));
    detail::abort_children guard(children.size());
    for (auto& child : children) guard.add(child.header_ptr());
    std::vector<std::optional<detail::non_void_t<T>>> slots(children.size());
    std::exception_ptr first;
    for (std::size_t i = 0; i < children.size(); ++i) co_await detail::join_into(children[i], slots[i], first);
    if (first) std::rethrow_exception(first);
    std::vector<detail::non_void_t<T>> out;
    out.reserve(slots.size());
    for (auto& s : slots) out.push_back(std::move(*s));
    co_return out;
}

}  // namespace spindle
