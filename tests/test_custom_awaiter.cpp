// The custom awaiter of docs/examples/custom_awaiter: a third-party callback
// API answering on its own thread, wrapped on the park protocol. Values and
// errors; with_timeout, stop tokens and join_handle::cancel; a cancel that
// comes after the answer (the value wins); abort and loop destruction while
// parked, also with the answer already posted to the loop (the late answer
// must find nobody: run under ASan); the dump's line.

#include "support.hpp"

#include "../docs/examples/custom_awaiter/kv_get.hpp"

#include <chrono>
#include <cstddef>
#include <memory>
#include <random>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using example::kv_errc;
using example::kv_get;
using spindle::join_handle;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::test::counted;
using spindle::test::run;
using spindle::test::run_until;
using spindle::test::settle;

namespace {

task<result<std::string>> fetch(vendor::kv_client& client, std::string key, std::stop_token token = {}) {
    co_return co_await kv_get(client, std::move(key), std::move(token));
}

/// Like fetch, with a local that proves the frame was destroyed.
task<result<std::string>> fetch_counted(vendor::kv_client& client, std::string key) {
    counted local;
    co_return co_await kv_get(client, std::move(key));
}

task<void> stop_after(std::stop_source& source, std::chrono::milliseconds d) {
    (void)co_await spindle::sleep_for(d);
    source.request_stop();
}

/// The result of a finished task (run the loop until it is done first).
result<std::string> result_of(loop& l, join_handle<result<std::string>>& h) {
    REQUIRE(h.done());
    return l.block_on([](join_handle<result<std::string>>& handle) -> task<result<std::string>> {
        co_return co_await handle;
    }(h));
}

/// Waits, without running the loop, until the vendor has answered `n`
/// requests in all: its answer is then posted to the loop, not run yet.
bool answered(const vendor::kv_client& client, std::size_t n) {
    const auto give_up = std::chrono::steady_clock::now() + 5s;
    while (client.answered() < n) {
        if (std::chrono::steady_clock::now() > give_up) return false;
        std::this_thread::sleep_for(1ms);
    }
    return true;
}

const spindle::task_info* find_task(const std::vector<spindle::task_info>& all, std::uint64_t id) {
    for (const auto& t : all)
        if (t.id == id) return &t;
    return nullptr;
}

}  // namespace

TEST_CASE("kv_get gives the value, or the vendor's not-found as kv_errc::not_found", "[custom_awaiter]") {
    vendor::kv_client client;
    client.put("greeting", "hello", 5ms);
    client.put("now", "at once");
    loop l;
    auto r = run(l, fetch(client, "greeting"));
    REQUIRE(r.has_value());
    CHECK(*r == "hello");
    CHECK(*run(l, fetch(client, "now")) == "at once");
    auto missing = run(l, fetch(client, "missing"));
    CHECK(missing.error() == kv_errc::not_found);
    CHECK(missing.error().message() == "no such key");
    CHECK(client.pending() == 0);
}

TEST_CASE("with_timeout around a slow kv_get gives timed_out and withdraws the request", "[custom_awaiter][timeout]") {
    vendor::kv_client client;
    client.put("slow", "too late", 10s);
    loop l;
    const auto start = std::chrono::steady_clock::now();
    auto r = run(l, [](vendor::kv_client& c) -> task<result<std::string>> {
        co_return co_await spindle::with_timeout(50ms, kv_get(c, "slow"));
    }(client));
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(r.error() == std::errc::timed_out);
    CHECK(took >= 50ms);
    CHECK(took < 2s);
    CHECK(client.pending() == 0);
}

TEST_CASE("with_timeout reaches a kv_get nested in awaited tasks", "[custom_awaiter][timeout]") {
    vendor::kv_client client;
    client.put("slow", "too late", 10s);
    loop l;
    auto r = run(l, [](vendor::kv_client& c) -> task<result<std::string>> {
        co_return co_await spindle::with_timeout(30ms, [](vendor::kv_client& inner) -> task<result<std::string>> {
            co_return co_await fetch(inner, "slow");
        }(c));
    }(client));
    CHECK(r.error() == std::errc::timed_out);
    CHECK(client.pending() == 0);
}

TEST_CASE("a stop request cancels kv_get with operation_canceled", "[custom_awaiter][cancel]") {
    vendor::kv_client client;
    client.put("slow", "too late", 10s);
    loop l;

    SECTION("while parked") {
        std::stop_source source;
        auto stopper = l.spawn(stop_after(source, 20ms));
        auto r = run(l, fetch(client, "slow", source.get_token()));
        CHECK(r.error() == std::errc::operation_canceled);
    }
    SECTION("before the wait: it completes at once") {
        std::stop_source source;
        source.request_stop();
        auto r = run(l, fetch(client, "slow", source.get_token()));
        CHECK(r.error() == std::errc::operation_canceled);
        CHECK(client.answered() == 0);
    }
    CHECK(client.pending() == 0);
}

TEST_CASE("join_handle::cancel cancels a task parked on kv_get", "[custom_awaiter][cancel]") {
    vendor::kv_client client;
    client.put("slow", "too late", 10s);
    loop l;
    auto h = l.spawn(fetch(client, "slow"), "reader");
    settle(l);
    REQUIRE(client.pending() == 1);
    h.cancel();
    REQUIRE(run_until(l, [&] { return h.done(); }));
    CHECK(result_of(l, h).error() == std::errc::operation_canceled);
    CHECK(client.pending() == 0);
}

