#pragma once
/// What TCP and Unix listeners share: binding options and the accept loop.
///
/// Running out of descriptors (EMFILE, ENFILE) or kernel memory (ENOBUFS,
/// ENOMEM) while accepting is not returned to the caller: accept() waits with
/// a back-off (1 ms doubling to 100 ms) and tries again, so a server neither
/// spins nor stops; connections wait in the kernel's backlog meanwhile and are
/// accepted once descriptors free up. The first failure of an episode is
/// logged at warn level. Transient errors of one connection (ECONNABORTED,
/// EPROTO) are skipped.
///
/// connections(listener, token) turns any listener's accept() into a stream:
///
///     auto incoming = net::connections(listener, stop);
///     while (auto c = co_await incoming.next()) {
///         if (*c) group.spawn(serve(std::move(**c)));
///         else log(c->error());
///     }

#include <spindle/net/socket.hpp>
#include <spindle/async_generator.hpp>
#include <spindle/task.hpp>

#include <stop_token>
#include <system_error>
#include <utility>

namespace spindle::net {

struct listen_options {
    int backlog = 1024;
    bool reuse_address = true;  ///< SO_REUSEADDR (TCP): rebind while old connections linger
    bool reuse_port = false;    ///< SO_REUSEPORT (TCP): several listeners share the port
    /// TCP_NODELAY on every accepted connection (TCP): small writes go at once
    /// instead of waiting, under Nagle's rule, for the peer's delayed ACK
    /// (some 40 ms on Linux). Set on the listener, which accepted sockets
    /// inherit: no system call per connection.
    bool no_delay = true;
};

namespace detail {

struct accepted {
    unique_fd fd;
    address peer;
};

/// Binds and listens on a new socket of `type` for `at`.
result<unique_fd> listen_on(const address& at, const listen_options& options);
/// Whether a TCP socket bound without SO_REUSEPORT could take `at` now: the
/// bind's error if not (address_in_use when another socket holds the port).
/// Nothing to check for port 0 or a Unix address.
result<void> probe_port(const address& at) noexcept;
/// The accept loop described above, on the listening descriptor `listener`,
/// which must outlive the call. Closing it ends the call with
/// operation_canceled, during a back-off too.
task<result<accepted>> accept_from(const unique_fd& listener, std::stop_token token);

/// What `listener.accept(token)` gives: result<tcp_stream>, result<unix_stream>.
template <class Listener>
using accept_result_t = typename decltype(std::declval<Listener&>().accept(std::declval<std::stop_token>()))::value_type;

}  // namespace detail

/// Every connection `listener` (a tcp_listener, unix_listener or
/// shared_listener) accepts, in turn: `listener.accept(token)` again and
/// again, one task frame per connection from the frame pool. A cancellation
/// ends the stream without a value: `token` stopped, the listener closed, or
/// the consumer's own cancel reaching the accept (next(token), with_timeout
/// around next(), join_handle::cancel: a new connections() goes on); any
/// other failure of accept is yielded once, then the stream ends. A yielded connection may be moved out
/// (`std::move(**c)`). `listener` must outlive the generator.
template <class Listener>
async_generator<detail::accept_result_t<Listener>> connections(Listener& listener, std::stop_token token = {}) {
    for (;;) {
        detail::accept_result_t<Listener> c = co_await listener.accept(token);
        if (!c && c.error() == std::errc::operation_canceled) co_return;
        const bool failed = !c;
        co_yield c;
        if (failed) co_return;
    }
}

}  // namespace spindle::net
