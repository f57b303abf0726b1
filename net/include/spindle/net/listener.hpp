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

#include <spindle/net/socket.hpp>
#include <spindle/task.hpp>

#include <stop_token>

namespace spindle::net {

struct listen_options {
    int backlog = 1024;
    bool reuse_address = true;  ///< SO_REUSEADDR (TCP): rebind while old connections linger
    bool reuse_port = false;    ///< SO_REUSEPORT (TCP): several listeners share the port
};

namespace detail {

struct accepted {
    unique_fd fd;
    address peer;
};

/// Binds and listens on a new socket of `type` for `at`.
result<unique_fd> listen_on(const address& at, const listen_options& options);
/// The accept loop described above, on the listening descriptor `listener`,
/// which must outlive the call. Closing it ends the call with
/// operation_canceled, during a back-off too.
task<result<accepted>> accept_from(const unique_fd& listener, std::stop_token token);

}  // namespace detail

}  // namespace spindle::net
