#pragma once
/// A group of loops, one per thread, sharing nothing (docs/multicore.md).
///
///     spindle::loop_group group({.threads = 4});
///     return group.run([&](std::stop_token stop) -> spindle::task<int> {
///         // on every loop: its own listener, state and tasks
///         co_return co_await serve(stop);
///     });
///
/// Each loop is built, run and destroyed on its own thread (optionally
/// pinned to a CPU), with loop_options::single_thread set. A task never moves
/// between loops; what crosses is a call: `co_await submit_to(j, fn)` runs
/// `fn()` on loop j (a function, or one returning a task, which then runs
/// there) and gives its outcome back to the calling task: a result of its
/// value, its own result if it returns one, or its exception rethrown.
///
/// Calls travel over a bounded single-producer single-consumer ring per
/// ordered pair of loops, drained once per tick of the receiving loop, which
/// is woken only if it sleeps (by the sender at the end of its tick's
/// callbacks and before it polls the OS, however many calls). A caller with `calls_in_flight` calls already in flight to the
/// same loop waits for one to finish: back-pressure, nothing is dropped and
/// nobody spins. A call allocates nothing when its callable and its outcome
/// fit in 48 bytes each (a function returning a task spawns that task).
///
/// Cancelling the waiting task (its stop token, with_timeout,
/// join_handle::cancel) ends the wait at once with operation_canceled
/// (timed_out under with_timeout); a task started for the call on the other
/// loop is cancelled too, and a function already run there stays run.
///
/// loop::post stays the way in for threads outside the group (at(i).post()).

#include <spindle/detail/cross_loop.hpp>
#include <spindle/loop.hpp>
#include <spindle/park.hpp>
#include <spindle/task.hpp>
#include <spindle/when_all.hpp>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <functional>
#include <memory>
#include <stop_token>
#include <type_traits>
#include <utility>
#include <vector>

namespace spindle {

namespace detail {
class group_core;
}

// Every member has an initializer, `{}` included: g++ 12 warns
// (-Wmissing-field-initializers) of a member without one that a designated
// initializer leaves out, `{.threads = 4}`.
struct loop_group_options {
    /// Loops, one thread each; 0: one per CPU this process may run on.
    unsigned threads = 1;
    /// CPUs to pin the loops to: loop i runs on cpus[i % cpus.size()]; empty:
    /// not pinned.
    std::vector<int> cpus{};
    /// The options of every loop (single_thread is set on each).
    loop_options loop{};
    /// Calls one loop may have in flight to another at once; the next waits
    /// for one of them to finish. Each ring has room for these and one more,
    /// rounded up to a power of two (cells of 64 bytes, two rings per ordered
    /// pair of loops: 16 KiB per pair by default).
    std::size_t calls_in_flight = 127;
    /// A loop with calls in flight, or that just took calls or replies,
    /// looks for more for this long before it sleeps (yielding its CPU to
    /// anyone else runnable there meanwhile): a stream of calls then costs
    /// no wake-ups. Zero: sleep at once.
    std::chrono::nanoseconds idle_spin = std::chrono::microseconds(20);
    /// Signals that stop the whole group, caught once, by loop 0, and blocked
    /// in every thread of the group; empty: the group catches none.
    std::vector<int> stop_signals = {SIGINT, SIGTERM};
};

class loop_group {
public:
    /// Nothing runs until run(). Throws std::invalid_argument for a CPU this
    /// process may not run on.
    explicit loop_group(loop_group_options options = {});
    ~loop_group();
    loop_group(const loop_group&) = delete;
    loop_group& operator=(const loop_group&) = delete;

    std::size_t size() const noexcept;
    const loop_group_options& options() const noexcept;

    /// Starts a thread per loop, builds the loop there and runs `main(stop)`
    /// (a task<void> or task<int>) on every one, each with its loop's stop
    /// token. Blocks until every main has returned and every loop is
    /// destroyed (with whatever was still parked in it), then returns 0 or
    /// the first non-zero status a main returned, or rethrows the first
    /// exception a main threw. A main that fails (non-zero or an exception)
    /// stops the group, as stop() does. A loop that cannot be built (its
    /// backend cannot start) is rethrown before any main runs. Once per group.
    template <class F>
        requires std::is_invocable_v<F&, std::stop_token>
    int run(F main);

    /// Any thread, also before run(): requests every loop's stop token. The
    /// mains see it and return; run() returns once they all have. Calls in
    /// flight between loops are answered until the last main returns.
    void stop() noexcept;

    /// The group whose loop runs on this thread, or null.
    static loop_group* current_or_null() noexcept;
    /// The same; throws std::logic_error outside a group's loop.
    static loop_group& current();
    /// The index of the loop running on this thread in its group, 0 to
    /// size() - 1; throws std::logic_error outside a group's loop.
    static std::size_t current_index();

    /// Loop `index`, for post() from threads outside the group while run()
    /// runs (after every loop is built: the mains have started).
    loop& at(std::size_t index);
    /// Every loop's metrics, loop i at index i (see loop::metrics; total()
    /// adds them up). Any thread, while run() runs.
    [[nodiscard]] std::vector<loop_metrics> metrics();

private:
    int run_erased(std::function<task<int>(std::stop_token)> main);
    std::unique_ptr<detail::group_core> m_core;
};

/// In a task of a group's loop: runs `fn()` on loop `target` of the same
/// group (this loop too) and gives its outcome, see above.
/// `auto get = [key] { return store.get(key); }; co_await submit_to(j, std::move(get));`
/// (a capturing lambda named first: g++ 12 destroys the captures of one made
/// inside the co_await expression twice, docs/runtime.md).
template <class F>
[[nodiscard]] auto submit_to(std::size_t target, F fn, std::stop_token token = {}) {
    return parked<detail::call_wait<std::decay_t<F>>>(std::move(token), detail::link_to(target), std::move(fn));
}

namespace detail {
template <class R, class F>
task<R> call_one(std::size_t target, F fn, std::stop_token token) {
    co_return co_await submit_to(target, std::move(fn), std::move(token));
}
}  // namespace detail

/// In a task of a group's loop: runs a copy of `fn()` on every loop of the
/// group (this one too), all at once, and gives what submit_to gives for
/// each, in the order of the loops. An exception of one is rethrown once all
/// have answered; cancelling the waiting task cancels every call.
/// `auto sizes = co_await submit_to_all([] { return shard().size(); });`
template <class F>
[[nodiscard]] task<std::vector<detail::call_result_t<detail::call_value_t<std::decay_t<F>>>>> submit_to_all(
    F fn, std::stop_token token = {}) {
    using R = detail::call_result_t<detail::call_value_t<std::decay_t<F>>>;
    const std::size_t n = loop_group::current().size();
    std::vector<task<R>> calls;
    calls.reserve(n);
    for (std::size_t j = 0; j < n; ++j) calls.push_back(detail::call_one<R>(j, fn, token));
    co_return co_await when_all(std::move(calls));
}

// ---------------------------------------------------------------------------

template <class F>
    requires std::is_invocable_v<F&, std::stop_token>
int loop_group::run(F main) {
    using R = std::invoke_result_t<F&, std::stop_token>;
    static_assert(std::is_same_v<R, task<void>> || std::is_same_v<R, task<int>>,
                  "spindle::loop_group::run: main(stop) must return task<void> or task<int>");
    if constexpr (std::is_same_v<R, task<int>>) {
        return run_erased(std::move(main));
    } else {
        return run_erased([main = std::move(main)](std::stop_token stop) mutable -> task<int> {
            co_await main(std::move(stop));
            co_return 0;
        });
    }
}

}  // namespace spindle
