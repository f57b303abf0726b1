// Child processes on every backend: exit codes and deaths by signal, spawn
// errors (ENOENT, EACCES, a missing working directory), 100 MiB through cat
// with every byte checked, stdout and stderr read at once, the environment
// and working directory, a child that sees only descriptors 0, 1 and 2 and
// starts with no signal blocked or ignored, kill and process groups, a
// cancelled wait that leaves the child running, children destroyed unwaited
// (killed or not) and a loop destroyed with children still running, all
// reaped; children the test started itself left alone; 1,000 children at
// once; both ways of waiting (pidfd and SIGCHLD); and a loop group. After
// every test, no child of this process is left a zombie.

#include "support.hpp"

#include <spindle/loop_group.hpp>
#include <spindle/process.hpp>
#include <spindle/signal.hpp>
#include <spindle/timeout.hpp>
#include <spindle/when_all.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

using namespace std::chrono_literals;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::test::run;
namespace process = spindle::process;
using process::exit_status;
using process::spawn_options;
using process::stdio;

namespace {

/// Every way of waiting this test's backend has: a pidfd and SIGCHLD, and
/// EVFILT_PROC on kqueue.
std::vector<process::wait_method> methods_here() {
    std::vector<process::wait_method> m{process::wait_method::pidfd, process::wait_method::sigchld};
    if (loop().backend() == spindle::backend_kind::kqueue) m.push_back(process::wait_method::kqueue);
    return m;
}

const char* name_of(process::wait_method m) {
    switch (m) {
        case process::wait_method::pidfd: return "pidfd";
        case process::wait_method::sigchld: return "sigchld";
        case process::wait_method::kqueue: return "kqueue";
        case process::wait_method::automatic: break;
    }
    return "automatic";
}

/// /proc/PID/stat, or "" for a process that is gone. Read with read(2): a
/// process reaped between the directory's listing and the read makes it fail
/// with ESRCH, which a std::ifstream turns into an exception.
std::string stat_of(pid_t pid) {
    const int fd = ::open(("/proc/" + std::to_string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return {};
    char buf[1024];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    ::close(fd);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

/// This process's children as /proc lists them: (pid, state).
std::vector<std::pair<pid_t, char>> children_of_ours() {
    std::vector<std::pair<pid_t, char>> found;
    DIR* d = ::opendir("/proc");
    REQUIRE(d != nullptr);
    while (dirent* e = ::readdir(d)) {
        const pid_t pid = std::atoi(e->d_name);
        if (pid <= 0) continue;
        const std::string text = stat_of(pid);
        const auto close = text.rfind(')');
        if (close == std::string::npos || close + 2 > text.size()) continue;
        std::istringstream rest(text.substr(close + 2));
        char state = 0;
        pid_t ppid = 0;
        rest >> state >> ppid;
        if (ppid == ::getpid()) found.emplace_back(pid, state);
    }
    ::closedir(d);
    return found;
}

/// Arguments built outside a coroutine's body: g++ 12 cannot build an
/// initializer_list inside one.
template <class... S>
std::vector<std::string> words(S... s) {
    std::vector<std::string> v;
    (v.emplace_back(s), ...);
    return v;
}

std::size_t zombies() {
    std::size_t n = 0;
    for (auto [pid, state] : children_of_ours()) n += state == 'Z';
    return n;
}

/// Waits (without a loop) until this process has no child left at all.
bool no_children_within(std::chrono::milliseconds limit) {
    const auto give_up = std::chrono::steady_clock::now() + limit;
    while (!children_of_ours().empty()) {
        if (std::chrono::steady_clock::now() > give_up) return false;
        std::this_thread::sleep_for(10ms);
    }
    return true;
}

/// Checks, at the end of a test, that no child is a zombie.
struct no_zombies_after {
    ~no_zombies_after() { CHECK(zombies() == 0); }
};

task<result<exit_status>> run_and_wait(std::string program, std::vector<std::string> args, spawn_options options = {}) {
    result<process::child> c = process::spawn(program, args, options);
    if (!c) co_return c.error();
    co_return co_await c->wait();
}

std::string text_of_proc(pid_t pid, const char* field) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(field, 0) == 0) return line.substr(line.find(':') + 1);
    return {};
}

}  // namespace

TEST_CASE("a child's exit code and its death by a signal", "[process]") {
    no_zombies_after check;
    for (auto method : methods_here()) {
        INFO(name_of(method));
        loop l;
        spawn_options o{.waiting = method};
        const result<exit_status> three = run(l, run_and_wait("sh", {"-c", "exit 3"}, o));
        REQUIRE(three);
        CHECK(three->exited());
        CHECK(three->code == 3);
        CHECK_FALSE(three->success());
        CHECK(three->describe() == "exit code 3");
        const result<exit_status> ok = run(l, run_and_wait("/bin/true", {}, o));
        REQUIRE(ok);
        CHECK(ok->success());
        const result<exit_status> killed = run(l, run_and_wait("sh", {"-c", "kill -KILL $$"}, o));
        REQUIRE(killed);
        CHECK_FALSE(killed->exited());
        CHECK(killed->signal == SIGKILL);
        CHECK(killed->describe().rfind("killed by signal 9", 0) == 0);
    }
}

TEST_CASE("a program that cannot start is an error of the spawn", "[process]") {
    no_zombies_after check;
    loop l;
    auto error_of_spawn = [](std::string program, spawn_options o = {}) {
        result<process::child> c = process::spawn(program, {}, o);
        return c ? std::error_code{} : c.error();
    };
    CHECK(error_of_spawn("spindle-no-such-program") == std::errc::no_such_file_or_directory);
    CHECK(error_of_spawn("/nonexistent/bin/prog") == std::errc::no_such_file_or_directory);
    // A file that is not executable.
    std::string path = "/tmp/spindle-process-XXXXXX";
    const int fd = ::mkostemp(path.data(), O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, "#!/bin/sh\n", 10) == 10);
    ::close(fd);
    ::chmod(path.c_str(), 0644);
    CHECK(error_of_spawn(path) == std::errc::permission_denied);
    ::unlink(path.c_str());
    CHECK(error_of_spawn("/bin/true", {.working_directory = "/nonexistent-spindle-dir"}) ==
          std::errc::no_such_file_or_directory);
    CHECK(error_of_spawn("") == std::errc::invalid_argument);
    CHECK(error_of_spawn("/bin/true", {.set_environment = {{"A=B", "c"}}}) == std::errc::invalid_argument);
    CHECK(children_of_ours().empty());
}

