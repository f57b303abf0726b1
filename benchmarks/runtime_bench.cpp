// Micro-benchmarks of the runtime. One line per case:
//   NAME ns_per_op=X [details]
// Each case runs several rounds and reports the median round; the machines
// these run on are shared, so compare ratios and medians, not single figures.
//
// Usage: spindle-bench [case...]   (default: every case)

#include <spindle/net/address.hpp>
#include <spindle/net/tcp.hpp>
#include <spindle/process.hpp>
#include <spindle/spindle.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <optional>
#include <random>
#include <string>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;

double wall_ns() {
    return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

double cpu_ns() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

long peak_rss_kib() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

template <class F>
double median_of(int rounds, F&& round) {
    std::vector<double> v;
    for (int i = 0; i < rounds; ++i) v.push_back(round());
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// --- yield: two tasks handing the loop to each other -------------------------

spindle::task<void> yielder(long n) {
    for (long i = 0; i < n; ++i) co_await spindle::yield();
}

void bench_yield() {
    constexpr long n = 2'000'000;
    double ns = median_of(5, [] {
        spindle::loop loop;
        loop.spawn(yielder(n)).detach();
        loop.spawn(yielder(n)).detach();
        double t0 = wall_ns();
        loop.run();
        return (wall_ns() - t0) / (2.0 * n);
    });
    std::printf("yield ns_per_op=%.1f tasks=2 yields_per_task=%ld\n", ns, n);
}

// --- spawn: spawn and complete an empty task ----------------------------------

spindle::task<void> empty_task() { co_return; }

double spawn_round(long batch, int batches) {
    return median_of(5, [=] {
        spindle::loop loop;
        double t0 = wall_ns();
        for (int b = 0; b < batches; ++b) {
            for (long i = 0; i < batch; ++i) loop.spawn(empty_task()).detach();
            loop.run();
        }
        return (wall_ns() - t0) / static_cast<double>(batch * batches);
    });
}

void bench_spawn() {
    // Steady state: 100 tasks in flight at a time. Burst: 10,000 spawned before
    // any runs, so their frames no longer fit in the caches.
    double steady = spawn_round(100, 5000);
    double burst = spawn_round(10'000, 50);
    std::printf("spawn ns_per_op=%.1f in_flight=100 burst_10000_ns_per_op=%.1f\n", steady, burst);
}

// --- timers: a million callback timers ------------------------------------------

struct fire_count {
    long fired = 0;
};

void count_fire(void* ctx) { ++static_cast<fire_count*>(ctx)->fired; }

void timers_fire_round(const char* name, std::chrono::nanoseconds slack) {
    constexpr long n = 1'000'000;
    spindle::loop_options options;
    options.timer_slack = slack;
    spindle::loop loop(options);
    std::deque<spindle::timer> timers;
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<long> spread(0, 999'999'999);
    std::vector<long> delays(n);
    fire_count count;
    for (long i = 0; i < n; ++i) timers.emplace_back(loop);

    // Round 1 runs on fresh memory (the queue's vectors grow, pages fault in);
    // rounds 2-5 are the steady state, the same loop again: medians of those.
    constexpr int rounds = 5;
    double cold = 0;
    std::vector<double> total, schedule, fire, wakes_per_s, wall;
    for (int round = 1; round <= rounds; ++round) {
        for (auto& d : delays) d = spread(rng);
        count.fired = 0;
        double c0 = cpu_ns();
        double w0 = wall_ns();
        for (long i = 0; i < n; ++i)
            timers[static_cast<std::size_t>(i)].start(std::chrono::nanoseconds(delays[static_cast<std::size_t>(i)]),
                                                      &count_fire, &count);
        double c1 = cpu_ns();
        const spindle::loop_metrics m0 = loop.metrics();
        loop.run();
        double c2 = cpu_ns();
        double w2 = wall_ns();
        const spindle::loop_metrics m1 = loop.metrics();
        if (count.fired != n) std::printf("%s: fired %ld of %ld\n", name, count.fired, n);
        if (round == 1) {
            cold = (c2 - c0) / n;
            continue;
        }
        total.push_back((c2 - c0) / n);
        schedule.push_back((c1 - c0) / n);
        fire.push_back((c2 - c1) / n);
        wall.push_back((w2 - w0) / 1e9);
        wakes_per_s.push_back(static_cast<double>(m1.sleeps - m0.sleeps) / ((w2 - w0) / 1e9));
    }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    };
    std::printf(
        "%s ns_per_op=%.1f timers=%ld schedule_cpu_ns=%.1f fire_cpu_ns=%.1f wakeups_per_s=%.0f first_round_ns_per_op=%.1f "
        "wall_s=%.2f peak_rss_mib=%.0f rounds=%d\n",
        name, median(total), n, median(schedule), median(fire), median(wakes_per_s), cold, median(wall),
        static_cast<double>(peak_rss_kib()) / 1024.0, rounds - 1);
}

// The loop's default timer slack (a 50 us grid, and 1/1024 of the delay for
// long timers), and a 1 ms grid: the resolution of Tokio's and libuv's timers.
// Much of the CPU time per timer is the wake-ups' (a sleep in the kernel and
// back costs 12-25 us of CPU on a virtual machine), so the slack weighs in.
void bench_timers_fire() {
    timers_fire_round("timers_fire", spindle::loop_options{}.timer_slack);
    timers_fire_round("timers_fire_slack_1ms", std::chrono::milliseconds(1));
}

void bench_timers_cancel() {
    constexpr long n = 1'000'000;
    spindle::loop loop;
    std::deque<spindle::timer> timers;
    std::mt19937_64 rng(7);
    std::uniform_int_distribution<long> spread(1'000'000'000, 1'999'999'999);
    std::vector<long> delays(n);
    for (auto& d : delays) d = spread(rng);
    fire_count count;
    for (long i = 0; i < n; ++i) timers.emplace_back(loop);

    double c0 = cpu_ns();
    for (long i = 0; i < n; ++i) timers[static_cast<std::size_t>(i)].start(std::chrono::nanoseconds(delays[static_cast<std::size_t>(i)]), &count_fire, &count);
    double c1 = cpu_ns();
    for (auto& t : timers) t.stop();
    double c2 = cpu_ns();
    loop.run();  // nothing left: returns at once
    std::printf("timers_cancel ns_per_op=%.1f timers=%ld schedule_ns=%.1f fired=%ld\n", (c2 - c1) / n, n, (c1 - c0) / n,
                count.fired);
}

// --- sleeping tasks: memory per task ------------------------------------------

long resident_kib() {
    long pages_total = 0, pages_resident = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) pages_resident = 0;
        std::fclose(f);
    }
    return pages_resident * (sysconf(_SC_PAGESIZE) / 1024);
}

