// A loop's inbox: posts, holds and the sleep flag (post_inbox.hpp).

#include "post_inbox.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

namespace spindle::detail {

void post_inbox::hold_release() noexcept {
    // Once the count drops, the loop may return from run() and be destroyed
    // before wake() is called: the in-flight count makes wait_for_leavers() wait for us.
    m_in_flight.fetch_add(1, std::memory_order_acq_rel);
    m_holds.fetch_sub(1, std::memory_order_acq_rel);
    m_counters.remote_wakeups.fetch_add(1, std::memory_order_relaxed);
    m_backend.wake();  // let run() see that the work may be over
    m_in_flight.fetch_sub(1, std::memory_order_release);
}

bool post_inbox::spin_until_posted(std::chrono::nanoseconds timeout) noexcept {
    using std::chrono::steady_clock;
    const auto now = [] {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(steady_clock::now().time_since_epoch()).count();
    };
    const std::int64_t start = now();
    std::int64_t until = m_spin_until_ns;
    // Cut short by the caller's timeout (a timer due), a spin that finds
    // nothing says nothing about the jobs.
    const bool whole_window = timeout <= std::chrono::nanoseconds::zero() || until <= start + timeout.count();
    if (!whole_window) until = start + timeout.count();
    if (start >= until || !m_spin_gauge.should_spin()) return false;
    do {
        for (int i = 0; i < 64; ++i) {
            if (queued()) {
                m_spin_gauge.found();
                return true;
            }
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#elif defined(__aarch64__)
            asm volatile("yield");
#endif
        }
        // No sched_yield here: a pool thread computing on this CPU would
        // keep it for its whole slice (3-4 ms on this kernel), and the spin
        // is short anyway.
    } while (now() < until);
    if (queued()) {
        m_spin_gauge.found();
        return true;
    }
    if (whole_window) m_spin_gauge.ran_out();
    return false;
}

void post_inbox::wait_for_leavers() noexcept {
    while (m_in_flight.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void post_inbox::discard_unrun() noexcept {
    while (post_node* node = m_posts.pop()) node->m_call(node, false);
}

}  // namespace spindle::detail
