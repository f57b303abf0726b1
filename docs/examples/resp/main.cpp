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

}  // namespace

int main(int argc, char** argv) {
    const service_options options = parse_service_options(
        argc, argv,
        {"spindle-resp", "An in-memory key-value server speaking RESP2 (the Redis protocol).", 6379,
         "\nCommands: PING, ECHO, SET (EX/PX/NX/XX/GET/KEEPTTL), GET, DEL, EXISTS, INCR, COMMAND, CONFIG GET, QUIT.\n"});
    loop_options lo;
    lo.backend = options.backend;
    return run_service_loop(lo, [&] { return run_tcp_service(options, "spindle-resp", serve_connection<net::tcp_stream>); });
}
