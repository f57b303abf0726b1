#pragma once
// Counts allocations through operator new on this thread while t_counting is
// set: include it in exactly one file of a test program (it replaces the
// global operator new there). Under AddressSanitizer the frame pool is off
// (every frame is allocated) and ASan's own operator new stays in place:
// nothing is replaced or counted there, and SPINDLE_FRAME_POOL is 0. Under
// ThreadSanitizer the pool is on but nothing is counted either.

#include <spindle/detail/frame_pool.hpp>

#include <cstddef>
#include <cstdlib>
#include <new>

#if SPINDLE_FRAME_POOL
namespace spindle::test {
inline thread_local bool t_counting = false;
inline thread_local std::size_t t_allocations = 0;
}  // namespace spindle::test
#endif

// ThreadSanitizer defines operator new itself: there, nothing is counted.
#if defined(__SANITIZE_THREAD__)
#define SPINDLE_COUNTING_NEW 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SPINDLE_COUNTING_NEW 0
#endif
#endif
#ifndef SPINDLE_COUNTING_NEW
#define SPINDLE_COUNTING_NEW SPINDLE_FRAME_POOL
#endif

#if SPINDLE_COUNTING_NEW

// Out of line: inlined, g++ takes the free() of a new'd pointer for a mismatch.
[[gnu::noinline]] void* operator new(std::size_t size) {
    if (spindle::test::t_counting) ++spindle::test::t_allocations;
    if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
    throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif
