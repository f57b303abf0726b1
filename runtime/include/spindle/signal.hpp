#pragma once
/// Waiting for a POSIX signal inside a task.
///
/// The loop catches a signal from the first wait_signal(signo) (or
/// loop::catch_signal) until it is destroyed. Every task waiting for that
/// signal when it arrives wakes. A signal that arrives while nobody waits is
/// kept: the next wait for it returns at once, and any number of deliveries
/// kept that way count as one.

#include <spindle/detail/cancel_hook.hpp>
#include <spindle/loop.hpp>
#include <spindle/result.hpp>

#include <stop_token>

namespace spindle {

namespace detail {

struct signal_waiter : list_hook<> {
    task_header* m_task = nullptr;
    int m_signo = 0;
};

class signal_awaiter : signal_waiter {
public:
    signal_awaiter(int signo, std::stop_token token) noexcept : m_token(std::move(token)) { m_signo = signo; }
    signal_awaiter(const signal_awaiter&) = delete;
    signal_awaiter& operator=(const signal_awaiter&) = delete;
    ~signal_awaiter() { unlink(); }

    bool await_ready() {
        if (m_token.stop_requested()) {
            m_cancelled = true;
            return true;
        }
        loop& l = loop::current();
        l.catch_signal(m_signo);
        return l.take_pending_signal(m_signo);
    }
    void await_suspend(std::coroutine_handle<> h) {
        m_task = &current_task();
        m_task->m_resume = h;
        m_task->m_loop->add_signal_waiter(*this);
        m_cancel.arm(m_token, this);
        park_cancellable(*m_task, this);
    }
    /// The signal number, or operation_canceled.
    result<int> await_resume() noexcept {
        unpark(m_task);
        m_cancel.disarm();
        if (m_cancelled) return cancelled_error();
        return m_signo;
    }
    void describe(std::string& out) const {
        out += "signal ";
        out += std::to_string(m_signo);
    }
    void on_cancel() noexcept {
        if (!is_linked()) return;
        unlink();
        m_cancelled = true;
        schedule(*m_task);
    }

private:
    std::stop_token m_token;
    bool m_cancelled = false;
    cancel_hook<signal_awaiter> m_cancel;
};

}  // namespace detail

/// Resumes the task when `signo` arrives (see the file comment for the rules).
[[nodiscard]] inline detail::signal_awaiter wait_signal(int signo, std::stop_token token = {}) {
    return detail::signal_awaiter(signo, std::move(token));
}

}  // namespace spindle
