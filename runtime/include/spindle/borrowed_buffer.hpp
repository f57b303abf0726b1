#pragma once
/// borrowed_buffer: bytes a borrowed read (spindle::recv_borrowed, a stream's
/// read_borrowed) received into a buffer lent by its loop. The loop keeps a
/// pool of read buffers (loop_options::read_buffer_size each) and lends one
/// only once data has arrived, so a connection waiting for input holds no
/// buffer at all: on io_uring the kernel picks one from a ring of provided
/// buffers, on epoll and kqueue the read is tried into a pooled buffer once
/// the socket is readable.
///
/// Give it back soon: when destroyed, on reset(), or by moving it into
/// another borrowed_buffer that is then dropped. Until then it is yours to
/// read and to modify. Give it back on its loop's thread; one that outlives
/// its loop is still valid, and freed when given back.

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace spindle {

namespace detail {
struct buffer_lender;
/// Gives buffer `id` back to a loop's pool (`lender`).
void give_back(void* lender, std::uint32_t id) noexcept;
}  // namespace detail

class borrowed_buffer {
public:
    /// Empty: lends nothing (and is what end of stream reads as).
    borrowed_buffer() noexcept = default;
    borrowed_buffer(borrowed_buffer&& other) noexcept
        : m_give_back(other.m_give_back),
          m_lender(std::exchange(other.m_lender, nullptr)),
          m_data(std::exchange(other.m_data, nullptr)),
          m_size(std::exchange(other.m_size, 0)),
          m_id(other.m_id) {}
    borrowed_buffer& operator=(borrowed_buffer&& other) noexcept {
        if (this != &other) {
            reset();
            m_give_back = other.m_give_back;
            m_lender = std::exchange(other.m_lender, nullptr);
            m_data = std::exchange(other.m_data, nullptr);
            m_size = std::exchange(other.m_size, 0);
            m_id = other.m_id;
        }
        return *this;
    }
    borrowed_buffer(const borrowed_buffer&) = delete;
    borrowed_buffer& operator=(const borrowed_buffer&) = delete;
    ~borrowed_buffer() { reset(); }

    /// The bytes received (after consume(), those left).
    std::span<std::byte> bytes() const noexcept { return {m_data, m_size}; }
    std::byte* data() const noexcept { return m_data; }
    std::size_t size() const noexcept { return m_size; }
    bool empty() const noexcept { return m_size == 0; }

    /// Drops the first n bytes (at most size()), for a parser that took
    /// them; the buffer stays borrowed until reset or destroyed.
    void consume(std::size_t n) noexcept {
        n = n < m_size ? n : m_size;
        m_data += n;
        m_size -= static_cast<std::uint32_t>(n);
    }
    /// Keeps the first n bytes (at most size()), dropping the rest.
    void shrink(std::size_t n) noexcept {
        if (n < m_size) m_size = static_cast<std::uint32_t>(n);
    }
    /// Gives the buffer back to its loop now; the buffer is then empty.
    void reset() noexcept {
        if (m_lender) m_give_back(std::exchange(m_lender, nullptr), m_id);
        m_data = nullptr;
        m_size = 0;
    }

    /// For spindle's reads: what a completion handed over.
    borrowed_buffer(detail::buffer_lender* lender, std::uint32_t id, std::byte* data, std::uint32_t size) noexcept
        : m_give_back(&detail::give_back), m_lender(lender), m_data(data), m_size(size), m_id(id) {}

    /// How a lender of its own takes its buffer `id` back (on the thread
    /// that lent it, as with a loop's).
    using give_back_fn = void (*)(void* lender, std::uint32_t id) noexcept;
    /// For a lender of spindle's other than a loop (an encrypted stream's
    /// plaintext): `size` bytes at `data`, going back through `give_back`.
    borrowed_buffer(give_back_fn give_back, void* lender, std::uint32_t id, std::byte* data,
                    std::uint32_t size) noexcept
        : m_give_back(give_back), m_lender(lender), m_data(data), m_size(size), m_id(id) {}

private:
    give_back_fn m_give_back = nullptr;
    void* m_lender = nullptr;
    std::byte* m_data = nullptr;
    std::uint32_t m_size = 0;
    std::uint32_t m_id = 0;
};

}  // namespace spindle
