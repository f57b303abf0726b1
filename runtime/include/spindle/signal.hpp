#pragma once
/// Waiting for a POSIX signal inside a task.
///
/// The loop catches a signal from the first wait_signal(signo) (or
/// loop::catch_signal) until it is destroyed. Every task waiting for that
/// signal when it arrives wakes. A signal that arrives while nobody waits is
/// kept: the next wait for it returns at once, and any number of deliveries
/// kept that way count as one.

#include <spindle/detail/engine.hpp>
#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/queued_wait.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>

#include <stop_token>
#include <string>
#include <system_error>

namespace spindle {

namespace detail {

class signal_wait;
// The loop's signal service (runtime/signals.cpp).
void catch_signal(loop_core& core, int signo);
bool take_pending_signal(loop_core& core, int signo) noexcept;
/// A pending signal taken by a wait that nobody will see: pending again.
void give_back_signal(loop_core& core, int signo) noexcept;
void add_signal_waiter(loop_core& core, signal_wait& w);

class signal_wait : public queued_wait {
public:
    explicit signal_wait(int signo) noexcept : m_signo(signo) {}

    /// A signal source the OS refuses (no descriptor left...) is the wait's
    /// error, not an exception; a bad signal number is a programming error.
    bool ready() {
        loop_core& core = current_core();
        try {
            catch_signal(core, m_signo);
        } catch (const std::system_error& e) {
            m_error = e.code();
            return true;
        }
        if (!take_pending_signal(core, m_signo)) return false;
        m_took_pending = &core;
        return true;
    }
    /// Took a pending signal and was destroyed before its task saw it (sent
    /// to the back of the ready queue, its budget spent): pending again.
    void on_discard() noexcept {
        if (m_took_pending) give_back_signal(*m_took_pending, m_signo);
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
    loop_core* m_took_pending = nullptr;
};

using signal_awaiter = parked<signal_wait>;

}  // namespace detail

/// Resumes the task when `signo` arrives (see the file comment for the rules).
[[nodiscard]] inline detail::signal_awaiter wait_signal(int signo, std::stop_token token = {}) {
    return detail::signal_awaiter(std::move(token), signo);
}

}  // namespace spindle
