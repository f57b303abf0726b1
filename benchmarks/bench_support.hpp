// What spindle-echo-bench, spindle-game-bench and spindle-soak share: their
// command lines, the example servers they run as child processes, and the
// cores those run on.

#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <sched.h>
#include <string>
#include <string_view>
#include <sys/resource.h>
#include <sys/types.h>
#include <vector>

namespace spindle::bench {

// --- the command line ----------------------------------------------------------

/// A program's name, for its error messages, and its usage text: printed on
/// `out`, then the program exits with `status` (never returns).
struct program {
    const char* name;
    void (*usage)(std::FILE* out, int status);
};

/// `text` as a number in lo..hi; anything else is an error: a message naming
/// the program, then its usage and exit status 2.
long number(const program& p, std::string_view text, long lo, long hi);

/// "a,b,,c" -> {"a", "b", "c"}: the empty parts are dropped.
std::vector<std::string> split(std::string_view text, char separator = ',');

/// Exits through the usage text (status 2) unless `name` is a backend spindle knows.
void require_backend(const program& p, std::string_view name);

/// A comma-separated list of backends, each checked by require_backend.
std::vector<std::string> backend_list(const program& p, std::string_view text);

/// Unsets SPINDLE_BACKEND, saying so: the servers started would inherit it,
/// and it would override the backend each one is given.
void ignore_backend_override(const char* reason);

// --- cores -----------------------------------------------------------------------

/// The CPUs this process may run on.
cpu_set_t allowed_cpus();

/// The first `count` CPUs of `set`, lowest first (fewer if it has fewer).
std::vector<int> first_cpus(const cpu_set_t& set, std::size_t count);

/// Pins the calling thread to `cpu`; before an exec, the program it becomes.
void pin_to_cpu(int cpu);

// --- child processes -------------------------------------------------------------

/// How a child is set up between fork and exec.
struct spawn_options {
    int cpu = -1;                     ///< pin to this CPU (negative: anywhere)
    long fd_limit = -1;               ///< its soft RLIMIT_NOFILE (negative: inherited)
    bool nonblocking_output = false;  ///< O_NONBLOCK on the pipe (both of its ends)
};

/// A child whose standard output is a pipe to this process.
struct spawned_child {
    pid_t pid = -1;
    int output = -1;  ///< the pipe's read end, for the caller to close
};

/// Runs `args` (args[0] the program's path) as a child with its standard
/// output on a pipe; nullopt if the pipe or the fork failed.
std::optional<spawned_child> spawn_with_output(std::vector<std::string> args, const spawn_options& options);

/// The port in a server's first line, "NAME listening on 127.0.0.1:PORT";
/// nullopt if `line` is not that.
std::optional<std::uint16_t> announced_port(const std::string& line);

/// A server started by start_server, and the loopback port it listens on.
struct server_child {
    pid_t pid = -1;
    std::uint16_t port = 0;
};

/// Starts `path --backend BACKEND --host 127.0.0.1 --port 0 EXTRA_ARGS...` and reads the
/// port from the line it prints once it listens (at most 10 s). On failure
/// says why on stderr, and the child, if any, is killed.
std::optional<server_child> start_server(const std::string& path, const std::string& backend, const spawn_options& options,
                                         const std::vector<std::string>& extra_args = {});

/// Waits up to `limit` for `pid` to exit; kills it if it does not. Returns its
/// wait status, or nullopt if it had to be killed. `usage`, if given, gets
/// the child's resource usage over its life.
std::optional<int> reap(pid_t pid, std::chrono::milliseconds limit, rusage* usage = nullptr);

/// Sends `signal` to `pid`, then reaps it as reap() does.
std::optional<int> stop_child(pid_t pid, int signal, std::chrono::milliseconds limit, rusage* usage = nullptr);

/// Whether a wait status from reap() is an exit with status 0.
bool exited_with_zero(const std::optional<int>& status);

// --- figures ---------------------------------------------------------------------

/// The median of `v` (the mean of the middle two for an even count), 0 if empty.
double median(std::vector<double> v);

}  // namespace spindle::bench
