#pragma once
// The engine of spindle::race (race.hpp): the shared race, the awaiting
// task's wait on it, and the entry task that runs each contestant.

#include <spindle/join_handle.hpp>
#include <spindle/loop.hpp>
#include <spindle/park.hpp>
#include <spindle/when_all.hpp>

#include <cstddef>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
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
        void describe(std::string& out) const { out += "race of " + std::to_string(m_race.m_children.size()) + " tasks"; }
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

/// The end both race()s share: waits until a child decides the race, cancels
/// the others, waits for every child, then gives the winner's result (or
/// rethrows its exception). Destroyed early, its guard aborts the children.
template <class R>
task<R> settle_race(race<R>& r, std::vector<join_handle<void>>& children) {
    when_all_children guard(children.size());
    for (auto& child : children) {
        guard.add(child.header_ptr());
        r.add_child(child.header_ptr());
    }
    co_await race_base::wait(std::stop_token{}, r);
    r.cancel_others();
    for (auto& child : children) co_await child;
    r.rethrow_if_failed();
    co_return r.take();
}

}  // namespace detail

}  // namespace spindle
