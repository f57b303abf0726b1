// Files on every backend: on io_uring the ring's own requests, on epoll the
// offload pool. Real temporary files: positional and vectored reads and
// writes, the cursor (a file is a byte stream), stat, sync, truncate, a
// sparse file past 4 GiB, a cold read after the page cache was dropped,
// every error case a user meets, the free functions (read_file, write_file
// plain and atomic, rename, remove, make_directory, status, the directory
// listing), cancellation before and during an operation (a FIFO's open,
// which blocks until a writer comes) with no descriptor lost, a loop
// destroyed while an open is in flight, two loops on their own threads; and
// net::send_file onto a TCP socket (sendfile on the pool) and through a
// stream that is not a socket.

#include "support.hpp"

#include <spindle/file.hpp>
#include <spindle/net/byte_stream.hpp>
#include <spindle/net/memory_stream.hpp>
#include <spindle/net/send_file.hpp>
#include <spindle/net/tcp.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <set>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using spindle::file;
using spindle::file_status;
using spindle::file_type;
using spindle::loop;
using spindle::result;
using spindle::task;
using spindle::test::bytes_of;
using spindle::test::run;
using spindle::test::run_until;
using spindle::test::text_of;
namespace fs = spindle::fs;

static_assert(spindle::net::byte_stream<file>, "a file is a byte stream");

namespace {

/// A fresh directory under /tmp, removed with what it holds.
struct scratch {
    std::string path;
    scratch() {
        path = "/tmp/spindle-files-XXXXXX";
        REQUIRE(::mkdtemp(path.data()) != nullptr);
    }
    ~scratch() {
        const std::string command = "rm -rf '" + path + "'";
        [[maybe_unused]] const int ignored = std::system(command.c_str());
    }
    std::string operator/(const std::string& name) const { return path + "/" + name; }
};

int open_descriptors() {
    int n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (::readdir(d)) ++n;
        ::closedir(d);
    }
    return n;
}

/// Background closes run on the pool: wait until the count is back.
bool descriptors_back_to(loop& l, int count) {
    return run_until(l, [&] { return open_descriptors() <= count; });
}

std::string slurp(const std::string& path) {
    std::string out;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "<missing>";
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
    return out;
}

std::span<std::byte> writable(std::string& s) { return std::as_writable_bytes(std::span<char>(s)); }

}  // namespace

TEST_CASE("open, write_at, read_at, stat, truncate, sync and close a real file") {
    scratch dir;
    loop l;
    const std::string path = dir / "data.bin";
    run(l, [&]() -> task<void> {
        result<file> f = co_await file::open(path, O_RDWR | O_CREAT | O_EXCL, 0640);
        REQUIRE(f);
        CHECK(f->is_open());
        CHECK((::fcntl(f->fd(), F_GETFD) & FD_CLOEXEC) != 0);

        result<std::size_t> w = co_await f->write_at(bytes_of("hello, world"), 0);
        REQUIRE(w);
        CHECK(*w == 12);
        w = co_await f->write_at(bytes_of("WORLD"), 7);
        CHECK(w.value() == 5);

        std::string back(32, '\0');
        result<std::size_t> r = co_await f->read_at(writable(back), 0);
        REQUIRE(r);
        CHECK(back.substr(0, *r) == "hello, WORLD");
        r = co_await f->read_at(writable(back), 100);  // past the end
        CHECK(r.value() == 0);

        result<file_status> st = co_await f->stat();
        REQUIRE(st);
        CHECK(st->is_regular());
        CHECK(st->size == 12);
        CHECK(st->permissions == 0640);
        CHECK(st->links == 1);
        CHECK(st->modified.time_since_epoch().count() > 0);

        {
            const auto checked = co_await f->truncate(5);
            CHECK(checked);
        }
        result<file_status> cut = co_await f->stat();
        CHECK(cut.value().size == 5);
        {
            const auto checked = co_await f->sync();
            CHECK(checked);
        }
        {
            const auto checked = co_await f->datasync();
            CHECK(checked);
        }
        result<void> closed = co_await f->close_reporting();
        CHECK(closed);
        CHECK_FALSE(f->is_open());
    }());
    CHECK(slurp(path) == "hello");
}

