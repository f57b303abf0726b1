#pragma once
// The kqueue backend (macOS and the BSDs; libkqueue elsewhere): the readiness
// backends' semantics (readiness_backend.hpp) on kqueue, with a filter added
// once per direction (EVFILT_READ for readers, EVFILT_WRITE for writers) with
// EV_CLEAR, so it reports edges and is never re-armed per operation. The
// filters an I/O operation needs are sent with the next poll()'s kevent()
// call, not one syscall each; readiness waits add theirs at once and ask
// poll(2) for the current state. A child's end (process_exit) is
// EVFILT_PROC with NOTE_EXIT, one filter per pid however many wait for it.

#include "readiness_backend.hpp"

#include <cstdint>
#include <vector>

struct kevent;

namespace spindle::reactor {

class kqueue_backend final : public readiness_backend {
public:
    explicit kqueue_backend(const backend_options& options = {});
    ~kqueue_backend() override;
    kqueue_backend(const kqueue_backend&) = delete;
    kqueue_backend& operator=(const kqueue_backend&) = delete;

    bool submit(operation& op) override;
    void close_fd(int fd) noexcept override;
    int poll(std::chrono::nanoseconds timeout) override;
    void wake() noexcept override;
    /// The kqueue itself: readable while it holds events. libkqueue's
    /// descriptor never turns readable (a pipe's write end): -1 there.
    int native_handle() const noexcept override;
    void flush() noexcept override;
    backend_kind kind() const noexcept override { return backend_kind::kqueue; }
    bool performs(op_code code) const noexcept override { return !is_file_op(code); }

private:
    void queue_filters(int fd, fd_state& st, std::uint32_t wanted);
    void add_filters_now(int fd, fd_state& st, std::uint32_t wanted);
    void flush_changes();
    void filter_failed(const struct kevent& ev) noexcept;
    void recheck_waiting_fds();  // libkqueue only
    bool watch_process(operation& op);
    void unwatch_process(int pid) noexcept override;

    int m_kq = -1;
    // Filters to add, sent with the next poll()'s kevent() (never more than
    // fit in its event array, so each failure has a slot to be reported in).
    std::vector<struct kevent> m_changes;
    // Failures of changes sent outside poll(), reported by the next poll().
    std::vector<struct kevent> m_failed;
    // Descriptors with readiness in the poll() in progress, once each.
    std::vector<int> m_touched;
};

}  // namespace spindle::reactor
