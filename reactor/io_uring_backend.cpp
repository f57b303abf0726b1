#include "io_uring_backend.hpp"

#include "syscall_op.hpp"

#include <spindle/reactor/buffer_pool.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <poll.h>
#include <span>
#include <stdexcept>
#include <string>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <system_error>
#include <thread>
#include <unistd.h>
#include <utility>

// liburing 2.3 knows every flag used here; older headers may not. The values
// are the kernel's (include/uapi/linux/io_uring.h), so the ring still asks for
// them and a kernel that lacks them answers EINVAL, which we handle.
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

// The pool of pooled receives, its free buffers handed to the kernel as a
// ring of provided buffers: a receive then names only the group, and the
// kernel picks a buffer once data has arrived. Buffer ids below the ring's
// size live in the ring when free; the rest (lent while the ring is full, or
// all of them without a ring) on the free list.
class io_uring_backend::ring_pool final : public buffer_pool {
public:
    static constexpr std::uint16_t group = 0;

    explicit ring_pool(std::size_t buffer_size) noexcept : buffer_pool(buffer_size) {}

    // Registers a ring of `entries` (a power of two) with its first chunk.
    // False when the kernel has no rings of provided buffers (before 5.19):
    // every receive then takes the plain way.
    bool attach(::io_uring& ring, std::uint32_t entries) noexcept {
        const std::size_t bytes = std::size_t{entries} * sizeof(::io_uring_buf);
        void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (memory == MAP_FAILED) return false;
        ::io_uring_buf_reg reg{};
        reg.ring_addr = reinterpret_cast<std::uint64_t>(memory);
        reg.ring_entries = entries;
        reg.bgid = group;
        if (::io_uring_register_buf_ring(&ring, &reg, 0) != 0) {
            ::munmap(memory, bytes);
            return false;
        }
        m_ring = static_cast<::io_uring_buf_ring*>(memory);
        m_entries = entries;
        m_mask = ::io_uring_buf_ring_mask(entries);
        ::io_uring_buf_ring_init(m_ring);
        grow_ring();
        return true;
    }
    void detach(::io_uring& ring) noexcept {
        if (!m_ring) return;
        ::io_uring_unregister_buf_ring(&ring, group);
        ::munmap(m_ring, std::size_t{m_entries} * sizeof(::io_uring_buf));
        m_ring = nullptr;
    }
    bool has_ring() const noexcept { return m_ring != nullptr; }

    // The ring ran dry: one more chunk for it. False once it holds all it can.
    bool grow_ring() noexcept {
        std::uint32_t first;
        if (!m_ring || capacity() >= m_entries || !add_chunk(first)) return false;
        for (std::uint32_t i = 0; i < chunk_buffers; ++i) on_free(first + i);
        return true;
    }
    // A completion handed the kernel's pick over to its operation.
    void lent_by_kernel() noexcept {
        --m_in_ring;
        add_lent(1);
    }
    // The kernel's pick for a completion that hands it to nobody: straight back.
    void recycle(std::uint32_t id) noexcept {
        --m_in_ring;
        on_free(id);
    }
    // Buffers in the ring for the kernel to pick, as the completions seen so
    // far tell: a pick whose completion is not collected yet still counts.
    std::uint32_t in_ring() const noexcept { return m_in_ring; }

private:
    void on_free(std::uint32_t id) noexcept override {
        if (m_ring && id < m_entries) {
            ::io_uring_buf_ring_add(m_ring, address(id), static_cast<unsigned>(m_buffer_size), static_cast<unsigned short>(id), m_mask, 0);
            ::io_uring_buf_ring_advance(m_ring, 1);
            ++m_in_ring;
        } else {
            m_free.push_back(id);
        }
    }

    ::io_uring_buf_ring* m_ring = nullptr;
    std::uint32_t m_entries = 0;
    std::uint32_t m_in_ring = 0;
    int m_mask = 0;
};

