#pragma once
// A timer as the loop's timer queue knows it: embedded in whatever waits
// (a sleep, a deadline, a periodic timer), so arming one allocates nothing.

#include <cstdint>
#include <limits>

namespace spindle::detail {

struct timer_node {
    using fire_fn = void (*)(timer_node&) noexcept;
    static constexpr std::uint32_t no_slot = std::numeric_limits<std::uint32_t>::max();

    fire_fn m_fire = nullptr;
    std::uint32_t m_slot = no_slot;  // the queue's handle while armed

    bool armed() const noexcept { return m_slot != no_slot; }
};

}  // namespace spindle::detail
