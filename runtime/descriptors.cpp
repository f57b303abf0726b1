// Descriptor ownership: closing through the loop that saw a descriptor, so its
// pending operations complete with operation_canceled first, and plainly once
// that loop is gone (a listener bound before the loop, destroyed after it).

#include "loop_core.hpp"

#include <spindle/io.hpp>
#include <spindle/loop.hpp>

#include <algorithm>
#include <mutex>
#include <unistd.h>
#include <vector>

namespace spindle {

namespace {

std::mutex g_live_mutex;
std::vector<const loop*> g_live_loops;

}  // namespace

namespace detail {

void register_live_loop(const loop& l) {
    std::lock_guard lock(g_live_mutex);
    g_live_loops.push_back(&l);
}

void unregister_live_loop(const loop& l) noexcept {
    std::lock_guard lock(g_live_mutex);
    std::erase(g_live_loops, &l);
}

void loop_core::close_fd(int fd) noexcept {
    if (fd < 0) return;
    m_backend->close_fd(fd);
    ::close(fd);
}

}  // namespace detail

void loop::close_fd(int fd) noexcept { m_core->close_fd(fd); }

unique_fd::unique_fd(int fd) noexcept : m_fd(fd), m_loop(loop::current_or_null()) {}

void unique_fd::adopt_current_loop() noexcept {
    if (!m_loop) m_loop = loop::current_or_null();
}

void unique_fd::reset() noexcept {
    int fd = std::exchange(m_fd, -1);
    if (fd < 0) return;
    if (m_loop && m_loop == loop::current_or_null()) {
        m_loop->close_fd(fd);
        return;
    }
    if (m_loop) {
        std::lock_guard lock(g_live_mutex);
        if (std::find(g_live_loops.begin(), g_live_loops.end(), m_loop) != g_live_loops.end()) {
            m_loop->close_fd(fd);
            return;
        }
    }
    ::close(fd);
}

}  // namespace spindle
