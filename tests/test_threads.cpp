// Loops fed by other threads: post, stop, loop::hold, native_handle and
// loop_thread. Also run under ThreadSanitizer (the `threads` suite).
//
// Catch2 assertions are made on the test thread only: other threads record
// what they saw in atomics (or in variables the test reads after joining them).

#include "stop_watchdog.hpp"
#include "support.hpp"

#include <poll.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <ctime>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using spindle::loop;
using spindle::task;
using spindle::test::stop_watchdog;

namespace {

pid_t this_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

/// The scheduler state of a thread of this process ('R', 'S', ...), or 0 if it is gone.
char thread_state(pid_t tid) {
    std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
    std::string line;
    if (!in || !std::getline(in, line)) return 0;
    auto close = line.rfind(')');
    if (close == std::string::npos || close + 2 >= line.size()) return 0;
    return line[close + 2];
}

bool thread_exists(pid_t tid) { return thread_state(tid) != 0; }

/// Holds the calling thread in a wait that work the kernel queues for it does
/// not end: vfork()'s wait for its child, which sleeps for `d`. A thread that
/// computes without making a syscall is held the same way, for a scheduler
/// tick at a time; this makes it last. (Under ThreadSanitizer vfork() is a
/// fork(): nothing is held, and the tests below prove nothing there.)
void hold_in_kernel(std::chrono::milliseconds d) {
    const pid_t child = ::vfork();
    if (child == 0) {
        const ::timespec ts{static_cast<time_t>(d.count() / 1000), static_cast<long>(d.count() % 1000) * 1'000'000};
        ::syscall(SYS_nanosleep, &ts, nullptr);
        ::_exit(0);
    }
    int status = 0;
    if (child > 0) ::waitpid(child, &status, 0);
}

double ms_since(spindle::clock::time_point t) {
    return std::chrono::duration<double, std::milli>(spindle::clock::now() - t).count();
}

/// The time from post() on this thread until the callback runs on the loop.
double post_round_trip_ms(loop& l) {
    std::promise<void> ran;
    auto done = ran.get_future();
    const auto posted = spindle::clock::now();
    l.post([&ran] { ran.set_value(); });
    if (done.wait_for(30s) != std::future_status::ready) return 30'000;
    return ms_since(posted);
}


// --- loop_thread tasks ----------------------------------------------------------------

task<void> doubler(int x, std::promise<int> result, std::promise<std::thread::id> where) {
    (void)co_await spindle::sleep_for(1ms);  // really park once on the loop
    co_await spindle::yield();
    where.set_value(std::this_thread::get_id());
    result.set_value(2 * x);
}

task<void> forever(std::atomic<long>& ticks) {
    for (long i = 0; i < 10'000'000; ++i) {
        ticks.fetch_add(1, std::memory_order_relaxed);
        (void)co_await spindle::sleep_for(1ms);
    }
}

task<void> sleeper(std::promise<void> started, std::atomic<int>& woke) {
    spindle::test::counted alive_while_parked;
    started.set_value();
    (void)co_await spindle::sleep_for(std::chrono::hours(1));
    woke.fetch_add(1);
}

task<void> sleepy(std::atomic<bool>& finished) {
    (void)co_await spindle::sleep_for(2s);
    finished = true;
}

task<void> spinner(const std::atomic<bool>& quit, std::atomic<long>& spins) {
    for (long i = 0; i < 100'000'000 && !quit.load(std::memory_order_relaxed); ++i) {
        spins.fetch_add(1, std::memory_order_relaxed);
        co_await spindle::yield();
    }
}

}  // namespace

// =====================================================================================