namespace {

// The submission queue only batches what one tick sends; in-flight requests
// are not limited by it. 1024 entries hold a busy tick of a server with a few
// hundred connections without an extra io_uring_enter to make room. The
// completion queue is larger because multishot polls add completions of their
// own; if it still overflows, the kernel keeps the rest (IORING_FEAT_NODROP).
constexpr unsigned sq_entries = 1024;
constexpr unsigned cq_entries = 8192;
constexpr unsigned small_sq_entries = 64;
constexpr unsigned small_cq_entries = 512;

// user_data: generation << 32 | slot index. Slot generations are never 0, so
// generation 0 marks the backend's own requests; they never reach 0xffffffff
// either, which liburing uses for its internal timeouts on old kernels.
constexpr std::uint64_t cancel_data = 1;  // acknowledgements of cancel requests: ignored
// The wake-up poll; re-armed under the other value when another thread takes
// the loop over, so the old request's last completion is told apart.
constexpr std::uint64_t wake_data = 2;
constexpr std::uint64_t wake_data_alt = 3;
constexpr std::uint32_t max_generation = 0x7fffffff;
constexpr std::uint32_t no_slot = std::numeric_limits<std::uint32_t>::max();

// read(2) and write(2) never move more than this in one call (MAX_RW_COUNT);
// a request's length is 32 bits, so larger spans are cut the same way.
constexpr std::size_t max_rw = 0x7ffff000;

std::uint32_t next_generation(std::uint32_t generation) noexcept {
    return generation == max_generation ? 1 : generation + 1;
}

unsigned poll_mask(std::uint32_t events) noexcept {
    unsigned mask = 0;
    if (events & readable) mask |= POLLIN | POLLRDHUP;
    if (events & writable) mask |= POLLOUT;
    return mask;
}

// A poll completion's mask as the backend-neutral bits the operation asked for.
std::int64_t poll_result(const operation& op, std::int32_t res) noexcept {
    const auto mask = static_cast<std::uint32_t>(res);
    std::uint32_t got = 0;
    if (mask & (POLLIN | POLLPRI | POLLRDHUP | POLLERR | POLLHUP)) got |= readable;
    if (mask & (POLLOUT | POLLERR | POLLHUP)) got |= writable;
    got &= op.events;
    // The kernel reports only what was asked, plus errors and hang-ups, which
    // count for both directions, so `got` is never empty; were it ever, 0
    // would read as "not ready" to the owner, so report what was asked.
    return got ? got : op.events;
}

bool transient(int r) noexcept { return r == -EINTR || r == -EAGAIN || r == -EBUSY; }

// Hooks for tests, read at each construction so a test can set them for one
// loop. SPINDLE_IO_URING_FAIL=1 makes the ring's setup fail as if io_uring
// were forbidden (EPERM), so the fallback to epoll can be exercised on any
// kernel; SPINDLE_IO_URING_FAIL=submit sets the ring up but makes every
// request fail to queue as if the submission queue could not be flushed, so
// the runtime's error channel for submit failures can be exercised.
enum class fault { none, setup, submit };

fault fault_injected() noexcept {
    const char* value = std::getenv("SPINDLE_IO_URING_FAIL");
    if (!value || !*value || std::strcmp(value, "0") == 0) return fault::none;
    return std::strcmp(value, "submit") == 0 ? fault::submit : fault::setup;
}

std::string setup_failure(int err) {
    std::string what = "io_uring_queue_init";
    switch (err) {
        case ENOSYS: what += " (the kernel has no io_uring)"; break;
        case EPERM: what += " (forbidden: seccomp, a container profile, or the sysctl kernel.io_uring_disabled)"; break;
        case ENOMEM: what += " (cannot lock the ring's memory: RLIMIT_MEMLOCK)"; break;
        case EINVAL: what += " (the kernel refuses the ring's setup)"; break;
        default: break;
    }
    return what;
}

}  // namespace

io_uring_backend::io_uring_backend(const backend_options& options, std::string& notes)
    : m_wake_data(wake_data), m_read_buffer_size(options.read_buffer_size), m_free_head(no_slot) {
    // A ring's size is a power of two, and a buffer id 16 bits.
    m_read_buffer_batch = std::bit_floor(std::clamp<std::uint32_t>(options.read_buffer_batch, 1, 32768));
    const fault injected = fault_injected();
    m_fail_submit = injected == fault::submit;
    if (injected == fault::setup)
        throw std::system_error(EPERM, std::system_category(), "io_uring_queue_init (made to fail by SPINDLE_IO_URING_FAIL)");
    m_single_thread = options.single_thread;
    setup_ring(notes);
    try {
        check_kernel();
        if (m_single_thread) register_ring(notes);
        m_wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (m_wake_fd < 0) throw std::system_error(errno, std::system_category(), "eventfd");
        m_slots.reserve(256);
        m_by_fd.resize(256);
        m_collected.reserve(1024);
        arm_wake();
        // Arm the wake-up now rather than at the first poll(): a host may wait
        // on native_handle() before it ever runs the loop. This first enter
        // also finds a seccomp filter that allows io_uring_setup only.
        const int r = ::io_uring_submit(&m_ring);
        if (r < 0) throw std::system_error(-r, std::system_category(), "io_uring_enter");
    } catch (...) {
        if (m_wake_fd >= 0) ::close(m_wake_fd);
        ::io_uring_queue_exit(&m_ring);
        throw;
    }
}

io_uring_backend::~io_uring_backend() {
    // Every operation was forgotten or completed by now (the loop sees to it);
    // closing the ring cancels our own wake-up poll. A registered ring
    // descriptor is released too (io_uring_queue_exit does it), from the
    // table of the calling thread: which is why a single-thread ring must be
    // destroyed on its own thread. Buffers still lent keep the pool alive.
    if (m_pool) {
        m_pool->detach(m_ring);
        m_pool->retire();
    }
    ::io_uring_queue_exit(&m_ring);
    ::close(m_wake_fd);
}

