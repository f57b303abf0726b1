#pragma once
// Recycles the memory of coroutine frames and task headers. Spawning and
// finishing tasks at a high rate otherwise spends most of its time in malloc
// and free once more blocks are live than the allocator's per-thread cache
// holds. Blocks are kept per size class (16-byte steps up to 1 KiB) in a
// per-thread free list of bounded length; larger blocks go to the allocator.
// A class's size is 8 bytes short of a multiple of 16, which is what fills a
// malloc chunk exactly (the allocator adds an 8-byte size word and rounds to
// 16): a 168-byte frame takes a 176-byte chunk, where a 176-byte class would
// take 192.
// A block freed on another thread than the one that allocated it simply joins
// that thread's lists: the memory is plain operator new memory either way.

#include <cstddef>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define SPINDLE_FRAME_POOL 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPINDLE_FRAME_POOL 0
#endif
#endif
#ifndef SPINDLE_FRAME_POOL
#define SPINDLE_FRAME_POOL 1
#endif

namespace spindle::detail {

// Under AddressSanitizer every block goes straight to the allocator, so a use
// of a destroyed frame is still reported.
class frame_pool {
public:
    static constexpr std::size_t granularity = 16;
    static constexpr std::size_t max_pooled = 1024;
    static constexpr std::size_t classes = (max_pooled - 8 + granularity - 1) / granularity + 1;  // class_of(max_pooled) + 1
    static constexpr std::size_t max_per_class = 4096;  // bounds what an idle thread keeps

    static void* allocate(std::size_t size) {
        if (!SPINDLE_FRAME_POOL || size > max_pooled) return ::operator new(size);
        frame_pool& pool = local();
        std::size_t c = class_of(size);
        if (block* b = pool.m_free[c]) {
            pool.m_free[c] = b->next;
            --pool.m_count[c];
            return b;
        }
        return ::operator new(size_of(c));
    }

    static void deallocate(void* p, std::size_t size) noexcept {
        if (!SPINDLE_FRAME_POOL || size > max_pooled) {
            ::operator delete(p);
            return;
        }
        frame_pool& pool = local();
        std::size_t c = class_of(size);
        if (pool.m_count[c] >= max_per_class) {
            ::operator delete(p);
            return;
        }
        auto* b = static_cast<block*>(p);
        b->next = pool.m_free[c];
        pool.m_free[c] = b;
        ++pool.m_count[c];
    }

    frame_pool() = default;
    frame_pool(const frame_pool&) = delete;
    frame_pool& operator=(const frame_pool&) = delete;
    ~frame_pool();

private:
    struct block {
        block* next;
    };
    // Class c holds blocks of 16c + 8 bytes.
    static constexpr std::size_t class_of(std::size_t size) noexcept {
        return size <= 8 ? 0 : (size - 8 + granularity - 1) / granularity;
    }
    static constexpr std::size_t size_of(std::size_t c) noexcept { return c * granularity + 8; }
    static frame_pool& local() noexcept {
        thread_local frame_pool pool;
        return pool;
    }

    block* m_free[classes] = {};
    std::size_t m_count[classes] = {};
};

}  // namespace spindle::detail
