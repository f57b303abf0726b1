#include "stop_links.hpp"

#include "loop_core.hpp"

#include <spindle/detail/task_header.hpp>

#include <algorithm>
#include <cstring>
#include <utility>

namespace spindle::detail {

namespace {

// A token is one pointer to its shared state (libstdc++ and libc++ alike):
// its bytes name the state, which the entry's own token keeps alive, so no
// other state can take its address while the entry lives.
static_assert(sizeof(std::stop_token) == sizeof(std::uintptr_t), "a stop_token is its state's address");
std::uintptr_t key_of(const std::stop_token& token) noexcept {
    std::uintptr_t key = 0;
    std::memcpy(&key, static_cast<const void*>(&token), sizeof key);
    return key;
}

}  // namespace

void stop_entry::fire::operator()() const noexcept {
    // A cancel that completes the wait at once unlinks nothing more; one that
    // completes later leaves it parked, and unlinked.
    while (stop_link* link = entry->m_waits.pop_front()) {
        task_header& t = *link->m_task;
        if (t.m_wait_info && t.m_wait_info->cancel) (void)t.m_wait_info->cancel(t.m_wait);
    }
}

stop_entry& stop_links::entry_for(const std::stop_token& token) {
    if (m_last && m_last->token() == token) return *m_last;
    const std::uintptr_t key = key_of(token);
    if (auto it = m_entries.find(key); it != m_entries.end()) {
        m_last = it->second.get();
        return *m_last;
    }
    if (m_entries.size() >= m_drop_at) drop_idle();
    auto entry = std::make_unique<stop_entry>(token);
    stop_entry& made = *entry;
    m_entries.emplace(key, std::move(entry));
    m_last = &made;
    return made;
}

void stop_links::drop_idle() noexcept {
    // Tokens with no wait parked now: a connection's own token outlives its
    // waits, and its entry holds the token's state.
    std::erase_if(m_entries, [](const auto& kv) { return kv.second->idle(); });
    m_last = nullptr;
    m_drop_at = std::max<std::size_t>(64, 2 * m_entries.size());
}

stop_entry& stop_entry_for(loop_core& core, const std::stop_token& token) {
    return core.stop_links_of().entry_for(token);
}

void link_stop(stop_entry& entry, stop_link& link) noexcept { entry.link(link); }

}  // namespace spindle::detail
