#pragma once
// The epoll backend: the readiness backends' semantics (readiness_backend.hpp)
// on an fd registered once (edge-triggered, for input and output together)
// the first time an operation on it had to wait.

#include "readiness_backend.hpp"

#include <cstdint>

namespace spindle::reactor {

class epoll_backend final : public readiness_backend {
public:
    explicit epoll_backend(const backend_options& options = {});
    ~epoll_backend() override;
    epoll_backend(const epoll_backend&) = delete;
    epoll_backend& operator=(const epoll_backend&) = delete;

    bool submit(operation& op) override;
    int poll(std::chrono::nanoseconds timeout) override;
    void wake() noexcept override;
    int native_handle() const noexcept override { return m_epoll; }
    backend_kind kind() const noexcept override { return backend_kind::epoll; }

private:
    bool ensure_registered(int fd, fd_state& st);

    int m_epoll = -1;
    int m_wake_fd = -1;
    bool m_pwait2 = true;  // epoll_pwait2 (ns timeouts) until the kernel says ENOSYS
};

}  // namespace spindle::reactor
