#pragma once
/// Files, without blocking a loop: spindle::file and the free functions of
/// spindle::fs.
///
///     spindle::result<spindle::file> f = co_await spindle::file::open("data.bin", O_RDONLY);
///     std::array<std::byte, 4096> buf;
///     spindle::result<std::size_t> n = co_await f->read_at(buf, 1 << 20);
///     spindle::result<std::string> text = co_await spindle::fs::read_file("notes.txt");
///
/// Every call answers result<T> and takes a stop token (with_timeout reaches
/// it too). No file syscall runs on a loop's thread: on io_uring a file
/// operation is the ring's own request where the kernel's probe lists it
/// (openat, read, write, fsync, statx, close, renameat, unlinkat, mkdirat,
/// ftruncate); everything else (epoll, kqueue, a kernel without the request)
/// runs as a blocking job on the offload pool (offload_pool::shared(), kind
/// blocking), which resumes the task on its loop.
///
/// The rules, and why (docs/files.md):
/// - An operation refers to the caller's buffers until it completes: keep
///   them alive. A cancelled operation may still have completed (a read's
///   bytes, a write's), as on io_uring the kernel may have finished it, and
///   on the pool a started job runs to its end first: after cancelling a
///   read or write, the file's contents and the buffer are unknown. A
///   cancelled open that completed anyway has its descriptor closed.
/// - A frame destroyed while its operation runs (a loop destroyed with the
///   task parked) waits for that operation to end, because it writes into
///   memory the frame owns. File operations are bounded syscalls; a file
///   that can block for ever (a FIFO, a terminal) is a descriptor for
///   spindle::read and spindle::write instead, which wait for readiness.
/// - Errors are the OS's: no_such_file_or_directory, permission_denied,
///   is_a_directory, no_space_on_device... (std::errc compares equal).
/// - A file belongs to the loop of the tasks that use it; its cursor
///   (read_some, write_some) is its own, not the descriptor's offset, so
///   positional calls and the cursor do not disturb each other.

#include <spindle/async_generator.hpp>
#include <spindle/detail/io_op.hpp>
#include <spindle/park.hpp>
#include <spindle/result.hpp>
#include <spindle/task.hpp>

#include <fcntl.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>

namespace spindle {

enum class file_type : std::uint8_t { regular, directory, symlink, block, character, fifo, socket, unknown };
std::string_view to_string(file_type type) noexcept;

/// What stat says of a file.
struct file_status {
    file_type type = file_type::unknown;
    /// Permission bits (07777).
    std::uint32_t permissions = 0;
    std::uint64_t size = 0;
    /// Space it takes on the device, in 512-byte blocks.
    std::uint64_t blocks = 0;
    std::uint64_t links = 0;
    std::uint64_t inode = 0;
    std::uint64_t device = 0;
    std::uint32_t user = 0;
    std::uint32_t group = 0;
    std::chrono::system_clock::time_point accessed;
    std::chrono::system_clock::time_point modified;
    std::chrono::system_clock::time_point changed;

    bool is_regular() const noexcept { return type == file_type::regular; }
    bool is_directory() const noexcept { return type == file_type::directory; }
};

namespace detail {

struct file_job;

// statx of the descriptor itself (an empty path).
#if defined(AT_EMPTY_PATH)
inline constexpr int empty_path = AT_EMPTY_PATH;
#else
inline constexpr int empty_path = 0;
#endif

/// A file operation as a wait of the park protocol: the ring's request
/// where the backend performs it (backend::performs), a blocking job on the
/// offload pool otherwise.
class file_wait : public waiter, private io_op {
public:
    file_wait(int fd, io_code code, int flags, const file_args& args) noexcept;
    ~file_wait();

