#pragma once
// How a fuzz target states an invariant: a failed check names itself and
// aborts, which libFuzzer reports as a crash and saves the input that made it.

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(condition) \
    ((condition) ? static_cast<void>(0) : ::spindle::fuzz::check_failed(#condition, __FILE__, __LINE__))

namespace spindle::fuzz {

[[noreturn]] inline void check_failed(const char* condition, const char* file, int line) {
    std::fprintf(stderr, "%s:%d: invariant does not hold: %s\n", file, line, condition);
    std::abort();
}

}  // namespace spindle::fuzz
