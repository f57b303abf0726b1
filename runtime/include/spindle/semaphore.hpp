#pragma once
/// semaphore: a count of permits shared by the tasks of one loop.
///
/// Strictly FIFO: an acquire waits while anyone waits before it, even if
/// enough permits are free for it, so a large request at the head of the
/// queue is never starved by a stream of small ones. release() hands permits
/// to the waiters in order, as long as the first one's request fits; the
/// permits are theirs from that moment, before they run.
///
/// `co_await s.acquire(n, token)` gives result<void>: the permits, or
/// operation_canceled (timed_out under with_timeout) if the wait was cancelled
/// before permits were handed to it; a waiter that already got its permits
/// ignores the cancel. The caller gives them back with release(n).
/// `co_await s.acquire_permit(n, token)` gives result<semaphore::permit>
/// instead, which gives them back when it is destroyed:
///
///     result<semaphore::permit> p = co_await downloads.acquire_permit();
///     if (!p) co_return p.error();
///     co_return co_await fetch(url);  // the permit goes back when the frame ends
///
/// Lifetimes: a waiter whose frame is destroyed while queued leaves the queue
/// (and the waiters behind it are served if they now fit); one destroyed after
/// its permits were handed over, before it resumed, releases them again.
/// Destroying the semaphore completes every wait that has not resumed with
/// operation_canceled.

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>

#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <stop_token>
#include <string>
#include <system_error>

namespace spindle {

class semaphore;

namespace detail {

class semaphore_wait;
class semaphore_permit_wait;

}  // namespace detail

class semaphore {
public:
    explicit semaphore(std::size_t initial = 0) noexcept : m_available(initial) {}
    semaphore(const semaphore&) = delete;
    semaphore& operator=(const semaphore&) = delete;
    ~semaphore();

    /// Takes `n` permits if they are free and nobody waits.
    [[nodiscard]] bool try_acquire(std::size_t n = 1) noexcept {
        if (!m_waiters.empty() || m_available < n) return false;
        m_available -= n;
        return true;
    }

    /// Adds `n` permits and hands them to the waiters in order.
    void release(std::size_t n = 1) noexcept {
        m_available += n;
        grant();
    }

    /// Free permits (not yet handed to any waiter).
    std::size_t available() const noexcept { return m_available; }
    /// Tasks are queued for permits (a new acquire queues behind them).
    bool has_waiters() const noexcept { return !m_waiters.empty(); }

    /// `co_await s.acquire(n, token)` → result<void>; give the permits back
    /// with release(n). acquire(0) completes at once.
    [[nodiscard]] parked<detail::semaphore_wait> acquire(std::size_t n = 1, std::stop_token token = {}) noexcept;

    /// `n` permits that go back to their semaphore when the permit is
    /// destroyed (or release() is called). The semaphore must outlive it.
    class permit {
    public:
        permit() noexcept = default;
        permit(permit&& other) noexcept
            : m_semaphore(std::exchange(other.m_semaphore, nullptr)), m_count(std::exchange(other.m_count, 0)) {}
        permit& operator=(permit&& other) noexcept {
            if (this != &other) {
                release();
                m_semaphore = std::exchange(other.m_semaphore, nullptr);
                m_count = std::exchange(other.m_count, 0);
            }
            return *this;
        }
        permit(const permit&) = delete;
        permit& operator=(const permit&) = delete;
        ~permit() { release(); }

        /// Gives the permits back now; nothing when empty.
        void release() noexcept {
            if (semaphore* s = std::exchange(m_semaphore, nullptr)) s->release(std::exchange(m_count, 0));
        }
        /// The permits held: 0 once released or moved from.
        std::size_t count() const noexcept { return m_semaphore ? m_count : 0; }
        explicit operator bool() const noexcept { return m_semaphore != nullptr; }

    private:
        friend class detail::semaphore_permit_wait;
        permit(semaphore& s, std::size_t n) noexcept : m_semaphore(&s), m_count(n) {}
        semaphore* m_semaphore = nullptr;
        std::size_t m_count = 0;
    };

