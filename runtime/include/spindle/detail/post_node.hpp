#pragma once
// What loop::post queues: a node of the loop's intrusive MPSC queue (the
// queue itself is the engine's), holding the posted callable after it.

#include <atomic>

namespace spindle::detail {

struct post_node {
    std::atomic<post_node*> m_next{nullptr};
    /// Runs (run == true) or just discards the node's callable, then frees it.
    void (*m_call)(post_node*, bool run) noexcept = nullptr;
};

}  // namespace spindle::detail
