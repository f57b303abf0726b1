#include "service.hpp"

#include <spdlog/cfg/env.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace spindle::examples {

namespace {

[[noreturn]] void usage(const service_info& info, std::FILE* out, int status) {
    struct line {
        std::string flag;
        std::string help;
    };
    std::vector<line> lines{
        {"--host ADDRESS", "address to listen on (default 127.0.0.1)"},
        {"--port N", "port to listen on (default " + std::to_string(info.default_port) + "; 0 picks a free one)"},
        {"--backend NAME", "automatic, epoll, io_uring or kqueue (default automatic)"},
        {"--threads N", "loops, one thread each (default 1; 0: one per CPU)"},
        {"--distribute MODE", "with several loops: reuseport (default: the kernel spreads connections) or least-loaded"},
    };
    std::string synopsis = " [--host ADDRESS] [--port N] [--backend NAME] [--threads N] [--distribute MODE]";
    for (const service_flag& f : info.flags) {
        std::string flag = std::string(f.name) + " " + std::string(f.value_name);
        synopsis += " [" + flag + "]";
        lines.push_back({std::move(flag), std::string(f.help)});
    }
    synopsis += " [--help]";
    lines.push_back({"--help", "this text"});
    std::size_t width = 0;
    for (const line& l : lines) width = std::max(width, l.flag.size());

    std::fprintf(out, "usage: %.*s%s\n%.*s\n\n", static_cast<int>(info.name.size()), info.name.data(), synopsis.c_str(),
                 static_cast<int>(info.description.size()), info.description.data());
    for (const line& l : lines)
        std::fprintf(out, "  %-*s   %s\n", static_cast<int>(width), l.flag.c_str(), l.help.c_str());
    std::fprintf(out,
                 "%.*s"
                 "\nStops cleanly on SIGINT or SIGTERM; SIGUSR1 prints what every task waits on to stderr.\n",
                 static_cast<int>(info.extra_help.size()), info.extra_help.data());
    std::exit(status);
}

}  // namespace

service_options parse_service_options(int argc, char** argv, const service_info& info) {
    // spindle's logger takes the default logger's sinks when first used.
    spdlog::set_default_logger(spdlog::stderr_color_mt(std::string(info.name)));
    spdlog::cfg::load_env_levels();
    service_options options;
    options.port = info.default_port;
    for (int i = 1; i < argc; ++i) {
        std::string_view arg = argv[i];
        auto value = [&]() -> std::string_view {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[i]);
                usage(info, stderr, 2);
            }
            return argv[++i];
        };
        if (arg == "--help" || arg == "-h") {
            usage(info, stdout, 0);
        } else if (arg == "--host") {
            options.host = value();
        } else if (arg == "--port") {
            std::string_view text = value();
            unsigned port = 0;
            auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
            if (ec != std::errc() || end != text.data() + text.size() || port > 65535) {
                std::fprintf(stderr, "%s: bad port '%.*s'\n", argv[0], static_cast<int>(text.size()), text.data());
                usage(info, stderr, 2);
            }
            options.port = static_cast<std::uint16_t>(port);
        } else if (arg == "--backend") {
            std::string_view name = value();
            auto kind = backend_from_string(name);
            if (!kind) {
                std::fprintf(stderr, "%s: unknown backend '%.*s'\n", argv[0], static_cast<int>(name.size()), name.data());
                usage(info, stderr, 2);
            }
            options.backend = *kind;
        } else if (arg == "--threads") {
            std::string_view text = value();
            unsigned n = 0;
            auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
            if (ec != std::errc() || end != text.data() + text.size() || n > 1024) {
                std::fprintf(stderr, "%s: bad thread count '%.*s'\n", argv[0], static_cast<int>(text.size()), text.data());
                usage(info, stderr, 2);
            }
            options.threads = n;
        } else if (arg == "--distribute") {
            std::string_view text = value();
            auto mode = net::distribution_from_string(text);
            if (!mode) {
                std::fprintf(stderr, "%s: unknown distribution '%.*s' (reuseport or least-loaded)\n", argv[0],
                             static_cast<int>(text.size()), text.data());
                usage(info, stderr, 2);
            }
            options.distribute = *mode;
        } else if (auto own = std::find_if(info.flags.begin(), info.flags.end(),
                                           [&](const service_flag& f) { return f.name == arg; });
                   own != info.flags.end()) {
            std::string_view text = value();
            if (std::string why = own->set(text); !why.empty()) {
                std::fprintf(stderr, "%s: bad %s '%.*s': %s\n", argv[0], argv[i - 1], static_cast<int>(text.size()),
                             text.data(), why.c_str());
                usage(info, stderr, 2);
            }
        } else {
            std::fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], argv[i]);
            usage(info, stderr, 2);
        }
    }
    return options;
}

namespace {
task<void> stop_on(int signo, std::stop_source stop) {
    result<int> got = co_await wait_signal(signo, stop.get_token());
    if (got) stop.request_stop();
}
}  // namespace

task<void> dump_on_sigusr1(std::stop_token stop) {
    while (co_await wait_signal(SIGUSR1, stop)) {
        std::string dump = loop::current().dump_tasks();
        std::fwrite(dump.data(), 1, dump.size(), stderr);
        std::fflush(stderr);
    }
}

task<void> stop_on_signals(std::stop_source stop) {
    // Both waits end when either signal stops the source.
    co_await when_all(stop_on(SIGINT, stop), stop_on(SIGTERM, stop));
}

void connection_set::spawn(task<void> connection) {
    const std::uint64_t id = m_next++;
    m_live.emplace(id, loop::current().spawn(run(std::move(connection), id), "connection"));
}

task<void> connection_set::run(task<void> connection, std::uint64_t id) {
    try {
        co_await std::move(connection);
    } catch (const std::exception& e) {
        // One connection's failure never takes the server down.
        logger()->warn("connection {} failed: {}", id, e.what());
    }
    m_live.erase(id);  // drops this task's own handle: it detaches
}

task<void> connection_set::wait_all() {
    while (!m_live.empty()) {
        auto first = m_live.begin();
        join_handle<void> h = std::move(first->second);
        m_live.erase(first);
        co_await std::move(h);
    }
}

bool open_loop(std::optional<loop>& out, const loop_options& options) {
    try {
        out.emplace(options);
        return true;
    } catch (const std::exception& e) {  // std::system_error, or std::invalid_argument for SPINDLE_BACKEND
        std::fprintf(stderr, "cannot start the loop: %s\n", e.what());
        return false;
    }
}

}  // namespace spindle::examples
