#include "signals.hpp"

#include "loop_core.hpp"

#include <spindle/log.hpp>

#include <stdexcept>

namespace spindle::detail {

// The public names are the reactor's, value for value.
static_assert(static_cast<int>(reactor::signal_mechanism::automatic) == static_cast<int>(signal_mechanism::automatic) &&
              static_cast<int>(reactor::signal_mechanism::signalfd) == static_cast<int>(signal_mechanism::signalfd) &&
              static_cast<int>(reactor::signal_mechanism::self_pipe) == static_cast<int>(signal_mechanism::self_pipe));

signal_service::signal_service(loop_core& core)
    : m_core(core), m_source(reactor::make_signal_source(static_cast<reactor::signal_mechanism>(core.options().signals))) {
    m_op.owner = this;
    m_op.complete = &on_ready;
    m_op.fd = m_source->fd();
    m_op.code = reactor::op_code::poll;
    m_op.events = reactor::readable;
    m_op.persistent = true;
    m_core.backend().submit(m_op);
}

signal_service::~signal_service() {
    m_core.backend().forget(m_op);
    for (slot& s : m_slots) s.waiters.clear();
    m_set_waiters.clear();
}

signal_service::slot& signal_service::slot_of(int signo) {
    if (signo <= 0 || signo > max_signal) throw std::invalid_argument("spindle: bad signal number");
    return m_slots[static_cast<std::size_t>(signo)];
}

void signal_service::catch_signal(int signo) {
    slot& s = slot_of(signo);
    if (!s.caught) {
        m_source->add(signo);
        s.caught = true;
    }
}

bool signal_service::take_pending(int signo) noexcept {
    if (signo <= 0 || signo > max_signal) return false;
    slot& s = m_slots[static_cast<std::size_t>(signo)];
    if (s.pending == 0) return false;
    s.pending = 0;
    return true;
}

void signal_service::give_back(int signo) noexcept { on_signal(this, signo); }

void signal_service::add_waiter(signal_wait& w) { slot_of(w.signo()).waiters.push_back(w); }

void signal_service::add_set_waiter(signal_set_wait& w) { m_set_waiters.push_back(w); }

void signal_service::on_ready(reactor::operation& op) noexcept {
    signal_service* self = static_cast<source_op&>(op).owner;
    try {
        self->m_source->drain(&on_signal, self);
    } catch (const std::exception& e) {
        logger()->error("reading signals failed: {}", e.what());
    }
}

void signal_service::on_signal(void* ctx, int signo) noexcept {
    auto* self = static_cast<signal_service*>(ctx);
    if (signo <= 0 || signo > max_signal) return;
    slot& s = self->m_slots[static_cast<std::size_t>(signo)];
    bool delivered = false;
    while (signal_wait* w = s.waiters.pop_front()) {
        w->complete();
        delivered = true;
    }
    if (!self->m_set_waiters.empty()) {
        // Those waiting for a set with this signal leave the list; the others
        // stay, in their order.
        intrusive_list<signal_set_wait> others;
        while (signal_set_wait* w = self->m_set_waiters.pop_front()) {
            if (w->signals().contains(signo)) {
                w->deliver(signo);
                delivered = true;
            } else {
                others.push_back(*w);
            }
        }
        self->m_set_waiters.splice_back(others);
    }
    if (!delivered) ++s.pending;
}

// --- the interface signal.hpp declares ------------------------------------------

void catch_signal(loop_core& core, int signo) {
    if (signo <= 0 || signo > signal_set::max_signal) throw std::invalid_argument("spindle: bad signal number");
    core.signals().catch_signal(signo);
}

bool take_pending_signal(loop_core& core, int signo) noexcept {
    try {
        return core.signals().take_pending(signo);
    } catch (...) {
        return false;  // no source could be made: nothing can be pending
    }
}

void add_signal_waiter(loop_core& core, signal_wait& w) { core.signals().add_waiter(w); }

void add_signal_set_waiter(loop_core& core, signal_set_wait& w) { core.signals().add_set_waiter(w); }

void give_back_signal(loop_core& core, int signo) noexcept { core.signals().give_back(signo); }

}  // namespace spindle::detail

namespace spindle {

void loop::catch_signal(int signo) { detail::catch_signal(*m_core, signo); }

}  // namespace spindle
