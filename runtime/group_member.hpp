#pragma once
// A loop's membership of a loop_group, as its engine sees it: the mail of
// cross-loop calls, taken once per tick, and the doorbells rung at the end
// of the tick for the loops this one sent to. Private to the runtime.

#include "post_inbox.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace spindle::detail {

class group_core;
class loop_core;

class group_member {
public:
    group_member(group_core& group, std::uint32_t index) : m_group(group), m_index(index) {}

    group_core& group() const noexcept { return m_group; }
    std::uint32_t index() const noexcept { return m_index; }
    loop_core* core() const noexcept { return m_core; }
    void attach(loop_core* core) noexcept { m_core = core; }

    /// Once per tick: handles what other loops sent (requests to run, replies
    /// to this loop's calls), when the doorbell says there is any.
    void take_mail() {
        m_took_mail = false;
        if (m_mail.load(std::memory_order_relaxed) && m_mail.exchange(false, std::memory_order_seq_cst)) {
            m_took_mail = true;
            drain();
        }
    }
    /// Before the loop sleeps (after announcing it): mail would be missed.
    bool has_mail() const noexcept { return m_mail.load(std::memory_order_seq_cst); }
    /// While spinning: mail has come (a cheap look, no ordering needed:
    /// the loop takes it through take_mail()).
    bool mail_waiting() const noexcept { return m_mail.load(std::memory_order_relaxed); }
    /// Whether mail is likely soon: this loop has calls in flight, or took
    /// mail in this tick (a stream of calls goes on). Then the loop spins for
    /// it a little before it sleeps, sparing both sides a wake-up.
    bool expects_mail() const noexcept { return m_calls_out > 0 || m_took_mail; }
    /// How long to spin (loop_group_options::idle_spin, ns).
    std::int64_t spin_ns() const noexcept { return m_spin_ns; }
    void set_spin(std::int64_t ns) noexcept { m_spin_ns = ns; }
    /// A call of this loop's left, or its reply was taken (link::send, release).
    void call_sent() noexcept { ++m_calls_out; }
    void call_done() noexcept { --m_calls_out; }
    /// At the end of the tick and before sleeping: rings the doorbell of
    /// every loop this one sent to, and wakes those that sleep.
    void send_mail() noexcept {
        if (!m_dirty.empty()) ring_doorbells();
    }
    /// A cell went to loop `to` (on this loop's thread).
    void note_sent(std::uint32_t to) {
        if (m_dirty_flag.empty()) m_dirty_flag.resize(m_dirty_capacity, 0);
        if (!m_dirty_flag[to]) {
            m_dirty_flag[to] = 1;
            m_dirty.push_back(to);
        }
    }
    void reserve_targets(std::size_t n) {
        m_dirty_capacity = n;
        m_dirty_flag.assign(n, 0);
        m_dirty.reserve(n);
    }

    /// Step 2 of the tick, after the posts: the calls other loops sent, then
    /// the doorbells of the loops this tick sent to (one each, however many calls).
    void exchange_mail() {
        take_mail();
        send_mail();
    }
    /// Before the loop polls the OS with `timeout`: sends its mail and, when
    /// calls or replies are expected soon, looks for them (or a post in
    /// `inbox`) a little before it sleeps, so that a stream costs no
    /// wake-ups. The timeout to poll with: zero when something came.
    std::chrono::nanoseconds before_poll(std::chrono::nanoseconds timeout, const post_inbox& inbox) noexcept {
        send_mail();
        if (timeout != std::chrono::nanoseconds::zero() && expects_mail() && spin_for_mail(timeout, inbox))
            return std::chrono::nanoseconds::zero();
        return timeout;
    }

    /// When the group is done, before the loop goes: destroys what its rings
    /// still hold, unrun.
    void discard_mail() noexcept;

    /// Another loop's thread: there is mail for this loop.
    void ring() noexcept { m_mail.store(true, std::memory_order_seq_cst); }

private:
    bool spin_for_mail(std::chrono::nanoseconds timeout, const post_inbox& inbox) const noexcept {
        using std::chrono::steady_clock;
        std::int64_t budget = m_spin_ns;
        if (timeout > std::chrono::nanoseconds::zero()) budget = std::min<std::int64_t>(budget, timeout.count());
        if (budget <= 0) return false;
        const auto until = steady_clock::now() + std::chrono::nanoseconds(budget);
        do {
            for (int i = 0; i < 64; ++i) {
                if (mail_waiting() || inbox.queued()) return true;
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            }
            // Another thread runnable on this CPU (a loop of an oversubscribed
            // group) runs meanwhile.
            std::this_thread::yield();
        } while (steady_clock::now() < until);
        return false;
    }
    void drain();
    void ring_doorbells() noexcept;

    group_core& m_group;
    std::uint32_t m_index;
    loop_core* m_core = nullptr;
    std::vector<std::uint32_t> m_dirty;
    std::vector<char> m_dirty_flag;
    std::size_t m_dirty_capacity = 0;
    std::uint64_t m_calls_out = 0;  // calls of this loop whose reply is not taken
    bool m_took_mail = false;       // in this tick
    std::int64_t m_spin_ns = 0;
    // Written by every loop that sends here: a line of its own.
    alignas(64) std::atomic<bool> m_mail{false};
};

}  // namespace spindle::detail
