// asio-echo: the TCP echo server of spindle-echo, written on Boost.Asio with
// C++20 coroutines the way Asio's own examples write it, for side-by-side runs
// under spindle-echo-bench (--server). One io_context on one thread; a
// coroutine per connection reads into its own 16 KiB buffer and writes back
// what came. Takes the command line spindle-echo-bench gives a server
// (--backend is accepted and ignored: Asio uses epoll on Linux), prints
// "asio-echo listening on HOST:PORT", and exits 0 on SIGINT or SIGTERM.

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace asio = boost::asio;
using asio::ip::tcp;

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

asio::awaitable<void> listen(tcp::acceptor& acceptor) {
    for (;;) {
        boost::system::error_code ec;
        tcp::socket socket = co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
        if (ec == asio::error::operation_aborted) co_return;
        if (ec) continue;
        asio::co_spawn(acceptor.get_executor(), echo(std::move(socket)), asio::detached);
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::string host = "127.0.0.1";
    unsigned short port = 7007;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--host") == 0)
            host = argv[i + 1];
        else if (std::strcmp(argv[i], "--port") == 0)
            port = static_cast<unsigned short>(std::atoi(argv[i + 1]));
        else if (std::strcmp(argv[i], "--backend") != 0) {
            std::fprintf(stderr, "usage: asio-echo [--host ADDRESS] [--port N] [--backend IGNORED]\n");
            return 2;
        }
    }
    asio::io_context io(1);
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address(host), port));
    asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](const boost::system::error_code&, int) { io.stop(); });
    std::printf("asio-echo listening on %s:%u\n", host.c_str(), static_cast<unsigned>(acceptor.local_endpoint().port()));
    std::fflush(stdout);
    asio::co_spawn(io, listen(acceptor), asio::detached);
    io.run();
    return 0;
}
