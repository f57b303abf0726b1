#pragma once
// A task's turn: from its resume until it waits or must give the loop back.
// It ends after loop_options::task_budget operations that complete without
// waiting, or once it has run for loop_options::task_quantum, whichever is
// first. The fast path (spend_budget) only counts t_budget down: the budget is
// handed out in stints, and the clock is read where a stint runs out. A stint
// is sized from how long such an operation took lately, so a turn of cheap
// operations reads the clock once per 32 of them and a turn of long ones
// (64 KiB copies) after each. Private to the runtime (loop_core owns one).

#include <algorithm>
#include <cstdint>
#include <limits>

namespace spindle::detail {

class task_turn {
public:
    /// Stints are at most this long: a clock read costs a few cheap operations.
    static constexpr std::uint32_t longest_stint = 32;
    /// A turn's first stint is never shorter: the few ready operations of a
    /// task resumed for one message never read the clock.
    static constexpr std::uint32_t first_stint_floor = 4;

    /// `budget`: operations per turn (0: unlimited); `quantum_ns`: time per
    /// turn (0: unlimited).
    task_turn(std::uint32_t budget, std::int64_t quantum_ns) noexcept
        : m_budget(budget == 0 ? std::numeric_limits<std::uint32_t>::max() : budget),
          m_quantum_ns(std::max<std::int64_t>(quantum_ns, 0)),
          m_operation_ns(m_quantum_ns / 8) {}

    std::uint32_t budget() const noexcept { return m_budget; }

    /// A task resumes; `epoch_ns` is the clock's last reading before it (the
    /// poll pacing reads it between resumes). Returns the first stint.
    std::uint32_t start(std::int64_t epoch_ns) noexcept {
        // Without a quantum the whole budget is one stint: nothing to note.
        if (m_quantum_ns == 0) return m_budget;
        m_started_ns = epoch_ns;
        m_stint_started_ns = epoch_ns;
        m_left = m_budget;
        return take(m_quantum_ns, first_stint_floor);
    }

    /// The running stint is spent, at `now_ns`: the next stint, or 0 when
    /// the turn is over (and stays over until the next start()).
    std::uint32_t next(std::int64_t now_ns) noexcept {
        if (m_quantum_ns == 0 || m_left == 0) return 0;
        // A longer operation counts at once, shorter ones lower the estimate
        // slowly (as the poll pacing's resume estimate does).
        const std::int64_t per_operation = (now_ns - m_stint_started_ns) / m_stint;
        m_operation_ns = per_operation > m_operation_ns ? per_operation : (3 * m_operation_ns + per_operation) / 4;
        const std::int64_t ran = now_ns - m_started_ns;
        if (ran >= m_quantum_ns) {
            m_left = 0;
            return 0;
        }
        m_stint_started_ns = now_ns;
        return take(m_quantum_ns - ran, 1);
    }

private:
    std::uint32_t take(std::int64_t time_left_ns, std::uint32_t floor) noexcept {
        const std::int64_t fit = m_operation_ns > 0 ? time_left_ns / m_operation_ns : longest_stint;
        const std::uint32_t n =
            std::min(static_cast<std::uint32_t>(std::clamp<std::int64_t>(fit, floor, longest_stint)), m_left);
        m_left -= n;
        m_stint = std::max<std::uint32_t>(n, 1);
        return n;
    }

    std::uint32_t m_budget;
    std::int64_t m_quantum_ns;
    std::int64_t m_operation_ns;  // an operation's duration, smoothed
    std::int64_t m_started_ns = 0;
    std::int64_t m_stint_started_ns = 0;
    std::uint32_t m_left = 0;  // budget not yet handed out in a stint
    std::uint32_t m_stint = 1;
};

}  // namespace spindle::detail
