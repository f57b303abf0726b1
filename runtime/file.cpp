// Files: each operation is the ring's request where the backend performs it,
// or else a blocking job on the offload pool that runs the reactor's
// perform_blocking against the operation held in the waiting frame.
//
// A pool job is recycled through a free list of the loop's thread, so a file
// read costs no allocation in steady state on either path. The job holds its
// frame (m_hold_on_abandon): a frame destroyed while the job runs waits for
// it, because the syscall writes into the frame's buffers.

#include "io_access.hpp"
#include "loop_core.hpp"

#include <spindle/async_generator.hpp>
#include <spindle/file.hpp>
#include <spindle/offload.hpp>
#include <spindle/reactor/blocking.hpp>

#include <dirent.h>
#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#endif
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace spindle {

namespace detail {

struct file_job final : offload_job {
    file_job() noexcept {
        m_run = &run;
        m_delete = &recycle;
        m_kind = job_kind::blocking;
        m_hold_on_abandon = true;
    }

    static void run(offload_job& job) noexcept {
        auto& self = static_cast<file_job&>(job);
        self.m_result = reactor::perform_blocking(io_access::op(*self.m_op));
        self.m_ran.store(true, std::memory_order_release);
    }
    static void recycle(offload_job& job) noexcept;

    io_op* m_op = nullptr;
    std::int64_t m_result = 0;
    std::atomic<bool> m_ran{false};
    file_job* m_next_free = nullptr;
};

namespace {

// Jobs are made and mostly let go on the loop's thread; one the pool lets go
// last (its wait gone) goes to that thread's list or back to the heap.
struct job_cache {
    file_job* head = nullptr;
    std::size_t size = 0;
    static constexpr std::size_t limit = 256;

    ~job_cache() {
        while (file_job* j = head) {
            head = j->m_next_free;
            ::operator delete(j);
        }
    }
};
thread_local job_cache cached_jobs;

file_job* acquire_job() {
    void* memory;
    if (file_job* j = cached_jobs.head) {
        cached_jobs.head = j->m_next_free;
        --cached_jobs.size;
        memory = j;
    } else {
        memory = ::operator new(sizeof(file_job));
    }
    return new (memory) file_job();
}

/// Runs `fn` on the pool with nobody waiting; here, as the last resort,
/// when the pool cannot take it.
template <class F>
void in_background(F fn) noexcept {
    job_of<F>* job = nullptr;
    try {
        job = new job_of<F>(std::move(fn));
    } catch (...) {
        return;
    }
    if (!submit_detached(nullptr, *job)) job_of<F>::run(*job);
    release_job(*job);
}

void close_in_background(int fd) noexcept {
    if (fd >= 0) in_background([fd] { ::close(fd); });
}

relaxed<std::int64_t>& file_ops_in_flight(loop_core& core) noexcept {
    return core.counters().io_in_flight[static_cast<std::size_t>(io_kind::file)];
}

io_request request_of(int fd, io_code code, int flags, const file_args* args) noexcept {
    io_request r;
    r.fd = fd;
    r.code = code;
    r.flags = flags;
    r.args.file = args;
    return r;
}

}  // namespace

void file_job::recycle(offload_job& job) noexcept {
    auto* self = static_cast<file_job*>(&job);
    self->~file_job();
    if (cached_jobs.size < job_cache::limit) {
        self->m_next_free = cached_jobs.head;
        cached_jobs.head = self;
        ++cached_jobs.size;
    } else {
        ::operator delete(self);
    }
}

file_wait::file_wait(int fd, io_code code, int flags, const file_args& args) noexcept
    : io_op(request_of(fd, code, flags, &m_args), &on_complete), m_args(args), m_code(code) {}

file_wait::~file_wait() {
    const reactor::operation& op = io_access::op(*this);
    std::int64_t made = -1;  // a descriptor an open made that nobody took
    if (m_native) {
        if (pending()) detail::forget_io(*m_core, *this);  // submitted, never parked
        if (op.state == reactor::op_state::done) made = op.result;
    }
    if (m_job) {
        --file_ops_in_flight(*m_core);
        if (m_job->m_ran.load(std::memory_order_acquire)) made = m_job->m_result;
        release_job(*m_job);
    }
    const bool opens = m_code == detail::io_code::openat || m_code == detail::io_code::openat2;
    if (opens && !m_answered && made >= 0) close_in_background(static_cast<int>(made));
}

bool file_wait::ready() {
    m_core = &current_core();
    const auto code = static_cast<reactor::op_code>(m_code);
    reactor::operation& op = io_access::op(*this);
    if (op.fd < 0 && !reactor::is_path_op(code)) {
        // No descriptor: nothing to run anywhere.
        m_native = true;
        op.result = -EBADF;
        op.state = reactor::op_state::done;
        return true;
    }
    if (m_core->backend().performs(code)) {
        m_native = true;
        return submit_io(*m_core, *this);
    }
    return false;
}

void file_wait::on_park() {
    if (m_native) return;
    m_job = acquire_job();
    m_job->m_op = this;
    ++file_ops_in_flight(*m_core);
    if (std::error_code ec = submit_job(nullptr, *m_job, *this, *m_core)) {
        m_job->m_error = ec;
        complete();
    }
}

void file_wait::on_cancel() noexcept {
    if (m_native) {
        cancel_io(*m_core, *this);
    } else if (m_job && cancel_job(*m_job)) {
        complete_cancelled();
    }
}

void file_wait::on_abandon() noexcept {
    if (m_native)
        forget_io(*m_core, *this);
    else if (m_job)
        abandon_job(*m_job);
}

int file_wait::descriptor() const noexcept { return io_access::op(*this).fd; }

void file_wait::on_complete(io_op& op) noexcept { static_cast<file_wait&>(op).complete(); }

std::int64_t file_wait::outcome() const noexcept {
    if (m_job) return m_job->m_result;
    return io_access::op(*this).result;
}

bool file_wait::performed() const noexcept {
    if (m_job) return m_job->m_ran.load(std::memory_order_acquire);
    const reactor::operation& op = io_access::op(*this);
    return m_native && op.state == reactor::op_state::done && op.result != -ECANCELED;
}

spindle::result<std::int64_t> file_wait::answer() noexcept {
    if (cancelled()) return cancelled_error();
    if (m_job && m_job->m_error) return m_job->m_error;
    const std::int64_t n = outcome();
    if (n < 0) return std::error_code(static_cast<int>(-n), std::system_category());
    m_answered = true;
    return n;
}

void file_wait::describe(std::string& out) const {
    const reactor::operation& op = io_access::op(*this);
    out += reactor::to_string(op.code);
    if (op.fd >= 0) {
        out += " on fd ";
        out += std::to_string(op.fd);
    }
    if (m_args.path && *m_args.path) {
        out += " of ";
        out += m_args.path;
    }
    if (m_job) out += ", on the offload pool";
}

spindle::result<std::size_t> file_count_wait::take() noexcept {
    spindle::result<std::int64_t> n = answer();
    if (!n) return n.error();
    return static_cast<std::size_t>(*n);
}

spindle::result<void> file_void_wait::take() noexcept {
    spindle::result<std::int64_t> n = answer();
    if (!n) return n.error();
    return {};
}

spindle::result<std::size_t> file_cursor_wait::take() noexcept {
    if (!m_cursor) return std::make_error_code(std::errc::broken_pipe);
    spindle::result<std::int64_t> n = answer();
    if (!n) return n.error();
    *m_cursor += static_cast<std::uint64_t>(*n);
    return static_cast<std::size_t>(*n);
}

spindle::result<int> file_open_wait::take() noexcept {
    spindle::result<std::int64_t> n = answer();
    if (!n) return n.error();
    return static_cast<int>(*n);
}

spindle::result<void> file_close_wait::take() noexcept {
    // A close that never ran (cancelled first) is made in the background:
    // the descriptor is gone either way.
    if (!performed()) close_in_background(descriptor());
    spindle::result<std::int64_t> n = answer();
    if (!n && n.error() != std::errc::operation_canceled) return n.error();
    return {};
}

namespace {

file_args stat_args(const char* path, void* buffer) noexcept {
    file_args a;
    a.path = path;
    a.data = buffer;
#if defined(__linux__)
    a.mode = STATX_BASIC_STATS;
#endif
    return a;
}

file_type type_of(unsigned mode) noexcept {
    switch (mode & S_IFMT) {
        case S_IFREG: return file_type::regular;
        case S_IFDIR: return file_type::directory;
        case S_IFLNK: return file_type::symlink;
        case S_IFBLK: return file_type::block;
        case S_IFCHR: return file_type::character;
        case S_IFIFO: return file_type::fifo;
        case S_IFSOCK: return file_type::socket;
        default: return file_type::unknown;
    }
}

std::chrono::system_clock::time_point time_of(std::int64_t seconds, std::int64_t nanoseconds) noexcept {
    using namespace std::chrono;
    return system_clock::time_point(duration_cast<system_clock::duration>(seconds * 1s + nanoseconds * 1ns));
}

}  // namespace

file_stat_wait::file_stat_wait(int fd, const char* path, int flags) noexcept
    : file_wait(fd, detail::io_code::statx, flags, stat_args(path, m_buffer)) {}

spindle::result<file_status> file_stat_wait::take() noexcept {
    spindle::result<std::int64_t> n = answer();
    if (!n) return n.error();
    file_status s;
#if defined(__linux__)
    static_assert(sizeof(struct statx) <= sizeof(m_buffer));
    const auto* x = reinterpret_cast<const struct statx*>(m_buffer);
    s.type = type_of(x->stx_mode);
    s.permissions = x->stx_mode & 07777;
    s.size = x->stx_size;
    s.blocks = x->stx_blocks;
    s.links = x->stx_nlink;
    s.inode = x->stx_ino;
    s.device = makedev(x->stx_dev_major, x->stx_dev_minor);
    s.user = x->stx_uid;
    s.group = x->stx_gid;
    s.accessed = time_of(x->stx_atime.tv_sec, x->stx_atime.tv_nsec);
    s.modified = time_of(x->stx_mtime.tv_sec, x->stx_mtime.tv_nsec);
    s.changed = time_of(x->stx_ctime.tv_sec, x->stx_ctime.tv_nsec);
#else
    static_assert(sizeof(struct stat) <= sizeof(m_buffer));
    const auto* x = reinterpret_cast<const struct stat*>(m_buffer);
    s.type = type_of(x->st_mode);
    s.permissions = x->st_mode & 07777;
    s.size = static_cast<std::uint64_t>(x->st_size);
    s.blocks = static_cast<std::uint64_t>(x->st_blocks);
    s.links = x->st_nlink;
    s.inode = x->st_ino;
    s.device = static_cast<std::uint64_t>(x->st_dev);
    s.user = x->st_uid;
    s.group = x->st_gid;
#if defined(__APPLE__)
    s.accessed = time_of(x->st_atimespec.tv_sec, x->st_atimespec.tv_nsec);
    s.modified = time_of(x->st_mtimespec.tv_sec, x->st_mtimespec.tv_nsec);
    s.changed = time_of(x->st_ctimespec.tv_sec, x->st_ctimespec.tv_nsec);
#else
    s.accessed = time_of(x->st_atim.tv_sec, x->st_atim.tv_nsec);
    s.modified = time_of(x->st_mtim.tv_sec, x->st_mtim.tv_nsec);
    s.changed = time_of(x->st_ctim.tv_sec, x->st_ctim.tv_nsec);
#endif
#endif
    return s;
}

}  // namespace detail

std::string_view to_string(file_type type) noexcept {
    switch (type) {
        case file_type::regular: return "regular";
        case file_type::directory: return "directory";
        case file_type::symlink: return "symlink";
        case file_type::block: return "block";
        case file_type::character: return "character";
        case file_type::fifo: return "fifo";
        case file_type::socket: return "socket";
        case file_type::unknown: return "unknown";
    }
    return "unknown";
}

// --- file ----------------------------------------------------------------------

using detail::file_args;

task<result<file>> file::open(std::string path, int flags, unsigned mode, std::stop_token token) {
    file_args a;
    a.path = path.c_str();
    a.mode = mode;
    result<int> fd =
        co_await parked<detail::file_open_wait>(std::move(token), AT_FDCWD, detail::io_code::openat, flags, a);
    if (!fd) co_return fd.error();
    co_return file(*fd);
}

task<result<file>> file::open_beneath(int directory, std::string path, int flags, unsigned mode,
                                      std::stop_token token) {
#if defined(__linux__) && defined(RESOLVE_BENEATH)
    ::open_how how{};
    how.flags = static_cast<std::uint64_t>(static_cast<unsigned>(flags | O_CLOEXEC));
    if (flags & (O_CREAT | O_TMPFILE)) how.mode = mode;  // openat2 refuses a mode otherwise
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    file_args a;
    a.path = path.c_str();
    a.data = &how;
    a.size = sizeof how;
    result<int> fd =
        co_await parked<detail::file_open_wait>(std::move(token), directory, detail::io_code::openat2, 0, a);
    if (!fd) co_return fd.error();
    co_return file(*fd);
#else
    (void)directory, (void)path, (void)flags, (void)mode, (void)token;
    co_return std::make_error_code(std::errc::function_not_supported);
#endif
}

file& file::operator=(file&& other) noexcept {
    if (this != &other) {
        close();
        m_fd = std::exchange(other.m_fd, -1);
        m_cursor = other.m_cursor;
        m_write_shut = other.m_write_shut;
    }
    return *this;
}

task<result<std::size_t>> file::read_exactly_at(std::span<std::byte> buf, std::uint64_t offset, std::stop_token token) {
    std::size_t done = 0;
    while (done < buf.size()) {
        result<std::size_t> n = co_await read_at(buf.subspan(done), offset + done, token);
        if (!n) co_return n.error();
        if (*n == 0) break;  // the end of the file
        done += *n;
    }
    co_return done;
}

task<result<void>> file::write_all_at(std::span<const std::byte> buf, std::uint64_t offset, std::stop_token token) {
    std::size_t done = 0;
    while (done < buf.size()) {
        result<std::size_t> n = co_await write_at(buf.subspan(done), offset + done, token);
        if (!n) co_return n.error();
        if (*n == 0) co_return std::make_error_code(std::errc::io_error);
        done += *n;
    }
    co_return result<void>{};
}

task<result<void>> file::write_all(std::span<const std::byte> buf, std::stop_token token) {
    std::size_t done = 0;
    while (done < buf.size()) {
        result<std::size_t> n = co_await write_some(buf.subspan(done), token);
        if (!n) co_return n.error();
        if (*n == 0) co_return std::make_error_code(std::errc::io_error);
        done += *n;
    }
    co_return result<void>{};
}

task<result<void>> file::write_all(std::span<const ::iovec> bufs, std::stop_token token) {
    std::vector<::iovec> left(bufs.begin(), bufs.end());
    std::size_t first = 0;
    while (first < left.size()) {
        if (left[first].iov_len == 0) {
            ++first;
            continue;
        }
        result<std::size_t> n = co_await write_some(std::span<const ::iovec>(left).subspan(first), token);
        if (!n) co_return n.error();
        if (*n == 0) co_return std::make_error_code(std::errc::io_error);
        for (std::size_t taken = *n; taken > 0;) {
            const std::size_t part = std::min(taken, left[first].iov_len);
            left[first].iov_base = static_cast<char*>(left[first].iov_base) + part;
            left[first].iov_len -= part;
            taken -= part;
            if (left[first].iov_len == 0) ++first;
        }
    }
    co_return result<void>{};
}

result<void> file::shutdown_write() noexcept {
    if (m_fd < 0) return std::make_error_code(std::errc::bad_file_descriptor);
    m_write_shut = true;
    return {};
}

namespace {

/// Operations on the ring still pending on `fd` complete with
/// operation_canceled before its number is given up.
void withdraw_from_loop(int fd) noexcept {
    if (detail::loop_core* core = detail::current_core_or_null()) core->backend().close_fd(fd);
}

}  // namespace

void file::close() noexcept {
    if (m_fd < 0) return;
    const int fd = release();
    withdraw_from_loop(fd);
    detail::close_in_background(fd);
}

task<result<void>> file::close_reporting(std::stop_token token) {
    if (m_fd < 0) co_return std::make_error_code(std::errc::bad_file_descriptor);
    const int fd = release();
    withdraw_from_loop(fd);
    co_return co_await parked<detail::file_close_wait>(std::move(token), fd, detail::io_code::close, 0, file_args{});
}

// --- free functions ------------------------------------------------------------

namespace fs {

task<result<std::string>> read_file(std::string path, std::size_t limit, std::stop_token token) {
    result<file> f = co_await file::open(std::move(path), O_RDONLY, 0, token);
    if (!f) co_return f.error();
    result<file_status> st = co_await f->stat(token);
    if (!st) co_return st.error();
    if (st->size > limit) co_return std::make_error_code(std::errc::file_too_large);
    // The size is a hint: a file may grow meanwhile, and /proc says 0.
    std::string out;
    out.resize(std::max<std::size_t>(static_cast<std::size_t>(st->size) + 1, 4096));
    std::size_t have = 0;
    for (;;) {
        if (have == out.size()) {
            if (out.size() > limit) co_return std::make_error_code(std::errc::file_too_large);
            out.resize(std::min(out.size() * 2, limit + 1));
        }
        auto room = std::as_writable_bytes(std::span<char>(out).subspan(have));
        result<std::size_t> n = co_await f->read_at(room, have, token);
        if (!n) co_return n.error();
        if (*n == 0) break;
        have += *n;
        if (have > limit) co_return std::make_error_code(std::errc::file_too_large);
    }
    out.resize(have);
    co_return out;
}

namespace {

std::string temporary_beside(const std::string& path, unsigned attempt) {
    static std::atomic<std::uint64_t> counter{0};
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    const std::uint64_t n = counter.fetch_add(1, std::memory_order_relaxed);
    return path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(n) + "-" +
           std::to_string(static_cast<std::uint64_t>(now) + attempt);
}

std::string parent_of(const std::string& path) {
    const std::size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

}  // namespace

task<result<void>> write_file(std::string path, std::string_view data, write_options options, std::stop_token token) {
    const auto bytes = std::as_bytes(std::span<const char>(data.data(), data.size()));
    if (!options.atomic) {
        result<file> f = co_await file::open(path, O_WRONLY | O_CREAT | O_TRUNC, options.mode, token);
        if (!f) co_return f.error();
        if (result<void> w = co_await f->write_all_at(bytes, 0, token); !w) co_return w.error();
        if (options.sync)
            if (result<void> s = co_await f->datasync(token); !s) co_return s.error();
        co_return co_await f->close_reporting(token);
    }
    // A name of our own beside the target (the same file system, so the
    // rename is atomic); O_EXCL so that no other file is ever overwritten.
    std::string temporary;
    result<file> f = std::make_error_code(std::errc::file_exists);
    for (unsigned attempt = 0; attempt < 16 && !f && f.error() == std::errc::file_exists; ++attempt) {
        temporary = temporary_beside(path, attempt);
        f = co_await file::open(temporary, O_WRONLY | O_CREAT | O_EXCL, options.mode, token);
    }
    if (!f) co_return f.error();
    result<void> r = co_await f->write_all_at(bytes, 0, token);
    if (r) r = co_await f->datasync(token);
    if (r) r = co_await f->close_reporting(token);
    if (r) r = co_await fs::rename(temporary, path, token);
    if (!r) {
        f->close();
        (void)co_await fs::remove(temporary);  // without the token: leave no litter behind
        co_return r.error();
    }
    if (options.sync) {
        // The rename itself on the device: sync the directory.
        result<file> dir = co_await file::open(parent_of(path), O_RDONLY | O_DIRECTORY, 0, token);
        if (!dir) co_return dir.error();
        if (result<void> s = co_await dir->sync(token); !s) co_return s.error();
    }
    co_return result<void>{};
}

task<result<void>> rename(std::string from, std::string to, std::stop_token token) {
    file_args a;
    a.path = from.c_str();
    a.path2 = to.c_str();
    co_return co_await parked<detail::file_void_wait>(std::move(token), AT_FDCWD, detail::io_code::renameat, 0, a);
}

task<result<void>> remove(std::string path, std::stop_token token) {
    file_args a;
    a.path = path.c_str();
    result<void> r = co_await parked<detail::file_void_wait>(token, AT_FDCWD, detail::io_code::unlinkat, 0, a);
    // A directory: Linux says EISDIR, POSIX EPERM.
    if (r || (r.error() != std::errc::is_a_directory && r.error() != std::errc::operation_not_permitted)) co_return r;
    result<void> d =
        co_await parked<detail::file_void_wait>(std::move(token), AT_FDCWD, detail::io_code::unlinkat, AT_REMOVEDIR, a);
    if (!d && d.error() == std::errc::not_a_directory) co_return r;
    co_return d;
}

task<result<void>> make_directory(std::string path, unsigned mode, std::stop_token token) {
    file_args a;
    a.path = path.c_str();
    a.mode = mode;
    co_return co_await parked<detail::file_void_wait>(std::move(token), AT_FDCWD, detail::io_code::mkdirat, 0, a);
}

task<result<file_status>> status(std::string path, bool follow_links, std::stop_token token) {
    co_return co_await parked<detail::file_stat_wait>(std::move(token), AT_FDCWD, path.c_str(),
                                                      follow_links ? 0 : AT_SYMLINK_NOFOLLOW);
}

namespace {

// An open directory, closed by whoever lets it go last: a pool thread, or
// the job that does nothing but let it go (never the loop's thread).
struct open_directory {
    DIR* handle = nullptr;
    ~open_directory() {
        if (handle) ::closedir(handle);
    }
};

struct directory_batch {
    std::vector<directory_entry> entries;
    bool end = false;
};

file_type type_of_entry([[maybe_unused]] const ::dirent& e) noexcept {
#if defined(DT_UNKNOWN)
    switch (e.d_type) {
        case DT_REG: return file_type::regular;
        case DT_DIR: return file_type::directory;
        case DT_LNK: return file_type::symlink;
        case DT_BLK: return file_type::block;
        case DT_CHR: return file_type::character;
        case DT_FIFO: return file_type::fifo;
        case DT_SOCK: return file_type::socket;
        default: return file_type::unknown;
    }
#else
    return file_type::unknown;
#endif
}

struct let_go_in_background {
    std::shared_ptr<open_directory> dir;
    ~let_go_in_background() {
        if (dir) detail::in_background([d = std::move(dir)]() mutable { d.reset(); });
    }
};

}  // namespace

async_generator<result<directory_entry>> list_directory(std::string path, std::stop_token token) {
    auto open = [path]() -> result<std::shared_ptr<open_directory>> {
        auto dir = std::make_shared<open_directory>();
        dir->handle = ::opendir(path.c_str());
        if (!dir->handle) return std::error_code(errno, std::system_category());
        return dir;
    };
    result<std::shared_ptr<open_directory>> opened = co_await offload(std::move(open), token);
    if (!opened) {
        co_yield opened.error();
        co_return;
    }
    let_go_in_background guard{std::move(*opened)};
    for (;;) {
        auto read_batch = [dir = guard.dir]() -> result<directory_batch> {
            directory_batch batch;
            for (int i = 0; i < 128; ++i) {
                errno = 0;
                const ::dirent* e = ::readdir(dir->handle);
                if (!e) {
                    if (errno != 0) return std::error_code(errno, std::system_category());
                    batch.end = true;
                    break;
                }
                const std::string_view name = e->d_name;
                if (name == "." || name == "..") continue;
                batch.entries.push_back({std::string(name), type_of_entry(*e)});
            }
            return batch;
        };
        result<directory_batch> batch = co_await offload(std::move(read_batch), token);
        if (!batch) {
            co_yield batch.error();
            co_return;
        }
        for (directory_entry& e : batch->entries) co_yield std::move(e);
        if (batch->end) co_return;
    }
}

}  // namespace fs

}  // namespace spindle
