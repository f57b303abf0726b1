// A program for test_backends: opens loops the way it is told and prints which
// backend each one got, what spindle logged and any error, one line each. A
// process of its own because the backend choice (SPINDLE_BACKEND) is read once
// per process, and a seccomp filter cannot be taken back.
//
//   backend-probe [--backend NAME] [--loops N] [--deny-io-uring]
//   backend-probe --deny-io-uring --exec PROGRAM [ARGS...]
//
// The second form runs another program under the filter (it outlives exec):
// a test program asked for io_uring where io_uring is forbidden.

#include <spindle/io.hpp>
#include <spindle/log.hpp>
#include <spindle/loop.hpp>
#include <spindle/task.hpp>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <system_error>

namespace {

// Makes io_uring_setup fail with EPERM, as a container's default seccomp
// profile does. (It matches the native system call number only; that is the
// one liburing uses.)
bool deny_io_uring_setup() {
    ::sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, static_cast<unsigned>(offsetof(::seccomp_data, nr))),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    ::sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
    return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
           ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

// The backend must do real work, not only start: one byte through a pipe.
spindle::task<bool> echo_byte(int r, int w) {
    char out = 'x', in = 0;
    auto sent = co_await spindle::write(w, std::as_bytes(std::span(&out, 1)));
    auto got = co_await spindle::read(r, std::as_writable_bytes(std::span(&in, 1)));
    co_return sent && got && *got == 1 && in == 'x';
}

}  // namespace

int main(int argc, char** argv) {
    spindle::loop_options options;
    int loops = 1;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--backend" && i + 1 < argc) {
            auto kind = spindle::backend_from_string(argv[++i]);
            if (!kind) return 2;
            options.backend = *kind;
        } else if (arg == "--loops" && i + 1 < argc) {
            loops = std::stoi(argv[++i]);
        } else if (arg == "--deny-io-uring") {
            if (!deny_io_uring_setup()) {
                std::printf("error: seccomp: %s\n", std::strerror(errno));
                return 4;
            }
        } else if (arg == "--exec" && i + 1 < argc) {
            ::execv(argv[i + 1], argv + i + 1);
            std::printf("error: exec %s: %s\n", argv[i + 1], std::strerror(errno));
            return 6;
        } else {
            return 2;
        }
    }

    auto logger = std::make_shared<spdlog::logger>("spindle", std::make_shared<spdlog::sinks::stdout_sink_st>());
    logger->set_pattern("log %l: %v");
    logger->set_level(spdlog::level::info);
    logger->flush_on(spdlog::level::info);
    spindle::set_logger(logger);

    for (int i = 0; i < loops && i < 16; ++i) {
        try {
            spindle::loop lp(options);
            int fds[2];
            if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return 5;
            const bool works = lp.block_on(echo_byte(fds[0], fds[1]));
            ::close(fds[0]);
            ::close(fds[1]);
            std::printf("backend %s%s\n", std::string(to_string(lp.backend())).c_str(), works ? "" : " (broken)");
        } catch (const std::exception& e) {
            std::printf("error: %s\n", e.what());
            std::fflush(stdout);
            return 3;
        }
        std::fflush(stdout);
    }
    return 0;
}
