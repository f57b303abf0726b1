// spindle-load: drives spindle-echo or spindle-http (or any echo or HTTP
// server) from N connections for a fixed time and prints what it measured.

#include "load.hpp"
#include "service.hpp"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

using namespace spindle;
using namespace spindle::examples;

namespace {

[[noreturn]] void usage(std::FILE* out, int status) {
    std::fprintf(out,
                 "usage: spindle-load [--mode echo|http] [--host ADDRESS] --port N [--connections N]\n"
                 "                    [--size BYTES] [--depth N] [--duration SECONDS] [--backend NAME]\n"
                 "                    [--reconnect] [--tls] [--tls-ca FILE] [--tls-name NAME] [--tls-resume]\n"
                 "Drives an echo or HTTP server and prints requests/s, MiB/s and latency.\n\n"
                 "  --mode         echo (default) or http (GET / expecting \"Hello, World!\")\n"
                 "  --host         server address (default 127.0.0.1)\n"
                 "  --port         server port\n"
                 "  --connections  concurrent connections, 1..10000 (default 50)\n"
                 "  --size         echo message size in bytes, 1..1048576 (default 64)\n"
                 "  --depth        requests in flight per connection, 1..1024 (default 1)\n"
                 "  --duration     seconds to run, 1..600 (default 3)\n"
                 "  --backend      automatic, epoll, io_uring or kqueue\n"
                 "  --reconnect    a new connection for every batch of --depth requests\n"
                 "  --tls          over TLS, verifying the server (with --reconnect: a full handshake each)\n"
                 "  --tls-ca       trust this CA file (PEM) instead of the system's store\n"
                 "  --tls-name     the name the server's certificate must carry (default: --host)\n"
                 "  --tls-resume   with --reconnect, resume the TLS session instead of a full handshake\n");
    std::exit(status);
}

long number(std::string_view text, long lo, long hi) {
    long v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) {
        std::fprintf(stderr, "spindle-load: '%.*s' is not a number in %ld..%ld\n", static_cast<int>(text.size()), text.data(), lo, hi);
        usage(stderr, 2);
    }
    return v;
}

}  // namespace

int main(int argc, char** argv) {
    load_options options;
    std::string host = "127.0.0.1";
    long port = -1;
    loop_options lo;
    for (int i = 1; i < argc; ++i) {
        std::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h") usage(stdout, 0);
        if (arg == "--reconnect" || arg == "--tls" || arg == "--tls-resume") {
            (arg == "--reconnect" ? options.reconnect : arg == "--tls" ? options.tls : options.tls_resume) = true;
            continue;
        }
        if (i + 1 >= argc) usage(stderr, 2);
        std::string_view value = argv[++i];
        if (arg == "--mode" && value == "echo") options.mode = load_mode::echo;
        else if (arg == "--mode" && value == "http") options.mode = load_mode::http;
        else if (arg == "--host") host = value;
        else if (arg == "--port") port = number(value, 1, 65535);
        else if (arg == "--connections") options.connections = static_cast<int>(number(value, 1, 10000));
        else if (arg == "--size") options.message_size = static_cast<std::size_t>(number(value, 1, 1 << 20));
        else if (arg == "--depth") options.depth = static_cast<int>(number(value, 1, 1024));
        else if (arg == "--duration") options.duration = std::chrono::seconds(number(value, 1, 600));
        else if (arg == "--backend" && backend_from_string(value)) lo.backend = *backend_from_string(value);
        else if (arg == "--tls-ca") options.tls_ca = value;
        else if (arg == "--tls-name") options.server_name = value;
        else usage(stderr, 2);
    }
    if (port < 0) usage(stderr, 2);
    result<net::address> target = net::address::from_ip(host, static_cast<std::uint16_t>(port));
    if (!target) {
        std::fprintf(stderr, "spindle-load: '%s' is not a numeric address\n", host.c_str());
        return 2;
    }
    options.target = *target;
    if (options.server_name.empty()) options.server_name = host;
    std::optional<loop> l;
    if (!open_loop(l, lo)) return 1;
    load_report report = l->block_on(run_load(options));
    std::printf("%s %s: %d connections, depth %d: %s\n", options.mode == load_mode::echo ? "echo" : "http",
                target->to_string().c_str(), options.connections, options.depth, report.summary().c_str());
    if (!report.first_error.empty()) std::printf("first error: %s\n", report.first_error.c_str());
    return report.errors == 0 && report.requests > 0 ? 0 : 1;
}