TEST_CASE("100 MiB through cat and back, every byte checked", "[process]") {
    no_zombies_after check;
    loop l;
    const bool same = run(
        l,
        []() -> task<bool> {
            result<process::child> c =
                process::spawn("cat", {}, {.stdin_from = stdio::pipe(), .stdout_to = stdio::pipe()});
            REQUIRE(c);
            constexpr std::size_t total = 100u << 20;
            auto byte_at = [](std::size_t i) { return static_cast<std::byte>((i * 131 + (i >> 12)) & 0xff); };
            auto writer = [&]() -> task<bool> {
                std::vector<std::byte> chunk(64 * 1024);
                for (std::size_t at = 0; at < total; at += chunk.size()) {
                    for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = byte_at(at + i);
                    const result<void> w = co_await c->stdin_pipe().write_all(chunk);
                    if (!w) co_return false;
                }
                co_return static_cast<bool>(c->stdin_pipe().shutdown_write());
            };
            auto reader = [&]() -> task<bool> {
                std::vector<std::byte> buf(64 * 1024);
                std::size_t seen = 0;
                bool intact = true;
                for (;;) {
                    const result<std::size_t> n = co_await c->stdout_pipe().read_some(buf);
                    if (!n) co_return false;
                    if (*n == 0) break;
                    for (std::size_t i = 0; i < *n; ++i) intact = intact && buf[i] == byte_at(seen + i);
                    seen += *n;
                }
                co_return intact&& seen == total;
            };
            auto [wrote, read] = co_await spindle::when_all(writer(), reader());
            const result<exit_status> s = co_await c->wait();
            co_return wrote&& read&& s && s->success();
        }(),
        60s);
    CHECK(same);
}

TEST_CASE("stdout and stderr read at once, however the child interleaves them", "[process]") {
    no_zombies_after check;
    loop l;
    // 1 MiB to stderr before anything to stdout: a reader of stdout alone
    // would wait forever while the child blocks on a full stderr.
    const result<process::output> o =
        run(l, process::run("sh", {"-c", "head -c 1048576 /dev/zero >&2; head -c 2097152 /dev/zero; exit 4"}), 30s);
    REQUIRE(o);
    CHECK(o->err.size() == 1048576);
    CHECK(o->out.size() == 2097152);
    CHECK(o->status.code == 4);
    // The limit keeps what fits and drops the rest, still reading to the end.
    const result<process::output> cut = run(l, process::run("sh", {"-c", "head -c 100000 /dev/zero"}, {}, 1000), 30s);
    REQUIRE(cut);
    CHECK(cut->out.size() == 1000);
    CHECK(cut->status.success());
}