TEST_CASE("a cancel after the vendor answered: the wait completes later, with the value", "[custom_awaiter][cancel]") {
    vendor::kv_client client;
    // Answered a little later: after the tick that sent the request ended
    // (answered at once, the answer could be run by that same tick).
    client.put("key", "value", 20ms);
    loop l;
    auto h = l.spawn(fetch(client, "key"), "reader");
    settle(l, 1);
    REQUIRE(answered(client, 1));  // posted, not run: the loop has not ticked since
    h.cancel();                    // the vendor cannot withdraw it any more
    auto all = l.tasks();
    const spindle::task_info* t = find_task(all, h.id());
    REQUIRE(t);
    CHECK(t->state == spindle::task_info::state_kind::parked);
    CHECK(t->waiting_on == "kv get 'key' (request 1, cancelling)");
    REQUIRE(run_until(l, [&] { return h.done(); }));
    auto r = result_of(l, h);
    REQUIRE(r.has_value());
    CHECK(*r == "value");
}

TEST_CASE("abort while parked on kv_get withdraws the wait", "[custom_awaiter][lifetime]") {
    vendor::kv_client client;
    loop l;
    counted::alive = 0;

    SECTION("the request still pending: the vendor forgets it") {
        client.put("slow", "too late", 10s);
        auto h = l.spawn(fetch_counted(client, "slow"), "reader");
        settle(l);
        REQUIRE(client.pending() == 1);
        REQUIRE(counted::alive == 1);
        h.abort();
        CHECK(counted::alive == 0);
        CHECK(client.pending() == 0);
    }
    SECTION("the answer already posted: it runs later and finds nobody") {
        client.put("key", "value");
        auto h = l.spawn(fetch_counted(client, "key"), "reader");
        settle(l, 1);
        REQUIRE(answered(client, 1));
        h.abort();
        CHECK(counted::alive == 0);
        settle(l);  // runs the post: it must not touch the destroyed frame
        CHECK(h.done());
        CHECK(l.task_count() == 0);
    }
    CHECK_FALSE(l.has_work());
}

TEST_CASE("aborts racing the vendor's answers: no late answer touches a dead wait", "[custom_awaiter][lifetime]") {
    vendor::kv_client client;
    client.put("key", "value", 1ms);
    loop l;
    std::mt19937 random(7);
    int completed = 0;
    for (int i = 0; i < 200; ++i) {
        auto h = l.spawn(fetch(client, "key"), "reader");
        // Abort anywhere: before the request, while pending, while the
        // callback runs on the vendor's thread, with the answer posted.
        const int ticks = static_cast<int>(random() % 4);
        for (int t = 0; t < ticks; ++t) l.run_once(std::chrono::microseconds(random() % 1500));
        if (h.done()) ++completed;
        h.abort();
    }
    // Every request left was withdrawn; a callback that was running on the
    // vendor's thread has posted by now (or found nobody).
    CHECK(client.pending() == 0);
    std::this_thread::sleep_for(5ms);
    settle(l);
    // Typically a few readers finish and dozens of answers come after the
    // abort, posted or not.
    INFO(completed << " of 200 readers got their answer before the abort; the vendor answered " << client.answered());
    CHECK(l.task_count() == 0);
    CHECK_FALSE(l.has_work());
}

TEST_CASE("the task dump says what a kv_get waits on, and since when", "[custom_awaiter][dump]") {
    vendor::kv_client client;
    client.put("slow", "too late", 10s);
    loop l;
    auto h = l.spawn(fetch(client, "slow"), "reader");
    settle(l);
    std::this_thread::sleep_for(30ms);
    l.run_once(0ms);  // the loop looks at the clock again
    auto all = l.tasks();
    const spindle::task_info* t = find_task(all, h.id());
    REQUIRE(t);
    CHECK(t->state == spindle::task_info::state_kind::parked);
    CHECK(t->waiting_on == "kv get 'slow' (request 1)");
    CHECK(t->parked_for >= 25ms);
    CHECK(t->parked_for < 5s);
    const std::string dump = l.dump_tasks();
    INFO(dump);
    CHECK(dump.find("'reader': waiting on kv get 'slow' (request 1) for ") != std::string::npos);
    h.abort();
}

TEST_CASE("destroying the loop with a task parked on kv_get", "[custom_awaiter][lifetime]") {
    vendor::kv_client client;
    client.put("slow", "too late", 10s);
    client.put("key", "value");
    counted::alive = 0;

    SECTION("the request pending: withdrawn") {
        {
            loop l;
            auto h = l.spawn(fetch_counted(client, "slow"), "reader");
            settle(l);
            REQUIRE(client.pending() == 1);
        }
        CHECK(counted::alive == 0);
        CHECK(client.pending() == 0);
    }
    SECTION("the answer posted: destroyed unrun") {
        {
            loop l;
            l.spawn(fetch_counted(client, "key"), "reader").detach();
            settle(l, 1);
            REQUIRE(answered(client, 1));
        }
        CHECK(counted::alive == 0);
    }
}

TEST_CASE("a client closed under a parked kv_get completes it with kv_errc::closed", "[custom_awaiter]") {
    auto client = std::make_unique<vendor::kv_client>();
    client->put("slow", "never", 10s);
    loop l;
    auto h = l.spawn(fetch(*client, "slow"), "reader");
    settle(l);
    client.reset();  // answers the pending request with status::closed
    REQUIRE(run_until(l, [&] { return h.done(); }));
    auto r = result_of(l, h);
    CHECK(r.error() == kv_errc::closed);
}
