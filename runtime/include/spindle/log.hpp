#pragma once
/// spindle logs through one named spdlog logger, "spindle": failed detached
/// tasks, failed posted callbacks, a backend's fallback. It is quiet by
/// default (warnings and errors). The library never configures sinks: unless
/// the application registered a logger named "spindle" or calls set_logger,
/// it writes to the sinks of spdlog's default logger.

#include <spdlog/logger.h>

#include <memory>

namespace spindle {

std::shared_ptr<spdlog::logger> logger();
void set_logger(std::shared_ptr<spdlog::logger> logger);

}  // namespace spindle
