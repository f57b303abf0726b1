#pragma once
// kv_get: the vendor's callback API (vendor_kv.hpp) as a spindle awaitable,
// written on the park protocol (<spindle/park.hpp>, docs/custom-awaiters.md).
//
//   spindle::result<std::string> r = co_await example::kv_get(client, "key", token);
//
// The answer comes on a thread that is not the loop's: a spindle::remote_answer
// carries it to the loop (through loop::post) and drops it when nobody waits
// any more, as spindle's own name resolution does (net/resolve.cpp).

#include "vendor_kv.hpp"

#include <spindle/loop.hpp>
#include <spindle/park.hpp>
#include <spindle/remote_answer.hpp>
#include <spindle/result.hpp>

#include <memory>
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

/// What the vendor answers, carried to the loop by a spindle::remote_answer.
struct kv_reply {
    vendor::status status = vendor::status::closed;
    std::string value;
};

class kv_get_wait : public spindle::waiter {
public:
    kv_get_wait(vendor::kv_client& client, std::string key)
        : m_client(client), m_key(std::move(key)), m_answer(std::make_shared<spindle::remote_answer<kv_reply>>()) {}

    void on_park() {
        m_answer->attach(*this);
        // A library may call back at once, on this thread: give() just posts.
        try {
            m_id = m_client.get(m_key, [answer = m_answer](vendor::status s, std::string value) {
                // On the vendor's worker thread: dropped if nobody waits any more.
                answer->give(kv_reply{s, std::move(value)});
            });
        } catch (...) {
            m_answer->detach();  // co_await rethrows; nothing was started
            throw;
        }
    }

    void on_cancel() noexcept {
        m_cancelling = true;
        if (m_client.cancel(m_id)) {
            // Withdrawn: no answer will ever come, so finish now (synchronous).
            m_answer->detach();
            complete_cancelled();
        }
        // Otherwise the answer is already on its way and completes the wait
        // with the value (asynchronous: the real result won the race). Called
        // again (a deadline, then the token), cancel() just says false again.
    }

    void on_abandon() noexcept {
        m_answer->detach();     // a late answer finds nobody
        m_client.cancel(m_id);  // and the vendor need not answer at all
    }

    void describe(std::string& out) const {
        out += "kv get '" + m_key + "' (request " + std::to_string(m_id) + (m_cancelling ? ", cancelling)" : ")");
    }

    spindle::result<std::string> take() {
        if (cancelled()) return spindle::cancelled_error();
        kv_reply reply = m_answer->take();
        switch (reply.status) {
            case vendor::status::ok: return std::move(reply.value);
            case vendor::status::not_found: return make_error_code(kv_errc::not_found);
            case vendor::status::closed: break;
        }
        return make_error_code(kv_errc::closed);
    }

private:
    vendor::kv_client& m_client;
    std::string m_key;
    std::shared_ptr<spindle::remote_answer<kv_reply>> m_answer;
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
