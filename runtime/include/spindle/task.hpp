#pragma once
/// task<T>: a lazy, move-only coroutine. Awaiting it starts it and transfers
/// control to it symmetrically, so chains of synchronously completing awaits
/// run in constant stack. An exception leaving the task is rethrown to its awaiter.

#include <spindle/detail/frame_pool.hpp>
#include <spindle/detail/task_header.hpp>

#include <coroutine>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace spindle {

template <class T = void>
class task;

namespace detail {

/// The size of the frame allocated last on this thread: a promise is built
/// right after its frame's allocation, and keeps it for the task dump.
constinit inline thread_local std::uint32_t t_frame_size = 0;

struct promise_base {
    /// One word for what a frame needs at its end, tagged in its low bits
    /// (frames and headers are 8-aligned): until the task starts, its frame's
    /// size (for spawn to give the dump); then either who awaits it or, on a
    /// spawned task's outermost frame, its header. A frame is one or the
    /// other, never both, and every frame carries this word while it lives.
    std::uintptr_t m_link = (std::uintptr_t{t_frame_size} << 2) | size_tag;
    std::exception_ptr m_error;

    static constexpr std::uintptr_t awaiter_tag = 0, root_tag = 1, size_tag = 2, tag_mask = 3;

    void set_continuation(std::coroutine_handle<> awaiting) noexcept {
        m_link = reinterpret_cast<std::uintptr_t>(awaiting.address()) | awaiter_tag;
    }
    void set_root(task_header* root) noexcept { m_link = reinterpret_cast<std::uintptr_t>(root) | root_tag; }
    /// The frame's size, before the task started (0 after).
    std::uint32_t frame_size() const noexcept {
        return (m_link & tag_mask) == size_tag ? static_cast<std::uint32_t>(m_link >> 2) : 0;
    }

    struct final_awaiter {
        bool await_ready() const noexcept { return false; }
        template <class P>
        std::coroutine_handle<> await_suspend(std::coroutine_handle<P> self) noexcept {
            const std::uintptr_t link = self.promise().m_link;
            if ((link & tag_mask) == awaiter_tag && link != 0)
                return std::coroutine_handle<>::from_address(reinterpret_cast<void*>(link));
            // A spawned task ended: the loop takes the result and may destroy this
            // frame, so nothing here may touch the promise afterwards.
            if ((link & tag_mask) == root_tag) task_finished(*reinterpret_cast<task_header*>(link & ~tag_mask));
            return std::noop_coroutine();
        }
        void await_resume() const noexcept {}
    };

    // Frames come from a per-thread pool: spawning at a high rate would
    // otherwise be dominated by malloc and free.
    static void* operator new(std::size_t size) {
        t_frame_size = static_cast<std::uint32_t>(size);
        return frame_pool::allocate(size);
    }
    static void operator delete(void* p, std::size_t size) noexcept { frame_pool::deallocate(p, size); }

    std::suspend_always initial_suspend() const noexcept { return {}; }
    final_awaiter final_suspend() const noexcept { return {}; }
    void unhandled_exception() noexcept { m_error = std::current_exception(); }

    void rethrow_if_failed() const {
        if (m_error) std::rethrow_exception(m_error);
    }
};

template <class T>
struct task_promise : promise_base {
    std::optional<T> m_value;

    task<T> get_return_object() noexcept;
    template <class U = T>
        requires std::is_convertible_v<U&&, T>
    void return_value(U&& v) noexcept(std::is_nothrow_constructible_v<T, U&&>) {
        m_value.emplace(std::forward<U>(v));
    }
    T take() {
        rethrow_if_failed();
        return std::move(*m_value);
    }
};

template <class T>
struct task_promise<T&> : promise_base {
    T* m_value = nullptr;

    task<T&> get_return_object() noexcept;
    void return_value(T& v) noexcept { m_value = &v; }
    T& take() {
        rethrow_if_failed();
        return *m_value;
    }
};

template <>
struct task_promise<void> : promise_base {
    task<void> get_return_object() noexcept;
    void return_void() noexcept {}
    void take() { rethrow_if_failed(); }
};

}  // namespace detail

template <class T>
class [[nodiscard]] task {
public:
    using promise_type = detail::task_promise<T>;
    using handle_type = std::coroutine_handle<promise_type>;
    using value_type = T;

    task() noexcept = default;
    explicit task(handle_type h) noexcept : m_handle(h) {}
    task(task&& other) noexcept : m_handle(std::exchange(other.m_handle, {})) {}
    task& operator=(task&& other) noexcept {
        if (this != &other) {
            if (m_handle) m_handle.destroy();
            m_handle = std::exchange(other.m_handle, {});
        }
        return *this;
    }
    task(const task&) = delete;
    task& operator=(const task&) = delete;
    ~task() {
        if (m_handle) m_handle.destroy();
    }

    bool valid() const noexcept { return static_cast<bool>(m_handle); }

    struct awaiter {
        handle_type m_handle;
        bool await_ready() const noexcept { return !m_handle || m_handle.done(); }
        std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiting) noexcept {
            m_handle.promise().set_continuation(awaiting);
            return m_handle;  // symmetric transfer: start the task in constant stack
        }
        decltype(auto) await_resume() {
            if (!m_handle) throw std::logic_error("spindle: awaiting an empty task");
            return m_handle.promise().take();
        }
    };
    awaiter operator co_await() & noexcept { return awaiter{m_handle}; }
    awaiter operator co_await() && noexcept { return awaiter{m_handle}; }

    /// Gives up ownership of the frame (used by spawn).
    handle_type release() noexcept { return std::exchange(m_handle, {}); }

private:
    handle_type m_handle;
};

namespace detail {

template <class T>
struct is_task : std::false_type {};
template <class T>
struct is_task<task<T>> : std::true_type {};

template <class T>
task<T> task_promise<T>::get_return_object() noexcept {
    return task<T>{std::coroutine_handle<task_promise<T>>::from_promise(*this)};
}
template <class T>
task<T&> task_promise<T&>::get_return_object() noexcept {
    return task<T&>{std::coroutine_handle<task_promise<T&>>::from_promise(*this)};
}
inline task<void> task_promise<void>::get_return_object() noexcept {
    return task<void>{std::coroutine_handle<task_promise<void>>::from_promise(*this)};
}
}  // namespace detail

}  // namespace spindle
