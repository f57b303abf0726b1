#pragma once
// Whether a spin is worth its CPU, learnt from the spins before it. A spin
// waits a short while for something another thread will do (an answer from
// the pool, a job for a pool thread) to save a wake-up; when what it waits
// for keeps coming later than the spin lasts (jobs that take longer than the
// window), every spin is a window of CPU thrown away. So a spin that runs out
// doubles the number of waits that then sleep at once (1, 2, 4 ... 64) before
// the next one tries again, and a spin that finds what it waited for starts
// over. Owned by one thread.

#include <algorithm>
#include <cstdint>

namespace spindle::detail {

class spin_gauge {
public:
    /// About to wait: spin first, or sleep at once.
    bool should_spin() noexcept {
        if (m_skip == 0) return true;
        --m_skip;
        return false;
    }
    /// The spin found what it waited for.
    void found() noexcept { m_misses = 0; }
    /// The spin ran its whole window in vain.
    void ran_out() noexcept {
        m_skip = std::uint32_t{1} << m_misses;
        m_misses = std::min<std::uint32_t>(m_misses + 1, max_shift);
    }

private:
    static constexpr std::uint32_t max_shift = 6;  // 64 sleeps between tries at most
    std::uint32_t m_skip = 0;
    std::uint32_t m_misses = 0;
};

}  // namespace spindle::detail