    bool ready();
    void on_park();
    void on_cancel() noexcept;
    void on_abandon() noexcept;
    void describe(std::string& out) const;

protected:
    /// The answer: a count, a descriptor or 0; the error otherwise
    /// (operation_canceled when cancelled, pool_closed...).
    spindle::result<std::int64_t> answer() noexcept;
    /// The syscall ran (it may have failed); false when it was withdrawn
    /// or cancelled before it started.
    bool performed() const noexcept;
    int descriptor() const noexcept;
    file_args m_args;

private:
    static void on_complete(io_op& op) noexcept;
    std::int64_t outcome() const noexcept;

    loop_core* m_core = nullptr;
    file_job* m_job = nullptr;
    io_code m_code;
    bool m_native = false;
    bool m_answered = false;
};

/// Completes with a byte count.
class file_count_wait : public file_wait {
public:
    using file_wait::file_wait;
    spindle::result<std::size_t> take() noexcept;
};

/// Completes with nothing but success or an error.
class file_void_wait : public file_wait {
public:
    using file_wait::file_wait;
    spindle::result<void> take() noexcept;
};

/// A read or write at a cursor, which it moves by the count; a null cursor
/// is a write after shutdown_write (broken_pipe).
class file_cursor_wait : public file_wait {
public:
    file_cursor_wait(int fd, io_code code, const file_args& args, std::uint64_t* cursor) noexcept
        : file_wait(fd, code, 0, args), m_cursor(cursor) {}
    spindle::result<std::size_t> take() noexcept;

private:
    std::uint64_t* m_cursor;
};

/// Completes with a new descriptor.
class file_open_wait : public file_wait {
public:
    using file_wait::file_wait;
    spindle::result<int> take() noexcept;
};

/// close(2): the descriptor is closed whatever happens, in the background
/// when the wait was cancelled before the close ran.
class file_close_wait : public file_wait {
public:
    using file_wait::file_wait;
    spindle::result<void> take() noexcept;
};

/// statx(2) into its own buffer: completes with a file_status.
class file_stat_wait : public file_wait {
public:
    file_stat_wait(int fd, const char* path, int flags) noexcept;
    spindle::result<file_status> take() noexcept;

private:
    alignas(8) std::byte m_buffer[256];  // a struct statx (or a struct stat)
};

}  // namespace detail

class file {
public:
    /// Opens `path` with open(2)'s `flags` (O_RDONLY, O_WRONLY | O_CREAT |
    /// O_TRUNC...) and, for a file it creates, `mode`. Always close-on-exec.
    [[nodiscard]] static task<result<file>> open(std::string path, int flags = O_RDONLY, unsigned mode = 0644,
                                                 std::stop_token token = {});

    /// Opens `path` beneath the directory open as `directory` (a descriptor,
    /// which stays the caller's; a file's fd()): no "..", no symbolic
    /// link, absolute or relative, leads out of it (openat2(2) with
    /// RESOLVE_BENEATH, Linux 5.6: function_not_supported before, and
    /// elsewhere; cross_device_link for a path that would leave).
    [[nodiscard]] static task<result<file>> open_beneath(int directory, std::string path, int flags = O_RDONLY,
                                                         unsigned mode = 0644, std::stop_token token = {});

    /// A closed file.
    file() noexcept = default;
    /// Takes over `fd` (closed with the file).
    explicit file(int fd) noexcept : m_fd(fd) {}
    file(file&& other) noexcept
        : m_fd(std::exchange(other.m_fd, -1)), m_cursor(other.m_cursor), m_write_shut(other.m_write_shut) {}
    file& operator=(file&& other) noexcept;
    file(const file&) = delete;
    file& operator=(const file&) = delete;
    ~file() { close(); }

    bool is_open() const noexcept { return m_fd >= 0; }
    int fd() const noexcept { return m_fd; }
    /// Gives the descriptor up without closing it.
    int release() noexcept { return std::exchange(m_fd, -1); }