TEST_CASE("vectored reads and writes, and the exact and whole forms") {
    scratch dir;
    loop l;
    run(l, [&]() -> task<void> {
        result<file> f = co_await file::open(dir / "v", O_RDWR | O_CREAT);
        REQUIRE(f);
        std::string a = "abc", b = "defgh";
        const std::array<::iovec, 2> out{{{a.data(), a.size()}, {b.data(), b.size()}}};
        result<std::size_t> w = co_await f->write_at(std::span<const ::iovec>(out), 10);
        CHECK(w.value() == 8);

        std::string x(4, '.'), y(4, '.');
        const std::array<::iovec, 2> in{{{x.data(), x.size()}, {y.data(), y.size()}}};
        result<std::size_t> r = co_await f->read_at(std::span<const ::iovec>(in), 10);
        CHECK(r.value() == 8);
        CHECK(x + y == "abcdefgh");

        // The hole before offset 10 reads as zeros.
        std::string all(64, '.');
        result<std::size_t> n = co_await f->read_exactly_at(writable(all), 0);
        CHECK(n.value() == 18);
        CHECK(all.substr(0, 10) == std::string(10, '\0'));

        const std::string big(300 * 1024, 'z');
        {
            const auto checked = co_await f->write_all_at(bytes_of(big), 0);
            CHECK(checked);
        }
        std::string again(big.size(), '\0');
        result<std::size_t> m = co_await f->read_exactly_at(writable(again), 0);
        CHECK(m.value() == big.size());
        CHECK(again == big);
    }());
}

TEST_CASE("the cursor: read_some and write_some move it; a file is a byte stream") {
    scratch dir;
    loop l;
    const std::string path = dir / "cursor";
    run(l, [&]() -> task<void> {
        result<file> f = co_await file::open(path, O_RDWR | O_CREAT | O_TRUNC);
        REQUIRE(f);
        {
            const auto checked = co_await f->write_all(bytes_of("one "));
            CHECK(checked);
        }
        std::string two = "two ", three = "three";
        const std::array<::iovec, 2> parts{{{two.data(), two.size()}, {three.data(), three.size()}}};
        {
            const auto checked = co_await f->write_all(std::span<const ::iovec>(parts));
            CHECK(checked);
        }
        CHECK(f->position() == 13);

        f->seek(0);
        std::string buf(5, '\0'), got;
        for (;;) {
            result<std::size_t> n = co_await f->read_some(writable(buf));
            REQUIRE(n);
            if (*n == 0) break;
            got.append(buf.data(), *n);
        }
        CHECK(got == "one two three");
        CHECK(f->position() == 13);

        CHECK(f->shutdown_write());
        result<std::size_t> late = co_await f->write_some(bytes_of("x"));
        CHECK(late.error() == std::errc::broken_pipe);
        // Positional writes are not the cursor's: still allowed.
        {
            const auto checked = co_await f->write_at(bytes_of("!"), 13);
            CHECK(checked);
        }
    }());
    CHECK(slurp(path) == "one two three!");
}

TEST_CASE("a sparse file past 4 GiB, by offset") {
    scratch dir;
    loop l;
    run(l, [&]() -> task<void> {
        result<file> f = co_await file::open(dir / "sparse", O_RDWR | O_CREAT);
        REQUIRE(f);
        constexpr std::uint64_t far = (std::uint64_t(5) << 30) + 123;  // 5 GiB and a bit
        result<std::size_t> w = co_await f->write_at(bytes_of("far away"), far);
        if (!w && w.error() == std::errc::file_too_large) {
            WARN("this file system has no room for a 5 GiB offset");
            co_return;
        }
        CHECK(w.value() == 8);
        std::string back(8, '\0');
        result<std::size_t> r = co_await f->read_at(writable(back), far);
        CHECK(r.value() == 8);
        CHECK(back == "far away");
        result<file_status> st = co_await f->stat();
        CHECK(st.value().size == far + 8);
        CHECK(st->blocks * 512 < (std::uint64_t(1) << 30));  // holes take no room
        {
            const auto checked = co_await f->truncate(far - 1);
            CHECK(checked);
        }
        {
            const auto checked = co_await f->stat();
            CHECK(checked.value().size == far - 1);
        }
    }());
}

