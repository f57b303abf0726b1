// libFuzzer target: basic_buffered_reader (spindle/net/buffered_reader.hpp)
// over a stream whose every read the input scripts: how many bytes arrive,
// whether they arrive in a later tick, a failed read, end of stream. The
// input also picks the reader's capacity and a sequence of calls (read_until
// with various delimiters and limits, read_exact, fill, consume), and a model
// of the byte stream checks each answer:
// - every byte comes out once and in order, whichever call hands it over;
// - buffered() is exactly what arrived and was not handed over;
// - read_until returns through the first delimiter and never more than its
//   limit; line_too_long only when the limit's worth of bytes is buffered
//   with no delimiter ending inside it; end_of_stream only at the end with
//   no such delimiter buffered; the stream's own errors come through as
//   they are;
// - the reader never asks the stream for zero bytes (which would read as
//   end of stream).
//
// The loop is made once; each input runs as one task on it and must leave
// no task behind.

#include "fuzz_check.hpp"

#include <spindle/loop.hpp>
#include <spindle/net/buffered_reader.hpp>
#include <spindle/net/detail/awaitable.hpp>
#include <spindle/net/error.hpp>
#include <spindle/result.hpp>
#include <spindle/sleep.hpp>
#include <spindle/task.hpp>

#include <fuzzer/FuzzedDataProvider.h>

#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace net = spindle::net;
using spindle::result;
using spindle::task;

