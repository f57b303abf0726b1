// Cross-loop calls: the links' two sides and the tick's share of the mail
// (group_member's drain). The calls themselves are templates in
// detail/cross_loop.hpp.

#include "group_core.hpp"

#include <spindle/log.hpp>
#include <spindle/loop.hpp>

#include <new>
#include <stdexcept>
#include <string>
#include <utility>

namespace spindle::detail {

namespace {

// Cells were built in a ring towards loop `to`: it is rung at the end of this
// loop's tick (once per tick, however many cells). Called on the sending
// loop's thread, inside its tick: it has a member. Allocates nothing: the
// dirty lists were sized for the group.
void note_sent(std::uint32_t to) noexcept { current_member()->note_sent(to); }

void post_remote_cancel(link& l, std::uint32_t slot, std::uint32_t generation) noexcept;

}  // namespace

// --- links ---------------------------------------------------------------------

link::link(std::uint32_t from, std::uint32_t to, std::size_t calls)
    : m_from(from), m_to(to), m_requests(calls + 1), m_replies(calls + 1) {
    // A ring holds every call in flight, and one cell more: the cell its
    // consumer is handling, which is freed only after its handling may have
    // let the next call (or reply) in.
    m_calls.resize(calls);
    for (std::uint32_t i = 0; i < calls; ++i) m_calls[i].m_next_free = i + 1;
    m_free_head = 0;
    m_credits = static_cast<std::uint32_t>(calls);
    m_running.resize(calls);
}

void link::start(call_wait_base& call) noexcept {
    if (m_credits == 0 || !m_credit_waiters.empty()) {
        call.m_phase = call_wait_base::phase::queued;
        m_credit_waiters.push_back(call);
        return;
    }
    send(call);
}

void link::send(call_wait_base& call) noexcept {
    --m_credits;
    const std::uint32_t slot = m_free_head;
    call_slot& s = m_calls[slot];
    m_free_head = s.m_next_free;
    s.m_waiter = &call;
    ++s.m_generation;
    if (s.m_generation == 0) s.m_generation = 1;  // 0 means no call
    call.m_slot = slot;
    call.m_phase = call_wait_base::phase::in_flight;
    // A credit was free, so a cell is: at most one request per credit.
    ring_cell* cell = m_requests.reserve();
    ::new (cell->bytes) cell_header{nullptr, slot, s.m_generation};
    call.m_build(call, *cell);
    m_requests.commit();
    note_sent(m_to);
    current_member()->call_sent();
}

void link::withdraw(call_wait_base& call) noexcept {
    switch (call.m_phase) {
        case call_wait_base::phase::queued: static_cast<list_hook<credit_tag>&>(call).unlink(); break;
        case call_wait_base::phase::in_flight: {
            // The reply still comes, and frees the credit; nobody takes it.
            call_slot& s = m_calls[call.m_slot];
            s.m_waiter = nullptr;
            post_remote_cancel(*this, call.m_slot, s.m_generation);
            break;
        }
        default: break;
    }
    call.m_phase = call_wait_base::phase::idle;
}

void link::release(std::uint32_t slot) noexcept {
    m_calls[slot].m_waiter = nullptr;
    m_calls[slot].m_next_free = m_free_head;
    m_free_head = slot;
    ++m_credits;
    current_member()->call_done();
    // The credit goes to the first caller queued for one, in order.
    if (call_wait_base* next = m_credit_waiters.pop_front()) send(*next);
}

link& link_to(std::size_t target) {
    group_member* me = current_member();
    if (!me) throw std::logic_error("spindle: submit_to outside a loop_group's loop (other threads: loop::post)");
    if (target >= me->group().size())
        throw std::out_of_range("spindle: submit_to: no loop " + std::to_string(target) + " in a group of " +
                                std::to_string(me->group().size()));
    return me->group().between(me->index(), static_cast<std::uint32_t>(target));
}

namespace {

// Asks the callee of `l` to cancel the task it runs for call (slot, generation).
void post_remote_cancel(link& l, std::uint32_t slot, std::uint32_t generation) noexcept {
    group_member* me = current_member();
    if (!me || me->group().closing()) return;  // the group is going: nothing to cancel for
    loop_core* callee = me->group().member(l.m_to).core();
    if (!callee) return;
    try {
        loop_of(*callee).post([&l, slot, generation] {
            remote_slot& r = l.m_running[slot];
            if (r.m_generation == generation && r.m_task.valid())
                r.m_task.cancel();
            else
                r.m_cancel_generation = generation;  // its request is still on the way
        });
    } catch (...) {
        // Out of memory for the post: the callee's task runs to its end.
    }
}

}  // namespace

// --- what the templates of detail/cross_loop.hpp call ---------------------------------

std::uint32_t callee_of(const link& l) noexcept { return l.m_to; }
void start_call(link& l, call_wait_base& call) noexcept { l.start(call); }
void withdraw_call(link& l, call_wait_base& call) noexcept { l.withdraw(call); }
void release_call(link& l, std::uint32_t slot) noexcept { l.release(slot); }

call_wait_base* take_waiter(link& l, std::uint32_t slot, std::uint32_t generation) noexcept {
    call_slot& s = l.m_calls[slot];
    if (s.m_generation != generation) return nullptr;
    return std::exchange(s.m_waiter, nullptr);
}

void remote_done(link& l, std::uint32_t slot, std::uint32_t generation) noexcept {
    remote_slot& r = l.m_running[slot];
    if (r.m_generation == generation) r.m_task = {};
}

ring_cell& reply_cell(link& l) noexcept {
    // The call holds a credit until its reply is taken: a cell is free.
    return *l.m_replies.reserve();
}

void send_reply(link& l) noexcept {
    l.m_replies.commit();
    note_sent(l.m_from);
}

void start_remote(link& l, std::uint32_t slot, std::uint32_t generation, task<void> t) noexcept {
    remote_slot& r = l.m_running[slot];
    try {
        r.m_generation = generation;
        r.m_task = loop::current().spawn(std::move(t), "call from " + std::to_string(l.m_from));
        if (r.m_cancel_generation == generation) r.m_task.cancel();
    } catch (...) {
        // Spawning failed (out of memory): the task, and so its reply, never
        // comes; the caller waits until it is cancelled.
        log_remote_failure();
    }
}

void log_remote_failure() noexcept { log_callback_failure("cross-loop call"); }

// --- the tick's side ---------------------------------------------------------------

void group_member::drain() {
    // Once per tick, at most a ring's capacity from each, so a sender that
    // keeps sending cannot keep this loop in its drain.
    for (std::uint32_t other = 0; other < m_group.size(); ++other) {
        link& in = m_group.between(other, m_index);
        for (std::size_t n = in.m_requests.capacity(); n > 0; --n) {
            ring_cell* cell = in.m_requests.front();
            if (!cell) break;
            header_of(*cell).m_handle(*cell, in, true);
            in.m_requests.pop();
        }
        link& out = m_group.between(m_index, other);
        for (std::size_t n = out.m_replies.capacity(); n > 0; --n) {
            ring_cell* cell = out.m_replies.front();
            if (!cell) break;
            header_of(*cell).m_handle(*cell, out, true);
            out.m_replies.pop();
        }
    }
}

void group_member::discard_mail() noexcept {
    const auto discard = [](spsc_ring<ring_cell>& ring, link& l) noexcept {
        while (ring_cell* cell = ring.front()) {
            header_of(*cell).m_handle(*cell, l, false);
            ring.pop();
        }
    };
    for (std::uint32_t other = 0; other < m_group.size(); ++other) {
        link& in = m_group.between(other, m_index);
        discard(in.m_requests, in);
        link& out = m_group.between(m_index, other);
        discard(out.m_replies, out);
    }
}

void group_member::ring_doorbells() noexcept {
    for (std::uint32_t to : m_dirty) {
        m_dirty_flag[to] = 0;
        group_member& target = m_group.member(to);
        target.ring();
        if (to != m_index && target.m_core) target.m_core->wake_if_sleeping();
    }
    m_dirty.clear();
}

}  // namespace spindle::detail
