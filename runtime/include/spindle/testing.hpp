#pragma once
/// Helpers for testing async code with any test framework (Catch2 included):
///
///     TEST_CASE("a retry gives up after a minute") {
///         auto r = spindle::testing::run(retry_for(60s));  // virtual time: microseconds
///         CHECK(r == std::errc::timed_out);
///     }
///
/// run() gives the task a fresh loop (virtual time by default, see
/// loop_options::virtual_time), runs it to completion and returns its value or
/// rethrows its exception. It fails with std::runtime_error, naming what every
/// task waits on, when the task is still running after the watchdog's real
/// time, or when it finished but left other tasks alive (a leak).

#include <spindle/loop.hpp>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>

namespace spindle::testing {

struct run_options {
    /// Real time the task gets before the test fails.
    std::chrono::milliseconds watchdog = std::chrono::seconds(10);
    bool virtual_time = true;
    /// Fail if tasks other than the one run are still alive at its end.
    bool check_leaks = true;
    loop_options loop{};
};

template <class T>
T run(task<T> t, run_options options = {}) {
    options.loop.virtual_time = options.virtual_time;
    loop l(options.loop);

    // The watchdog runs on a thread of its own, in real time: under virtual
    // time the loop's clock says nothing about how long the test has taken.
    std::mutex m;
    std::condition_variable cv;
    bool finished = false;
    bool fired = false;
    std::thread watchdog([&] {
        std::unique_lock lock(m);
        if (cv.wait_for(lock, options.watchdog, [&] { return finished; })) return;
        fired = true;
        l.post([&l] { l.stop(); });
    });
    auto stop_watchdog = [&] {
        {
            std::lock_guard lock(m);
            finished = true;
        }
        cv.notify_one();
        watchdog.join();
    };

    using value_type = std::conditional_t<std::is_void_v<T>, bool, T>;
    std::optional<value_type> value;
    std::exception_ptr error;
    auto body = [&](task<T> inner) -> task<void> {
        try {
            if constexpr (std::is_void_v<T>) {
                co_await std::move(inner);
                value.emplace(true);
            } else {
                value.emplace(co_await std::move(inner));
            }
        } catch (...) {
            error = std::current_exception();
        }
    };
    try {
        l.block_on(body(std::move(t)));
    } catch (const std::system_error&) {
        // Stopped by the watchdog: reported below.
    }
    stop_watchdog();
    if (fired || (!value && !error))
        throw std::runtime_error("spindle::testing::run: the task is still running after " +
                                 std::to_string(options.watchdog.count()) + " ms\n" + l.dump_tasks());
    if (options.check_leaks && l.task_count() != 0)
        throw std::runtime_error("spindle::testing::run: the task finished but left tasks alive\n" + l.dump_tasks());
    if (error) std::rethrow_exception(error);
    if constexpr (!std::is_void_v<T>) return std::move(*value);
}

}  // namespace spindle::testing
