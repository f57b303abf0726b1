#pragma once
/// async_generator<T>: a coroutine that may co_await anything (sleeps, I/O,
/// channels, tasks) and co_yields values one at a time to whoever reads it.
///
///     async_generator<int> ticks(int n) {
///         for (int i = 0; i < n; ++i) {
///             if (!co_await sleep_for(10ms)) co_return;  // cancelled
///             co_yield i;
///         }
///     }
///
///     auto gen = ticks(3);
///     while (auto v = co_await gen.next()) use(*v);
///
/// Lazy, move-only, `[[nodiscard]]`: nothing runs until the first next().
/// Each `co_await next()` resumes the producer where it stopped, by symmetric
/// transfer, and it runs until its next co_yield or its end. The producer
/// runs inside the task that awaits next(): its waits park that task, so a
/// stop token, a with_timeout or join_handle::cancel around next() reaches
/// the wait the producer is parked on, at any depth.
///
/// What next() gives (next_result<T>): true with the value (`*r`, `r->`),
/// or false at the end. The value is the object the producer yielded, in the
/// producer's frame: valid until the next call of next() or the generator's
/// destruction. A yielded rvalue works too (it lives until the producer
/// resumes); a value that needs converting to T is built in the producer's
/// frame, without allocation. T may be a reference or a move-only type (move
/// out of `*r`).
///
/// - Exceptions: one thrown by the producer is rethrown from that
///   `co_await next()`; the generator has then ended.
/// - The end: after the end (or the exception), next() gives the end again.
/// - Cancellation by next(token): a token stopped before the call gives no
///   value with cancelled() true, without resuming the producer (a later
///   next() resumes it where it was). A stop requested while the producer
///   runs cancels the wait it is parked on and every later one until it
///   yields or ends, as a with_timeout's scope does: those waits complete
///   with operation_canceled, and what the producer does then is what next()
///   gives (a value it yields, an exception, or the end, with cancelled()
///   true). with_timeout(d, gen.next()) gives result<next_result<T>>,
///   timed_out when the deadline cut the producer short (a value yielded
///   after that is dropped, as with_timeout does for any operation).
/// - The budget (spindle/budget.hpp): each value spends one unit of the
///   consumer task's budget; with none left, the task goes to the back of the
///   ready queue before it sees the value. So a producer that never waits
///   cannot hold the loop.
/// - Destruction: destroying the generator (after any value, or at the end)
///   destroys the producer's frame and its locals. It must not be destroyed
///   while a next() is pending; when the consumer's frame goes (its task
///   aborted, its loop destroyed) while the producer is parked, the pending
///   next() goes first, then the generator, whose producer's wait is
///   withdrawn with its frame.
/// - One next() at a time: awaiting next() while another is pending (from
///   another task) throws std::logic_error.
///
/// Frames come from the frame pool, as a task's do; a value costs no allocation.

#include <spindle/detail/engine.hpp>
#include <spindle/detail/frame_pool.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/park.hpp>

#include <coroutine>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <type_traits>
#include <utility>

namespace spindle {

template <class T>
class async_generator;

/// What `co_await gen.next()` gives: the next value, or nothing at the end.
/// Like a pointer to the yielded object, valid until the next next().
template <class T>
class next_result {
public:
    using reference = std::conditional_t<std::is_reference_v<T>, T, T&>;
    using pointer = std::add_pointer_t<reference>;

    /// The end of the stream.
    next_result() noexcept = default;
    explicit next_result(pointer value) noexcept : m_value(value) {}
    /// No value, because next(token)'s token was stopped.
    static next_result cancelled_end() noexcept {
        next_result r;
        r.m_cancelled = true;
        return r;
    }

    /// A value came.
    bool has_value() const noexcept { return m_value != nullptr; }
    explicit operator bool() const noexcept { return has_value(); }
    /// The value; only when has_value().
    reference operator*() const noexcept { return static_cast<reference>(*m_value); }
    pointer operator->() const noexcept { return m_value; }
    /// No value because next(token)'s token was stopped: before the call
    /// (the producer was not resumed), or while the producer ran, which then
    /// ended. False at a plain end.
    bool cancelled() const noexcept { return m_cancelled; }

private:
    pointer m_value = nullptr;
    bool m_cancelled = false;
};

namespace detail {

template <class T>
class generator_promise {
public:
    using reference = typename next_result<T>::reference;
    using pointer = typename next_result<T>::pointer;
    using handle_type = std::coroutine_handle<generator_promise>;

    // Frames come from the per-thread pool, as a task's do.
    static void* operator new(std::size_t size) { return frame_pool::allocate(size); }
    static void operator delete(void* p, std::size_t size) noexcept { frame_pool::deallocate(p, size); }

