#pragma once
/// broadcast_sender<T> and broadcast_receiver<T>: every value sent reaches
/// every receiver, each reading at its own pace from one shared ring.
///
///     spindle::broadcast_sender<quote> quotes(256);    // holds the last 256 values
///     auto rx = quotes.subscribe();                      // sees what is sent from now on
///     (void)quotes.send(q);                              // never waits
///     for (;;) {
///         spindle::broadcast_result<quote> r = co_await rx.receive(token);
///         if (r) show(*r);
///         else if (r.error() == spindle::errc::receiver_lagged) note_gap(r.missed());
///         else break;                                    // channel_closed, or cancelled
///     }
///
/// Sending never waits. A value is stored once, in a ring of `capacity`
/// values shared by all receivers; every receiver that was subscribed when it
/// was sent reads it once. The receivers that read it before the last one get
/// a copy; the last one gets the value itself (moved), and the slot is empty
/// from then on. When the ring holds `capacity` values, a send overwrites the
/// oldest, which is destroyed at that moment.
///
/// Lag: a receiver that had not read a value before it was overwritten gets
/// spindle::errc::receiver_lagged from its next receive, with missed() saying
/// how many values it lost; the receive after that gives the oldest value
/// still held. Nothing else is skipped.
///
/// send() gives the number of receivers that will see the value. With none
/// subscribed nothing is stored and the value is not touched (0): a receiver
/// subscribed later would never see it anyway.
///
/// Closing: close() on any sender, or destroying the last sender. Later sends
/// fail with channel_closed; receivers read what they can still see, then get
/// channel_closed. subscribe() (on a sender or a receiver) gives a receiver
/// that sees the values sent from then on.
///
/// A receive reads its value when its task resumes, not when the value is
/// sent: a receiver woken by a send that is overwritten before its task runs
/// reports the lag instead. So a receive that completed but whose task never
/// saw the result (its frame destroyed, its budget spent, a when_any that
/// another branch won) has taken nothing: the values stay for the receiver's
/// next receive. A receiver serves one receive at a time (a second one, or a
/// try_receive, while a receive is pending is a std::logic_error).
///
/// Lifetimes: destroying a receiver gives up its claim on the values it had
/// not read (a value that no receiver still has to read is destroyed at
/// once); a task waiting on it gets channel_closed. The ring lives until the
/// last sender and the last receiver are gone; the values still held are
/// destroyed then.
///
/// Costs: the ring (capacity + 1 slots, rounded up to a power of two) is
/// allocated once, by the first sender; a send or a receive allocates nothing
/// beyond what T's copy does. A send wakes every receiver that waits.
///
/// Threads: like channel, a broadcast belongs to one loop's thread: every
/// sender and receiver is used there. Another thread sends through
/// loop::post.

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/errc.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

namespace spindle {

template <class T>
class broadcast_sender;
template <class T>
class broadcast_receiver;

/// What a broadcast receive gives: a value, or an error —
/// errc::receiver_lagged (see missed()), errc::channel_closed (closed and
/// read to the end), operation_canceled (timed_out under with_timeout), or
/// std::errc::operation_would_block from try_receive.
template <class T>
class broadcast_result : public result<T> {
public:
    broadcast_result(T value) noexcept(std::is_nothrow_move_constructible_v<T>) : result<T>(std::move(value)) {}
    broadcast_result(std::error_code error) : result<T>(error) {}

    /// With errc::receiver_lagged: how many values were overwritten before
    /// this receiver read them. Otherwise 0.
    std::uint64_t missed() const noexcept { return m_missed; }

    static broadcast_result lagged(std::uint64_t missed) {
        broadcast_result r(make_error_code(errc::receiver_lagged));
        r.m_missed = missed;
        return r;
    }

private:
    std::uint64_t m_missed = 0;
};

namespace detail {

template <class T>
class broadcast_receive_wait;
template <class T>
using broadcast_receive_awaiter = parked<broadcast_receive_wait<T>>;

/// The ring and its bookkeeping, shared by the senders and receivers of one
/// broadcast. Values are numbered by sequence; the ring holds the last
/// `capacity` of them, [oldest(), m_next).
template <class T>
class broadcast_state {
public:
    struct slot {
        /// Receivers that still have to read the value; 0: the slot is empty.
        std::size_t readers = 0;
        alignas(T) std::byte storage[sizeof(T)];