    /// Reads at most buf.size() bytes at `offset`: the count, 0 at the end.
    [[nodiscard]] parked<detail::file_count_wait> read_at(std::span<std::byte> buf, std::uint64_t offset,
                                                          std::stop_token token = {}) {
        return parked<detail::file_count_wait>(std::move(token), m_fd, detail::io_code::read_at, 0,
                                               buffer_args(buf.data(), buf.size(), offset));
    }
    /// Writes at most buf.size() bytes at `offset`: the count.
    [[nodiscard]] parked<detail::file_count_wait> write_at(std::span<const std::byte> buf, std::uint64_t offset,
                                                           std::stop_token token = {}) {
        return parked<detail::file_count_wait>(std::move(token), m_fd, detail::io_code::write_at, 0,
                                               buffer_args(const_cast<std::byte*>(buf.data()), buf.size(), offset));
    }
    /// Vectored: fills (or writes) the buffers in order from `offset`.
    [[nodiscard]] parked<detail::file_count_wait> read_at(std::span<const ::iovec> bufs, std::uint64_t offset,
                                                          std::stop_token token = {}) {
        return parked<detail::file_count_wait>(std::move(token), m_fd, detail::io_code::readv_at, 0,
                                               vector_args(bufs, offset));
    }
    [[nodiscard]] parked<detail::file_count_wait> write_at(std::span<const ::iovec> bufs, std::uint64_t offset,
                                                           std::stop_token token = {}) {
        return parked<detail::file_count_wait>(std::move(token), m_fd, detail::io_code::writev_at, 0,
                                               vector_args(bufs, offset));
    }
    /// Reads until `buf` is full or the file ends: the count.
    [[nodiscard]] task<result<std::size_t>> read_exactly_at(std::span<std::byte> buf, std::uint64_t offset,
                                                            std::stop_token token = {});
    /// Writes all of `buf` at `offset`, across partial writes.
    [[nodiscard]] task<result<void>> write_all_at(std::span<const std::byte> buf, std::uint64_t offset,
                                                  std::stop_token token = {});

    // --- the cursor: a file is a byte stream (spindle::net::byte_stream)

    /// Reads at the cursor and moves it by the count; 0 at the end.
    [[nodiscard]] parked<detail::file_cursor_wait> read_some(std::span<std::byte> buf, std::stop_token token = {}) {
        return parked<detail::file_cursor_wait>(std::move(token), m_fd, detail::io_code::read_at,
                                                buffer_args(buf.data(), buf.size(), m_cursor), &m_cursor);
    }
    /// Writes at the cursor and moves it by the count (after shutdown_write:
    /// broken_pipe).
    [[nodiscard]] parked<detail::file_cursor_wait> write_some(std::span<const std::byte> buf,
                                                              std::stop_token token = {}) {
        return parked<detail::file_cursor_wait>(std::move(token), writable_fd(), detail::io_code::write_at,
                                                buffer_args(const_cast<std::byte*>(buf.data()), buf.size(), m_cursor),
                                                writable_cursor());
    }
    [[nodiscard]] parked<detail::file_cursor_wait> write_some(std::span<const ::iovec> bufs,
                                                              std::stop_token token = {}) {
        return parked<detail::file_cursor_wait>(std::move(token), writable_fd(), detail::io_code::writev_at,
                                                vector_args(bufs, m_cursor), writable_cursor());
    }
    [[nodiscard]] task<result<void>> write_all(std::span<const std::byte> buf, std::stop_token token = {});
    [[nodiscard]] task<result<void>> write_all(std::span<const ::iovec> bufs, std::stop_token token = {});
    /// Ends writing through the cursor: later writes fail with broken_pipe.
    result<void> shutdown_write() noexcept;
    std::uint64_t position() const noexcept { return m_cursor; }
    void seek(std::uint64_t position) noexcept { m_cursor = position; }

    // --- the rest

