#pragma once
/// task_group: structured concurrency. Children spawned into a group run
/// concurrently on the current loop; join() waits for all of them. The first
/// child to fail (throw) cancels its siblings (join_handle::cancel), and join()
/// rethrows that failure once every child has finished. Destroying the group
/// aborts the children still running (their frames are destroyed at once), so
/// no child ever runs on against the group's freed state: join() before the
/// group goes out of scope to let them finish.
///
///     task_group group;
///     for (auto& peer : peers) group.spawn(ping(peer));
///     co_await group.join();

#include <spindle/loop.hpp>
#include <spindle/park.hpp>

#include <cstddef>
#include <exception>
#include <list>
#include <string>

namespace spindle {

class task_group {
public:
    task_group() = default;
    task_group(const task_group&) = delete;
    task_group& operator=(const task_group&) = delete;
    ~task_group();

    /// Starts `t` as a child (from the next tick). Its value is dropped.
    template <class T>
    void spawn(task<T> t, std::string name = {}) {
        auto it = m_children.emplace(m_children.end());
        ++m_running;
        it->handle = loop::current().spawn(run_child(std::move(t), this, it), std::move(name));
        // A group already cancelled cancels newcomers too.
        if (m_cancelled) it->handle.cancel();
    }

    /// Waits until every child has finished, then rethrows the first failure.
    /// Cancelling the task that awaits join() cancels the children (join still
    /// waits for them to finish).
    task<void> join();

    /// Cancels every running child.
    void cancel() noexcept;

    /// Children still running.
    std::size_t size() const noexcept { return m_running; }

private:
    struct child {
        join_handle<void> handle;
        // The running child's pointer to its group, in its own frame.
        task_group** group = nullptr;
    };
    using child_list = std::list<child>;

    // A child may outlive its group: one that destroys the group (say, by
    // aborting the task whose frame holds it) cannot be aborted while it
    // runs, so the destructor clears `group` and the child finishes alone.
    template <class T>
    static task<void> run_child(task<T> t, task_group* group, child_list::iterator self) {
        self->group = &group;
        try {
            co_await std::move(t);
        } catch (...) {
            if (group && !group->m_error) {
                group->m_error = std::current_exception();
                group->cancel();
            }
        }
        if (group) group->child_done(self);
    }
    void child_done(child_list::iterator self) noexcept;

    class join_wait;

    child_list m_children;
    std::size_t m_running = 0;
    std::exception_ptr m_error;
    waiter* m_joiner = nullptr;
    bool m_cancelled = false;
};

}  // namespace spindle
