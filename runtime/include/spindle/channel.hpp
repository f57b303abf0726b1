#pragma once
/// channel<T>: a FIFO queue between the tasks of one loop, any number of
/// senders and receivers.
///
///     spindle::channel<job> jobs(64);              // bounded: at most 64 buffered
///     auto inputs = spindle::channel<input>::unbounded();
///     if (result<void> sent = co_await jobs.send(std::move(j)); !sent) ...  // channel_closed, or cancelled
///     while (auto r = co_await jobs.receive()) use(*r);    // ends with channel_closed
///
/// Sending: a waiting receiver gets the value directly (no trip through the
/// buffer); otherwise it is buffered; a full bounded channel makes the sender
/// wait, in FIFO order with the other senders. A waiting sender's value stays
/// where the caller has it (send takes a reference): it is moved (or, from an
/// lvalue, copied) only at the moment it is delivered. A send that fails —
/// the channel is closed, or the wait was cancelled — leaves the caller's
/// value untouched, so nothing is lost silently: `co_await ch.send(std::move(v))`
/// still owns `v` when it returns an error. Await the send in the expression
/// that creates it (the usual `co_await ch.send(...)`), since it refers to the
/// value.
///
/// Receiving: `co_await ch.receive(token)` gives result<T>: the oldest value,
/// or spindle::errc::channel_closed once the channel is closed and everything
/// sent before the close has been received. A receiver that was handed a value
/// keeps it even if it is cancelled at the same moment.
///
/// close() (idempotent): later sends fail with channel_closed; blocked senders
/// wake with channel_closed (their values stay theirs); receivers drain the
/// buffer, then get channel_closed. Destroying the channel closes it.
///
/// A receiver destroyed after a value was handed to it but before it ran (its
/// task aborted, the loop destroyed) puts the value back at the front of the
/// channel, where it came from: to the first waiting receiver, or ahead of
/// everything buffered (values put back by several receivers keep the order
/// they were handed out in), even past a bounded capacity. Nothing is lost;
/// only when the channel itself is destroyed first does such a value go down
/// with the receiver that holds it.
///
/// Threads: a channel belongs to its loop's thread. Another thread (a game's
/// simulation thread) feeds it with post_send(loop, value), which posts the
/// send onto the loop's thread; post_close(loop) closes it from there. Posted
/// values are never refused for lack of room: another thread cannot wait for
/// a loop's task, so they are buffered even past a bounded capacity (bound
/// them upstream if needed), ahead of tasks waiting to send, in the order each
/// thread posted them. A value
/// posted after the close is dropped. Each post allocates one node. The
/// channel must outlive the posts' execution: declare it before the loop (a
/// destroyed loop discards posts it never ran), or stop the posting thread and
/// let the loop run once before destroying the channel.
///
/// receive() and try_receive() return result<T>, which needs T to be default
/// constructible.

#include <spindle/detail/channel_ring.hpp>
#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/errc.hpp>
#include <spindle/loop.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>

#include <algorithm>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace spindle {

template <class T>
class channel;

/// Selects the unbounded channel constructor.
struct unbounded_t {
    explicit unbounded_t() = default;
};
inline constexpr unbounded_t unbounded_channel{};

namespace detail {

template <class T>
struct channel_receiver : waiter, list_hook<> {
    enum class state : std::uint8_t { idle, waiting, received, cancelled, closed, done };
    channel<T>* m_channel = nullptr;
    std::optional<T> m_value;
    /// Hand-off order, for putting values back in order (see channel::put_back).
    std::uint64_t m_ticket = 0;
    state m_state = state::idle;
};

template <class T>
struct channel_sender : waiter, list_hook<> {
    enum class state : std::uint8_t { idle, waiting, sent, cancelled, closed };
    channel<T>* m_channel = nullptr;
    // The caller's value; never written to when m_copy (it came as const T&).
    T* m_value = nullptr;
    bool m_copy = false;
    state m_state = state::idle;

    T&& moved() noexcept { return std::move(*m_value); }
};

template <class T>
class channel_send_wait;
template <class T>
class channel_receive_wait;
template <class T>
using channel_send_awaiter = parked<channel_send_wait<T>>;
template <class T>
using channel_receive_awaiter = parked<channel_receive_wait<T>>;

}  // namespace detail

