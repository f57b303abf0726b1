#pragma once
// The loop's signal service: one signal source per loop (signalfd, or the
// self-pipe), watched by a persistent readiness operation; each signal's
// waiters, the waits for any of several signals, and deliveries kept while
// nobody waits.

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/reactor/operation.hpp>
#include <spindle/reactor/signal_source.hpp>
#include <spindle/signal.hpp>

#include <array>
#include <cstdint>
#include <memory>

namespace spindle::detail {

class loop_core;

class signal_service {
public:
    explicit signal_service(loop_core& core);
    /// Withdraws the watch on the source; waiters still parked are dropped
    /// (their tasks are destroyed with the loop).
    ~signal_service();
    signal_service(const signal_service&) = delete;
    signal_service& operator=(const signal_service&) = delete;

    void catch_signal(int signo);
    bool take_pending(int signo) noexcept;
    /// A signal taken from pending that nobody saw: to the waiters, or pending.
    void give_back(int signo) noexcept;
    void add_waiter(signal_wait& w);
    void add_set_waiter(signal_set_wait& w);

private:
    static constexpr int max_signal = signal_set::max_signal;
    struct slot {
        intrusive_list<signal_wait> waiters;
        std::uint64_t pending = 0;
        bool caught = false;
    };
    struct source_op : reactor::operation {
        signal_service* owner = nullptr;
    };

    slot& slot_of(int signo);
    static void on_ready(reactor::operation& op) noexcept;
    static void on_signal(void* self, int signo) noexcept;

    loop_core& m_core;
    std::unique_ptr<reactor::signal_source> m_source;
    std::array<slot, max_signal + 1> m_slots;
    // Waits for any of several signals: each delivery looks through them all.
    intrusive_list<signal_set_wait> m_set_waiters;
    source_op m_op;
};

}  // namespace spindle::detail
