// Several tasks take turns on one loop: one sleeps, one yields, a callback
// timer ticks at a fixed rate, and one task waits for a signal that another
// raises. Run it and watch the interleaving.

#include <spindle/spindle.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>

using namespace std::chrono_literals;

namespace {

spindle::task<void> sleeper(const char* name) {
    for (int i = 1; i <= 3; ++i) {
        std::printf("%-8s step %d, then sleeps 100 ms\n", name, i);
        co_await spindle::sleep_for(100ms);
    }
}

spindle::task<void> yielder(const char* name) {
    for (int i = 1; i <= 5; ++i) {
        std::printf("%-8s step %d, then yields\n", name, i);
        co_await spindle::yield();
    }
}

spindle::task<void> signal_waiter() {
    std::printf("waiter   waits for SIGUSR1\n");
    auto signo = co_await spindle::wait_signal(SIGUSR1);
    std::printf("waiter   got signal %d\n", signo.value());
}

spindle::task<void> signal_raiser() {
    co_await spindle::sleep_for(250ms);
    std::printf("raiser   raises SIGUSR1\n");
    std::raise(SIGUSR1);
}

}  // namespace

int main() {
    spindle::loop loop;
    // Catch it before anyone raises it, so it is never delivered the default way.
    loop.catch_signal(SIGUSR1);

    int ticks = 0;
    spindle::timer metronome(loop);
    metronome.start_repeating(
        70ms,
        [](void* count) {
            int& n = *static_cast<int*>(count);
            std::printf("timer    tick %d\n", ++n);
        },
        &ticks);

    loop.spawn(sleeper("alpha")).detach();
    loop.spawn(yielder("beta")).detach();
    loop.spawn(signal_waiter()).detach();
    loop.spawn(signal_raiser()).detach();

    auto stop_metronome = [](spindle::timer& t) -> spindle::task<void> {
        co_await spindle::sleep_for(400ms);
        t.stop();
    };
    loop.run_once(std::chrono::nanoseconds::zero());
    loop.block_on(stop_metronome(metronome));
    loop.run();
    std::printf("done: every task finished, the timer ticked %d times\n", ticks);
    return 0;
}
