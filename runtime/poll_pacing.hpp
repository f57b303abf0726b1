#pragma once
// When a loop whose tasks stay ready looks at the OS: at least every
// loop_options::poll_interval, on the real clock even under virtual time.
// The clock is not read after every resume (a read costs about as much as a
// yield): a countdown of resumes, sized from how long a resume takes, says
// when to read it next. Private to the runtime (loop_core owns one; the stall
// probe reads the countdown and the epoch from another thread).

#include "relaxed.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace spindle::detail {

class poll_pacing {
public:
    /// While resumes are short, the clock is read after every this many.
    static constexpr unsigned check_every = 16;

    poll_pacing(std::int64_t interval_ns, std::int64_t now_ns) noexcept
        : m_interval_ns(std::max<std::int64_t>(0, interval_ns)),
          m_last_poll_ns(now_ns),
          m_last_check_ns(now_ns),
          // Resumes are taken for long until measured short: the clock is
          // read after each of the first few dozen, never after 16 long ones.
          m_resume_ns(std::max<std::int64_t>(m_interval_ns, 1)) {}

    /// Resumes left before the next clock read; zero once the stall monitor
    /// flagged the running resume. The loop reads it after every resume.
    unsigned countdown() const noexcept { return m_until_check.load(); }
    void set_countdown(unsigned n) noexcept { m_until_check = n; }
    /// The stall monitor's conditional zero (any thread).
    bool cut_countdown(unsigned expected) noexcept { return m_until_check.compare_exchange_release(expected, 0); }
    /// When the clock was last read for the interval: a new epoch each time.
    std::int64_t epoch() const noexcept { return m_last_check_ns.load(); }

    /// The countdown ran out, at `now`: true when the interval has too, and
    /// the OS should be looked at now; otherwise plans the next check.
    bool interval_over(std::int64_t now) noexcept {
        // A longer resume counts at once, shorter ones lower the estimate
        // slowly, so that a few short resumes among long ones do not stretch
        // the next check over many long ones.
        const std::int64_t per_resume = (now - m_last_check_ns.load()) / m_span;
        m_resume_ns = per_resume > m_resume_ns ? per_resume : (3 * m_resume_ns + per_resume) / 4;
        m_last_check_ns = now;
        const std::int64_t since_poll = now - m_last_poll_ns;
        if (since_poll >= m_interval_ns) return true;
        plan_next_check(m_interval_ns - since_poll);
        return false;
    }
    /// Whether the interval has passed since the last poll (a busy tick's check).
    bool due(std::int64_t now) const noexcept { return now - m_last_poll_ns >= m_interval_ns; }

    /// The OS was looked at, at `now`.
    void polled(std::int64_t now) noexcept {
        m_last_poll_ns = now;
        m_last_check_ns = now;
        plan_next_check(m_interval_ns);
    }
    /// A poll happened between two resumes of this tick (interval_over): the
    /// tick's own poll step is then already done.
    void note_polled_in_batch() noexcept { m_polled_in_batch = true; }
    bool take_polled_in_batch() noexcept { return std::exchange(m_polled_in_batch, false); }

private:
    void plan_next_check(std::int64_t left_ns) noexcept {
        // As many resumes as fit in what is left of the interval, at most
        // check_every, at least one.
        std::int64_t n = m_resume_ns > 0 ? left_ns / m_resume_ns : check_every;
        n = std::clamp<std::int64_t>(n, 1, check_every);
        m_span = static_cast<unsigned>(n);
        m_until_check = m_span;
    }

    std::int64_t m_interval_ns;
    std::int64_t m_last_poll_ns;            // when the OS was last looked at
    relaxed<std::int64_t> m_last_check_ns;  // when the clock was last read for it
    std::int64_t m_resume_ns;               // a resume's duration, smoothed
    relaxed<unsigned> m_until_check{1};
    unsigned m_span = 1;  // resumes between the last two clock reads
    bool m_polled_in_batch = false;
};

}  // namespace spindle::detail