        T& value() noexcept { return *std::launder(reinterpret_cast<T*>(storage)); }
    };

    explicit broadcast_state(std::size_t capacity)
        : m_capacity(capacity), m_mask(slots_for(capacity) - 1), m_slots(new slot[m_mask + 1]) {}
    broadcast_state(const broadcast_state&) = delete;
    broadcast_state& operator=(const broadcast_state&) = delete;
    ~broadcast_state() {
        for (std::size_t i = 0; i <= m_mask; ++i)
            if (m_slots[i].readers) std::destroy_at(&m_slots[i].value());
    }

    /// The last handle (sender or receiver) frees the state.
    static void release_handle(broadcast_state* s) noexcept {
        if (s->m_senders == 0 && s->m_receivers == 0) delete s;
    }

    std::uint64_t oldest() const noexcept { return m_next > m_capacity ? m_next - m_capacity : 0; }
    slot& at(std::uint64_t seq) noexcept { return m_slots[static_cast<std::size_t>(seq & m_mask)]; }

    /// One receiver gives up its claim on a value: the value goes once
    /// nobody still has to read it.
    void release(slot& s) noexcept {
        if (--s.readers == 0) std::destroy_at(&s.value());
    }

    /// Stores a value for every receiver subscribed now (at least one).
    template <class U>
    std::size_t push(U&& value) {
        // The slot of m_next is empty: the ring has a spare slot, so the new
        // value is built before the oldest one goes, and a constructor that
        // throws changes nothing.
        slot& fresh = at(m_next);
        std::construct_at(reinterpret_cast<T*>(fresh.storage), std::forward<U>(value));
        fresh.readers = m_receivers;
        if (m_next >= m_capacity) {
            // Overwritten: receivers that had not read it will hear of the lag.
            slot& gone = at(m_next - m_capacity);
            if (gone.readers) {
                gone.readers = 0;
                std::destroy_at(&gone.value());
            }
        }
        ++m_next;
        wake_all();
        return m_receivers;
    }

    void close() noexcept {
        if (m_closed) return;
        m_closed = true;
        wake_all();
    }

    /// Waiting receivers have read everything: each wakes and reads when it resumes.
    void wake_all() noexcept {
        while (broadcast_receive_wait<T>* w = m_waiting.pop_front()) w->complete();
    }

    std::size_t m_capacity;
    std::size_t m_mask;
    std::unique_ptr<slot[]> m_slots;
    std::uint64_t m_next = 0;  // the sequence number of the next value sent
    intrusive_list<broadcast_receive_wait<T>> m_waiting;
    std::size_t m_receivers = 0;
    std::size_t m_senders = 0;
    bool m_closed = false;

private:
    static std::size_t slots_for(std::size_t capacity) {
        if (capacity == 0) throw std::invalid_argument("spindle: a broadcast's capacity must be at least 1");
        if (capacity >= std::numeric_limits<std::size_t>::max() / 2 / sizeof(slot))
            throw std::length_error("spindle: broadcast capacity too large");
        return std::bit_ceil(capacity + 1);
    }
};

}  // namespace detail

/// One end that sends. Copies are more senders of the same broadcast; the
/// broadcast closes when the last one is destroyed (or on close()).
template <class T>
class broadcast_sender {
    static_assert(std::is_copy_constructible_v<T>, "broadcast_sender<T>: every receiver but the last gets a copy");
    using state = detail::broadcast_state<T>;

public:
    /// A new broadcast holding the last `capacity` values (at least 1:
    /// std::invalid_argument otherwise). No receiver yet: subscribe().
    explicit broadcast_sender(std::size_t capacity) : m_state(new state(capacity)) { m_state->m_senders = 1; }
    broadcast_sender(const broadcast_sender& other) noexcept : m_state(other.m_state) {
        if (m_state) ++m_state->m_senders;
    }
    broadcast_sender(broadcast_sender&& other) noexcept : m_state(std::exchange(other.m_state, nullptr)) {}
    broadcast_sender& operator=(const broadcast_sender& other) noexcept {
        if (this != &other) {
            reset();
            m_state = other.m_state;
            if (m_state) ++m_state->m_senders;
        }
        return *this;
    }
    broadcast_sender& operator=(broadcast_sender&& other) noexcept {
        if (this != &other) {
            reset();
            m_state = std::exchange(other.m_state, nullptr);
        }
        return *this;
    }
    ~broadcast_sender() { reset(); }

