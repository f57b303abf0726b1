// Loop groups: N loops on N threads, their stop, and cross-loop calls
// (submit_to) with their order, back-pressure, cancellation and lifetimes.
// Also run under ThreadSanitizer (the `threads` suite).
//
// Catch2 assertions are made on the test thread only: loops record what they
// saw in plain variables the test reads after run() has joined them.

#include "support.hpp"

#include <spindle/loop_group.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using spindle::loop_group;
using spindle::loop_group_options;
using spindle::result;
using spindle::task;
using spindle::test::error_of;
using spindle::test::run;

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool slow_build = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
constexpr bool slow_build = true;
#else
constexpr bool slow_build = false;
#endif
#else
constexpr bool slow_build = false;
#endif

loop_group_options group_of(unsigned n) {
    loop_group_options o;
    o.threads = n;
    o.stop_signals = {};
    return o;
}

// Stops the group if a test hangs, so the suite fails instead of hanging.
class watchdog {
public:
    watchdog(loop_group& g, std::chrono::seconds limit) : m_thread([&g, limit, this] {
        const auto until = std::chrono::steady_clock::now() + limit;
        while (!m_done.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
        if (!m_done.load()) {
            m_fired.store(true);
            g.stop();
        }
    }) {}
    ~watchdog() {
        m_done.store(true);
        m_thread.join();
    }
    bool fired() const { return m_fired.load(); }

private:
    std::atomic<bool> m_done{false};
    std::atomic<bool> m_fired{false};
    std::thread m_thread;
};

}  // namespace

TEST_CASE("a loop group runs main on every loop, each on its own thread, and knows its index", "[loop_group]") {
    for (unsigned n : {1u, 2u, 4u}) {
        loop_group g(group_of(n));
        REQUIRE(g.size() == n);
        std::vector<std::size_t> index(n, 99);
        std::vector<std::size_t> size(n, 0);
        std::vector<std::thread::id> thread(n);
        std::vector<char> single_thread(n, 0);
        // No Catch2 assertion on the loops' threads (it is not thread-safe):
        // they record, the test thread checks.
        const int status = g.run([&](std::stop_token) -> task<void> {
            const std::size_t i = loop_group::current_index();
            index[i] = i;
            size[i] = loop_group::current().size();
            thread[i] = std::this_thread::get_id();
            single_thread[i] = spindle::loop::current().options().single_thread;
            co_return;
        });
        CHECK(status == 0);
        for (std::size_t i = 0; i < n; ++i) {
            CHECK(index[i] == i);
            CHECK(size[i] == n);
            CHECK(single_thread[i]);
            CHECK(thread[i] != std::this_thread::get_id());
            for (std::size_t j = 0; j < i; ++j) CHECK(thread[i] != thread[j]);
        }
        CHECK_THROWS_AS(g.run([](std::stop_token) -> task<void> { co_return; }), std::logic_error);
    }
}

TEST_CASE("threads = 0 makes one loop per CPU this process may run on", "[loop_group]") {
    loop_group g(group_of(0));
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
    CHECK(g.size() == static_cast<std::size_t>(CPU_COUNT(&set)));
}

TEST_CASE("loops pinned to CPUs run there", "[loop_group]") {
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
        if (CPU_ISSET(c, &set)) first = c;
    loop_group_options o = group_of(2);
    o.cpus = {first};
    loop_group g(o);
    std::vector<int> cpu(2, -1);
    CHECK(g.run([&](std::stop_token) -> task<void> {
        cpu[loop_group::current_index()] = ::sched_getcpu();
        co_return;
    }) == 0);
    CHECK(cpu[0] == first);
    CHECK(cpu[1] == first);

    loop_group_options bad = group_of(1);
    bad.cpus = {CPU_SETSIZE - 1};
    if (!CPU_ISSET(CPU_SETSIZE - 1, &set)) CHECK_THROWS_AS(loop_group(bad), std::invalid_argument);
}

