// The demo: starts spindle-http and spindle-echo as their own processes, drives
// each for a few seconds with spindle's own load generator, prints what it
// measured, then stops both with SIGTERM and checks that they exit cleanly.

#include "../load/load.hpp"
#include "service.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <optional>
#include <string>
#include <string_view>
#include <sys/wait.h>
#include <unistd.h>

using namespace std::chrono_literals;
using namespace spindle;
using namespace spindle::examples;

namespace {

struct server {
    pid_t pid = -1;
    std::uint16_t port = 0;
};

// Starts `program` on a free port and reads the port from the line it prints
// ("<name> listening on 127.0.0.1:PORT").
std::optional<server> start(const std::string& program) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return std::nullopt;
    pid_t pid = ::fork();
    if (pid < 0) return std::nullopt;
    if (pid == 0) {
        ::dup2(out[1], STDOUT_FILENO);
        ::execl(program.c_str(), program.c_str(), "--port", "0", static_cast<char*>(nullptr));
        std::fprintf(stderr, "cannot start %s: %s\n", program.c_str(), std::strerror(errno));
        ::_exit(127);
    }
    ::close(out[1]);
    std::string line;
    char c;
    while (line.size() < 256 && ::read(out[0], &c, 1) == 1 && c != '\n') line += c;
    ::close(out[0]);
    auto colon = line.rfind(':');
    if (line.find(" listening on ") == std::string::npos || colon == std::string::npos) {
        std::fprintf(stderr, "%s did not start (said: '%s')\n", program.c_str(), line.c_str());
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        return std::nullopt;
    }
    return server{pid, static_cast<std::uint16_t>(std::stoi(line.substr(colon + 1)))};
}

bool stop(const server& s, const char* name) {
    ::kill(s.pid, SIGTERM);
    int status = 0;
    ::waitpid(s.pid, &status, 0);
    const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::printf("%s: stopped by SIGTERM, %s\n", name, clean ? "exit status 0" : "did NOT exit cleanly");
    return clean;
}

task<int> drive(server http, server echo) {
    int failures = 0;
    struct run {
        const char* what;
        load_mode mode;
        std::uint16_t port;
        int connections;
        int depth;
    };
    const run runs[] = {
        {"spindle-http, 50 connections, 1 request in flight each", load_mode::http, http.port, 50, 1},
        {"spindle-http, 50 connections, 16 pipelined requests each", load_mode::http, http.port, 50, 16},
        {"spindle-echo, 50 connections, 64-byte messages", load_mode::echo, echo.port, 50, 1},
    };
    for (const run& r : runs) {
        load_options o;
        o.mode = r.mode;
        o.target = net::address::ipv4_loopback(r.port);
        o.connections = r.connections;
        o.depth = r.depth;
        o.duration = 3s;
        load_report report = co_await run_load(o);
        std::printf("%-58s %s\n", r.what, report.summary().c_str());
        if (!report.first_error.empty()) std::printf("  first error: %s\n", report.first_error.c_str());
        if (report.errors != 0 || report.requests == 0) ++failures;
        std::fflush(stdout);
    }
    co_return failures;
}

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        const bool help = arg == "--help" || arg == "-h";
        std::fprintf(help ? stdout : stderr,
                     "usage: spindle-demo\n"
                     "Starts spindle-http and spindle-echo (built next to this program) on loopback, drives\n"
                     "each for a few seconds with spindle's load generator (every response checked),\n"
                     "prints requests per second and latency, and stops both with SIGTERM.\n"
                     "SPINDLE_BACKEND=epoll|io_uring|kqueue chooses the backend of all three.\n");
        if (!help) std::fprintf(stderr, "spindle-demo: unknown argument '%s'\n", argv[i]);
        return help ? 0 : 2;
    }
    // The servers are built next to this program.
    std::string dir = argv[0];
    dir = dir.substr(0, dir.rfind('/') + 1);
    std::optional<server> http = start(dir + "spindle-http");
    std::optional<server> echo = start(dir + "spindle-echo");
    int failures = 0;
    if (http && echo) {
        std::printf("spindle-http on 127.0.0.1:%u, spindle-echo on 127.0.0.1:%u; 3 s per run, loopback\n\n", http->port, echo->port);
        std::fflush(stdout);
        std::optional<loop> l;
        failures = open_loop(l, {}) ? l->block_on(drive(*http, *echo)) : 1;
        std::printf("\n");
    } else {
        failures = 1;
    }
    if (http && !stop(*http, "spindle-http")) ++failures;
    if (echo && !stop(*echo, "spindle-echo")) ++failures;
    return failures == 0 ? 0 : 1;
}