spindle::task<void> sleeper(std::chrono::nanoseconds d) { (void)co_await spindle::sleep_for(d); }

void bench_sleeping_tasks() {
    // 100,000 tasks each asleep for a random 0-1000 ms: resident memory per
    // task, (peak RSS - RSS before spawning) / tasks, with every task parked.
    // Run alone (`spindle-bench sleeping_tasks`) for a clean figure: earlier
    // cases leave memory in the allocator's free lists.
    constexpr long n = 100'000;
    std::mt19937_64 rng(1);
    std::uniform_int_distribution<long> spread(0, 999'999'999);
    std::vector<long> delays(n);
    for (auto& d : delays) d = spread(rng);
    spindle::loop loop;
    const long before_kib = resident_kib();
    for (long i = 0; i < n; ++i)
        loop.spawn(sleeper(std::chrono::nanoseconds(delays[static_cast<std::size_t>(i)]))).detach();
    (void)loop.run_once(std::chrono::nanoseconds::zero());  // every task runs to its sleep
    const long parked_kib = resident_kib();
    const spindle::loop_metrics m = loop.metrics();
    const double w0 = wall_ns();
    loop.run();
    const double w1 = wall_ns();
    const long peak_kib = std::max(parked_kib, peak_rss_kib());
    std::printf("sleeping_tasks bytes_per_task=%.0f tasks=%ld parked=%llu timers_pending=%llu rss_before_kib=%ld "
                "rss_parked_kib=%ld wall_s=%.2f\n",
                static_cast<double>(peak_kib - before_kib) * 1024.0 / n, n,
                static_cast<unsigned long long>(m.tasks_alive), static_cast<unsigned long long>(m.timers_pending), before_kib,
                parked_kib, (w1 - w0) / 1e9);
}

