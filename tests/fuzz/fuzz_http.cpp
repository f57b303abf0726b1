// libFuzzer target: the example HTTP server's protocol core
// (docs/examples/http/http_protocol.hpp) on any bytes, under three sets of
// limits. Besides what the sanitizers catch, it checks what the header
// promises:
// - parse_request is stateless and decides at the first byte that shows the
//   answer: any prefix of the input parses as `incomplete`, or exactly as
//   the whole input does;
// - a complete request's views lie in the input, its body is the
//   Content-Length bytes after a head of at most max_head bytes;
// - handle_batch answers the same bytes with the same responses however they
//   are split into reads, as a connection feeds it.

#include "fuzz_check.hpp"
#include "http_protocol.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace http = spindle::examples::http;

namespace {

/// Whether `part` lies within `whole` (an empty view lies anywhere).
bool inside(std::string_view part, std::string_view whole) {
    const std::less_equal<const char*> le;
    return part.empty() || (le(whole.data(), part.data()) && le(part.data() + part.size(), whole.data() + whole.size()));
}

/// Same contents at the same place.
bool same_view(std::string_view a, std::string_view b) { return a.size() == b.size() && (a.empty() || a.data() == b.data()); }

bool same(const http::parse_result& a, const http::parse_result& b) {
    return a.status == b.status && a.consumed == b.consumed && same_view(a.method, b.method) &&
           same_view(a.target, b.target) && same_view(a.body, b.body) && a.version_minor == b.version_minor &&
           a.keep_alive == b.keep_alive && a.content_length == b.content_length;
}

void check_result(std::string_view input, const http::parse_limits& limits, const http::parse_result& r) {
    switch (r.status) {
    case http::parse_status::complete: {
        FUZZ_CHECK(r.consumed > 0 && r.consumed <= input.size());
        FUZZ_CHECK(r.body.size() <= r.consumed);
        const std::size_t head = r.consumed - r.body.size();
        FUZZ_CHECK(head <= limits.max_head);
        FUZZ_CHECK(r.body.size() <= limits.max_body);
        FUZZ_CHECK(r.body.empty() || r.body.data() == input.data() + head);
        FUZZ_CHECK(r.content_length.value_or(0) == r.body.size());
        FUZZ_CHECK(!r.method.empty() && inside(r.method, input.substr(0, head)));
        FUZZ_CHECK(!r.target.empty() && inside(r.target, input.substr(0, head)));
        FUZZ_CHECK(r.version_minor == 0 || r.version_minor == 1);
        break;
    }
    case http::parse_status::body_too_large:
        FUZZ_CHECK(r.consumed == 0);
        FUZZ_CHECK(r.content_length && *r.content_length > limits.max_body);
        FUZZ_CHECK(!r.keep_alive);
        break;
    case http::parse_status::too_large:
        FUZZ_CHECK(input.size() >= limits.max_head);
        [[fallthrough]];
    case http::parse_status::incomplete:
    case http::parse_status::bad_request:
    case http::parse_status::not_implemented:
    case http::parse_status::version_not_supported:
        FUZZ_CHECK(r.consumed == 0);
        FUZZ_CHECK(r.body.empty());
        break;
    }
}

/// The whole input and a selection of its prefixes: every cut when it is
/// short, else the cuts around the request's end, the limit and line ends.
void check_prefixes(std::string_view input, const http::parse_limits& limits) {
    const http::parse_result whole = http::parse_request(input, limits);
    check_result(input, limits, whole);

    const auto cut = [&](std::size_t size) {
        if (size > input.size()) return;
        const std::string_view prefix = input.substr(0, size);
        const http::parse_result r = http::parse_request(prefix, limits);
        check_result(prefix, limits, r);
        FUZZ_CHECK(r.status == http::parse_status::incomplete || same(r, whole));
    };
    if (input.size() <= 96) {
        for (std::size_t size = 0; size < input.size(); ++size) cut(size);
        return;
    }
    for (const std::size_t near : {whole.consumed, limits.max_head, input.size()}) {
        for (std::size_t d = 0; d <= 2; ++d) {
            if (near >= d) cut(near - d);
            cut(near + d);
        }
    }
    for (std::size_t i = 1; i < 16; ++i) cut(input.size() * i / 16);
    std::size_t lines = 0;
    for (std::size_t at = input.find('\n'); at != std::string_view::npos && lines < 32;
         at = input.find('\n', at + 1), ++lines) {
        cut(at);
        cut(at + 1);
    }
}

/// One handle_batch over everything, then the same bytes fed in reads whose
/// sizes the input picks, the unconsumed bytes kept for the next call.
void check_batches(std::string_view input, const http::parse_limits& limits) {
    http::output_buffer whole_out;
    const http::batch_result whole = http::handle_batch(input, whole_out, limits);
    FUZZ_CHECK(whole.consumed <= input.size());
    FUZZ_CHECK(whole.responses > 0 || whole_out.empty());
    FUZZ_CHECK(whole_out.empty() || whole_out.view().starts_with("HTTP/1.1 "));
    if (!whole.close) {
        FUZZ_CHECK(http::parse_request(input.substr(whole.consumed), limits).status == http::parse_status::incomplete);
    }

    http::output_buffer split_out;
    std::string buffered;
    std::size_t fed = 0;
    std::size_t responses = 0;
    bool closed = false;
    while (fed < input.size() && !closed) {
        const std::size_t n = std::min<std::size_t>(input.size() - fed, 1 + static_cast<unsigned char>(input[fed]) % 61);
        buffered.append(input.substr(fed, n));
        fed += n;
        const http::batch_result batch = http::handle_batch(buffered, split_out, limits);
        FUZZ_CHECK(batch.consumed <= buffered.size());
        buffered.erase(0, batch.consumed);
        responses += batch.responses;
        closed = batch.close;
    }
    FUZZ_CHECK(closed == whole.close);
    FUZZ_CHECK(responses == whole.responses);
    FUZZ_CHECK(split_out.view() == whole_out.view());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    // The defaults, limits a short input reaches, and limits that move with
    // the input's length so that every boundary gets crossed somewhere.
    const http::parse_limits limits[] = {
        {},
        {.max_head = 64, .max_body = 16},
        {.max_head = 1 + size / 2, .max_body = size / 4},
    };
    for (const http::parse_limits& each : limits) {
        check_prefixes(input, each);
        check_batches(input, each);
    }
    return 0;
}
