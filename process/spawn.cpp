#include <spindle/loop.hpp>
#include <spindle/process.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

extern char** environ;

namespace spindle::process {

namespace {

std::error_code os_error(int e) noexcept { return {e, std::system_category()}; }

#ifdef __linux__
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
/// The child's pidfd (close-on-exec, as every pidfd is), or -1 with errno.
int open_pidfd(pid_t pid) noexcept { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }
#else
int open_pidfd(pid_t) noexcept {
    errno = ENOSYS;
    return -1;
}
#endif

/// Whether this kernel gives pidfds, asked once: a seccomp filter may refuse
/// them with EPERM, an old kernel with ENOSYS.
bool pidfds_available() noexcept {
    static const bool available = [] {
        const int fd = open_pidfd(::getpid());
        if (fd < 0) return false;
        ::close(fd);
        return true;
    }();
    return available;
}

bool has_nul(std::string_view s) noexcept { return s.find('\0') != std::string_view::npos; }

/// The child's environment as "NAME=value" strings.
std::vector<std::string> environment_of(const spawn_options& options) {
    std::vector<std::string> env;
    auto replaced = [&](std::string_view entry) {
        const std::string_view name = entry.substr(0, entry.find('='));
        for (const auto& u : options.unset_environment)
            if (u == name) return true;
        for (const auto& [n, v] : options.set_environment)
            if (n == name) return true;
        return false;
    };
    if (options.inherit_environment)
        for (char** e = environ; e && *e; ++e)
            if (!replaced(*e)) env.emplace_back(*e);
    // A name set twice: the later entry wins, as it would with setenv.
    for (std::size_t i = 0; i < options.set_environment.size(); ++i) {
        const auto& [name, value] = options.set_environment[i];
        bool later = false;
        for (std::size_t j = i + 1; j < options.set_environment.size(); ++j)
            later = later || options.set_environment[j].first == name;
        if (!later) env.push_back(name + "=" + value);
    }
    return env;
}

/// posix_spawn's attribute and file action objects, destroyed on every path.
struct spawn_plan {
    posix_spawnattr_t attr;
    posix_spawn_file_actions_t actions;
    bool attr_made = false;
    bool actions_made = false;
    /// Descriptors the parent made for the child only (its pipe ends, the
    /// copies of given descriptors): closed once the child has its own.
    std::vector<unique_fd> for_child;

    ~spawn_plan() {
        if (attr_made) posix_spawnattr_destroy(&attr);
        if (actions_made) posix_spawn_file_actions_destroy(&actions);
    }
};

/// A copy of `fd` at 3 or above, close-on-exec: the dup2 onto 0, 1 or 2
/// then never meets a source that an earlier dup2 replaced, and the copy
/// itself is closed by the exec.
result<int> high_copy(int fd, spawn_plan& plan) {
    const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (copy < 0) return os_error(errno);
    plan.for_child.emplace_back(copy, nullptr);
    return copy;
}

/// Sets up the child's descriptor `target` (0, 1 or 2) as `how` says; a pipe's
/// parent end goes to `parent_end`.
std::error_code plan_stdio(spawn_plan& plan, int target, const stdio& how, net::unix_stream& parent_end) {
    switch (how.how()) {
        case stdio::kind::inherit: return {};
        case stdio::kind::null: {
            const int flags = target == 0 ? O_RDONLY : O_WRONLY;
            return os_error(posix_spawn_file_actions_addopen(&plan.actions, target, "/dev/null", flags, 0));
        }
        case stdio::kind::descriptor: {
            if (how.fd() < 0) return make_error_code(std::errc::bad_file_descriptor);
            result<int> copy = high_copy(how.fd(), plan);
            if (!copy) return copy.error();
            return os_error(posix_spawn_file_actions_adddup2(&plan.actions, *copy, target));
        }
        case stdio::kind::pipe: {
            int ends[2];
            if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) return os_error(errno);
            unique_fd ours(ends[0], nullptr);
            unique_fd theirs(ends[1], nullptr);
            // Ours does not block, as every descriptor a loop drives; theirs
            // does, as a program expects of its standard streams (O_NONBLOCK
            // belongs to each end's own open file).
            if (::fcntl(ours.get(), F_SETFL, ::fcntl(ours.get(), F_GETFL) | O_NONBLOCK) != 0) return os_error(errno);
#ifdef SO_NOSIGPIPE
            const int on = 1;
            ::setsockopt(ours.get(), SOL_SOCKET, SO_NOSIGPIPE, &on, sizeof on);
#endif
            result<int> copy = high_copy(theirs.get(), plan);
            if (!copy) return copy.error();
            parent_end = net::unix_stream(std::move(ours));
            return os_error(posix_spawn_file_actions_adddup2(&plan.actions, *copy, target));
        }
    }
    return {};
}

}  // namespace