TEST_CASE("a cold read after the page cache was dropped") {
    scratch dir;
    loop l;
    const std::string path = dir / "cold";
    std::string content(1 << 20, '\0');
    for (std::size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>('a' + i % 23);
    {
        const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        REQUIRE(fd >= 0);
        REQUIRE(::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
        ::fsync(fd);
        // Advice the kernel may ignore (tmpfs keeps pages in memory): the
        // read is then warm, and must be right either way.
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
    }
    run(l, [&]() -> task<void> {
        result<file> f = co_await file::open(path);
        REQUIRE(f);
        std::string back(content.size(), '\0');
        result<std::size_t> n = co_await f->read_exactly_at(writable(back), 0);
        CHECK(n.value() == content.size());
        CHECK(back == content);
    }());
}

TEST_CASE("errors are results: missing, a directory, not a directory, permission, a closed file") {
    scratch dir;
    loop l;
    const int before = open_descriptors();
    run(l, [&]() -> task<void> {
        result<file> missing = co_await file::open(dir / "nope");
        CHECK(missing.error() == std::errc::no_such_file_or_directory);

        result<file> as_dir = co_await file::open(dir.path, O_WRONLY);
        CHECK(as_dir.error() == std::errc::is_a_directory);

        result<file> made = co_await file::open(dir / "plain", O_WRONLY | O_CREAT);
        REQUIRE(made);
        made->close();
        result<file> under = co_await file::open(dir / "plain/inner");
        CHECK(under.error() == std::errc::not_a_directory);

        result<file> exclusive = co_await file::open(dir / "plain", O_WRONLY | O_CREAT | O_EXCL);
        CHECK(exclusive.error() == std::errc::file_exists);

        if (::geteuid() != 0) {
            ::chmod((dir / "plain").c_str(), 0);
            result<file> denied = co_await file::open(dir / "plain");
            CHECK(denied.error() == std::errc::permission_denied);
        } else {
            WARN("running as root: permissions are not enforced, EACCES not checked");
        }

        file closed;
        std::string buf(4, '\0');
        result<std::size_t> r = co_await closed.read_at(writable(buf), 0);
        CHECK(r.error() == std::errc::bad_file_descriptor);
        result<std::size_t> w = co_await closed.write_some(bytes_of("x"));
        CHECK(w.error() == std::errc::bad_file_descriptor);
        {
            const auto checked = co_await closed.stat();
            CHECK(checked.error() == std::errc::bad_file_descriptor);
        }
        {
            const auto checked = co_await closed.close_reporting();
            CHECK(checked.error() == std::errc::bad_file_descriptor);
        }

        // A file opened for reading only refuses writes.
        result<file> ro = co_await file::open(dir / "ro", O_WRONLY | O_CREAT);
        REQUIRE(ro);
        ro->close();
        result<file> reader = co_await file::open(dir / "ro", O_RDONLY);
        REQUIRE(reader);
        {
            const auto checked = co_await reader->write_at(bytes_of("x"), 0);
            CHECK(checked.error() == std::errc::bad_file_descriptor);
        }
        // A directory opened for reading cannot be read as a file.
        result<file> d = co_await file::open(dir.path, O_RDONLY | O_DIRECTORY);
        REQUIRE(d);
        {
            const auto checked = co_await d->read_at(writable(buf), 0);
            CHECK(checked.error() == std::errc::is_a_directory);
        }
        {
            const auto checked = co_await d->stat();
            CHECK(checked.value().is_directory());
        }
    }());
    CHECK(descriptors_back_to(l, before));
}

TEST_CASE("spindle::read of a regular file never blocks the loop: io_uring reads it, epoll refuses") {
    scratch dir;
    const std::string path = dir / "plain";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, "data", 4) == 4);
    REQUIRE(::lseek(fd, 0, SEEK_SET) == 0);
    loop l;
    spindle::test::log_capture logs;
    run(l, [&]() -> task<void> {
        std::string buf(8, '\0');
        result<std::size_t> n = co_await spindle::read(fd, writable(buf));
        if (l.backend() == spindle::backend_kind::epoll) {
            CHECK(n.error() == std::errc::operation_not_permitted);
        } else {
            CHECK(n.value() == 4);
        }
    }());
    if (l.backend() == spindle::backend_kind::epoll) CHECK(logs.contains("use spindle::file"));
    ::close(fd);
}

