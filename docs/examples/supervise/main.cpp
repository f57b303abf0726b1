// spindle-supervise: a small process supervisor, the shape of foreman or
// honcho, on spindle::process.
//
//   spindle-supervise [--restart always|on-failure|never] [--grace-ms N]
//                     -- CMD [ARGS...] [-- CMD [ARGS...] ...]
//
// Runs every command at once, each in a process group of its own, stdin on
// /dev/null. Each line a command writes is relayed with its index and pid:
// "[0:1234] text" on stdout for its stdout, on stderr for its stderr (a line
// longer than 16 KiB is relayed in pieces, a last line without a newline as
// it is). The supervisor's own lines start with "supervise: " on stderr:
//   supervise: [0:1234] started: CMD
//   supervise: [0:1234] ended: exit code 3; restart in 200 ms
//
// --restart (default on-failure) says when a command that ended starts
// again: always, on-failure (not exit code 0), or never. Restarts back off:
// 100 ms, doubled after each restart up to 5 s, and back to 100 ms after a
// run of at least 10 s.
//
// SIGTERM or SIGINT: every command's group gets SIGTERM; a command still
// running --grace-ms later (default 5000) gets SIGKILL; the supervisor exits
// 0 once all have ended. Otherwise it exits when no command is left to run
// (every one ended and none is restarted): with the status of the first
// command that failed (its exit code, or 128 + the signal that killed it),
// or 0. A bad argument, or a command that cannot start at all (ENOENT,
// EACCES), is a clear error and exit status 2.

#include <spindle/process.hpp>
#include <spindle/spindle.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

using namespace std::chrono_literals;
using spindle::result;
using spindle::task;
namespace process = spindle::process;

