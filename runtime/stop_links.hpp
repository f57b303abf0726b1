#pragma once
// The loop's stop tokens (see detail/stop_link.hpp): one std::stop_callback
// per token in use, each with the list of waits parked on it. Entries stay
// while their token may be used again, so a server's token is registered
// once; entries with no wait are dropped when they pile up. Stop requests
// arrive on the loop's thread (park.hpp), so nothing here is locked.

#include <spindle/detail/intrusive_list.hpp>
#include <spindle/detail/stop_link.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stop_token>
#include <unordered_map>

namespace spindle::detail {

class stop_entry {
public:
    explicit stop_entry(const std::stop_token& token) : m_token(token), m_callback(token, fire{this}) {}
    stop_entry(const stop_entry&) = delete;
    stop_entry& operator=(const stop_entry&) = delete;

    const std::stop_token& token() const noexcept { return m_token; }
    bool idle() const noexcept { return m_waits.empty(); }
    void link(stop_link& link) noexcept { m_waits.push_back(link); }

private:
    struct fire {
        stop_entry* entry;
        void operator()() const noexcept;
    };

    intrusive_list<stop_link, stop_tag> m_waits;  // before the callback, which may fire at once
    std::stop_token m_token;
    std::stop_callback<fire> m_callback;
};

class stop_links {
public:
    stop_links() = default;
    stop_links(const stop_links&) = delete;
    stop_links& operator=(const stop_links&) = delete;

    /// Throws std::bad_alloc.
    stop_entry& entry_for(const std::stop_token& token);
    /// Entries kept now (for tests: idle ones must not pile up).
    std::size_t size() const noexcept { return m_entries.size(); }

private:
    void drop_idle() noexcept;

    std::unordered_map<std::uintptr_t, std::unique_ptr<stop_entry>> m_entries;  // by the token's state
    stop_entry* m_last = nullptr;                                               // the last one found
    std::size_t m_drop_at = 64;
};

}  // namespace spindle::detail
