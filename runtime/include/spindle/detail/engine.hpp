#pragma once
// The narrow interface between awaiters and the loop that runs them: schedule
// a task, arm and disarm timers, submit, cancel and forget descriptor
// operations, read the clock. It names the loop's engine only as an opaque
// type, so an awaiter's header does not pull in the loop.

#include <cstdint>
#include <limits>

namespace spindle {
class loop;
}

namespace spindle::detail {

class loop_core;  // the loop's engine (runtime/loop_core.hpp)
struct task_header;
struct timer_node;
class io_op;

/// The task the loop running on this thread is resuming now. Throws
/// std::logic_error outside of a task (an awaitable needs a task to park).
task_header& current_task();
/// The task the loop running on this thread is resuming now, or null.
task_header* current_task_or_null() noexcept;
/// Makes `t` the running task, and returns the one it replaces: when_any
/// starts each branch inline, inside its task's turn, as a header of its own
/// (a branch's waits park that header, not the task). Call it again with
/// what it returned when the branch suspends. A loop must be running here.
task_header* exchange_running_task(task_header* t) noexcept;
/// The engine of the loop running a tick on this thread, or null. Read
/// inline: every operation looks it up.
constinit inline thread_local loop_core* t_current_core = nullptr;
/// Throws std::logic_error: no loop runs here.
[[noreturn]] void no_loop_running();
/// The engine of the loop running on this thread; throws std::logic_error
/// when no loop runs here.
inline loop_core& current_core() {
    if (!t_current_core) no_loop_running();
    return *t_current_core;
}
/// The engine a task runs on.
loop_core& core_of(const task_header& task) noexcept;
/// The engine behind a loop.
loop_core& core_of(loop& l) noexcept;
/// The public face of an engine.
loop& loop_of(loop_core& core) noexcept;

/// Makes a parked task ready; it resumes in a later tick, never inline.
void schedule(task_header& task) noexcept;
/// What the running task may still complete without waiting before the
/// loop looks at its turn again: a stint of its budget (loop_options::
/// task_budget), set by the loop each time it resumes a task; unlimited
/// outside tasks. Per thread, like the running task, and read inline: it is
/// spent on the fastest paths.
constinit inline thread_local std::uint32_t t_budget = std::numeric_limits<std::uint32_t>::max();

/// The stint ran out: true with a new one in t_budget, false when the turn is
/// over (its budget spent, or loop_options::task_quantum run out). A task in
/// a budget_exempt_scope always gets a new one.
bool next_stint() noexcept;

/// An operation of the running task completed without waiting: spends one
/// unit of its budget. False when its turn is over: the task must go to the
/// back of the ready queue before it goes on.
inline bool spend_budget() noexcept {
    if (t_budget == 0 && !next_stint()) return false;
    --t_budget;
    return true;
}
/// A full budget for the rest of the running task's turn (the end of a
/// budget_exempt_scope).
void refill_budget() noexcept;

/// Arms `node` (not armed) to fire at `deadline_ns` on the loop's clock;
/// (deadline, insertion) order, never early.
void arm_timer(loop_core& core, timer_node& node, std::int64_t deadline_ns);
/// Disarms `node`; no-op when it is not armed.
void disarm_timer(loop_core& core, timer_node& node) noexcept;

/// The running loop's clock (virtual under virtual time), else the steady clock (ns).
std::int64_t now_ns() noexcept;
/// The loop's clock as of its last look at the OS (ns): cheap, slightly old.
std::int64_t recent_ns(const loop_core& core) noexcept;

/// Starts `op`. True when it completed at once (op.result() is set, also for a
/// failure to submit: ENOMEM, EBADF, a full ring...); false when it is pending
/// and its completion function will be called. Never throws.
bool submit_io(loop_core& core, io_op& op) noexcept;
/// Asks a pending operation to finish early (ECANCELED, or its real result if
/// it won the race). No-op when not pending.
void cancel_io(loop_core& core, io_op& op) noexcept;
/// The operation's memory is about to go away: the backend never touches it
/// again and never calls its completion. No-op when not pending.
void forget_io(loop_core& core, io_op& op) noexcept;

}  // namespace spindle::detail