namespace {

enum class restart_policy { always, on_failure, never };

struct settings {
    restart_policy restart = restart_policy::on_failure;
    std::chrono::milliseconds grace = 5000ms;
    std::vector<std::vector<std::string>> commands;
};

constexpr const char* usage =
    "usage: spindle-supervise [--restart always|on-failure|never] [--grace-ms N] -- CMD [ARGS...] [-- CMD ...]\n";

/// The settings, or a message for a bad argument.
std::optional<settings> parse(int argc, char** argv, std::string& error) {
    settings s;
    int i = 1;
    auto value_of = [&](std::string_view arg, std::string_view name) -> std::optional<std::string_view> {
        if (arg.size() > name.size() && arg.substr(0, name.size()) == name && arg[name.size()] == '=')
            return arg.substr(name.size() + 1);
        if (arg != name) return std::nullopt;
        if (i + 1 >= argc) return std::string_view{};
        return std::string_view(argv[++i]);
    };
    for (; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--") break;
        if (auto v = value_of(arg, "--restart")) {
            if (*v == "always")
                s.restart = restart_policy::always;
            else if (*v == "on-failure")
                s.restart = restart_policy::on_failure;
            else if (*v == "never")
                s.restart = restart_policy::never;
            else {
                error = "--restart takes always, on-failure or never, not '" + std::string(*v) + "'";
                return std::nullopt;
            }
        } else if (auto g = value_of(arg, "--grace-ms")) {
            long ms = -1;
            const auto [end, ec] = std::from_chars(g->data(), g->data() + g->size(), ms);
            if (g->empty() || ec != std::errc{} || end != g->data() + g->size() || ms < 0 || ms > 3'600'000) {
                error =
                    "--grace-ms takes a whole number of milliseconds from 0 to 3600000, not '" + std::string(*g) + "'";
                return std::nullopt;
            }
            s.grace = std::chrono::milliseconds(ms);
        } else if (arg == "--help" || arg == "-h") {
            std::fputs(usage, stdout);
            std::exit(0);
        } else {
            error = "unknown argument '" + std::string(arg) + "' (commands follow --)";
            return std::nullopt;
        }
    }
    if (i >= argc) {
        error = "no command: give one after --";
        return std::nullopt;
    }
    for (; i < argc; ++i) {
        if (std::string_view(argv[i]) == "--") {
            s.commands.emplace_back();
            continue;
        }
        s.commands.back().emplace_back(argv[i]);
    }
    for (std::size_t c = 0; c < s.commands.size(); ++c)
        if (s.commands[c].empty()) {
            error = "command " + std::to_string(c) + " is empty (two -- in a row, or a -- at the end)";
            return std::nullopt;
        }
    return s;
}

/// Writes all of `text` to `fd`. Blocking on purpose: a reader of the
/// supervisor's output that falls behind slows the relays down, so that the
/// commands wait on their pipes rather than the supervisor buffering without
/// bound.
void write_out(int fd, std::string_view text) {
    while (!text.empty()) {
        const ssize_t n = ::write(fd, text.data(), text.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;  // stdout closed: nothing to relay to
        text.remove_prefix(static_cast<std::size_t>(n));
    }
}

void say(std::string_view text) { write_out(STDERR_FILENO, "supervise: " + std::string(text) + "\n"); }

/// Relays `from` to `fd` line by line, each with `prefix`, until it closes.
task<void> relay(spindle::net::unix_stream& from, int fd, std::string prefix) {
    constexpr std::size_t longest = 16 * 1024;
    std::string pending;
    std::array<std::byte, 16 * 1024> buf;
    std::string batch;
    for (;;) {
        const result<std::size_t> n = co_await from.read_some(buf);
        if (!n || *n == 0) break;
        pending.append(reinterpret_cast<const char*>(buf.data()), *n);
        // What one read brought goes out in one write.
        batch.clear();
        std::size_t start = 0;
        for (;;) {
            const std::size_t newline = pending.find('\n', start);
            if (newline == std::string::npos) break;
            batch += prefix;
            batch.append(pending, start, newline + 1 - start);
            start = newline + 1;
        }
        pending.erase(0, start);
        while (pending.size() >= longest) {
            batch += prefix;
            batch.append(pending, 0, longest);
            batch += '\n';
            pending.erase(0, longest);
        }
        write_out(fd, batch);
    }
    if (!pending.empty()) write_out(fd, prefix + pending + "\n");
}

/// 128 + the signal, as a shell reports a death by signal.
int status_code(const process::exit_status& s) { return s.exited() ? s.code : 128 + s.signal; }

struct supervisor {
    settings config;
    std::stop_source stopping;  ///< requested on SIGTERM or SIGINT
    std::optional<int> first_failure;
    bool cannot_start = false;

    /// Waits for `c` to end; when a stop is asked first, SIGTERM to its
    /// group, and SIGKILL once the grace period is over.
    task<process::exit_status> wait_or_stop(process::child& c, const std::string& tag) {
        result<process::exit_status> s = co_await c.wait(stopping.get_token());
        if (!s) {
            (void)c.kill_group(SIGTERM);
            s = co_await spindle::with_timeout(config.grace, c.wait());
            if (!s) {
                say(tag + " still running after the grace period: SIGKILL");
                (void)c.kill_group(SIGKILL);
                s = co_await c.wait();
            }
        }
        if (!s) co_return process::exit_status{.code = 255};
        co_return *s;
    }

    /// Runs command `index`, again and again as the policy says.
    task<void> run_command(std::size_t index) {
        const std::vector<std::string>& argv = config.commands[index];
        const std::vector<std::string> args(argv.begin() + 1, argv.end());
        std::string line = argv[0];
        for (const auto& a : args) line += " " + a;
        auto backoff = 100ms;
        bool started_once = false;
        while (!stopping.stop_requested()) {
            const auto began = spindle::loop::now();
            result<process::child> c = process::spawn(argv[0], args,
                                                      {.stdin_from = process::stdio::null(),
                                                       .stdout_to = process::stdio::pipe(),
                                                       .stderr_to = process::stdio::pipe(),
                                                       .new_process_group = true,
                                                       // Should the supervisor itself die, its
                                                       // children go with it.
                                                       .kill_on_destroy = true});
            const std::string tag = "[" + std::to_string(index) + (c ? ":" + std::to_string(c->pid()) : "") + "]";
            process::exit_status status;
            if (!c) {
                say(tag + " cannot start " + argv[0] + ": " + c.error().message());
                if (!started_once) {
                    // A command that never ran is a bad argument.
                    cannot_start = true;
                    stopping.request_stop();
                    co_return;
                }
                status.code = 127;
            } else {
                started_once = true;
                say(tag + " started: " + line);
                auto [out, err, ended] = co_await spindle::when_all(relay(c->stdout_pipe(), STDOUT_FILENO, tag + " "),
                                                                    relay(c->stderr_pipe(), STDERR_FILENO, tag + " "),
                                                                    wait_or_stop(*c, tag));
                status = ended;
            }
            if (!status.success() && !first_failure) first_failure = status_code(status);
            const bool again = !stopping.stop_requested() &&
                               (config.restart == restart_policy::always ||
                                (config.restart == restart_policy::on_failure && !status.success()));
            if (!again) {
                say(tag + " ended: " + status.describe());
                co_return;
            }
            if (spindle::loop::now() - began >= 10s) backoff = 100ms;
            say(tag + " ended: " + status.describe() + "; restart in " + std::to_string(backoff.count()) + " ms");
            if (!co_await spindle::sleep_for(backoff, stopping.get_token())) co_return;
            backoff = std::min<std::chrono::milliseconds>(backoff * 2, 5s);
        }
    }

    task<int> run() {
        std::stop_source signals_done;
        auto on_signal = [this](std::stop_token done) -> task<void> {
            const result<int> signo = co_await spindle::wait_signal({SIGINT, SIGTERM}, done);
            if (!signo) co_return;
            say(std::string("caught ") + (*signo == SIGINT ? "SIGINT" : "SIGTERM") + ": stopping every command");
            stopping.request_stop();
        };
        spindle::join_handle<void> watch = spindle::loop::current().spawn(on_signal(signals_done.get_token()));
        std::vector<task<void>> commands;
        for (std::size_t i = 0; i < config.commands.size(); ++i) commands.push_back(run_command(i));
        co_await spindle::when_all(std::move(commands));
        const bool by_signal = stopping.stop_requested() && !cannot_start;
        signals_done.request_stop();
        co_await watch;
        if (cannot_start) co_return 2;
        if (by_signal) co_return 0;
        co_return first_failure.value_or(0);
    }
};

}  // namespace

int main(int argc, char** argv) {
    std::string error;
    std::optional<settings> config = parse(argc, argv, error);
    if (!config) {
        std::fprintf(stderr, "spindle-supervise: %s\n%s", error.c_str(), usage);
        return 2;
    }
    spindle::loop l;
    // Caught from the start, so that a signal during the first spawns is kept.
    l.catch_signal(SIGINT);
    l.catch_signal(SIGTERM);
    supervisor s;
    s.config = std::move(*config);
    return l.block_on(s.run());
}
