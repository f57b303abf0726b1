// The example HTTP server's protocol core: request parsing (framing, limits,
// malformed input), response bytes, and pipelined batches.
#include "catch.hpp"

#include "http_protocol.hpp"
#include "static_rules.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

using namespace std::string_literals;
using spindle::examples::http::append_response;
using spindle::examples::http::batch_result;
using spindle::examples::http::handle_batch;
using spindle::examples::http::output_buffer;
using spindle::examples::http::parse_limits;
using spindle::examples::http::parse_request;
using spindle::examples::http::parse_result;
using spindle::examples::http::parse_status;
using spindle::examples::http::response_options;

namespace {

const std::string ok_response =
    "HTTP/1.1 200 OK\r\nServer: spindle\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n\r\nHello, World!";
const std::string ok_close_response =
    "HTTP/1.1 200 OK\r\nServer: spindle\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n"
    "Connection: close\r\n\r\nHello, World!";
const std::string ok_head_response =
    "HTTP/1.1 200 OK\r\nServer: spindle\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n\r\n";
const std::string not_found_response =
    "HTTP/1.1 404 Not Found\r\nServer: spindle\r\nContent-Length: 9\r\nContent-Type: text/plain\r\n\r\nNot Found";
const std::string not_allowed_response =
    "HTTP/1.1 405 Method Not Allowed\r\nServer: spindle\r\nContent-Length: 18\r\nContent-Type: text/plain\r\n"
    "Allow: GET, HEAD\r\n\r\nMethod Not Allowed";
const std::string bad_request_response =
    "HTTP/1.1 400 Bad Request\r\nServer: spindle\r\nContent-Length: 11\r\nContent-Type: text/plain\r\n"
    "Connection: close\r\n\r\nBad Request";

const std::string get_root = "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n";

/// Runs handle_batch on `input` with a fresh buffer and returns what it wrote.
std::string answer(std::string_view input, batch_result* batch = nullptr, const parse_limits& limits = {}) {
    output_buffer out;
    const batch_result result = handle_batch(input, out, limits);
    if (batch != nullptr) *batch = result;
    return std::string(out.view());
}

/// `text` in a heap block of exactly its size, so that a sanitizer sees any
/// read past its end (a std::string has slack and a terminator after it).
std::unique_ptr<char[]> exact_copy(std::string_view text) {
    auto copy = std::make_unique<char[]>(text.size());
    std::copy(text.begin(), text.end(), copy.get());
    return copy;
}

/// A request whose head is exactly `size` bytes, padded in one header value.
std::string head_of_size(std::size_t size, std::string_view terminator = "\r\n\r\n") {
    const std::string prefix = "GET / HTTP/1.1\r\nHost: a\r\nX-Pad: ";
    return prefix + std::string(size - prefix.size() - terminator.size(), 'p') + std::string(terminator);
}

}  // namespace

TEST_CASE("http: parse_request reads a simple GET, with views into the input", "[http]") {
    const std::string input = "GET /index.html?q=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: test\r\n\r\n";
    const parse_result r = parse_request(input);
    REQUIRE(r.status == parse_status::complete);
    REQUIRE(r.consumed == input.size());
    REQUIRE(r.method == "GET");
    REQUIRE(r.target == "/index.html?q=1");
    REQUIRE(r.version_minor == 1);
    REQUIRE(r.keep_alive);
    REQUIRE_FALSE(r.content_length.has_value());
    REQUIRE(r.body.empty());
    REQUIRE(r.method.data() == input.data());
    REQUIRE(r.target.data() == input.data() + 4);
}

TEST_CASE("http: parse_request consumes one request and leaves the next", "[http]") {
    const std::string input = get_root + "GET /b HTTP/1.1\r\nHost: x\r\n\r\n";
    const parse_result first = parse_request(input);
    REQUIRE(first.status == parse_status::complete);
    REQUIRE(first.consumed == get_root.size());
    const parse_result second = parse_request(std::string_view(input).substr(first.consumed));
    REQUIRE(second.status == parse_status::complete);
    REQUIRE(second.target == "/b");
    REQUIRE(second.consumed == input.size() - get_root.size());
}

TEST_CASE("http: every proper prefix of a valid request is incomplete", "[http]") {
    const std::vector<std::string> requests = {
        get_root,
        "POST /submit HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
        "GET / HTTP/1.1\nHost: a\n\n",
        "\r\n\r\nGET / HTTP/1.0\r\n\r\n",
        "HEAD /x HTTP/1.0\r\nConnection: keep-alive\r\nX-Empty:\r\n\r\n",
        // Long enough for the eight-bytes-at-a-time scan to meet the end of the input.
        "GET /a/longer/path/than/a/word?q=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: longer than a word\r\n\r\n",
    };
    for (const std::string& request : requests) {
        INFO(request);
        for (std::size_t n = 0; n < request.size(); ++n) {
            INFO("prefix of " << n << " bytes");
            const auto prefix = exact_copy(std::string_view(request).substr(0, n));
            const parse_result r = parse_request(std::string_view(prefix.get(), n));
            REQUIRE(r.status == parse_status::incomplete);
            REQUIRE(r.consumed == 0);
            REQUIRE(r.method.empty());
        }
        const auto whole = exact_copy(request);
        const parse_result r = parse_request(std::string_view(whole.get(), request.size()));
        REQUIRE(r.status == parse_status::complete);
        REQUIRE(r.consumed == request.size());
    }
}

