#pragma once
// What the loop knows of one spawned task. Kept apart from the coroutine frame
// so a join handle can outlive the frame (the frame is destroyed as soon as the
// task finishes or is aborted; its result waits here).

#include <spindle/detail/intrusive_list.hpp>

#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

namespace spindle {
class waiter;
}

namespace spindle::detail {

class loop_core;
struct ready_tag;  // hook in the loop's ready queue
struct all_tag;    // hook in the loop's list of live tasks

enum class task_status : std::uint8_t { running, succeeded, failed, aborted };

/// A region of a task that a deadline can cancel (see with_timeout). Scopes
/// nest: they form a stack through m_parent, innermost first, living in the
/// frames of the awaiters that opened them.
struct cancel_scope {
    cancel_scope* m_parent = nullptr;
    /// The scope's deadline passed: waits inside it are cancelled.
    bool m_cancelled = false;
    /// A cancel ended a wait inside the scope while it was open: its own
    /// deadline, an enclosing scope's, or join_handle::cancel(). Only this
    /// tells a with_timeout around an operation that reports no error that
    /// the operation was cut short (a deadline that passed after the last
    /// wait completed, in the same tick, cut nothing short).
    bool m_reached = false;
};

/// What the loop may do with the wait a task is parked on: one static table
/// per awaiter type, so a park costs two pointer stores.
struct wait_info {
    /// Cancels the wait (it completes with operation_canceled); null when the
    /// wait cannot be cancelled. Must be a no-op once the wait completed, and
    /// then return false; true when the cancel reached a parked wait.
    bool (*cancel)(void* awaiter) noexcept;
    /// Appends what the task waits on, for the dump of parked tasks.
    void (*describe)(const void* awaiter, std::string& out);
};

struct task_header;

/// A task's name lives in a table of the process, not in its header: most
/// tasks have none, and a header lives as long as its task. The header only
/// says that it has one (m_named). Any thread.
/// Names `t` (before it is registered); throws std::bad_alloc.
void name_task(task_header& t, std::string_view name);
/// Appends the name of `t` to `out`; nothing for a task without one.
void append_task_name(const task_header& t, std::string& out);
/// Drops the name of `t`, which is going away.
void forget_task_name(const task_header& t) noexcept;
/// How many names the table holds now (for tests: a name outliving its task
/// would be a leak).
std::size_t task_names_held() noexcept;

/// What differs between spawned<T> for each T: one static table per type.
struct task_ops {
    /// Moves the result out of the finished frame, then destroys the frame.
    void (*finish)(task_header&) noexcept;
    /// Frees the header.
    void (*destroy)(task_header&) noexcept;
};

struct task_header : list_hook<ready_tag>, list_hook<all_tag> {
    /// The innermost suspended coroutine of this task: what the loop resumes.
    std::coroutine_handle<> m_resume;
    /// The task's outermost frame while it runs; empty once it finished.
    std::coroutine_handle<> m_frame;
    loop_core* m_loop = nullptr;
    union {
        /// While the task runs: the wait of a task parked in co_await on its
        /// join handle (see joiner()).
        waiter* m_joiner;
        /// Once it failed: what it threw. A failed task has no joiner left,
        /// so the two share their word.
        std::exception_ptr m_error;
    };
    std::uint64_t m_id = 0;
    /// One for the loop while the task runs, one for a live join handle, one
    /// for a join parked on it.
    std::uint16_t m_refs = 0;
    task_status m_status = task_status::running;
    /// Its failure reached someone through the join handle.
    bool m_observed : 1 = false;
    /// join_handle::cancel() was called: every wait from now on is cancelled.
    bool m_cancel_requested : 1 = false;
    /// Inside a budget_exempt_scope: ready operations spend no budget.
    bool m_unbudgeted : 1 = false;
    /// A branch of a when_any over awaitables (a branch_header): a header the
    /// loop resumes but does not list.
    bool m_branch : 1 = false;
    /// The outermost frame's size (bytes), for the dump, and whether the
    /// task has a name: both set before the task is registered, never after.
    std::uint32_t m_frame_size : 31 = 0;
    std::uint32_t m_named : 1 = 0;
    const task_ops* m_ops = nullptr;
    /// The innermost open cancel scope, if any.
    cancel_scope* m_scope = nullptr;
    /// The wait the task is parked on (a sleep, an I/O, a signal, a lock...)
    /// and since when (loop time, ns); cleared when that wait resumes.
    const wait_info* m_wait_info = nullptr;
    void* m_wait = nullptr;
    std::int64_t m_parked_at = 0;

