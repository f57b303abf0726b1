#include "bench_support.hpp"

#include <spindle/backend_kind.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace std::chrono_literals;

namespace spindle::bench {

namespace {

// The usage callback exits by itself; the exit here only makes that certain
// for the compiler, which cannot see [[noreturn]] through a pointer.
[[noreturn]] void exit_with_usage(const program& p) {
    p.usage(stderr, 2);
    std::exit(2);
}

}  // namespace

long number(const program& p, std::string_view text, long lo, long hi) {
    long v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) {
        std::fprintf(stderr, "%s: '%.*s' is not a number in %ld..%ld\n", p.name, static_cast<int>(text.size()), text.data(), lo,
                     hi);
        exit_with_usage(p);
    }
    return v;
}

std::vector<std::string> split(std::string_view text, char separator) {
    std::vector<std::string> parts;
    for (;;) {
        const auto at = text.find(separator);
        if (at != 0 && !text.empty()) parts.emplace_back(text.substr(0, at));
        if (at == std::string_view::npos) break;
        text.remove_prefix(at + 1);
    }
    return parts;
}

void require_backend(const program& p, std::string_view name) {
    if (backend_from_string(name)) return;
    std::fprintf(stderr, "%s: unknown backend '%.*s'\n", p.name, static_cast<int>(name.size()), name.data());
    exit_with_usage(p);
}

std::vector<std::string> backend_list(const program& p, std::string_view text) {
    std::vector<std::string> backends = split(text);
    for (const std::string& b : backends) require_backend(p, b);
    return backends;
}

void ignore_backend_override(const char* reason) {
    if (const char* env = std::getenv("SPINDLE_BACKEND")) {
        std::printf("note: ignoring SPINDLE_BACKEND=%s (%s)\n", env, reason);
        ::unsetenv("SPINDLE_BACKEND");
    }
}

cpu_set_t allowed_cpus() {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    ::sched_getaffinity(0, sizeof allowed, &allowed);
    return allowed;
}

std::vector<int> first_cpus(const cpu_set_t& set, std::size_t count) {
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE && cpus.size() < count; ++c)
        if (CPU_ISSET(c, &set)) cpus.push_back(c);
    return cpus;
}

void pin_to_cpu(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    ::sched_setaffinity(0, sizeof set, &set);
}

std::optional<spawned_child> spawn_with_output(std::vector<std::string> args, const spawn_options& options) {
    // The argument vector is made before the fork: the child only calls
    // what is safe between fork and exec.
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2];
    if (::pipe2(out, O_CLOEXEC | (options.nonblocking_output ? O_NONBLOCK : 0)) != 0) return std::nullopt;
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(out[0]);
        ::close(out[1]);
        return std::nullopt;
    }
    if (pid == 0) {
        // Pinned before exec, so the server never runs a single instruction
        // on the core of the load that drives it.
        if (options.cpu >= 0) pin_to_cpu(options.cpu);
        if (options.fd_limit >= 0) {
            rlimit lim{};
            ::getrlimit(RLIMIT_NOFILE, &lim);
            lim.rlim_cur = static_cast<rlim_t>(options.fd_limit);
            if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) ::_exit(126);
        }
        ::dup2(out[1], STDOUT_FILENO);
        ::execv(argv[0], argv.data());
        std::fprintf(stderr, "cannot start %s: %s\n", argv[0], std::strerror(errno));
        ::_exit(127);
    }
    ::close(out[1]);
    return spawned_child{pid, out[0]};
}

std::optional<std::uint16_t> announced_port(const std::string& line) {
    const auto colon = line.rfind(':');
    if (line.find(" listening on ") == std::string::npos || colon == std::string::npos) return std::nullopt;
    return static_cast<std::uint16_t>(std::atoi(line.c_str() + colon + 1));
}

std::optional<server_child> start_server(const std::string& path, const std::string& backend, const spawn_options& options,
                                         const std::vector<std::string>& extra_args) {
    std::vector<std::string> args{path, "--backend", backend, "--host", "127.0.0.1", "--port", "0"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    const std::optional<spawned_child> child = spawn_with_output(std::move(args), options);
    if (!child) return std::nullopt;
    // At most 10 s and 256 bytes for the line.
    std::string line;
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (line.size() < 256 && std::chrono::steady_clock::now() < until) {
        pollfd p{child->output, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        char c;
        if (::read(child->output, &c, 1) != 1 || c == '\n') break;
        line += c;
    }
    ::close(child->output);
    const std::optional<std::uint16_t> port = announced_port(line);
    if (!port) {
        std::fprintf(stderr, "%s --backend %s did not start (said: '%s')\n", path.c_str(), backend.c_str(), line.c_str());
        ::kill(child->pid, SIGKILL);
        reap(child->pid, 5s);
        return std::nullopt;
    }
    return server_child{child->pid, *port};
}

std::optional<int> reap(pid_t pid, std::chrono::milliseconds limit, rusage* usage) {
    const auto until = std::chrono::steady_clock::now() + limit;
    int status = 0;
    for (;;) {
        const pid_t r = ::wait4(pid, &status, WNOHANG, usage);
        if (r == pid) return status;
        if (r < 0 && errno != EINTR) return std::nullopt;
        if (std::chrono::steady_clock::now() >= until) break;
        ::usleep(5000);
    }
    ::kill(pid, SIGKILL);
    ::wait4(pid, &status, 0, usage);
    return std::nullopt;
}

std::optional<int> stop_child(pid_t pid, int signal, std::chrono::milliseconds limit, rusage* usage) {
    ::kill(pid, signal);
    return reap(pid, limit, usage);
}

bool exited_with_zero(const std::optional<int>& status) {
    return status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace spindle::bench