TEST_CASE("http: handle_batch answers pipelined requests with one output", "[http]") {
    const std::string missing = "GET /missing HTTP/1.1\r\nHost: a\r\n\r\n";
    const std::string input = get_root + missing + "HEAD / HTTP/1.1\r\nHost: a\r\n\r\n";
    const std::string expected = ok_response + not_found_response + ok_head_response;

    SECTION("all in one buffer") {
        batch_result batch;
        REQUIRE(answer(input, &batch) == expected);
        REQUIRE(batch.consumed == input.size());
        REQUIRE(batch.responses == 3);
        REQUIRE_FALSE(batch.close);
    }

    SECTION("fed one byte at a time") {
        std::string buffered;
        output_buffer out;
        std::vector<std::size_t> completed_at;
        for (std::size_t i = 0; i < input.size(); ++i) {
            buffered.push_back(input[i]);
            const batch_result batch = handle_batch(buffered, out);
            REQUIRE_FALSE(batch.close);
            if (batch.responses > 0) {
                REQUIRE(batch.responses == 1);
                REQUIRE(batch.consumed == buffered.size());
                completed_at.push_back(i + 1);
            } else {
                REQUIRE(batch.consumed == 0);
            }
            buffered.erase(0, batch.consumed);
        }
        REQUIRE(buffered.empty());
        REQUIRE(out.view() == expected);
        REQUIRE(completed_at ==
                std::vector<std::size_t>{get_root.size(), get_root.size() + missing.size(), input.size()});
    }

    SECTION("an incomplete tail is left for the next read") {
        const std::string partial = "GET / HTTP/1.1\r\nHo";
        batch_result batch;
        REQUIRE(answer(get_root + get_root + partial, &batch) == ok_response + ok_response);
        REQUIRE(batch.consumed == 2 * get_root.size());
        REQUIRE(batch.responses == 2);
        REQUIRE_FALSE(batch.close);
    }

    SECTION("empty input writes nothing") {
        batch_result batch;
        REQUIRE(answer("", &batch).empty());
        REQUIRE(batch.consumed == 0);
        REQUIRE(batch.responses == 0);
        REQUIRE_FALSE(batch.close);
    }
}

TEST_CASE("http: keep-alive follows the version and the Connection options", "[http]") {
    struct row {
        std::string headers;
        int minor;
        bool keep_alive;
    };
    const std::vector<row> rows = {
        {"GET / HTTP/1.1\r\nHost: a\r\n", 1, true},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n", 1, false},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: Close\r\n", 1, false},
        {"GET / HTTP/1.1\r\nHost: a\r\nconnection:close\r\n", 1, false},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n", 1, true},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, close\r\n", 1, false},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: closed, xclose\r\n", 1, true},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nConnection: close\r\n", 1, false},
        {"GET / HTTP/1.0\r\n", 0, false},
        {"GET / HTTP/1.0\r\nConnection: keep-alive\r\n", 0, true},
        {"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n", 0, true},
        {"GET / HTTP/1.0\r\nConnection: foo , keep-alive\r\n", 0, true},
        {"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n", 0, false},
        {"GET / HTTP/1.0\r\nKeep-Alive: timeout=5\r\n", 0, false},
    };
    for (const row& each : rows) {
        const std::string input = each.headers + "\r\n";
        INFO(input);
        const parse_result r = parse_request(input);
        REQUIRE(r.status == parse_status::complete);
        REQUIRE(r.version_minor == each.minor);
        REQUIRE(r.keep_alive == each.keep_alive);
    }
}