TEST_CASE("threads: posts from 4 threads run exactly once, in order per producer", "[threads]") {
    constexpr int producers = 4;
    constexpr int per_producer = 100'000;

    // Touched on the loop thread (this one) only.
    std::array<long, producers> runs{};
    std::array<long, producers> last{-1, -1, -1, -1};
    std::array<long, producers> out_of_order{};
    long total = 0;
    int producers_done = 0;
    pid_t wrong_thread = 0;
    const pid_t loop_tid = this_tid();

    loop l;
    std::optional<loop::hold> hold(std::in_place, l);
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int p = 0; p < producers; ++p) {
        threads.emplace_back([&, p] {
            while (!go.load()) std::this_thread::yield();
            for (long i = 0; i < per_producer; ++i) {
                l.post([&, p, i] {
                    if (this_tid() != loop_tid) wrong_thread = this_tid();
                    ++runs[p];
                    ++total;
                    if (last[p] + 1 != i) ++out_of_order[p];
                    last[p] = i;
                });
            }
            // FIFO per producer: this runs after all of this producer's posts.
            l.post([&] {
                if (++producers_done == producers) hold.reset();
            });
        });
    }
    go = true;
    stop_watchdog watchdog(l, 100s);
    l.run();
    const bool stopped_by_watchdog = watchdog.finish();
    for (auto& t : threads) t.join();

    CHECK_FALSE(stopped_by_watchdog);
    CHECK(producers_done == producers);
    CHECK(total == long{producers} * per_producer);
    for (int p = 0; p < producers; ++p) {
        CAPTURE(p);
        CHECK(runs[p] == per_producer);
        CHECK(last[p] == per_producer - 1);
        CHECK(out_of_order[p] == 0);
    }
    CHECK(wrong_thread == 0);
    CHECK_FALSE(l.has_work());
}

TEST_CASE("threads: a post wakes a loop asleep in poll with no timers", "[threads]") {
    loop l;
    std::optional<loop::hold> hold(std::in_place, l);
    REQUIRE_FALSE(l.time_to_next_deadline().has_value());  // nothing but I/O can wake it

    const pid_t loop_tid = this_tid();
    char state_at_post = '?';
    bool ran = false;
    pid_t ran_on = 0;
    std::thread poster([&] {
        std::this_thread::sleep_for(50ms);
        // The loop thread should be blocked by now; give it a bounded while.
        for (int i = 0; i < 200; ++i) {
            state_at_post = thread_state(loop_tid);
            if (state_at_post == 'S') break;
            std::this_thread::sleep_for(5ms);
        }
        l.post([&] {
            ran = true;
            ran_on = this_tid();
            hold.reset();
        });
    });
    stop_watchdog watchdog(l, 10s);
    l.run();
    const bool stopped_by_watchdog = watchdog.finish();
    poster.join();

    CHECK(state_at_post == 'S');  // asleep (in epoll), not spinning
    CHECK_FALSE(stopped_by_watchdog);
    CHECK(ran);
    CHECK(ran_on == loop_tid);
}

TEST_CASE("threads: stop() from another thread makes run() return", "[threads]") {
    loop l;
    std::optional<loop::hold> hold(std::in_place, l);

    SECTION("while the loop sleeps") {
        std::atomic<bool> stop_called{false};
        std::thread stopper([&] {
            std::this_thread::sleep_for(50ms);
            stop_called = true;
            l.stop();
        });
        stop_watchdog watchdog(l, 10s);
        l.run();
        const bool stopped_by_watchdog = watchdog.finish();
        stopper.join();
        CHECK(stop_called.load());  // run() did not return on its own
        CHECK_FALSE(stopped_by_watchdog);
        CHECK(l.has_work());  // the hold is still there: only stop() ended run()
    }
    SECTION("while a task keeps the loop busy") {
        std::atomic<bool> quit{false};
        std::atomic<long> spins{0};
        auto h = l.spawn(spinner(quit, spins));
        std::atomic<bool> stop_called{false};
        std::thread stopper([&] {
            std::this_thread::sleep_for(50ms);
            stop_called = true;
            l.stop();
        });
        stop_watchdog watchdog(l, 10s);
        l.run();
        const bool stopped_by_watchdog = watchdog.finish();
        stopper.join();
        CHECK(stop_called.load());
        CHECK_FALSE(stopped_by_watchdog);
        CHECK_FALSE(h.done());
        CHECK(spins.load() > 0);
        h.abort();  // it borrows this section's locals
        CHECK(h.done());
    }

    // run() can be used again after a stop: it goes on until the work is done.
    bool ran = false;
    std::thread releaser([&] {
        l.post([&] {
            ran = true;
            hold.reset();
        });
    });
    releaser.join();
    stop_watchdog watchdog(l, 10s);
    l.run();
    CHECK_FALSE(watchdog.finish());
    CHECK(ran);
    CHECK_FALSE(l.has_work());
}

