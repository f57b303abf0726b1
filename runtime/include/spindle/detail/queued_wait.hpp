#pragma once
// A wait that sits in its primitive's queue of waiters (an event, a count, a
// signal): cancelling or abandoning it is leaving the queue.

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/park.hpp>

namespace spindle::detail {

class queued_wait : public waiter, public list_hook<> {
public:
    /// A waiter already woken keeps its success (it is no longer queued).
    void on_cancel() noexcept {
        unlink();
        complete_cancelled();
    }
    void on_abandon() noexcept { unlink(); }
};

}  // namespace spindle::detail