    /// Never waits. The number of receivers that will see the value (0: none
    /// is subscribed; nothing is stored and `value` is not moved from), or
    /// errc::channel_closed (`value` not moved from).
    [[nodiscard]] result<std::size_t> send(T&& value) { return send_impl(std::move(value)); }
    [[nodiscard]] result<std::size_t> send(const T& value) { return send_impl(value); }

    /// A receiver that sees the values sent from now on.
    [[nodiscard]] broadcast_receiver<T> subscribe() const {
        if (!m_state) return {};
        return broadcast_receiver<T>(*m_state);
    }

    /// Closes the broadcast for every sender (idempotent): waiting receivers
    /// wake, read what is left and then get channel_closed.
    void close() noexcept {
        if (m_state) m_state->close();
    }

    bool is_closed() const noexcept { return !m_state || m_state->m_closed; }
    std::size_t receiver_count() const noexcept { return m_state ? m_state->m_receivers : 0; }
    std::size_t capacity() const noexcept { return m_state ? m_state->m_capacity : 0; }

private:
    template <class U>
    result<std::size_t> send_impl(U&& value) {
        if (!m_state || m_state->m_closed) return make_error_code(errc::channel_closed);
        if (m_state->m_receivers == 0) return std::size_t{0};
        return m_state->push(std::forward<U>(value));
    }

    void reset() noexcept {
        if (!m_state) return;
        state* s = std::exchange(m_state, nullptr);
        if (--s->m_senders == 0) s->close();
        state::release_handle(s);
    }

    state* m_state;
};

/// One reader with a cursor of its own. Move-only; an empty receiver (default
/// constructed, or moved from) gives channel_closed.
template <class T>
class broadcast_receiver {
    using state = detail::broadcast_state<T>;

public:
    broadcast_receiver() noexcept = default;
    broadcast_receiver(broadcast_receiver&& other) noexcept
        : m_state(std::exchange(other.m_state, nullptr)), m_cursor(other.m_cursor), m_wait(std::exchange(other.m_wait, nullptr)) {
        if (m_wait) m_wait->moved_to(*this);
    }
    broadcast_receiver& operator=(broadcast_receiver&& other) noexcept {
        if (this != &other) {
            reset();
            m_state = std::exchange(other.m_state, nullptr);
            m_cursor = other.m_cursor;
            m_wait = std::exchange(other.m_wait, nullptr);
            if (m_wait) m_wait->moved_to(*this);
        }
        return *this;
    }
    broadcast_receiver(const broadcast_receiver&) = delete;
    broadcast_receiver& operator=(const broadcast_receiver&) = delete;
    ~broadcast_receiver() { reset(); }

    /// `co_await rx.receive(token)` → broadcast_result<T>: the next value,
    /// receiver_lagged, channel_closed once closed and read to the end, or
    /// operation_canceled. Waits while there is nothing new.
    [[nodiscard]] detail::broadcast_receive_awaiter<T> receive(std::stop_token token = {}) noexcept;

    /// The same without waiting: std::errc::operation_would_block when there
    /// is nothing new.
    broadcast_result<T> try_receive() {
        if (m_wait) throw std::logic_error("spindle: a broadcast_receiver serves one receive at a time");
        return read();
    }

    /// Another receiver of the same broadcast, seeing the values sent from now on.
    [[nodiscard]] broadcast_receiver subscribe() const {
        if (!m_state) return {};
        return broadcast_receiver(*m_state);
    }

    /// Values held that this receiver has not read yet (not those it lost).
    std::size_t size() const noexcept {
        if (!m_state) return 0;
        return static_cast<std::size_t>(m_state->m_next - std::max(m_cursor, m_state->oldest()));
    }
    /// The next receive gives channel_closed.
    bool is_closed() const noexcept { return !m_state || (m_state->m_closed && m_cursor == m_state->m_next); }

private:
    friend class broadcast_sender<T>;
    friend class detail::broadcast_receive_wait<T>;