TEST_CASE("threads: stop() from another thread makes block_on() return", "[threads]") {
    // loop.hpp: stop() "makes run() and block_on() return after the current tick".
    loop l;
    std::atomic<bool> finished{false};
    std::atomic<bool> stop_called{false};
    std::thread stopper([&] {
        std::this_thread::sleep_for(50ms);
        stop_called = true;
        l.stop();
    });
    try {
        l.block_on(sleepy(finished));
    } catch (...) {
        // Returning by an exception is fine too: what matters is when.
    }
    stopper.join();
    CHECK(stop_called.load());
    CHECK_FALSE(finished.load());  // block_on came back before its task ended
}

TEST_CASE("threads: native_handle turns readable when another thread posts", "[threads]") {
    // A host folds the loop into its own poller: tick, then wait on native_handle.
    loop l;
    if (!spindle::test::has_native_handle(l)) return;
    l.poll();
    ::pollfd pfd{l.native_handle(), POLLIN, 0};
    REQUIRE(::poll(&pfd, 1, 0) == 0);  // nothing to do yet
    REQUIRE_FALSE(l.time_to_next_deadline().has_value());  // so a host would wait without limit

    std::atomic<bool> ran{false};
    std::thread poster([&] {
        std::this_thread::sleep_for(20ms);
        l.post([&] { ran = true; });
    });
    pfd.revents = 0;
    const int n = ::poll(&pfd, 1, 3000);  // bounded here; a host would wait forever
    poster.join();
    CHECK(n == 1);
    CHECK((pfd.revents & POLLIN) != 0);

    for (int i = 0; i < 10 && !ran.load(); ++i) l.poll();
    CHECK(ran.load());
}

TEST_CASE("threads: loop_thread runs tasks spawned and callbacks posted from other threads", "[threads][loop_thread]") {
    constexpr int spawners = 3;
    constexpr int tasks_each = 10;
    constexpr int posters = 4;
    constexpr int posts_each = 1000;

    std::vector<std::future<int>> results;
    std::vector<std::future<std::thread::id>> places;
    std::thread::id loop_id;
    long posted_runs = 0;  // loop thread only, read through a future
    std::vector<std::thread> threads;
    {
        spindle::loop_thread lt;
        loop_id = lt.thread_id();
        CHECK(loop_id != std::this_thread::get_id());

        // Futures are made here, promises travel into the tasks.
        std::vector<std::vector<std::promise<int>>> rp(spawners);
        std::vector<std::vector<std::promise<std::thread::id>>> wp(spawners);
        for (int s = 0; s < spawners; ++s) {
            for (int i = 0; i < tasks_each; ++i) {
                rp[s].emplace_back();
                wp[s].emplace_back();
                results.push_back(rp[s].back().get_future());
                places.push_back(wp[s].back().get_future());
            }
        }
        for (int s = 0; s < spawners; ++s) {
            threads.emplace_back([&lt, &rp, &wp, s] {
                for (int i = 0; i < tasks_each; ++i)
                    lt.spawn(doubler(s * 100 + i, std::move(rp[s][i]), std::move(wp[s][i])), "doubler");
            });
        }
        for (int p = 0; p < posters; ++p) {
            threads.emplace_back([&lt, &posted_runs] {
                for (int i = 0; i < posts_each; ++i) lt.post([&posted_runs] { ++posted_runs; });
            });
        }
        for (auto& t : threads) t.join();
        // Posted after every producer finished: runs after all their posts.
        std::promise<long> count;
        auto counted_posts = count.get_future();
        lt.post([&posted_runs, &count] { count.set_value(posted_runs); });
        REQUIRE(counted_posts.wait_for(30s) == std::future_status::ready);
        CHECK(counted_posts.get() == long{posters} * posts_each);

        for (int s = 0; s < spawners; ++s) {
            for (int i = 0; i < tasks_each; ++i) {
                auto& f = results[static_cast<std::size_t>(s * tasks_each + i)];
                REQUIRE(f.wait_for(30s) == std::future_status::ready);
                CHECK(f.get() == 2 * (s * 100 + i));
            }
        }
        for (auto& f : places) {
            REQUIRE(f.wait_for(30s) == std::future_status::ready);
            CHECK(f.get() == loop_id);
        }
    }
}

