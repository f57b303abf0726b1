#pragma once
/// Waiting for POSIX signals inside a task: one, `wait_signal(SIGHUP)`, or
/// any of several, `wait_signal({SIGINT, SIGTERM})`, which gives the one
/// that arrived.
///
/// The loop catches a signal from the first wait for it (or
/// loop::catch_signal) until it is destroyed. Every task waiting for that
/// signal when it arrives wakes. A signal that arrives while nobody waits is
/// kept: the next wait for it returns at once, and any number of deliveries
/// kept that way count as one. A wait for several signals that finds more
/// than one kept takes the lowest-numbered; the others stay kept.
///
/// A wait that was handed a signal (woken by it, or taking one kept) but
/// whose task never saw it — the task aborted or its loop destroyed before
/// it ran, or a when_any that another branch won in the same tick — gives it
/// back: the signal is kept again, so it is not lost. (When other tasks woke
/// for the same delivery too, the next wait for it returns at once.)

#include <spindle/detail/engine.hpp>
#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/queued_wait.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>

#include <bit>
#include <cstdint>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <type_traits>

namespace spindle {

/// A set of signal numbers (1 to 64), to wait for any of them.
class signal_set {
public:
    constexpr signal_set() noexcept = default;
    /// `signal_set{SIGINT, SIGTERM}`, or a braced list where a set is
    /// expected: `wait_signal({SIGINT, SIGTERM})`. std::invalid_argument for
    /// a number out of range. (Not a std::initializer_list: g++ 12 cannot
    /// build one inside a coroutine.)
    template <class... I>
        requires(sizeof...(I) > 0 && (std::is_same_v<I, int> && ...))
    signal_set(I... signos) {
        (add(signos), ...);
    }

    signal_set& add(int signo) {
        if (signo <= 0 || signo > max_signal) throw std::invalid_argument("spindle: bad signal number");
        m_bits |= bit(signo);
        return *this;
    }
    bool contains(int signo) const noexcept { return signo > 0 && signo <= max_signal && (m_bits & bit(signo)) != 0; }
    bool empty() const noexcept { return m_bits == 0; }

    /// Calls f(signo) for each signal of the set, lowest first.
    template <class F>
    void for_each(F&& f) const {
        for (std::uint64_t b = m_bits; b; b &= b - 1) f(std::countr_zero(b) + 1);
    }

    friend bool operator==(const signal_set&, const signal_set&) = default;

    static constexpr int max_signal = 64;

private:
    static constexpr std::uint64_t bit(int signo) noexcept { return std::uint64_t{1} << (signo - 1); }

    std::uint64_t m_bits = 0;
};

namespace detail {

class signal_wait;
class signal_set_wait;
// The loop's signal service (runtime/signals.cpp).
void catch_signal(loop_core& core, int signo);
bool take_pending_signal(loop_core& core, int signo) noexcept;
/// A signal handed to a wait that nobody will see: kept again (or given to
/// whoever waits for it now).
void give_back_signal(loop_core& core, int signo) noexcept;
void add_signal_waiter(loop_core& core, signal_wait& w);
void add_signal_set_waiter(loop_core& core, signal_set_wait& w);

class signal_wait : public queued_wait {
public:
    explicit signal_wait(int signo) noexcept : m_signo(signo) {}

    /// A signal source the OS refuses (no descriptor left...) is the wait's
    /// error, not an exception; a bad signal number is a programming error.
    bool ready() {
        loop_core& core = current_core();
        m_core = &core;
        try {
            catch_signal(core, m_signo);
        } catch (const std::system_error& e) {
            m_error = e.code();
            return true;
        }
        return take_pending_signal(core, m_signo);
    }
    /// Completed with the signal (taken from the kept ones, or woken by a
    /// delivery) and destroyed before its task saw it: kept again.
    void on_discard() noexcept {
        if (m_core && !cancelled() && !m_error) give_back_signal(*m_core, m_signo);
    }
    void on_park() { add_signal_waiter(core(), *this); }
    void describe(std::string& out) const {
        out += "signal ";
        out += std::to_string(m_signo);
    }
    /// The signal number, or operation_canceled.
    result<int> take() noexcept {
        if (cancelled()) return cancelled_error();
        if (m_error) return m_error;
        return m_signo;
    }
    int signo() const noexcept { return m_signo; }

private:
    int m_signo;
    std::error_code m_error;
    loop_core* m_core = nullptr;
};

/// A wait for any signal of a set; the service hands it the one that came.
class signal_set_wait : public queued_wait {
public:
    explicit signal_set_wait(signal_set signals) noexcept : m_signals(signals) {}

    bool ready() {
        loop_core& core = current_core();
        m_core = &core;
        try {
            m_signals.for_each([&](int signo) { catch_signal(core, signo); });
        } catch (const std::system_error& e) {
            m_error = e.code();
            return true;
        }
        // Kept deliveries, lowest number first: one is taken, the others stay.
        m_signals.for_each([&](int signo) {
            if (m_signo == 0 && take_pending_signal(core, signo)) m_signo = signo;
        });
        return m_signo != 0;
    }
    void on_park() { add_signal_set_waiter(core(), *this); }
    /// As for one signal: a signal handed over and never seen is kept again.
    void on_discard() noexcept {
        if (m_core && m_signo != 0 && !cancelled()) give_back_signal(*m_core, m_signo);
    }
    void describe(std::string& out) const {
        out += "signals";
        char sep = ' ';
        m_signals.for_each([&](int signo) {
            out += sep;
            out += std::to_string(signo);
            sep = ',';
        });
    }
    /// The signal that arrived, or operation_canceled.
    result<int> take() noexcept {
        if (cancelled()) return cancelled_error();
        if (m_error) return m_error;
        return m_signo;
    }

    const signal_set& signals() const noexcept { return m_signals; }
    /// From the signal service: `signo`, one of the set, arrived.
    void deliver(int signo) noexcept {
        m_signo = signo;
        complete();
    }

private:
    signal_set m_signals;
    int m_signo = 0;
    std::error_code m_error;
    loop_core* m_core = nullptr;
};

using signal_awaiter = parked<signal_wait>;
using signal_set_awaiter = parked<signal_set_wait>;

}  // namespace detail

/// Resumes the task when `signo` arrives (see the file comment for the rules).
[[nodiscard]] inline detail::signal_awaiter wait_signal(int signo, std::stop_token token = {}) {
    return detail::signal_awaiter(std::move(token), signo);
}

/// Resumes the task when any signal of `signals` arrives: result<int> is the
/// one that did (the lowest-numbered when several were kept), or
/// operation_canceled. `wait_signal({SIGINT, SIGTERM}, token)`. An empty set
/// is a std::invalid_argument.
[[nodiscard]] inline detail::signal_set_awaiter wait_signal(signal_set signals, std::stop_token token = {}) {
    if (signals.empty()) throw std::invalid_argument("spindle: wait_signal of no signal");
    return detail::signal_set_awaiter(std::move(token), signals);
}

}  // namespace spindle
