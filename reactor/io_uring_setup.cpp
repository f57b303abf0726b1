// Setting the ring up: the flags the kernel takes, tried from the best down,
// the size it allows, and the probe for every operation the backend sends.

#include "io_uring_backend.hpp"
#include "io_uring_ring_pool.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <sys/eventfd.h>
#include <system_error>
#include <unistd.h>
#include <utility>

namespace spindle::reactor {

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

// Hooks for tests, read at each construction so a test can set them for one
// loop. SPINDLE_IO_URING_FAIL=1 makes the ring's setup fail as if io_uring
// were forbidden (EPERM), so the fallback to epoll can be exercised on any
// kernel; SPINDLE_IO_URING_FAIL=submit sets the ring up but makes every
// request fail to queue as if the submission queue could not be flushed, so
// the runtime's error channel for submit failures can be exercised;
// SPINDLE_IO_URING_FAIL=multishot makes the kernel refuse multishot receives
// (EINVAL, as before 6.0), so feeds fall back to one-shot receives.
enum class fault { none, setup, submit, multishot };

fault fault_injected() noexcept {
    const char* value = std::getenv("SPINDLE_IO_URING_FAIL");
    if (!value || !*value || std::strcmp(value, "0") == 0) return fault::none;
    if (std::strcmp(value, "submit") == 0) return fault::submit;
    return std::strcmp(value, "multishot") == 0 ? fault::multishot : fault::setup;
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

// The kernel's request behind each operation, as the probe names it. No
// default: -Wswitch flags a new op_code here until it names its request.
struct kernel_op {
    int opcode;
    const char* name;
};

constexpr kernel_op kernel_op_of(op_code code) noexcept {
    switch (code) {
        case op_code::read: return {IORING_OP_READ, "READ"};
        case op_code::write: return {IORING_OP_WRITE, "WRITE"};
        case op_code::readv: return {IORING_OP_READV, "READV"};
        case op_code::writev: return {IORING_OP_WRITEV, "WRITEV"};
        case op_code::recv: return {IORING_OP_RECV, "RECV"};
        case op_code::send: return {IORING_OP_SEND, "SEND"};
        case op_code::recvmsg: return {IORING_OP_RECVMSG, "RECVMSG"};
        case op_code::sendmsg: return {IORING_OP_SENDMSG, "SENDMSG"};
        case op_code::accept: return {IORING_OP_ACCEPT, "ACCEPT"};
        case op_code::connect: return {IORING_OP_CONNECT, "CONNECT"};
        case op_code::poll: return {IORING_OP_POLL_ADD, "POLL_ADD"};
        case op_code::recv_pooled: return {IORING_OP_RECV, "RECV"};
        case op_code::read_at: return {IORING_OP_READ, "READ"};
        case op_code::write_at: return {IORING_OP_WRITE, "WRITE"};
        case op_code::readv_at: return {IORING_OP_READV, "READV"};
        case op_code::writev_at: return {IORING_OP_WRITEV, "WRITEV"};
        case op_code::fsync: return {IORING_OP_FSYNC, "FSYNC"};
        case op_code::openat: return {IORING_OP_OPENAT, "OPENAT"};
        case op_code::close: return {IORING_OP_CLOSE, "CLOSE"};
        case op_code::statx: return {IORING_OP_STATX, "STATX"};
        case op_code::renameat: return {IORING_OP_RENAMEAT, "RENAMEAT"};
        case op_code::unlinkat: return {IORING_OP_UNLINKAT, "UNLINKAT"};
        case op_code::mkdirat: return {IORING_OP_MKDIRAT, "MKDIRAT"};
        case op_code::truncate: return {io_uring_op_ftruncate, "FTRUNCATE"};
        case op_code::openat2: return {IORING_OP_OPENAT2, "OPENAT2"};
        case op_code::process_exit: return {IORING_OP_NOP, "NOP"};  // never submitted: performs() refuses it
    }
    return {IORING_OP_NOP, "NOP"};
}

}  // namespace

io_uring_backend::io_uring_backend(const backend_options& options, std::string& notes)
    : m_wake_data(wake_data), m_read_buffer_size(options.read_buffer_size), m_free_head(no_slot) {
    // A ring's size is a power of two, and a buffer id 16 bits.
    m_read_buffer_batch = std::bit_floor(std::clamp<std::uint32_t>(options.read_buffer_batch, 1, 32768));
    const fault injected = fault_injected();
    m_fail_submit = injected == fault::submit;
    m_fail_multishot = injected == fault::multishot;
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
        m_withdrawn.reserve(64);
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
        // Feeds still armed may pick a buffer and write into it at any
        // time: their requests end before the pool can go. Then what they
        // queued, and completions nobody dispatched, give their buffers back.
        bool armed = false;
        for (std::size_t fd = 0; fd < m_feeds.size(); ++fd) {
            retire_feed(static_cast<int>(fd));
            armed = armed || m_feeds[fd].stage != feed_stage::idle;
        }
        for (int round = 0; armed && round < 20; ++round) {
            ::__kernel_timespec limit{.tv_sec = 0, .tv_nsec = 50'000'000};
            ::io_uring_cqe* first = nullptr;
            ::io_uring_submit_and_wait_timeout(&m_ring, &first, 1, &limit, nullptr);
            collect();
            armed =
                std::any_of(m_feeds.begin(), m_feeds.end(), [](const feed& f) { return f.stage != feed_stage::idle; });
        }
        for (const completion& c : m_collected) recycle_buffer(c.flags);
        for (const completion& c : m_postponed) recycle_buffer(c.flags);
        for (feed& f : m_feeds)
            while (f.has_arrivals()) pop_arrival(f);
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
    // Every operation's own request, then what the backend makes by itself:
    // readiness polls (an EAGAIN, the wake-up) and cancels.
    const auto require = [probe](const kernel_op& needed) {
        if (::io_uring_opcode_supported(probe, needed.opcode)) return;
        ::io_uring_free_probe(probe);
        throw std::system_error(ENOSYS, std::system_category(), std::string("io_uring: the kernel lacks IORING_OP_") + needed.name);
    };
    // File operations are optional: those the kernel lacks run on the pool.
    for (op_code code : all_op_codes) {
        if (!is_file_op(code))
            require(kernel_op_of(code));
        else if (::io_uring_opcode_supported(probe, kernel_op_of(code).opcode))
            m_file_ops |= 1u << static_cast<unsigned>(code);
    }
    require({IORING_OP_POLL_ADD, "POLL_ADD"});
    require({IORING_OP_ASYNC_CANCEL, "ASYNC_CANCEL"});
    ::io_uring_free_probe(probe);
    m_cqe_skip = (m_ring.features & IORING_FEAT_CQE_SKIP) != 0;
}

}  // namespace spindle::reactor