TEST_CASE("outside a group's loop: no index, and submit_to says why", "[loop_group]") {
    CHECK(loop_group::current_or_null() == nullptr);
    CHECK_THROWS_AS(loop_group::current_index(), std::logic_error);
    spindle::loop l;
    auto body = []() -> task<bool> {
        try {
            (void)co_await spindle::submit_to(0, [] { return 1; });
        } catch (const std::logic_error&) {
            co_return true;
        }
        co_return false;
    };
    CHECK(run(l, body()));
}

TEST_CASE("submit_to gives the value, the result, the void, or the exception of what ran on the other loop",
          "[loop_group][submit_to]") {
    loop_group g(group_of(2));
    struct seen {
        int value = 0;
        std::size_t ran_on = 99;
        std::error_code error;
        bool void_done = false;
        std::string thrown;
        int from_task = 0;
        int self = 0;
        bool out_of_range = false;
    } s;
    const int status = g.run([&](std::stop_token) -> task<void> {
        if (loop_group::current_index() != 0) co_return;
        result<int> v = co_await spindle::submit_to(1, [] { return 6 * 7; });
        s.value = v ? *v : -1;
        result<std::size_t> where = co_await spindle::submit_to(1, [] { return loop_group::current_index(); });
        s.ran_on = where ? *where : 99;
        result<int> failed = co_await spindle::submit_to(1, []() -> result<int> {
            return std::make_error_code(std::errc::no_such_file_or_directory);
        });
        s.error = failed ? std::error_code{} : failed.error();
        result<void> done = co_await spindle::submit_to(1, [&s] { (void)s; });
        s.void_done = static_cast<bool>(done);
        try {
            (void)co_await spindle::submit_to(1, []() -> int { throw std::runtime_error("on loop 1"); });
        } catch (const std::runtime_error& e) {
            s.thrown = e.what();
        }
        result<int> t = co_await spindle::submit_to(1, []() -> task<int> {
            (void)co_await spindle::sleep_for(1ms);
            co_return static_cast<int>(loop_group::current_index()) + 100;
        });
        s.from_task = t ? *t : -1;
        result<int> self = co_await spindle::submit_to(0, [] { return 5; });
        s.self = self ? *self : -1;
        try {
            (void)co_await spindle::submit_to(2, [] { return 0; });
        } catch (const std::out_of_range&) {
            s.out_of_range = true;
        }
    });
    CHECK(status == 0);
    CHECK(s.value == 42);
    CHECK(s.ran_on == 1);
    CHECK(s.error == std::errc::no_such_file_or_directory);
    CHECK(s.void_done);
    CHECK(s.thrown == "on loop 1");
    CHECK(s.from_task == 101);
    CHECK(s.self == 5);
    CHECK(s.out_of_range);
}

TEST_CASE("submit_to_all runs a copy on every loop and gives the outcomes in loop order", "[loop_group][submit_to]") {
    loop_group g(group_of(4));
    std::vector<std::size_t> where;
    std::vector<int> tasks;
    std::string thrown;
    CHECK(g.run([&](std::stop_token) -> task<void> {
        if (loop_group::current_index() != 2) co_return;
        std::vector<result<std::size_t>> r = co_await spindle::submit_to_all([] { return loop_group::current_index(); });
        for (auto& x : r) where.push_back(x ? *x : 99);
        std::vector<result<int>> t = co_await spindle::submit_to_all([]() -> task<int> {
            (void)co_await spindle::sleep_for(1ms);
            co_return static_cast<int>(loop_group::current_index()) * 10;
        });
        for (auto& x : t) tasks.push_back(x ? *x : -1);
        try {
            (void)co_await spindle::submit_to_all([]() -> int {
                if (loop_group::current_index() == 3) throw std::runtime_error("loop 3 refused");
                return 0;
            });
        } catch (const std::runtime_error& e) {
            thrown = e.what();
        }
    }) == 0);
    CHECK(where == std::vector<std::size_t>{0, 1, 2, 3});
    CHECK(tasks == std::vector<int>{0, 10, 20, 30});
    CHECK(thrown == "loop 3 refused");
}

