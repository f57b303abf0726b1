#include "mapped_array.hpp"

#include <sys/mman.h>

#include <new>

namespace spindle::detail {

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool use_mappings = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool use_mappings = false;
#else
constexpr bool use_mappings = true;
#endif
#else
constexpr bool use_mappings = true;
#endif

bool is_mapping(std::size_t bytes) noexcept { return use_mappings && bytes >= mapped_array_page; }

std::size_t whole_pages(std::size_t bytes) noexcept {
    return (bytes + mapped_array_page - 1) / mapped_array_page * mapped_array_page;
}

}  // namespace

void* grow_array_storage(void* old, std::size_t old_bytes, std::size_t used_bytes, std::size_t& new_bytes) {
    if (!is_mapping(new_bytes)) {
        // operator new, not realloc: tests that count allocations see these.
        void* p = ::operator new(new_bytes);
        if (used_bytes) std::memcpy(p, old, used_bytes);
        ::operator delete(old);
        return p;
    }
    new_bytes = whole_pages(new_bytes);
    const bool old_mapped = old && is_mapping(old_bytes);
#if defined(__linux__)
    if (old_mapped) {
        // The kernel moves the pages, if it must, by their page tables.
        void* p = ::mremap(old, old_bytes, new_bytes, MREMAP_MAYMOVE);
        if (p == MAP_FAILED) throw std::bad_alloc();
        return p;
    }
#endif
    void* p = ::mmap(nullptr, new_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (used_bytes) std::memcpy(p, old, used_bytes);
    if (old_mapped)
        ::munmap(old, old_bytes);
    else
        ::operator delete(old);
    return p;
}

void free_array_storage(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    if (is_mapping(bytes))
        ::munmap(p, bytes);
    else
        ::operator delete(p);
}

}  // namespace spindle::detail