// --- posts from another thread ----------------------------------------------------

void bench_post_cross_thread() {
    constexpr long n = 2'000'000;
    double ns = median_of(5, [] {
        spindle::loop loop;
        long done = 0;
        std::optional<spindle::loop::hold> hold(std::in_place, loop);
        double t0 = wall_ns();
        std::thread producer([&] {
            for (long i = 0; i < n - 1; ++i) loop.post([&done] { ++done; });
            loop.post([&] {
                ++done;
                hold.reset();
            });
        });
        loop.run();
        double elapsed = wall_ns() - t0;
        producer.join();
        if (done != n) std::printf("post_cross_thread: ran %ld of %ld\n", done, n);
        return elapsed / n;
    });
    std::printf("post_cross_thread ns_per_op=%.1f posts=%ld producers=1\n", ns, n);
}

// --- mutex: uncontended lock and unlock inside one task ------------------------

spindle::task<void> lock_unlock(spindle::mutex& m, long n) {
    for (long i = 0; i < n; ++i) {
        auto guard = co_await m.lock();
        (void)guard;
    }
}

spindle::task<void> contended_locker(spindle::mutex& m, long n, long& counter) {
    for (long i = 0; i < n; ++i) {
        auto guard = co_await m.lock();
        ++counter;
        co_await spindle::yield();  // hold it across a switch: the other task queues
    }
}

void bench_mutex() {
    constexpr long n = 5'000'000;
    double uncontended = median_of(5, [] {
        spindle::loop loop;
        spindle::mutex m;
        double t0 = wall_ns();
        loop.block_on(lock_unlock(m, n));
        return (wall_ns() - t0) / static_cast<double>(n);
    });
    constexpr long k = 500'000;
    double contended = median_of(5, [] {
        spindle::loop loop;
        spindle::mutex m;
        long counter = 0;
        loop.spawn(contended_locker(m, k, counter)).detach();
        loop.spawn(contended_locker(m, k, counter)).detach();
        double t0 = wall_ns();
        loop.run();
        return (wall_ns() - t0) / static_cast<double>(2 * k);
    });
    std::printf("mutex ns_per_op=%.1f uncontended_lock_unlock contended_2_tasks_ns_per_lock=%.1f\n", uncontended, contended);
}

// --- channel: send + receive between two tasks ----------------------------------

spindle::task<void> produce(spindle::channel<long>& ch, long n) {
    for (long i = 0; i < n; ++i) (void)co_await ch.send(i);
    ch.close();
}

spindle::task<void> consume(spindle::channel<long>& ch, long& sum) {
    for (;;) {
        spindle::result<long> v = co_await ch.receive();
        if (!v) break;
        sum += *v;
    }
}

double channel_round(std::size_t capacity, long n) {
    return median_of(5, [=] {
        spindle::loop loop;
        spindle::channel<long> ch(capacity);
        long sum = 0;
        loop.spawn(produce(ch, n)).detach();
        loop.spawn(consume(ch, sum)).detach();
        double t0 = wall_ns();
        loop.run();
        double ns = (wall_ns() - t0) / static_cast<double>(n);
        if (sum != n * (n - 1) / 2) std::printf("channel: wrong sum\n");
        return ns;
    });
}

void bench_channel() {
    constexpr long n = 2'000'000;
    double one = channel_round(1, n);
    double batch = channel_round(64, n);
    std::printf("channel ns_per_op=%.1f capacity=1 send_receive capacity_64_ns_per_op=%.1f\n", one, batch);
}

// --- generator: values from a generator to its consumer, in one task -----------

spindle::async_generator<long> numbers(long n) {
    for (long i = 0; i < n; ++i) co_yield i;
}

spindle::task<void> sum_numbers(long n, long& sum) {
    auto gen = numbers(n);
    while (auto v = co_await gen.next()) sum += *v;
}

