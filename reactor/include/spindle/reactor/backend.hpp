#pragma once
/// The one interface every OS backend implements (epoll, io_uring, kqueue).
/// Completion-based: an operation is submitted and completes with a result.
/// Readiness backends emulate that by trying the syscall first.

#include <spindle/reactor/operation.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace spindle::reactor {

enum class backend_kind { automatic, epoll, io_uring, kqueue };

class buffer_pool;

/// The buffers of pooled receives (op_code::recv_pooled), counted.
struct read_buffer_counts {
    std::uint32_t mapped = 0;  ///< made so far; never given back to the OS while the backend lives
    std::uint32_t lent = 0;    ///< of those, held now by an operation or its owner
};

std::string_view to_string(backend_kind) noexcept;
/// The kind named "automatic", "epoll", "io_uring" or "kqueue".
std::optional<backend_kind> backend_from_string(std::string_view name) noexcept;

class backend {
public:
    virtual ~backend() = default;

    /// Starts `op`. Returns true when it completed at once (op.result is set and
    /// complete() is NOT called); false when it is pending and complete() will be
    /// called later, from poll(), cancel() or close_fd(), never from submit().
    /// Which operations complete at once is the backend's choice: epoll and
    /// kqueue try the syscall first, io_uring only queues the request. A
    /// negative `fd` completes at once with -EBADF everywhere. Throws
    /// std::system_error when the operation cannot be started (epoll cannot
    /// watch a regular file: EPERM, where io_uring answers a poll of one at
    /// once; io_uring's submission queue cannot be flushed); `op` is then not
    /// pending and complete() is never called.
    ///
    /// Several operations waiting on one descriptor in one direction are
    /// served in the order they were submitted by epoll and kqueue, in the
    /// kernel's order by io_uring; none is lost or served twice.
    virtual bool submit(operation& op) = 0;

    /// Asks a pending operation to finish early. It completes with -ECANCELED,
    /// or with its real result if it had already won the race. No-op otherwise
    /// (an operation never submitted, done, or forgotten). complete() is
    /// called from cancel() itself on epoll and kqueue, from a later poll() on
    /// io_uring, where a result the kernel made first is the likely answer.
    virtual void cancel(operation& op) noexcept = 0;

    /// The operation's memory is about to go away: never touch it again and
    /// never call its complete(). Used when a parked frame is destroyed.
    virtual void forget(operation& op) noexcept = 0;

    /// The descriptor is about to be closed: every operation still pending on it
    /// completes with -ECANCELED and the backend drops what it knows of `fd`.
    /// -ECANCELED even for a result the kernel had already made (io_uring):
    /// what it handed over (an accepted descriptor, a pooled buffer) is given
    /// back. complete() is called from close_fd() itself on epoll and kqueue,
    /// from a later poll() on io_uring. A descriptor the backend does not know
    /// of, or with nothing pending, is a no-op.
    virtual void close_fd(int fd) noexcept = 0;

    /// Waits for completions for at most `timeout` (negative: no limit, zero:
    /// do not block) or until wake(). Returns how many operations completed.
    virtual int poll(std::chrono::nanoseconds timeout) = 0;

    /// Interrupts a poll() in progress or the next one. Any thread, signal-safe.
    virtual void wake() noexcept = 0;

    /// A descriptor that becomes readable when poll() would have work, so a host
    /// with its own poller can fold this backend into it; -1 if the backend has
    /// none (kqueue emulated on Linux by libkqueue).
    virtual int native_handle() const noexcept = 0;

    /// Sends what waits for the next poll() (io_uring's queued requests,
    /// kqueue's batched registrations) to the OS now, so that a host sleeping
    /// on native_handle() is woken by it. Nothing to do for epoll.
    virtual void flush() noexcept {}

    virtual backend_kind kind() const noexcept = 0;

    /// Whether submit() performs operations of `code`. Every backend performs
    /// the operations on sockets and pipes. A file operation (is_file_op)
    /// would block the loop's thread on a readiness backend, so only io_uring
    /// performs those, where its probe lists them; the owner runs the others
    /// on a thread that may block (perform_blocking). Only kqueue performs
    /// process_exit. submit() of one a backend does not perform completes at
    /// once with -EOPNOTSUPP.
    virtual bool performs(op_code code) const noexcept { return !is_file_op(code) && code != op_code::process_exit; }

    /// Any thread (a metrics scrape), while the backend lives.
    read_buffer_counts read_buffers() const noexcept;

protected:
    /// The pool is made by the first pooled receive; from then on read_buffers() counts it.
    void publish(const buffer_pool& pool) noexcept { m_published_pool.store(&pool, std::memory_order_release); }

private:
    std::atomic<const buffer_pool*> m_published_pool{nullptr};
};

/// How the loop will use its backend, for backends that can do better when told.
struct backend_options {
    /// The backend is made, polled and destroyed on one thread, and no other
    /// thread calls anything but wake() (a loop of a loop_group). io_uring may
    /// then tie its ring to that thread (single issuer, deferred task work)
    /// and register the ring's descriptor.
    bool single_thread = false;
    /// Pooled receives (op_code::recv_pooled): the size of each buffer lent.
    std::size_t read_buffer_size = 16 * 1024;
    /// One poll() lends at most this many buffers to pooled receives; those
    /// beyond wait for the next poll(), which serves them first. io_uring
    /// hands the kernel a ring of provided buffers of this size (rounded down
    /// to a power of two, at most 32768); once those are all lent, a pooled
    /// receive waits for readiness and takes one of the pool's other buffers.
    std::uint32_t read_buffer_batch = 256;
};

/// Creates a backend. Throws std::system_error when the kind cannot start here.
/// `automatic` tries io_uring, then epoll on Linux, and is kqueue elsewhere.
/// The environment variable SPINDLE_BACKEND (automatic, epoll, io_uring or
/// kqueue; read once per process) replaces `kind` for every loop; any other
/// value throws std::invalid_argument.
std::unique_ptr<backend> make_backend(backend_kind kind);

/// The same; when `automatic` had to pass over its first choice, says why in
/// `fallback_reason` (empty otherwise), for the caller to report.
std::unique_ptr<backend> make_backend(backend_kind kind, std::string& fallback_reason);
/// The same, with `options` for the backend; `notes` says what the backend
/// had to do without (a setup flag the kernel lacks), empty when nothing.
std::unique_ptr<backend> make_backend(backend_kind kind, const backend_options& options, std::string& fallback_reason,
                                      std::string& notes);

}  // namespace spindle::reactor
