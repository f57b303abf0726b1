#pragma once
// The kqueue backend (macOS and the BSDs; libkqueue elsewhere): the epoll
// backend's semantics on kqueue. An operation tries its syscall first; only on
// EAGAIN does it wait, on a filter added once per direction (EVFILT_READ for
// readers, EVFILT_WRITE for writers) with EV_CLEAR, so it reports edges and is
// never re-armed per operation. Each edge retries the waiting operations of
// that fd in order until one hits EAGAIN again. The filters an I/O operation
// needs are sent with the next poll()'s kevent() call, not one syscall each;
// readiness waits add theirs at once and ask poll(2) for the current state.

#include <spindle/reactor/backend.hpp>

#include <cstdint>
#include <vector>

struct kevent;

namespace spindle::reactor {

class kqueue_backend final : public backend {
public:
    kqueue_backend();
    ~kqueue_backend() override;
    kqueue_backend(const kqueue_backend&) = delete;
    kqueue_backend& operator=(const kqueue_backend&) = delete;

    bool submit(operation& op) override;
    void cancel(operation& op) noexcept override;
    void forget(operation& op) noexcept override;
    void close_fd(int fd) noexcept override;
    int poll(std::chrono::nanoseconds timeout) override;
    void wake() noexcept override;
    /// The kqueue itself: readable while it holds events. libkqueue's
    /// descriptor never turns readable (a pipe's write end): -1 there.
    int native_handle() const noexcept override;
    backend_kind kind() const noexcept override { return backend_kind::kqueue; }

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
        std::uint8_t filters = 0;  // readable | writable: filters added (or queued) in this generation
        std::uint8_t got = 0;      // readiness collected by the poll() in progress
        int error = 0;             // a socket error an event reported, not yet returned
    };

    fd_state& state_of(int fd);
    void queue_filters(int fd, fd_state& st, std::uint32_t wanted);
    void add_filters_now(int fd, fd_state& st, std::uint32_t wanted);
    void flush_changes();
    void filter_failed(const struct kevent& ev) noexcept;
    void retry(fd_state& st, op_list& list, std::uint32_t got, bool polls_only);
    void unlink(operation& op) noexcept;
    void finish(operation& op, std::int64_t result) noexcept;
    op_list& list_for(operation& op) noexcept;
    void recheck_waiting_fds();  // libkqueue only

    int m_kq = -1;
    std::vector<fd_state> m_fds;
    // Filters to add, sent with the next poll()'s kevent() (never more than
    // fit in its event array, so each failure has a slot to be reported in).
    std::vector<struct kevent> m_changes;
    // Failures of changes sent outside poll(), reported by the next poll().
    std::vector<struct kevent> m_failed;
    // Descriptors with readiness in the poll() in progress, once each.
    std::vector<int> m_touched;
    // Persistent polls found ready at submit: completed by the next poll().
    op_list m_deferred;
    int m_completed = 0;
};

}  // namespace spindle::reactor