void bench_generator() {
    // The default budget: every 128 values the consumer goes round the ready
    // queue once, and that is part of the figure.
    constexpr long n = 20'000'000;
    double ns = median_of(5, [] {
        spindle::loop loop;
        long sum = 0;
        loop.spawn(sum_numbers(n, sum)).detach();
        double t0 = wall_ns();
        loop.run();
        double per_value = (wall_ns() - t0) / static_cast<double>(n);
        if (sum != n * (n - 1) / 2) std::printf("generator: wrong sum\n");
        return per_value;
    });
    std::printf("generator ns_per_op=%.1f values=%ld consumers=1 task_budget=128\n", ns, n);
}

// --- offload: an empty job to the pool and back -----------------------------------

spindle::task<void> offload_serial(long n) {
    auto empty = [] {};
    for (long i = 0; i < n; ++i) (void)co_await spindle::offload(empty);
}

void bench_offload() {
    constexpr long n = 20'000;
    constexpr long in_flight = 16;
    {
        // Warm the pool: its threads start on first use.
        spindle::loop loop;
        loop.block_on(offload_serial(100));
    }
    // Process CPU: the pool's threads, spinning for work included.
    const double c0 = cpu_ns();
    const double serial = median_of(5, [&] {
        spindle::loop loop;
        const double t0 = wall_ns();
        loop.block_on(offload_serial(n));
        return (wall_ns() - t0) / n;
    });
    const double cpu_per_op = (cpu_ns() - c0) / (5.0 * n);
    const double parallel = median_of(5, [&] {
        spindle::loop loop;
        const double t0 = wall_ns();
        loop.block_on([](long each) -> spindle::task<void> {
            std::vector<spindle::join_handle<void>> workers;
            for (long i = 0; i < in_flight; ++i)
                workers.push_back(spindle::loop::current().spawn(offload_serial(each)));
            for (auto& w : workers) co_await w;
        }(n / in_flight));
        return (wall_ns() - t0) / n;
    });
    std::printf("offload ns_per_op=%.1f round_trip_empty_job cpu_ns_per_op=%.1f in_flight_16_ns_per_op=%.1f\n", serial,
                cpu_per_op, parallel);
}

// --- file_read: 4 KiB random reads from a file in the page cache ------------------

// SPINDLE_BENCH_FILE_MIB sets the file's size (default 1024).
std::uint64_t bench_file_bytes() {
    const char* mib = std::getenv("SPINDLE_BENCH_FILE_MIB");
    const long n = mib ? std::atol(mib) : 1024;
    return static_cast<std::uint64_t>(std::max(n, 1L)) << 20;
}

spindle::task<void> random_reads(spindle::file& f, std::uint64_t blocks, long n, std::uint64_t seed, long& failed) {
    std::array<std::byte, 4096> buf;
    std::uint64_t x = seed;
    for (long i = 0; i < n; ++i) {
        x ^= x << 13;  // xorshift64: the same offsets every run
        x ^= x >> 7;
        x ^= x << 17;
        spindle::result<std::size_t> r = co_await f.read_at(buf, (x % blocks) * buf.size());
        if (!r || *r != buf.size()) ++failed;
    }
}

