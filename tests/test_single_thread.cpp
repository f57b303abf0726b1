// Loops with loop_options::single_thread (every loop of a loop_group): built,
// run and destroyed on one thread, fed by others only through post, stop and
// holds. On io_uring the ring is then single-issuer with deferred task work
// where the kernel has them. Also run under ThreadSanitizer.

#include "support.hpp"

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

using namespace std::chrono_literals;
using spindle::loop;
using spindle::task;

TEST_CASE("a single-thread loop sleeps, and wakes for a post from another thread", "[single_thread][threads]") {
    std::atomic<int> ran{0};
    std::atomic<bool> built{false};
    std::atomic<spindle::loop*> where{nullptr};
    std::thread owner([&] {
        spindle::loop_options options;
        options.single_thread = true;
        loop l(options);
        where.store(&l);
        loop::hold keep(l);
        l.spawn([](std::atomic<bool>& built) -> task<void> {
            co_await spindle::sleep_for(1ms);
            built.store(true);
        }(built)).detach();
        l.run();
    });
    while (!where.load()) std::this_thread::yield();
    while (!built.load()) std::this_thread::sleep_for(1ms);
    // The loop sleeps in the kernel now: a post must wake it.
    where.load()->post([&ran] { ran.fetch_add(1); });
    for (int i = 0; i < 5000 && ran.load() == 0; ++i) std::this_thread::sleep_for(1ms);
    CHECK(ran.load() == 1);
    where.load()->stop();
    owner.join();
}
