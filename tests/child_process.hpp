#pragma once
// Starting a program for a test, its stdout and stderr on a pipe the test reads.

#include "catch.hpp"

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace spindle::test {

struct child_output {
    pid_t pid = -1;
    int out = -1;  ///< the read end of the child's stdout and stderr
};

/// Starts `argv` (found on PATH) with its output on a pipe.
inline child_output spawn_with_output(std::vector<std::string> argv) {
    int out[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::dup2(out[1], STDOUT_FILENO);
        ::dup2(out[1], STDERR_FILENO);
        std::vector<char*> args;
        for (auto& a : argv) args.push_back(a.data());
        args.push_back(nullptr);
        ::execvp(args[0], args.data());
        ::_exit(127);
    }
    ::close(out[1]);
    return {pid, out[0]};
}

}  // namespace spindle::test
