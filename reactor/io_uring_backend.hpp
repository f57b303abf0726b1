#pragma once
// The io_uring backend: every operation is a request to the kernel, which
// completes it by itself; poll() sends what was queued since the last call and
// waits for completions in one io_uring_enter, then dispatches them.
//
// A request's user_data is a slot index and that slot's generation, never a
// pointer: a completion that arrives for an operation already forgotten finds
// its slot freed (or reused under a newer generation) and is dropped.
//
// Lifetimes: an operation's buffers belong to the kernel from the moment its
// request is queued until its final completion has been collected from the
// ring. cancel() only asks (the operation completes later, from poll());
// forget() asks and then waits for that final completion before returning.

#include <spindle/reactor/backend.hpp>

#include <liburing.h>

#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

// liburing 2.3 knows every flag the backend uses; older headers may not. The
// values are the kernel's (include/uapi/linux/io_uring.h), so the ring still
// asks for them and a kernel that lacks them answers EINVAL, which we handle.
#ifndef IORING_SETUP_SUBMIT_ALL
#define IORING_SETUP_SUBMIT_ALL (1U << 7)
#endif
#ifndef IORING_SETUP_COOP_TASKRUN
#define IORING_SETUP_COOP_TASKRUN (1U << 8)
#endif
#ifndef IORING_SETUP_TASKRUN_FLAG
#define IORING_SETUP_TASKRUN_FLAG (1U << 9)
#endif
#ifndef IORING_SQ_TASKRUN
#define IORING_SQ_TASKRUN (1U << 2)
#endif
#ifndef IORING_FEAT_CQE_SKIP
#define IORING_FEAT_CQE_SKIP (1U << 11)
#endif
#ifndef IORING_SETUP_SINGLE_ISSUER
#define IORING_SETUP_SINGLE_ISSUER (1U << 12)
#endif
#ifndef IORING_SETUP_DEFER_TASKRUN
#define IORING_SETUP_DEFER_TASKRUN (1U << 13)
#endif

namespace spindle::reactor {

/// IORING_OP_FTRUNCATE (6.9), newer than some liburing headers.
inline constexpr int io_uring_op_ftruncate = 55;

class io_uring_backend final : public backend {
public:
    /// Sets up a ring. Throws std::system_error saying why io_uring cannot run
    /// here (no kernel support, forbidden by seccomp or kernel.io_uring_disabled,
    /// not enough lockable memory, a kernel too old for the operations we use).
    /// With options.single_thread, `notes` says which of the single-thread
    /// setup flags the kernel refused (empty when all were taken).
    io_uring_backend(const backend_options& options, std::string& notes);
    ~io_uring_backend() override;
    io_uring_backend(const io_uring_backend&) = delete;
    io_uring_backend& operator=(const io_uring_backend&) = delete;

    bool submit(operation& op) override;
    void cancel(operation& op) noexcept override;
    void forget(operation& op) noexcept override;
    void close_fd(int fd) noexcept override;
    int poll(std::chrono::nanoseconds timeout) override;
    void wake() noexcept override;
    int native_handle() const noexcept override { return m_ring.ring_fd; }
    void flush() noexcept override;
    backend_kind kind() const noexcept override { return backend_kind::io_uring; }
    bool performs(op_code code) const noexcept override;

private:
    // user_data: generation << 32 | slot index. Slot generations are never 0, so
    // generation 0 marks the backend's own requests; they never reach 0xffffffff
    // either, which liburing uses for its internal timeouts on old kernels.
    static constexpr std::uint64_t cancel_data = 1;  // acknowledgements of cancel requests: ignored
    // The wake-up poll; re-armed under the other value when another thread takes
    // the loop over, so the old request's last completion is told apart.
    static constexpr std::uint64_t wake_data = 2;
    static constexpr std::uint64_t wake_data_alt = 3;
    static constexpr std::uint32_t max_generation = 0x7fffffff;
    static constexpr std::uint32_t no_slot = std::numeric_limits<std::uint32_t>::max();

    static constexpr std::uint32_t next_generation(std::uint32_t generation) noexcept {
        return generation == max_generation ? 1 : generation + 1;
    }

