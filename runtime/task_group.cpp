#include <spindle/task_group.hpp>

namespace spindle {

// The joiner parks on this until the last child finishes.
class task_group::join_wait : public waiter {
public:
    explicit join_wait(task_group& group) noexcept : m_group(group) {}
    static constexpr bool forwards_cancel = true;
    bool ready() const noexcept { return m_group.m_running == 0; }
    void on_park() noexcept { m_group.m_joiner = this; }
    // The joiner is cancelled: the children are, and join goes on waiting for
    // them, so it still returns only once they have all finished.
    void on_cancel() noexcept { m_group.cancel(); }
    // The joiner was aborted: the group, which may live on, must not wake it.
    void on_abandon() noexcept {
        if (m_group.m_joiner == this) m_group.m_joiner = nullptr;
    }
    void describe(std::string& out) const { out += "join of a task group of " + std::to_string(m_group.m_running); }
    void take() noexcept { m_group.m_joiner = nullptr; }

private:
    task_group& m_group;
};

task_group::~task_group() {
    // Children still running would outlive the state they refer to: destroy
    // them now (a child cannot destroy itself, so one that is running the
    // destructor is left to finish, its handle detached, told that the group
    // is gone).
    for (child& c : m_children) {
        detail::task_header* h = c.handle.header_ptr();
        if (!h || h->m_status != detail::task_status::running) continue;
        if (h != detail::running_task(*h->m_loop))
            c.handle.abort();
        else if (c.group)
            *c.group = nullptr;
    }
}

task<void> task_group::join() {
    while (m_running > 0) co_await parked<join_wait>(std::stop_token{}, *this);
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
    if (m_running == 0 && m_joiner) m_joiner->complete();
}

}  // namespace spindle