    async_generator<T> get_return_object() noexcept;
    std::suspend_always initial_suspend() const noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { m_error = std::current_exception(); }

    /// Hands control back to the consumer. A value spends one unit of the
    /// consumer task's budget; with none left, the task goes to the back of
    /// the ready queue, and the consumer resumes from there.
    class yield_awaiter {
    public:
        explicit yield_awaiter(generator_promise& p) noexcept : m_promise(&p) {}
        bool await_ready() const noexcept { return false; }
        std::coroutine_handle<> await_suspend(std::coroutine_handle<>) noexcept {
            if (spend_budget()) [[likely]]
                return m_promise->m_consumer;
            return m_promise->requeue_consumer();
        }
        void await_resume() const noexcept {}

    protected:
        generator_promise* m_promise;
    };

    /// A yielded value that had to be converted to T: built here, in the
    /// producer's frame, where it lives until the producer resumes.
    class converting_yield : public yield_awaiter {
    public:
        template <class U>
        converting_yield(generator_promise& p, U&& v) : yield_awaiter(p), m_value(std::forward<U>(v)) {}
        std::coroutine_handle<> await_suspend(std::coroutine_handle<> h) noexcept {
            // Only now is this object where it stays while suspended.
            this->m_promise->m_value = std::addressof(m_value);
            return yield_awaiter::await_suspend(h);
        }

    private:
        std::remove_cvref_t<T> m_value;
    };

    using stored = std::remove_reference_t<reference>;

    // An lvalue: referred to where it is (T, T& or const T&).
    yield_awaiter yield_value(stored& v) noexcept
        requires std::is_lvalue_reference_v<reference>
    {
        m_value = std::addressof(v);
        return yield_awaiter(*this);
    }
    // An rvalue (for T or T&&, and const T& binds it above): a temporary of
    // the co_yield expression, which lasts until the producer resumes.
    yield_awaiter yield_value(stored&& v) noexcept
        requires(!std::is_lvalue_reference_v<T>)
    {
        m_value = std::addressof(v);
        return yield_awaiter(*this);
    }
    template <class U>
        requires(!std::is_reference_v<T> && !std::is_same_v<std::remove_cvref_t<U>, T> &&
                 std::is_constructible_v<T, U &&>)
    converting_yield yield_value(U&& v) noexcept(std::is_nothrow_constructible_v<T, U&&>) {
        return converting_yield(*this, std::forward<U>(v));
    }
    // A const lvalue of T for a generator of T: copied (T copyable).
    converting_yield yield_value(const stored& v) noexcept(std::is_nothrow_copy_constructible_v<stored>)
        requires(!std::is_reference_v<T> && !std::is_const_v<T> && std::is_copy_constructible_v<stored>)
    {
        return converting_yield(*this, v);
    }

    struct final_awaiter {
        bool await_ready() const noexcept { return false; }
        std::coroutine_handle<> await_suspend(handle_type self) noexcept { return self.promise().m_consumer; }
        void await_resume() const noexcept {}
    };
    final_awaiter final_suspend() const noexcept { return {}; }

    /// Starts a next(): the consumer to resume at the next yield or the end.
    void attach(std::coroutine_handle<> consumer) {
        if (m_consumer) throw std::logic_error("spindle: async_generator::next() awaited while another next() is pending");
        m_consumer = consumer;
    }

    /// Ends a next(): the value, the end, or the producer's exception.
    next_result<T> take(handle_type self) {
        m_consumer = {};
        if (m_requeued) [[unlikely]] {
            m_requeued = false;
            spend_requeued_turn();
        }
        if (self.done()) {
            if (m_error) std::rethrow_exception(std::exchange(m_error, nullptr));
            return {};
        }
        return next_result<T>(m_value);
    }

private:
    std::coroutine_handle<> requeue_consumer() noexcept {
        task_header* t = current_task_or_null();
        if (!t) return m_consumer;  // outside a task there is no budget
        // As a parked wait that completed at once: the loop resumes the
        // consumer directly, in its turn.
        m_requeued = true;
        requeue_for_budget(*t, m_consumer);
        return std::noop_coroutine();
    }

    /// Who awaits next() now; empty between calls.
    std::coroutine_handle<> m_consumer;
    /// The object of the last co_yield.
    pointer m_value = nullptr;
    std::exception_ptr m_error;
    bool m_requeued = false;
};

/// What next() returns.
template <class T>
class generator_next {
public:
    using handle_type = typename generator_promise<T>::handle_type;
    explicit generator_next(handle_type h) noexcept : m_handle(h) {}