TEST_CASE("a large callable and a large outcome travel too", "[loop_group][submit_to]") {
    loop_group g(group_of(2));
    std::string got;
    CHECK(g.run([&](std::stop_token) -> task<void> {
        if (loop_group::current_index() != 0) co_return;
        std::array<char, 200> big{};
        big.fill('x');
        result<std::string> r = co_await spindle::submit_to(1, [big] { return std::string(big.begin(), big.end()) + "!"; });
        got = r ? *r : "";
    }) == 0);
    CHECK(got == std::string(200, 'x') + "!");
}

namespace {

// One stream of calls from loop `from` to loop `to`: each carries the next
// sequence number; the callee checks they arrive in order, each once.
struct pair_record {
    std::vector<char> ran;          // by the callee: seq ran (count)
    std::uint64_t last = 0;         // by the callee: last seq of a function, 1-based
    std::uint64_t last_task = 0;    // by the callee: last seq of a task
    std::uint64_t out_of_order = 0; // by the callee
    std::vector<char> answered;     // by the caller: seq got its value
    std::uint64_t wrong = 0;        // by the caller: a value that was not seq * 2
    std::uint64_t cancelled = 0;    // by the caller
    std::uint64_t sent = 0;         // by the caller
};

task<void> caller(pair_record& p, std::size_t to, std::uint64_t count, std::uint64_t& next, std::uint32_t seed) {
    std::minstd_rand rng(seed);
    while (next < count) {
        const std::uint64_t seq = ++next;
        ++p.sent;
        const unsigned kind = rng() % 16;
        // Functions run as the callee takes its mail, in order; tasks start in
        // the same order, from the callee's next tick: each kind in order.
        auto on_callee = [&p, seq](bool task) {
            std::uint64_t& last = task ? p.last_task : p.last;
            if (seq <= last) ++p.out_of_order;
            last = seq;
            ++p.ran[seq];
            return seq * 2;
        };
        result<std::uint64_t> r = std::make_error_code(std::errc::invalid_argument);  // replaced below
        if (kind == 0) {
            // A timeout shorter than a round trip, now and then.
            r = co_await spindle::with_timeout(std::chrono::microseconds(rng() % 50),
                                               spindle::submit_to(to, [on_callee] { return on_callee(false); }));
        } else if (kind == 1) {
            // A task on the callee that outlives a short deadline at times.
            const auto nap = std::chrono::microseconds(rng() % 100);
            r = co_await spindle::with_timeout(50us, spindle::submit_to(to, [on_callee, nap]() -> task<std::uint64_t> {
                const std::uint64_t v = on_callee(true);
                (void)co_await spindle::sleep_for(nap);
                co_return v;
            }));
        } else {
            r = co_await spindle::submit_to(to, [on_callee] { return on_callee(false); });
        }
        if (r) {
            p.answered[seq] = 1;
            if (*r != seq * 2) ++p.wrong;
        } else if (r.error() == std::errc::timed_out || r.error() == std::errc::operation_canceled) {
            ++p.cancelled;
        } else {
            ++p.wrong;
        }
    }
}

}  // namespace

TEST_CASE("calls between every pair of loops arrive in order, each once, through random timeouts",
          "[loop_group][submit_to][stress]") {
    for (unsigned n : {2u, 4u}) {
        // A million calls each way between every two loops (and as many from
        // each loop to itself); fewer under the sanitizers, which are slower.
        const std::uint64_t per_pair = slow_build ? 20'000 : 1'000'000;
        INFO(n << " loops, " << per_pair << " calls per ordered pair");
        loop_group_options o = group_of(n);
        o.calls_in_flight = 32;  // small, so callers often wait for a credit
        loop_group g(o);
        std::vector<pair_record> pairs(std::size_t{n} * n);
        for (pair_record& p : pairs) {
            p.ran.assign(per_pair + 1, 0);
            p.answered.assign(per_pair + 1, 0);
        }
        watchdog dog(g, 120s);
        const int status = g.run([&](std::stop_token) -> task<void> {
            const std::size_t me = loop_group::current_index();
            std::vector<task<void>> callers;
            std::vector<std::uint64_t> next(n, 0);
            for (std::size_t to = 0; to < n; ++to)
                for (int c = 0; c < 48; ++c)  // more callers than credits
                    callers.push_back(caller(pairs[me * n + to], to, per_pair, next[to],
                                             static_cast<std::uint32_t>(me * 1000 + to * 100 + c + 1)));
            co_await spindle::when_all(std::move(callers));
        });
        CHECK_FALSE(dog.fired());
        CHECK(status == 0);
        for (std::size_t k = 0; k < pairs.size(); ++k) {
            const pair_record& p = pairs[k];
            INFO("pair " << k / n << " -> " << k % n);
            CHECK(p.sent == per_pair);
            CHECK(p.out_of_order == 0);
            CHECK(p.wrong == 0);
            std::uint64_t answered = 0, twice = 0, lost = 0;
            for (std::uint64_t seq = 1; seq <= per_pair; ++seq) {
                if (p.ran[seq] > 1) ++twice;
                if (p.answered[seq]) {
                    ++answered;
                    if (p.ran[seq] != 1) ++lost;
                }
            }
            CHECK(twice == 0);
            CHECK(lost == 0);
            CHECK(answered + p.cancelled == per_pair);
            CHECK(p.cancelled > 0);
        }
    }
}