TEST_CASE("http: malformed requests are bad_request and answered with 400 and a close", "[http]") {
    const std::vector<std::string> inputs = {
        "garbage\r\n\r\n",
        "GET /\r\nHost: a\r\n\r\n",
        "GET / \r\nHost: a\r\n\r\n",
        "GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /  HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET  HTTP/1.1\r\nHost: a\r\n\r\n",
        " GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET / HTTP/1.1 \r\nHost: a\r\n\r\n",
        "GET /a b HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET / http/1.1\r\nHost: a\r\n\r\n",
        "GET / HTTP/1.10\r\nHost: a\r\n\r\n",
        "GET / HTTP/1\r\nHost: a\r\n\r\n",
        "GET / HTTP/1.x\r\nHost: a\r\n\r\n",
        "GET / HTTP/11\r\nHost: a\r\n\r\n",
        "G(T / HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /a\x01z HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /a\x7f HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /\r HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET / HTTP/1.1\r\r\nHost: a\r\n\r\n",
        "GET / HTTP/1.1\r\nHost a\r\n\r\n",
        "GET / HTTP/1.1\r\nHost : a\r\n\r\n",
        "GET / HTTP/1.1\r\nHost\t: a\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\n: empty name\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nX(y): 1\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n folded\r\n\r\n",
        "GET / HTTP/1.1\r\n Host: a\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n"s,
        "GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nX: a\x1b\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 2\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5,\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\nhello!",
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 100000000000000000000\r\n"
        "Content-Length: 100000000000000000001\r\n\r\n",
        "GET / HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        "GET / HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n",
    };
    for (const std::string& input : inputs) {
        INFO(input);
        const parse_result r = parse_request(input);
        REQUIRE(r.status == parse_status::bad_request);
        REQUIRE(r.consumed == 0);
        REQUIRE(r.method.empty());
        batch_result batch;
        REQUIRE(answer(input, &batch) == bad_request_response);
        REQUIRE(batch.consumed == 0);
        REQUIRE(batch.responses == 1);
        REQUIRE(batch.close);
    }
}

TEST_CASE("http: a malformed request is refused at the first byte that shows it", "[http]") {
    REQUIRE(parse_request("\x16\x03\x01\x02\x00"s).status == parse_status::bad_request);
    REQUIRE(parse_request("GE(").status == parse_status::bad_request);
    REQUIRE(parse_request("GET\r").status == parse_status::bad_request);
    REQUIRE(parse_request("\rX").status == parse_status::bad_request);
    REQUIRE(parse_request("GET /\x01").status == parse_status::bad_request);
    REQUIRE(parse_request("GET / HTTP/1.1\r\nHo st").status == parse_status::bad_request);
    REQUIRE(parse_request("GET / HTTP/1.1\r\nHost: a\x01").status == parse_status::bad_request);
    REQUIRE(parse_request("GET / HTTP/1.1\r\nHost: a\rb").status == parse_status::bad_request);

    REQUIRE(parse_request("").status == parse_status::incomplete);
    REQUIRE(parse_request("\r").status == parse_status::incomplete);
    REQUIRE(parse_request("\r\n\r").status == parse_status::incomplete);
    REQUIRE(parse_request("GET").status == parse_status::incomplete);
    // The version is judged whole.
    REQUIRE(parse_request("GET / XTTP/1").status == parse_status::incomplete);
    REQUIRE(parse_request("GET / XTTP/1.1").status == parse_status::bad_request);
}

TEST_CASE("http: every byte of a long target or value is checked", "[http]") {
    // Long enough that most bytes are checked eight at a time; moving the
    // odd byte through every position puts it in every lane of a word.
    const std::string plain(45, 'v');
    for (std::size_t at = 0; at < plain.size(); ++at) {
        INFO("byte " << at);
        for (const char bad : {'\0', '\x01', '\x08', '\x0b', '\x1f', '\x7f', '\r'}) {
            std::string value = plain;
            value[at] = bad;
            INFO("value byte " << static_cast<int>(static_cast<unsigned char>(bad)));
            REQUIRE(parse_request("GET / HTTP/1.1\r\nHost: a\r\nX: " + value + "\r\n\r\n").status ==
                    parse_status::bad_request);
        }
        for (const char good : {'\t', ' ', '!', '~', '\x80', '\xff'}) {
            std::string value = plain;
            value[at] = good;
            const std::string input = "GET / HTTP/1.1\r\nHost: a\r\nX: " + value + "\r\n\r\n";
            REQUIRE(parse_request(input).consumed == input.size());
        }
        for (const char bad : {'\0', '\x01', '\t', '\n', '\r', '\x1f', ' ', '\x7f'}) {
            std::string target = "/" + plain;
            target[at + 1] = bad;
            INFO("target byte " << static_cast<int>(static_cast<unsigned char>(bad)));
            REQUIRE(parse_request("GET " + target + " HTTP/1.1\r\nHost: a\r\n\r\n").status ==
                    parse_status::bad_request);
        }
        for (const char good : {'!', '%', '~', '\x80', '\xff'}) {
            std::string target = "/" + plain;
            target[at + 1] = good;
            const std::string input = "GET " + target + " HTTP/1.1\r\nHost: a\r\n\r\n";
            const parse_result r = parse_request(input);
            REQUIRE(r.status == parse_status::complete);
            REQUIRE(r.target == target);
        }
    }
}

