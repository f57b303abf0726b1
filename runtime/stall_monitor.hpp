#pragma once
// The stall monitor: one thread per process that looks at every watched
// loop's progress a few times per threshold and flags a resume that has run
// longer than its loop's loop_options::stall_threshold. The loop reads no
// clock for it: the monitor compares what the loop already writes per resume
// (the running task and the poll-interval countdown). The loop names the task
// and logs, on its own thread, when the resume returns (loop.cpp).

#include <atomic>

namespace spindle::detail {

class loop_core;

/// Starts watching `core` (its stall_threshold is above zero), and the
/// monitor thread with the first loop.
void watch_for_stalls(loop_core& core);
/// Stops watching; once this returns the monitor never touches `core`.
void unwatch_for_stalls(loop_core& core) noexcept;

/// The monitor sleeps while every watched loop sleeps; a loop that starts
/// resuming tasks wakes it (one relaxed load per tick otherwise).
inline std::atomic<bool> g_stall_monitor_parked{false};
void wake_stall_monitor() noexcept;
inline void wake_stall_monitor_if_parked() noexcept {
    if (g_stall_monitor_parked.load(std::memory_order_relaxed)) [[unlikely]]
        wake_stall_monitor();
}

}  // namespace spindle::detail