void bench_file_read() {
    const std::uint64_t bytes = bench_file_bytes();
    char path[] = "/tmp/spindle-bench-file-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) {
        std::printf("file_read: cannot make a temporary file\n");
        return;
    }
    ::unlink(path);
    {
        // Written through the page cache, which keeps it: every read is warm.
        std::vector<char> chunk(1 << 20);
        for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 31);
        for (std::uint64_t done = 0; done < bytes; done += chunk.size())
            if (::write(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) {
                std::printf("file_read: cannot write the file\n");
                ::close(fd);
                return;
            }
    }
    const std::uint64_t blocks = bytes / 4096;
    spindle::file f(::dup(fd));
    ::close(fd);
    constexpr long n = 200'000;
    long failed = 0;
    // CPU per read is the rounds' mean: the loop's thread, the pool's threads
    // and the ring's kernel workers, all of the process.
    const auto round = [&](long in_flight, double& cpu_sum) {
        spindle::loop loop;
        const double c0 = cpu_ns();
        const double t0 = wall_ns();
        loop.block_on([&]() -> spindle::task<void> {
            std::vector<spindle::join_handle<void>> readers;
            for (long i = 0; i < in_flight; ++i)
                readers.push_back(spindle::loop::current().spawn(random_reads(
                    f, blocks, n / in_flight, 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i), failed)));
            for (auto& r : readers) co_await r;
        }());
        const double wall = (wall_ns() - t0) / n;
        cpu_sum += (cpu_ns() - c0) / n;
        return wall;
    };
    double warm = 0, cpu_one = 0, cpu_many = 0;
    (void)round(1, warm);  // the pool's threads, the ring's workers
    const double one = median_of(3, [&] { return round(1, cpu_one); });
    const double many = median_of(3, [&] { return round(64, cpu_many); });
    cpu_one /= 3;
    cpu_many /= 3;
    if (failed) std::printf("file_read: %ld reads failed\n", failed);
    std::printf(
        "file_read ns_per_op=%.1f in_flight=1 reads_per_s=%.0f cpu_ns_per_op=%.1f in_flight_64_ns_per_op=%.1f "
        "in_flight_64_reads_per_s=%.0f in_flight_64_cpu_ns_per_op=%.1f file_mib=%llu block=4096\n",
        one, 1e9 / one, cpu_one, many, 1e9 / many, cpu_many, static_cast<unsigned long long>(bytes >> 20));
}

// --- process_spawn: start /bin/true and wait for its end --------------------------

namespace process = spindle::process;
using spindle::result;

// SPINDLE_BENCH_SPAWNS sets the children per round (default 2000).
long bench_spawns() {
    const char* n = std::getenv("SPINDLE_BENCH_SPAWNS");
    return std::max(n ? std::atol(n) : 2000L, 16L);
}

spindle::task<void> spawn_and_wait(long n, long& failed) {
    for (long i = 0; i < n; ++i) {
        result<process::child> c = process::spawn("/bin/true");
        if (!c) {
            ++failed;
            continue;
        }
        const result<process::exit_status> s = co_await c->wait();
        if (!s || !s->success()) ++failed;
    }
}

double spawn_round(long n, long in_flight, long& failed) {
    spindle::loop loop;
    const double t0 = wall_ns();
    loop.block_on([&]() -> spindle::task<void> {
        std::vector<spindle::join_handle<void>> starters;
        for (long i = 0; i < in_flight; ++i)
            starters.push_back(spindle::loop::current().spawn(spawn_and_wait(n / in_flight, failed)));
        for (auto& s : starters) co_await s;
    }());
    return (wall_ns() - t0) / static_cast<double>(n / in_flight * in_flight);
}

void bench_process_spawn() {
    const long n = bench_spawns();
    long failed = 0;
    (void)spawn_round(16, 1, failed);  // the reaper, the loop's signal service
    const double one = median_of(3, [&] { return spawn_round(n, 1, failed); });
    const double many = median_of(3, [&] { return spawn_round(n, 8, failed); });
    // The same with a large, touched heap: what fork(2) would copy page
    // tables of (SPINDLE_BENCH_HEAP_MIB, default 1024; 0 leaves it out).
    const char* heap_env = std::getenv("SPINDLE_BENCH_HEAP_MIB");
    const long heap_mib = heap_env ? std::atol(heap_env) : 1024;
    double heavy = 0;
    if (heap_mib > 0) {
        const std::size_t bytes = static_cast<std::size_t>(heap_mib) << 20;
        void* heap = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (heap != MAP_FAILED) {
            std::memset(heap, 1, bytes);
            heavy = median_of(3, [&] { return spawn_round(n / 4, 1, failed); });
            ::munmap(heap, bytes);
        }
    }
    if (failed) std::printf("process_spawn: %ld children failed\n", failed);
    std::printf(
        "process_spawn ns_per_op=%.1f in_flight=1 spawns=%ld in_flight_8_ns_per_op=%.1f heap_mib=%ld "
        "heap_ns_per_op=%.1f program=/bin/true\n",
        one, n, many, heap_mib, heavy);
}

// --- process_pipe: bytes through `cat`, stdin pipe in, stdout pipe out -------------