TEST_CASE("http: HTTP versions", "[http]") {
    SECTION("1.0 and 1.1 are read, later 1.x minors as 1.1") {
        REQUIRE(parse_request("GET / HTTP/1.0\r\n\r\n").version_minor == 0);
        REQUIRE(parse_request(get_root).version_minor == 1);
        const parse_result r = parse_request("GET / HTTP/1.2\r\nHost: a\r\n\r\n");
        REQUIRE(r.status == parse_status::complete);
        REQUIRE(r.version_minor == 1);
        REQUIRE(r.keep_alive);
    }
    SECTION("other major versions are not supported") {
        for (const char* input : {"GET / HTTP/9.9\r\nHost: a\r\n\r\n", "GET / HTTP/2.0\r\nHost: a\r\n\r\n",
                                  "GET / HTTP/0.9\r\n\r\n", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"}) {
            INFO(input);
            REQUIRE(parse_request(input).status == parse_status::version_not_supported);
        }
        // Known from the request line alone.
        REQUIRE(parse_request("GET / HTTP/9.9\r\n").status == parse_status::version_not_supported);
        batch_result batch;
        REQUIRE(answer("GET / HTTP/9.9\r\nHost: a\r\n\r\n", &batch) ==
                "HTTP/1.1 505 HTTP Version Not Supported\r\nServer: spindle\r\nContent-Length: 26\r\n"
                "Content-Type: text/plain\r\nConnection: close\r\n\r\nHTTP Version Not Supported");
        REQUIRE(batch.close);
        REQUIRE(batch.consumed == 0);
    }
    SECTION("HTTP/1.0 needs no Host") {
        REQUIRE(parse_request("GET / HTTP/1.0\r\n\r\n").status == parse_status::complete);
        REQUIRE(parse_request("GET / HTTP/1.1\r\nHost:\r\n\r\n").status == parse_status::complete);
    }
}

TEST_CASE("http: lines may end in CRLF or in a bare LF", "[http]") {
    SECTION("bare LF throughout") {
        const std::string input = "GET /lf HTTP/1.1\nHost: a\nConnection: close\n\n";
        const parse_result r = parse_request(input);
        REQUIRE(r.status == parse_status::complete);
        REQUIRE(r.consumed == input.size());
        REQUIRE(r.target == "/lf");
        REQUIRE_FALSE(r.keep_alive);
    }
    SECTION("mixed terminators") {
        const std::string input = "GET / HTTP/1.1\r\nHost: a\nX: 1\r\n\n";
        const parse_result r = parse_request(input);
        REQUIRE(r.status == parse_status::complete);
        REQUIRE(r.consumed == input.size());
    }
    SECTION("empty lines before a request are skipped and consumed") {
        const std::string input = "\r\n\n\r\n" + get_root;
        const parse_result r = parse_request(input);
        REQUIRE(r.status == parse_status::complete);
        REQUIRE(r.consumed == input.size());
        REQUIRE(r.method.data() == input.data() + 5);
    }
    SECTION("a CRLF after a body does not break the next pipelined request") {
        const std::string input = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi\r\n" + get_root;
        batch_result batch;
        REQUIRE(answer(input, &batch) == not_allowed_response + ok_response);
        REQUIRE(batch.consumed == input.size());
        REQUIRE(batch.responses == 2);
    }
}

TEST_CASE("http: request bodies are framed by Content-Length", "[http]") {
    const std::string head = "POST /form HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n";

    SECTION("the body is part of the request") {
        const std::string input = head + "helloGET";
        const parse_result r = parse_request(input);
        REQUIRE(r.status == parse_status::complete);
        REQUIRE(r.consumed == head.size() + 5);
        REQUIRE(r.content_length == std::optional<std::uint64_t>(5));
        REQUIRE(r.body == "hello");
        REQUIRE(r.body.data() == input.data() + head.size());
    }
    SECTION("a partly buffered body is incomplete") {
        for (std::size_t n = 0; n < 5; ++n) {
            REQUIRE(parse_request(head + std::string(n, 'x')).status == parse_status::incomplete);
        }
    }
    SECTION("agreeing repeats are accepted") {
        for (const char* field : {"Content-Length: 5\r\ncontent-length: 5\r\n", "Content-Length: 5, 5\r\n",
                                  "CONTENT-LENGTH: 005\r\nContent-Length:5\r\n"}) {
            INFO(field);
            const std::string input = "POST / HTTP/1.1\r\nHost: a\r\n"s + field + "\r\nhello";
            const parse_result r = parse_request(input);
            REQUIRE(r.status == parse_status::complete);
            REQUIRE(r.content_length == std::optional<std::uint64_t>(5));
            REQUIRE(r.body == "hello");
        }
    }
    SECTION("zero") {
        const parse_result r = parse_request("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
        REQUIRE(r.status == parse_status::complete);
        REQUIRE(r.content_length == std::optional<std::uint64_t>(0));
        REQUIRE(r.body.empty());
    }
    SECTION("the body limit") {
        const parse_limits limits{.max_head = 8192, .max_body = 10};
        const std::string at_limit = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n0123456789";
        REQUIRE(parse_request(at_limit, limits).status == parse_status::complete);

        // Refused from the head alone, with the body not yet sent.
        const parse_result over = parse_request("POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n", limits);
        REQUIRE(over.status == parse_status::body_too_large);
        REQUIRE(over.consumed == 0);
        REQUIRE(over.method == "POST");
        REQUIRE(over.target == "/up");
        REQUIRE(over.content_length == std::optional<std::uint64_t>(11));
        REQUIRE_FALSE(over.keep_alive);

        REQUIRE(parse_request("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1048576\r\n\r\n").status ==
                parse_status::incomplete);
        REQUIRE(parse_request("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1048577\r\n\r\n").status ==
                parse_status::body_too_large);
    }
    SECTION("a length beyond 64 bits is too large, not malformed") {
        const parse_result r =
            parse_request("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n");
        REQUIRE(r.status == parse_status::body_too_large);
        REQUIRE(r.content_length == std::optional<std::uint64_t>(std::numeric_limits<std::uint64_t>::max()));
    }
    SECTION("413 and a close") {
        batch_result batch;
        REQUIRE(answer("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2000000\r\n\r\n", &batch) ==
                "HTTP/1.1 413 Content Too Large\r\nServer: spindle\r\nContent-Length: 17\r\n"
                "Content-Type: text/plain\r\nConnection: close\r\n\r\nContent Too Large");
        REQUIRE(batch.close);
        REQUIRE(batch.consumed == 0);
        // HEAD gets the headers alone, even for an error.
        REQUIRE(answer("HEAD / HTTP/1.1\r\nHost: a\r\nContent-Length: 2000000\r\n\r\n") ==
                "HTTP/1.1 413 Content Too Large\r\nServer: spindle\r\nContent-Length: 17\r\n"
                "Content-Type: text/plain\r\nConnection: close\r\n\r\n");
    }
}

TEST_CASE("http: Transfer-Encoding is not implemented", "[http]") {
    for (const char* field : {"Transfer-Encoding: chunked\r\n", "transfer-encoding: gzip, chunked\r\n",
                              "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"}) {
        const std::string input = "POST / HTTP/1.1\r\nHost: a\r\n"s + field + "\r\n5\r\nhello\r\n0\r\n\r\n";
        INFO(input);
        REQUIRE(parse_request(input).status == parse_status::not_implemented);
        batch_result batch;
        REQUIRE(answer(input, &batch) ==
                "HTTP/1.1 501 Not Implemented\r\nServer: spindle\r\nContent-Length: 15\r\n"
                "Content-Type: text/plain\r\nConnection: close\r\n\r\nNot Implemented");
        REQUIRE(batch.close);
    }
}

TEST_CASE("http: the head size limit", "[http]") {
    SECTION("a head of exactly max_head bytes is accepted") {
        const std::string input = head_of_size(8192);
        REQUIRE(input.size() == 8192);
        const parse_result r = parse_request(input);
        REQUIRE(r.status == parse_status::complete);
        REQUIRE(r.consumed == 8192);
        // Bytes after it belong to the next request and do not count.
        REQUIRE(parse_request(input + get_root).consumed == 8192);
        // The same with a bare LF ending the head on the last allowed byte.
        REQUIRE(parse_request(head_of_size(8192, "\r\n\n")).status == parse_status::complete);
    }
    SECTION("a complete head one byte longer is too large") {
        // In both, the final LF is the first byte past the limit.
        REQUIRE(parse_request(head_of_size(8193)).status == parse_status::too_large);
        REQUIRE(parse_request(head_of_size(8193, "\r\n\n")).status == parse_status::too_large);
    }
    SECTION("no terminator within max_head bytes") {
        const std::string open = "GET / HTTP/1.1\r\nHost: a\r\nX-Pad: ";
        const auto padded = [&](std::size_t size) { return open + std::string(size - open.size(), 'p'); };
        REQUIRE(parse_request(padded(8193)).status == parse_status::too_large);
        // Nothing that follows can end a head within the limit any more.
        REQUIRE(parse_request(padded(8192)).status == parse_status::too_large);
        REQUIRE(parse_request(padded(8191)).status == parse_status::incomplete);
        REQUIRE(parse_request(padded(8191) + "\r").status == parse_status::too_large);
        // A request line alone, never ended.
        REQUIRE(parse_request("GET /" + std::string(8188, 'a')).status == parse_status::too_large);
        // Empty lines before the request line count too.
        std::string blank_lines;
        for (int i = 0; i < 4096; ++i) blank_lines += "\r\n";
        REQUIRE(parse_request(blank_lines).status == parse_status::too_large);
        REQUIRE(parse_request(blank_lines.substr(2)).status == parse_status::incomplete);
    }
    SECTION("a smaller limit from the caller") {
        const parse_limits limits{.max_head = 40};
        REQUIRE(parse_request(head_of_size(40), limits).status == parse_status::complete);
        REQUIRE(parse_request(head_of_size(41), limits).status == parse_status::too_large);
        REQUIRE(parse_request(get_root, parse_limits{.max_head = 0}).status == parse_status::too_large);
        batch_result batch;
        REQUIRE(answer(get_root + head_of_size(41), &batch, limits) ==
                ok_response +
                    "HTTP/1.1 431 Request Header Fields Too Large\r\nServer: spindle\r\nContent-Length: 31\r\n"
                    "Content-Type: text/plain\r\nConnection: close\r\n\r\nRequest Header Fields Too Large");
        REQUIRE(batch.consumed == get_root.size());
    }
    SECTION("431 and a close") {
        batch_result batch;
        REQUIRE(answer(get_root + head_of_size(9000), &batch) ==
                ok_response +
                    "HTTP/1.1 431 Request Header Fields Too Large\r\nServer: spindle\r\nContent-Length: 31\r\n"
                    "Content-Type: text/plain\r\nConnection: close\r\n\r\nRequest Header Fields Too Large");
        REQUIRE(batch.consumed == get_root.size());
        REQUIRE(batch.responses == 2);
        REQUIRE(batch.close);
    }
}

TEST_CASE("http: responses to GET, HEAD, other paths and other methods", "[http]") {
    SECTION("GET / is 200 Hello, World!") {
        REQUIRE(answer(get_root) == ok_response);
        REQUIRE(answer("GET /?name=x HTTP/1.1\r\nHost: a\r\n\r\n") == ok_response);
    }
    SECTION("HEAD / has GET's headers and no body") {
        REQUIRE(answer("HEAD / HTTP/1.1\r\nHost: a\r\n\r\n") == ok_head_response);
        REQUIRE(answer("HEAD /nope HTTP/1.1\r\nHost: a\r\n\r\n") ==
                "HTTP/1.1 404 Not Found\r\nServer: spindle\r\nContent-Length: 9\r\nContent-Type: text/plain\r\n\r\n");
    }
    SECTION("other paths are 404") {
        REQUIRE(answer("GET /index.html HTTP/1.1\r\nHost: a\r\n\r\n") == not_found_response);
        REQUIRE(answer("GET // HTTP/1.1\r\nHost: a\r\n\r\n") == not_found_response);
        REQUIRE(answer("GET * HTTP/1.1\r\nHost: a\r\n\r\n") == not_found_response);
    }
    SECTION("other methods are 405 with Allow, and their bodies are skipped") {
        REQUIRE(answer("DELETE / HTTP/1.1\r\nHost: a\r\n\r\n") == not_allowed_response);
        // Methods are case-sensitive.
        REQUIRE(answer("get / HTTP/1.1\r\nHost: a\r\n\r\n") == not_allowed_response);
        const std::string post = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nGET / HTTP/";
        batch_result batch;
        REQUIRE(answer(post + get_root, &batch) == not_allowed_response + ok_response);
        REQUIRE(batch.consumed == post.size() + get_root.size());
        REQUIRE(batch.responses == 2);
    }
    SECTION("the connection options in the response") {
        REQUIRE(answer("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n") == ok_close_response);
        REQUIRE(answer("GET / HTTP/1.0\r\n\r\n") == ok_close_response);
        REQUIRE(answer("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n") ==
                "HTTP/1.1 200 OK\r\nServer: spindle\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n"
                "Connection: keep-alive\r\n\r\nHello, World!");
    }
}

TEST_CASE("http: append_response writes the status line, framing and body", "[http]") {
    output_buffer out;
    append_response(out, 200, "OK", "Hello, World!", true);
    REQUIRE(out.view() == ok_response);

    out.clear();
    response_options options;
    options.content_type = "application/json";
    options.extra_headers = "X-A: 1\r\nX-B: 2\r\n";
    const std::string body(123456, 'b');
    append_response(out, 201, "Created", body, false, options);
    REQUIRE(out.view() ==
            "HTTP/1.1 201 Created\r\nServer: spindle\r\nContent-Length: 123456\r\nContent-Type: application/json\r\n"
            "Connection: close\r\nX-A: 1\r\nX-B: 2\r\n\r\n" +
                body);

    out.clear();
    options = {};
    options.head_only = true;
    append_response(out, 204, "No Content", "", true, options);
    REQUIRE(out.view() ==
            "HTTP/1.1 204 No Content\r\nServer: spindle\r\nContent-Length: 0\r\nContent-Type: text/plain\r\n\r\n");
}

TEST_CASE("http: handle_batch stops after a close and after an error", "[http]") {
    SECTION("a request asking to close ends the batch") {
        const std::string closing = "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
        batch_result batch;
        REQUIRE(answer(get_root + closing + get_root, &batch) == ok_response + ok_close_response);
        REQUIRE(batch.consumed == get_root.size() + closing.size());
        REQUIRE(batch.responses == 2);
        REQUIRE(batch.close);
    }
    SECTION("requests before a bad one are answered, then 400") {
        batch_result batch;
        REQUIRE(answer(get_root + get_root + "BAD\r\n\r\n" + get_root, &batch) ==
                ok_response + ok_response + bad_request_response);
        REQUIRE(batch.consumed == 2 * get_root.size());
        REQUIRE(batch.responses == 3);
        REQUIRE(batch.close);
    }
    SECTION("a bad line is refused before the head is complete") {
        batch_result batch;
        REQUIRE(answer(get_root + "GET / HTTP/1.1\r\nNo colon\r\n", &batch) == ok_response + bad_request_response);
        REQUIRE(batch.consumed == get_root.size());
        REQUIRE(batch.close);
    }
}

TEST_CASE("http: output_buffer is reused without reallocating", "[http]") {
    const std::string input = get_root + get_root + "GET /x HTTP/1.1\r\nHost: a\r\n\r\n";
    output_buffer out;
    REQUIRE(handle_batch(input, out).responses == 3);
    const std::string first(out.view());
    const std::size_t capacity = out.capacity();
    const char* storage = out.view().data();

    for (int round = 0; round < 3; ++round) {
        out.clear();
        REQUIRE(out.empty());
        REQUIRE(out.capacity() == capacity);
        REQUIRE(handle_batch(input, out).responses == 3);
        REQUIRE(out.view() == first);
        REQUIRE(out.view().data() == storage);
    }

    REQUIRE(out.bytes().size() == out.size());
    REQUIRE(static_cast<const void*>(out.bytes().data()) == static_cast<const void*>(storage));

    output_buffer digits(64);
    REQUIRE(digits.capacity() >= 64);
    digits.append_decimal(0);
    digits.append(" ");
    digits.append_decimal(std::numeric_limits<std::uint64_t>::max());
    REQUIRE(digits.view() == "0 18446744073709551615");
}

TEST_CASE("http: GET /bytes/N answers N bytes of the alphabet, up to 1 MiB; beyond, or not a number, 404", "[http]") {
    const std::string small = answer("GET /bytes/30 HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(small.find("Content-Length: 30\r\n") != std::string::npos);
    CHECK(small.ends_with("\r\n\r\nabcdefghijklmnopqrstuvwxyzabcd"));
    const std::string big = answer("GET /bytes/1048576 HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(big.find("Content-Length: 1048576\r\n") != std::string::npos);
    CHECK(answer("GET /bytes/0 HTTP/1.1\r\nHost: a\r\n\r\n").find("Content-Length: 0\r\n") != std::string::npos);
    for (const char* path : {"/bytes/1048577", "/bytes/", "/bytes/12a", "/bytes/99999999"})
        CHECK(answer("GET "s + path + " HTTP/1.1\r\nHost: a\r\n\r\n").starts_with("HTTP/1.1 404 "));
}

TEST_CASE("http: a dynamic route is rendered per request, before the built-in pages, which can be turned off", "[http]") {
    using spindle::examples::http::dynamic_route;
    using spindle::examples::http::route_table;
    int renders = 0;
    const dynamic_route routes[] = {
        {"/metrics", "text/plain; version=0.0.4", [&] { return "n " + std::to_string(++renders) + "\n"; }},
        // A dynamic route wins over a built-in page of the same path.
        {"/", "text/html", [] { return std::string("<p>mine</p>"); }},
    };
    auto serve = [&](std::string_view input, bool builtin) {
        output_buffer out;
        const batch_result batch = handle_batch(input, out, {}, route_table{builtin, routes});
        CHECK(batch.consumed == input.size());
        return std::string(out.view());
    };

    const std::string two = serve("GET /metrics HTTP/1.1\r\nHost: a\r\n\r\nGET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", true);
    CHECK(two ==
          "HTTP/1.1 200 OK\r\nServer: spindle\r\nContent-Length: 4\r\nContent-Type: text/plain; version=0.0.4\r\n\r\nn 1\n"
          "HTTP/1.1 200 OK\r\nServer: spindle\r\nContent-Length: 4\r\nContent-Type: text/plain; version=0.0.4\r\n\r\nn 2\n");
    // HEAD: rendered for its length, and no body.
    CHECK(serve("HEAD /metrics HTTP/1.1\r\nHost: a\r\n\r\n", true) ==
          "HTTP/1.1 200 OK\r\nServer: spindle\r\nContent-Length: 4\r\nContent-Type: text/plain; version=0.0.4\r\n\r\n");
    CHECK(renders == 3);
    CHECK(serve("GET / HTTP/1.1\r\nHost: a\r\n\r\n", true).ends_with("<p>mine</p>"));
    CHECK(serve("GET /bytes/3 HTTP/1.1\r\nHost: a\r\n\r\n", true).ends_with("\r\n\r\nabc"));
    CHECK(serve("POST /metrics HTTP/1.1\r\nHost: a\r\n\r\n", true).starts_with("HTTP/1.1 405 "));
    CHECK(renders == 3);

    // Without the built-in pages only the dynamic routes answer.
    const dynamic_route only[] = {routes[0]};
    output_buffer out;
    handle_batch("GET /bytes/3 HTTP/1.1\r\nHost: a\r\n\r\nGET /metricsx HTTP/1.1\r\nHost: a\r\n\r\n", out, {}, route_table{false, only});
    CHECK(out.view().starts_with("HTTP/1.1 404 Not Found\r\n"));
    CHECK(out.view().find("HTTP/1.1 404 ", 1) != std::string_view::npos);
    // The default table is the example server's own pages, no dynamic ones.
    CHECK(answer("GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n").starts_with("HTTP/1.1 404 "));
}

// --- the rules of --root (static_rules.hpp) ----------------------------------------------------

namespace rules = spindle::examples::http;

TEST_CASE("static rules: a target names a file beneath the root, or is refused") {
    CHECK(rules::file_of_target("/") == "index.html");
    CHECK(rules::file_of_target("/a/b.txt?x=1") == "a/b.txt");
    CHECK(rules::file_of_target("/docs/") == "docs/index.html");
    CHECK(rules::file_of_target("/with%20space") == "with space");
    for (std::string_view bad : {"", "x", "/..", "/../a", "/a/../b", "/./a", "/a/.", "/%2e%2e/a", "/%2E", "/a%2fb",
                                 "/a%5cb", "/a%00", "/a%0", "/a%g0", "//a", "/a//b"}) {
        INFO(bad);
        CHECK_FALSE(rules::file_of_target(bad));
    }
    CHECK_FALSE(rules::file_of_target(std::string_view("/a\0b", 4)));
}

TEST_CASE("static rules: one byte range, clipped; several or malformed mean the whole file") {
    rules::byte_range r;
    using rules::range_answer;
    CHECK(rules::parse_range(std::nullopt, 10, r) == range_answer::whole);
    CHECK(rules::parse_range("bytes=2-5", 10, r) == range_answer::partial);
    CHECK((r.first == 2 && r.length == 4));
    CHECK(rules::parse_range("bytes=7-", 10, r) == range_answer::partial);
    CHECK((r.first == 7 && r.length == 3));
    CHECK(rules::parse_range("bytes=5-100", 10, r) == range_answer::partial);
    CHECK((r.first == 5 && r.length == 5));
    CHECK(rules::parse_range("bytes=-3", 10, r) == range_answer::partial);
    CHECK((r.first == 7 && r.length == 3));
    CHECK(rules::parse_range("bytes=-30", 10, r) == range_answer::partial);
    CHECK((r.first == 0 && r.length == 10));
    CHECK(rules::parse_range("bytes=10-", 10, r) == range_answer::unsatisfiable);
    CHECK(rules::parse_range("bytes=-0", 10, r) == range_answer::unsatisfiable);
    CHECK(rules::parse_range("bytes=0-", 0, r) == range_answer::unsatisfiable);
    for (std::string_view whole : {"bytes=1-2,4-5", "items=1-2", "bytes=5-2", "bytes=x-", "bytes=1-y", "bytes"}) {
        INFO(whole);
        CHECK(rules::parse_range(whole, 10, r) == range_answer::whole);
    }
}

TEST_CASE("static rules: HTTP dates both ways, header values, content types") {
    using namespace std::chrono;
    const system_clock::time_point t = system_clock::from_time_t(784111777);
    CHECK(rules::http_date(t) == "Sun, 06 Nov 1994 08:49:37 GMT");
    CHECK(rules::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT") == t);
    CHECK_FALSE(rules::parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"));
    CHECK_FALSE(rules::parse_http_date("Sun, 06 Xyz 1994 08:49:37 GMT"));

    const std::string_view head = "GET / HTTP/1.1\r\nHost: x\r\nrange:  bytes=1-2 \r\nX-Empty:\r\n\r\n";
    CHECK(rules::header_value(head, "Range") == "bytes=1-2");
    CHECK(rules::header_value(head, "host") == "x");
    CHECK(rules::header_value(head, "X-Empty") == "");
    CHECK_FALSE(rules::header_value(head, "Cookie"));

    CHECK(rules::content_type_of("a/b.HTML") == "text/html; charset=utf-8");
    CHECK(rules::content_type_of("x.png") == "image/png");
    CHECK(rules::content_type_of("dir.d/file") == "application/octet-stream");
    CHECK(rules::content_type_of("noext") == "application/octet-stream");
}

TEST_CASE("static rules: SHA-256 of the standard vectors") {
    CHECK(rules::sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(rules::sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(rules::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    CHECK(rules::sha256_hex(std::string(1000000, 'a')) ==
          "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}
