#pragma once
// Cross-loop calls between the loops of a loop_group (loop_group.hpp).
//
// Every ordered pair of loops (caller, callee) has a link: a ring of
// requests (caller to callee) and a ring of replies (callee to caller), each
// a single-producer single-consumer ring of cache-line cells, plus a table
// of the calls in flight on each side. A call holds one credit of its link
// from the moment its request is built in the ring until the caller has
// taken its reply; each ring has a cell more than the link has credits (the
// one its consumer is handling), so a reply always finds a free cell and
// neither ring can overflow. With no
// credit left a caller waits, in order, for one (back-pressure).
//
// Cells are built in place and handled in place: the callable and the
// outcome live in the cell when they fit in its 48 bytes, else in one
// allocation. A cancelled call ends at once for the caller; its reply, when
// it comes, is destroyed, and a task started for it on the callee is
// cancelled through a post (rare, so it may allocate).

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/join_handle.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>
#include <spindle/task.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <stop_token>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

// g++ 12 takes the variant of a call_outcome moved into a cell for one read
// before it is written (-Wmaybe-uninitialized), a known false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace spindle::detail {

struct link;
struct call_wait_base;

// --- cells ---------------------------------------------------------------------

/// One cache line of a link's ring: an item's header and its inline payload.
struct alignas(64) ring_cell {
    std::byte bytes[64];
};

/// What every cell starts with: the function that handles its item (run
/// true) or only destroys it (false: the group is gone), then destroys it.
struct cell_header {
    void (*m_handle)(ring_cell& cell, link& l, bool run) noexcept;
    std::uint32_t m_slot;
    std::uint32_t m_generation;
};

inline constexpr std::size_t cell_payload_offset = 16;
inline constexpr std::size_t cell_payload_size = sizeof(ring_cell) - cell_payload_offset;
static_assert(sizeof(cell_header) <= cell_payload_offset);

template <class P>
inline constexpr bool fits_in_cell = sizeof(P) <= cell_payload_size && alignof(P) <= cell_payload_offset;

inline cell_header& header_of(ring_cell& c) noexcept { return *std::launder(reinterpret_cast<cell_header*>(c.bytes)); }

/// The payload of type P in a cell: inline, or a pointer to it when it is too large.
template <class P>
struct cell_payload {
    using stored = std::conditional_t<fits_in_cell<P>, P, P*>;
    static void* where(ring_cell& c) noexcept { return c.bytes + cell_payload_offset; }
    static P& get(ring_cell& c) noexcept {
        if constexpr (fits_in_cell<P>)
            return *std::launder(reinterpret_cast<P*>(where(c)));
        else
            return **std::launder(reinterpret_cast<P**>(where(c)));
    }
    template <class... A>
    static void make(ring_cell& c, A&&... args) {
        if constexpr (fits_in_cell<P>)
            ::new (where(c)) P(std::forward<A>(args)...);
        else
            ::new (where(c)) P*(new P(std::forward<A>(args)...));
    }
    static void destroy(ring_cell& c) noexcept {
        if constexpr (fits_in_cell<P>)
            std::destroy_at(&get(c));
        else
            delete &get(c);
    }
};

// --- what a call yields ------------------------------------------------------------

template <class R>
struct callee_value {
    using type = R;
};
template <class U>
struct callee_value<task<U>> {
    using type = U;
};
/// What the callee's function gives: its value, or the value of the task it returns.
template <class F>
using call_value_t = typename callee_value<std::invoke_result_t<F&>>::type;

template <class V>
struct call_result {
    using type = result<V>;
};
template <>
struct call_result<void> {
    using type = result<void>;
};
template <class X>
struct call_result<result<X>> {
    using type = result<X>;
};
/// What co_await submit_to(...) gives: a result of the value (a result stays itself).
template <class V>
using call_result_t = typename call_result<V>::type;

/// The outcome of a call, carried back in the reply.
template <class V>
struct call_outcome {
    using stored = std::conditional_t<std::is_void_v<V>, std::monostate, V>;
    std::variant<std::monostate, stored, std::exception_ptr> m_state;

