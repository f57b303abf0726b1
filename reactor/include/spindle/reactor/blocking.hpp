#pragma once
/// File operations (is_file_op) run the blocking way, for a thread that may
/// block: the pool's, never a loop's. What a backend does not perform itself
/// (backend::performs) its owner runs through this.

#include <spindle/reactor/operation.hpp>

#include <cstdint>

namespace spindle::reactor {

/// Runs the file operation `op` describes and returns what its completion
/// would carry: a count, a descriptor, 0, or -errno. Touches nothing of `op`
/// but its arguments, so any thread may run it while the owner waits.
/// -EINVAL for an operation that is no file operation.
std::int64_t perform_blocking(const operation& op) noexcept;

}  // namespace spindle::reactor