TEST_CASE("threads: loop_thread's destructor stops and joins its thread", "[threads][loop_thread]") {
    std::atomic<long> ticks{0};
    pid_t loop_tid = 0;
    {
        spindle::loop_thread lt;
        std::promise<pid_t> tid;
        auto tid_future = tid.get_future();
        lt.post([&tid] { tid.set_value(this_tid()); });
        REQUIRE(tid_future.wait_for(30s) == std::future_status::ready);
        loop_tid = tid_future.get();
        CHECK(thread_exists(loop_tid));
        lt.spawn(forever(ticks), "forever");  // never ends by itself
        for (int i = 0; i < 2000 && ticks.load() < 3; ++i) std::this_thread::sleep_for(1ms);
        REQUIRE(ticks.load() >= 3);
    }
    // The thread is gone (the kernel may list it a moment after the join) and
    // nothing of the loop runs any more.
    for (int i = 0; i < 2000 && thread_exists(loop_tid); ++i) std::this_thread::sleep_for(1ms);
    CHECK_FALSE(thread_exists(loop_tid));
    const long after = ticks.load();
    std::this_thread::sleep_for(20ms);
    CHECK(ticks.load() == after);
}

TEST_CASE("threads: a loop_thread destroyed with parked tasks destroys their frames", "[threads][loop_thread]") {
    constexpr int parked = 8;
    const int base = spindle::test::counted::alive;
    std::atomic<int> woke{0};
    auto started_at = spindle::clock::now();
    {
        spindle::loop_thread lt;
        std::vector<std::future<void>> started;
        for (int i = 0; i < parked; ++i) {
            std::promise<void> p;
            started.push_back(p.get_future());
            lt.spawn(sleeper(std::move(p), woke), "sleeper");
        }
        for (auto& f : started) REQUIRE(f.wait_for(30s) == std::future_status::ready);
        // The futures order the counted constructions (on the loop thread) before this read.
        CHECK(spindle::test::counted::alive - base == parked);
        started_at = spindle::clock::now();
    }
    const auto took = spindle::clock::now() - started_at;
    CHECK(spindle::test::counted::alive == base);  // every parked frame was destroyed
    CHECK(woke.load() == 0);                       // ... without running on
    // Promptly: nowhere near the hour the tasks were sleeping for.
    CHECK(std::chrono::duration_cast<std::chrono::milliseconds>(took).count() < 30'000);
}

// io_uring runs a request's completion as task work of the thread that made
// the request; under COOP_TASKRUN that waits until the thread enters the
// kernel. Whatever a loop waits on must be made by the thread that runs it.

TEST_CASE("threads: posts reach a loop_thread at once while the thread that made it is held", "[threads][loop_thread]") {
    spindle::loop_thread lt;
    double latency = 0;
    std::thread poster([&] {
        std::this_thread::sleep_for(300ms);  // the constructing thread is held by then
        latency = post_round_trip_ms(lt.get());
    });
    hold_in_kernel(2000ms);
    poster.join();
    INFO("post round trip " << latency << " ms while the constructing thread was held for 2000 ms");
    CHECK(latency < 1000);
}

TEST_CASE("threads: a loop built on one thread and run on another serves posts and watchers at once", "[threads]") {
    spindle::test::socket_pair pair;  // outlives the loop
    std::unique_ptr<loop> l;
    std::atomic<long> fired{0};
    std::unique_ptr<spindle::watcher> w;
    std::promise<void> built;
    std::thread builder([&] {
        l = std::make_unique<loop>();
        // Made outside any tick: its poll request is this thread's.
        w = std::make_unique<spindle::watcher>(
            *l, pair.a, spindle::readable,
            [](void* context) { static_cast<std::atomic<long>*>(context)->fetch_add(1); }, &fired);
        built.set_value();
        hold_in_kernel(2000ms);
    });
    built.get_future().wait();
    std::optional<loop::hold> hold(std::in_place, *l);
    std::thread runner([&] { l->run(); });

    std::this_thread::sleep_for(300ms);
    const double post_ms = post_round_trip_ms(*l);
    const auto written = spindle::clock::now();
    REQUIRE(::send(pair.b, "x", 1, MSG_NOSIGNAL) == 1);
    for (int i = 0; i < 30'000 && fired.load() == 0; ++i) std::this_thread::sleep_for(100us);
    const double watcher_ms = ms_since(written);

    std::promise<void> released;
    l->post([&] {
        w.reset();
        hold.reset();
        released.set_value();
    });
    released.get_future().wait();
    runner.join();
    builder.join();
    INFO("post " << post_ms << " ms, watcher " << watcher_ms << " ms while the building thread was held for 2000 ms");
    CHECK(post_ms < 1000);
    CHECK(fired.load() >= 1);
    CHECK(watcher_ms < 1000);
}

TEST_CASE("threads: a loop outlives the thread that built and ran it; its waits carry on", "[threads]") {
    // The kernel cancels an exiting thread's requests: what the loop waits on
    // must be made again, not reported as cancelled.
    spindle::test::socket_pair watched;
    spindle::test::socket_pair read_from;
    std::unique_ptr<loop> l;
    std::atomic<long> fired{0};
    std::unique_ptr<spindle::watcher> w;
    long received = 0;  // the recv's result; touched by whichever thread runs the loop
    std::optional<spindle::join_handle<void>> reader;
    std::thread builder([&] {
        l = std::make_unique<loop>();
        w = std::make_unique<spindle::watcher>(
            *l, watched.a, spindle::readable,
            [](void* context) { static_cast<std::atomic<long>*>(context)->fetch_add(1); }, &fired);
        reader.emplace(l->spawn([](int fd, long& out) -> task<void> {
            std::array<std::byte, 8> buf{};
            auto got = co_await spindle::recv(fd, buf);
            out = got ? static_cast<long>(*got) : -static_cast<long>(got.error().value());
        }(read_from.a, received)));
        spindle::test::settle(*l);  // the recv is in the kernel, made by this thread
    });
    builder.join();
    spindle::test::settle(*l);

    REQUIRE(::send(watched.b, "x", 1, MSG_NOSIGNAL) == 1);
    REQUIRE(::send(read_from.b, "abc", 3, MSG_NOSIGNAL) == 3);
    CHECK(spindle::test::run_until(*l, [&] { return fired.load() >= 1 && reader->done(); }));
    CHECK(fired.load() >= 1);
    CHECK(w->active());
    REQUIRE(reader->done());
    CHECK(received == 3);  // not -ECANCELED
    w.reset();
    reader.reset();
}

TEST_CASE("threads: a loop returns from run() and is destroyed while another thread releases its last hold", "[threads][hold]") {
    // The loop may see the work end as soon as the count drops, return and be
    // destroyed while the releasing thread is still inside ~hold() (or post()).
    constexpr int rounds = 200;
    int finished = 0;
    int timed_out = 0;
    SECTION("~hold on another thread") {
        for (int i = 0; i < rounds; ++i) {
            auto l = std::make_unique<loop>();
            std::optional<loop::hold> hold(std::in_place, *l);
            std::atomic<bool> go{false};
            std::thread releaser([&] {
                while (!go.load()) std::this_thread::yield();
                hold.reset();
            });
            go = true;
            const auto give_up = spindle::clock::now() + 10s;
            bool late = false;
            while (l->poll()) {
                if (spindle::clock::now() > give_up) {
                    late = true;
                    break;
                }
            }
            if (late) {
                releaser.join();  // then the loop must outlive it
                ++timed_out;
            }
            l.reset();  // the releaser may still be inside ~hold()
            if (!late) releaser.join();
            ++finished;
        }
    }
    SECTION("post() on another thread, whose callback releases the hold") {
        for (int i = 0; i < rounds; ++i) {
            auto l = std::make_unique<loop>();
            std::optional<loop::hold> hold(std::in_place, *l);  // touched on this thread only
            std::atomic<bool> go{false};
            loop* target = l.get();
            std::thread poster([&go, target, &hold] {
                while (!go.load()) std::this_thread::yield();
                target->post([&hold] { hold.reset(); });
            });
            go = true;
            const auto give_up = spindle::clock::now() + 10s;
            bool late = false;
            while (l->poll()) {
                if (spindle::clock::now() > give_up) {
                    late = true;
                    break;
                }
            }
            if (late) {
                poster.join();
                ++timed_out;
            }
            l.reset();  // the poster may still be inside post()
            if (!late) poster.join();
            ++finished;
        }
    }
    CHECK(finished == rounds);
    CHECK(timed_out == 0);
}
