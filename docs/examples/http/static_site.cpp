#include "static_site.hpp"

#include "static_rules.hpp"

#include <spindle/offload.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#endif

#include <cerrno>
#include <charconv>
#include <chrono>

namespace spindle::examples::http {

namespace {

/// Files up to this size are read and sent with their head.
constexpr std::uint64_t inline_limit = 64 * 1024;

struct opened {
    int fd = -1;
    int error = 0;
    bool regular = false;
    std::uint64_t size = 0;
    std::chrono::system_clock::time_point modified;
};

/// On the pool: opens `path` beneath the root and stats it.
opened open_beneath(int root, const std::string& path) noexcept {
    opened o;
#if defined(SYS_openat2) && defined(RESOLVE_BENEATH)
    ::open_how how{};
    how.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    o.fd = static_cast<int>(::syscall(SYS_openat2, root, path.c_str(), &how, sizeof how));
    if (o.fd < 0 && errno == ENOSYS)
#endif
        // No openat2 (before 5.6): no symbolic link at all in the last name.
        o.fd = ::openat(root, path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW);
    if (o.fd < 0) {
        o.error = errno;
        return o;
    }
    struct stat st {};
    if (::fstat(o.fd, &st) < 0) {
        o.error = errno;
        ::close(o.fd);
        o.fd = -1;
        return o;
    }
    o.regular = S_ISREG(st.st_mode);
    o.size = static_cast<std::uint64_t>(st.st_size);
    o.modified = std::chrono::system_clock::from_time_t(st.st_mtime);
    return o;
}

/// openat2 beneath the root and a stat: the ring's own requests on io_uring,
/// the pool elsewhere; the pool's open_beneath where openat2 is missing.
task<result<opened>> open_file(int root, std::string path) {
    result<spindle::file> f = co_await spindle::file::open_beneath(root, path, O_RDONLY | O_NOCTTY | O_NONBLOCK);
    if (!f && f.error() == std::errc::function_not_supported) {
        auto open = [root, path] { return open_beneath(root, path); };
        co_return co_await offload(open);
    }
    opened o;
    if (!f) {
        o.error = f.error().value();
        co_return o;
    }
    result<file_status> st = co_await f->stat();
    if (!st) {
        o.error = st.error().value();
        co_return o;
    }
    o.regular = st->is_regular();
    o.size = st->size;
    o.modified = std::chrono::floor<std::chrono::seconds>(st->modified);  // as Last-Modified says it
    o.fd = f->release();
    co_return o;
}

std::string head_of(int status, std::string_view reason, std::uint64_t length, std::string_view type,
                    std::string_view extra, bool keep_alive) {
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) + "\r\nServer: spindle\r\n";
    if (status != 304) h += "Content-Length: " + std::to_string(length) + "\r\n";
    if (!type.empty()) h += "Content-Type: " + std::string(type) + "\r\n";
    if (!keep_alive) h += "Connection: close\r\n";
    h += extra;
    h += "\r\n";
    return h;
}

site_response text(int status, std::string_view reason, std::string_view body, bool keep_alive, bool head_only,
                   std::string_view extra = {}) {
    site_response r;
    r.head = head_of(status, reason, body.size(), "text/plain", extra, keep_alive);
    if (!head_only) r.head += body;
    r.close = !keep_alive;
    return r;
}

}  // namespace

void reserve_for_body(std::string& in, std::size_t max_body) {
    if (in.capacity() > 64 * 1024) return;  // done for this request, or no body to speak of
    std::size_t end = in.find("\r\n\r\n");
    if (end == std::string::npos) return;
    end += 4;
    const std::optional<std::string_view> length = header_value(std::string_view(in).substr(0, end), "Content-Length");
    std::uint64_t n = 0;
    if (!length || std::from_chars(length->data(), length->data() + length->size(), n).ec != std::errc()) return;
    if (n <= max_body) in.reserve(end + static_cast<std::size_t>(n));
}

site_response refuse_request(parse_status status) {
    switch (status) {
        case parse_status::too_large:
            return text(431, "Request Header Fields Too Large", "Header Too Large\n", false, false);
        case parse_status::body_too_large: return text(413, "Content Too Large", "Content Too Large\n", false, false);
        case parse_status::not_implemented: return text(501, "Not Implemented", "Not Implemented\n", false, false);
        case parse_status::version_not_supported:
            return text(505, "HTTP Version Not Supported", "HTTP Version Not Supported\n", false, false);
        default: return text(400, "Bad Request", "Bad Request\n", false, false);
    }
}

