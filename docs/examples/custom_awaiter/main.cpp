// spindle-custom-awaiter: a third-party callback API (vendor_kv.hpp, a
// stand-in key-value client answering on its own thread) wrapped as an
// awaitable on the park protocol (kv_get.hpp), and what the protocol gives it
// without a line of its own: values, errors, with_timeout, stop tokens,
// join_handle::cancel and abort, the task dump, and a loop destroyed with the
// wait still parked. docs/custom-awaiters.md walks through kv_get.hpp.
//
// Prints one line per outcome ("ok: ..." or "UNEXPECTED: ..."); exits 0 when
// every outcome is the expected one, 1 otherwise.

#include "kv_get.hpp"

#include <spindle/spindle.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>

using namespace std::chrono_literals;
using example::kv_get;
using spindle::result;
using spindle::task;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
    std::printf("%s: %s\n", ok ? "ok" : "UNEXPECTED", what.c_str());
    if (!ok) ++failures;
}

std::string describe(const result<std::string>& r) {
    return r ? "\"" + *r + "\"" : r.error().message();
}

task<result<std::string>> fetch(vendor::kv_client& client, std::string key) {
    co_return co_await kv_get(client, std::move(key));
}

task<void> stop_later(std::stop_source& source, std::chrono::milliseconds after) {
    (void)co_await spindle::sleep_for(after);
    source.request_stop();  // on the loop's thread, as stop requests must be
}

// Blocks the loop's thread, on purpose, until the vendor has answered `n`
// requests in all: its answer is then posted to the loop but not run yet.
bool wait_for_answers(const vendor::kv_client& client, std::size_t n) {
    const auto give_up = std::chrono::steady_clock::now() + 5s;
    while (client.answered() < n)
        if (std::chrono::steady_clock::now() > give_up)
            return false;
        else
            std::this_thread::sleep_for(1ms);
    return true;
}

task<void> demonstrate(vendor::kv_client& client) {
    spindle::loop& loop = spindle::loop::current();

    {
        result<std::string> r = co_await kv_get(client, "greeting");
        check(r && *r == "hello", "kv_get(\"greeting\") gives " + describe(r));
    }
    {
        result<std::string> r = co_await kv_get(client, "no such key");
        check(r.error() == example::kv_errc::not_found, "kv_get(\"no such key\") gives " + describe(r));
    }
    {
        // The deadline cancels the parked wait; operation_canceled becomes timed_out.
        const auto start = spindle::clock::now();
        result<std::string> r = co_await spindle::with_timeout(50ms, kv_get(client, "slow"));
        const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(spindle::clock::now() - start);
        check(r.error() == std::errc::timed_out && took < 2s,
              "with_timeout(50ms, kv_get(\"slow\")) gives " + describe(r) + " after " + std::to_string(took.count()) + " ms");
    }
    {
        std::stop_source source;
        auto stopper = loop.spawn(stop_later(source, 20ms), "stopper");
        result<std::string> r = co_await kv_get(client, "slow", source.get_token());
        check(r.error() == std::errc::operation_canceled, "a stop request after 20 ms gives " + describe(r));
        co_await stopper;
    }
    {
        auto reader = loop.spawn(fetch(client, "slow"), "reader");
        (void)co_await spindle::sleep_for(10ms);  // the reader parks on its kv_get
        const std::string dump = loop.dump_tasks();
        std::printf("loop.dump_tasks() with the reader parked:\n%s", dump.c_str());
        check(dump.find("'reader': waiting on kv get 'slow' (request ") != std::string::npos,
              "the dump says what the reader waits on");
        reader.cancel();
        result<std::string> r = co_await reader;
        check(r.error() == std::errc::operation_canceled, "join_handle::cancel() makes the reader's kv_get give " + describe(r));
    }
    {
        auto reader = loop.spawn(fetch(client, "slow"), "reader");
        (void)co_await spindle::sleep_for(10ms);
        const std::size_t pending = client.pending();
        reader.abort();
        check(client.pending() == pending - 1, "join_handle::abort() withdrew the reader's request from the vendor");
        bool threw = false;
        try {
            (void)co_await reader;
        } catch (const std::system_error& e) {
            threw = e.code() == std::errc::operation_canceled;
        }
        check(threw, "awaiting the aborted reader throws operation_canceled");
    }
    {
        // A cancel that comes too late: the vendor has answered and the answer
        // is posted to the loop. cancel() cannot withdraw it, so the wait
        // stays parked until the answer completes it, with the value.
        auto reader = loop.spawn(fetch(client, "greeting"), "reader");
        const std::size_t answered = client.answered();
        co_await spindle::yield();  // the reader parks
        check(wait_for_answers(client, answered + 1), "the vendor answered the reader");
        reader.cancel();
        const std::string dump = loop.dump_tasks();
        check(dump.find("waiting on kv get 'greeting' (request ") != std::string::npos &&
                  dump.find(", cancelling)") != std::string::npos,
              "the dump shows the reader's cancel in progress");
        result<std::string> r = co_await reader;
        check(r && *r == "hello", "the answer that won the race is kept: " + describe(r));
    }
}

}  // namespace

int main() {
    try {
        // Declared first: the client must outlive every wait on it.
        vendor::kv_client client;
        client.put("greeting", "hello", 5ms);
        client.put("slow", "too late", 10s);
        {
            spindle::loop loop;
            loop.block_on(demonstrate(client));

            // A loop destroyed with a task parked on kv_get: the frame is
            // destroyed, the wait withdrawn, and the vendor asked to forget it.
            auto left = loop.spawn(fetch(client, "slow"), "left parked");
            for (int i = 0; i < 3; ++i) loop.poll();
            check(client.pending() == 1, "a task is parked on kv_get(\"slow\") as the loop goes");
        }
        check(client.pending() == 0, "destroying the loop withdrew the parked request");
    } catch (const std::exception& e) {
        std::printf("UNEXPECTED: %s\n", e.what());
        return 1;
    }
    std::printf("%s\n", failures == 0 ? "every outcome as expected" : "some outcomes were unexpected");
    return failures == 0 ? 0 : 1;
}