    /// fsync(2): data and metadata on the device.
    [[nodiscard]] parked<detail::file_void_wait> sync(std::stop_token token = {}) {
        return parked<detail::file_void_wait>(std::move(token), m_fd, detail::io_code::fsync, 0, detail::file_args{});
    }
    /// fdatasync(2): the data, and the metadata needed to read it back.
    [[nodiscard]] parked<detail::file_void_wait> datasync(std::stop_token token = {}) {
        return parked<detail::file_void_wait>(std::move(token), m_fd, detail::io_code::fsync, 1, detail::file_args{});
    }
    [[nodiscard]] parked<detail::file_stat_wait> stat(std::stop_token token = {}) {
        return parked<detail::file_stat_wait>(std::move(token), m_fd, "", detail::empty_path);
    }
    /// ftruncate(2): cuts or extends (with zeros) the file to `length`.
    [[nodiscard]] parked<detail::file_void_wait> truncate(std::uint64_t length, std::stop_token token = {}) {
        detail::file_args a;
        a.offset = length;
        return parked<detail::file_void_wait>(std::move(token), m_fd, detail::io_code::truncate, 0, a);
    }

    /// Closes at once, without waiting and without an answer: the close(2)
    /// itself runs off the loop. Safe to call twice.
    void close() noexcept;
    /// Closes and answers what close(2) said (a network file system reports
    /// a failed write there). The file is closed whatever the answer.
    [[nodiscard]] task<result<void>> close_reporting(std::stop_token token = {});

private:
    static detail::file_args buffer_args(std::byte* data, std::size_t size, std::uint64_t offset) noexcept {
        detail::file_args a;
        a.data = data;
        a.size = size;
        a.offset = offset;
        return a;
    }
    static detail::file_args vector_args(std::span<const ::iovec> bufs, std::uint64_t offset) noexcept {
        detail::file_args a;
        a.iov = bufs.data();
        a.count = static_cast<int>(bufs.size());
        a.offset = offset;
        return a;
    }
    // After shutdown_write, no descriptor: the write fails at once, and its
    // wait (told by a null cursor) says broken_pipe.
    int writable_fd() const noexcept { return m_write_shut ? -1 : m_fd; }
    std::uint64_t* writable_cursor() noexcept { return m_write_shut ? nullptr : &m_cursor; }

    int m_fd = -1;
    std::uint64_t m_cursor = 0;
    bool m_write_shut = false;
};

namespace fs {

/// The whole file, or file_too_large beyond `limit` bytes.
[[nodiscard]] task<result<std::string>> read_file(std::string path, std::size_t limit = std::size_t(1) << 30,
                                                  std::stop_token token = {});

struct write_options {
    /// Write a temporary file beside `path`, sync it, then rename it over
    /// `path`: a reader sees the old contents or the new, never a part.
    bool atomic = false;
    /// fdatasync before closing (always done when atomic).
    bool sync = false;
    /// The mode of a file created.
    unsigned mode = 0644;
};
/// Writes `data` as the whole file (created or truncated).
[[nodiscard]] task<result<void>> write_file(std::string path, std::string_view data, write_options options = {},
                                            std::stop_token token = {});

/// rename(2): `to` is replaced if it exists.
[[nodiscard]] task<result<void>> rename(std::string from, std::string to, std::stop_token token = {});
/// Removes a file, or an empty directory.
[[nodiscard]] task<result<void>> remove(std::string path, std::stop_token token = {});
[[nodiscard]] task<result<void>> make_directory(std::string path, unsigned mode = 0755, std::stop_token token = {});
/// stat of a path; follow_links false: of a symbolic link itself (lstat).
[[nodiscard]] task<result<file_status>> status(std::string path, bool follow_links = true, std::stop_token token = {});

struct directory_entry {
    std::string name;
    /// From the directory itself; unknown where the file system does not say.
    file_type type = file_type::unknown;
};
/// The entries of a directory, without "." and "..", in the directory's
/// order, read in batches on the pool. An error (opening or reading) is
/// yielded as the last item.
[[nodiscard]] async_generator<result<directory_entry>> list_directory(std::string path, std::stop_token token = {});

}  // namespace fs

}  // namespace spindle
