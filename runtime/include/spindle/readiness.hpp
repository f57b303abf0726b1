#pragma once
/// Readiness of a descriptor, as watchers and wait_readable/wait_writable
/// report it. Flags: combine with |.

#include <cstdint>

namespace spindle {

enum readiness : std::uint32_t {
    readable = 1u,
    writable = 2u,
};

}  // namespace spindle
