// spindle-chat: a line-based chat server. Every line a client sends goes to
// every other client, through a bounded queue per client; a client whose
// queue overflows is dropped as too slow, so it cannot hold back the others.
//
// Each connection is two tasks: the reader (this connection's lines, fanned
// out) and the writer (its queue, batched into large writes). There is no
// yield() anywhere: a reader whose input is always ready goes to the back of
// the ready queue after its budget of operations (loop_options::task_budget),
// so the writers keep up however fast the readers' input arrives.

#include "service.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

using namespace spindle;
using namespace spindle::examples;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t max_line = 4096;
// A writer sends at most this much at once: one syscall for many lines.
constexpr std::size_t write_batch = 64 * 1024;

struct chat_options {
    std::size_t queue = 1000;
    std::chrono::seconds idle_timeout{300};
    std::chrono::seconds write_timeout{10};
};

// One line, made once and shared by every queue it is in.
using line_ptr = std::shared_ptr<const std::string>;

line_ptr make_line(std::string text) { return std::make_shared<const std::string>(std::move(text)); }

struct client {
    client(std::uint64_t id, std::size_t queue_capacity) : id(id), name("guest-" + std::to_string(id)), queue(queue_capacity) {}

    std::uint64_t id;
    std::string name;
    channel<line_ptr> queue;
    std::stop_source reads;   // ends the reader: dropped as slow, or the server stops
    std::stop_source writes;  // ends the writer at once: dropped as slow
    bool dropped = false;
};

struct chat_stats {
    std::uint64_t joined = 0;
    std::uint64_t lines_in = 0;
    std::uint64_t lines_out = 0;  // lines put into a queue
    std::uint64_t dropped_slow = 0;
    std::uint64_t closed_idle = 0;
    std::size_t deepest_queue = 0;
};

class chat_room {
public:
    explicit chat_room(const chat_options& options) : m_options(options) {}

    const chat_options& options() const noexcept { return m_options; }
    chat_stats& stats() noexcept { return m_stats; }
    std::size_t size() const noexcept { return m_clients.size(); }

    std::shared_ptr<client> join() {
        auto c = std::make_shared<client>(++m_next_id, m_options.queue);
        m_clients.push_back(c);
        ++m_stats.joined;
        return c;
    }

    void leave(const client& c) {
        auto at = std::find_if(m_clients.begin(), m_clients.end(), [&](const auto& p) { return p.get() == &c; });
        if (at == m_clients.end()) return;
        *at = std::move(m_clients.back());
        m_clients.pop_back();
    }

    /// Puts `line` into the queue of every client but `from`. A full queue
    /// drops its client: it is not reading fast enough. `targets` is the
    /// caller's buffer, reused from line to line.
    task<void> broadcast(line_ptr line, const client* from, std::vector<std::shared_ptr<client>>& targets) {
        // The set may change while this task waits for its turn: send to the
        // clients there were, kept alive by `targets` (a closed queue refuses).
        targets.assign(m_clients.begin(), m_clients.end());
        for (const std::shared_ptr<client>& to : targets) {
            if (to.get() == from || to->dropped) continue;
            if (to->queue.size() >= to->queue.capacity()) {
                drop_slow(*to);
                continue;
            }
            // Completes at once (there is room), spending one unit of this
            // task's budget: a reader with much input takes turns with the writers.
            if (co_await to->queue.send(line)) {
                ++m_stats.lines_out;
                m_stats.deepest_queue = std::max(m_stats.deepest_queue, to->queue.size());
            }
        }
        targets.clear();
    }

    std::string stats_line() const {
        return "* stats: clients=" + std::to_string(m_clients.size()) + " joined=" + std::to_string(m_stats.joined) +
               " lines_in=" + std::to_string(m_stats.lines_in) + " lines_out=" + std::to_string(m_stats.lines_out) +
               " dropped_slow=" + std::to_string(m_stats.dropped_slow) + " closed_idle=" + std::to_string(m_stats.closed_idle) +
               " deepest_queue=" + std::to_string(m_stats.deepest_queue) + "/" + std::to_string(m_options.queue) + "\n";
    }

private:
    void drop_slow(client& c) {
        c.dropped = true;
        ++m_stats.dropped_slow;
        logger()->info("spindle-chat: {} dropped: its queue of {} lines is full", c.name, c.queue.capacity());
        c.reads.request_stop();
        c.writes.request_stop();
    }

    chat_options m_options;
    std::vector<std::shared_ptr<client>> m_clients;
    chat_stats m_stats;
    std::uint64_t m_next_id = 0;
};

std::span<const std::byte> bytes(std::string_view text) { return std::as_bytes(std::span(text.data(), text.size())); }

/// Sends the client's queue until it is closed and empty, many lines per write.
task<void> write_queue(net::tcp_stream& stream, client& c, std::chrono::seconds write_timeout) {
    std::string out;
    out.reserve(write_batch);
    for (;;) {
        result<line_ptr> first = co_await c.queue.receive();
        if (!first) break;  // closed and drained
        out.assign(**first);
        while (out.size() < write_batch) {
            result<line_ptr> more = c.queue.try_receive();
            if (!more) break;
            out += **more;
        }
        result<void> w = co_await with_timeout(write_timeout, stream.write_all(bytes(out), c.writes.get_token()));
        if (!w) {
            if (w.error() != std::errc::operation_canceled)
                logger()->debug("spindle-chat: {}: write: {}", c.name, w.error().message());
            c.reads.request_stop();  // the peer is gone or stuck: end the reader too
            break;
        }
    }
}