TEST_CASE("the environment, added to, trimmed or replaced, and the working directory", "[process]") {
    no_zombies_after check;
    loop l;
    ::setenv("SPINDLE_PARENT_ONLY", "p", 1);
    ::setenv("SPINDLE_REMOVED", "r", 1);
    const result<process::output> added =
        run(l, process::run("sh", {"-c", "echo $SPINDLE_PARENT_ONLY:$SPINDLE_ADDED:$SPINDLE_REMOVED:$(pwd)"},
                            {.set_environment = {{"SPINDLE_ADDED", "first"}, {"SPINDLE_ADDED", "a"}},
                             .unset_environment = {"SPINDLE_REMOVED"},
                             .working_directory = "/tmp"}));
    REQUIRE(added);
    CHECK(added->out == "p:a::/tmp\n");
    const result<process::output> replaced =
        run(l, process::run("/usr/bin/env", {}, {.inherit_environment = false, .set_environment = {{"ONLY", "1"}}}));
    REQUIRE(replaced);
    CHECK(replaced->out == "ONLY=1\n");
    ::unsetenv("SPINDLE_PARENT_ONLY");
    ::unsetenv("SPINDLE_REMOVED");
}

TEST_CASE("a child sees only descriptors 0, 1 and 2", "[process]") {
    no_zombies_after check;
    loop l;
    // A descriptor the application opened without O_CLOEXEC, and one with.
    const int leaky = ::open("/dev/null", O_RDONLY);
    const int marked = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    REQUIRE(leaky >= 0);
    // The shell lists its own descriptors while ls runs in a process of its
    // own ("; true" keeps the shell from replacing itself with ls).
    const result<process::output> o = run(l, process::run("sh", {"-c", "ls /proc/$$/fd; true"}));
    ::close(leaky);
    ::close(marked);
    REQUIRE(o);
    CHECK(o->out == "0\n1\n2\n");
}

TEST_CASE("a child starts with no signal blocked or ignored", "[process]") {
    no_zombies_after check;
    loop l;
    // The loop blocks what its signal service catches; SIGPIPE ignored by
    // the application would survive an exec as well.
    l.catch_signal(SIGTERM);
    l.catch_signal(SIGUSR1);
    struct sigaction ignore {
    }, old{};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &old);
    const bool clean = run(l, []() -> task<bool> {
        result<process::child> c = process::spawn("sleep", words("30"));
        REQUIRE(c);
        const std::uint64_t blocked = std::stoull(text_of_proc(c->pid(), "SigBlk"), nullptr, 16);
        const std::uint64_t ignored = std::stoull(text_of_proc(c->pid(), "SigIgn"), nullptr, 16);
        CHECK(blocked == 0);
        // Signals 1 to 31 and the real-time ones an application may use;
        // glibc's posix_spawn leaves its own two (32 and 33, which it
        // reserves) ignored (docs/processes.md).
        CHECK((ignored & ~std::uint64_t{0x180000000}) == 0);
        // SIGTERM has its default action: it ends the child.
        REQUIRE(c->kill(SIGTERM));
        const result<exit_status> s = co_await c->wait();
        co_return s && s->signal == SIGTERM;
    }());
    ::sigaction(SIGPIPE, &old, nullptr);
    CHECK(clean);
}

TEST_CASE("a cancelled wait leaves the child running; kill, then wait", "[process]") {
    no_zombies_after check;
    for (auto method : methods_here()) {
        INFO(name_of(method));
        loop l;
        const bool ok = run(l, [](process::wait_method m) -> task<bool> {
            result<process::child> c = process::spawn("sleep", words("30"), {.waiting = m});
            REQUIRE(c);
            const auto first = co_await spindle::with_timeout(50ms, c->wait());
            CHECK(spindle::test::error_of(first) == std::errc::timed_out);
            result<std::optional<exit_status>> still = c->try_wait();
            REQUIRE(still);
            CHECK_FALSE(still->has_value());
            REQUIRE(c->kill(SIGKILL));
            const result<exit_status> s = co_await c->wait();
            REQUIRE(s);
            // Reaped: the same status again, and no signal reaches a reused pid.
            const result<exit_status> again = co_await c->wait();
            REQUIRE(again);
            CHECK(*again == *s);
            CHECK(spindle::test::error_of(c->kill()) == std::errc::no_such_process);
            co_return s->signal == SIGKILL;
        }(method));
        CHECK(ok);
    }
}

