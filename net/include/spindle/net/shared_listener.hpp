#pragma once
/// One TCP address served by every loop of a loop_group (docs/multicore.md).
///
///     auto listener = net::shared_listener::bind(group, at, net::distribution::least_loaded);
///     group.run([&](std::stop_token stop) -> task<void> {
///         while (auto s = co_await listener->accept(stop)) serve(std::move(*s));
///     });
///
/// Bound before run(), so the port (0 picks one) is known and printed once.
/// Each loop's accept() gives the connections meant for that loop, as
/// tcp_streams owned by it from then on; the distribution says which:
///
/// - reuseport (the default): a listening socket per loop, all bound with
///   SO_REUSEPORT; the kernel spreads connections over them by a hash of
///   the addresses. Nothing crosses loops, but the hash can leave one loop
///   with many more connections than another.
/// - least_loaded: one listening socket; the first loop to call accept()
///   accepts from it and hands each connection to the accepting loop with
///   the fewest live connections (closed ones no longer count), over a
///   cross-loop call. Even, at the cost of a call per connection.
///
/// A live connection is a tcp_stream accept() gave that is still open; the
/// listener (a copy of it) must outlive the streams it gave, which count
/// themselves in it. Under least_loaded, the accepting loop accepts until
/// the stop token of its first accept() call is requested.
/// accept() takes a stop token; with it requested (or close()), it gives
/// operation_canceled. Every loop that should receive connections calls
/// accept(); least_loaded hands connections only to loops that have.

#include <spindle/net/address.hpp>
#include <spindle/net/listener.hpp>
#include <spindle/net/tcp.hpp>
#include <spindle/result.hpp>
#include <spindle/task.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <stop_token>
#include <string_view>

namespace spindle {
class loop_group;
}

namespace spindle::net {

enum class distribution { reuseport, least_loaded };

std::string_view to_string(distribution d) noexcept;
/// "reuseport" or "least-loaded" (also "least_loaded").
std::optional<distribution> distribution_from_string(std::string_view name) noexcept;

class shared_listener {
public:
    /// Binds `at` for the loops of `group` (any thread, before group.run()).
    static result<shared_listener> bind(const loop_group& group, const address& at,
                                        distribution d = distribution::reuseport, listen_options options = {});

    /// The next connection for the loop of the calling task.
    task<result<tcp_stream>> accept(std::stop_token token = {});

    /// The bound address (the port picked for port 0).
    const address& local_address() const noexcept;
    distribution mode() const noexcept;
    /// Live connections of loop `index` (any thread; a snapshot).
    std::size_t live(std::size_t index) const noexcept;
    /// The busiest loop's live connections over the mean (1 is even; 0
    /// with none).
    double imbalance() const noexcept;
    /// On a loop of the group: this loop's share is closed, its accept() in
    /// progress gives operation_canceled and least_loaded hands it nothing
    /// more (reuseport: its socket is closed; least_loaded, on the accepting
    /// loop: the one socket too). Open connections stay open.
    void close() noexcept;

    struct state;

private:
    explicit shared_listener(std::shared_ptr<state> s) noexcept : m_state(std::move(s)) {}
    std::shared_ptr<state> m_state;
};

}  // namespace spindle::net
