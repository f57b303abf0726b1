#pragma once
// waitid(2) without blocking, for a child by its pidfd or its pid.

#include <spindle/process.hpp>

#include <optional>
#include <system_error>

namespace spindle::process::detail {

/// Reaps the child if it has ended: its status, nullopt while it runs, or the
/// error (no_child_process when something else reaped it first).
result<std::optional<exit_status>> reap_if_ended(int pidfd, pid_t pid) noexcept;

}  // namespace spindle::process::detail