// SPINDLE_BENCH_CAT_MIB sets the bytes per round (default 1024 MiB).
std::size_t bench_cat_bytes() {
    const char* mib = std::getenv("SPINDLE_BENCH_CAT_MIB");
    return static_cast<std::size_t>(std::max(mib ? std::atol(mib) : 1024L, 1L)) << 20;
}

spindle::task<void> feed(spindle::net::unix_stream& to, std::size_t bytes, long& failed) {
    std::vector<std::byte> chunk(64 * 1024, std::byte{'x'});
    for (std::size_t sent = 0; sent < bytes; sent += chunk.size()) {
        const result<void> w = co_await to.write_all(chunk);
        if (!w) {
            ++failed;
            break;
        }
    }
    to.close();  // cat's end of input
}

spindle::task<void> drain(spindle::net::unix_stream& from, std::size_t& got, long& failed) {
    std::vector<std::byte> buf(64 * 1024);
    for (;;) {
        const result<std::size_t> n = co_await from.read_some(buf);
        if (!n) ++failed;
        if (!n || *n == 0) break;
        got += *n;
    }
}

void bench_process_pipe() {
    const std::size_t bytes = bench_cat_bytes();
    long failed = 0;
    double cpu_sum = 0;
    const auto round = [&] {
        spindle::loop loop;
        std::size_t got = 0;
        const double c0 = cpu_ns();
        const double t0 = wall_ns();
        process::spawn_options options;
        options.stdin_from = process::stdio::pipe();
        options.stdout_to = process::stdio::pipe();
        const std::vector<std::string> no_args;
        loop.block_on([&]() -> spindle::task<void> {
            result<process::child> c = process::spawn("cat", no_args, options);
            if (!c) {
                ++failed;
                co_return;
            }
            spindle::join_handle<void> in = spindle::loop::current().spawn(feed(c->stdin_pipe(), bytes, failed));
            spindle::join_handle<void> out = spindle::loop::current().spawn(drain(c->stdout_pipe(), got, failed));
            co_await in;
            co_await out;
            const result<process::exit_status> s = co_await c->wait();
            if (!s || !s->success()) ++failed;
        }());
        const double wall = wall_ns() - t0;
        cpu_sum += cpu_ns() - c0;
        if (got != bytes) ++failed;
        return wall;
    };
    (void)round();
    cpu_sum = 0;
    const double wall = median_of(3, round);
    if (failed) std::printf("process_pipe: %ld rounds failed\n", failed);
    const double mib = static_cast<double>(bytes >> 20);
    std::printf(
        "process_pipe ns_per_op=%.1f per_64kib mib_per_s=%.0f parent_cpu_ns_per_64kib=%.1f mib=%.0f "
        "program=cat\n",
        wall / (mib * 16), mib / (wall / 1e9), cpu_sum / 3 / (mib * 16), mib);
}

// --- offload_latency: a loop's answers to a client while the pool computes ---------

// A client thread pings a task of the loop over loopback TCP (1 byte each
// way, 2,000 pings 500 µs apart): first with the pool idle, then with every
// cpu thread of the pool busy on 2 ms jobs that 4 more tasks keep queued.
// The loop's thread then shares the cores with the pool's.
struct ping_figures {
    double p50_us = 0;
    double p99_us = 0;
    long failed = 0;
};

ping_figures ping_client(std::uint16_t port, int pings) {
    ping_figures f;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
        f.failed = pings;
        ::close(fd);
        return f;
    }
    std::vector<double> rtt;
    rtt.reserve(static_cast<std::size_t>(pings));
    for (int i = 0; i < pings; ++i) {
        char b = 'p';
        const double t0 = wall_ns();
        if (::send(fd, &b, 1, MSG_NOSIGNAL) != 1 || ::recv(fd, &b, 1, 0) != 1) {
            ++f.failed;
            break;
        }
        rtt.push_back((wall_ns() - t0) / 1e3);
        std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    ::close(fd);
    if (rtt.empty()) return f;
    std::sort(rtt.begin(), rtt.end());
    f.p50_us = rtt[rtt.size() / 2];
    f.p99_us = rtt[rtt.size() * 99 / 100];
    return f;
}

