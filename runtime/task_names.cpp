// Task names, out of the task headers (task_header.hpp): a table for the
// whole process, in shards so that loops of a group naming their tasks at
// once seldom take the same lock. A name is read on any thread: the dump of
// one loop describes a join of a task of another.

#include <spindle/detail/task_header.hpp>

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace spindle::detail {

namespace {

struct name_shard {
    std::mutex mutex;
    std::unordered_map<const task_header*, std::string> names;
};

constexpr std::size_t shard_count = 16;
constexpr int shard_bits = 4;
static_assert(shard_count == std::size_t{1} << shard_bits);

std::array<name_shard, shard_count>& all_shards() noexcept {
    // Never destroyed: a header may go (and drop its name) while the
    // process's statics are torn down.
    static auto* shards = new std::array<name_shard, shard_count>;
    return *shards;
}

name_shard& shard_of(const task_header& t) noexcept {
    auto& shards = all_shards();
    // Headers are 16-byte aligned blocks of 128 bytes or more: mix the bits
    // above those into the few that pick a shard.
    const auto p = reinterpret_cast<std::uintptr_t>(&t) >> 4;
    return shards[(p * 0x9e3779b97f4a7c15u) >> (64 - shard_bits)];
}

}  // namespace

void name_task(task_header& t, std::string_view name) {
    name_shard& s = shard_of(t);
    {
        const std::lock_guard lock(s.mutex);
        s.names.insert_or_assign(&t, std::string(name));
    }
    t.m_named = 1;
}

void append_task_name(const task_header& t, std::string& out) {
    if (!t.m_named) return;
    name_shard& s = shard_of(t);
    const std::lock_guard lock(s.mutex);
    if (auto it = s.names.find(&t); it != s.names.end()) out += it->second;
}

void forget_task_name(const task_header& t) noexcept {
    name_shard& s = shard_of(t);
    const std::lock_guard lock(s.mutex);
    s.names.erase(&t);
}

std::size_t task_names_held() noexcept {
    std::size_t n = 0;
    for (name_shard& s : all_shards()) {
        const std::lock_guard lock(s.mutex);
        n += s.names.size();
    }
    return n;
}

}  // namespace spindle::detail
