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

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/park.hpp>
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

class mutex_wait;

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
    ~mutex();

    /// Locks if the mutex is free (never when tasks wait: it is not free then).
    [[nodiscard]] bool try_lock() noexcept {
        if (m_locked) return false;
        m_locked = true;
        return true;
    }

    /// Releases the mutex, or hands it to the first waiter. The mutex must be
    /// locked; any code (any task, or none) may unlock it.
    void unlock() noexcept;


    bool is_locked() const noexcept { return m_locked; }
    /// Tasks are queued for the mutex (they have not been handed it yet).
    bool has_waiters() const noexcept { return !m_waiters.empty(); }

    /// `co_await m.lock(token)` → result<guard>.
    [[nodiscard]] parked<detail::mutex_wait> lock(std::stop_token token = {}) noexcept;

private:
    friend class detail::mutex_wait;

    bool m_locked = false;
    detail::intrusive_list<detail::mutex_wait> m_waiters;
    // The waiter that was given ownership and has not resumed yet: it must give
    // it back if it is destroyed before it runs. At most one, since ownership is
    // exclusive.
    detail::mutex_wait* m_handed = nullptr;
};

namespace detail {

class mutex_wait : public waiter, public list_hook<> {
public:
    explicit mutex_wait(mutex& m) noexcept : m_mutex(&m) {}

    // A locked mutex may already belong to a waiter that has not run yet;
    // queueing behind it is what makes the hand-off fair.
    bool ready() noexcept {
        m_owner = m_mutex->try_lock();
        return m_owner;
    }
    void on_park() noexcept { m_mutex->m_waiters.push_back(*this); }
    /// Only a queued waiter can be cancelled; an owner keeps the mutex.
    void on_cancel() noexcept {
        unlink();
        complete_cancelled();
    }
    void on_abandon() noexcept { unlink(); }
    /// Handed ownership, destroyed before it resumed (its task was aborted,
    /// or the loop destroyed): pass ownership on.
    void on_discard() noexcept {
        if (!m_owner || !m_mutex) return;
        if (m_mutex->m_handed == this) m_mutex->m_handed = nullptr;
        m_mutex->unlock();
    }
    void describe(std::string& out) const { out += "mutex lock"; }
    result<mutex::guard> take() noexcept {
        if (!m_owner || !m_mutex) return cancelled_error();
        if (m_mutex->m_handed == this) m_mutex->m_handed = nullptr;
        m_owner = false;  // the guard owns the mutex now
        return mutex::guard(*m_mutex, std::adopt_lock);
    }

    void hand_over() noexcept {
        m_owner = true;
        complete();
    }
    void mutex_gone() noexcept {
        m_mutex = nullptr;
        m_owner = false;
        complete_cancelled();
    }

private:
    mutex* m_mutex;
    bool m_owner = false;
};

}  // namespace detail

inline mutex::~mutex() {
    while (detail::mutex_wait* w = m_waiters.pop_front()) w->mutex_gone();
    // Handed ownership, not resumed yet (already scheduled): the mutex it
    // would own is going away.
    if (m_handed) m_handed->mutex_gone();
}

inline void mutex::unlock() noexcept {
        if (detail::mutex_wait* w = m_waiters.pop_front()) {
            // Stays locked: the waiter owns it from now on, before it even runs.
            m_handed = w;
            w->hand_over();
        } else {
            m_locked = false;
        }
    }

inline parked<detail::mutex_wait> mutex::lock(std::stop_token token) noexcept {
    return parked<detail::mutex_wait>(std::move(token), *this);
}

}  // namespace spindle
