// Backend selection and fallback, checked in child processes (the backend
// choice is read once per process): an io_uring that cannot start, made so by
// a seccomp filter or by the fault hook, leaves automatic on epoll with one
// info line; asking for it explicitly is an error; SPINDLE_BACKEND wins over
// loop_options; a name that is not a backend is refused. A test program on a
// backend that cannot start is skipped (exit code 77), and fails on a name
// that is not a backend.

#include "support.hpp"

#include <spindle/loop.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

struct outcome {
    int exit_code = -1;
    std::string output;
    int count(const std::string& needle) const {
        int n = 0;
        for (auto at = output.find(needle); at != std::string::npos; at = output.find(needle, at + 1)) ++n;
        return n;
    }
};

// Runs `args` (a program, then its arguments) with exactly these SPINDLE_*
// variables set (others unset); its output is stdout and stderr together.
outcome run_program(std::vector<std::string> args, const std::map<std::string, std::string>& env) {
    int out[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::dup2(out[1], STDOUT_FILENO);
        ::dup2(out[1], STDERR_FILENO);
        ::unsetenv("SPINDLE_BACKEND");
        ::unsetenv("SPINDLE_IO_URING_FAIL");
        for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        ::execv(argv[0], argv.data());
        ::_exit(127);
    }
    ::close(out[1]);
    outcome result;
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    char buf[512];
    while (std::chrono::steady_clock::now() < deadline) {
        ::pollfd pfd{out[0], POLLIN, 0};
        if (::poll(&pfd, 1, 100) <= 0) continue;
        const ssize_t n = ::read(out[0], buf, sizeof buf);
        if (n <= 0) break;
        result.output.append(buf, static_cast<std::size_t>(n));
    }
    ::close(out[0]);
    int status = 0;
    if (std::chrono::steady_clock::now() >= deadline) ::kill(pid, SIGKILL);
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return result;
}

outcome probe(std::vector<std::string> args, const std::map<std::string, std::string>& env) {
    const char* path = std::getenv("SPINDLE_BACKEND_PROBE");
    REQUIRE(path);
    args.insert(args.begin(), path);
    return run_program(std::move(args), env);
}

// A test program built with the tests' main, which skips (exit code 77) when
// SPINDLE_BACKEND names a backend that cannot start.
std::string test_program() {
    const char* path = std::getenv("SPINDLE_TEST_PROGRAM");
    REQUIRE(path);
    return path;
}

constexpr int exit_skipped = 77;

#if SPINDLE_HAVE_IO_URING
// Whether io_uring starts on this machine at all; the kernel or a container
// may forbid it, and then automatic must land on epoll without any help.
bool io_uring_works_here() {
    static const bool works = probe({"--backend", "io_uring"}, {}).exit_code == 0;
    return works;
}
#endif

}  // namespace

TEST_CASE("backends: epoll asked for is epoll", "[backends]") {
    auto r = probe({"--backend", "epoll"}, {});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output == "backend epoll\n");
}

TEST_CASE("backends: SPINDLE_BACKEND overrides loop_options", "[backends]") {
    auto r = probe({"--backend", "io_uring", "--loops", "2"}, {{"SPINDLE_BACKEND", "epoll"}});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output == "backend epoll\nbackend epoll\n");
}

TEST_CASE("backends: a SPINDLE_BACKEND that names no backend is refused", "[backends]") {
    auto r = probe({}, {{"SPINDLE_BACKEND", "select"}});
    INFO(r.output);
    CHECK(r.exit_code == 3);
    CHECK(r.count("SPINDLE_BACKEND='select' is not a backend") == 1);
}

TEST_CASE("backends: a test program whose SPINDLE_BACKEND names no backend fails", "[backends]") {
    auto r = run_program({test_program()}, {{"SPINDLE_BACKEND", "select"}});
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.count("error: spindle: SPINDLE_BACKEND='select' is not a backend") == 1);
}

#if !SPINDLE_HAVE_KQUEUE
TEST_CASE("backends: a test program on a backend not built in is skipped", "[backends]") {
    auto r = run_program({test_program()}, {{"SPINDLE_BACKEND", "kqueue"}});
    INFO(r.output);
    CHECK(r.exit_code == exit_skipped);
    CHECK(r.count("skipped: backend kqueue cannot start: spindle: backend 'kqueue' is not built in") == 1);
}
#endif

#if SPINDLE_HAVE_IO_URING

TEST_CASE("backends: a test program on an io_uring that cannot start is skipped", "[backends]") {
    // Forbidden by a seccomp filter, as a container's profile does; the filter
    // outlives the probe's exec of the test program.
    auto denied = probe({"--deny-io-uring", "--exec", test_program()}, {{"SPINDLE_BACKEND", "io_uring"}});
    INFO(denied.output);
    CHECK(denied.exit_code == exit_skipped);
    CHECK(denied.count("skipped: backend io_uring cannot start: ") == 1);
    CHECK(denied.count("forbidden") == 1);

    auto faulted = run_program({test_program()}, {{"SPINDLE_BACKEND", "io_uring"}, {"SPINDLE_IO_URING_FAIL", "1"}});
    INFO(faulted.output);
    CHECK(faulted.exit_code == exit_skipped);
    CHECK(faulted.count("skipped: backend io_uring cannot start: ") == 1);
}

TEST_CASE("backends: automatic picks io_uring where it starts", "[backends]") {
    auto r = probe({"--loops", "2"}, {});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    if (io_uring_works_here()) {
        CHECK(r.output == "backend io_uring\nbackend io_uring\n");
    } else {
        CHECK(r.count("backend epoll\n") == 2);
        CHECK(r.count("log info: io_uring unavailable, using epoll") == 1);
    }
}

TEST_CASE("backends: io_uring forbidden by seccomp falls back to epoll, logged once", "[backends]") {
    auto r = probe({"--deny-io-uring", "--loops", "3"}, {});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.count("backend epoll\n") == 3);
    CHECK(r.count("(broken)") == 0);
    CHECK(r.count("log info: io_uring unavailable, using epoll") == 1);
    CHECK(r.count("Operation not permitted") == 1);
}

TEST_CASE("backends: io_uring asked for but forbidden is a clear error", "[backends]") {
    auto r = probe({"--deny-io-uring", "--backend", "io_uring"}, {});
    INFO(r.output);
    CHECK(r.exit_code == 3);
    CHECK(r.count("error: ") == 1);
    CHECK(r.count("forbidden") == 1);
    CHECK(r.count("backend ") == 0);

    auto by_env = probe({"--deny-io-uring"}, {{"SPINDLE_BACKEND", "io_uring"}});
    INFO(by_env.output);
    CHECK(by_env.exit_code == 3);
}

TEST_CASE("backends: the fault hook makes io_uring fail the same way", "[backends]") {
    auto r = probe({"--loops", "2"}, {{"SPINDLE_IO_URING_FAIL", "1"}});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.count("backend epoll\n") == 2);
    CHECK(r.count("log info: io_uring unavailable, using epoll") == 1);

    auto asked = probe({"--backend", "io_uring"}, {{"SPINDLE_IO_URING_FAIL", "1"}});
    INFO(asked.output);
    CHECK(asked.exit_code == 3);
}

#else

TEST_CASE("backends: without io_uring built in, automatic is epoll and io_uring is refused", "[backends]") {
    auto r = probe({}, {});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.count("backend epoll\n") == 1);
    auto asked = probe({"--backend", "io_uring"}, {});
    INFO(asked.output);
    CHECK(asked.exit_code == 3);
    CHECK(asked.count("not built in") == 1);
}

#endif
