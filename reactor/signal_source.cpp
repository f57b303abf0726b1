#include <spindle/reactor/signal_source.hpp>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <fcntl.h>
#include <mutex>
#include <stdexcept>
#if defined(__linux__)
#include <sys/signalfd.h>
#endif
#include <system_error>
#include <unistd.h>

namespace spindle::reactor {

namespace {

[[noreturn]] void throw_errno(const char* what) { throw std::system_error(errno, std::system_category(), what); }

#if defined(__linux__)
// signalfd: the signals are blocked in the calling thread (the loop's) and
// read as data. Another thread that does not block them may still receive
// them the classic way: block them in every thread (before starting threads)
// when that matters.
class signalfd_source final : public signal_source {
public:
    signalfd_source() {
        sigemptyset(&m_mask);
        sigemptyset(&m_blocked_by_us);
        m_fd = ::signalfd(-1, &m_mask, SFD_NONBLOCK | SFD_CLOEXEC);
        if (m_fd < 0) throw_errno("signalfd");
    }
    ~signalfd_source() override {
        // Consume what is pending before unblocking, or it would be delivered
        // with its default action (often: end the process) the moment we unblock.
        drain([](void*, int) {}, nullptr);
        ::pthread_sigmask(SIG_UNBLOCK, &m_blocked_by_us, nullptr);
        ::close(m_fd);
    }

    void add(int signo) override {
        if (sigismember(&m_mask, signo) == 1) return;
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, signo);
        sigset_t old;
        if (::pthread_sigmask(SIG_BLOCK, &one, &old) != 0) throw std::runtime_error("pthread_sigmask failed");
        if (sigismember(&old, signo) == 0) sigaddset(&m_blocked_by_us, signo);
        sigaddset(&m_mask, signo);
        if (::signalfd(m_fd, &m_mask, 0) < 0) throw_errno("signalfd");
    }

    int fd() const noexcept override { return m_fd; }

    void drain(void (*on_signal)(void*, int), void* ctx) override {
        std::array<signalfd_siginfo, 16> infos;
        for (;;) {
            ssize_t n = ::read(m_fd, infos.data(), sizeof infos);
            if (n < 0) {
                if (errno == EINTR) continue;
                return;  // EAGAIN: all read
            }
            for (std::size_t i = 0; i < static_cast<std::size_t>(n) / sizeof(signalfd_siginfo); ++i)
                on_signal(ctx, static_cast<int>(infos[i].ssi_signo));
            if (static_cast<std::size_t>(n) < sizeof infos) return;
        }
    }

    signal_mechanism mechanism() const noexcept override { return signal_mechanism::signalfd; }

private:
    int m_fd = -1;
    sigset_t m_mask;
    sigset_t m_blocked_by_us;
};
#endif  // __linux__

// The self-pipe trick: the handler only writes the signal number into a pipe,
// the one thing that is safe inside a handler; the loop reads the pipe.
// Handlers are process-wide, so one pipe per signal is recorded here.
constexpr int max_signal = 65;
// The write end of the pipe for each signal, plus one (zero: nobody catches it).
std::array<std::atomic<int>, max_signal> g_pipe_plus_one{};

extern "C" void self_pipe_handler(int signo) {
    if (signo <= 0 || signo >= max_signal) return;
    int fd = g_pipe_plus_one[static_cast<std::size_t>(signo)].load(std::memory_order_relaxed) - 1;
    if (fd < 0) return;
    const int saved = errno;
    const auto byte = static_cast<unsigned char>(signo);
    // A full pipe drops the byte: the loop is awake and reading anyway.
    [[maybe_unused]] auto r = ::write(fd, &byte, 1);
    errno = saved;
}

class self_pipe_source final : public signal_source {
public:
    self_pipe_source() {
        int fds[2];
#if defined(__APPLE__)
        // No pipe2 on macOS: set the flags after (a fork+exec on another
        // thread in between would inherit the pipe).
        if (::pipe(fds) < 0) throw_errno("pipe");
        for (int fd : fds) {
            if (::fcntl(fd, F_SETFL, O_NONBLOCK) < 0 || ::fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
                const int err = errno;
                ::close(fds[0]);
                ::close(fds[1]);
                throw std::system_error(err, std::system_category(), "fcntl");
            }
        }
#else
        if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) < 0) throw_errno("pipe2");
#endif
        m_read = fds[0];
        m_write = fds[1];
    }
    ~self_pipe_source() override {
        for (int signo = 1; signo < max_signal; ++signo) {
            if (!m_installed[static_cast<std::size_t>(signo)]) continue;
            ::sigaction(signo, &m_previous[static_cast<std::size_t>(signo)], nullptr);
            g_pipe_plus_one[static_cast<std::size_t>(signo)].store(0);
        }
        ::close(m_read);
        ::close(m_write);
    }

    void add(int signo) override {
        if (signo <= 0 || signo >= max_signal) throw std::invalid_argument("spindle: bad signal number");
        auto index = static_cast<std::size_t>(signo);
        if (m_installed[index]) return;
        int expected = 0;
        if (!g_pipe_plus_one[index].compare_exchange_strong(expected, m_write + 1))
            throw std::logic_error("spindle: another loop already catches this signal");
        struct sigaction sa {};
        sa.sa_handler = &self_pipe_handler;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        if (::sigaction(signo, &sa, &m_previous[index]) < 0) {
            g_pipe_plus_one[index].store(0);
            throw_errno("sigaction");
        }
        m_installed[index] = true;
    }

    int fd() const noexcept override { return m_read; }

    void drain(void (*on_signal)(void*, int), void* ctx) override {
        unsigned char buf[64];
        for (;;) {
            ssize_t n = ::read(m_read, buf, sizeof buf);
            if (n < 0) {
                if (errno == EINTR) continue;
                return;
            }
            if (n == 0) return;
            for (ssize_t i = 0; i < n; ++i) on_signal(ctx, buf[i]);
        }
    }

    signal_mechanism mechanism() const noexcept override { return signal_mechanism::self_pipe; }

private:
    int m_read = -1;
    int m_write = -1;
    std::array<bool, max_signal> m_installed{};
    std::array<struct sigaction, max_signal> m_previous{};
};

}  // namespace

std::unique_ptr<signal_source> make_signal_source(signal_mechanism mechanism) {
    switch (mechanism) {
#if defined(__linux__)
        case signal_mechanism::automatic:
        case signal_mechanism::signalfd: return std::make_unique<signalfd_source>();
#else
        case signal_mechanism::automatic: return std::make_unique<self_pipe_source>();
        case signal_mechanism::signalfd:
            throw std::system_error(std::make_error_code(std::errc::function_not_supported),
                                    "spindle: signalfd is Linux only");
#endif
        case signal_mechanism::self_pipe: return std::make_unique<self_pipe_source>();
    }
    throw std::invalid_argument("spindle: unknown signal mechanism");
}

}  // namespace spindle::reactor