    /// `co_await s.acquire_permit(n, token)` → result<permit>: acquire(n),
    /// with the release tied to the permit's lifetime.
    [[nodiscard]] parked<detail::semaphore_permit_wait> acquire_permit(std::size_t n = 1,
                                                                       std::stop_token token = {}) noexcept;

private:
    friend class detail::semaphore_wait;

    // Serves the head of the queue while its request fits; stops at the first
    // that does not, so nobody overtakes it.
    void grant() noexcept;


    std::size_t m_available;
    detail::intrusive_list<detail::semaphore_wait> m_waiters;
    // Granted, not resumed yet: they give their permits back if destroyed first.
    detail::intrusive_list<detail::semaphore_wait> m_granted;
};

namespace detail {

class semaphore_wait : public waiter, public list_hook<> {
public:
    semaphore_wait(semaphore& s, std::size_t n) noexcept : m_semaphore(&s), m_count(n) {}

    /// Permits taken here are listed as granted, like those granted to a
    /// parked waiter: the task may go to the back of the ready queue (its
    /// budget spent) and die there (on_discard gives them back), or the
    /// semaphore may be destroyed meanwhile (it forgets this waiter).
    bool ready() noexcept {
        m_granted = m_semaphore->try_acquire(m_count);
        if (m_granted) m_semaphore->m_granted.push_back(*this);
        return m_granted;
    }
    void on_park() noexcept { m_semaphore->m_waiters.push_back(*this); }
    /// Only a queued waiter can be cancelled; one that got its permits keeps them.
    void on_cancel() noexcept {
        unlink();
        complete_cancelled();
        // It may have been the head that held the others back.
        if (m_semaphore) m_semaphore->grant();
    }
    void on_abandon() noexcept {
        unlink();
        if (m_semaphore) m_semaphore->grant();
    }
    /// Granted, destroyed before it resumed: the permits go back.
    void on_discard() noexcept {
        if (!m_granted || !m_semaphore) return;
        unlink();
        m_semaphore->release(m_count);
    }
    void describe(std::string& out) const {
        out += "semaphore acquire of ";
        out += std::to_string(m_count);
        if (m_semaphore) {
            out += " (";
            out += std::to_string(m_semaphore->available());
            out += " free)";
        }
    }
    result<void> take() noexcept {
        if (cancelled() || !m_semaphore) return cancelled_error();
        unlink();  // from the granted list
        m_granted = false;
        return {};
    }

    void grant() noexcept {
        m_granted = true;
        complete();
    }
    std::size_t count() const noexcept { return m_count; }
    semaphore* owner() const noexcept { return m_semaphore; }
    void semaphore_gone() noexcept {
        m_semaphore = nullptr;
        m_granted = false;
        complete_cancelled();
    }

private:
    semaphore* m_semaphore;
    std::size_t m_count;
    bool m_granted = false;
};

/// acquire_permit's wait: the same queue, the permits handed over in a permit.
class semaphore_permit_wait : public semaphore_wait {
public:
    using semaphore_wait::semaphore_wait;
    result<semaphore::permit> take() noexcept {
        if (result<void> got = semaphore_wait::take(); !got) return got.error();
        return semaphore::permit(*owner(), count());
    }
};

}  // namespace detail

inline semaphore::~semaphore() {
    while (detail::semaphore_wait* w = m_waiters.pop_front()) w->semaphore_gone();
    // Granted, already scheduled: the permits go with the semaphore.
    while (detail::semaphore_wait* w = m_granted.pop_front()) w->semaphore_gone();
}

inline void semaphore::grant() noexcept {
        while (detail::semaphore_wait* w = m_waiters.front()) {
            if (w->count() > m_available) break;
            m_waiters.pop_front();
            m_available -= w->count();
            m_granted.push_back(*w);
            w->grant();
        }
    }

inline parked<detail::semaphore_wait> semaphore::acquire(std::size_t n, std::stop_token token) noexcept {
    return parked<detail::semaphore_wait>(std::move(token), *this, n);
}

inline parked<detail::semaphore_permit_wait> semaphore::acquire_permit(std::size_t n, std::stop_token token) noexcept {
    return parked<detail::semaphore_permit_wait>(std::move(token), *this, n);
}

}  // namespace spindle
