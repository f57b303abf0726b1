#pragma once
// What every example service shares: its command line (--host, --port,
// --backend, --help) and a stop on SIGINT or SIGTERM.

#include <spindle/net.hpp>
#include <spindle/spindle.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <pthread.h>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <optional>
#include <system_error>
#include <unordered_map>

#include <cstdint>
#include <functional>
#include <stop_token>
#include <string>
#include <string_view>

namespace spindle::examples {

struct service_options {
    std::string host = "127.0.0.1";
    std::uint16_t port = 0;
    backend_kind backend = backend_kind::automatic;
    /// Loops, one thread each (--threads; 0: one per CPU). 1: one loop on
    /// the main thread.
    unsigned threads = 1;
    /// How a group's loops share the listening address (--distribute).
    net::distribution distribute = net::distribution::reuseport;
};

/// A flag of one program, beside the shared ones: "--name VALUE".
struct service_flag {
    std::string_view name;        ///< e.g. "--max-clients"
    std::string_view value_name;  ///< e.g. "N", shown in --help
    std::string_view help;        ///< one line for --help, the default included
    /// Takes the value; returns an empty string, or why the value is refused.
    std::function<std::string(std::string_view)> set;
};

struct service_info {
    std::string_view name;         ///< the program's name, e.g. "spindle-echo"
    std::string_view description;  ///< one line for --help
    std::uint16_t default_port;
    std::string_view extra_help = {};       ///< more lines for --help, if any
    std::span<const service_flag> flags = {};  ///< the program's own flags, if any
};

/// Parses the command line. --help prints the usage and exits with 0; a bad
/// argument (a flag of info.flags refusing its value included) prints the
/// usage to stderr and exits with 2. Also sends logging to stderr (stdout is
/// the program's own output; SPDLOG_LEVEL=debug shows more).
service_options parse_service_options(int argc, char** argv, const service_info& info);

/// Creates the loop in `out`. When it cannot start (a backend not available
/// here, a SPINDLE_BACKEND that names none) says why on stderr and returns false.
bool open_loop(std::optional<loop>& out, const loop_options& options);

/// Creates a loop with `options` and runs `make_main()` (a task<int>) on it;
/// its value is the exit status. A backend that cannot start is reported as
/// status 1, not a crash.
template <class MakeMain>
int run_service_loop(const loop_options& options, MakeMain make_main);

/// What a request/response protocol made of one batch of input.
struct batch_outcome {
    std::size_t consumed = 0;  ///< bytes of input handled; dropped from the front
    std::string_view reply;    ///< bytes to write, all at once
    bool close = false;        ///< close once the reply is written
};

/// The connection loop of a pipelined request/response protocol over any
/// byte stream (a socket, an encrypted stream, a memory_stream in a test):
/// one read, `handle(std::string_view unconsumed_input) -> batch_outcome` over
/// everything buffered, one write of its reply, then the consumed bytes are
/// dropped. The read buffer (16 KiB, grown only for a request larger than
/// that) lives as long as the connection, so a request in steady state
/// allocates nothing. On a stream that lends its reads' buffers (a socket),
/// requests are parsed where they arrived and a connection holds a buffer of
/// its own only once a request has come split across reads: one waiting for
/// its next request holds none, and one whose reply does not point into its
/// input gives the read's buffer back before writing. With `linger`, a close asked for by `handle` half-closes
/// and drains what the peer still sends (briefly) so the reply is not lost to
/// a reset.
template <net::byte_stream Stream, class Handle>
task<void> serve_batches(Stream& stream, std::stop_token stop, Handle handle, bool linger);

/// Half-closes `stream` and reads what the peer still sends, for at most
/// 500 ms and 1 MiB, so the last reply reaches it before the close.
template <net::byte_stream Stream>
task<void> close_gracefully(Stream& stream, std::span<std::byte> scratch, std::stop_token stop);

/// Until `stop` is requested, prints the loop's task dump to stderr on each
/// SIGUSR1: what every connection waits on, and for how long.
task<void> dump_on_sigusr1(std::stop_token stop);

/// Resolves once SIGINT or SIGTERM arrives (or `stop` is requested otherwise),
/// after requesting `stop`. Spawn it; await its handle or ignore it.
task<void> stop_on_signals(std::stop_source stop);

/// A task a service runs beside its connections (a metrics endpoint), on its
/// only loop or on loop 0 of a group: started once the service listens, given
/// the service's stop token, and awaited before the service returns. Empty:
/// none.
using companion = std::function<task<void>(std::stop_token)>;

/// The connections of a server: each runs as its own task; wait_all() waits
/// for every one still running. A finished connection leaves the set at once.
class connection_set {
public:
    void spawn(task<void> connection);
    std::size_t size() const noexcept { return m_live.size(); }
    task<void> wait_all();

private:
    task<void> run(task<void> connection, std::uint64_t id);
    std::unordered_map<std::uint64_t, join_handle<void>> m_live;
    std::uint64_t m_next = 0;
};

/// A TCP server's life (SIGUSR1 prints the task dump to stderr): binds options.host:options.port, prints
/// "<name> listening on ADDRESS:PORT", runs `handler(stream, stop)` (a
/// task<void>) for each connection, with TCP_NODELAY on its stream (the
/// listener's default, which accepted sockets inherit: the services write
/// whole replies), until SIGINT or SIGTERM, then stops
/// accepting, lets every connection see the stop (their waits complete with
/// operation_canceled), waits for them all (and for `beside`) and returns 0.
/// 1 if it cannot bind.
template <class Handler>
task<int> run_tcp_service(const service_options& options, std::string_view name, Handler handler, companion beside = {}) {
    result<net::address> at = net::address::from_ip(options.host, options.port);
    if (!at) {
        std::fprintf(stderr, "%.*s: '%s' is not a numeric address\n", static_cast<int>(name.size()), name.data(), options.host.c_str());
        co_return 2;
    }
    result<net::tcp_listener> listener = net::tcp_listener::bind(*at);
    if (!listener) {
        std::fprintf(stderr, "%.*s: cannot listen on %s: %s\n", static_cast<int>(name.size()), name.data(), at->to_string().c_str(),
                     listener.error().message().c_str());
        co_return 1;
    }
    // Catch the signals before saying we listen: a supervisor may signal as
    // soon as it reads that line, before the tasks that wait for them run.
    loop::current().catch_signal(SIGINT);
    loop::current().catch_signal(SIGTERM);
    loop::current().catch_signal(SIGUSR1);
    std::printf("%.*s listening on %s\n", static_cast<int>(name.size()), name.data(), listener->local_address()->to_string().c_str());
    std::fflush(stdout);

    std::stop_source stop;
    join_handle<void> signals = loop::current().spawn(stop_on_signals(stop), "signals");
    join_handle<void> dumps = loop::current().spawn(dump_on_sigusr1(stop.get_token()), "dump on SIGUSR1");
    join_handle<void> side;
    if (beside) side = loop::current().spawn(beside(stop.get_token()), "companion");
    connection_set connections;
    for (;;) {
        result<net::tcp_stream> stream = co_await listener->accept(stop.get_token());
        if (!stream) {
            if (stop.stop_requested()) break;
            logger()->warn("{}: accept: {}", name, stream.error().message());
            continue;
        }
        connections.spawn(handler(std::move(*stream), stop.get_token()));
    }
    listener->close();
    co_await connections.wait_all();
    co_await signals;
    co_await dumps;
    if (side.valid()) co_await side;
    co_return 0;
}

/// serve_batches on a stream that lends its reads' buffers: keeps what a
/// batch left unconsumed of `input` in `kept` (`used` bytes of `capacity`),
/// for the next read to add to. `input` is the borrowed buffer's bytes, or
/// `kept` itself when `used` was not 0.
inline void keep_unconsumed(std::string_view input, std::size_t consumed, std::unique_ptr<char[]>& kept,
                            std::size_t& capacity, std::size_t& used) {
    constexpr std::size_t initial_size = 16 * 1024;
    const std::size_t left = input.size() - consumed;
    if (left > 0 && used == 0) {
        if (capacity < left) {
            capacity = std::max(initial_size, left);
            kept.reset(new char[capacity]);
        }
        std::memcpy(kept.get(), input.data() + consumed, left);
    } else if (left > 0 && consumed > 0) {
        std::memmove(kept.get(), kept.get() + consumed, left);
    }
    used = left;
}

template <net::byte_stream Stream, class Handle>
task<void> serve_batches(Stream& stream, std::stop_token stop, Handle handle, bool linger) {
    constexpr std::size_t initial_size = 16 * 1024;
    if constexpr (net::reads_borrowed<Stream>) {
        // What a batch left unconsumed (a request split across reads) is
        // kept here, allocated the first time it is needed; otherwise each
        // batch is parsed in the buffer the read borrowed.
        std::unique_ptr<char[]> kept;
        std::size_t capacity = 0;
        std::size_t used = 0;
        for (;;) {
            result<borrowed_buffer> got = co_await stream.read_borrowed(stop);
            if (!got || got->empty()) co_return;  // closed, reset, or the server is stopping
            std::string_view input(reinterpret_cast<const char*>(got->data()), got->size());
            if (used > 0) {
                if (used + input.size() > capacity) {
                    // A request larger than the buffer: its parser bounds it.
                    const std::size_t bigger_capacity = std::max(capacity * 2, used + input.size());
                    std::unique_ptr<char[]> bigger(new char[bigger_capacity]);
                    std::memcpy(bigger.get(), kept.get(), used);
                    kept = std::move(bigger);
                    capacity = bigger_capacity;
                }
                std::memcpy(kept.get() + used, input.data(), input.size());
                used += input.size();
                input = std::string_view(kept.get(), used);
                got->reset();
            }
            const batch_outcome batch = handle(input);
            // A reply that does not point into the input lets the borrowed
            // buffer go back before the write: a write that waits (on
            // io_uring every write completes in a later tick) then holds no
            // read buffer, and a burst of requests needs no buffers beyond
            // those its reads are lent.
            const bool reply_apart = std::less<>{}(batch.reply.data() + batch.reply.size(), input.data() + 1) ||
                                     std::less<>{}(input.data() + input.size(), batch.reply.data() + 1);
            const bool early = !batch.close && (batch.reply.empty() || reply_apart);
            if (early) {
                keep_unconsumed(input, batch.consumed, kept, capacity, used);
                got->reset();
            }
            if (!batch.reply.empty()) {
                if (result<void> w = co_await net::write_all(stream, batch.reply, stop); !w) co_return;
            }
            if (batch.close) {
                got->reset();
                if (linger) {
                    std::unique_ptr<std::byte[]> scratch(new std::byte[initial_size]);
                    co_await close_gracefully(stream, std::span(scratch.get(), initial_size), stop);
                }
                co_return;
            }
            if (!early) keep_unconsumed(input, batch.consumed, kept, capacity, used);
        }
    } else {
        std::unique_ptr<char[]> in(new char[initial_size]);
        std::size_t capacity = initial_size;
        std::size_t used = 0;
        for (;;) {
            if (used == capacity) {
                // A request larger than the buffer: its parser bounds it.
                std::unique_ptr<char[]> bigger(new char[capacity * 2]);
                std::memcpy(bigger.get(), in.get(), used);
                in = std::move(bigger);
                capacity *= 2;
            }
            result<std::size_t> n =
                co_await stream.read_some(std::as_writable_bytes(std::span(in.get() + used, capacity - used)), stop);
            if (!n || *n == 0) co_return;  // closed, reset, or the server is stopping
            used += *n;

            const batch_outcome batch = handle(std::string_view(in.get(), used));
            if (!batch.reply.empty()) {
                if (result<void> w = co_await net::write_all(stream, batch.reply, stop); !w) co_return;
            }
            if (batch.close) {
                if (linger) co_await close_gracefully(stream, std::as_writable_bytes(std::span(in.get(), capacity)), stop);
                co_return;
            }
            used -= batch.consumed;
            if (used > 0 && batch.consumed > 0) std::memmove(in.get(), in.get() + batch.consumed, used);
        }
    }
}

template <net::byte_stream Stream>
task<void> close_gracefully(Stream& stream, std::span<std::byte> scratch, std::stop_token stop) {
    using namespace std::chrono_literals;
    // A socket's half-close completes at once; an encrypted stream's writes
    // its goodbye first, bounded by the same deadline as the drain.
    const auto until = clock::now() + 500ms;
    if (!co_await with_deadline(until, net::shutdown_write(stream, stop))) co_return;
    // Closing with the peer's bytes unread would make the kernel send a reset,
    // which can destroy the reply before the peer reads it (nginx's lingering
    // close does the same).
    for (std::size_t drained = 0; drained < 1024 * 1024;) {
        result<std::size_t> n = co_await with_deadline(until, stream.read_some(scratch, stop));
        if (!n || *n == 0) co_return;
        drained += *n;
    }
}

template <class MakeMain>
int run_service_loop(const loop_options& options, MakeMain make_main) {
    std::optional<loop> l;
    if (!open_loop(l, options)) return 1;
    return l->block_on(make_main());
}

/// One loop of a group serving its share of `listener`'s connections until
/// `stop`, then waiting for them all (loop 0 also prints the task dump on
/// SIGUSR1, and runs `beside`).
template <class Handler>
task<int> serve_share(net::shared_listener listener, std::string_view name, Handler& handler, std::stop_token stop,
                      companion beside = {}) {
    join_handle<void> dumps;
    join_handle<void> side;
    if (loop_group::current_index() == 0) {
        loop::current().catch_signal(SIGUSR1);
        dumps = loop::current().spawn(dump_on_sigusr1(stop), "dump on SIGUSR1");
        if (beside) side = loop::current().spawn(beside(stop), "companion");
    }
    connection_set connections;
    for (;;) {
        result<net::tcp_stream> stream = co_await listener.accept(stop);
        if (!stream) {
            if (stop.stop_requested()) break;
            logger()->warn("{}: accept: {}", name, stream.error().message());
            continue;
        }
        connections.spawn(handler(std::move(*stream), stop));
    }
    listener.close();
    co_await connections.wait_all();
    if (dumps.valid()) co_await dumps;
    if (side.valid()) co_await side;
    co_return 0;
}

/// A TCP service on options.threads loops: with 1, run_tcp_service on one
/// loop; with more (0: one per CPU), a loop_group whose loops share the
/// address as options.distribute says, each serving its connections with
/// `handler`, stopped together by SIGINT or SIGTERM. `on_group(group)` runs
/// before the loops start (per-loop state is sized there); `beside` runs on
/// the only loop, or loop 0. The exit status.
template <class Handler, class OnGroup>
int serve_tcp(const service_options& options, loop_options lo, std::string_view name, Handler handler, OnGroup on_group,
              companion beside = {}) {
    lo.backend = options.backend;
    if (options.threads == 1)
        return run_service_loop(lo, [&] { return run_tcp_service(options, name, handler, beside); });
    const int n = static_cast<int>(name.size());
    result<net::address> at = net::address::from_ip(options.host, options.port);
    if (!at) {
        std::fprintf(stderr, "%.*s: '%s' is not a numeric address\n", n, name.data(), options.host.c_str());
        return 2;
    }
    // Threads started from here inherit the mask: SIGUSR1 reaches loop 0's
    // wait only (the group blocks its stop signals itself).
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    ::pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
    loop_group_options go;
    go.threads = options.threads;
    go.loop = lo;
    std::optional<loop_group> group;
    group.emplace(go);
    result<net::shared_listener> listener = net::shared_listener::bind(*group, *at, options.distribute);
    if (!listener) {
        std::fprintf(stderr, "%.*s: cannot listen on %s: %s\n", n, name.data(), at->to_string().c_str(),
                     listener.error().message().c_str());
        return 1;
    }
    on_group(*group);
    std::printf("%.*s listening on %s (%zu loops, %.*s)\n", n, name.data(), listener->local_address().to_string().c_str(),
                group->size(), static_cast<int>(to_string(options.distribute).size()), to_string(options.distribute).data());
    std::fflush(stdout);
    try {
        return group->run([&](std::stop_token stop) -> task<int> {
            return serve_share(*listener, name, handler, std::move(stop), beside);
        });
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%.*s: %s\n", n, name.data(), e.what());
        return 1;
    }
}

/// For serve_tcp's `on_group` when the service keeps no state per loop.
inline void no_group_setup(loop_group&) noexcept {}

template <class Handler>
int serve_tcp(const service_options& options, const loop_options& lo, std::string_view name, Handler handler) {
    return serve_tcp(options, lo, name, std::move(handler), no_group_setup);
}

}  // namespace spindle::examples