TEST_CASE("EVFILT_PROC: a kqueue loop sees a child end by itself; others refuse it", "[process]") {
    no_zombies_after check;
    loop l;
    if (l.backend() != spindle::backend_kind::kqueue) {
        const bool refused = run(l, []() -> task<bool> {
            result<process::child> c =
                process::spawn("sh", words("-c", "exit 0"), {.waiting = process::wait_method::kqueue});
            REQUIRE(c);
            const result<exit_status> s = co_await c->wait();
            // Still this child's to reap, which try_wait does once it ends.
            for (int i = 0; i < 500; ++i) {
                result<std::optional<exit_status>> now = c->try_wait();
                REQUIRE(now);
                if (now->has_value()) break;
                (void)co_await spindle::sleep_for(10ms);
            }
            co_return spindle::test::error_of(s) == std::errc::operation_not_supported;
        }());
        CHECK(refused);
        return;
    }
    // Two waits for one child: the first withdrawn by its deadline, which
    // must leave the filter in place for the second.
    const bool ok = run(l, []() -> task<bool> {
        result<process::child> c = process::spawn("sleep", words("30"), {.waiting = process::wait_method::kqueue});
        REQUIRE(c);
        auto short_wait = [](process::child& one) -> task<bool> {
            const auto first = co_await spindle::with_timeout(30ms, one.wait());
            co_return spindle::test::error_of(first) == std::errc::timed_out;
        };
        auto long_wait = [](process::child& one) -> task<int> {
            const result<exit_status> s = co_await one.wait();
            co_return s ? s->signal : -1;
        };
        auto killer = [](process::child& one) -> task<bool> {
            (void)co_await spindle::sleep_for(100ms);
            co_return static_cast<bool>(one.kill(SIGTERM));
        };
        auto [timed_out, signal, killed] = co_await spindle::when_all(short_wait(*c), long_wait(*c), killer(*c));
        CHECK(timed_out);
        CHECK(killed);
        CHECK(signal == SIGTERM);
        // A child that ended before its wait began: answered at once.
        result<process::child> quick =
            process::spawn("sh", words("-c", "exit 4"), {.waiting = process::wait_method::kqueue});
        REQUIRE(quick);
        auto quick_wait = [](process::child& one) -> task<int> {
            (void)co_await spindle::sleep_for(100ms);
            const result<exit_status> s = co_await one.wait();
            co_return s ? s->code : -1;
        };
        const int code = co_await quick_wait(*quick);
        co_return timed_out&& signal == SIGTERM&& code == 4;
    }());
    CHECK(ok);
}

TEST_CASE("a process group of its own, signalled as a whole", "[process]") {
    no_zombies_after check;
    loop l;
    const bool ok = run(l, []() -> task<bool> {
        result<process::child> c =
            process::spawn("sh", words("-c", "sleep 30 & sleep 30; wait"), {.new_process_group = true});
        REQUIRE(c);
        CHECK(::getpgid(c->pid()) == c->pid());
        (void)co_await spindle::sleep_for(100ms);  // the shell has started its two sleeps
        REQUIRE(c->kill_group(SIGKILL));
        const result<exit_status> s = co_await c->wait();
        result<process::child> plain = process::spawn("/bin/true");
        REQUIRE(plain);
        CHECK(spindle::test::error_of(plain->kill_group()) == std::errc::invalid_argument);
        (void)co_await plain->wait();
        co_return s && s->signal == SIGKILL;
    }());
    CHECK(ok);
    // Both sleeps were in the group: nothing of it is left (they were the
    // shell's children, reparented when it died, so not ours to count).
    CHECK(no_children_within(2s));
}

TEST_CASE("children destroyed unwaited are killed or left to end, and reaped", "[process]") {
    for (auto method : methods_here()) {
        INFO(name_of(method));
        {
            loop l;
            result<process::child> killed =
                process::spawn("sleep", {"30"}, {.kill_on_destroy = true, .waiting = method});
            result<process::child> left = process::spawn("sleep", {"0.2"}, {.waiting = method});
            REQUIRE(killed);
            REQUIRE(left);
        }
        // The reaper thread took both: the first killed at once, the second
        // when its sleep ended.
        CHECK(no_children_within(3s));
    }
}

