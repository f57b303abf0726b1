// spindle-resp: a small in-memory key-value server speaking RESP2, the Redis
// protocol: PING, ECHO, SET, GET, DEL, EXISTS, INCR, inline commands and
// pipelining; protocol errors are answered with -ERR and the connection closed.
// It works with the real redis-cli and redis-benchmark.
//
// Per batch of pipelined commands it does one read, executes every complete
// command into one output buffer, and writes that buffer once. All
// connections share one store: they run on one loop thread, so no lock.

#include "resp_protocol.hpp"
#include "service.hpp"

#include <cstring>
#include <memory>

using namespace spindle;
using namespace spindle::examples;

namespace {

constexpr std::size_t read_buffer_size = 16 * 1024;

resp::store g_store;

task<void> serve_connection(net::tcp_stream stream, std::stop_token stop) {
    (void)stream.set_nodelay(true);
    std::unique_ptr<char[]> in(new char[read_buffer_size]);
    std::size_t capacity = read_buffer_size;
    std::size_t used = 0;
    resp::output_buffer out;
    resp::request_parser parser;
    for (;;) {
        if (used == capacity) {
            // A command larger than the buffer (a big SET): grow to hold it.
            // The parser refuses bulk lengths above Redis's own limit.
            std::unique_ptr<char[]> bigger(new char[capacity * 2]);
            std::memcpy(bigger.get(), in.get(), used);
            in = std::move(bigger);
            capacity *= 2;
        }
        result<std::size_t> n =
            co_await stream.read_some(std::as_writable_bytes(std::span(in.get() + used, capacity - used)), stop);
        if (!n || *n == 0) break;
        used += *n;

        out.clear();
        resp::batch_result batch = resp::handle_batch(std::string_view(in.get(), used), g_store, out, parser);
        if (!out.empty()) {
            std::string_view reply = out.view();
            if (result<void> w = co_await stream.write_all(std::as_bytes(std::span(reply.data(), reply.size())), stop); !w)
                break;
        }
        if (batch.close) break;
        used -= batch.consumed;
        if (used > 0 && batch.consumed > 0) std::memmove(in.get(), in.get() + batch.consumed, used);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const service_options options = parse_service_options(
        argc, argv,
        {"spindle-resp", "An in-memory key-value server speaking RESP2 (the Redis protocol).", 6379,
         "\nCommands: PING, ECHO, SET (EX/PX/NX/XX/GET/KEEPTTL), GET, DEL, EXISTS, INCR, COMMAND, CONFIG GET, QUIT.\n"});
    loop_options lo;
    lo.backend = options.backend;
    return run_service_loop(lo, [&] { return run_tcp_service(options, "spindle-resp", serve_connection); });
}
