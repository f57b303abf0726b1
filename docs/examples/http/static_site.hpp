#pragma once
/// spindle-http --root DIR: static files, and POST /sha256, over any byte
/// stream (a socket, or TLS over one).
///
/// Per request: the file is opened on the offload pool with openat2(2)
/// beneath the root (RESOLVE_BENEATH: no "..", no symbolic link, absolute or
/// not, leaves it), its head written, and its bytes sent with
/// net::send_file (sendfile(2) on the pool for a socket, bounded reads and
/// writes through TLS), so a connection holds one 16 KiB read buffer and a
/// large file streams with bounded memory. POST /sha256 hashes a body of up
/// to 16 MiB on the pool (kind cpu), so the loop serves other connections
/// meanwhile; larger bodies get 413.

#include "http_protocol.hpp"
#include "service.hpp"

#include <spindle/file.hpp>
#include <spindle/net/send_file.hpp>
#include <spindle/offload.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

namespace spindle::examples::http {

struct static_site {
    /// The root, opened once (O_DIRECTORY), for openat2 beneath it.
    int root_fd = -1;
    /// POST /sha256 bodies at most (413 above).
    std::size_t max_body = 16 * 1024 * 1024;
    /// Resources the program makes (GET /metrics), looked at before the files.
    std::span<const dynamic_route> dynamic;
};

/// What to send for one request: the head, then (unless empty) `length`
/// bytes of `file` from `offset`.
struct site_response {
    std::string head;
    std::optional<spindle::file> file;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
    bool close = false;
};

/// The response to one complete request; `head` is its head's bytes.
task<site_response> answer_site_request(const static_site& site, const parse_result& request, std::string_view head);
/// The response to a request parse_request refused (400, 413, 431...).
site_response refuse_request(parse_status status);
/// Room for the whole request in `in` once its head says how long its body
/// is: growing a large buffer by doubling would copy it, and fault in fresh
/// pages, inside one resume.
void reserve_for_body(std::string& in, std::size_t max_body);

template <net::byte_stream Stream>
task<void> serve_site_connection(Stream& stream, const static_site& site, std::stop_token stop) {
    const parse_limits limits{.max_head = 8192, .max_body = site.max_body};
    std::string in;
    std::vector<std::byte> chunk(16 * 1024);
    for (;;) {
        const parse_result request = parse_request(in, limits);
        if (request.status == parse_status::incomplete) {
            reserve_for_body(in, site.max_body);
            result<std::size_t> n = co_await stream.read_some(chunk, stop);
            if (!n || *n == 0) co_return;
            in.append(reinterpret_cast<const char*>(chunk.data()), *n);
            continue;
        }
        site_response response;
        if (request.status == parse_status::complete) {
            const std::string_view head(in.data(), request.consumed - request.body.size());
            response = co_await answer_site_request(site, request, head);
        } else {
            response = refuse_request(request.status);
        }
        const bool close = response.close || request.status != parse_status::complete || !request.keep_alive;
        if (!co_await stream.write_all(std::as_bytes(std::span(response.head)), stop)) co_return;
        if (response.file && response.length > 0) {
            result<std::uint64_t> sent =
                co_await net::send_file(stream, *response.file, response.offset, response.length, stop);
            // A file cut short under us: the length sent was a promise.
            if (!sent || *sent != response.length) co_return;
        }
        if (close) {
            co_await close_gracefully(stream, chunk, stop);
            co_return;
        }
        in.erase(0, request.consumed);
        // A large body's room goes with it: a kept connection holds little.
        // Freeing megabytes hands their pages back to the OS (munmap or
        // madvise, milliseconds on a busy machine): on the pool, not here.
        if (in.capacity() > 1024 * 1024 && in.size() < 16 * 1024) {
            std::string rest(in);  // the next request's first bytes, if any
            auto free_it = [big = std::move(in)]() mutable { std::string().swap(big); };
            (void)co_await offload(std::move(free_it), stop);
            in = std::move(rest);
        }
    }
}

}  // namespace spindle::examples::http
