#pragma once
// The epoll backend: completion semantics on a readiness API. An operation
// tries its syscall first; only on EAGAIN does it wait, on an fd registered
// once (edge-triggered, for input and output together) the first time it had
// to wait. Each readiness edge retries the waiting operations of that fd in
// order until one hits EAGAIN again; readiness waits queued behind it still
// hear of the edge.

#include <spindle/reactor/backend.hpp>

#include <cstdint>
#include <vector>

struct epoll_event;

namespace spindle::reactor {

class epoll_backend final : public backend {
public:
    epoll_backend();
    ~epoll_backend() override;
    epoll_backend(const epoll_backend&) = delete;
    epoll_backend& operator=(const epoll_backend&) = delete;

    bool submit(operation& op) override;
    void cancel(operation& op) noexcept override;
    void forget(operation& op) noexcept override;
    void close_fd(int fd) noexcept override;
    int poll(std::chrono::nanoseconds timeout) override;
    void wake() noexcept override;
    int native_handle() const noexcept override { return m_epoll; }
    backend_kind kind() const noexcept override { return backend_kind::epoll; }

private:
    struct op_list {
        operation* head = nullptr;
        operation* tail = nullptr;
        bool empty() const noexcept { return head == nullptr; }
        void push_back(operation& op) noexcept;
        void erase(operation& op) noexcept;
    };
    struct fd_state {
        op_list readers;  // read, recv, accept, readable polls
        op_list writers;  // write, send, connect, writable polls
        std::uint32_t generation = 0;
        bool registered = false;
    };

    fd_state& state_of(int fd);
    void wait_on(operation& op);
    bool ensure_registered(int fd, fd_state& st);
    void retry(op_list& list);
    void retry(op_list& list, std::uint32_t got, bool polls_only);
    void unlink(operation& op) noexcept;
    void finish(operation& op, std::int64_t result) noexcept;
    op_list& list_for(operation& op) noexcept;

    int m_epoll = -1;
    int m_wake_fd = -1;
    bool m_pwait2 = true;  // epoll_pwait2 (ns timeouts) until the kernel says ENOSYS
    std::vector<fd_state> m_fds;
    // Persistent polls found ready at submit: completed by the next poll().
    op_list m_deferred;
    int m_completed = 0;
};

}  // namespace spindle::reactor
