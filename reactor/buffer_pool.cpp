#include <spindle/reactor/buffer_pool.hpp>

#include <sys/mman.h>

#include <new>

namespace spindle::reactor {

buffer_pool::buffer_pool(std::size_t buffer_size) noexcept : m_buffer_size(buffer_size) {}

buffer_pool::~buffer_pool() {
    for (std::byte* chunk : m_chunks) ::munmap(chunk, m_buffer_size * chunk_buffers);
}

bool buffer_pool::add_chunk(std::uint32_t& first) noexcept {
    // Mapped, not malloc'ed: a chunk's pages cost nothing until a buffer is
    // used, and a lent buffer never shares a page with the allocator's data.
    void* memory = ::mmap(nullptr, m_buffer_size * chunk_buffers, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return false;
    try {
        m_free.reserve(capacity() + chunk_buffers);
        m_chunks.push_back(static_cast<std::byte*>(memory));
    } catch (const std::bad_alloc&) {
        ::munmap(memory, m_buffer_size * chunk_buffers);
        return false;
    }
    first = capacity() - chunk_buffers;
    m_mapped.store(capacity(), std::memory_order_relaxed);
    return true;
}

bool buffer_pool::take(std::uint32_t& id) noexcept {
    if (m_free.empty()) {
        std::uint32_t first;
        if (!add_chunk(first)) return false;
        // Pushed highest first, so the lowest id is lent first.
        for (std::uint32_t i = chunk_buffers; i-- > 0;) on_free(first + i);
        if (m_free.empty()) return false;
    }
    id = m_free.back();
    m_free.pop_back();
    add_lent(1);
    return true;
}

void buffer_pool::give_back(std::uint32_t id) noexcept {
    add_lent(static_cast<std::uint32_t>(-1));
    if (m_retired) {
        if (lent() == 0) delete this;
        return;
    }
    on_free(id);
}

void buffer_pool::retire() noexcept {
    m_retired = true;
    if (lent() == 0) delete this;
}

}  // namespace spindle::reactor
