#pragma once
// A loop group's shared state: its loops, the mesh of links between them,
// and the group's stop. Private to the runtime (loop_group.cpp runs it;
// cross_loop.cpp carries its calls).

#include "cross_loop_link.hpp"
#include "group_member.hpp"
#include "loop_core.hpp"

#include <spindle/loop_group.hpp>

#include <atomic>
#include <barrier>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <vector>

namespace spindle::detail {

class group_core {
public:
    group_core(loop_group& owner, loop_group_options options);

    loop_group& owner() noexcept { return m_owner; }
    std::uint32_t size() const noexcept { return m_size; }
    const loop_group_options& options() const noexcept { return m_options; }
    link& between(std::uint32_t from, std::uint32_t to) noexcept { return *m_links[std::size_t{from} * m_size + to]; }
    group_member& member(std::uint32_t index) noexcept { return *m_members[index]; }
    bool closing() const noexcept { return m_closing.load(std::memory_order_acquire); }

    int run(const std::function<task<int>(std::stop_token)>& main);
    void stop() noexcept;
    loop& at(std::size_t index);

private:
    void run_loop(std::uint32_t index, const std::function<task<int>(std::stop_token)>& main);
    task<void> run_main(std::uint32_t index, std::function<task<int>(std::stop_token)> main);
    task<void> stop_on_signals();
    void main_finished(int status, std::exception_ptr error) noexcept;
    void pin(std::uint32_t index) const;

    loop_group& m_owner;
    loop_group_options m_options;
    std::uint32_t m_size;
    std::vector<std::unique_ptr<link>> m_links;
    std::vector<std::unique_ptr<group_member>> m_members;
    std::vector<loop*> m_loops;
    // Each requested on its own loop's thread only (stop() posts there).
    std::vector<std::stop_source> m_stops;

    std::mutex m_mutex;  // the fields below
    bool m_started = false;
    bool m_stop_requested = false;
    bool m_ran = false;
    std::uint32_t m_mains_left = 0;
    int m_status = 0;
    std::exception_ptr m_error;
    std::exception_ptr m_build_error;
    std::atomic<bool> m_closing{false};
    std::barrier<>* m_built = nullptr;    // every loop is built
    std::barrier<>* m_stopped = nullptr;  // every loop stopped ticking
};

/// The group membership of the loop running on this thread, if any.
inline group_member* current_member() noexcept {
    loop_core* core = current_core_or_null();
    return core ? core->member() : nullptr;
}

}  // namespace spindle::detail