    enum class slot_state : std::uint8_t {
        free,
        in_kernel,  // a request is queued or submitted; its final completion is still to come
        collected,  // the final completion was taken from the ring, not yet dispatched
        parked,     // waits in its descriptor's feed, with no request of its own
    };
    struct slot {
        operation* op = nullptr;  // null once forgotten while the kernel still held it
        std::uint32_t generation = 1;
        std::uint32_t next_free = 0;
        // Where its request went in the submission ring: the kernel has taken
        // the request once the ring's head has moved past this position.
        std::uint32_t sq_position = 0;
        slot_state state = slot_state::free;
        // A cancel request went out for the current request (cancel(), forget()
        // or close_fd()): nothing is retried or re-armed any more.
        bool cancel_requested = false;
        // close_fd() was called on its descriptor: it completes with
        // -ECANCELED even if the kernel finished it first.
        bool closed = false;
        // The operation hit EAGAIN; the request in the kernel is a one-shot poll
        // for its direction, after which the operation is sent again.
        bool awaiting_readiness = false;
        // A pooled receive that cannot have the kernel pick from its ring (none,
        // or all lent): it waits for readiness, then receives into a buffer
        // taken from the pool (held in op.args.pooled.id while in the kernel).
        bool pooled_plain = false;
        // It went the plain way because the ring was dry (not for an EAGAIN):
        // once readable, it goes back to the ring if the ring has buffers again.
        bool ring_was_dry = false;
        // m_issuer_epoch when the request was made.
        std::uint32_t issuer_epoch = 0;
        // The next operation parked in the same feed, in arrival order.
        std::uint32_t next_waiter = no_slot;
    };
    // A descriptor's feed (io_uring_feeds.cpp): one multishot receive serves
    // the pooled receives of a byte stream, so that the kernel's request and
    // its poll stay armed from one receive to the next. What arrives while no
    // receive waits is queued here, in order; a read of any other kind on the
    // descriptor is served from the queue first and then retires the feed.
    struct arrival {
        std::int32_t res;         // bytes in the buffer; 0 (end of stream) or -errno: a feed's last
        std::uint32_t id;         // the buffer, when res > 0
        std::uint32_t taken = 0;  // bytes already copied out to a read of another kind
    };
    enum class feed_stage : std::uint8_t {
        idle,      // no request in the kernel
        armed,     // the multishot receive is in the kernel
        retiring,  // armed, and cancelled: its final completion is still to come
    };
    struct feed {
        std::uint32_t generation = 1;  // advanced by close_fd: late completions are dropped
        feed_stage stage = feed_stage::idle;
        bool plain_only = false;  // a read of another kind came: no multishot again until close_fd
        bool delivered = false;   // the current request has completed at least once
        std::uint32_t sq_position = 0;
        std::uint32_t first_waiter = no_slot;
        std::uint32_t last_waiter = no_slot;
        std::uint32_t head = 0;  // arrivals before it were taken
        std::vector<arrival> arrivals;

        bool has_arrivals() const noexcept { return head < arrivals.size(); }
        bool busy() const noexcept { return stage != feed_stage::idle || first_waiter != no_slot || has_arrivals(); }
    };
    // Data arrivals a feed queues before it retires for want of a reader: the
    // socket's own buffer, not ours, holds what a slow reader has not taken.
    static constexpr std::uint32_t feed_backlog = 4;
    // A feed's user_data: this bit, its generation << 32, its descriptor.
    static constexpr std::uint64_t feed_bit = std::uint64_t{1} << 63;
    // A completion copied out of the ring, so the ring's slot can be reused at
    // once and dispatching can be deferred.
    struct completion {
        std::uint64_t user_data;
        std::int32_t res;
        std::uint32_t flags;
    };

    // Making the ring and probing the kernel (io_uring_setup.cpp).
    void setup_ring(std::string& notes);
    void register_ring(std::string& notes) noexcept;
    void check_kernel();

    // Slots, requests and completions (io_uring_backend.cpp).
    std::uint32_t allocate_slot(operation& op);
    void release_slot(std::uint32_t index) noexcept;
    std::uint64_t user_data_of(std::uint32_t index) const noexcept;
    ::io_uring_sqe* get_sqe() noexcept;
    bool queue_request(std::uint32_t index) noexcept;
    bool queue_cancel(std::uint32_t index) noexcept;
    bool queue_cancel_of(std::uint64_t target) noexcept;
    void arm_wake() noexcept;
    void adopt_calling_thread() noexcept;

