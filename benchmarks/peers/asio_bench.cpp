// The runtime benchmarks' cases written on Boost.Asio, for side-by-side runs
// with spindle-bench (same cases, same sizes, same output format).

#include <utility>  // Boost 1.74 uses std::exchange without including it

#include <boost/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

namespace asio = boost::asio;

namespace {

double wall_ns() {
    return static_cast<double>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

double cpu_ns() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

template <class F>
double median_of(int rounds, F&& round) {
    std::vector<double> v;
    for (int i = 0; i < rounds; ++i) v.push_back(round());
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

asio::awaitable<void> yielder(long n) {
    for (long i = 0; i < n; ++i) co_await asio::post(asio::use_awaitable);
}

void bench_yield() {
    constexpr long n = 2'000'000;
    double ns = median_of(5, [] {
        asio::io_context io(1);
        asio::co_spawn(io, yielder(n), asio::detached);
        asio::co_spawn(io, yielder(n), asio::detached);
        double t0 = wall_ns();
        io.run();
        return (wall_ns() - t0) / (2.0 * n);
    });
    std::printf("yield ns_per_op=%.1f tasks=2 yields_per_task=%ld\n", ns, n);
}

asio::awaitable<void> empty_task() { co_return; }

double spawn_round(long batch, int batches) {
    return median_of(5, [=] {
        asio::io_context io(1);
        double t0 = wall_ns();
        for (int b = 0; b < batches; ++b) {
            for (long i = 0; i < batch; ++i) asio::co_spawn(io, empty_task(), asio::detached);
            io.run();
            io.restart();
        }
        return (wall_ns() - t0) / static_cast<double>(batch * batches);
    });
}

void bench_spawn() {
    double steady = spawn_round(100, 5000);
    double burst = spawn_round(10'000, 50);
    std::printf("spawn ns_per_op=%.1f in_flight=100 burst_10000_ns_per_op=%.1f\n", steady, burst);
}

void bench_timers_fire() {
    constexpr long n = 1'000'000;
    asio::io_context io(1);
    std::vector<std::unique_ptr<asio::steady_timer>> timers;
    timers.reserve(n);
    for (long i = 0; i < n; ++i) timers.push_back(std::make_unique<asio::steady_timer>(io));
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<long> spread(0, 999'999'999);
    std::vector<long> delays(n);
    long fired = 0;
    double cold = 0;
    for (int round = 1; round <= 2; ++round) {
        for (auto& d : delays) d = spread(rng);
        fired = 0;
        double c0 = cpu_ns();
        for (long i = 0; i < n; ++i) {
            auto& t = *timers[static_cast<std::size_t>(i)];
            t.expires_after(std::chrono::nanoseconds(delays[static_cast<std::size_t>(i)]));
            t.async_wait([&fired](const boost::system::error_code&) { ++fired; });
        }
        double c1 = cpu_ns();
        io.run();
        io.restart();
        double c2 = cpu_ns();
        if (round == 1) {
            cold = (c2 - c0) / n;
            continue;
        }
        std::printf("timers_fire ns_per_op=%.1f timers=%ld fired=%ld schedule_cpu_ns=%.1f fire_cpu_ns=%.1f first_round_ns_per_op=%.1f\n",
                    (c2 - c0) / n, n, fired, (c1 - c0) / n, (c2 - c1) / n, cold);
    }
}

void bench_timers_cancel() {
    constexpr long n = 1'000'000;
    asio::io_context io(1);
    std::vector<std::unique_ptr<asio::steady_timer>> timers;
    timers.reserve(n);
    for (long i = 0; i < n; ++i) timers.push_back(std::make_unique<asio::steady_timer>(io));
    std::mt19937_64 rng(7);
    std::uniform_int_distribution<long> spread(1'000'000'000, 1'999'999'999);
    long fired = 0;
    double c0 = cpu_ns();
    for (auto& t : timers) {
        t->expires_after(std::chrono::nanoseconds(spread(rng)));
        t->async_wait([&fired](const boost::system::error_code& ec) { fired += ec ? 0 : 1; });
    }
    double c1 = cpu_ns();
    for (auto& t : timers) t->cancel();
    double c2 = cpu_ns();
    io.run();  // the cancelled handlers run here
    std::printf("timers_cancel ns_per_op=%.1f timers=%ld schedule_ns=%.1f fired=%ld\n", (c2 - c1) / n, n, (c1 - c0) / n, fired);
}

long resident_kib() {
    long pages_total = 0, pages_resident = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) pages_resident = 0;
        std::fclose(f);
    }
    return pages_resident * (sysconf(_SC_PAGESIZE) / 1024);
}

long peak_rss_kib() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

asio::awaitable<void> sleeper(std::chrono::nanoseconds d) {
    asio::steady_timer t(co_await asio::this_coro::executor, d);
    co_await t.async_wait(asio::use_awaitable);
}

void bench_sleeping_tasks() {
    constexpr long n = 100'000;
    std::mt19937_64 rng(1);
    std::uniform_int_distribution<long> spread(0, 999'999'999);
    std::vector<long> delays(n);
    for (auto& d : delays) d = spread(rng);
    asio::io_context io(1);
    const long before_kib = resident_kib();
    for (long i = 0; i < n; ++i)
        asio::co_spawn(io, sleeper(std::chrono::nanoseconds(delays[static_cast<std::size_t>(i)])), asio::detached);
    io.poll();  // every coroutine runs to its wait
    const long parked_kib = resident_kib();
    const double w0 = wall_ns();
    io.run();
    const double w1 = wall_ns();
    const long peak_kib = std::max(parked_kib, peak_rss_kib());
    std::printf("sleeping_tasks bytes_per_task=%.0f tasks=%ld rss_before_kib=%ld rss_parked_kib=%ld wall_s=%.2f\n",
                static_cast<double>(peak_kib - before_kib) * 1024.0 / n, n, before_kib, parked_kib, (w1 - w0) / 1e9);
}

void bench_post_cross_thread() {
    constexpr long n = 2'000'000;
    double ns = median_of(5, [] {
        asio::io_context io(1);
        auto guard = asio::make_work_guard(io);
        long done = 0;
        double t0 = wall_ns();
        std::thread producer([&] {
            for (long i = 0; i < n - 1; ++i) asio::post(io, [&done] { ++done; });
            asio::post(io, [&] {
                ++done;
                guard.reset();
            });
        });
        io.run();
        double elapsed = wall_ns() - t0;
        producer.join();
        return elapsed / n;
    });
    std::printf("post_cross_thread ns_per_op=%.1f posts=%ld producers=1\n", ns, n);
}

// offload: an empty job posted to a thread_pool, the coroutine resuming on
// its io_context afterwards (an awaitable's completion goes through its own
// executor): one at a time, then 16 in flight.
asio::awaitable<void> offload_chain(asio::thread_pool& pool, long n) {
    for (long i = 0; i < n; ++i) co_await asio::post(pool.get_executor(), asio::use_awaitable);
}

void bench_offload() {
    constexpr long n = 20'000;
    constexpr long in_flight = 16;
    asio::thread_pool pool(4);
    auto round = [&](long chains) {
        asio::io_context io(1);
        const double t0 = wall_ns();
        for (long i = 0; i < chains; ++i) asio::co_spawn(io, offload_chain(pool, n / chains), asio::detached);
        io.run();
        return (wall_ns() - t0) / n;
    };
    round(1);  // warm the pool
    const double c0 = cpu_ns();
    const double serial = median_of(5, [&] { return round(1); });
    const double cpu_per_op = (cpu_ns() - c0) / (5.0 * n);
    const double parallel = median_of(5, [&] { return round(in_flight); });
    std::printf("offload ns_per_op=%.1f round_trip_empty_job cpu_ns_per_op=%.1f in_flight_16_ns_per_op=%.1f\n", serial,
                cpu_per_op, parallel);
    pool.join();
}

struct bench_case {
    const char* name;
    void (*run)();
};

constexpr bench_case cases[] = {
    {"yield", &bench_yield},
    {"spawn", &bench_spawn},
    {"timers_fire", &bench_timers_fire},
    {"timers_cancel", &bench_timers_cancel},
    {"sleeping_tasks", &bench_sleeping_tasks},
    {"post_cross_thread", &bench_post_cross_thread},
    {"offload", &bench_offload},
};

}  // namespace

int main(int argc, char** argv) {
    for (const auto& c : cases) {
        bool wanted = argc == 1;
        for (int i = 1; i < argc; ++i) wanted = wanted || std::strcmp(argv[i], c.name) == 0;
        if (wanted) {
            c.run();
            std::fflush(stdout);
        }
    }
}
