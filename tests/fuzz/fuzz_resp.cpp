// libFuzzer target: the example Redis server's protocol core
// (docs/examples/resp/resp_protocol.hpp) on any bytes. Besides what the
// sanitizers catch, it checks what the header promises:
// - request_parser is incremental without changing its answers: fed the
//   bytes in reads of any size, each call given the unconsumed bytes at a
//   new address (as a connection's buffer may move them), it parses the
//   same commands and fails with the same error as when given everything at
//   once;
// - each command run gets exactly one reply, and the replies are well-formed
//   RESP2: what a client sent cannot end a reply line early and smuggle in
//   one of its own.

#include "fuzz_check.hpp"
#include "resp_protocol.hpp"

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace resp = spindle::examples::resp;

namespace {

/// What one parse() said, copied out of the views it gave.
struct outcome {
    resp::parse_status status;
    std::size_t consumed;
    std::string error;
    std::vector<std::string> args;

    bool operator==(const outcome&) const = default;
};

outcome record(const resp::parse_result& r, const resp::request_parser& parser, std::size_t given) {
    outcome o{r.status, r.consumed, std::string(r.error), {}};
    switch (r.status) {
    case resp::parse_status::complete:
        FUZZ_CHECK(r.consumed > 0 && r.consumed <= given);
        FUZZ_CHECK(r.error.empty());
        for (const std::string_view arg : parser.args()) o.args.emplace_back(arg);
        break;
    case resp::parse_status::incomplete:
        FUZZ_CHECK(r.consumed == 0 && r.error.empty() && parser.args().empty());
        break;
    case resp::parse_status::error:
        FUZZ_CHECK(r.consumed == 0 && !r.error.empty() && parser.args().empty());
        FUZZ_CHECK(r.error.find_first_of("\r\n") == std::string_view::npos);
        break;
    }
    return o;
}

/// Parses command after command, each call given all the bytes left, until
/// one is incomplete or an error.
std::vector<outcome> parse_at_once(std::string_view input) {
    resp::request_parser parser;
    std::vector<outcome> outcomes;
    std::size_t pos = 0;
    for (;;) {
        const std::string_view rest = input.substr(pos);
        outcomes.push_back(record(parser.parse(rest), parser, rest.size()));
        if (outcomes.back().status != resp::parse_status::complete) return outcomes;
        pos += outcomes.back().consumed;
    }
}

/// The same, with the bytes arriving in reads of `read_size(offset)` bytes.
/// Every call gets the unconsumed bytes in a new heap block, the last one
/// freed, so a view kept across calls is a use after free.
template <class ReadSize>
std::vector<outcome> parse_in_reads(std::string_view input, ReadSize read_size) {
    resp::request_parser parser;
    std::vector<outcome> outcomes;
    std::size_t pos = 0;
    std::size_t arrived = 0;
    for (;;) {
        arrived = std::min(input.size(), arrived + read_size(arrived));
        for (;;) {
            const std::size_t n = arrived - pos;
            const std::unique_ptr<char[]> moved(new char[n + 1]);
            std::memcpy(moved.get(), input.data() + pos, n);
            const outcome o = record(parser.parse({moved.get(), n}), parser, n);
            if (o.status == resp::parse_status::incomplete && arrived < input.size()) break;
            outcomes.push_back(o);
            if (o.status != resp::parse_status::complete) return outcomes;
            pos += o.consumed;
        }
    }
}

/// Reads one RESP2 reply at `pos` and moves past it; false if the bytes there
/// are not one.
bool read_reply(std::string_view out, std::size_t& pos, int depth = 0) {
    if (pos >= out.size() || depth > 8) return false;
    const std::size_t end = out.find("\r\n", pos);
    if (end == std::string_view::npos) return false;
    const char type = out[pos];
    const std::string_view line = out.substr(pos + 1, end - pos - 1);
    if (line.find_first_of("\r\n") != std::string_view::npos) return false;
    pos = end + 2;
    if (type == '+' || type == '-') return true;
    std::int64_t n = 0;
    const auto [stop, ec] = std::from_chars(line.data(), line.data() + line.size(), n);
    if (ec != std::errc() || stop != line.data() + line.size()) return false;
    switch (type) {
    case ':':
        return true;
    case '$':
        if (n == -1) return true;
        if (n < 0 || out.size() - pos < static_cast<std::size_t>(n) + 2) return false;
        pos += static_cast<std::size_t>(n);
        if (out.substr(pos, 2) != "\r\n") return false;
        pos += 2;
        return true;
    case '*':
        if (n < 0) return false;
        for (std::int64_t i = 0; i < n; ++i) {
            if (!read_reply(out, pos, depth + 1)) return false;
        }
        return true;
    default:
        return false;
    }
}

std::size_t count_replies(std::string_view out) {
    std::size_t replies = 0;
    for (std::size_t pos = 0; pos < out.size(); ++replies) FUZZ_CHECK(read_reply(out, pos));
    return replies;
}

/// Runs the parsed commands one by one, as handle_batch does: one reply each,
/// none after QUIT; then handle_batch itself, which must also answer each
/// command once, plus the protocol error if there is one.
void check_execution(std::string_view input, const std::vector<outcome>& outcomes) {
    resp::store db;
    resp::output_buffer out;
    std::size_t run = 0;
    bool quit = false;
    for (const outcome& o : outcomes) {
        if (o.status != resp::parse_status::complete || o.args.empty()) continue;
        const std::vector<std::string_view> args(o.args.begin(), o.args.end());
        const std::size_t before = out.size();
        const resp::connection_action action = resp::execute(args, db, out);
        FUZZ_CHECK(out.size() > before);
        ++run;
        if (action == resp::connection_action::close) {
            quit = true;
            break;
        }
    }
    FUZZ_CHECK(count_replies(out.view()) == run);

    resp::store batch_db;
    resp::output_buffer batch_out;
    const resp::batch_result batch = resp::handle_batch(input, batch_db, batch_out);
    const bool failed = !quit && outcomes.back().status == resp::parse_status::error;
    FUZZ_CHECK(batch.close == (quit || failed));
    FUZZ_CHECK(count_replies(batch_out.view()) == run + (failed ? 1 : 0));
    FUZZ_CHECK(batch.consumed <= input.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    const std::vector<outcome> at_once = parse_at_once(input);
    // Reads whose sizes the bytes themselves pick, and for short inputs one
    // byte at a time, which splits every line ending and every number.
    FUZZ_CHECK(parse_in_reads(input, [&](std::size_t at) {
                   return at < input.size() ? 1 + static_cast<unsigned char>(input[at]) % 23 : 1;
               }) == at_once);
    if (size <= 256) FUZZ_CHECK(parse_in_reads(input, [](std::size_t) { return 1; }) == at_once);
    check_execution(input, at_once);
    return 0;
}
