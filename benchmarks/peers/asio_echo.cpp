// asio-echo: the TCP echo server of spindle-echo, written on Boost.Asio with
// C++20 coroutines the way Asio's own examples write it, for side-by-side runs
// under spindle-echo-bench (--server). One io_context on one thread; a
// coroutine per connection reads into its own 16 KiB buffer and writes back
// what came. Takes the command line spindle-echo-bench gives a server
// (--backend is accepted and ignored: Asio uses epoll on Linux), prints
// "asio-echo listening on HOST:PORT", and exits 0 on SIGINT or SIGTERM.

#include "asio_server.hpp"

#include <array>

using namespace peers;

namespace {

asio::awaitable<void> echo(tcp::socket socket) {
    socket.set_option(tcp::no_delay(true));
    std::array<char, 16 * 1024> buffer;
    for (;;) {
        boost::system::error_code ec;
        const std::size_t n = co_await socket.async_read_some(asio::buffer(buffer), asio::redirect_error(asio::use_awaitable, ec));
        if (ec) co_return;
        co_await asio::async_write(socket, asio::buffer(buffer.data(), n), asio::redirect_error(asio::use_awaitable, ec));
        if (ec) co_return;
    }
}

}  // namespace

int main(int argc, char** argv) { return peers::server_main(argc, argv, "asio-echo", 7007, echo); }
