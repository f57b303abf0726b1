#include "watchers.hpp"

#include "io_access.hpp"
#include "loop_core.hpp"

#include <spindle/io.hpp>

namespace spindle {

namespace detail {

void watcher_registry::start(watcher& w) {
    reactor::operation& op = io_access::op(w);
    // Submit before linking: if it throws (say, epoll refuses a regular file),
    // no list keeps a node that never finished constructing.
    const bool ready_now = m_core.backend().submit(op);
    m_watchers.push_back(w);
    ++m_active;
    // A one-shot watch may be satisfied at once: it still calls back from the
    // loop, never from inside the constructor.
    if (ready_now) fired(w);
    // Made outside this loop's tick, by a host that may sleep on
    // native_handle() next: the watch must reach the OS before it does.
    else if (current_core_or_null() != &m_core)
        m_core.backend().flush();
}

void watcher_registry::stop(watcher& w) noexcept {
    if (w.watch_hook().is_linked()) {
        w.watch_hook().unlink();
        --m_active;
    }
    w.fired_hook().unlink();
    if (w.pending()) m_core.backend().forget(io_access::op(w));
}

void watcher_registry::fired(watcher& w) noexcept {
    if ((!io_access::op(w).persistent || !w.pending()) && w.watch_hook().is_linked()) {
        // Done (one-shot, or its descriptor was closed): it no longer keeps the
        // loop alive, even if it is already queued to call back.
        w.watch_hook().unlink();
        --m_active;
    }
    if (!w.fired_hook().is_linked()) m_fired.push_back(w);
}

void watcher_registry::dispatch() {
    while (watcher* w = m_fired.pop_front()) {
        try {
            w->m_callback(w->m_context);  // may stop or destroy any watcher
        } catch (...) {
            log_callback_failure("watcher callback");
        }
    }
}

void watcher_registry::detach_all() noexcept {
    // Watchers outlive the loop only by mistake; make their stop() harmless.
    while (watcher* w = m_watchers.pop_front()) {
        if (w->pending()) m_core.backend().forget(io_access::op(*w));
        w->m_loop = nullptr;
    }
    while (watcher* w = m_fired.pop_front()) w->m_loop = nullptr;
    m_active = 0;
}

}  // namespace detail

watcher::watcher(loop& owner, int fd, std::uint32_t events, callback fn, void* context, mode m)
    : io_op(spindle::poll_request(fd, events, m == mode::persistent), &on_complete),
      m_loop(&detail::core_of(owner)),
      m_callback(fn),
      m_context(context) {
    m_loop->watchers().start(*this);
}

void watcher::on_complete(detail::io_op& op) noexcept {
    auto& self = static_cast<watcher&>(op);
    if (self.m_loop) self.m_loop->watchers().fired(self);
}

void watcher::stop() noexcept {
    if (m_loop) m_loop->watchers().stop(*this);
}

bool watcher::active() const noexcept { return m_loop && (pending() || fired_hook().is_linked()); }

}  // namespace spindle