    task_header() noexcept : m_joiner(nullptr) {}
    task_header(const task_header&) = delete;
    task_header& operator=(const task_header&) = delete;
    ~task_header() {
        if (m_status == task_status::failed) m_error.~exception_ptr();
        if (m_named) forget_task_name(*this);
    }

    /// The task parked on this one's join handle; null once it finished.
    waiter* joiner() const noexcept { return m_status == task_status::running ? m_joiner : nullptr; }
    /// Ends the task as failed with `error`: its joiner must be taken first.
    void fail(std::exception_ptr error) noexcept {
        ::new (&m_error) std::exception_ptr(std::move(error));
        m_status = task_status::failed;
    }

    /// A wait that parks now must be cancelled at once.
    bool cancel_pending() const noexcept {
        if (m_cancel_requested) return true;
        for (const cancel_scope* s = m_scope; s; s = s->m_parent)
            if (s->m_cancelled) return true;
        return false;
    }

    /// A cancel of this task (a deadline, join_handle::cancel) ended one of
    /// its waits: marks every open scope the cancel cuts short, from the
    /// innermost out to the outermost one that expired (all of them after
    /// join_handle::cancel). A scope inside the one whose deadline passed is
    /// cut short too: its with_timeout passes operation_canceled up to the
    /// scope that turns it into timed_out.
    void note_cancel_reached() noexcept {
        const cancel_scope* cause = nullptr;
        if (!m_cancel_requested)
            for (const cancel_scope* s = m_scope; s; s = s->m_parent)
                if (s->m_cancelled) cause = s;
        for (cancel_scope* s = m_scope; s; s = s->m_parent) {
            s->m_reached = true;
            if (s == cause) break;
        }
    }

    list_hook<ready_tag>& ready_hook() noexcept { return *this; }
    const list_hook<ready_tag>& ready_hook() const noexcept { return *this; }
    list_hook<all_tag>& all_hook() noexcept { return *this; }
};

/// A branch of a when_any over awaitables (when_any.hpp), as the loop sees
/// it: a task header of its own, which the branch's waits park and the loop
/// resumes, but which is not in the loop's list of tasks; part of the task
/// m_outer. Spawned tasks do without that word.
struct branch_header : task_header {
    branch_header() noexcept { m_branch = true; }
    task_header* m_outer = nullptr;
    /// The branch's awaitable completed (its wait, or its task, is done).
    void (*m_arrive)(branch_header&) noexcept = nullptr;
};

/// The task a when_any branch is part of; null for a spawned task.
inline const task_header* outer_of(const task_header& t) noexcept {
    return t.m_branch ? static_cast<const branch_header&>(t).m_outer : nullptr;
}

/// Called from a spawned task's final suspend point (defined by the loop).
void task_finished(task_header& task) noexcept;
/// Drops one reference; the last one frees the header.
void release_task(task_header& task) noexcept;
/// Logs a failure nobody can observe any more.
void log_unobserved_failure(const task_header& task) noexcept;
/// Destroys a running task's frame now (see join_handle::abort).
void abort_task(task_header& task);
/// Cancels the task's current and future waits (see join_handle::cancel).
void cancel_task(task_header& task) noexcept;
/// The task the loop is resuming now, or null.
task_header* running_task(const loop_core& core) noexcept;

}  // namespace spindle::detail
