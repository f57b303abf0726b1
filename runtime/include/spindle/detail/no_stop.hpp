#pragma once
// The token of a wait that was given none.

#include <stop_token>

namespace spindle::detail {

/// What an awaiter factory's token parameter defaults to: a named object
/// bound by reference, not a `= {}` temporary, because g++ keeps the
/// temporaries of a co_await expression in the awaiting frame for as long as
/// the task waits (8 bytes of every frame that waits without a token).
/// Only for functions that copy the token into what they return: a
/// coroutine's parameter must stay a value.
inline constinit const std::stop_token no_stop{};  // no start-up order to care about

}  // namespace spindle::detail
