// The README's example, built with the project so it cannot rot.
#include <spindle/spindle.hpp>

#include <chrono>
#include <cstdio>

using namespace std::chrono_literals;

spindle::task<int> slow_square(int x) {
    (void)co_await spindle::sleep_for(10ms);
    co_return x * x;
}

spindle::task<int> sum_of_squares() {
    auto [a, b, c] = co_await spindle::when_all(slow_square(1), slow_square(2), slow_square(3));
    co_return a + b + c;  // the three sleeps overlap: about 10 ms in all
}

int main() {
    spindle::loop loop;
    std::printf("%d\n", loop.block_on(sum_of_squares()));
}
