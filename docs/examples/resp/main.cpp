// spindle-resp: a small in-memory key-value server speaking RESP2, the Redis
// protocol: PING, ECHO, SET, GET, DEL, EXISTS, INCR, inline commands and
// pipelining; protocol errors are answered with -ERR and the connection closed.
// It works with the real redis-cli and redis-benchmark. With --metrics-port,
// GET /metrics on a loopback port gives the loops' metrics.
//
// Per batch of pipelined commands it does one read, executes every complete
// command into one output buffer, and writes that buffer once. On one loop
// (the default) all connections share one store: one thread, so no lock.
// With --threads N each loop owns a shard of the keyspace (a key belongs to
// the loop its hash names); a command on another loop's key runs there as a
// cross-loop call, so SET on one connection and GET on another agree,
// whatever loops they landed on. Still no lock: a shard is touched by its
// own loop only.

#include "metrics_endpoint.hpp"
#include "resp_protocol.hpp"
#include "service.hpp"

#include <spindle/loop_group.hpp>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace spindle;
using namespace spindle::examples;

namespace {

resp::store g_store;

// Any byte stream: run_tcp_service hands in a tcp_stream; an encrypted stream
// would be served the same way.
template <net::byte_stream Stream>
task<void> serve_connection(Stream stream, std::stop_token stop) {
    resp::output_buffer out;
    // Remembers a command cut by the end of a read, so it is scanned once.
    resp::request_parser parser;
    co_await serve_batches(
        stream, stop,
        [&](std::string_view input) {
            out.clear();
            resp::batch_result batch = resp::handle_batch(input, g_store, out, parser);
            return batch_outcome{batch.consumed, out.view(), batch.close};
        },
        /*linger=*/false);
}

// --- with several loops: the keyspace in shards ---------------------------------

std::vector<resp::store> g_shards;  // one per loop, each used by its loop only

std::size_t owner_of(std::string_view key) { return std::hash<std::string_view>{}(key) % g_shards.size(); }

bool equals_ignoring_case(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if ((a[i] | 0x20) != (b[i] | 0x20)) return false;
    return true;
}

// The commands that name keys, and where their keys are: GET, SET, INCR
// (one key, args[1]); DEL and EXISTS (every argument after the name).
bool is_multi_key(std::string_view name) { return equals_ignoring_case(name, "DEL") || equals_ignoring_case(name, "EXISTS"); }
bool is_single_key(std::string_view name) {
    return equals_ignoring_case(name, "GET") || equals_ignoring_case(name, "SET") || equals_ignoring_case(name, "INCR");
}

// Runs one command on loop `owner`'s shard and gives its reply. The
// arguments are copied: the call may outlive this connection's buffer (a
// cancelled wait does not unrun a call the owner took).
task<std::string> run_on(std::size_t owner, std::span<const std::string_view> args) {
    std::vector<std::string> owned(args.begin(), args.end());
    auto run = [argv = std::move(owned)] {
        std::vector<std::string_view> views(argv.begin(), argv.end());
        resp::output_buffer out;
        (void)resp::execute(views, g_shards[loop_group::current_index()], out);
        return std::string(out.view());
    };
    result<std::string> reply = co_await submit_to(owner, std::move(run));
    co_return reply ? std::move(*reply) : std::string("-ERR the key's loop is stopping\r\n");
}

// One command, wherever its keys live; its reply appended to `out`.
task<resp::connection_action> execute_sharded(std::span<const std::string_view> args, resp::output_buffer& out) {
    const std::size_t me = loop_group::current_index();
    const std::string_view name = args[0];
    if (is_single_key(name) && args.size() >= 2) {
        const std::size_t owner = owner_of(args[1]);
        if (owner == me) co_return resp::execute(args, g_shards[me], out);
        out.append_raw(co_await run_on(owner, args));
        co_return resp::connection_action::keep_open;
    }
    if (is_multi_key(name) && args.size() >= 2) {
        // DEL k1 k2 ...: each key on its owner, the counts summed.
        std::int64_t total = 0;
        for (std::size_t i = 1; i < args.size(); ++i) {
            const std::string_view one[] = {name, args[i]};
            std::string reply;
            if (owner_of(args[i]) == me) {
                resp::output_buffer local;
                (void)resp::execute(one, g_shards[me], local);
                reply = std::string(local.view());
            } else {
                reply = co_await run_on(owner_of(args[i]), one);
            }
            if (reply.size() > 1 && reply[0] == ':') total += std::stoll(reply.substr(1));
        }
        out.append_integer(total);
        co_return resp::connection_action::keep_open;
    }
    co_return resp::execute(args, g_shards[me], out);
}

// The connection loop of serve_batches, with commands that may wait for
// another loop: one read, every complete command (in order), one write.
task<void> serve_sharded(net::tcp_stream stream, std::stop_token stop) {
    constexpr std::size_t initial_size = 16 * 1024;
    std::vector<char> in(initial_size);
    std::size_t used = 0;
    resp::output_buffer out;
    resp::request_parser parser;
    for (;;) {
        if (used == in.size()) in.resize(in.size() * 2);  // a command larger than the buffer: the parser bounds it
        result<std::size_t> n = co_await stream.read_some(std::as_writable_bytes(std::span(in).subspan(used)), stop);
        if (!n || *n == 0) co_return;
        used += *n;
        out.clear();
        std::size_t pos = 0;
        bool close = false;
        while (pos < used && !close) {
            const resp::parse_result parsed = parser.parse(std::string_view(in.data() + pos, used - pos));
            if (parsed.status == resp::parse_status::incomplete) break;
            if (parsed.status == resp::parse_status::error) {
                out.append_raw("-ERR ");
                out.append_raw(parsed.error);
                out.append_raw("\r\n");
                close = true;
                break;
            }
            pos += parsed.consumed;
            if (parser.args().empty()) continue;
            // The arguments are views into `in`, which stays put meanwhile.
            close = co_await execute_sharded(parser.args(), out) == resp::connection_action::close;
        }
        if (!out.view().empty()) {
            if (result<void> w = co_await net::write_all(stream, out.view(), stop); !w) co_return;
        }
        if (close) co_return;
        used -= pos;
        if (used > 0 && pos > 0) std::memmove(in.data(), in.data() + pos, used);
    }
}

}  // namespace

int main(int argc, char** argv) {
    metrics_endpoint metrics;
    const service_flag flags[] = {metrics.flag()};
    const service_options options = parse_service_options(
        argc, argv,
        {"spindle-resp", "An in-memory key-value server speaking RESP2 (the Redis protocol).", 6379,
         "\nCommands: PING, ECHO, SET (EX/PX/NX/XX/GET/KEEPTTL), GET, DEL, EXISTS, INCR, COMMAND, CONFIG GET, QUIT.\n", flags});
    if (metrics.enabled() && !metrics.bind("spindle-resp")) return 1;
    if (options.threads == 1)
        return serve_tcp(options, loop_options{}, "spindle-resp", serve_connection<net::tcp_stream>, no_group_setup, metrics.serve());
    return serve_tcp(
        options, loop_options{}, "spindle-resp", serve_sharded,
        [](loop_group& group) { g_shards = std::vector<resp::store>(group.size()); }, metrics.serve());
}
