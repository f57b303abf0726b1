#pragma once
// Lets a std::stop_token cancel the operation an awaiter has parked on.
// Stop requests must come from the loop's own thread (from another thread,
// post() the request_stop() call): the cancellation touches loop state.

#include <spindle/detail/task_header.hpp>

#include <optional>
#include <string>
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

template <class Awaiter>
concept describable = requires(const Awaiter& a, std::string& out) { a.describe(out); };

template <class Awaiter>
inline constexpr wait_info wait_info_of{
    [](void* p) noexcept { static_cast<Awaiter*>(p)->on_cancel(); },
    [](const void* p, std::string& out) {
        if constexpr (describable<Awaiter>)
            static_cast<const Awaiter*>(p)->describe(out);
        else
            out += "a wait";
    },
};

template <class Awaiter>
inline constexpr wait_info uncancellable_wait_info_of{
    nullptr,
    [](const void* p, std::string& out) {
        if constexpr (describable<Awaiter>)
            static_cast<const Awaiter*>(p)->describe(out);
        else
            out += "a wait";
    },
};

/// Records `self` as the wait `task` is parked on, so a cancel scope that
/// expires (with_timeout) or join_handle::cancel() can cancel it, and the
/// dump of parked tasks can name it; cancels at once if the task is already
/// cancelled. Call at the end of await_suspend, once the wait is fully armed.
/// `Awaiter` needs on_cancel() and may have describe(std::string&) const.
template <class Awaiter>
void park_cancellable(task_header& task, Awaiter* self) noexcept {
    task.m_wait_info = &wait_info_of<Awaiter>;
    task.m_wait = self;
    task.m_parked_at = recent_time(task);
    if ((task.m_scope || task.m_cancel_requested) && task.scope_cancelled()) self->on_cancel();
}

/// For waits that cannot be cancelled (a join, idle): only named in the dump.
template <class Awaiter>
void park_uncancellable(task_header& task, const Awaiter* self) noexcept {
    task.m_wait_info = &uncancellable_wait_info_of<Awaiter>;
    task.m_wait = const_cast<Awaiter*>(self);
    task.m_parked_at = recent_time(task);
}

inline void unpark(task_header* task) noexcept {
    if (task) task->m_wait_info = nullptr;
}

}  // namespace spindle::detail
