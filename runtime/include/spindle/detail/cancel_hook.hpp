#pragma once
// Lets a std::stop_token cancel the operation an awaiter has parked on.
// Stop requests must come from the loop's own thread (from another thread,
// post() the request_stop() call): the cancellation touches loop state.

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

}  // namespace spindle::detail
