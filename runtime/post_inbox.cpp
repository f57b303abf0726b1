// A loop's inbox: posts, holds and the sleep flag (post_inbox.hpp).

#include "post_inbox.hpp"

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

void post_inbox::wait_for_leavers() noexcept {
    while (m_in_flight.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void post_inbox::discard_unrun() noexcept {
    while (post_node* node = m_posts.pop()) node->m_call(node, false);
}

}  // namespace spindle::detail
