#include "reaper.hpp"

#include "wait_status.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <csignal>
#include <mutex>
#include <thread>
#include <vector>

namespace spindle::process::detail {

namespace {

/// One thread for the whole process, started by the first child it is
/// handed, never joined: it only ever waits in poll(2), so it holds nothing
/// at exit, and the children it still watches then pass to init, which
/// reaps them. The object is never destroyed, so that no exit-time
/// destructor can race the thread.
class reaper {
public:
    static reaper& instance() {
        static reaper* const r = new reaper;  // never destroyed: see above
        return *r;
    }

    void take(int pidfd, pid_t pid) noexcept {
        {
            std::lock_guard lock(m_mutex);
            try {
                m_incoming.push_back({pidfd, pid});
            } catch (...) {
                // No memory for one more entry: the child stays a zombie
                // until exit, which is better than failing its owner.
                if (pidfd >= 0) ::close(pidfd);
                return;
            }
        }
        const char one = 1;
        (void)!::write(m_wake[1], &one, 1);
    }

private:
    struct orphan {
        int pidfd;
        pid_t pid;
    };

    reaper() {
        if (::pipe2(m_wake, O_CLOEXEC | O_NONBLOCK) != 0) throw std::system_error(errno, std::system_category());
        // Every signal blocked: a signal meant for the application's loops
        // (SIGTERM to a loop group) must never land on this thread.
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        std::thread t([this] { run(); });
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
#ifdef __linux__
        pthread_setname_np(t.native_handle(), "spindle-reaper");
#endif
        t.detach();
    }

    void run() noexcept {
        std::vector<orphan> watched;
        std::vector<pollfd> fds;
        for (;;) {
            fds.clear();
            fds.push_back({m_wake[0], POLLIN, 0});
            bool by_pid = false;
            for (const orphan& o : watched) {
                if (o.pidfd >= 0) fds.push_back({o.pidfd, POLLIN, 0});
                by_pid = by_pid || o.pidfd < 0;
            }
            // Children without a pidfd give no descriptor to wait on: they
            // are looked for every 100 ms (only on kernels without pidfds,
            // or after an EMFILE).
            ::poll(fds.data(), fds.size(), by_pid ? 100 : -1);
            char drain[64];
            while (::read(m_wake[0], drain, sizeof drain) > 0) {
            }
            {
                std::lock_guard lock(m_mutex);
                watched.insert(watched.end(), m_incoming.begin(), m_incoming.end());
                m_incoming.clear();
            }
            std::erase_if(watched, [](const orphan& o) {
                result<std::optional<exit_status>> now = reap_if_ended(o.pidfd, o.pid);
                if (now && !*now) return false;  // still running
                // Reaped, or gone (someone else's waitpid(-1) took it).
                if (o.pidfd >= 0) ::close(o.pidfd);
                return true;
            });
        }
    }

    int m_wake[2] = {-1, -1};
    std::mutex m_mutex;
    std::vector<orphan> m_incoming;
};

}  // namespace

void hand_to_reaper(int pidfd, pid_t pid) noexcept {
    try {
        reaper::instance().take(pidfd, pid);
    } catch (...) {
        // No thread could start: the child is a zombie until exit.
        if (pidfd >= 0) ::close(pidfd);
    }
}

}  // namespace spindle::process::detail
