#include "wait_status.hpp"

#include <sys/wait.h>

#include <cerrno>
#include <cstring>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace spindle::process {

std::string exit_status::describe() const {
    if (exited()) return "exit code " + std::to_string(code);
    std::string s = "killed by signal " + std::to_string(signal);
    if (const char* name = ::strsignal(signal)) s += std::string(" (") + name + ")";
    if (core_dumped) s += ", core dumped";
    return s;
}

namespace detail {

result<std::optional<exit_status>> reap_if_ended(int pidfd, pid_t pid) noexcept {
    siginfo_t info{};
    for (;;) {
        const int r = pidfd >= 0
                          ? ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG)
                          : ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG);
        if (r == 0) break;
        if (errno != EINTR) return std::error_code(errno, std::system_category());
    }
    if (info.si_pid == 0) return std::optional<exit_status>{};  // still running
    exit_status s;
    switch (info.si_code) {
        case CLD_EXITED: s.code = info.si_status; break;
        case CLD_DUMPED:
            s.signal = info.si_status;
            s.core_dumped = true;
            break;
        default: s.signal = info.si_status; break;  // CLD_KILLED
    }
    return std::optional<exit_status>{s};
}

}  // namespace detail

}  // namespace spindle::process
