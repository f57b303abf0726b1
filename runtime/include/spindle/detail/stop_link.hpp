#pragma once
// How a parked wait hears of its stop token. A std::stop_callback per wait
// costs a pooled block and a lock of the token's state to register, and
// again to remove, on every wait that parks: most waits of a server share
// one token (its stop). So each loop registers one callback per token it
// sees, and a parked wait links itself into that token's list on its loop:
// two pointer writes to park, two to resume (runtime/stop_links.cpp).

#include <spindle/detail/intrusive_list.hpp>

#include <stop_token>

namespace spindle::detail {

class loop_core;
struct task_header;
struct stop_tag;  // hook in a token's list of parked waits
class stop_entry;

/// A parked wait's place among the waits of its token on its loop. A stop
/// request cancels the wait `m_task` is parked on (the one linked).
struct stop_link : list_hook<stop_tag> {
    task_header* m_task = nullptr;
};

/// The loop's entry for `token` (which can stop and has not), made on first
/// use. Throws std::bad_alloc.
stop_entry& stop_entry_for(loop_core& core, const std::stop_token& token);
/// Links `link` (its task set) to `entry`, until it unlinks itself.
void link_stop(stop_entry& entry, stop_link& link) noexcept;

}  // namespace spindle::detail
