#pragma once
/// Turns asynchronous signals into something a loop can read: signalfd on
/// Linux, the self-pipe trick elsewhere (and on request, so both are tested).

#include <memory>

namespace spindle::reactor {

enum class signal_mechanism { automatic, signalfd, self_pipe };

class signal_source {
public:
    virtual ~signal_source() = default;

    /// Starts catching `signo` (idempotent). Throws std::system_error.
    virtual void add(int signo) = 0;

    /// Becomes readable when signals have arrived.
    virtual int fd() const noexcept = 0;

    /// Reads everything that arrived and calls on_signal(ctx, signo) once per
    /// delivery (the kernel may merge deliveries of one signal).
    virtual void drain(void (*on_signal)(void* ctx, int signo), void* ctx) = 0;

    virtual signal_mechanism mechanism() const noexcept = 0;
};

std::unique_ptr<signal_source> make_signal_source(signal_mechanism mechanism);

}  // namespace spindle::reactor
