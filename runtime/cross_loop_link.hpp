#pragma once
// A link between two loops of a group: the rings that carry cross-loop calls
// and their replies, and the tables of the calls in flight on each side
// (detail/cross_loop.hpp has the protocol). Private to the runtime.

#include "spsc_ring.hpp"

#include <spindle/detail/cross_loop.hpp>
#include <spindle/detail/intrusive_list.hpp>
#include <spindle/join_handle.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spindle::detail {

struct call_slot {
    call_wait_base* m_waiter = nullptr;  // null: free, or orphaned by a cancel
    std::uint32_t m_generation = 0;
    std::uint32_t m_next_free = 0;
};

struct remote_slot {
    join_handle<void> m_task;               // a task started for the call, while it runs
    std::uint32_t m_generation = 0;         // of the call it runs for
    std::uint32_t m_cancel_generation = 0;  // a cancel that came before its request
};

struct link {
    link(std::uint32_t from, std::uint32_t to, std::size_t calls);

    std::uint32_t m_from;
    std::uint32_t m_to;
    spsc_ring<ring_cell> m_requests;  // caller to callee
    spsc_ring<ring_cell> m_replies;   // callee to caller

    // The caller's side: touched by loop m_from only.
    alignas(64) std::vector<call_slot> m_calls;
    std::uint32_t m_free_head = 0;
    std::uint32_t m_credits = 0;
    intrusive_list<call_wait_base, credit_tag> m_credit_waiters;

    // The callee's side: touched by loop m_to only.
    alignas(64) std::vector<remote_slot> m_running;

    void start(call_wait_base& call) noexcept;
    void withdraw(call_wait_base& call) noexcept;
    void release(std::uint32_t slot) noexcept;

private:
    void send(call_wait_base& call) noexcept;
};

}  // namespace spindle::detail