    void collect() noexcept;
    void note(const ::io_uring_cqe& cqe) noexcept;
    void dispatch();
    void finish_request(std::uint32_t index, std::int32_t res, std::uint32_t flags);
    void finish(std::uint32_t index, std::int64_t result);
    void link_fd(operation& op) noexcept;
    void unlink_fd(operation& op) noexcept;
    bool lookup(const operation& op, std::uint32_t& index) const noexcept;

    // Pooled receives and the ring of provided buffers (io_uring_buffers.cpp,
    // ring_pool in io_uring_ring_pool.hpp).
    void start_pooled(std::uint32_t index) noexcept;
    void finish_pooled(std::uint32_t index, std::int32_t res, std::uint32_t flags);
    void recycle_buffer(std::uint32_t flags) noexcept;

    // Feeds (io_uring_feeds.cpp).
    enum class routed : std::uint8_t { alone, at_once, parked };
    routed route_to_feed(operation& op);
    feed& feed_of(int fd);
    std::uint64_t feed_data(int fd) const noexcept;
    bool arm_feed(int fd) noexcept;
    void retire_feed(int fd) noexcept;
    void park(int fd, std::uint32_t index) noexcept;
    void unpark(std::uint32_t index) noexcept;
    void send_alone(std::uint32_t index, bool ring_was_dry);
    void deliver(const completion& c);
    void serve(int fd);
    std::int64_t serve_at_once(int fd, operation& op) noexcept;
    std::int64_t copy_out(feed& f, const operation& op) noexcept;
    void pop_arrival(feed& f) noexcept;
    void close_feed(int fd) noexcept;

    class ring_pool;

    ::io_uring m_ring{};
    int m_wake_fd = -1;
    bool m_wake_armed = false;
    std::uint64_t m_wake_data;  // user_data of the wake-up poll
    // The thread whose requests complete promptly: the last to run poll().
    // The epoch counts changes of it.
    std::thread::id m_issuer = std::this_thread::get_id();
    std::uint32_t m_issuer_epoch = 0;
    bool m_fail_submit = false;  // SPINDLE_IO_URING_FAIL=submit (tests)
    // backend_options::single_thread: m_issuer never changes; the ring may be
    // single-issuer with deferred task work and its descriptor registered.
    bool m_single_thread = false;
    bool m_multishot = true;   // multishot polls (5.13); off once the kernel says EINVAL
    bool m_recv_multishot = true;   // feeds (6.0); off once the kernel says EINVAL
    bool m_fail_multishot = false;  // SPINDLE_IO_URING_FAIL=multishot (tests)
    bool m_cqe_skip = false;   // IOSQE_CQE_SKIP_SUCCESS for cancel requests (5.17)
    std::uint32_t m_file_ops = 0;  // a bit per file op_code the kernel's probe lists

    // Pooled receives' buffers, made by the first one; the kernel picks from
    // its ring (buffer group 0) where it has one (5.19).
    ring_pool* m_pool = nullptr;
    std::size_t m_read_buffer_size;
    std::uint32_t m_read_buffer_batch;

    std::vector<slot> m_slots;
    std::uint32_t m_free_head;  // a free slot's index, or m_slots.size() when none
    // Operations with a request in the kernel, per descriptor number, linked
    // through operation::next/prev: close_fd finds them without a scan.
    std::vector<operation*> m_by_fd;
    std::vector<feed> m_feeds;  // per descriptor number, made by its first pooled receive
    // user_data of receives cancelled while parked in a feed: completed by
    // the end of the next dispatch, unless the feed served them first.
    std::vector<std::uint64_t> m_withdrawn;
    std::vector<completion> m_collected;
    // Readiness of pooled receives that came while m_read_buffer_batch
    // buffers were on their way to tasks that had not run yet: dispatched
    // first by the next poll, so a burst of readable connections does not
    // take a buffer each at once.
    std::vector<completion> m_postponed;
    std::uint32_t m_plain_in_kernel = 0;  // buffers taken for plain pooled receives the kernel holds
    // This dispatch's receives that found the ring dry, and the chunks the
    // ring grew by for them (one per chunk_buffers such receives).
    std::uint32_t m_dry_receives = 0;
    std::uint32_t m_ring_growths = 0;
    // Receives of this dispatch sent back to the ring after it had run dry
    // for them: no more than it holds, so none finds it dry again, and they
    // count against the batch as the buffers they are about to be lent.
    std::uint32_t m_ring_claims = 0;
    int m_completed = 0;
};

}  // namespace spindle::reactor
