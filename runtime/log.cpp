#include <spindle/log.hpp>

#include <spdlog/spdlog.h>

#include <mutex>

namespace spindle {

namespace {
std::mutex g_logger_mutex;
std::shared_ptr<spdlog::logger> g_logger;
}  // namespace

std::shared_ptr<spdlog::logger> logger() {
    std::lock_guard lock(g_logger_mutex);
    if (!g_logger) {
        g_logger = spdlog::get("spindle");
        if (!g_logger) {
            auto sinks = spdlog::default_logger()->sinks();
            g_logger = std::make_shared<spdlog::logger>("spindle", sinks.begin(), sinks.end());
            g_logger->set_level(spdlog::level::warn);
        }
    }
    return g_logger;
}

void set_logger(std::shared_ptr<spdlog::logger> logger) {
    std::lock_guard lock(g_logger_mutex);
    g_logger = std::move(logger);
}

}  // namespace spindle