TEST_CASE("a loop destroyed with children still running leaves no zombie", "[process]") {
    {
        loop l;
        for (bool kill : {true, false}) {
            (void)l.spawn([](bool k) -> task<void> {
                result<process::child> c = process::spawn("sleep", words(k ? "30" : "0.3"), {.kill_on_destroy = k});
                REQUIRE(c);
                (void)co_await c->wait();
            }(kill));
        }
        spindle::test::settle(l);
        CHECK(children_of_ours().size() == 2);
    }  // the parked tasks' frames are destroyed, and their children with them
    CHECK(no_children_within(3s));
}

TEST_CASE("children the application started itself are never reaped by spindle", "[process]") {
    no_zombies_after check;
    for (auto method : methods_here()) {
        INFO(name_of(method));
        loop l;
        pid_t theirs = -1;
        char* argv[] = {const_cast<char*>("sh"), const_cast<char*>("-c"), const_cast<char*>("exit 7"), nullptr};
        REQUIRE(::posix_spawnp(&theirs, "sh", nullptr, nullptr, argv, environ) == 0);
        // Ours end after theirs, so a SIGCHLD for theirs arrives while ours
        // are waited for.
        for (int i = 0; i < 3; ++i) {
            const result<exit_status> s = run(l, run_and_wait("sh", {"-c", "sleep 0.05; exit 1"}, {.waiting = method}));
            REQUIRE(s);
            CHECK(s->code == 1);
        }
        int status = 0;
        REQUIRE(::waitpid(theirs, &status, 0) == theirs);
        CHECK(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 7);
    }
}

TEST_CASE("1,000 children at once", "[process]") {
    no_zombies_after check;
    // Each child holds a pidfd (and the test some pipes): 1,000 need more
    // than a default soft limit of 1,024 leaves.
    rlimit files{};
    ::getrlimit(RLIMIT_NOFILE, &files);
    if (files.rlim_max < 1200) {
        WARN("RLIMIT_NOFILE's hard limit is below 1,200: not tested");
        return;
    }
    const rlimit before = files;
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
    for (auto method : methods_here()) {
        INFO(name_of(method));
        loop l;
        const int ended = run(
            l,
            [](process::wait_method m) -> task<int> {
                std::vector<process::child> children;
                for (int i = 0; i < 1000; ++i) {
                    result<process::child> c = process::spawn("sh", words("-c", "read line; exit 5"),
                                                              {.stdin_from = stdio::pipe(), .waiting = m});
                    REQUIRE(c);
                    children.push_back(std::move(*c));
                }
                // All 1,000 alive at once, each waiting for its line.
                CHECK(children_of_ours().size() == 1000);
                std::vector<task<int>> waits;
                for (auto& c : children)
                    waits.push_back([](process::child& one) -> task<int> {
                        const std::string_view line = "go\n";
                        const result<void> w = co_await one.stdin_pipe().write_all(spindle::test::bytes_of(line));
                        if (!w) co_return 0;
                        const result<exit_status> s = co_await one.wait();
                        co_return s && s->code == 5 ? 1 : 0;
                    }(c));
                int n = 0;
                for (int one : co_await spindle::when_all(std::move(waits))) n += one;
                co_return n;
            }(method),
            120s);
        CHECK(ended == 1000);
    }
    ::setrlimit(RLIMIT_NOFILE, &before);
}

TEST_CASE("children on every loop of a loop group", "[process]") {
    no_zombies_after check;
    spindle::loop_group_options two;
    two.threads = 2;
    spindle::loop_group group(two);
    std::atomic<int> right{0};
    const int status = group.run([&](std::stop_token) -> task<int> {
        for (int i = 0; i < 10; ++i) {
            // Made before the co_await: g++ 12 destroys a co_await
            // expression's temporaries twice (docs/runtime.md).
            task<result<exit_status>> one = run_and_wait("sh", words("-c", "exit " + std::to_string(i)));
            const result<exit_status> s = co_await std::move(one);
            if (s && s->code == i) ++right;
        }
        co_return 0;
    });
    CHECK(status == 0);
    CHECK(right == 20);
}