template <class T>
class channel {
    static_assert(std::is_move_constructible_v<T>, "channel<T> needs a move-constructible T");

public:
    using value_type = T;

    /// A bounded channel; the buffer is allocated here, once. `capacity` must
    /// be at least 1 (std::invalid_argument otherwise, a std::logic_error).
    explicit channel(std::size_t capacity) : m_capacity(checked(capacity)), m_buffer(capacity) {}
    /// An unbounded channel: sends never wait.
    explicit channel(unbounded_t) : m_capacity(std::numeric_limits<std::size_t>::max()), m_buffer(16) {}
    static channel unbounded() { return channel(unbounded_channel); }

    channel(const channel&) = delete;
    channel& operator=(const channel&) = delete;
    ~channel() {
        close();
        // Handed a value, not resumed yet: the value stays with its receiver.
        while (receiver* r = m_handed.pop_front()) r->m_channel = nullptr;
    }

    /// `co_await ch.send(std::move(v), token)` → result<void>: success once
    /// delivered or buffered; errors spindle::errc::channel_closed, or
    /// operation_canceled (timed_out under with_timeout). On an error `v` is
    /// untouched.
    [[nodiscard]] detail::channel_send_awaiter<T> send(T&& value, std::stop_token token = {}) noexcept;
    /// Copies `value` when it is delivered.
    [[nodiscard]] detail::channel_send_awaiter<T> send(const T& value, std::stop_token token = {}) noexcept
        requires std::is_copy_constructible_v<T>;
    /// `co_await ch.receive(token)` → result<T>.
    [[nodiscard]] detail::channel_receive_awaiter<T> receive(std::stop_token token = {}) noexcept;

    /// Sends without waiting: result<void>, an error of channel_closed, or
    /// std::errc::operation_would_block when a bounded channel is full (or
    /// senders are already waiting). `value` is moved from only on success.
    result<void> try_send(T&& value) { return try_send_impl(std::move(value)); }
    result<void> try_send(const T& value)
        requires std::is_copy_constructible_v<T>
    {
        return try_send_impl(value);
    }
    /// The oldest value; channel_closed once closed and drained;
    /// std::errc::operation_would_block when empty.
    result<T> try_receive() {
        if (!m_buffer.empty()) {
            T v(std::move(m_buffer.front()));
            pop_front();
            refill();
            return result<T>(std::move(v));
        }
        if (m_closed) return make_error_code(errc::channel_closed);
        return std::make_error_code(std::errc::operation_would_block);
    }

    /// Thread-safe: delivers `value` on the loop's thread in its next tick (see
    /// the file comment: never refused for room, dropped after close).
    void post_send(loop& l, T value) {
        l.post([this, v = std::move(value)]() mutable {
            if (!m_closed) deliver(std::move(v));
        });
    }
    /// Thread-safe: closes the channel on the loop's thread, after the values
    /// this thread posted before.
    void post_close(loop& l) {
        l.post([this] { close(); });
    }

    /// Wakes every waiter: senders and, since the buffer is empty whenever a
    /// receiver waits, receivers, all with channel_closed.
    void close() noexcept {
        if (m_closed) return;
        m_closed = true;
        while (sender* s = m_senders.pop_front()) {
            s->m_state = sender::state::closed;
            s->complete();
        }
        while (receiver* r = m_receivers.pop_front()) {
            r->m_state = receiver::state::closed;
            r->complete();
        }
    }

    bool is_closed() const noexcept { return m_closed; }
    /// Values buffered now.
    std::size_t size() const noexcept { return m_buffer.size(); }
    bool empty() const noexcept { return m_buffer.empty(); }
    /// The bound, or std::numeric_limits<std::size_t>::max() when unbounded.
    std::size_t capacity() const noexcept { return m_capacity; }

private:
    using receiver = detail::channel_receiver<T>;
    using sender = detail::channel_sender<T>;
    friend class detail::channel_send_wait<T>;
    friend class detail::channel_receive_wait<T>;

    static std::size_t checked(std::size_t capacity) {
        if (capacity == 0) throw std::invalid_argument("spindle: a channel's capacity must be at least 1");
        return capacity;
    }

    /// A send may go ahead without waiting: FIFO behind waiting senders, and a
    /// receiver waits only while the buffer is empty.
    bool can_send_now() const noexcept {
        return m_senders.empty() && (!m_receivers.empty() || m_buffer.size() < m_capacity);
    }

