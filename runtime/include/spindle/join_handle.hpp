#pragma once
/// join_handle<T>: what spawn returns. co_await it for the task's result (its
/// exception is rethrown); drop it to detach the task, which then runs on.

#include <spindle/park.hpp>
#include <spindle/result.hpp>
#include <spindle/task.hpp>

#include <optional>
#include <system_error>
#include <utility>

namespace spindle {

namespace detail {

struct pooled {
    static void* operator new(std::size_t size) { return frame_pool::allocate(size); }
    static void operator delete(void* p, std::size_t size) noexcept { frame_pool::deallocate(p, size); }
};

template <class T>
struct spawned final : task_header, pooled {
    std::optional<T> m_value;
};
template <class T>
struct spawned<T&> final : task_header, pooled {
    T* m_value = nullptr;
};
template <>
struct spawned<void> final : task_header, pooled {};

template <class T>
void finish_spawned(task_header& header) noexcept {
    auto frame = std::coroutine_handle<task_promise<T>>::from_address(header.m_frame.address());
    auto& promise = frame.promise();
    if (promise.m_error) {
        header.fail(promise.m_error);
    } else {
        try {
            if constexpr (std::is_reference_v<T>) {
                static_cast<spawned<T>&>(header).m_value = promise.m_value;
            } else if constexpr (!std::is_void_v<T>) {
                static_cast<spawned<T>&>(header).m_value.emplace(std::move(*promise.m_value));
            }
            header.m_status = task_status::succeeded;
        } catch (...) {
            header.fail(std::current_exception());
        }
    }
    header.m_frame = {};
    frame.destroy();
}

template <class T>
void delete_spawned(task_header& header) noexcept {
    delete static_cast<spawned<T>*>(&header);
}

template <class T>
inline constexpr task_ops spawned_ops{&finish_spawned<T>, &delete_spawned<T>};

/// A task parked in co_await on another task's join handle. Not cancellable:
/// the joined task runs on regardless.
template <class T>
class join_wait : public waiter {
public:
    explicit join_wait(spawned<T>* target) noexcept : m_target(target) {}
    ~join_wait() {
        if (m_holds_ref) release_task(*m_target);
    }

    bool ready() const {
        if (!m_target) throw std::logic_error("spindle: awaiting an empty join_handle");
        return m_target->m_status != task_status::running;
    }
    void on_park() {
        if (m_target->joiner()) throw std::logic_error("spindle: a task can be joined by one awaiter only");
        m_target->m_joiner = this;
        // While parked, the handle may be dropped by another task: hold the
        // header so the result is still there when this task resumes.
        ++m_target->m_refs;
        m_holds_ref = true;
    }
    void on_abandon() noexcept {
        if (m_target->joiner() == this) m_target->m_joiner = nullptr;
    }
    void describe(std::string& out) const {
        out += "join of task ";
        out += std::to_string(m_target->m_id);
        if (m_target->m_named) {
            out += " (";
            detail::append_task_name(*m_target, out);
            out += ")";
        }
    }
    T take() {
        if (!m_target) throw std::logic_error("spindle: awaiting an empty join_handle");
        switch (m_target->m_status) {
            case task_status::failed:
                m_target->m_observed = true;
                std::rethrow_exception(m_target->m_error);
            case task_status::aborted: throw std::system_error(cancelled_error(), "task aborted");
            default: break;
        }
        if constexpr (std::is_reference_v<T>) {
            return *m_target->m_value;
        } else if constexpr (!std::is_void_v<T>) {
            return std::move(*m_target->m_value);
        }
    }

protected:
    spawned<T>* m_target;
    bool m_holds_ref = false;
};

/// What join(token) gives: result<T>, result<void>, or a reference wrapped.
template <class T>
using join_result_t = result<std::conditional_t<std::is_void_v<T>, void,
                                                std::conditional_t<std::is_reference_v<T>,
                                                                   std::reference_wrapper<std::remove_reference_t<T>>, T>>>;

/// join(token)'s wait: a join that can be cancelled. Cancelled, it stops
/// waiting and leaves the task running; the task may be joined again.
template <class T>
class cancellable_join_wait : public join_wait<T> {
public:
    using join_wait<T>::join_wait;