spindle::task<void> echo_pings(spindle::net::tcp_listener& listener) {
    spindle::result<spindle::net::tcp_stream> s = co_await listener.accept();
    if (!s) co_return;
    std::array<std::byte, 64> buf;
    for (;;) {
        spindle::result<std::size_t> n = co_await s->read_some(buf);
        if (!n || *n == 0) co_return;
        spindle::result<void> w = co_await s->write_all(std::span<const std::byte>(buf.data(), *n));
        if (!w) co_return;
    }
}

spindle::task<void> keep_pool_busy(const std::atomic<bool>& stop, long& jobs) {
    while (!stop.load(std::memory_order_relaxed)) {
        auto spin = [] {
            const double until = wall_ns() + 2e6;
            while (wall_ns() < until) {
            }
        };
        spindle::result<void> r = co_await spindle::offload(spin, spindle::job_options{.kind = spindle::job_kind::cpu});
        if (!r) co_return;
        ++jobs;
    }
}

ping_figures ping_round(bool saturated, long& jobs) {
    constexpr int pings = 2000;
    spindle::loop loop;
    spindle::result<spindle::net::tcp_listener> listener =
        spindle::net::tcp_listener::bind(spindle::net::address::ipv4_loopback(0));
    if (!listener) return {0, 0, pings};
    const std::uint16_t port = listener->local_address()->port();
    std::atomic<bool> stop{false};
    ping_figures figures;
    loop.block_on([](spindle::net::tcp_listener& l, std::uint16_t port, bool saturated, std::atomic<bool>& stop,
                     long& jobs, ping_figures& figures) -> spindle::task<void> {
        std::vector<spindle::join_handle<void>> busy;
        if (saturated) {
            const unsigned threads = spindle::offload_pool::shared().options().cpu_threads + 4;
            for (unsigned i = 0; i < threads; ++i)
                busy.push_back(spindle::loop::current().spawn(keep_pool_busy(stop, jobs)));
            (void)co_await spindle::sleep_for(std::chrono::milliseconds(20));
        }
        auto server = spindle::loop::current().spawn(echo_pings(l));
        // A thread of its own, as a client would be: not one of the pool's.
        std::atomic<bool> done{false};
        std::thread client([&, port] {
            figures = ping_client(port, pings);
            done = true;
        });
        while (!done.load()) (void)co_await spindle::sleep_for(std::chrono::milliseconds(1));
        client.join();
        stop = true;
        for (auto& b : busy) co_await b;
        co_await server;
    }(*listener, port, saturated, stop, jobs, figures));
    return figures;
}

void bench_offload_latency() {
    long jobs = 0;
    const ping_figures idle = ping_round(false, jobs);
    const ping_figures busy = ping_round(true, jobs);
    std::printf(
        "offload_latency ns_per_op=%.0f ping_p99_saturated ping_p50_idle_us=%.1f ping_p99_idle_us=%.1f "
        "ping_p50_saturated_us=%.1f ping_p99_saturated_us=%.1f cpu_jobs_2ms=%ld failed=%ld\n",
        busy.p99_us * 1e3, idle.p50_us, idle.p99_us, busy.p50_us, busy.p99_us, jobs, idle.failed + busy.failed);
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
    {"mutex", &bench_mutex},
    {"channel", &bench_channel},
    {"generator", &bench_generator},
    {"offload", &bench_offload},
    {"offload_latency", &bench_offload_latency},
    {"file_read", &bench_file_read},
    {"process_spawn", &bench_process_spawn},
    {"process_pipe", &bench_process_pipe},
};

}  // namespace

int main(int argc, char** argv) {
    // SPINDLE_BENCH_POOL_THREADS caps the offload pool, for comparisons
    // with pools of a fixed size (libuv's 4 threads).
    if (const char* threads = std::getenv("SPINDLE_BENCH_POOL_THREADS")) {
        spindle::offload_pool_options options;
        options.max_threads = static_cast<unsigned>(std::atoi(threads));
        spindle::offload_pool::configure_shared(options);
    }
    for (const auto& c : cases) {
        bool wanted = argc == 1;
        for (int i = 1; i < argc; ++i) wanted = wanted || std::strcmp(argv[i], c.name) == 0;
        if (wanted) {
            c.run();
            std::fflush(stdout);
        }
    }
}
