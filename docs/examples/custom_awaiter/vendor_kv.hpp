#pragma once
// ============================================================================
//  THE THIRD-PARTY LIBRARY BEING WRAPPED: a stand-in for a vendor's client.
//  Nothing in this file knows spindle; kv_get.hpp is the wrapper.
// ============================================================================
//
// A key-value client with a callback API, the shape of many real ones
// (database drivers, RPC stubs, SDKs): get() returns at once with a request
// id, and the answer comes later on the client's own worker thread. The
// "server" is a map in memory, and each key answers after a latency of its
// own, so slow answers are easy to arrange.
//
// The contract, as such a library documents it:
//   - get(key, cb) calls cb exactly once, on the worker thread, unless
//     cancel() returned true for it;
//   - cancel(id) → true: withdrawn, the callback will never be called;
//     false: too late (the callback is running or has run) or no such request;
//   - the destructor answers every pending request with status::closed, then
//     joins the worker.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace vendor {

enum class status { ok, not_found, closed };

class kv_client {
public:
    using request_id = std::uint64_t;
    using callback = std::function<void(status, std::string value)>;

    kv_client() : m_worker([this] { work(); }) {}
    ~kv_client() {
        {
            std::lock_guard lock(m_mutex);
            m_closing = true;
        }
        m_wake.notify_one();
        m_worker.join();
    }
    kv_client(const kv_client&) = delete;
    kv_client& operator=(const kv_client&) = delete;

    /// Stores `value`; a get of `key` is answered `latency` after it was made.
    void put(std::string key, std::string value, std::chrono::milliseconds latency = std::chrono::milliseconds(0)) {
        std::lock_guard lock(m_mutex);
        m_store[std::move(key)] = entry{std::move(value), latency};
    }

    /// Looks `key` up; `cb` is called once, on the worker thread.
    request_id get(std::string key, callback cb) {
        std::lock_guard lock(m_mutex);
        auto found = m_store.find(key);
        const auto latency = found == m_store.end() ? std::chrono::milliseconds(0) : found->second.latency;
        const request_id id = m_next_id++;
        m_pending.push_back({id, std::chrono::steady_clock::now() + latency, std::move(key), std::move(cb)});
        m_wake.notify_one();
        return id;
    }

    /// True when the request was withdrawn: its callback will never be called.
    bool cancel(request_id id) {
        std::lock_guard lock(m_mutex);
        auto it = std::find_if(m_pending.begin(), m_pending.end(), [&](const request& r) { return r.id == id; });
        if (it == m_pending.end()) return false;
        m_pending.erase(it);
        return true;
    }

    /// Requests waiting for their answer (neither answered nor cancelled).
    std::size_t pending() const {
        std::lock_guard lock(m_mutex);
        return m_pending.size();
    }
    /// Callbacks that have returned so far.
    std::size_t answered() const noexcept { return m_answered.load(std::memory_order_acquire); }

private:
    struct entry {
        std::string value;
        std::chrono::milliseconds latency{0};
    };
    struct request {
        request_id id;
        std::chrono::steady_clock::time_point due;
        std::string key;
        callback cb;
    };

    void work() {
        std::unique_lock lock(m_mutex);
        for (;;) {
            if (m_closing) break;
            auto first = std::min_element(m_pending.begin(), m_pending.end(),
                                          [](const request& a, const request& b) { return a.due < b.due; });
            if (first == m_pending.end()) {
                m_wake.wait(lock);
                continue;
            }
            if (first->due > std::chrono::steady_clock::now()) {
                m_wake.wait_until(lock, first->due);
                continue;
            }
            // Out of the pending list, cancel() can no longer withdraw it.
            request r = std::move(*first);
            m_pending.erase(first);
            auto found = m_store.find(r.key);
            const status s = found == m_store.end() ? status::not_found : status::ok;
            std::string value = found == m_store.end() ? std::string() : found->second.value;
            lock.unlock();
            r.cb(s, std::move(value));
            m_answered.fetch_add(1, std::memory_order_release);
            lock.lock();
        }
        std::vector<request> left = std::move(m_pending);
        m_pending.clear();
        lock.unlock();
        for (request& r : left) {
            r.cb(status::closed, {});
            m_answered.fetch_add(1, std::memory_order_release);
        }
    }

    mutable std::mutex m_mutex;
    std::condition_variable m_wake;
    std::map<std::string, entry> m_store;
    std::vector<request> m_pending;
    request_id m_next_id = 1;
    bool m_closing = false;
    std::atomic<std::size_t> m_answered{0};
    std::thread m_worker;  // last: it starts once everything above is built
};

}  // namespace vendor
