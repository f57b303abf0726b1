#pragma once
// What the Asio peers (asio-echo, asio-http) share: the command line
// spindle-echo-bench gives a server, one io_context on one thread, a
// coroutine per connection accepted, the announcement "NAME listening on
// HOST:PORT", and a clean exit (status 0) on SIGINT or SIGTERM.

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace peers {

namespace asio = boost::asio;
using asio::ip::tcp;

template <class Serve>
asio::awaitable<void> accept_each(tcp::acceptor& acceptor, Serve serve) {
    for (;;) {
        boost::system::error_code ec;
        tcp::socket socket = co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
        if (ec == asio::error::operation_aborted) co_return;
        if (ec) continue;
        asio::co_spawn(acceptor.get_executor(), serve(std::move(socket)), asio::detached);
    }
}

/// Serves every connection with `serve(tcp::socket)`, an asio::awaitable<void>;
/// returns the process's exit status.
template <class Serve>
int server_main(int argc, char** argv, const char* name, unsigned short default_port, Serve serve) {
    std::string host = "127.0.0.1";
    unsigned short port = default_port;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 < argc && std::strcmp(argv[i], "--host") == 0)
            host = argv[i + 1];
        else if (i + 1 < argc && std::strcmp(argv[i], "--port") == 0)
            port = static_cast<unsigned short>(std::atoi(argv[i + 1]));
        else if (i + 1 >= argc || std::strcmp(argv[i], "--backend") != 0) {
            std::fprintf(stderr, "usage: %s [--host ADDRESS] [--port N] [--backend IGNORED]\n", name);
            return 2;
        }
    }
    asio::io_context io(1);
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address(host), port));
    asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](const boost::system::error_code&, int) { io.stop(); });
    std::printf("%s listening on %s:%u\n", name, host.c_str(), static_cast<unsigned>(acceptor.local_endpoint().port()));
    std::fflush(stdout);
    asio::co_spawn(io, accept_each(acceptor, serve), asio::detached);
    io.run();
    return 0;
}

}  // namespace peers
