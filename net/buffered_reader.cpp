#include <spindle/net/buffered_reader.hpp>
#include <spindle/net/error.hpp>

#include <algorithm>
#include <cstring>
#include <string_view>

namespace spindle::net {

template class basic_buffered_reader<stream_socket>;

namespace detail {

read_buffer::read_buffer(std::size_t capacity)
    : m_data(new std::byte[std::max<std::size_t>(capacity, 1)]), m_capacity(std::max<std::size_t>(capacity, 1)) {}

void read_buffer::consume(std::size_t n) noexcept {
    n = std::min(n, m_end - m_begin);
    m_begin += n;
    m_scanned = m_scanned > n ? m_scanned - n : 0;
    if (m_begin == m_end) m_begin = m_end = 0;
}

void read_buffer::make_room(std::size_t want) {
    if (m_capacity - m_end >= want) return;
    const std::size_t used = m_end - m_begin;
    if (m_capacity - used < want) {
        // Grows only when a caller asks for more than the buffer holds
        // (a read_until limit above the capacity).
        std::size_t capacity = std::max(m_capacity * 2, used + want);
        std::unique_ptr<std::byte[]> bigger(new std::byte[capacity]);
        std::memcpy(bigger.get(), m_data.get() + m_begin, used);
        m_data = std::move(bigger);
        m_capacity = capacity;
    } else {
        std::memmove(m_data.get(), m_data.get() + m_begin, used);
    }
    m_begin = 0;
    m_end = used;
}

std::optional<result<std::string_view>> read_buffer::find_line(std::string_view delimiter, std::size_t max) {
    if (delimiter.empty()) return make_error_code(std::errc::invalid_argument);
    max = std::max(max, delimiter.size());
    std::string_view have(reinterpret_cast<const char*>(m_data.get() + m_begin), m_end - m_begin);
    // Resume the search where the last one stopped, less a delimiter's worth
    // in case it straddled the old end.
    std::size_t from = m_scanned >= delimiter.size() ? m_scanned - (delimiter.size() - 1) : 0;
    std::size_t at = have.find(delimiter, from);
    if (at != std::string_view::npos && at + delimiter.size() <= max) {
        std::size_t len = at + delimiter.size();
        std::string_view line = have.substr(0, len);
        // The caller's view stays valid until its next call on the reader:
        // consume now, the bytes are not moved before then.
        m_begin += len;
        m_scanned = 0;
        if (m_begin == m_end) m_begin = m_end = 0;
        return line;
    }
    m_scanned = have.size();
    if (have.size() >= max) return make_error_code(errc::line_too_long);
    if (m_begin + max > m_capacity) make_room(max - (m_end - m_begin));
    return std::nullopt;
}

std::size_t read_buffer::take(std::span<std::byte> out) noexcept {
    const std::size_t n = std::min(out.size(), m_end - m_begin);
    if (n == 0) return 0;
    std::memcpy(out.data(), m_data.get() + m_begin, n);
    consume(n);
    return n;
}

}  // namespace detail

}  // namespace spindle::net