TEST_CASE("open_beneath: paths inside a directory open, paths that leave it are refused") {
    scratch dir;
    scratch outside;
    loop l;
    const int before = open_descriptors();
    run(l, [&]() -> task<void> {
        {
            const auto checked = co_await fs::make_directory(dir / "in");
            CHECK(checked);
        }
        {
            const auto checked = co_await fs::write_file(dir / "in/f", "inside");
            CHECK(checked);
        }
        {
            const auto checked = co_await fs::write_file(outside / "secret", "outside");
            CHECK(checked);
        }
        ::symlink((outside / "secret").c_str(), (dir / "leaves").c_str());
        ::symlink("in/f", (dir / "stays").c_str());
        result<file> root = co_await file::open(dir.path, O_RDONLY | O_DIRECTORY);
        REQUIRE(root);
        result<file> f = co_await file::open_beneath(root->fd(), "stays");
        if (!f && f.error() == std::errc::function_not_supported) {
            WARN("no openat2 here (Linux before 5.6)");
            co_return;
        }
        REQUIRE(f);
        std::string buf(16, '\0');
        result<std::size_t> n = co_await f->read_at(writable(buf), 0);
        CHECK(buf.substr(0, n.value()) == "inside");
        {
            const auto checked = co_await file::open_beneath(root->fd(), "leaves");
            CHECK(checked.error() == std::errc::cross_device_link);
        }
        {
            const auto checked = co_await file::open_beneath(root->fd(), "in/../../x");
            CHECK(checked.error() == std::errc::cross_device_link);
        }
        {
            const auto checked = co_await file::open_beneath(root->fd(), outside / "secret");
            CHECK(checked.error() == std::errc::cross_device_link);
        }
        {
            const auto checked = co_await file::open_beneath(root->fd(), "missing");
            CHECK(checked.error() == std::errc::no_such_file_or_directory);
        }
        result<file> made = co_await file::open_beneath(root->fd(), "in/new", O_WRONLY | O_CREAT, 0600);
        REQUIRE(made);
        {
            const auto checked = co_await made->stat();
            CHECK(checked.value().permissions == 0600);
        }
    }());
    CHECK(descriptors_back_to(l, before));
}

TEST_CASE("read_file and write_file, plain and atomic") {
    scratch dir;
    loop l;
    const std::string path = dir / "config.txt";
    run(l, [&]() -> task<void> {
        {
            const auto checked = co_await fs::write_file(path, "first");
            CHECK(checked);
        }
        result<std::string> one = co_await fs::read_file(path);
        CHECK(one.value() == "first");

        const std::string big(3 * 1024 * 1024 + 7, 'q');
        {
            const auto checked = co_await fs::write_file(path, big, {.atomic = true, .sync = true, .mode = 0600});
            CHECK(checked);
        }
        result<std::string> two = co_await fs::read_file(path);
        CHECK(two.value() == big);
        {
            const auto checked = co_await fs::status(path);
            CHECK(checked.value().permissions == 0600);
        }

        result<std::string> limited = co_await fs::read_file(path, 1024);
        CHECK(limited.error() == std::errc::file_too_large);

        // /proc says size 0: read until the end anyway.
        result<std::string> proc = co_await fs::read_file("/proc/self/status");
        REQUIRE(proc);
        CHECK(proc->find("Name:") != std::string::npos);

        result<std::string> missing = co_await fs::read_file(dir / "missing");
        CHECK(missing.error() == std::errc::no_such_file_or_directory);
        // An atomic write into a directory that does not exist fails, and
        // leaves nothing behind.
        result<void> nowhere = co_await fs::write_file(dir / "no/such/dir/x", "data", {.atomic = true});
        CHECK(nowhere.error() == std::errc::no_such_file_or_directory);
    }());
    // No temporary file is left beside the target.
    std::set<std::string> names;
    DIR* d = ::opendir(dir.path.c_str());
    REQUIRE(d);
    while (const dirent* e = ::readdir(d)) names.insert(e->d_name);
    ::closedir(d);
    CHECK(names == std::set<std::string>{".", "..", "config.txt"});
}

