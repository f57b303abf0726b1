#pragma once
// Lets a std::stop_token cancel the operation an awaiter has parked on.
// Stop requests must come from the loop's own thread (from another thread,
// post() the request_stop() call): the cancellation touches loop state.

#include <spindle/detail/task_header.hpp>

#include <optional>
#include <stop_token>

namespace spindle::detail {

template <class Awaiter>
class cancel_hook {
public:
    void arm(const std::stop_token& token, Awaiter* self) {
        if (token.stop_possible()) m_callback.emplace(token, fire{self});
    }
    void disarm() noexcept { m_callback.reset(); }

private:
    struct fire {
        Awaiter* self;
        void operator()() const noexcept { self->on_cancel(); }
    };
    std::optional<std::stop_callback<fire>> m_callback;
};

/// Records `self` as the wait `task` is parked on, so a cancel scope that
/// expires (with_timeout) can cancel it; cancels at once if a scope already
/// expired. Call at the end of await_suspend, once the wait is fully armed.
template <class Awaiter>
void park_cancellable(task_header& task, Awaiter* self) noexcept {
    task.m_cancel_wait = [](void* p) noexcept { static_cast<Awaiter*>(p)->on_cancel(); };
    task.m_wait = self;
    if (task.m_scope && task.scope_cancelled()) self->on_cancel();
}

inline void unpark(task_header* task) noexcept {
    if (task) task->m_cancel_wait = nullptr;
}

}  // namespace spindle::detail