    template <class Fn>
    void capture(Fn&& fn) noexcept {
        try {
            if constexpr (std::is_void_v<V>) {
                std::forward<Fn>(fn)();
                m_state.template emplace<1>();
            } else {
                m_state.template emplace<1>(std::forward<Fn>(fn)());
            }
        } catch (...) {
            m_state.template emplace<2>(std::current_exception());
        }
    }
    call_result_t<V> take() {
        if (m_state.index() == 2) std::rethrow_exception(std::get<2>(m_state));
        if constexpr (std::is_void_v<V>)
            return {};
        else
            return call_result_t<V>(std::move(std::get<1>(m_state)));
    }
};

// --- a link between two loops --------------------------------------------------------
//
// The link itself (its rings and tables) is the engine's; the templates
// below reach it through these calls.

struct credit_tag {};

/// The link from the loop running on this thread to loop `target` of its
/// group. Throws std::logic_error outside a group's loop and std::out_of_range
/// for a target beyond the group.
link& link_to(std::size_t target);
/// The loop a call over `l` runs on.
std::uint32_t callee_of(const link& l) noexcept;

// --- caller's side
/// Sends the call's request now if a credit is free, else queues the call for one.
void start_call(link& l, call_wait_base& call) noexcept;
/// The call gives up (cancelled, or its frame destroyed): it leaves the
/// queue, or its reply will be dropped and the callee's task cancelled.
void withdraw_call(link& l, call_wait_base& call) noexcept;
/// The caller still waiting for the reply to call (slot, generation), taken
/// off its slot; null when it gave up.
call_wait_base* take_waiter(link& l, std::uint32_t slot, std::uint32_t generation) noexcept;
/// A reply was taken: frees its credit for the next caller in the queue.
void release_call(link& l, std::uint32_t slot) noexcept;

// --- callee's side
/// Runs `t` on the callee's loop as the task of call (slot, generation).
void start_remote(link& l, std::uint32_t slot, std::uint32_t generation, task<void> t) noexcept;
/// The task of call (slot, generation) is done: its slot forgets it.
void remote_done(link& l, std::uint32_t slot, std::uint32_t generation) noexcept;
/// The cell a reply is built in (there always is one: the call holds a credit).
ring_cell& reply_cell(link& l) noexcept;
/// Publishes the reply built in reply_cell(); the caller is rung at the end of the tick.
void send_reply(link& l) noexcept;
/// Logs a callee's failure to start what a call asked for.
void log_remote_failure() noexcept;

// --- the caller's wait --------------------------------------------------------------

struct call_wait_base : waiter, list_hook<credit_tag> {
    enum class phase : std::uint8_t { idle, queued, in_flight, answered };

    link* m_link = nullptr;
    phase m_phase = phase::idle;
    std::uint32_t m_slot = 0;
    /// Builds the request in `cell` (moving the callable there).
    void (*m_build)(call_wait_base& self, ring_cell& cell) noexcept = nullptr;

    void answered() noexcept {
        m_phase = phase::answered;
        complete();
    }
};

template <class V>
void deliver_reply(ring_cell& cell, link& l, bool run) noexcept;
template <class V>
void send_outcome(link& l, std::uint32_t slot, std::uint32_t generation, call_outcome<V>&& outcome) noexcept;

template <class V>
struct reply_wait : call_wait_base {
    std::optional<call_outcome<V>> m_outcome;
};

/// The task run on the callee for a call whose function returns a task. The
/// function lives in this frame until its task is done: a lambda's captures
/// are what its coroutine refers to.
template <class F>
task<void> run_remote(F fn, link& l, std::uint32_t slot, std::uint32_t generation) {
    using V = call_value_t<F>;
    call_outcome<V> outcome;
    try {
        if constexpr (std::is_void_v<V>) {
            co_await std::invoke(fn);
            outcome.m_state.template emplace<1>();
        } else {
            outcome.m_state.template emplace<1>(co_await std::invoke(fn));
        }
    } catch (...) {
        outcome.m_state.template emplace<2>(std::current_exception());
    }
    remote_done(l, slot, generation);
    send_outcome(l, slot, generation, std::move(outcome));
}

