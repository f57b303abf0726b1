#pragma once
/// Child processes: `spindle::process::spawn` starts a program with its
/// standard streams inherited, closed to /dev/null, given descriptors or
/// pipes the loop reads and writes as byte streams, and `co_await
/// child.wait()` gives its exit status. docs/processes.md has the rules and
/// their reasons: how the child starts clean (an empty signal mask, default
/// dispositions, only descriptors 0, 1 and 2), how every child is reaped,
/// and what a wait's cancellation leaves running.

#include <spindle/net/unix.hpp>
#include <spindle/result.hpp>
#include <spindle/task.hpp>

#include <sys/types.h>

#include <csignal>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace spindle::process {

/// What one of the child's standard streams is.
class stdio {
public:
    enum class kind { inherit, null, pipe, descriptor };

    /// The parent's own stream (the default).
    static stdio inherit() noexcept { return stdio(kind::inherit, -1); }
    /// /dev/null.
    static stdio null() noexcept { return stdio(kind::null, -1); }
    /// A pipe the parent holds the other end of, as a net::unix_stream
    /// (a socket pair, as libuv makes it, so it is a byte stream on every
    /// backend; the child's end blocks, the parent's does not).
    static stdio pipe() noexcept { return stdio(kind::pipe, -1); }
    /// A descriptor of the parent's, duplicated into the child; the parent
    /// keeps its own and may close it once spawn has returned.
    static stdio descriptor(int fd) noexcept { return stdio(kind::descriptor, fd); }

    kind how() const noexcept { return m_kind; }
    int fd() const noexcept { return m_fd; }

private:
    stdio(kind k, int fd) noexcept : m_kind(k), m_fd(fd) {}
    kind m_kind;
    int m_fd;
};

/// How a child's end is learnt.
enum class wait_method {
    automatic,  ///< pidfd where the kernel has it (Linux 5.3), else kqueue on a kqueue loop, else sigchld
    pidfd,      ///< the child's pidfd, watched by the loop; ENOSYS without it
    sigchld,    ///< SIGCHLD through the loop's signal service, then this child's own waitid
    kqueue,     ///< EVFILT_PROC on the waiting loop's kqueue; operation_not_supported at wait on another backend
};

struct spawn_options {
    /// Start from the parent's environment (true) or from an empty one.
    bool inherit_environment = true;
    /// Variables set (NAME, value), after the inherited ones; a later entry wins.
    std::vector<std::pair<std::string, std::string>> set_environment = {};
    /// Variables removed from the inherited ones.
    std::vector<std::string> unset_environment = {};
    /// The child's working directory; empty: the parent's.
    std::string working_directory = {};
    stdio stdin_from = stdio::inherit();
    stdio stdout_to = stdio::inherit();
    stdio stderr_to = stdio::inherit();
    /// setsid(2) in the child: a session (and process group) of its own, no
    /// controlling terminal.
    bool new_session = false;
    /// A process group of its own (its pgid is its pid), so that
    /// kill_group() reaches what it starts.
    bool new_process_group = false;
    /// When the child object is destroyed before a wait saw the child end:
    /// SIGKILL it first (true), or leave it running (false). Either way it
    /// is reaped when it ends, never left a zombie.
    bool kill_on_destroy = false;
    wait_method waiting = wait_method::automatic;
};

/// How a child ended: an exit code, or the signal that killed it.
struct exit_status {
    int code = 0;    ///< exit(3)'s status, when it exited
    int signal = 0;  ///< the signal that ended it, or 0 when it exited
    bool core_dumped = false;

    bool exited() const noexcept { return signal == 0; }
    bool success() const noexcept { return signal == 0 && code == 0; }
    /// "exit code 3", "killed by signal 9 (Killed)".
    std::string describe() const;
    friend bool operator==(const exit_status&, const exit_status&) = default;
};

class child;

/// Starts `program` with `args` (argv[1] on; argv[0] is `program`). A
/// program without a '/' is looked up on the parent's PATH. A program that
/// cannot be started is an error of this call (no_such_file_or_directory,
/// permission_denied, ...), never a child that exits with 127: so is a
/// working directory that does not exist. On a loop's thread the child
/// belongs to that loop; otherwise to the loop of the first wait.
result<child> spawn(std::string_view program, const std::vector<std::string>& args = {},
                    const spawn_options& options = {});

/// What run() collected.
struct output {
    exit_status status;
    std::string out;  ///< everything the child wrote to stdout
    std::string err;  ///< and to stderr
};

/// Spawns with stdout and stderr on pipes (stdin as `options` says, pipes
/// excepted: /dev/null then), reads both at once until the child closes
/// them, and waits for it. At most `limit` bytes of each are kept; more is
/// read and dropped, so the child never blocks on a full pipe.
task<result<output>> run(std::string program, std::vector<std::string> args = {}, spawn_options options = {},
                         std::size_t limit = 64 * 1024 * 1024, std::stop_token token = {});

class child {
public:
    child() noexcept = default;
    child(child&& other) noexcept;
    child& operator=(child&& other) noexcept;
    child(const child&) = delete;
    child& operator=(const child&) = delete;
    /// Without a wait that saw the child end: kill_on_destroy's SIGKILL, and
    /// the child handed to the process's reaper (docs/processes.md).
    ~child();

    bool valid() const noexcept { return m_pid > 0; }
    pid_t pid() const noexcept { return m_pid; }

    /// The parent's ends of the pipes asked for (stdio::pipe()); a stream
    /// that is not open otherwise. Closing stdin_pipe() (or shutdown_write)
    /// is the child's end of input.
    net::unix_stream& stdin_pipe() noexcept { return m_stdin; }
    net::unix_stream& stdout_pipe() noexcept { return m_stdout; }
    net::unix_stream& stderr_pipe() noexcept { return m_stderr; }

    /// Waits for the child to end and reaps it. Answers its exit status
    /// (the same again on every later wait), or operation_canceled when the
    /// token fires: the child then runs on, and a later wait (or the
    /// reaper) still sees its end. A deadline: `with_timeout(d,
    /// child.wait())`, then kill() and wait again.
    task<result<exit_status>> wait(std::stop_token token = {});
    /// The status when the child has ended (reaping it), nullopt while it
    /// runs. Never blocks.
    result<std::optional<exit_status>> try_wait();

    /// Sends `signo` to the child (through its pidfd where there is one, so
    /// never to another process that reused the pid). no_such_process once
    /// it was reaped.
    result<void> kill(int signo = SIGTERM);
    /// Sends `signo` to the child's process group (new_process_group or
    /// new_session); invalid_argument for a child without one.
    result<void> kill_group(int signo = SIGTERM);

private:
    friend result<child> spawn(std::string_view, const std::vector<std::string>&, const spawn_options&);
    void release() noexcept;

    pid_t m_pid = -1;
    unique_fd m_pidfd;                               ///< not open when waited for by SIGCHLD or EVFILT_PROC
    wait_method m_waiting = wait_method::automatic;  ///< how, when m_pidfd is not open
    bool m_kill_on_destroy = false;
    bool m_group = false;
    std::optional<exit_status> m_status;  ///< set once reaped
    net::unix_stream m_stdin;
    net::unix_stream m_stdout;
    net::unix_stream m_stderr;
};

}  // namespace spindle::process