    template <class U>
    result<void> try_send_impl(U&& value) {
        if (m_closed) return make_error_code(errc::channel_closed);
        if (!can_send_now()) return std::make_error_code(std::errc::operation_would_block);
        deliver(std::forward<U>(value));
        return {};
    }

    /// To the first waiting receiver, or to the back of the buffer.
    template <class U>
    void deliver(U&& value) {
        if (receiver* r = m_receivers.front()) {
            // Construct before unlinking: if T's constructor throws, the
            // receiver is still queued rather than lost.
            r->m_value.emplace(std::forward<U>(value));
            r->unlink();
            hand_to(*r, m_next_ticket++);
        } else {
            m_buffer.push_back(std::forward<U>(value));
        }
    }

    /// The ticket orders values by age: a value put back and handed out again
    /// keeps its own.
    void hand_to(receiver& r, std::uint64_t ticket) noexcept {
        r.m_state = receiver::state::received;
        r.m_ticket = ticket;
        m_handed.push_back(r);
        r.complete();
    }

    /// Takes the oldest buffered value into `out`.
    void take_front(std::optional<T>& out) {
        out.emplace(std::move(m_buffer.front()));
        pop_front();
        refill();
    }

    /// Room was made: the first waiting senders' values move into it, in order.
    void refill() {
        while (m_buffer.size() < m_capacity) {
            sender* s = m_senders.front();
            if (!s) break;
            if constexpr (std::is_copy_constructible_v<T>) {
                if (s->m_copy)
                    m_buffer.push_back(std::as_const(*s->m_value));
                else
                    m_buffer.push_back(s->moved());
            } else {
                m_buffer.push_back(s->moved());
            }
            s->unlink();
            s->m_state = sender::state::sent;
            s->complete();
        }
    }

    void pop_front() noexcept {
        m_buffer.pop_front();
        if (m_returned_count) {
            ++m_returned_first;
            if (--m_returned_count == 0) {
                m_returned.clear();
                m_returned_first = 0;
            }
        }
    }

    /// A value handed to a receiver that was destroyed before it ran. It is
    /// older than anything buffered, so it goes first — but behind values put
    /// back by receivers that were handed theirs earlier (several receivers
    /// destroyed together, in any order: the loop's destruction). Those sit at
    /// the front of the buffer; their tickets are kept, sorted, in m_returned.
    void put_back(T&& value, std::uint64_t ticket) {
        if (receiver* r = m_receivers.front()) {
            // Receivers wait only on an empty buffer: nothing older is left.
            r->m_value.emplace(std::move(value));
            r->unlink();
            hand_to(*r, ticket);
            return;
        }
        const auto first = m_returned.begin() + static_cast<std::ptrdiff_t>(m_returned_first);
        const auto at = std::lower_bound(first, m_returned.end(), ticket);
        const auto index = static_cast<std::size_t>(at - first);
        m_returned.insert(at, ticket);
        try {
            if constexpr (std::is_move_assignable_v<T> && std::is_swappable_v<T>)
                m_buffer.insert(index, std::move(value));
            else
                m_buffer.push_front(std::move(value));
        } catch (...) {
            m_returned.erase(m_returned.begin() + static_cast<std::ptrdiff_t>(m_returned_first + index));
            throw;
        }
        ++m_returned_count;
    }

    std::size_t m_capacity;
    detail::channel_ring<T> m_buffer;
    detail::intrusive_list<sender> m_senders;      // waiting: the buffer is full
    detail::intrusive_list<receiver> m_receivers;  // waiting: the buffer is empty
    detail::intrusive_list<receiver> m_handed;     // handed a value, not resumed yet
    std::uint64_t m_next_ticket = 0;
    // Tickets of the values put back at the front of the buffer, oldest first:
    // m_returned[m_returned_first ...], m_returned_count of them. Used (and
    // allocated) only when receivers are destroyed holding a value.
    std::vector<std::uint64_t> m_returned;
    std::size_t m_returned_first = 0;
    std::size_t m_returned_count = 0;
    bool m_closed = false;
};