void io_uring_backend::setup_ring(std::string& notes) {
    // COOP_TASKRUN: completions are run when we next enter the kernel instead
    // of interrupting the thread with an IPI; TASKRUN_FLAG tells us when such
    // work waits, so a zero-timeout poll() enters only then (5.19).
    // SUBMIT_ALL: one bad request does not hold back the rest of a batch (5.18).
    //
    // A request's completion is task work of the thread that made it, run
    // when that thread next enters the kernel: whatever the loop waits on must
    // be made by the thread that runs it (adopt_calling_thread).
    //
    // SINGLE_ISSUER (6.0) with DEFER_TASKRUN (6.1), for a single-thread loop
    // only. They tie the ring to the thread that created it: an io_uring_enter
    // from any other thread fails with EEXIST, so a loop built on one thread
    // and run on another could not use them. DEFER_TASKRUN keeps completions
    // as task work of the ring until its owner enters with GETEVENTS (which
    // every poll() that may find work does: see poll()), instead of running
    // them on the thread's next syscall of any kind; it also leaves a poller
    // of the ring's descriptor asleep until then, so native_handle() is no
    // use to a host's poller with it. TASKRUN_FLAG still raises
    // IORING_SQ_TASKRUN for that deferred work.
    constexpr unsigned base = IORING_SETUP_CQSIZE | IORING_SETUP_CLAMP;
    constexpr unsigned shared = base | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
    constexpr unsigned single_issuer = shared | IORING_SETUP_SINGLE_ISSUER;
    constexpr unsigned deferred = single_issuer | IORING_SETUP_DEFER_TASKRUN;
    constexpr unsigned shared_attempts[] = {shared, base | IORING_SETUP_SUBMIT_ALL, base};
    constexpr unsigned single_attempts[] = {deferred, single_issuer, shared, base | IORING_SETUP_SUBMIT_ALL, base};
    const std::span<const unsigned> attempts = m_single_thread ? std::span<const unsigned>(single_attempts)
                                                               : std::span<const unsigned>(shared_attempts);
    // Before 5.12 the rings count against RLIMIT_MEMLOCK, 64 KiB by default on
    // some systems: when the full size is refused with ENOMEM, try a small ring.
    constexpr std::pair<unsigned, unsigned> sizes[] = {{sq_entries, cq_entries}, {small_sq_entries, small_cq_entries}};
    int r = -EINVAL;
    unsigned taken = 0;
    for (const auto& [sq, cq] : sizes) {
        for (unsigned flags : attempts) {
            ::io_uring_params params{};
            params.flags = flags;
            params.cq_entries = cq;
            taken = flags;
            r = ::io_uring_queue_init_params(sq, &m_ring, &params);
            if (r != -EINVAL) break;  // EINVAL: a flag this kernel does not know; try fewer
        }
        if (r != -ENOMEM) break;
    }
    if (r < 0) throw std::system_error(-r, std::system_category(), setup_failure(-r));
    if (!m_single_thread || taken == deferred) return;
    if (taken == single_issuer)
        notes = "io_uring: deferred task work unavailable (kernel before 6.1), using a single-issuer ring with cooperative task work";
    else if (taken == shared)
        notes = "io_uring: single-issuer ring with deferred task work unavailable (kernel before 6.1), using a shared ring with cooperative task work";
    else
        notes = "io_uring: single-issuer ring with deferred task work unavailable (kernel before 6.1), using a plain ring";
}

void io_uring_backend::register_ring(std::string& notes) noexcept {
    // Every io_uring_enter looks the ring's descriptor up in the process's
    // file table, taking and dropping a reference to the file; a registered
    // ring is found in the calling thread's own table instead (5.18). Only
    // for a single-thread ring: the registration belongs to the thread that
    // made it, and liburing then enters through it from whatever thread calls.
    // m_ring.ring_fd stays the real descriptor (native_handle(), close);
    // liburing keeps the registered index apart, in enter_ring_fd.
    const int r = ::io_uring_register_ring_fd(&m_ring);
    if (r == 1) return;
    if (!notes.empty()) notes += "; ";
    notes += "io_uring: the ring's descriptor cannot be registered (";
    notes += r == -EINVAL ? "kernel before 5.18" : std::strerror(-r);
    notes += "), every enter looks it up";
}

void io_uring_backend::check_kernel() {
    // Without fast poll (5.7) a request that must wait would hold a kernel
    // worker thread for as long as it waits; without NODROP (5.5) completions
    // could be lost when the completion queue is full.
    if (!(m_ring.features & IORING_FEAT_FAST_POLL) || !(m_ring.features & IORING_FEAT_NODROP))
        throw std::system_error(ENOSYS, std::system_category(), "io_uring: the kernel is older than 5.7 (no fast poll)");
    ::io_uring_probe* probe = ::io_uring_get_probe_ring(&m_ring);
    if (!probe) throw std::system_error(ENOSYS, std::system_category(), "io_uring: the kernel cannot list its operations");
    static constexpr std::pair<int, const char*> needed[] = {
        {IORING_OP_READ, "READ"},         {IORING_OP_WRITE, "WRITE"},     {IORING_OP_READV, "READV"},
        {IORING_OP_WRITEV, "WRITEV"},     {IORING_OP_RECV, "RECV"},       {IORING_OP_SEND, "SEND"},
        {IORING_OP_RECVMSG, "RECVMSG"},   {IORING_OP_SENDMSG, "SENDMSG"}, {IORING_OP_ACCEPT, "ACCEPT"},
        {IORING_OP_CONNECT, "CONNECT"},   {IORING_OP_POLL_ADD, "POLL_ADD"},
        {IORING_OP_ASYNC_CANCEL, "ASYNC_CANCEL"},
    };
    for (const auto& [opcode, name] : needed) {
        if (!::io_uring_opcode_supported(probe, opcode)) {
            ::io_uring_free_probe(probe);
            throw std::system_error(ENOSYS, std::system_category(), std::string("io_uring: the kernel lacks IORING_OP_") + name);
        }
    }
    ::io_uring_free_probe(probe);
    m_cqe_skip = (m_ring.features & IORING_FEAT_CQE_SKIP) != 0;
}

// --- slots -------------------------------------------------------------------

std::uint32_t io_uring_backend::allocate_slot(operation& op) {
    std::uint32_t index = m_free_head;
    if (index == no_slot) {
        m_slots.emplace_back();
        index = static_cast<std::uint32_t>(m_slots.size() - 1);
    } else {
        m_free_head = m_slots[index].next_free;
    }
    slot& s = m_slots[index];
    s.op = &op;
    s.state = slot_state::in_kernel;
    s.cancel_requested = false;
    s.awaiting_readiness = false;
    s.pooled_plain = false;
    s.ring_was_dry = false;
    s.closed = false;
    return index;
}

void io_uring_backend::release_slot(std::uint32_t index) noexcept {
    slot& s = m_slots[index];
    s.op = nullptr;
    s.state = slot_state::free;
    s.cancel_requested = false;
    s.awaiting_readiness = false;
    s.pooled_plain = false;
    s.ring_was_dry = false;
    s.closed = false;
    // A completion still travelling under the old generation will not match.
    s.generation = next_generation(s.generation);
    s.next_free = m_free_head;
    m_free_head = index;
}

std::uint64_t io_uring_backend::user_data_of(std::uint32_t index) const noexcept {
    return (std::uint64_t{m_slots[index].generation} << 32) | index;
}

