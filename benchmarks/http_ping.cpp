// spindle-http-ping: a latency probe for an HTTP/1.1 server on loopback.
// One keep-alive connection asks GET PATH every INTERVAL_MS milliseconds for
// SECONDS seconds, and times each answer from the request's write to its
// body's last byte; then prints the percentiles. Plain blocking sockets on a
// thread of its own, so the probe measures the server and nothing of a loop.
// Bounded: SECONDS, each read with a 5 s time limit, and 100,000 pings.
//
// Usage: spindle-http-ping PORT [PATH] [SECONDS] [INTERVAL_MS]
//   prints: http_ping pings=N p50_ms=X p99_ms=X max_ms=X failed=N

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

int connect_to(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    timeval limit{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

/// One request and its whole response on `fd`; false on any failure (an
/// error, a status other than 200, a connection closed or timed out).
bool ping_once(int fd, const std::string& request, std::string& in) {
    for (std::size_t sent = 0; sent < request.size();) {
        const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) return false;
        sent += static_cast<std::size_t>(n);
    }
    in.clear();
    std::size_t head_end = std::string::npos;
    std::size_t total = 0;
    char buf[16384];
    for (;;) {
        if (head_end == std::string::npos) {
            head_end = in.find("\r\n\r\n");
            if (head_end != std::string::npos) {
                if (in.compare(0, 12, "HTTP/1.1 200") != 0) return false;
                const std::size_t at = in.find("Content-Length:");
                if (at == std::string::npos || at > head_end) return false;
                total = head_end + 4 + std::strtoull(in.c_str() + at + 15, nullptr, 10);
            }
        }
        if (head_end != std::string::npos && in.size() >= total) return in.size() == total;
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return false;
        in.append(buf, static_cast<std::size_t>(n));
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: spindle-http-ping PORT [PATH] [SECONDS] [INTERVAL_MS]\n");
        return 2;
    }
    const int port = std::atoi(argv[1]);
    const std::string path = argc > 2 ? argv[2] : "/";
    const double seconds = argc > 3 ? std::atof(argv[3]) : 10;
    const int interval_ms = argc > 4 ? std::atoi(argv[4]) : 10;
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

    int fd = connect_to(port);
    if (fd < 0) {
        std::fprintf(stderr, "spindle-http-ping: cannot connect to 127.0.0.1:%d: %s\n", port, std::strerror(errno));
        return 1;
    }
    std::vector<double> ms;
    long failed = 0;
    std::string in;
    const auto end = clock_type::now() + std::chrono::duration<double>(seconds);
    auto next = clock_type::now();
    while (clock_type::now() < end && ms.size() < 100'000) {
        const auto start = clock_type::now();
        if (ping_once(fd, request, in)) {
            ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - start).count());
        } else {
            // A failure counts and starts a new connection, outside the timing.
            ++failed;
            ::close(fd);
            fd = connect_to(port);
            if (fd < 0) break;
        }
        next += std::chrono::milliseconds(interval_ms);
        std::this_thread::sleep_until(next);
    }
    if (fd >= 0) ::close(fd);
    std::sort(ms.begin(), ms.end());
    const auto pick = [&](double p) {
        if (ms.empty()) return 0.0;
        return ms[std::min(ms.size() - 1, static_cast<std::size_t>(p / 100 * static_cast<double>(ms.size())))];
    };
    std::printf("http_ping pings=%zu p50_ms=%.3f p99_ms=%.3f max_ms=%.3f failed=%ld\n", ms.size(), pick(50), pick(99),
                ms.empty() ? 0.0 : ms.back(), failed);
    return failed > 0 && ms.empty() ? 1 : 0;
}
