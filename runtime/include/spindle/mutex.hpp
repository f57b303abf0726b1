#pragma once
/// mutex: mutual exclusion between the tasks of one loop, across suspension
/// points (a std::mutex held over a co_await would block the whole loop).
///
/// Fair by hand-off: unlock() with tasks waiting does not release the mutex;
/// it makes the first waiter the owner and schedules it. A task that unlocks
/// and at once locks again therefore queues behind the waiters (no barging),
/// and waiters get the mutex in the order they asked for it.
///
/// `co_await m.lock(token)` gives a result<mutex::guard>: the guard unlocks
/// when destroyed. A cancelled wait (stop request, with_timeout) gives
/// operation_canceled (timed_out), unless ownership was already handed to the
/// waiter: then the cancel is ignored and the lock succeeds.
///
/// Lifetimes: a waiter whose frame is destroyed while queued leaves the queue;
/// one destroyed after ownership was handed to it, before it resumed, passes
/// ownership on (to the next waiter, or unlocks). Destroying the mutex
/// completes every wait that has not resumed with operation_canceled. A guard
/// must not outlive its mutex.

#include <spindle/detail/cancel_hook.hpp>
#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/result.hpp>

#include <coroutine>
#include <cstdint>
#include <mutex>
#include <stop_token>
#include <string>
#include <utility>

namespace spindle {

class mutex;

namespace detail {

struct mutex_waiter : list_hook<> {
    enum class state : std::uint8_t { idle, waiting, owner, cancelled, done };
    task_header* m_task = nullptr;
    mutex* m_mutex = nullptr;
    state m_state = state::idle;
};

class mutex_lock_awaiter;

}  // namespace detail

class mutex {
public:
    /// Owns a locked mutex and unlocks it when destroyed. Movable.
    class guard {
    public:
        guard() noexcept = default;
        /// Takes over a mutex this task already locked (try_lock).
        guard(mutex& m, std::adopt_lock_t) noexcept : m_mutex(&m) {}
        guard(guard&& other) noexcept : m_mutex(std::exchange(other.m_mutex, nullptr)) {}
        guard& operator=(guard&& other) noexcept {
            if (this != &other) {
                unlock();
                m_mutex = std::exchange(other.m_mutex, nullptr);
            }
            return *this;
        }
        guard(const guard&) = delete;
        guard& operator=(const guard&) = delete;
        ~guard() { unlock(); }

        bool owns_lock() const noexcept { return m_mutex != nullptr; }
        explicit operator bool() const noexcept { return owns_lock(); }
        mutex* get() const noexcept { return m_mutex; }
        /// Unlocks now (once); the guard is empty afterwards.
        void unlock() noexcept {
            if (m_mutex) std::exchange(m_mutex, nullptr)->unlock();
        }
        /// Gives up ownership without unlocking.
        mutex* release() noexcept { return std::exchange(m_mutex, nullptr); }

    private:
        mutex* m_mutex = nullptr;
    };

    mutex() noexcept = default;
    mutex(const mutex&) = delete;
    mutex& operator=(const mutex&) = delete;
    ~mutex() {
        while (detail::mutex_waiter* w = m_waiters.pop_front()) {
            w->m_mutex = nullptr;
            w->m_state = detail::mutex_waiter::state::cancelled;
            detail::schedule(*w->m_task);
        }
        // Handed ownership, not resumed yet (already scheduled): the mutex it
        // would own is going away.
        if (m_handed) {
            m_handed->m_mutex = nullptr;
            m_handed->m_state = detail::mutex_waiter::state::cancelled;
        }
    }

    /// Locks if the mutex is free (never when tasks wait: it is not free then).
    [[nodiscard]] bool try_lock() noexcept {
        if (m_locked) return false;
        m_locked = true;
        return true;
    }

    /// Releases the mutex, or hands it to the first waiter. The mutex must be
    /// locked; any code (any task, or none) may unlock it.
    void unlock() noexcept {
        if (detail::mutex_waiter* w = m_waiters.pop_front()) {
            // Stays locked: the waiter owns it from now on, before it even runs.
            w->m_state = detail::mutex_waiter::state::owner;
            m_handed = w;
            detail::schedule(*w->m_task);
        } else {
            m_locked = false;
        }
    }

    bool is_locked() const noexcept { return m_locked; }
    /// Tasks are queued for the mutex (they have not been handed it yet).
    bool has_waiters() const noexcept { return !m_waiters.empty(); }

    /// `co_await m.lock(token)` → result<guard>.
    [[nodiscard]] detail::mutex_lock_awaiter lock(std::stop_token token = {}) noexcept;

private:
    friend class detail::mutex_lock_awaiter;

    bool m_locked = false;
    detail::intrusive_list<detail::mutex_waiter> m_waiters;
    // The waiter that was given ownership and has not resumed yet: it must give
    // it back if it is destroyed before it runs. At most one, since ownership is
    // exclusive.
    detail::mutex_waiter* m_handed = nullptr;
};

namespace detail {

class mutex_lock_awaiter : mutex_waiter {
public:
    mutex_lock_awaiter(mutex& m, std::stop_token token) noexcept : m_token(std::move(token)) { m_mutex = &m; }
    mutex_lock_awaiter(const mutex_lock_awaiter&) = delete;
    mutex_lock_awaiter& operator=(const mutex_lock_awaiter&) = delete;
    ~mutex_lock_awaiter() {
        if (m_state == state::waiting) {
            unlink();
        } else if (m_state == state::owner && m_mutex) {
            // Destroyed between the hand-off and its resumption (its task was
            // aborted, or the loop destroyed): pass ownership on.
            if (m_mutex->m_handed == this) m_mutex->m_handed = nullptr;
            m_mutex->unlock();
        }
    }

    bool await_ready() noexcept {
        if (m_token.stop_requested()) {
            m_state = state::cancelled;
            return true;
        }
        // A locked mutex may already belong to a waiter that has not run yet;
        // queueing behind it is what makes the hand-off fair.
        if (!m_mutex->try_lock()) return false;
        m_state = state::owner;
        return true;
    }
    void await_suspend(std::coroutine_handle<> h) {
        m_task = &current_task();
        m_task->m_resume = h;
        m_state = state::waiting;
        m_mutex->m_waiters.push_back(*this);
        m_cancel.arm(m_token, this);
        park_cancellable(*m_task, this);
    }
    result<mutex::guard> await_resume() noexcept {
        unpark(m_task);
        m_cancel.disarm();
        if (m_state != state::owner) return cancelled_error();
        if (m_mutex->m_handed == this) m_mutex->m_handed = nullptr;
        m_state = state::done;  // the guard owns the mutex now
        return mutex::guard(*m_mutex, std::adopt_lock);
    }

    /// For the dump of parked tasks.
    void describe(std::string& out) const { out += "mutex lock"; }

    /// Only a queued waiter can be cancelled; an owner keeps the mutex.
    void on_cancel() noexcept {
        if (m_state != state::waiting) return;
        unlink();
        m_state = state::cancelled;
        schedule(*m_task);
    }

private:
    std::stop_token m_token;
    cancel_hook<mutex_lock_awaiter> m_cancel;
};

}  // namespace detail

inline detail::mutex_lock_awaiter mutex::lock(std::stop_token token) noexcept {
    return detail::mutex_lock_awaiter(*this, std::move(token));
}

}  // namespace spindle
