#pragma once
// The process's reaper: children whose child object went before a wait saw
// them end are reaped here when they end, so none is left a zombie.

#include <sys/types.h>

namespace spindle::process::detail {

/// Takes over `pidfd` (or -1: the child is then looked for by `pid`) and
/// reaps the child on the reaper's thread once it has ended.
void hand_to_reaper(int pidfd, pid_t pid) noexcept;

}  // namespace spindle::process::detail