namespace detail {

template <class T>
class channel_send_wait : public channel_sender<T> {
    using state = typename channel_sender<T>::state;

public:
    channel_send_wait(channel<T>& ch, T* value, bool copy) noexcept {
        this->m_channel = &ch;
        this->m_value = value;
        this->m_copy = copy;
    }

    bool ready() {
        channel<T>& ch = *this->m_channel;
        if (ch.m_closed) {
            this->m_state = state::closed;
            return true;
        }
        if (!ch.can_send_now()) return false;
        if constexpr (std::is_copy_constructible_v<T>) {
            if (this->m_copy)
                ch.deliver(std::as_const(*this->m_value));
            else
                ch.deliver(this->moved());
        } else {
            ch.deliver(this->moved());
        }
        this->m_state = state::sent;
        return true;
    }
    void on_park() noexcept {
        this->m_state = state::waiting;
        this->m_channel->m_senders.push_back(*this);
    }
    /// A value already taken stays sent.
    void on_cancel() noexcept {
        if (this->m_state != state::waiting) return;
        this->unlink();
        this->m_state = state::cancelled;
        this->complete_cancelled();
    }
    // Destroyed while waiting: leave the queue; the value was never touched.
    void on_abandon() noexcept { this->unlink(); }
    void describe(std::string& out) const { out += "channel send (full)"; }
    result<void> take() noexcept {
        switch (this->m_state) {
            case state::sent: return {};
            case state::closed: return make_error_code(errc::channel_closed);
            default: return cancelled_error();
        }
    }
};

template <class T>
class channel_receive_wait : public channel_receiver<T> {
    using state = typename channel_receiver<T>::state;

public:
    explicit channel_receive_wait(channel<T>& ch) noexcept { this->m_channel = &ch; }

    bool ready() {
        channel<T>& ch = *this->m_channel;
        // Senders wait only while the buffer is full, so an empty buffer means
        // nobody is waiting to send.
        if (!ch.m_buffer.empty()) {
            ch.take_front(this->m_value);
            // Listed as handed, with its age, like a value given to a parked
            // receiver: if the task dies before it sees the value (sent to
            // the back of the ready queue, its budget spent), on_discard
            // puts it back where it was.
            this->m_state = state::received;
            this->m_ticket = ch.m_next_ticket++;
            ch.m_handed.push_back(*this);
            return true;
        }
        if (ch.m_closed) {
            this->m_state = state::closed;
            return true;
        }
        return false;
    }
    void on_park() noexcept {
        this->m_state = state::waiting;
        this->m_channel->m_receivers.push_back(*this);
    }
    /// A receiver already handed a value keeps it.
    void on_cancel() noexcept {
        if (this->m_state != state::waiting) return;
        this->unlink();
        this->m_state = state::cancelled;
        this->complete_cancelled();
    }
    void on_abandon() noexcept { this->unlink(); }
    /// Handed a value and destroyed before it ran: give the value back.
    void on_discard() noexcept {
        if (this->m_state != state::received || !this->is_linked()) return;
        this->unlink();
        if (!this->m_channel) return;
        try {
            this->m_channel->put_back(std::move(*this->m_value), this->m_ticket);
        } catch (...) {
            // Growing the buffer failed: the value cannot be kept.
        }
    }
    void describe(std::string& out) const { out += "channel receive (empty)"; }
    result<T> take() {
        switch (this->m_state) {
            case state::received:
                this->unlink();  // from the handed list
                this->m_state = state::done;
                return result<T>(std::move(*this->m_value));
            case state::closed: return make_error_code(errc::channel_closed);
            default: return cancelled_error();
        }
    }
};

}  // namespace detail

template <class T>
detail::channel_send_awaiter<T> channel<T>::send(T&& value, std::stop_token token) noexcept {
    return detail::channel_send_awaiter<T>(std::move(token), *this, std::addressof(value), false);
}

template <class T>
detail::channel_send_awaiter<T> channel<T>::send(const T& value, std::stop_token token) noexcept
    requires std::is_copy_constructible_v<T>
{
    return detail::channel_send_awaiter<T>(std::move(token), *this, const_cast<T*>(std::addressof(value)), true);
}

template <class T>
detail::channel_receive_awaiter<T> channel<T>::receive(std::stop_token token) noexcept {
    return detail::channel_receive_awaiter<T>(std::move(token), *this);
}

}  // namespace spindle
