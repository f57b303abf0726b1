#pragma once
// What the readiness backends (epoll, kqueue) share: completion semantics on a
// readiness API. An operation tries its syscall first; only on EAGAIN does it
// wait, in its fd's list for its direction. Each readiness edge retries the
// waiting operations of that fd in order until one hits EAGAIN again;
// readiness waits queued behind it still hear of the edge.
//
// A backend derived from this one says how a descriptor is watched, how the
// kernel is waited on and its events decoded, and how wake() works. It calls
// the helpers below from its own submit() and poll() rather than being called
// back, so an operation's way through costs no virtual call (only a watcher
// already ready at submit calls wake()).

#include <spindle/reactor/backend.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <vector>

namespace spindle::reactor {

class readiness_backend : public backend {
public:
    void cancel(operation& op) noexcept final;
    void forget(operation& op) noexcept final;
    void close_fd(int fd) noexcept override;

protected:
    explicit readiness_backend(const backend_options& options);
    ~readiness_backend() override;

    // Pending operations, linked through operation::next and prev.
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
        std::uint8_t watched = 0;  // readable | writable: watched by the kernel (or queued to be) in this generation
        std::uint8_t got = 0;      // readiness collected by the poll() in progress, where it comes in several events
        int error = 0;             // a socket error an event reported, not yet returned
        // A stream receive came back short since the last readable edge: the
        // socket is empty, and on epoll the next receive waits for an edge
        // instead of trying first (its recv would only say EAGAIN). Safe with
        // edge triggering: data that arrives after that receive raises a new
        // edge. kqueue keeps the mark but tries every receive.
        bool drained = false;
        // The peer's end (or an error) was reported (set by epoll): it stays
        // to be read after the data before it, and raises no second edge, so
        // a short receive no longer means an empty socket.
        bool read_closed = false;
    };

    fd_state& state_of(int fd);
    // Null for a descriptor never seen: an event for it is stale.
    fd_state* known_state(std::size_t fd) noexcept { return fd < m_fds.size() ? &m_fds[fd] : nullptr; }

    static bool complete_now(operation& op, std::int64_t result) noexcept;
    // Tries the operation's syscall (or starts its connect). True: it completed
    // and op.result is set; false: it must wait for readiness.
    bool attempt(operation& op, fd_state& st) noexcept;
    // A stream receive on a socket a short receive emptied: no use trying it
    // before the next readable edge.
    static bool drained_for(const operation& op, const fd_state& st) noexcept { return st.drained && op.stream; }
    // The operation waits in its fd's list for its direction.
    void park(operation& op, fd_state& st) noexcept;
    // Parks a readiness wait that found `ready` at submit; returns submit()'s value.
    bool start_poll(operation& op, fd_state& st, std::uint32_t ready) noexcept;
    // The fd reported `got` (readable | writable): serves its waiters.
    void on_ready(fd_state& st, std::uint32_t got);
    // Completes the persistent polls that were ready at submit, and serves
    // the pooled receives the last poll held back. Starts each poll.
    void complete_deferred() noexcept;
    bool has_deferred() const noexcept { return !m_deferred.empty() || !m_postponed.empty(); }
    void finish(operation& op, std::int64_t result) noexcept;

    // process_exit, on a backend that performs it (kqueue): its waits, by pid.
    // The backend watches each pid once, however many wait for it, and is
    // told (unwatch_process) when the last wait for one goes.
    void park_process(operation& op) noexcept;
    bool watching_process(int pid) const noexcept;
    void process_ended(int pid) noexcept;
    virtual void unwatch_process(int /*pid*/) noexcept {}

    static std::uint32_t ready_now(int fd, std::uint32_t events) noexcept;
    // Null for no limit (a negative timeout).
    static ::timespec* to_timespec(std::chrono::nanoseconds timeout, ::timespec& ts) noexcept;

    std::vector<fd_state> m_fds;
    int m_completed = 0;  // by the poll() in progress

private:
    // The operation's syscall; a pooled receive lends a buffer only for data.
    std::int64_t transfer(operation& op) noexcept;
    // Notes a stream receive that emptied its socket (fd_state::drained).
    void note_received(const operation& op, fd_state& st, std::int64_t r) const noexcept;
    std::int64_t receive_pooled(operation& op) noexcept;
    bool batch_lent() const noexcept;
    void retry(fd_state& st, op_list& list, std::uint32_t got, bool polls_only);
    void unlink(operation& op) noexcept;
    op_list& list_for(operation& op) noexcept;

    // Persistent polls found ready at submit: completed by the next poll().
    op_list m_deferred;
    // Pooled receives whose fd turned readable while m_read_buffer_batch
    // buffers were on their way to tasks that had not run yet: served first
    // by the next poll, so that a burst of readable connections (thousands,
    // after a quiet spell) does not lend a buffer to each before any task
    // has run to give one back.
    op_list m_postponed;
    op_list m_processes;  // process_exit waits
    std::size_t m_read_buffer_size;
    std::uint32_t m_read_buffer_batch;
    buffer_pool* m_pool = nullptr;  // made by the first pooled receive
};

}  // namespace spindle::reactor