/// Runs the request in `cell` on the callee's loop and destroys it.
template <class F>
void handle_request(ring_cell& cell, link& l, bool run) noexcept {
    const cell_header h = header_of(cell);
    F& fn = cell_payload<F>::get(cell);
    if (!run) {
        cell_payload<F>::destroy(cell);
        return;
    }
    using R = std::invoke_result_t<F&>;
    using V = call_value_t<F>;
    if constexpr (std::is_same_v<R, task<V>>) {
        try {
            start_remote(l, h.m_slot, h.m_generation, run_remote<F>(std::move(fn), l, h.m_slot, h.m_generation));
        } catch (...) {
            // No memory for the task's frame: the caller hears it.
            call_outcome<V> failed;
            failed.m_state.template emplace<2>(std::current_exception());
            send_outcome(l, h.m_slot, h.m_generation, std::move(failed));
        }
    } else {
        call_outcome<V> outcome;
        outcome.capture([&fn]() -> decltype(auto) { return std::invoke(fn); });
        send_outcome(l, h.m_slot, h.m_generation, std::move(outcome));
    }
    cell_payload<F>::destroy(cell);
}

/// Sends the outcome of call (slot, generation) back to its caller.
template <class V>
void send_outcome(link& l, std::uint32_t slot, std::uint32_t generation, call_outcome<V>&& outcome) noexcept {
    ring_cell& cell = reply_cell(l);
    try {
        cell_payload<call_outcome<V>>::make(cell, std::move(outcome));
    } catch (...) {
        // Too large for the cell and no memory for it: the caller hears that.
        call_outcome<V> lost;
        lost.m_state.template emplace<2>(std::make_exception_ptr(std::bad_alloc()));
        if constexpr (fits_in_cell<call_outcome<V>>)
            cell_payload<call_outcome<V>>::make(cell, std::move(lost));
        else std::terminate();  // cannot even say so
    }
    ::new (cell.bytes) cell_header{&deliver_reply<V>, slot, generation};
    send_reply(l);
}

/// Hands the reply in `cell` to its caller, if it still waits, and destroys it.
template <class V>
void deliver_reply(ring_cell& cell, link& l, bool run) noexcept {
    const cell_header h = header_of(cell);
    call_wait_base* waiter = run ? take_waiter(l, h.m_slot, h.m_generation) : nullptr;
    if (waiter) {
        auto& w = static_cast<reply_wait<V>&>(*waiter);
        try {
            w.m_outcome.emplace(std::move(cell_payload<call_outcome<V>>::get(cell)));
        } catch (...) {
            w.m_outcome.emplace();
            w.m_outcome->m_state.template emplace<2>(std::current_exception());
        }
        w.answered();
    }
    cell_payload<call_outcome<V>>::destroy(cell);
    if (run) release_call(l, h.m_slot);
}

/// A task's cross-loop call, run by the park protocol: parked<call_wait<F>>.
template <class F>
class call_wait : public reply_wait<call_value_t<F>> {
    using V = call_value_t<F>;
    using base = call_wait_base;

public:
    call_wait(link& l, F&& fn) : m_fn(std::move(fn)) {
        this->m_link = &l;
        this->m_build = &build;
    }

    void on_park() { start_call(*this->m_link, *this); }
    void on_cancel() noexcept {
        withdraw_call(*this->m_link, *this);
        this->complete_cancelled();
    }
    void on_abandon() noexcept { withdraw_call(*this->m_link, *this); }
    void describe(std::string& out) const {
        out += this->m_phase == base::phase::queued ? "call to loop " : "reply from loop ";
        out += std::to_string(callee_of(*this->m_link));
        if (this->m_phase == base::phase::queued) out += " (waiting for a free slot)";
    }
    call_result_t<V> take() {
        if (this->cancelled() || !this->m_outcome) {
            if constexpr (std::is_void_v<V>)
                return result<void>(cancelled_error());
            else
                return call_result_t<V>(cancelled_error());
        }
        return this->m_outcome->take();
    }

private:
    static void build(base& self, ring_cell& cell) noexcept {
        auto& me = static_cast<call_wait&>(self);
        try {
            cell_payload<F>::make(cell, std::move(me.m_fn));
            header_of(cell).m_handle = &handle_request<F>;
        } catch (...) {
            // No memory for a large callable: the call fails on the callee's
            // side with nothing to run, and says so.
            cell_payload<failed_call>::make(cell, std::current_exception());
            header_of(cell).m_handle = &handle_request<failed_call>;
        }
    }

    // What a request whose callable could not be stored carries instead.
    struct failed_call {
        explicit failed_call(std::exception_ptr error) noexcept : m_error(std::move(error)) {}
        std::exception_ptr m_error;
        V operator()() { std::rethrow_exception(m_error); }
    };

    F m_fn;
};

}  // namespace spindle::detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