    void on_cancel() noexcept {
        if (this->m_target->joiner() == this) this->m_target->m_joiner = nullptr;
        this->complete_cancelled();
    }
    join_result_t<T> take() {
        if (this->cancelled()) return cancelled_error();
        if constexpr (std::is_void_v<T>) {
            join_wait<T>::take();
            return {};
        } else if constexpr (std::is_reference_v<T>) {
            return std::ref(join_wait<T>::take());
        } else {
            return join_wait<T>::take();
        }
    }
};

}  // namespace detail

template <class T>
class [[nodiscard]] join_handle {
public:
    join_handle() noexcept = default;
    explicit join_handle(detail::spawned<T>* task) noexcept : m_task(task) {}
    join_handle(join_handle&& other) noexcept : m_task(std::exchange(other.m_task, nullptr)) {}
    join_handle& operator=(join_handle&& other) noexcept {
        if (this != &other) {
            detach();
            m_task = std::exchange(other.m_task, nullptr);
        }
        return *this;
    }
    join_handle(const join_handle&) = delete;
    join_handle& operator=(const join_handle&) = delete;
    ~join_handle() { detach(); }

    bool valid() const noexcept { return m_task != nullptr; }
    /// True once the task returned, threw or was aborted.
    bool done() const noexcept { return m_task && m_task->m_status != detail::task_status::running; }
    std::uint64_t id() const noexcept { return m_task ? m_task->m_id : 0; }

    /// Destroys the task's frame now if it still runs (its pending sleeps and I/O
    /// are withdrawn, its locals destroyed). Awaiting the handle afterwards throws
    /// std::system_error(operation_canceled). A task cannot abort itself.
    void abort() {
        if (m_task) detail::abort_task(*m_task);
    }

    /// Asks the task to stop: the wait it is parked on (I/O, sleep, signal,
    /// lock, channel...) and every later one complete with operation_canceled,
    /// so the task unwinds through its own code and finishes; await the handle
    /// to know when. Unlike abort(), the task's own cleanup runs. No-op once done.
    void cancel() noexcept {
        if (m_task) detail::cancel_task(*m_task);
    }

    /// Lets the task run on alone.
    void detach() noexcept {
        if (!m_task) return;
        if (m_task->m_status == detail::task_status::failed && !m_task->m_observed)
            detail::log_unobserved_failure(*m_task);
        detail::release_task(*std::exchange(m_task, nullptr));
    }

    using awaiter = parked<detail::join_wait<T>>;
    /// `co_await handle`: the task's value once it finishes (its exception
    /// rethrown). Not cancellable: the awaiting task waits for the task's end.
    awaiter operator co_await() const noexcept { return awaiter(std::stop_token{}, m_task); }

    /// `co_await handle.join(token)` → result<T> (result<void>; for a T&, a
    /// result<std::reference_wrapper<T>>): the task's value once it finishes,
    /// or operation_canceled if the join is cancelled first (the token, a
    /// cancel of the awaiting task; timed_out under with_timeout, as in
    /// `co_await with_timeout(1s, handle.join())`). Cancelling the join leaves
    /// the task running, and it may be joined again: cancel() is the way to
    /// stop it. The task's exception is rethrown, as by `co_await handle`.
    [[nodiscard]] parked<detail::cancellable_join_wait<T>> join(std::stop_token token = {}) const noexcept {
        return parked<detail::cancellable_join_wait<T>>(std::move(token), m_task);
    }

    /// For the loop (block_on) and when_all.
    const detail::task_header& header() const noexcept { return *m_task; }
    detail::task_header* header_ptr() noexcept { return m_task; }

private:
    detail::spawned<T>* m_task = nullptr;
};

}  // namespace spindle