    bool await_ready() const noexcept { return !m_handle || m_handle.done(); }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<> consumer) {
        m_handle.promise().attach(consumer);
        return m_handle;  // symmetric transfer into the producer
    }
    next_result<T> await_resume() {
        if (!m_handle) return {};
        return m_handle.promise().take(m_handle);
    }

private:
    handle_type m_handle;
};

/// What next(token) returns: while the producer runs, a cancel scope of the
/// task, which the token's stop cancels. Await it in the expression that
/// creates it.
template <class T>
class generator_next_stop {
public:
    using handle_type = typename generator_promise<T>::handle_type;
    generator_next_stop(handle_type h, std::stop_token token) noexcept : m_handle(h), m_token(std::move(token)) {}
    generator_next_stop(const generator_next_stop&) = delete;
    generator_next_stop& operator=(const generator_next_stop&) = delete;
    ~generator_next_stop() { close_scope(); }

    bool await_ready() noexcept {
        if (!m_handle || m_handle.done()) return true;
        // Stopped already: the producer is not resumed.
        m_stopped_early = m_token.stop_requested();
        return m_stopped_early;
    }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<> consumer) {
        m_handle.promise().attach(consumer);
        if (m_token.stop_possible()) {
            if (task_header* t = current_task_or_null()) {
                m_task = t;
                open_cancel_scope(*t, m_scope);
                m_stop.emplace(m_token, on_stop{this});
            }
        }
        return m_handle;
    }
    next_result<T> await_resume() {
        if (m_stopped_early) return next_result<T>::cancelled_end();
        if (!m_handle) return {};
        const bool stopped = m_scope.m_cancelled;
        close_scope();
        next_result<T> r = m_handle.promise().take(m_handle);
        if (!r && stopped) return next_result<T>::cancelled_end();
        return r;
    }

private:
    struct on_stop {
        generator_next_stop* self;
        void operator()() const noexcept { self->stop(); }
    };

    void stop() noexcept {
        // A parked task is woken from the wait it is parked on, wherever that
        // is inside the producer (the same reach as a with_timeout deadline).
        cancel_within(*m_task, m_scope);
    }

    void close_scope() noexcept {
        if (!m_task) return;
        m_stop.reset();
        close_cancel_scope(*m_task, m_scope);
        m_task = nullptr;
    }

    handle_type m_handle;
    std::stop_token m_token;
    task_header* m_task = nullptr;
    cancel_scope m_scope;
    std::optional<std::stop_callback<on_stop>> m_stop;
    bool m_stopped_early = false;
};

}  // namespace detail

template <class T>
class [[nodiscard]] async_generator {
public:
    using promise_type = detail::generator_promise<T>;
    using handle_type = std::coroutine_handle<promise_type>;
    using value_type = std::remove_cvref_t<T>;
    using reference = typename next_result<T>::reference;
    using pointer = typename next_result<T>::pointer;

    async_generator() noexcept = default;
    explicit async_generator(handle_type h) noexcept : m_handle(h) {}
    async_generator(async_generator&& other) noexcept : m_handle(std::exchange(other.m_handle, {})) {}
    /// Destroys the producer this generator held (not while its next() is pending).
    async_generator& operator=(async_generator&& other) noexcept {
        if (this != &other) {
            if (m_handle) m_handle.destroy();
            m_handle = std::exchange(other.m_handle, {});
        }
        return *this;
    }
    async_generator(const async_generator&) = delete;
    async_generator& operator=(const async_generator&) = delete;
    /// Destroys the producer's frame and its locals (see above).
    ~async_generator() {
        if (m_handle) m_handle.destroy();
    }

    /// Holds a producer (not default-constructed or moved from).
    bool valid() const noexcept { return static_cast<bool>(m_handle); }
    /// The producer ended (returned or threw): next() gives the end (or the
    /// exception, once).
    bool done() const noexcept { return !m_handle || m_handle.done(); }

    /// `co_await next()`: the next value, or the end; rethrows the
    /// producer's exception. The previous value is gone once it is called.
    [[nodiscard]] detail::generator_next<T> next() noexcept { return detail::generator_next<T>(m_handle); }
    /// As next(), cancelled by `token` (see above). Await it in the
    /// expression that creates it.
    [[nodiscard]] detail::generator_next_stop<T> next(std::stop_token token) noexcept {
        return detail::generator_next_stop<T>(m_handle, std::move(token));
    }

private:
    handle_type m_handle;
};

namespace detail {
template <class T>
async_generator<T> generator_promise<T>::get_return_object() noexcept {
    return async_generator<T>(handle_type::from_promise(*this));
}
}  // namespace detail

}  // namespace spindle
