#include <spindle/task_group.hpp>

namespace spindle {

class task_group::join_wait {
public:
    explicit join_wait(task_group& group) noexcept : m_group(group) {}
    join_wait(const join_wait&) = delete;
    join_wait& operator=(const join_wait&) = delete;
    // Destroyed while parked (the joiner was aborted, its header maybe freed):
    // the group, which may live on, must not wake it when the children finish.
    ~join_wait() {
        if (m_task && m_group.m_joiner == m_task) m_group.m_joiner = nullptr;
    }
    bool await_ready() const noexcept { return m_group.m_running == 0; }
    void await_suspend(std::coroutine_handle<> h) {
        m_task = &detail::current_task();
        m_task->m_resume = h;
        m_group.m_joiner = m_task;
        detail::park_cancellable(*m_task, this);
    }
    void await_resume() noexcept {
        detail::unpark(m_task);
        m_group.m_joiner = nullptr;
    }
    // The joiner is cancelled: the children are, and join goes on waiting for
    // them, so it still returns only once they have all finished.
    void on_cancel() noexcept { m_group.cancel(); }
    void describe(std::string& out) const { out += "join of a task group of " + std::to_string(m_group.m_running); }

private:
    task_group& m_group;
    detail::task_header* m_task = nullptr;
};

task_group::~task_group() {
    // Children still running would outlive the state they refer to: destroy
    // them now (a child cannot destroy itself, so one that is running the
    // destructor is left to finish, its handle detached, told that the group
    // is gone).
    for (child& c : m_children) {
        detail::task_header* h = c.handle.header_ptr();
        if (!h || h->m_status != detail::task_status::running) continue;
        if (h != h->m_loop->running_task())
            c.handle.abort();
        else if (c.group)
            *c.group = nullptr;
    }
}

task<void> task_group::join() {
    while (m_running > 0) co_await join_wait(*this);
    if (std::exception_ptr e = std::exchange(m_error, nullptr)) {
        m_cancelled = false;
        std::rethrow_exception(e);
    }
    m_cancelled = false;
}

void task_group::cancel() noexcept {
    m_cancelled = true;
    for (child& c : m_children) c.handle.cancel();
}

void task_group::child_done(child_list::iterator self) noexcept {
    --m_running;
    m_children.erase(self);  // drops this child's own handle: it detaches
    if (m_running == 0 && m_joiner) detail::schedule(*m_joiner);
}

}  // namespace spindle