result<child> spawn(std::string_view program, const std::vector<std::string>& args, const spawn_options& options) {
    if (program.empty() || has_nul(program) || has_nul(options.working_directory))
        return make_error_code(std::errc::invalid_argument);
    for (const auto& a : args)
        if (has_nul(a)) return make_error_code(std::errc::invalid_argument);
    for (const auto& [name, value] : options.set_environment)
        if (name.empty() || name.find('=') != std::string::npos || has_nul(name) || has_nul(value))
            return make_error_code(std::errc::invalid_argument);

    bool by_pidfd = false;
    switch (options.waiting) {
        case wait_method::automatic: by_pidfd = pidfds_available(); break;
        case wait_method::pidfd:
            if (!pidfds_available()) return make_error_code(std::errc::function_not_supported);
            by_pidfd = true;
            break;
        case wait_method::sigchld:
        case wait_method::kqueue: break;
    }
    spawn_plan plan;
    if (int e = posix_spawnattr_init(&plan.attr)) return os_error(e);
    plan.attr_made = true;
    if (int e = posix_spawn_file_actions_init(&plan.actions)) return os_error(e);
    plan.actions_made = true;

    // The child starts clean: a loop thread blocks the signals its signalfd
    // reads, and a child would inherit that mask (and ignore SIGTERM); a
    // disposition set to SIG_IGN would survive the exec as well.
    short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&plan.attr, &none);
    posix_spawnattr_setsigdefault(&plan.attr, &all);
    if (options.new_session) {
#ifdef POSIX_SPAWN_SETSID
        flags |= POSIX_SPAWN_SETSID;
#else
        return make_error_code(std::errc::function_not_supported);
#endif
    } else if (options.new_process_group) {
        flags |= POSIX_SPAWN_SETPGROUP;
        posix_spawnattr_setpgroup(&plan.attr, 0);
    }
    posix_spawnattr_setflags(&plan.attr, flags);

    child c;
    if (std::error_code e = plan_stdio(plan, 0, options.stdin_from, c.m_stdin)) return e;
    if (std::error_code e = plan_stdio(plan, 1, options.stdout_to, c.m_stdout)) return e;
    if (std::error_code e = plan_stdio(plan, 2, options.stderr_to, c.m_stderr)) return e;
    if (!options.working_directory.empty()) {
#if defined(__GLIBC__) || defined(__APPLE__) || defined(__FreeBSD__)
        if (int e = posix_spawn_file_actions_addchdir_np(&plan.actions, options.working_directory.c_str()))
            return os_error(e);
#else
        return make_error_code(std::errc::function_not_supported);
#endif
    }
    // Nothing but 0, 1 and 2 reaches the program: descriptors that the
    // application opened without O_CLOEXEC included.
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    if (int e = posix_spawn_file_actions_addclosefrom_np(&plan.actions, 3)) return os_error(e);
#endif

    std::vector<std::string> env = environment_of(options);
    std::vector<char*> envp;
    envp.reserve(env.size() + 1);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string program_z(program);
    std::vector<std::string> argv_store;
    argv_store.reserve(args.size() + 1);
    argv_store.push_back(program_z);
    argv_store.insert(argv_store.end(), args.begin(), args.end());
    std::vector<char*> argv;
    argv.reserve(argv_store.size() + 1);
    for (auto& a : argv_store) argv.push_back(a.data());
    argv.push_back(nullptr);

    // glibc's posix_spawn is clone(CLONE_VM | CLONE_VFORK): no page table is
    // copied, however large the heap, and an exec that fails (or a chdir)
    // is its return value, not a child exiting with 127.
    pid_t pid = -1;
    const bool search = program.find('/') == std::string_view::npos;
    const int e = search ? posix_spawnp(&pid, program_z.c_str(), &plan.actions, &plan.attr, argv.data(), envp.data())
                         : posix_spawn(&pid, program_z.c_str(), &plan.actions, &plan.attr, argv.data(), envp.data());
    if (e != 0) return os_error(e);

    c.m_pid = pid;
    c.m_kill_on_destroy = options.kill_on_destroy;
    c.m_group = options.new_session || options.new_process_group;
    c.m_waiting = options.waiting;
    if (by_pidfd) {
        // Race-free: the child is ours and unreaped, so its pid cannot have
        // been reused yet (short of a waitpid(-1) elsewhere in the process).
        const int fd = open_pidfd(pid);
        // Refused after the probe allowed it (EMFILE): the child runs, so
        // it is waited for by SIGCHLD instead, never lost.
        if (fd >= 0) c.m_pidfd = unique_fd(fd);
    }
    return c;
}

}  // namespace spindle::process