task<site_response> answer_site_request(const static_site& site, const parse_result& request, std::string_view head) {
    const bool keep = request.keep_alive;
    if (request.method == "POST") {
        if (request.target.substr(0, request.target.find('?')) != "/sha256")
            co_return text(405, "Method Not Allowed", "Method Not Allowed\n", keep, false, "Allow: GET, HEAD\r\n");
        // CPU work: on the pool, while the loop serves other connections.
        auto hash = [body = request.body] { return sha256_hex(body) + "\n"; };
        result<std::string> digest = co_await offload(hash, {.kind = job_kind::cpu});
        if (!digest) co_return text(503, "Service Unavailable", "Service Unavailable\n", false, false);
        co_return text(200, "OK", *digest, keep, false);
    }
    const bool head_only = request.method == "HEAD";
    if (request.method != "GET" && !head_only)
        co_return text(405, "Method Not Allowed", "Method Not Allowed\n", keep, false, "Allow: GET, HEAD, POST\r\n");
    const std::string_view resource = request.target.substr(0, request.target.find('?'));
    for (const dynamic_route& route : site.dynamic) {
        if (route.path != resource) continue;
        const std::string body = route.render();
        site_response r;
        r.head = head_of(200, "OK", body.size(), route.content_type, {}, keep);
        if (!head_only) r.head += body;
        r.close = !keep;
        co_return r;
    }
    std::optional<std::string> path = file_of_target(request.target);
    if (!path) co_return text(400, "Bad Request", "Bad Request\n", false, head_only);

    result<opened> found = co_await open_file(site.root_fd, *path);
    if (!found) co_return text(503, "Service Unavailable", "Service Unavailable\n", false, head_only);
    if (found->fd < 0) {
        if (found->error == ENOENT || found->error == ENOTDIR || found->error == ENAMETOOLONG)
            co_return text(404, "Not Found", "Not Found\n", keep, head_only);
        // EXDEV: the path leaves the root; ELOOP: a link where none may be.
        co_return text(403, "Forbidden", "Forbidden\n", keep, head_only);
    }
    site_response r;
    r.file.emplace(found->fd);
    if (!found->regular) co_return text(403, "Forbidden", "Forbidden\n", keep, head_only);

    const std::string modified = "Last-Modified: " + http_date(found->modified) + "\r\nAccept-Ranges: bytes\r\n";
    if (std::optional<std::string_view> since = header_value(head, "If-Modified-Since")) {
        if (auto t = parse_http_date(*since); t && found->modified <= *t) {
            r.head = head_of(304, "Not Modified", 0, {}, modified, keep);
            r.file.reset();
            r.close = !keep;
            co_return r;
        }
    }
    const std::string_view type = content_type_of(*path);
    byte_range range;
    switch (parse_range(header_value(head, "Range"), found->size, range)) {
        case range_answer::whole:
            r.head = head_of(200, "OK", found->size, type, modified, keep);
            r.length = found->size;
            break;
        case range_answer::partial:
            r.head =
                head_of(206, "Partial Content", range.length, type,
                        modified + "Content-Range: bytes " + std::to_string(range.first) + "-" +
                            std::to_string(range.first + range.length - 1) + "/" + std::to_string(found->size) + "\r\n",
                        keep);
            r.offset = range.first;
            r.length = range.length;
            break;
        case range_answer::unsatisfiable:
            co_return text(416, "Range Not Satisfiable", "Range Not Satisfiable\n", keep, head_only,
                           "Content-Range: bytes */" + std::to_string(found->size) + "\r\n");
    }
    if (head_only) r.length = 0;
    r.close = !keep;
    if (r.length > 0 && r.length <= inline_limit) {
        // A small file goes out with its head, in one write: a read (the
        // ring's own on io_uring) costs less than sendfile's trip to the pool.
        const std::size_t at = r.head.size();
        r.head.resize(at + static_cast<std::size_t>(r.length));
        auto into = std::as_writable_bytes(std::span<char>(r.head).subspan(at));
        result<std::size_t> n = co_await r.file->read_exactly_at(into, r.offset);
        if (!n || *n != r.length) co_return text(500, "Internal Server Error", "Internal Server Error\n", false, false);
        r.file.reset();
        r.length = 0;
    }
    co_return r;
}

}  // namespace spindle::examples::http
