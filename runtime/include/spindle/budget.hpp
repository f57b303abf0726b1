#pragma once
/// The cooperative budget (loop_options::task_budget, 128 by default). Every
/// operation that completes without waiting — a read that finds data, a
/// channel value already there, a free mutex, a line already buffered —
/// spends one unit of the running task's budget. With none left, the next
/// such operation sends the task to the back of the ready queue, its result
/// kept; the budget is refilled when the task next runs. So a task whose
/// operations are always ready cannot hold the loop, the same on every
/// backend. yield() still gives the loop back at once.

#include <spindle/detail/engine.hpp>
#include <spindle/detail/task_header.hpp>
#include <spindle/park.hpp>

#include <stop_token>
#include <string>
#include <utility>

namespace spindle {

namespace detail {

/// A wait that is always over: it only spends the budget (and is a point
/// where a cancelled task stops).
class budget_wait : public waiter {
public:
    bool ready() const noexcept { return true; }
    void on_park() noexcept { complete(); }
    void on_cancel() noexcept { complete_cancelled(); }
    void on_abandon() noexcept {}
    void describe(std::string& out) const { out += "its turn (budget spent)"; }
};

}  // namespace detail

/// For a loop of the task's own work between operations that never wait:
/// spends one unit of the budget, going to the back of the ready queue when
/// none is left. Gives operation_canceled once the task (or `token`) is
/// cancelled, like any operation.
[[nodiscard]] inline parked<detail::budget_wait> consume_budget(std::stop_token token = {}) {
    return parked<detail::budget_wait>(std::move(token));
}

/// While it lives, the operations of the task that made it spend no budget:
/// for a short run of ready operations that must not be interleaved with
/// other tasks. Make it and destroy it in the same task.
class budget_exempt_scope {
public:
    budget_exempt_scope() : m_task(&detail::current_task()), m_previous(m_task->m_unbudgeted) {
        m_task->m_unbudgeted = true;
    }
    ~budget_exempt_scope() {
        m_task->m_unbudgeted = m_previous;
        if (!m_previous) detail::refill_budget();
    }
    budget_exempt_scope(const budget_exempt_scope&) = delete;
    budget_exempt_scope& operator=(const budget_exempt_scope&) = delete;

private:
    detail::task_header* m_task;
    bool m_previous;
};

}  // namespace spindle