bool io_uring_backend::lookup(const operation& op, std::uint32_t& index) const noexcept {
    index = op.backend_slot;
    return index < m_slots.size() && m_slots[index].op == &op && m_slots[index].state != slot_state::free;
}

void io_uring_backend::link_fd(operation& op) noexcept {
    // submit() made room for this descriptor number.
    operation*& head = m_by_fd[static_cast<std::size_t>(op.fd)];
    op.prev = nullptr;
    op.next = head;
    if (head) head->prev = &op;
    head = &op;
}

void io_uring_backend::unlink_fd(operation& op) noexcept {
    if (op.prev)
        op.prev->next = op.next;
    else
        m_by_fd[static_cast<std::size_t>(op.fd)] = op.next;
    if (op.next) op.next->prev = op.prev;
    op.next = op.prev = nullptr;
}

// --- requests ----------------------------------------------------------------

::io_uring_sqe* io_uring_backend::get_sqe() noexcept {
    // A full submission queue is sent at once and reused, never dropped. The
    // bound only guards against a ring that keeps refusing.
    for (int attempt = 0; attempt < 64; ++attempt) {
        if (::io_uring_sqe* sqe = ::io_uring_get_sqe(&m_ring)) return sqe;
        const int r = ::io_uring_submit(&m_ring);
        if (r == -EBUSY || r == -EAGAIN)
            collect();  // completions are backing up: take them out to make room
        else if (r < 0 && r != -EINTR)
            return nullptr;
    }
    return nullptr;
}