TEST_CASE("rename, remove, make_directory, status and the directory listing") {
    scratch dir;
    loop l;
    run(l, [&]() -> task<void> {
        {
            const auto checked = co_await fs::make_directory(dir / "sub");
            CHECK(checked);
        }
        result<void> again = co_await fs::make_directory(dir / "sub");
        CHECK(again.error() == std::errc::file_exists);
        {
            const auto checked = co_await fs::write_file(dir / "sub/a", "A");
            CHECK(checked);
        }
        {
            const auto checked = co_await fs::write_file(dir / "b", "B");
            CHECK(checked);
        }
        {
            const auto checked = co_await fs::rename(dir / "b", dir / "sub/c");
            CHECK(checked);
        }
        result<void> gone = co_await fs::rename(dir / "b", dir / "d");
        CHECK(gone.error() == std::errc::no_such_file_or_directory);
        ::symlink("a", (dir / "sub/link").c_str());

        result<file_status> link = co_await fs::status(dir / "sub/link", false);
        CHECK(link.value().type == file_type::symlink);
        result<file_status> target = co_await fs::status(dir / "sub/link");
        CHECK(target.value().type == file_type::regular);
        CHECK(target->size == 1);

        std::set<std::string> names;
        auto listing = fs::list_directory(dir / "sub");
        while (auto entry = co_await listing.next()) {
            REQUIRE(*entry);
            names.insert((*entry)->name);
            if ((*entry)->name == "a") CHECK((*entry)->type == file_type::regular);
        }
        CHECK(names == std::set<std::string>{"a", "c", "link"});

        auto missing = fs::list_directory(dir / "nope");
        auto first = co_await missing.next();
        REQUIRE(first);
        CHECK(first->error() == std::errc::no_such_file_or_directory);
        {
            const auto checked = co_await missing.next();
            CHECK_FALSE(checked);
        }

        result<void> not_empty = co_await fs::remove(dir / "sub");
        CHECK(not_empty.error() == std::errc::directory_not_empty);
        for (const char* name : {"sub/a", "sub/c", "sub/link"}) {
            const auto checked = co_await fs::remove(dir / name);
            CHECK(checked);
        }
        {
            const auto checked = co_await fs::remove(dir / "sub");
            CHECK(checked);
        }
        {
            const auto checked = co_await fs::status(dir / "sub");
            CHECK(checked.error() == std::errc::no_such_file_or_directory);
        }
        {
            const auto checked = co_await fs::remove(dir / "sub");
            CHECK(checked.error() == std::errc::no_such_file_or_directory);
        }
    }());
}