    explicit broadcast_receiver(state& s) noexcept : m_state(&s), m_cursor(s.m_next) { ++s.m_receivers; }

    /// A receive would not wait: a value, a lag to report, or the close.
    bool has_news() const noexcept { return !m_state || m_cursor < m_state->m_next || m_state->m_closed; }

    broadcast_result<T> read() {
        if (!m_state) return make_error_code(errc::channel_closed);
        state& s = *m_state;
        const std::uint64_t oldest = s.oldest();
        if (m_cursor < oldest) {
            const std::uint64_t missed = oldest - m_cursor;
            m_cursor = oldest;
            return broadcast_result<T>::lagged(missed);
        }
        if (m_cursor == s.m_next) {
            if (s.m_closed) return make_error_code(errc::channel_closed);
            return std::make_error_code(std::errc::operation_would_block);
        }
        typename state::slot& slot = s.at(m_cursor);
        if (slot.readers == 1) {
            // The last receiver that has to read it: the value itself.
            broadcast_result<T> r(std::move(slot.value()));
            slot.readers = 0;
            std::destroy_at(&slot.value());
            ++m_cursor;
            return r;
        }
        broadcast_result<T> r(std::as_const(slot.value()));  // a copy that throws changes nothing
        --slot.readers;
        ++m_cursor;
        return r;
    }

    void reset() noexcept;

    state* m_state = nullptr;
    std::uint64_t m_cursor = 0;  // the sequence number of the next value to read
    // The receive in progress (claimed by ready() or on_park(), until take()
    // or its destruction).
    detail::broadcast_receive_wait<T>* m_wait = nullptr;
};

namespace detail {

template <class T>
class broadcast_receive_wait : public waiter, public list_hook<> {
public:
    explicit broadcast_receive_wait(broadcast_receiver<T>& r) noexcept : m_receiver(&r) {}

    bool ready() {
        claim();
        return m_receiver->has_news();
    }
    void on_park() noexcept { m_receiver->m_state->m_waiting.push_back(*this); }
    void on_cancel() noexcept {
        unlink();
        complete_cancelled();
    }
    void on_abandon() noexcept {
        unlink();
        unclaim();
    }
    /// Completed, never resumed: nothing was taken (a value is read only in
    /// take()), so only the claim goes.
    void on_discard() noexcept { unclaim(); }
    void describe(std::string& out) const { out += "broadcast receive (nothing new)"; }
    broadcast_result<T> take() {
        unclaim();
        if (cancelled()) return cancelled_error();
        if (!m_receiver) return make_error_code(errc::channel_closed);
        return m_receiver->read();
    }

    /// The receiver is destroyed while this receive is pending.
    void receiver_gone() noexcept {
        unlink();
        m_receiver = nullptr;
        complete();
    }
    void moved_to(broadcast_receiver<T>& r) noexcept { m_receiver = &r; }

private:
    void claim() {
        if (m_receiver->m_wait && m_receiver->m_wait != this)
            throw std::logic_error("spindle: a broadcast_receiver serves one receive at a time");
        m_receiver->m_wait = this;
    }
    void unclaim() noexcept {
        if (m_receiver && m_receiver->m_wait == this) m_receiver->m_wait = nullptr;
    }

    broadcast_receiver<T>* m_receiver;
};

}  // namespace detail

template <class T>
detail::broadcast_receive_awaiter<T> broadcast_receiver<T>::receive(std::stop_token token) noexcept {
    return detail::broadcast_receive_awaiter<T>(std::move(token), *this);
}

template <class T>
void broadcast_receiver<T>::reset() noexcept {
    if (!m_state) return;
    state* s = std::exchange(m_state, nullptr);
    if (m_wait) std::exchange(m_wait, nullptr)->receiver_gone();
    // Give up the claim on every value held that this receiver had not read.
    for (std::uint64_t seq = std::max(m_cursor, s->oldest()); seq < s->m_next; ++seq) s->release(s->at(seq));
    --s->m_receivers;
    state::release_handle(s);
}

}  // namespace spindle