bool io_uring_backend::queue_request(std::uint32_t index) noexcept {
    slot& s = m_slots[index];
    operation& op = *s.op;
    ::io_uring_sqe* sqe = get_sqe();
    if (!sqe) return false;
    const int fd = op.fd;
    if (s.awaiting_readiness) {
        ::io_uring_prep_poll_add(sqe, fd, is_reader(op) ? POLLIN | POLLRDHUP : POLLOUT);
    } else {
        // Offset -1: the file's own position, as read(2) and write(2) use it.
        constexpr auto current_position = static_cast<std::uint64_t>(-1);
        const auto size = [&op] { return static_cast<unsigned>(std::min(op.args.buf.size, max_rw)); };
        switch (op.code) {
            case op_code::read: ::io_uring_prep_read(sqe, fd, op.args.buf.data, size(), current_position); break;
            case op_code::write: ::io_uring_prep_write(sqe, fd, op.args.buf.data, size(), current_position); break;
            case op_code::readv:
                ::io_uring_prep_readv(sqe, fd, op.args.vec.iov, static_cast<unsigned>(op.args.vec.count), current_position);
                break;
            case op_code::writev:
                ::io_uring_prep_writev(sqe, fd, op.args.vec.iov, static_cast<unsigned>(op.args.vec.count), current_position);
                break;
            case op_code::recv: ::io_uring_prep_recv(sqe, fd, op.args.buf.data, size(), op.flags); break;
            case op_code::recv_pooled:
                if (s.pooled_plain) {
                    ::io_uring_prep_recv(sqe, fd, m_pool->address(op.args.pooled.id), m_pool->buffer_size(), op.flags);
                } else {
                    ::io_uring_prep_recv(sqe, fd, nullptr, m_pool->buffer_size(), op.flags);
                    sqe->flags |= IOSQE_BUFFER_SELECT;
                    sqe->buf_group = ring_pool::group;
                }
                break;
            // MSG_NOSIGNAL: a closed peer is EPIPE, never a SIGPIPE that kills the process.
            case op_code::send: ::io_uring_prep_send(sqe, fd, op.args.buf.data, size(), op.flags | MSG_NOSIGNAL); break;
            case op_code::recvmsg: ::io_uring_prep_recvmsg(sqe, fd, op.args.msg, static_cast<unsigned>(op.flags)); break;
            case op_code::sendmsg:
                ::io_uring_prep_sendmsg(sqe, fd, op.args.msg, static_cast<unsigned>(op.flags | MSG_NOSIGNAL));
                break;
            case op_code::accept:
                ::io_uring_prep_accept(sqe, fd, op.args.accept.addr, op.args.accept.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
                break;
            // The completion is the connect's own outcome (0, -ECONNREFUSED...):
            // the kernel reads SO_ERROR for us.
            case op_code::connect: ::io_uring_prep_connect(sqe, fd, op.args.connect.addr, op.args.connect.len); break;
            case op_code::poll:
                // A persistent poll stays armed in the kernel (multishot, 5.13)
                // and completes with IORING_CQE_F_MORE on each readiness.
                if (op.persistent && m_multishot)
                    ::io_uring_prep_poll_multishot(sqe, fd, poll_mask(op.events));
                else
                    ::io_uring_prep_poll_add(sqe, fd, poll_mask(op.events));
                break;
        }
    }
    ::io_uring_sqe_set_data64(sqe, user_data_of(index));
    s.issuer_epoch = m_issuer_epoch;
    s.sq_position = m_ring.sq.sqe_tail - 1;  // io_uring_get_sqe just advanced the tail past it
    s.state = slot_state::in_kernel;
    link_fd(op);
    return true;
}

bool io_uring_backend::queue_cancel(std::uint32_t index) noexcept {
    // Keyed by user_data, generation included: it cannot hit a later
    // operation that reuses the slot, whenever the kernel gets to it.
    return queue_cancel_of(user_data_of(index));
}

bool io_uring_backend::queue_cancel_of(std::uint64_t target) noexcept {
    ::io_uring_sqe* sqe = get_sqe();
    if (!sqe) return false;
    ::io_uring_prep_cancel64(sqe, target, 0);
    ::io_uring_sqe_set_data64(sqe, cancel_data);
    // Only failures (ENOENT: already done; EALREADY: running) would post a
    // completion; they are ignored, the target's own completion is what counts.
    if (m_cqe_skip) sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
    return true;
}

void io_uring_backend::arm_wake() noexcept {
    ::io_uring_sqe* sqe = get_sqe();
    if (!sqe) return;  // the next poll() tries again
    // A multishot poll on an eventfd that is never read: each write() wakes
    // the eventfd's waiters and so posts one completion, at no cost to the
    // loop beyond reaping it. The counter only grows; it would take 2^64
    // wake-ups to saturate it (and then write() fails with EAGAIN, harmless).
    if (m_multishot)
        ::io_uring_prep_poll_multishot(sqe, m_wake_fd, POLLIN);
    else
        ::io_uring_prep_poll_add(sqe, m_wake_fd, POLLIN);
    ::io_uring_sqe_set_data64(sqe, m_wake_data);
    m_wake_armed = true;
}

void io_uring_backend::adopt_calling_thread() noexcept {
    // io_uring completes a request through task work of the thread that made
    // it, and under COOP_TASKRUN that work waits until the thread next enters
    // the kernel. Requests made on a thread that does not run the loop (it
    // was built there, or run there before) would complete only when that
    // thread makes a syscall: perhaps milliseconds later, perhaps never. Make
    // again from here, at once, what only waits for readiness: the wake-up
    // and the polls. They write nothing into memory of ours, so the old
    // requests are left to their cancels, their completions ignored (another
    // user_data). Requests that move data finish where they were made.
    m_issuer = std::this_thread::get_id();
    ++m_issuer_epoch;
    if (m_wake_armed) {
        queue_cancel_of(m_wake_data);
        m_wake_data = m_wake_data == wake_data ? wake_data_alt : wake_data;
        arm_wake();
    }
    for (std::uint32_t index = 0; index < m_slots.size(); ++index) {
        slot& s = m_slots[index];
        if (s.state != slot_state::in_kernel || !s.op || s.cancel_requested) continue;
        if (s.op->code != op_code::poll && !s.awaiting_readiness) continue;
        queue_cancel(index);
        unlink_fd(*s.op);
        s.generation = next_generation(s.generation);
        if (!queue_request(index)) {
            // The ring refuses requests: the next dispatch reports it.
            s.state = slot_state::collected;
            m_collected.push_back({user_data_of(index), -EIO, 0});
        }
    }
}

void io_uring_backend::flush() noexcept {
    if (::io_uring_sq_ready(&m_ring) == 0) return;  // nothing queued: no syscall
    // Errors are not lost: the requests stay queued and the next poll() reports.
    [[maybe_unused]] const int r = ::io_uring_submit(&m_ring);
}

// --- the backend interface ----------------------------------------------------

bool io_uring_backend::submit(operation& op) {
    if (op.fd < 0) {
        op.result = -EBADF;
        op.state = op_state::done;
        return true;
    }
    const auto fd_index = static_cast<std::size_t>(op.fd);
    if (fd_index >= m_by_fd.size()) m_by_fd.resize(std::max(fd_index + 1, m_by_fd.size() * 2));
    if (op.code == op_code::recv_pooled && !m_pool) {
        auto* pool = new ring_pool(m_read_buffer_size);
        pool->attach(m_ring, m_read_buffer_batch);
        m_pool = pool;
        publish(*pool);
    }
    const std::uint32_t index = allocate_slot(op);
    op.backend_slot = index;
    op.state = op_state::pending;
    if (op.code == op_code::recv_pooled) start_pooled(index);
    if (m_fail_submit || !queue_request(index)) {
        release_slot(index);
        op.state = op_state::idle;
        throw std::system_error(EBUSY, std::system_category(), "io_uring: the submission queue cannot be flushed");
    }
    // Everything else waits for the next poll(), where one io_uring_enter sends
    // the tick's batch. A watcher is often made outside any tick, by a host
    // that then sleeps on native_handle(): send it now, or its first readiness
    // would stay unseen in the submission queue.
    if (op.code == op_code::poll && op.persistent) flush();
    return false;
}

void io_uring_backend::cancel(operation& op) noexcept {
    std::uint32_t index;
    if (!op.pending() || !lookup(op, index)) return;
    slot& s = m_slots[index];
    if (s.cancel_requested) return;
    s.cancel_requested = true;
    // Collected already: the next poll() completes it with its real result
    // (or with -ECANCELED where it would have been retried or re-armed).
    if (s.state == slot_state::in_kernel) queue_cancel(index);
}

void io_uring_backend::forget(operation& op) noexcept {
    if (!op.pending()) return;
    std::uint32_t index;
    if (!lookup(op, index)) {
        op.state = op_state::idle;
        return;
    }
    if (m_slots[index].state == slot_state::in_kernel) {
        // The kernel may still write into the operation's buffers (a read's
        // data, accept's address): cancel, then wait for the final completion.
        // Completions of other operations reaped meanwhile are kept for the
        // next poll(); complete() is never called from here.
        bool waiting = true;
        if (!m_slots[index].cancel_requested) {
            m_slots[index].cancel_requested = true;
            waiting = queue_cancel(index);
        }
        while (waiting && m_slots[index].state == slot_state::in_kernel) {
            const int r = ::io_uring_submit_and_wait(&m_ring, 1);
            if (r < 0 && !transient(r)) waiting = false;
            collect();
        }
        if (m_slots[index].state == slot_state::in_kernel) {
            // The ring refuses to work (it should not happen): the least harm
            // is to keep the slot out of use until its completion ever comes,
            // and never to touch the operation again.
            unlink_fd(op);
            m_slots[index].op = nullptr;
            op.state = op_state::idle;
            return;
        }
    }
    // A pooled receive's buffer goes back: the one it was given, or the
    // kernel's pick in a completion nobody will dispatch now.
    if (op.code == op_code::recv_pooled) {
        const slot& s = m_slots[index];
        if (s.pooled_plain && !s.awaiting_readiness) {
            --m_plain_in_kernel;
            m_pool->give_back(op.args.pooled.id);
        }
        const std::uint64_t data = user_data_of(index);
        for (completion& c : m_collected) {
            if (c.user_data != data) continue;
            recycle_buffer(c.flags);
            c.flags &= ~IORING_CQE_F_BUFFER;
        }
    }
    // An accept that won the race made a descriptor nobody will ever see.
    if (op.code == op_code::accept) {
        const std::uint64_t data = user_data_of(index);
        for (completion& c : m_collected) {
            if (c.user_data == data && c.res >= 0) {
                ::close(c.res);
                c.res = -ECANCELED;
            }
        }
    }
    // Its collected completions now carry a stale generation and are skipped.
    release_slot(index);
    op.state = op_state::idle;
}

void io_uring_backend::close_fd(int fd) noexcept {
    if (fd < 0 || static_cast<std::size_t>(fd) >= m_by_fd.size()) return;
    // A request still in the submission queue would look the number up only
    // when sent, after the runtime closed it, perhaps under a new file: it must
    // reach the kernel now, while the number still names the file being
    // closed. Requests already sent hold their own reference to the file, so
    // the close that follows does not disturb them; their cancels do.
    const unsigned sent = IO_URING_READ_ONCE(*m_ring.sq.khead);
    bool unsent = false;
    for (operation* op = m_by_fd[static_cast<std::size_t>(fd)]; op; op = op->next)
        if (static_cast<std::int32_t>(m_slots[op->backend_slot].sq_position - sent) >= 0) unsent = true;
    if (unsent) flush();
    // Each cancel is keyed by user_data, not by descriptor: IORING_ASYNC_CANCEL_FD
    // matches the open file, so it would also cancel requests made through a
    // dup() of it, and it would have to reach the kernel before the close,
    // costing an io_uring_enter here; these ride with the next poll()'s batch.
    // Restart from the head each time: queueing may reap completions, which
    // unlinks operations from this very list.
    for (;;) {
        operation* op = m_by_fd[static_cast<std::size_t>(fd)];
        while (op && m_slots[op->backend_slot].cancel_requested) op = op->next;
        if (!op) break;
        m_slots[op->backend_slot].cancel_requested = true;
        m_slots[op->backend_slot].closed = true;
        queue_cancel(op->backend_slot);
    }
    // Completions already collected (or held back for the next poll) must
    // not lead to a retry or a re-armed poll on a number that may soon name
    // another file.
    for (const std::vector<completion>* list : {&m_collected, &m_postponed}) {
        for (const completion& c : *list) {
            const auto index = static_cast<std::uint32_t>(c.user_data);
            if ((c.user_data >> 32) == 0 || index >= m_slots.size()) continue;
            slot& s = m_slots[index];
            if (s.generation == (c.user_data >> 32) && s.op && s.op->fd == fd) s.cancel_requested = s.closed = true;
        }
    }
}

int io_uring_backend::poll(std::chrono::nanoseconds timeout) {
    m_completed = 0;
    if (std::this_thread::get_id() != m_issuer) [[unlikely]] {
        // A single-issuer ring refuses every enter from another thread
        // (EEXIST), and a registered descriptor means nothing there: the
        // loop checks this first, so only a misuse of the backend gets here.
        if (m_single_thread)
            throw std::logic_error("spindle: a single-thread io_uring backend polled from another thread");
        adopt_calling_thread();
    }
    if (!m_collected.empty() || !m_postponed.empty() || ::io_uring_cq_ready(&m_ring) > 0)
        timeout = std::chrono::nanoseconds::zero();
    if (timeout == std::chrono::nanoseconds::zero()) {
        // Enter only to send requests or to run completions the kernel holds
        // for us (IORING_SQ_TASKRUN) or could not fit in the queue; otherwise
        // the completion queue is read without a syscall.
        //
        // Under DEFER_TASKRUN nothing reaches the completion queue until we
        // enter with GETEVENTS (io_uring_submit_and_get_events always asks
        // for it), and the kernel raises IORING_SQ_TASKRUN for deferred work
        // as for cooperative work: the same test finds it, with no enter
        // while nothing completed. A recent kernel runs at most 20 items of
        // deferred work per enter and leaves the flag raised while any are
        // left, so a burst larger than that takes one enter per 20, each
        // tick's poll() picking up where the last stopped (checked on 6.18).
        const unsigned kernel_flags = IO_URING_READ_ONCE(*m_ring.sq.kflags);
        if (::io_uring_sq_ready(&m_ring) > 0 || (kernel_flags & (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW))) {
            const int r = ::io_uring_submit_and_get_events(&m_ring);
            if (r < 0 && !transient(r)) throw std::system_error(-r, std::system_category(), "io_uring_enter");
        }
    } else {
        // One io_uring_enter sends the tick's requests and waits: the whole
        // cost of a tick in the kernel, in steady state.
        ::__kernel_timespec ts{};
        ::__kernel_timespec* tsp = nullptr;
        if (timeout > std::chrono::nanoseconds::zero()) {
            ts.tv_sec = static_cast<long long>(timeout.count() / 1'000'000'000);
            ts.tv_nsec = static_cast<long long>(timeout.count() % 1'000'000'000);
            tsp = &ts;
        }
        ::io_uring_cqe* first = nullptr;
        const int r = ::io_uring_submit_and_wait_timeout(&m_ring, &first, 1, tsp, nullptr);
        if (r < 0 && r != -ETIME && !transient(r)) throw std::system_error(-r, std::system_category(), "io_uring_enter");
    }
    collect();
    if (!m_wake_armed) {
        // The kernel ended the wake-up poll (or has only one-shot polls): empty
        // the eventfd, which a one-shot poll would otherwise find ready forever,
        // and re-arm at once, so a host waiting on native_handle() still hears
        // wake() before we run again.
        std::uint64_t drained;
        [[maybe_unused]] const auto n = ::read(m_wake_fd, &drained, sizeof drained);
        arm_wake();
        flush();
    }
    // Pooled receives the last poll held back go first.
    if (!m_postponed.empty()) {
        m_collected.insert(m_collected.begin(), m_postponed.begin(), m_postponed.end());
        m_postponed.clear();
    }
    dispatch();
    if (!m_postponed.empty()) wake();  // a host polling native_handle() comes back for the rest
    return m_completed;
}

void io_uring_backend::wake() noexcept {
    const std::uint64_t one = 1;
    // EAGAIN means the counter is saturated: the loop is woken anyway.
    [[maybe_unused]] const auto r = ::write(m_wake_fd, &one, sizeof one);
}

// --- completions -----------------------------------------------------------------

void io_uring_backend::collect() noexcept {
    for (;;) {
        unsigned head;
        unsigned seen = 0;
        ::io_uring_cqe* cqe;
        io_uring_for_each_cqe(&m_ring, head, cqe) {
            note(*cqe);
            ++seen;
        }
        ::io_uring_cq_advance(&m_ring, seen);
        if (!::io_uring_cq_has_overflow(&m_ring)) break;
        // The kernel kept completions that did not fit: have it move them in.
        const int r = ::io_uring_get_events(&m_ring);
        if (r < 0 && !transient(r)) break;
    }
}

void io_uring_backend::note(const ::io_uring_cqe& cqe) noexcept {
    const std::uint64_t data = cqe.user_data;
    const auto index = static_cast<std::uint32_t>(data);
    const auto generation = static_cast<std::uint32_t>(data >> 32);
    if (generation == 0) {
        if (data == m_wake_data && !(cqe.flags & IORING_CQE_F_MORE)) {
            m_wake_armed = false;
            if (cqe.res == -EINVAL) m_multishot = false;  // a kernel before 5.13
        }
        return;
    }
    if (index >= m_slots.size()) return recycle_buffer(cqe.flags);
    slot& s = m_slots[index];
    if (s.generation != generation || s.state != slot_state::in_kernel) return recycle_buffer(cqe.flags);  // forgotten
    if (!(cqe.flags & IORING_CQE_F_MORE)) {
        // The kernel is done with the operation's memory from here on.
        s.state = slot_state::collected;
        if (s.op) unlink_fd(*s.op);
    }
    m_collected.push_back({data, cqe.res, cqe.flags});
}

void io_uring_backend::dispatch() {
    // By index: a completion handler may (against the contract, but safely)
    // call forget(), which appends what it reaps while waiting.
    m_dry_receives = m_ring_growths = m_ring_claims = 0;
    for (std::size_t i = 0; i < m_collected.size(); ++i) {
        const completion c = m_collected[i];
        const auto index = static_cast<std::uint32_t>(c.user_data);
        if (index >= m_slots.size() || m_slots[index].generation != (c.user_data >> 32)) {
            recycle_buffer(c.flags);
            continue;
        }
        slot& s = m_slots[index];
        if (!s.op) {
            // Forgotten while the ring was failing: its last completion frees it.
            recycle_buffer(c.flags);
            if (!(c.flags & IORING_CQE_F_MORE)) release_slot(index);
            continue;
        }
        if (c.flags & IORING_CQE_F_MORE) {
            // A persistent poll's readiness; the request stays armed. After a
            // cancel, only the final completion is of interest.
            if (s.cancel_requested) continue;
            operation& op = *s.op;
            op.result = poll_result(op, c.res);
            ++m_completed;
            op.complete(op);
            continue;
        }
        finish_request(index, c.res, c.flags);
    }
    m_collected.clear();
}

void io_uring_backend::recycle_buffer(std::uint32_t flags) noexcept {
    if (flags & IORING_CQE_F_BUFFER) m_pool->recycle(flags >> IORING_CQE_BUFFER_SHIFT);
}

void io_uring_backend::start_pooled(std::uint32_t index) noexcept {
    // Without a ring the receive waits for readiness first, so that it takes
    // a buffer only when data is there.
    slot& s = m_slots[index];
    s.pooled_plain = !m_pool->has_ring();
    s.awaiting_readiness = s.pooled_plain;
    s.ring_was_dry = false;
}

void io_uring_backend::finish_pooled(std::uint32_t index, std::int32_t res, std::uint32_t flags) {
    slot& s = m_slots[index];
    operation& op = *s.op;
    const bool cancelled = s.cancel_requested;
    if (s.awaiting_readiness) {
        // Readable: receive, unless this poll has lent its batch already;
        // then the next poll comes back to it first. The batch counts the
        // receives sent back to the ring in this dispatch too.
        if (cancelled) return finish(index, -ECANCELED);
        if (res < 0) return finish(index, res);
        if (m_pool->in_transit() + m_plain_in_kernel + m_ring_claims >= m_read_buffer_batch) {
            m_postponed.push_back({user_data_of(index), res, 0});
            return;
        }
        s.awaiting_readiness = false;
        if (s.ring_was_dry && m_ring_claims < m_pool->in_ring()) {
            ++m_ring_claims;
            // Tasks gave buffers back into the ring since it ran dry for this
            // receive: the kernel picks one of those, and the pool maps no
            // other buffers for a burst that the ring can serve in turn.
            s.pooled_plain = s.ring_was_dry = false;
            if (!queue_request(index)) finish(index, -EIO);
            return;
        }
        if (!m_pool->take(op.args.pooled.id)) return finish(index, -ENOMEM);
        ++m_plain_in_kernel;
        if (!queue_request(index)) {
            --m_plain_in_kernel;
            m_pool->give_back(op.args.pooled.id);
            finish(index, -EIO);
        }
        return;
    }
    // The buffer the receive filled: the kernel's pick, or the one it was given.
    bool held = false;
    std::uint32_t id = 0;
    if (flags & IORING_CQE_F_BUFFER) {
        held = true;
        id = flags >> IORING_CQE_BUFFER_SHIFT;
        m_pool->lent_by_kernel();
    } else if (s.pooled_plain) {
        held = true;
        id = op.args.pooled.id;
        --m_plain_in_kernel;
    }
    if (res > 0) {
        op.args.pooled = {m_pool, id};
        m_pool->handed_over();
        return finish(index, res);  // closed meanwhile: finish gives it back
    }
    if (held) m_pool->give_back(id);
    const bool retry = res == -ENOBUFS || res == -EAGAIN || res == -EINTR;
    if (retry && cancelled) return finish(index, -ECANCELED);
    if (res == -ENOBUFS || res == -EAGAIN) {
        // ENOBUFS: the ring ran dry; another chunk for it while it has room.
        // One chunk serves this many receives of the same dispatch (a burst
        // of readable connections finds it dry all at once), not one each.
        // Beyond that, and on an EAGAIN (as for any operation the kernel
        // cannot wait on, finish_request), wait for readiness and take one of
        // the pool's other buffers.
        bool plain = res == -EAGAIN;
        if (!plain && ++m_dry_receives > m_ring_growths * buffer_pool::chunk_buffers) {
            plain = !m_pool->grow_ring();
            if (!plain) ++m_ring_growths;
        }
        if (plain) {
            s.pooled_plain = s.awaiting_readiness = true;
            s.ring_was_dry = res == -ENOBUFS;
        }
        if (!queue_request(index)) finish(index, -EIO);
        return;
    }
    if (res == -EINTR) {
        if (s.pooled_plain) {
            if (!m_pool->take(op.args.pooled.id)) return finish(index, -ENOMEM);
            ++m_plain_in_kernel;
        }
        if (!queue_request(index)) {
            if (s.pooled_plain) {
                --m_plain_in_kernel;
                m_pool->give_back(op.args.pooled.id);
            }
            finish(index, -EIO);
        }
        return;
    }
    finish(index, res);
}

void io_uring_backend::finish_request(std::uint32_t index, std::int32_t res, std::uint32_t flags) {
    slot& s = m_slots[index];
    operation& op = *s.op;
    const bool cancelled = s.cancel_requested;

    if (res == -ECANCELED && !cancelled && s.issuer_epoch != m_issuer_epoch && op.code != op_code::connect) {
        // The kernel cancelled it, not we: it was made by a thread that no
        // longer runs the loop (adopt_calling_thread), or that thread exited.
        // Nothing was done; make it again from this thread. Not a connect,
        // which may have left the socket connecting.
        if (!queue_request(index)) finish(index, -EIO);
        return;
    }

    if (op.code == op_code::recv_pooled) return finish_pooled(index, res, flags);

    if (op.code == op_code::poll) {
        if (op.persistent && !cancelled) {
            if (res == -EINVAL && m_multishot) {
                // A kernel without multishot polls: one-shot polls, re-armed
                // after each completion, from now on.
                m_multishot = false;
                if (!queue_request(index)) finish(index, -EIO);
                return;
            }
            if (res >= 0) {
                // The kernel ended the multishot by itself (a full completion
                // queue, say) or it was one-shot: re-arm first, so the
                // operation is still pending when its owner hears of it.
                if (!queue_request(index)) {
                    finish(index, -EIO);
                    return;
                }
                op.result = poll_result(op, res);
                ++m_completed;
                op.complete(op);
                return;
            }
            // Errors end it, -ECANCELED included: without a cancel of ours
            // (and from this thread's own request) it means the ring is going
            // away.
        }
        finish(index, res >= 0 ? poll_result(op, res) : res);
        return;
    }

    if (s.awaiting_readiness) {
        // The readiness poll of an operation that hit EAGAIN came back.
        s.awaiting_readiness = false;
        if (cancelled) {
            finish(index, -ECANCELED);
            return;
        }
        if (res >= 0) {
            if (!queue_request(index)) finish(index, -EIO);
            return;
        }
        finish(index, res);
        return;
    }

    // EAGAIN reaches us when the kernel cannot wait on the file for us (a
    // non-blocking descriptor of a driver without that support, MSG_DONTWAIT):
    // wait for readiness and try again, as the epoll backend would. Not for
    // connect, whose EAGAIN (a full Unix listener backlog) is its answer.
    if ((res == -EAGAIN || res == -EINTR) && op.code != op_code::connect) {
        if (cancelled) {
            finish(index, -ECANCELED);
            return;
        }
        s.awaiting_readiness = res == -EAGAIN;
        if (!queue_request(index)) finish(index, res);
        return;
    }
    finish(index, res);
}

void io_uring_backend::finish(std::uint32_t index, std::int64_t result) {
    operation& op = *m_slots[index].op;
    const bool closed = m_slots[index].closed;
    // Free the slot first: complete() may start another operation at once.
    release_slot(index);
    op.result = result;
    if (closed && result != -ECANCELED) {
        // Its descriptor was closed while the kernel finished it: as on every
        // backend, it completes with -ECANCELED, and what it handed over (an
        // accepted descriptor) is closed rather than lost.
        release_handed_over(op);
        op.result = -ECANCELED;
    }
    op.state = op_state::done;
    ++m_completed;
    op.complete(op);
}

}  // namespace spindle::reactor
