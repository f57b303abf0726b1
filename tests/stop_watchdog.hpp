#pragma once
// A watchdog for tests of loops fed by other threads: if the loop is still
// running after `limit`, it stops it (again and again, from its own thread:
// itself a cross-thread stop), so a lost wake-up fails the test instead of
// hanging the suite.

#include <spindle/loop.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace spindle::test {

class stop_watchdog {
public:
    stop_watchdog(spindle::loop& l, std::chrono::milliseconds limit)
        : m_loop(l), m_limit(limit), m_thread([this] { watch(); }) {}
    ~stop_watchdog() { finish(); }
    stop_watchdog(const stop_watchdog&) = delete;
    stop_watchdog& operator=(const stop_watchdog&) = delete;

    /// Ends the watch; returns whether the watchdog had to stop the loop.
    bool finish() {
        {
            std::lock_guard lock(m_mutex);
            m_done = true;
        }
        m_cv.notify_all();
        if (m_thread.joinable()) m_thread.join();
        return m_fired;
    }

private:
    void watch() {
        std::unique_lock lock(m_mutex);
        if (m_cv.wait_for(lock, m_limit, [this] { return m_done; })) return;
        m_fired = true;
        for (int i = 0; i < 600 && !m_done; ++i) {
            m_loop.stop();
            m_cv.wait_for(lock, std::chrono::milliseconds(100), [this] { return m_done; });
        }
    }

    spindle::loop& m_loop;
    std::chrono::milliseconds m_limit;
    std::mutex m_mutex;
    std::condition_variable m_cv;
    bool m_done = false;
    bool m_fired = false;
    std::thread m_thread;  // last: starts once the rest exists
};

}  // namespace spindle::test