TEST_CASE("a large directory is listed in full, across batches") {
    scratch dir;
    for (int i = 0; i < 300; ++i) {
        const int fd = ::open((dir / ("f" + std::to_string(i))).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        REQUIRE(fd >= 0);
        ::close(fd);
    }
    loop l;
    const int before = open_descriptors();
    const std::size_t count = run(l, [&]() -> task<std::size_t> {
        std::size_t n = 0;
        auto listing = fs::list_directory(dir.path);
        while (auto entry = co_await listing.next()) n += entry->has_value();
        // Stopped early: the directory is still closed (below).
        auto partial = fs::list_directory(dir.path);
        (void)co_await partial.next();
        co_return n;
    }());
    CHECK(count == 300);
    CHECK(descriptors_back_to(l, before));
}

TEST_CASE("a stopped token: nothing is done and nothing is opened") {
    scratch dir;
    loop l;
    const int before = open_descriptors();
    run(l, [&]() -> task<void> {
        std::stop_source stop;
        stop.request_stop();
        result<file> f = co_await file::open(dir / "never", O_WRONLY | O_CREAT, 0644, stop.get_token());
        CHECK(f.error() == std::errc::operation_canceled);
        result<void> m = co_await fs::make_directory(dir / "never-dir", 0755, stop.get_token());
        CHECK(m.error() == std::errc::operation_canceled);
        // A close cancelled before it ran still closes.
        result<file> g = co_await file::open(dir / "closing", O_WRONLY | O_CREAT);
        REQUIRE(g);
        {
            const auto checked = co_await g->close_reporting(stop.get_token());
            CHECK(checked);
        }
    }());
    CHECK(::access((dir / "never").c_str(), F_OK) != 0);
    CHECK(::access((dir / "never-dir").c_str(), F_OK) != 0);
    CHECK(descriptors_back_to(l, before));
}

TEST_CASE("cancelling an open in flight: a descriptor it made anyway is closed") {
    // Opening a FIFO for reading blocks until a writer opens it: an open
    // that is surely in flight when the cancel comes.
    scratch dir;
    const std::string fifo = dir / "fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    loop l;
    const int before = open_descriptors();
    std::atomic<bool> writer_done{false};
    std::thread writer;
    run(l, [&]() -> task<void> {
        std::stop_source stop;
        // O_CREAT: io_uring would try a non-blocking open first, which a FIFO
        // allows at once.
        auto opening = l.spawn(file::open(fifo, O_RDONLY | O_CREAT, 0600, stop.get_token()));
        (void)co_await spindle::sleep_for(50ms);
        CHECK(l.metrics().io_in_flight[static_cast<std::size_t>(spindle::io_kind::file)] == 1);
        CHECK(l.dump_tasks().find("open of " + fifo) != std::string::npos);
        stop.request_stop();
        // On the pool the open runs to its end, so let a writer come.
        writer = std::thread([&] {
            std::this_thread::sleep_for(20ms);  // the cancel first, most of the time
            const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
            if (fd >= 0) ::close(fd);
            writer_done = true;
        });
        // Cancelled, or done before the cancel reached it: then the file is
        // ours, and closed with it.
        result<file> f = co_await opening;
        CHECK((f.error() == std::errc::operation_canceled || f.has_value()));
    }());
    // A writer still blocked (io_uring interrupted the open): release it.
    if (!writer_done) {
        const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        while (!writer_done) std::this_thread::sleep_for(1ms);
        if (fd >= 0) ::close(fd);
    }
    writer.join();
    CHECK(descriptors_back_to(l, before));
    CHECK(l.metrics().io_in_flight[static_cast<std::size_t>(spindle::io_kind::file)] == 0);
}

TEST_CASE("a loop destroyed while an open is in flight frees its frame and loses no descriptor") {
    scratch dir;
    const std::string fifo = dir / "fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    loop after;  // its own descriptors counted in `before`
    const int before = open_descriptors();
    std::atomic<bool> writer_done{false};
    spindle::test::counted::alive = 0;
    {
        loop l;
        l.spawn([](std::string path) -> task<void> {
             spindle::test::counted witness;
             result<file> f = co_await file::open(path, O_RDONLY | O_CREAT, 0600);
             (void)f;
         }(fifo))
            .detach();
        spindle::test::settle(l);
        CHECK(spindle::test::counted::alive == 1);
        // A writer after a while: the pool's open ends then, and the loop's
        // destruction waits for it, since it writes into the frame.
        std::thread([&] {
            std::this_thread::sleep_for(100ms);
            const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
            if (fd >= 0) ::close(fd);
            writer_done = true;
        }).detach();
    }
    CHECK(spindle::test::counted::alive == 0);
    while (!writer_done) std::this_thread::sleep_for(1ms);
    CHECK(descriptors_back_to(after, before));
}

TEST_CASE("two loops on their own threads read and write files at once") {
    scratch dir;
    std::atomic<int> good{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
        threads.emplace_back([&, t] {
            loop l;
            const bool ok = run(l, [&]() -> task<bool> {
                const std::string path = dir / ("t" + std::to_string(t));
                for (int i = 0; i < 50; ++i) {
                    const std::string text = "round " + std::to_string(i) + " of thread " + std::to_string(t);
                    if (!co_await fs::write_file(path, text)) co_return false;
                    result<std::string> back = co_await fs::read_file(path);
                    if (!back || *back != text) co_return false;
                }
                co_return true;
            }());
            if (ok) ++good;
        });
    }
    for (auto& th : threads) th.join();
    CHECK(good == 2);
}

namespace {

namespace net = spindle::net;

/// Reads `s` to its end (bounded), counting, and checking its first
/// `checked` bytes against the pattern the file was written with.
task<result<std::uint64_t>> read_pattern(net::tcp_stream& s, std::uint64_t checked, bool& intact) {
    std::vector<std::byte> buf(64 * 1024);
    std::uint64_t got = 0;
    intact = true;
    for (int i = 0; i < 1'000'000; ++i) {
        result<std::size_t> n = co_await s.read_some(buf);
        if (!n) co_return n.error();
        if (*n == 0) co_return got;
        for (std::size_t k = 0; k < *n; ++k)
            if (got + k < checked && buf[k] != static_cast<std::byte>((got + k) % 251)) intact = false;
        got += *n;
    }
    co_return std::make_error_code(std::errc::message_size);
}

std::string pattern_file(const scratch& dir, std::size_t size) {
    std::string content(size, '\0');
    for (std::size_t i = 0; i < size; ++i) content[i] = static_cast<char>(i % 251);
    const std::string path = dir / "pattern";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
    ::close(fd);
    return path;
}

}  // namespace

TEST_CASE("send_file: sendfile onto a TCP socket, a range, the end of the file, a closed peer") {
    scratch dir;
    constexpr std::size_t size = 6 * 1024 * 1024 + 17;
    const std::string path = pattern_file(dir, size);
    loop l;
    run(l, [&]() -> task<void> {
        auto listener = net::tcp_listener::bind(net::address::ipv4_loopback(0));
        REQUIRE(listener);
        auto at = listener->local_address();
        REQUIRE(at);
        result<net::tcp_stream> client = co_await net::tcp_stream::connect(*at);
        REQUIRE(client);
        result<net::tcp_stream> server = co_await listener->accept();
        REQUIRE(server);
        result<file> f = co_await file::open(path);
        REQUIRE(f);

        // The whole file, then a range from the middle, then past the end.
        bool intact = false;
        auto reader = l.spawn(read_pattern(*client, size, intact));
        result<std::uint64_t> all = co_await net::send_file(*server, *f, 0, size);
        CHECK(all.value() == size);
        result<std::uint64_t> tail = co_await net::send_file(*server, *f, size - 10, 1000);
        CHECK(tail.value() == 10);  // the file ended first
        CHECK(server->shutdown_write());
        result<std::uint64_t> got = co_await reader;
        CHECK(got.value() == size + 10);
        CHECK(intact);

        // A closed peer: broken_pipe (or a reset), and the process lives on.
        result<net::tcp_stream> c2 = co_await net::tcp_stream::connect(*at);
        REQUIRE(c2);
        result<net::tcp_stream> s2 = co_await listener->accept();
        REQUIRE(s2);
        c2->close();
        result<std::uint64_t> late = co_await net::send_file(*s2, *f, 0, size);
        REQUIRE_FALSE(late);
        CHECK((late.error() == std::errc::broken_pipe || late.error() == std::errc::connection_reset));
    }());
}

TEST_CASE("send_file: a range through a stream that is not a socket, byte for byte") {
    scratch dir;
    constexpr std::size_t size = 300 * 1024 + 5;
    const std::string path = pattern_file(dir, size);
    loop l;
    run(l, [&]() -> task<void> {
        auto ends = net::memory_stream::pair(16 * 1024);
        net::memory_stream& a = ends.first;
        net::memory_stream& b = ends.second;
        result<file> f = co_await file::open(path);
        REQUIRE(f);
        constexpr std::uint64_t from = 1000, count = 200 * 1024;
        auto sender = [&]() -> task<result<std::uint64_t>> {
            result<std::uint64_t> n = co_await net::send_file(a, *f, from, count);
            a.close();
            co_return n;
        };
        auto sending = l.spawn(sender());
        std::vector<std::byte> buf(4096);
        std::uint64_t got = 0;
        bool intact = true;
        for (int i = 0; i < 100'000; ++i) {
            result<std::size_t> n = co_await b.read_some(buf);
            REQUIRE(n);
            if (*n == 0) break;
            for (std::size_t k = 0; k < *n; ++k)
                if (buf[k] != static_cast<std::byte>((from + got + k) % 251)) intact = false;
            got += *n;
        }
        CHECK(got == count);
        CHECK(intact);
        result<std::uint64_t> sent = co_await sending;
        CHECK(sent.value() == count);
    }());
}
