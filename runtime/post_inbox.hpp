#pragma once
// A loop's inbox: callbacks posted from any thread, the holds that keep the
// loop running for work elsewhere, and the sleep flag that decides whether a
// poster must wake the loop. Private to the runtime (loop_core owns one).
//
// The rule that loses no wake-up: the loop announces its sleep (a seq_cst
// store), then looks at the queue once more; a poster pushes (seq_cst), then
// looks at the flag. One of the two sees the other.

#include "loop_metrics.hpp"
#include "post_queue.hpp"
#include "relaxed.hpp"
#include "spin_gauge.hpp"

#include <spindle/reactor/backend.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace spindle::detail {

class post_inbox {
public:
    post_inbox(reactor::backend& backend, loop_counters& counters) noexcept
        : m_backend(backend), m_counters(counters) {}
    post_inbox(const post_inbox&) = delete;
    post_inbox& operator=(const post_inbox&) = delete;

    // --- any thread
    void push(post_node* node) noexcept {
        push_begin(node);
        push_end();
    }
    /// push() in two halves, for a poster that puts the node in under a lock
    /// of its own and must not make the wake-up's system call holding it (a
    /// thread descheduled on its way out of that call would hold the lock,
    /// and any loop that needs it, for a time slice). The loop is not
    /// destroyed between the two: its teardown waits for push_end (and a
    /// frame abandoned meanwhile waits in wait_for_leavers).
    void push_begin(post_node* node) noexcept {
        // Once the node is in, the loop may run it, finish and be destroyed
        // while this thread still looks at the flags: wait_for_leavers().
        m_in_flight.fetch_add(1, std::memory_order_acq_rel);
        m_posts.push(node);
        m_posted.fetch_add(1, std::memory_order_seq_cst);
    }
    void push_end() noexcept {
        wake_if_sleeping();
        m_in_flight.fetch_sub(1, std::memory_order_release);
    }
    /// Wakes the loop if it sleeps in the OS, once until it wakes (after a
    /// seq_cst store of what it should find: a loop group's doorbell).
    void wake_if_sleeping() noexcept {
        if (m_sleeping.load(std::memory_order_seq_cst) && !m_wake_sent.exchange(true, std::memory_order_acq_rel)) {
            m_counters.remote_wakeups.fetch_add(1, std::memory_order_relaxed);
            m_backend.wake();
        }
    }
    void hold_acquire() noexcept { m_holds.fetch_add(1, std::memory_order_acq_rel); }
    void hold_release() noexcept;

    // --- the loop's thread
    /// Runs what was posted before this call; a callback that posts again
    /// lands in the next tick, so posts cannot starve the loop.
    void run_due() {
        const std::uint64_t target = m_posted.load(std::memory_order_acquire);
        while (m_posts_run < target) {
            post_node* node = m_posts.pop();
            if (!node) break;  // a push is half done; it runs next tick
            ++m_posts_run;
            node->m_call(node, true);
        }
    }
    /// Something was posted that has not run yet (perhaps still being pushed).
    bool due() const noexcept { return m_posted.load(std::memory_order_acquire) != m_posts_run; }
    /// A node is in the queue, or being pushed.
    bool queued() const noexcept { return !m_posts.empty(); }
    bool held() const noexcept { return m_holds.load(std::memory_order_acquire) > 0; }
    std::uint64_t posts_run() const noexcept { return m_posts_run.load(); }

    /// The start of a tick: the loop will look at its posts by itself.
    /// (Load first: a store per tick would bounce the line between threads.)
    void note_awake() noexcept {
        if (m_sleeping.load(std::memory_order_relaxed)) m_sleeping.store(false, std::memory_order_relaxed);
    }
    /// About to block in the OS: posters from now on wake the loop.
    void announce_sleep() noexcept { m_sleeping.store(true, std::memory_order_seq_cst); }
    /// Back from the OS: the next sleep needs a new wake-up.
    void note_polled() noexcept {
        m_sleeping.store(false, std::memory_order_relaxed);
        m_wake_sent.store(false, std::memory_order_relaxed);
    }

    // --- the loop's thread: answers due from other threads (offload jobs)
    /// loop_options::answer_spin, in ns.
    void set_answer_spin(std::int64_t ns) noexcept { m_answer_spin_ns = ns; }
    bool spins_for_answers() const noexcept { return m_answer_spin_ns > 0; }
    /// A job submitted at `now` (steady clock) will answer by a post.
    void expect_answer(std::int64_t now) noexcept {
        ++m_answers_due;
        m_spin_until_ns = now + m_answer_spin_ns;
    }
    /// Its answer ran, or will never come (withdrawn, detached, abandoned).
    void answer_ended() noexcept { --m_answers_due; }
    /// About to sleep up to `timeout` (negative: no limit). With an answer
    /// due and the spin window of the latest job still open, looks at the
    /// queue until it closes, unless recent spins ran out in vain (jobs
    /// longer than the window: spin_gauge). True when a post came.
    bool spin_for_answer(std::chrono::nanoseconds timeout) noexcept {
        if (m_answers_due == 0) return false;
        return spin_until_posted(timeout);
    }

    // --- teardown
    /// Lets threads still inside push() or hold_release() leave (nanoseconds):
    /// past that point they could not see that the loop is going.
    void wait_for_leavers() noexcept;
    /// Destroys the posts that never ran, unrun.
    void discard_unrun() noexcept;

private:
    bool spin_until_posted(std::chrono::nanoseconds timeout) noexcept;

    reactor::backend& m_backend;
    loop_counters& m_counters;
    post_queue m_posts;
    std::atomic<std::uint64_t> m_posted{0};
    relaxed<std::uint64_t> m_posts_run{0};
    std::atomic<bool> m_sleeping{true};  // nobody looks at posts until the first tick
    std::atomic<bool> m_wake_sent{false};
    std::atomic<std::size_t> m_holds{0};
    std::int64_t m_answer_spin_ns = 0;
    std::int64_t m_spin_until_ns = 0;  // the latest job's submission + m_answer_spin_ns
    std::size_t m_answers_due = 0;
    spin_gauge m_spin_gauge;
    // Threads inside push() or hold_release(); written by them only, so on a line of its own.
    alignas(64) std::atomic<std::size_t> m_in_flight{0};
};

}  // namespace spindle::detail
