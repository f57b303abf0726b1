#pragma once
/// remote_answer<T>: the answer to a wait that another thread gives (a
/// worker pool, a library's callback thread), carried to the wait's loop.
///
///     class lookup_wait : public spindle::waiter {
///     public:
///         void on_park() {
///             m_answer->attach(*this);             // before the work can answer
///             pool.submit([a = m_answer] { a->give(lookup()); });  // any thread
///         }
///         void on_cancel() noexcept { m_answer->detach(); complete_cancelled(); }
///         void on_abandon() noexcept { m_answer->detach(); }
///         spindle::result<std::string> take() {
///             if (cancelled()) return spindle::cancelled_error();
///             return m_answer->take();
///         }
///     private:
///         std::shared_ptr<spindle::remote_answer<std::string>> m_answer =
///             std::make_shared<spindle::remote_answer<std::string>>();
///     };
///
/// The state is shared (a std::shared_ptr) by the wait and whoever answers,
/// since either may go first. give() stores the value and posts the
/// completion to the wait's loop (loop::post), while holding the lock the
/// wait detaches under: a wait still attached means its frame, and so its
/// loop, is alive (a loop destroys its parked frames, which detach, before it
/// goes). On the loop, the posted call looks again, since the wait may have
/// been cancelled or destroyed between the post and then. So an answer that
/// comes after the wait gave up, or after its loop is gone, is dropped: it
/// never touches a dead frame or loop. A post the loop never runs (the loop
/// destroyed first) frees its reference to the state.
///
/// One answer per attach: give() after the first answer is dropped. The
/// value is written before the post and read on the loop after it: take()
/// needs no lock. Each answer costs one post (one allocation).

#include <spindle/loop.hpp>
#include <spindle/park.hpp>

#include <memory>
#include <mutex>
#include <optional>
#include <utility>

namespace spindle {

template <class T>
class remote_answer : public std::enable_shared_from_this<remote_answer<T>> {
public:
    remote_answer() = default;
    remote_answer(const remote_answer&) = delete;
    remote_answer& operator=(const remote_answer&) = delete;

    /// Loop thread, from the wait's on_park(): `w` now waits for the answer.
    /// Make the state with std::make_shared: give() keeps it alive.
    void attach(waiter& w) noexcept {
        std::lock_guard lock(m_mutex);
        m_loop = &w.owner();
        m_waiter = &w;
        m_value.reset();
    }

    /// Loop thread, from on_cancel() and on_abandon(): the wait gives up; an
    /// answer that comes later finds nobody.
    void detach() noexcept {
        std::lock_guard lock(m_mutex);
        m_waiter = nullptr;
    }

    /// Any thread: whether a wait is attached (a snapshot), so a worker can
    /// skip work nobody waits for any more.
    bool awaited() const {
        std::lock_guard lock(m_mutex);
        return m_waiter != nullptr;
    }

    /// Any thread, once per attach: stores `value` and completes the wait on
    /// its loop. False when nobody waits any more (the value is dropped).
    /// Throws std::bad_alloc when the post cannot be made (the wait then
    /// goes on waiting, until cancelled).
    bool give(T value) {
        std::lock_guard lock(m_mutex);
        if (!m_waiter || m_value) return false;
        m_value.emplace(std::move(value));
        try {
            m_loop->post([self = this->shared_from_this()] { self->deliver(); });
        } catch (...) {
            m_value.reset();
            throw;
        }
        return true;
    }

    /// Loop thread, from the wait's take() after it completed (not
    /// cancelled): the value given.
    T take() { return std::move(*m_value); }

private:
    // On the loop's thread: the wait may have gone since the post.
    void deliver() noexcept {
        waiter* w;
        {
            std::lock_guard lock(m_mutex);
            w = std::exchange(m_waiter, nullptr);
        }
        if (w) w->complete();
    }

    mutable std::mutex m_mutex;
    loop* m_loop = nullptr;      // guarded by m_mutex
    waiter* m_waiter = nullptr;  // guarded by m_mutex
    std::optional<T> m_value;    // written before the post, read after it
};

}  // namespace spindle
