#pragma once
/// Buffered reads over a stream: lines (or any delimiter) and exact counts.
/// The buffer is allocated once; reads then cost no allocation.

#include <spindle/net/stream.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

namespace spindle::net {

class buffered_reader {
public:
    /// Reads from `stream`, which must outlive the reader.
    explicit buffered_reader(stream_socket& stream, std::size_t capacity = 16 * 1024);

    /// The bytes up to and including the next `delimiter`. The view is valid
    /// until the next call on this reader. line_too_long when `max` bytes
    /// arrive without a delimiter (they stay buffered); end_of_stream when the
    /// peer closes first (what arrived stays in buffered()).
    task<result<std::string_view>> read_until(std::string_view delimiter, std::size_t max, std::stop_token token = {});
    /// Fills `out` from the buffer, then from the stream.
    task<result<void>> read_exact(std::span<std::byte> out, std::stop_token token = {});
    /// Reads once more from the stream into the buffer: the count added, 0 at
    /// end of stream.
    task<result<std::size_t>> fill(std::stop_token token = {});

    /// What is buffered and not yet consumed.
    std::span<const std::byte> buffered() const noexcept { return {m_data.get() + m_begin, m_end - m_begin}; }
    void consume(std::size_t n) noexcept;

private:
    void make_room(std::size_t want);

    stream_socket* m_stream;
    std::unique_ptr<std::byte[]> m_data;
    std::size_t m_capacity;
    std::size_t m_begin = 0;
    std::size_t m_end = 0;
    /// Bytes after m_begin already searched for the delimiter.
    std::size_t m_scanned = 0;
};

}  // namespace spindle::net
