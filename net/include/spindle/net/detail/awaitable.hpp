#pragma once
// What `co_await x` yields, as a type, and an awaiter that is ready at once:
// the vocabulary of the byte_stream concept.

#include <concepts>
#include <coroutine>
#include <type_traits>
#include <utility>

namespace spindle::net::detail {

// For decltype only: for a plain awaiter it returns a reference to its argument.
template <class A>
decltype(auto) awaiter_for(A&& a) {
    if constexpr (requires { std::forward<A>(a).operator co_await(); })
        return std::forward<A>(a).operator co_await();
    else if constexpr (requires { operator co_await(std::forward<A>(a)); })
        return operator co_await(std::forward<A>(a));
    else
        return std::forward<A>(a);
}

template <class A>
concept has_awaiter = requires(A&& a) {
    awaiter_for(std::forward<A>(a)).await_ready();
    awaiter_for(std::forward<A>(a)).await_resume();
};

/// The type `co_await std::declval<A>()` yields.
template <has_awaiter A>
using await_result_t = decltype(awaiter_for(std::declval<A>()).await_resume());

/// `A` is awaitable (as an rvalue, the way a call's result is awaited) and
/// yields `R`, ignoring references and const.
template <class A, class R>
concept awaitable_of = has_awaiter<A> && std::same_as<std::remove_cvref_t<await_result_t<A>>, R>;

/// An awaiter that never suspends: lets a value computed synchronously be
/// awaited like an operation.
template <class T>
struct ready_awaiter {
    T m_value;
    bool await_ready() const noexcept { return true; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    T await_resume() noexcept(std::is_nothrow_move_constructible_v<T>) { return std::move(m_value); }
};

}  // namespace spindle::net::detail
