#pragma once
// A loop's side of the stall detector: what the monitor thread reads to see
// which resume runs (the running task, the pacing's epoch and countdown), and
// where it leaves a finding; the loop names the task and logs, on its own
// thread, when the flagged resume returns. Private to the runtime (loop_core
// owns one; the monitor is stall_monitor.hpp, both in stall_monitor.cpp).

#include "loop_metrics.hpp"
#include "poll_pacing.hpp"

#include <atomic>
#include <cstdint>

namespace spindle::detail {

struct task_header;

/// Which resume is running: the pair changes with every resume (the
/// countdown falls within an epoch, and each clock check starts a new
/// epoch), and `running` is false between resumes.
struct resume_probe {
    bool running = false;
    std::int64_t epoch = 0;
    unsigned countdown = 0;
    bool operator==(const resume_probe&) const = default;
};

class stall_probe {
public:
    stall_probe(poll_pacing& pacing, loop_counters& counters) noexcept : m_pacing(pacing), m_counters(counters) {}
    stall_probe(const stall_probe&) = delete;
    stall_probe& operator=(const stall_probe&) = delete;

    /// The monitor saw `probe`'s resume run since `since_ns` (any thread):
    /// leaves its finding, then sets the countdown to zero, which sends the
    /// loop to its rare path when that resume returns.
    void flag(const resume_probe& probe, std::int64_t since_ns) noexcept;
    /// A finding waits (the loop's thread, on its rare path).
    bool flagged() const noexcept { return m_flag.load(std::memory_order_relaxed); }
    /// Takes the finding and logs it: `t` is the task of the resume that just
    /// returned with `countdown` (null if it finished inside that resume), or
    /// the task finishing now (`finishing`).
    void take_flag(const task_header* t, unsigned countdown, bool finishing = false) noexcept;
    /// The task that last finished inside its own resume: after that resume
    /// its header may be gone, but its id can still be named.
    void note_finished(std::uint64_t id) noexcept { m_finished_id = id; }

private:
    void report(const task_header* t, bool finished, std::uint64_t id, std::int64_t since_ns) noexcept;

    poll_pacing& m_pacing;
    loop_counters& m_counters;
    // The monitor's finding: which resume, since when; then the flag.
    std::atomic<bool> m_flag{false};
    std::atomic<std::int64_t> m_epoch{0};
    std::atomic<unsigned> m_countdown{0};
    std::atomic<std::int64_t> m_since_ns{0};
    std::uint64_t m_finished_id = 0;
};

}  // namespace spindle::detail
