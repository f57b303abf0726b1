#pragma once
// kv_get: the vendor's callback API (vendor_kv.hpp) as a spindle awaitable,
// written on the park protocol (<spindle/park.hpp>, docs/custom-awaiters.md).
//
//   spindle::result<std::string> r = co_await example::kv_get(client, "key", token);
//
// The pattern is the one of spindle's own name resolution (net/resolve.cpp):
// the answer comes on a thread that is not the loop's, so it travels through
// loop::post, and a state shared with the callback lets it find out whether
// anybody still waits for it.

#include "vendor_kv.hpp"

#include <spindle/loop.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>

#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <system_error>
#include <utility>

namespace example {

/// The vendor's failures as error codes: spindle's one error style.
enum class kv_errc { not_found = 1, closed };

inline const std::error_category& kv_category() noexcept {
    struct category final : std::error_category {
        const char* name() const noexcept override { return "kv"; }
        std::string message(int value) const override {
            return static_cast<kv_errc>(value) == kv_errc::not_found ? "no such key" : "client closed";
        }
    };
    static const category instance;
    return instance;
}

inline std::error_code make_error_code(kv_errc e) noexcept { return {static_cast<int>(e), kv_category()}; }

}  // namespace example

template <>
struct std::is_error_code_enum<example::kv_errc> : std::true_type {};

namespace example {

/// One request, shared by the awaiting frame and the vendor's callback. The
/// frame may go first (its task aborted, its loop destroyed): it detaches
/// under the mutex, and the answer, whenever it comes, finds nobody.
struct kv_call {
    std::mutex mutex;
    spindle::loop* loop = nullptr;      // guarded by mutex
    spindle::waiter* waiter = nullptr;  // guarded by mutex
    // Written by the worker before it posts; read on the loop after the post.
    vendor::status status = vendor::status::closed;
    std::string value;
};

class kv_get_wait : public spindle::waiter {
public:
    kv_get_wait(vendor::kv_client& client, std::string key)
        : m_client(client), m_key(std::move(key)), m_call(std::make_shared<kv_call>()) {}

    void on_park() {
        {
            std::lock_guard lock(m_call->mutex);
            m_call->loop = &owner();
            m_call->waiter = this;
        }
        // Not under the mutex: a library may call back at once, on this thread.
        try {
            m_id = m_client.get(m_key, [call = m_call](vendor::status s, std::string value) {
                answer(call, s, std::move(value));
            });
        } catch (...) {
            detach();  // co_await rethrows; nothing was started
            throw;
        }
    }

    void on_cancel() noexcept {
        m_cancelling = true;
        if (m_client.cancel(m_id)) {
            // Withdrawn: no answer will ever come, so finish now (synchronous).
            detach();
            complete_cancelled();
        }
        // Otherwise the answer is already on its way and completes the wait
        // with the value (asynchronous: the real result won the race). Called
        // again (a deadline, then the token), cancel() just says false again.
    }

    void on_abandon() noexcept {
        detach();              // a late answer finds nobody
        m_client.cancel(m_id); // and the vendor need not answer at all
    }

    void describe(std::string& out) const {
        out += "kv get '" + m_key + "' (request " + std::to_string(m_id) + (m_cancelling ? ", cancelling)" : ")");
    }

    spindle::result<std::string> take() {
        if (cancelled()) return spindle::cancelled_error();
        switch (m_call->status) {
            case vendor::status::ok: return std::move(m_call->value);
            case vendor::status::not_found: return make_error_code(kv_errc::not_found);
            case vendor::status::closed: break;
        }
        return make_error_code(kv_errc::closed);
    }

private:
    // On the vendor's worker thread: never touch the waiter from here.
    static void answer(const std::shared_ptr<kv_call>& call, vendor::status s, std::string value) {
        std::lock_guard lock(call->mutex);
        if (!call->waiter) return;  // cancelled or abandoned: nobody waits
        call->status = s;
        call->value = std::move(value);
        // Post while holding the mutex: a waiter still attached means its
        // frame, and so its loop, is alive (a loop destroys its parked frames,
        // which detach under this mutex, before it goes).
        call->loop->post([call] {
            // On the loop's thread; the waiter may have gone since the post.
            spindle::waiter* w;
            {
                std::lock_guard inner(call->mutex);
                w = std::exchange(call->waiter, nullptr);
            }
            if (w) w->complete();
        });
    }

    void detach() noexcept {
        std::lock_guard lock(m_call->mutex);
        m_call->waiter = nullptr;
    }

    vendor::kv_client& m_client;
    std::string m_key;
    std::shared_ptr<kv_call> m_call;
    vendor::kv_client::request_id m_id = 0;
    bool m_cancelling = false;
};

/// `co_await kv_get(client, key, token)` → the value, kv_errc::not_found,
/// kv_errc::closed, or operation_canceled (timed_out under with_timeout).
/// Cancelled by `token`, with_timeout and join_handle::cancel. `client` must
/// outlive the wait.
[[nodiscard]] inline spindle::parked<kv_get_wait> kv_get(vendor::kv_client& client, std::string key,
                                                         std::stop_token token = {}) {
    return spindle::parked<kv_get_wait>(std::move(token), client, std::move(key));
}

}  // namespace example
