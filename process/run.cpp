#include <spindle/process.hpp>
#include <spindle/when_all.hpp>

#include <array>
#include <cstddef>

namespace spindle::process {

namespace {

/// Reads `from` to its end, keeping at most `limit` bytes: more is read and
/// dropped, so the child never blocks on a full pipe.
task<result<void>> drain(net::unix_stream& from, std::string& into, std::size_t limit, std::stop_token token) {
    std::array<std::byte, 16 * 1024> buf;
    for (;;) {
        result<std::size_t> n = co_await from.read_some(buf, token);
        if (!n) co_return n.error();
        if (*n == 0) co_return result<void>{};
        const std::size_t kept = std::min(*n, limit - std::min(limit, into.size()));
        into.append(reinterpret_cast<const char*>(buf.data()), kept);
    }
}

}  // namespace

task<result<output>> run(std::string program, std::vector<std::string> args, spawn_options options, std::size_t limit,
                         std::stop_token token) {
    options.stdout_to = stdio::pipe();
    options.stderr_to = stdio::pipe();
    // Nobody would write to a stdin pipe here: the child gets end of input.
    if (options.stdin_from.how() == stdio::kind::pipe) options.stdin_from = stdio::null();
    result<child> c = spawn(program, args, options);
    if (!c) co_return c.error();
    output o;
    // Both at once: a child that fills stderr while stdout is being read
    // would otherwise block, and so would this task.
    auto [out, err] =
        co_await when_all(drain(c->stdout_pipe(), o.out, limit, token), drain(c->stderr_pipe(), o.err, limit, token));
    if (!out) co_return out.error();
    if (!err) co_return err.error();
    result<exit_status> status = co_await c->wait(token);
    if (!status) co_return status.error();
    o.status = *status;
    co_return o;
}

}  // namespace spindle::process
