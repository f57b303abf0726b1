#pragma once
// What the loop knows of one spawned task. Kept apart from the coroutine frame
// so a join handle can outlive the frame (the frame is destroyed as soon as the
// task finishes or is aborted; its result waits here).

#include <spindle/detail/intrusive_list.hpp>

#include <coroutine>
#include <cstdint>
#include <exception>
#include <string>

namespace spindle {
class loop;
}

namespace spindle::detail {

struct ready_tag;  // hook in the loop's ready queue
struct all_tag;    // hook in the loop's list of live tasks

enum class task_status : std::uint8_t { running, succeeded, failed, aborted };

/// A region of a task that a deadline can cancel (see with_timeout). Scopes
/// nest: they form a stack through m_parent, innermost first, living in the
/// frames of the awaiters that opened them.
struct cancel_scope {
    cancel_scope* m_parent = nullptr;
    bool m_cancelled = false;
};

struct task_header : list_hook<ready_tag>, list_hook<all_tag> {
    /// The innermost suspended coroutine of this task: what the loop resumes.
    std::coroutine_handle<> m_resume;
    /// The task's outermost frame while it runs; empty once it finished.
    std::coroutine_handle<> m_frame;
    loop* m_loop = nullptr;
    /// A task parked in co_await on this task's join handle.
    task_header* m_joiner = nullptr;
    std::exception_ptr m_error;
    std::string m_name;
    std::uint64_t m_id = 0;
    /// One for the loop while the task runs, one for a live join handle.
    std::uint32_t m_refs = 0;
    task_status m_status = task_status::running;
    /// Its failure reached someone through the join handle.
    bool m_observed = false;
    /// Moves the result out of the finished frame, then destroys the frame.
    void (*m_finish)(task_header&) noexcept = nullptr;
    void (*m_delete)(task_header&) noexcept = nullptr;
    /// The innermost open cancel scope, if any.
    cancel_scope* m_scope = nullptr;
    /// How to cancel the wait the task is parked on (a sleep, an I/O, a signal
    /// wait); cleared when that wait resumes. Cancelling a wait that already
    /// completed must be a no-op.
    void (*m_cancel_wait)(void*) noexcept = nullptr;
    void* m_wait = nullptr;

    bool scope_cancelled() const noexcept {
        for (const cancel_scope* s = m_scope; s; s = s->m_parent)
            if (s->m_cancelled) return true;
        return false;
    }

    list_hook<ready_tag>& ready_hook() noexcept { return *this; }
    list_hook<all_tag>& all_hook() noexcept { return *this; }
};

/// The task the loop running on this thread is resuming now. Throws
/// std::logic_error outside of a task (an awaitable needs a task to park).
task_header& current_task();

/// Makes a parked task ready; it resumes in a later tick (never inline).
void schedule(task_header& task) noexcept;

/// Called from a spawned task's final suspend point (defined by the loop).
void task_finished(task_header& task) noexcept;
/// Drops one reference; the last one frees the header.
void release_task(task_header& task) noexcept;
/// Logs a failure nobody can observe any more.
void log_unobserved_failure(const task_header& task) noexcept;
/// Destroys a running task's frame now (see join_handle::abort).
void abort_task(task_header& task);

}  // namespace spindle::detail
