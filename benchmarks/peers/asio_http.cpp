// asio-http: the HTTP/1.1 keep-alive server of spindle-http's GET /, written
// on Boost.Asio with C++20 coroutines, for side-by-side runs under
// spindle-echo-bench --mode http (--server). One io_context on one thread; a
// coroutine per connection reads into its own 16 KiB buffer, answers every
// complete request in it (pipelining: a request ends at its blank line; GET /
// gets what spindle-http sends, 97 bytes with its longer Server name, and
// anything else 404 and the connection closed) into one output buffer, and
// writes that once. A head
// over 16 KiB is refused (431). It parses less than spindle-http (nothing
// beyond the blank line that ends a head), so it is the cheaper of the two by
// construction. Takes the command line spindle-echo-bench gives a server
// (--backend is accepted and ignored: Asio uses epoll on Linux), prints
// "asio-http listening on HOST:PORT", and exits 0 on SIGINT or SIGTERM.

#include "asio_server.hpp"

#include <array>
#include <cstring>
#include <string>
#include <string_view>

using namespace peers;

namespace {

constexpr std::string_view ok_response =
    "HTTP/1.1 200 OK\r\nServer: asio-http\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n\r\nHello, World!";
constexpr std::string_view not_found = "HTTP/1.1 404 Not Found\r\nServer: asio-http\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
constexpr std::string_view too_large =
    "HTTP/1.1 431 Request Header Fields Too Large\r\nServer: asio-http\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

asio::awaitable<void> serve(tcp::socket socket) {
    socket.set_option(tcp::no_delay(true));
    std::array<char, 16 * 1024> input;
    std::size_t buffered = 0;
    std::string output;
    for (;;) {
        boost::system::error_code ec;
        const std::size_t n = co_await socket.async_read_some(asio::buffer(input.data() + buffered, input.size() - buffered),
                                                              asio::redirect_error(asio::use_awaitable, ec));
        if (ec) co_return;
        const std::string_view in(input.data(), buffered + n);
        output.clear();
        bool close = false;
        std::size_t at = 0;
        for (;;) {
            const std::size_t end = in.find("\r\n\r\n", at);
            if (end == std::string_view::npos) break;
            const bool found = in.substr(at, end - at).starts_with("GET / ");
            output += found ? ok_response : not_found;
            at = end + 4;
            if (!found) {
                close = true;
                break;
            }
        }
        buffered = in.size() - at;
        if (buffered == input.size()) {
            output += too_large;
            close = true;
        } else if (buffered > 0 && at > 0) {
            std::memmove(input.data(), input.data() + at, buffered);
        }
        if (!output.empty()) {
            co_await asio::async_write(socket, asio::buffer(output), asio::redirect_error(asio::use_awaitable, ec));
            if (ec) co_return;
        }
        if (close) co_return;
    }
}

}  // namespace

int main(int argc, char** argv) { return peers::server_main(argc, argv, "asio-http", 8080, serve); }