std::string_view trim_line(std::string_view line) {
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
    return line;
}

/// One command line (starting with '/'); false when the client asked to leave.
bool run_command(chat_room& room, client& c, std::string_view line) {
    auto reply = [&](std::string text) { (void)c.queue.try_send(make_line(std::move(text))); };
    if (line == "/quit") return false;
    if (line == "/stats") {
        reply(room.stats_line());
    } else if (line.starts_with("/nick ")) {
        std::string_view name = line.substr(6);
        if (name.empty() || name.size() > 32 || name.find_first_of(" \t") != std::string_view::npos) {
            reply("* a name is 1 to 32 characters without spaces\n");
        } else {
            c.name = name;
            reply("* you are now " + c.name + "\n");
        }
    } else {
        reply("* commands: /nick NAME, /stats, /quit\n");
    }
    return true;
}

task<void> serve_client(chat_room& room, net::tcp_stream stream, std::stop_token server_stop) {
    std::shared_ptr<client> me = room.join();
    std::stop_callback stop_reads(server_stop, [&me] { me->reads.request_stop(); });
    join_handle<void> writer =
        loop::current().spawn(write_queue(stream, *me, room.options().write_timeout), "chat writer " + me->name);
    (void)me->queue.try_send(make_line("* welcome, " + me->name + "; /nick NAME, /stats, /quit\n"));
    std::vector<std::shared_ptr<client>> targets;
    co_await room.broadcast(make_line("* " + me->name + " joined\n"), me.get(), targets);

    net::buffered_reader reader(stream);
    std::string said;
    for (;;) {
        result<std::string_view> line =
            co_await with_timeout(room.options().idle_timeout, reader.read_until("\n", max_line, me->reads.get_token()));
        if (!line) {
            if (line.error() == std::errc::timed_out) {
                ++room.stats().closed_idle;
                (void)me->queue.try_send(make_line("* closed: idle for too long\n"));
            } else if (line.error() == net::errc::line_too_long) {
                (void)me->queue.try_send(make_line("* closed: a line is at most 4096 bytes\n"));
            }
            break;
        }
        const std::string_view text = trim_line(*line);
        if (text.empty()) continue;
        if (text.front() == '/') {
            if (!run_command(room, *me, text)) break;
            continue;
        }
        ++room.stats().lines_in;
        said.assign(me->name).append(": ").append(text).append("\n");
        co_await room.broadcast(make_line(said), me.get(), targets);
    }

    room.leave(*me);
    if (server_stop.stop_requested() && !me->dropped) (void)me->queue.try_send(make_line("* server shutting down\n"));
    if (!me->dropped) co_await room.broadcast(make_line("* " + me->name + " left\n"), me.get(), targets);
    // The writer sends what is still queued, then ends; a dropped client's
    // writer has been told to stop at once.
    me->queue.close();
    co_await writer;
}

std::string parse_number(std::string_view text, long lo, long hi, long& out) {
    long v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi)
        return "not a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
    out = v;
    return {};
}

std::string parse_seconds(std::string_view text, long lo, long hi, std::chrono::seconds& out) {
    long v = 0;
    std::string why = parse_number(text, lo, hi, v);
    if (why.empty()) out = std::chrono::seconds(v);
    return why;
}

}  // namespace

int main(int argc, char** argv) {
    chat_options chat;
    const std::array flags{
        service_flag{"--queue", "LINES", "lines queued per client before it is dropped as too slow, 1 to 1000000 (default 1000)",
                     [&](std::string_view text) {
                         long n = 0;
                         std::string why = parse_number(text, 1, 1'000'000, n);
                         chat.queue = static_cast<std::size_t>(n);
                         return why;
                     }},
        service_flag{"--idle-timeout", "SECONDS", "close a client silent this long, 1 to 86400 (default 300)",
                     [&](std::string_view text) { return parse_seconds(text, 1, 86'400, chat.idle_timeout); }},
        service_flag{"--write-timeout", "SECONDS", "drop a client that takes a write this long, 1 to 3600 (default 10)",
                     [&](std::string_view text) { return parse_seconds(text, 1, 3600, chat.write_timeout); }},
    };
    const service_options options = parse_service_options(
        argc, argv,
        {.name = "spindle-chat",
         .description = "A line-based chat server: each line a client sends goes to every other client.",
         .default_port = 7009,
         .extra_help = "\nLines are at most 4096 bytes. Others see \"NAME: TEXT\"; the server's own lines start\n"
                       "with \"* \". Commands: /nick NAME, /stats (counters of the server), /quit.\n"
                       "A client whose queue of lines to send overflows is dropped as too slow.\n",
         .flags = flags});
    loop_options lo;
    lo.backend = options.backend;
    chat_room room(chat);
    return run_service_loop(lo, [&] {
        return run_tcp_service(options, "spindle-chat", [&room](net::tcp_stream stream, std::stop_token stop) {
            return serve_client(room, std::move(stream), stop);
        });
    });
}