namespace {

std::string_view text_of(std::span<const std::byte> bytes) {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

/// A byte stream that hands out `payload`, each read as the script says.
class scripted_stream {
public:
    scripted_stream(std::string_view payload, FuzzedDataProvider& script) : m_payload(payload), m_script(&script) {}

    task<result<std::size_t>> read_some(std::span<std::byte> buf, std::stop_token = {}) {
        // Zero bytes would be taken for the end of the stream.
        FUZZ_CHECK(!buf.empty());
        // One byte of script per read; once the script has run out, reads
        // take one byte at a time, at once, without errors.
        const auto step = m_script->ConsumeIntegral<std::uint8_t>();
        if (step & 0x80) co_await spindle::yield();
        const unsigned pick = step & 0x7f;
        if (pick == 0x7f || pick == 0x7e) {
            m_last_error = pick == 0x7f ? std::make_error_code(std::errc::connection_reset)
                                        : std::make_error_code(std::errc::operation_canceled);
            co_return m_last_error;
        }
        const std::size_t n = std::min({buf.size(), std::size_t{pick} + 1, m_payload.size() - m_delivered});
        std::memcpy(buf.data(), m_payload.data() + m_delivered, n);
        m_delivered += n;
        co_return n;
    }

    // Never called by the reader; here for the concept.
    auto write_some(std::span<const std::byte>, std::stop_token = {}) { return refused<std::size_t>(); }
    auto write_all(std::span<const std::byte>, std::stop_token = {}) { return refused<void>(); }
    auto write_all(std::span<const ::iovec>, std::stop_token = {}) { return refused<void>(); }
    result<void> shutdown_write() noexcept { return {}; }
    void close() noexcept {}

    std::size_t delivered() const noexcept { return m_delivered; }
    bool at_end() const noexcept { return m_delivered == m_payload.size(); }
    std::error_code last_error() const noexcept { return m_last_error; }

private:
    template <class T>
    static net::detail::ready_awaiter<result<T>> refused() {
        return {std::make_error_code(std::errc::operation_not_supported)};
    }

    std::string_view m_payload;
    FuzzedDataProvider* m_script;
    std::size_t m_delivered = 0;
    std::error_code m_last_error;
};

static_assert(net::byte_stream<scripted_stream>);

/// What the reader should have done so far: `handed` bytes of the payload
/// given out (or consumed), in order.
struct model {
    std::string_view payload;
    const scripted_stream* stream;
    std::size_t handed = 0;

    std::string_view pending() const { return payload.substr(handed, stream->delivered() - handed); }
};

std::string pick_delimiter(FuzzedDataProvider& script) {
    switch (script.ConsumeIntegralInRange(0, 6)) {
    case 0: return "\n";
    case 1: return "\r\n";
    case 2: return "\r\n\r\n";
    case 3: return "aa";  // overlaps itself
    case 4: return "aba";
    case 5: return "";    // invalid_argument
    default: return script.ConsumeBytesAsString(script.ConsumeIntegralInRange<std::size_t>(1, 3));
    }
}

task<void> check_read_until(net::basic_buffered_reader<scripted_stream>& reader, model& m, FuzzedDataProvider& script) {
    const std::string delimiter = pick_delimiter(script);
    const std::size_t max = script.ConsumeBool() ? script.ConsumeIntegralInRange<std::size_t>(0, 48)
                                                 : script.ConsumeIntegralInRange<std::size_t>(0, 2048);
    const std::size_t limit = std::max(max, delimiter.size());
    const result<std::string_view> line = co_await reader.read_until(delimiter, max);
    const std::string_view pending = m.pending();
    if (delimiter.empty()) {
        FUZZ_CHECK(!line && line.error() == std::errc::invalid_argument);
    } else if (line) {
        FUZZ_CHECK(line->size() <= limit);
        FUZZ_CHECK(*line == pending.substr(0, line->size()));
        FUZZ_CHECK(line->ends_with(delimiter));
        FUZZ_CHECK(pending.find(delimiter) == line->size() - delimiter.size());
        m.handed += line->size();
    } else if (line.error() == net::errc::line_too_long) {
        FUZZ_CHECK(pending.size() >= limit);
        const std::size_t at = pending.find(delimiter);
        FUZZ_CHECK(at == std::string_view::npos || at + delimiter.size() > limit);
    } else if (line.error() == net::errc::end_of_stream) {
        FUZZ_CHECK(m.stream->at_end());
        FUZZ_CHECK(pending.size() < limit);
        FUZZ_CHECK(pending.find(delimiter) == std::string_view::npos);
    } else {
        FUZZ_CHECK(line.error() == m.stream->last_error());
    }
}

task<void> check_read_exact(net::basic_buffered_reader<scripted_stream>& reader, model& m, FuzzedDataProvider& script) {
    // On the heap, so that a write past its end is caught.
    std::vector<std::byte> out(script.ConsumeIntegralInRange<std::size_t>(0, 300));
    const result<void> r = co_await reader.read_exact(out);
    if (r) {
        FUZZ_CHECK(text_of(out) == m.payload.substr(m.handed, out.size()));
        m.handed += out.size();
        co_return;
    }
    // What was buffered and what arrived went into `out`, in order, and is
    // gone from the reader.
    const std::size_t got = m.stream->delivered() - m.handed;
    FUZZ_CHECK(got < out.size());
    FUZZ_CHECK(text_of(std::span(out).first(got)) == m.payload.substr(m.handed, got));
    m.handed += got;
    if (r.error() == net::errc::end_of_stream) FUZZ_CHECK(m.stream->at_end());
    else FUZZ_CHECK(r.error() == m.stream->last_error());
}

task<void> check_fill(net::basic_buffered_reader<scripted_stream>& reader, model& m) {
    const std::size_t before = m.stream->delivered();
    const result<std::size_t> n = co_await reader.fill();
    if (n) {
        FUZZ_CHECK(*n == m.stream->delivered() - before);
        FUZZ_CHECK(*n > 0 || m.stream->at_end());
    } else {
        FUZZ_CHECK(n.error() == m.stream->last_error());
        FUZZ_CHECK(m.stream->delivered() == before);
    }
}

task<void> drive(std::string_view payload, std::size_t capacity, FuzzedDataProvider& script) {
    scripted_stream stream(payload, script);
    net::basic_buffered_reader reader(stream, capacity);
    model m{payload, &stream};
    while (script.remaining_bytes() > 0) {
        switch (script.ConsumeIntegralInRange(0, 4)) {
        case 0:
        case 1: co_await check_read_until(reader, m, script); break;
        case 2: co_await check_read_exact(reader, m, script); break;
        case 3: co_await check_fill(reader, m); break;
        default: {
            const std::size_t n = script.ConsumeIntegralInRange<std::size_t>(0, 64);
            reader.consume(n);
            m.handed += std::min(n, m.pending().size());
            break;
        }
        }
        FUZZ_CHECK(m.handed <= stream.delivered());
        FUZZ_CHECK(text_of(reader.buffered()) == m.pending());
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    // One loop for the whole run: making one per input would cost more than
    // the input does.
    static spindle::loop loop;
    FuzzedDataProvider script(data, size);
    // The capacity (0: the smallest, 1) and the calls and reads come from the
    // back of the input, the bytes the stream carries from its front.
    const std::size_t capacity = script.ConsumeIntegralInRange<std::size_t>(0, 64);
    const std::string payload = script.ConsumeRandomLengthString(4096);
    loop.block_on(drive(payload, capacity, script));
    FUZZ_CHECK(loop.task_count() == 0);
    return 0;
}
