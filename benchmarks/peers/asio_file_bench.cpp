// spindle-bench's file_read case on Asio's random_access_file, which runs on
// io_uring (standalone Asio built with ASIO_HAS_IO_URING; sockets stay on
// epoll): 4 KiB random reads from a file in the page cache
// (SPINDLE_BENCH_FILE_MIB, default 1024), 1 and 64 in flight, the same
// offsets and the same output format.

#include <asio.hpp>
#include <asio/random_access_file.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

double wall_ns() {
    return static_cast<double>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
}

double cpu_ns() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

constexpr long reads = 200'000;
long failed = 0;

asio::awaitable<void> random_reads(asio::random_access_file& f, std::uint64_t blocks, long n, std::uint64_t x) {
    std::array<char, 4096> buf;
    for (long i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        asio::error_code ec;
        const std::size_t got = co_await f.async_read_some_at((x % blocks) * buf.size(), asio::buffer(buf),
                                                              asio::redirect_error(asio::use_awaitable, ec));
        if (ec || got != buf.size()) ++failed;
    }
}

double round(const std::string& path, std::uint64_t blocks, long in_flight, double& cpu_sum) {
    asio::io_context io(1);
    asio::random_access_file f(io, path, asio::random_access_file::read_only);
    const double c0 = cpu_ns();
    const double t0 = wall_ns();
    for (long i = 0; i < in_flight; ++i)
        asio::co_spawn(
            io, random_reads(f, blocks, reads / in_flight, 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i)),
            asio::detached);
    io.run();
    const double wall = (wall_ns() - t0) / reads;
    cpu_sum += (cpu_ns() - c0) / reads;
    return wall;
}

}  // namespace

int main() {
    const char* mib = std::getenv("SPINDLE_BENCH_FILE_MIB");
    const long n = mib ? std::atol(mib) : 1024;
    const std::uint64_t bytes = static_cast<std::uint64_t>(std::max(n, 1L)) << 20;
    char path[] = "/tmp/asio-bench-file-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) return 1;
    std::vector<char> chunk(1 << 20);
    for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 31);
    for (std::uint64_t done = 0; done < bytes; done += chunk.size())
        if (::write(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) return 1;
    ::close(fd);
    const std::uint64_t blocks = bytes / 4096;
    double warm = 0, cpu_one = 0, cpu_many = 0;
    std::vector<double> one, many;
    (void)round(path, blocks, 1, warm);
    for (int i = 0; i < 3; ++i) one.push_back(round(path, blocks, 1, cpu_one));
    for (int i = 0; i < 3; ++i) many.push_back(round(path, blocks, 64, cpu_many));
    ::unlink(path);
    std::sort(one.begin(), one.end());
    std::sort(many.begin(), many.end());
    if (failed) std::printf("file_read: %ld reads failed\n", failed);
    std::printf(
        "file_read ns_per_op=%.1f in_flight=1 reads_per_s=%.0f cpu_ns_per_op=%.1f in_flight_64_ns_per_op=%.1f "
        "in_flight_64_reads_per_s=%.0f in_flight_64_cpu_ns_per_op=%.1f file_mib=%llu block=4096\n",
        one[1], 1e9 / one[1], cpu_one / 3, many[1], 1e9 / many[1], cpu_many / 3,
        static_cast<unsigned long long>(bytes >> 20));
}
