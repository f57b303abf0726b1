#pragma once
/// when_all: runs tasks concurrently on the current loop and waits for every
/// one of them. If any fails, the first failure (in argument order) is rethrown
/// once all have finished. Destroying the awaiting task aborts the children.
///
/// Cancelling the awaiting task (with_timeout around when_all, or
/// join_handle::cancel) cancels every child (join_handle::cancel: the wait each
/// is parked on completes with operation_canceled); when_all waits for them all
/// to finish, then throws std::system_error(operation_canceled). Under
/// with_timeout, whose result for a when_all is a result<std::tuple<...>>,
/// that is the result's timed_out, not an exception.

#include <spindle/loop.hpp>
#include <spindle/park.hpp>

#include <system_error>

#include <exception>
#include <functional>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace spindle {

namespace detail {

/// What when_all and when_any hold and return for a task<T>: std::monostate
/// for void, std::reference_wrapper<U> for a reference U& (neither a variant
/// nor a vector nor an optional can hold a reference), T itself otherwise.
template <class T>
using joined_t = std::conditional_t<std::is_void_v<T>, std::monostate,
                                    std::conditional_t<std::is_reference_v<T>, std::reference_wrapper<std::remove_reference_t<T>>, T>>;

// Children keep their results in their own task headers, never in the parent's
// frame: a child may outlive the parent (when it is the very task that aborted
// it, it cannot be destroyed while it runs).
class when_all_children {
public:
    explicit when_all_children(std::size_t n) { m_children.reserve(n); }
    when_all_children(const when_all_children&) = delete;
    when_all_children& operator=(const when_all_children&) = delete;
    void add(task_header* child) { m_children.push_back(child); }
    /// The awaiting task was cancelled (a deadline, join_handle::cancel): so
    /// is every child; when_all still waits for them all.
    void cancel_all() noexcept {
        m_cancelled = true;
        for (task_header* child : m_children) cancel_task(*child);
    }
    bool cancelled() const noexcept { return m_cancelled; }
    ~when_all_children() {
        for (task_header* child : m_children)
            if (child->m_status == task_status::running && child != running_task(*child->m_loop)) abort_task(*child);
    }

private:
    std::vector<task_header*> m_children;  // kept alive by the join handles declared before us
    bool m_cancelled = false;
};

/// A join that passes a cancellation of the awaiting task on to every child
/// of the when_all, then goes on waiting.
template <class T>
class when_all_join_wait : public join_wait<T> {
public:
    when_all_join_wait(spawned<T>* child, when_all_children& all) noexcept : join_wait<T>(child), m_all(&all) {}
    static constexpr bool forwards_cancel = true;
    void on_cancel() noexcept { m_all->cancel_all(); }

private:
    when_all_children* m_all;
};

template <class T>
task<void> join_into(join_handle<T>& child, when_all_children& all, std::optional<joined_t<T>>& slot, std::exception_ptr& first) {
    try {
        auto* header = static_cast<spawned<T>*>(child.header_ptr());
        if constexpr (std::is_void_v<T>) {
            co_await parked<when_all_join_wait<T>>(std::stop_token{}, header, all);
            slot.emplace();
        } else {
            slot.emplace(co_await parked<when_all_join_wait<T>>(std::stop_token{}, header, all));
        }
    } catch (...) {
        if (!first) first = std::current_exception();
    }
}

/// What a cancelled when_all throws once every child has finished (with_timeout
/// makes it the timed_out of its result).
[[noreturn]] inline void throw_when_all_cancelled() { throw std::system_error(cancelled_error(), "when_all cancelled"); }

}  // namespace detail

/// Results in argument order; a task<void> gives std::monostate, a task<U&> a
/// std::reference_wrapper<U>.
template <class... T>
task<std::tuple<detail::joined_t<T>...>> when_all(task<T>... tasks) {
    loop& l = loop::current();
    std::tuple<join_handle<T>...> children{l.spawn(std::move(tasks), "when_all")...};
    detail::when_all_children guard(sizeof...(T));
    std::tuple<std::optional<detail::joined_t<T>>...> slots;
    std::exception_ptr first;
    std::vector<task<void>> joins;
    joins.reserve(sizeof...(T));
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        (guard.add(std::get<I>(children).header_ptr()), ...);
        (joins.push_back(detail::join_into(std::get<I>(children), guard, std::get<I>(slots), first)), ...);
    }(std::index_sequence_for<T...>{});
    for (auto& join : joins) co_await std::move(join);
    if (guard.cancelled()) detail::throw_when_all_cancelled();
    if (first) std::rethrow_exception(first);
    co_return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::tuple<detail::joined_t<T>...>(std::move(*std::get<I>(slots))...);
    }(std::index_sequence_for<T...>{});
}

/// Results in the vector's order.
template <class T>
task<std::vector<detail::joined_t<T>>> when_all(std::vector<task<T>> tasks) {
    loop& l = loop::current();
    std::vector<join_handle<T>> children;
    children.reserve(tasks.size());
    for (auto& t : tasks) children.push_back(l.spawn(std::move(t), "when_all"));
    detail::when_all_children guard(children.size());
    for (auto& child : children) guard.add(child.header_ptr());
    std::vector<std::optional<detail::joined_t<T>>> slots(children.size());
    std::exception_ptr first;
    for (std::size_t i = 0; i < children.size(); ++i) co_await detail::join_into(children[i], guard, slots[i], first);
    if (guard.cancelled()) detail::throw_when_all_cancelled();
    if (first) std::rethrow_exception(first);
    std::vector<detail::joined_t<T>> out;
    out.reserve(slots.size());
    for (auto& s : slots) out.push_back(std::move(*s));
    co_return out;
}

}  // namespace spindle