TEST_CASE("a caller with every credit in use waits for one; nothing is dropped", "[loop_group][submit_to]") {
    loop_group_options o = group_of(2);
    o.calls_in_flight = 4;
    loop_group g(o);
    std::atomic<bool> callee_blocked{false};
    std::atomic<bool> release{false};
    std::size_t queued_seen = 0;
    std::vector<int> values;
    CHECK(g.run([&](std::stop_token) -> task<void> {
        if (loop_group::current_index() == 1) {
            // Hold loop 1 in one resume: it takes no mail meanwhile.
            co_await spindle::yield();
            callee_blocked.store(true);
            while (!release.load()) std::this_thread::sleep_for(1ms);
            co_return;
        }
        while (!callee_blocked.load()) (void)co_await spindle::sleep_for(1ms);
        std::vector<task<int>> calls;
        for (int i = 0; i < 100; ++i)
            calls.push_back([](int i) -> task<int> {
                result<int> r = co_await spindle::submit_to(1, [i] { return i; });
                co_return r ? *r : -1;
            }(i));
        auto all = spindle::loop::current().spawn(spindle::when_all(std::move(calls)));
        (void)co_await spindle::sleep_for(20ms);
        const std::string dump = spindle::loop::current().dump_tasks();
        for (std::size_t at = dump.find("waiting for a free slot"); at != std::string::npos;
             at = dump.find("waiting for a free slot", at + 1))
            ++queued_seen;
        release.store(true);
        values = co_await all;
    }) == 0);
    CHECK(queued_seen == 96);
    REQUIRE(values.size() == 100);
    for (int i = 0; i < 100; ++i) CHECK(values[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("cancelling a call cancels the task it started on the other loop", "[loop_group][submit_to][cancel]") {
    loop_group g(group_of(2));
    std::atomic<int> remote_outcome{0};  // 1: finished its sleep, 2: saw the cancel
    std::error_code caller_saw;
    std::chrono::milliseconds took{};
    CHECK(g.run([&](std::stop_token stop) -> task<void> {
        if (loop_group::current_index() == 1) {
            // Stay until loop 0 is done, so the cancel finds the task running.
            (void)co_await spindle::sleep_for(10s, stop);
            co_return;
        }
        const auto start = std::chrono::steady_clock::now();
        result<int> r = co_await spindle::with_timeout(20ms, spindle::submit_to(1, [&remote_outcome]() -> task<int> {
            std::error_code e = error_of(co_await spindle::sleep_for(10s));
            remote_outcome.store(e ? 2 : 1);
            co_return 1;
        }));
        took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
        caller_saw = r ? std::error_code{} : r.error();
        for (int i = 0; i < 2000 && remote_outcome.load() == 0; ++i) (void)co_await spindle::sleep_for(1ms);
        loop_group::current().stop();
    }) == 0);
    CHECK(caller_saw == std::errc::timed_out);
    CHECK(took < 5s);
    CHECK(remote_outcome.load() == 2);
}

TEST_CASE("stop() from another thread ends every main; loops go with their parked tasks", "[loop_group][stop]") {
    for (unsigned n : {2u, 4u}) {
        loop_group g(group_of(n));
        std::atomic<unsigned> parked{0};
        std::vector<std::error_code> woke(n);
        std::thread stopper([&] {
            while (parked.load() < n) std::this_thread::sleep_for(1ms);
            std::this_thread::sleep_for(10ms);
            g.stop();
        });
        const int status = g.run([&](std::stop_token stop) -> task<void> {
            const std::size_t me = loop_group::current_index();
            // Left parked when the loop goes: a sleeper, and a call to the
            // next loop that never answers (its task sleeps for an hour).
            spindle::loop::current().spawn([]() -> task<void> { (void)co_await spindle::sleep_for(1h); }()).detach();
            spindle::loop::current()
                .spawn([](std::size_t to) -> task<void> {
                    (void)co_await spindle::submit_to(to, []() -> task<int> {
                        (void)co_await spindle::sleep_for(1h);
                        co_return 0;
                    });
                }((me + 1) % n))
                .detach();
            parked.fetch_add(1);
            woke[me] = error_of(co_await spindle::sleep_for(1h, stop));
        });
        stopper.join();
        CHECK(status == 0);
        for (const std::error_code& e : woke) CHECK(e == std::errc::operation_canceled);
    }
}

TEST_CASE("a main that fails stops the group: its status, or its exception, comes out of run()", "[loop_group][stop]") {
    {
        loop_group g(group_of(3));
        const int status = g.run([](std::stop_token stop) -> task<int> {
            if (loop_group::current_index() == 2) co_return 3;
            (void)co_await spindle::sleep_for(1h, stop);
            co_return 0;
        });
        CHECK(status == 3);
    }
    {
        loop_group g(group_of(2));
        CHECK_THROWS_WITH(g.run([](std::stop_token stop) -> task<void> {
            if (loop_group::current_index() == 1) throw std::runtime_error("main failed");
            (void)co_await spindle::sleep_for(1h, stop);
        }),
                          "main failed");
    }
}

TEST_CASE("stop() before run(): every main starts stopped", "[loop_group][stop]") {
    loop_group g(group_of(2));
    g.stop();
    std::vector<char> stopped(2, 0);  // not vector<bool>: two loops write two of its elements
    CHECK(g.run([&](std::stop_token stop) -> task<void> {
        stopped[loop_group::current_index()] = stop.stop_requested();
        co_return;
    }) == 0);
    CHECK(stopped[0]);
    CHECK(stopped[1]);
}

TEST_CASE("SIGTERM stops the whole group once; every loop closes up and run() returns 0", "[loop_group][signals]") {
    loop_group_options o = group_of(4);
    o.stop_signals = {SIGINT, SIGTERM};
    loop_group g(o);
    std::atomic<unsigned> ready{0};
    std::vector<int> cleaned(4, 0);
    std::thread sender([&] {
        // A thread started before run() must block the group's signals
        // itself (the group blocks them in the threads it starts), or the
        // process-wide SIGTERM may be delivered to it.
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGTERM);
        sigaddset(&set, SIGINT);
        ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
        while (ready.load() < 4) std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(20ms);  // loop 0 waits for the signal by now
        ::kill(::getpid(), SIGTERM);
    });
    const int status = g.run([&](std::stop_token stop) -> task<void> {
        ready.fetch_add(1);
        (void)co_await spindle::sleep_for(1h, stop);
        // What a service does on the way out: its own closing work.
        (void)co_await spindle::sleep_for(1ms);
        cleaned[loop_group::current_index()] = 1;
    });
    sender.join();
    CHECK(status == 0);
    for (int c : cleaned) CHECK(c == 1);
}

// Built with -Wextra -Werror: g++ 12 warns of every member without a default
// initializer that a designated initializer leaves out.
TEST_CASE("loop_group_options take designated initializers, as the docs write them", "[loop_group]") {
    const spindle::loop_group_options o{.threads = 2};
    CHECK(o.threads == 2);
    CHECK(o.cpus.empty());
}
