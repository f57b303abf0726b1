#include <spindle/tls/stream.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>

namespace spindle::tls {

namespace detail {

result<void> request_key_update(session& s, bool peer_too) {
    ERR_clear_error();
    if (SSL_key_update(s.native_handle(), peer_too ? SSL_KEY_UPDATE_REQUESTED : SSL_KEY_UPDATE_NOT_REQUESTED) != 1)
        return take_openssl_error(make_error_code(std::errc::operation_not_supported));
    return {};
}

}  // namespace detail

template class stream<net::tcp_stream>;

task<result<tcp_stream>> connect(context ctx, net::address peer, std::string server_name, std::stop_token token) {
    result<net::tcp_stream> tcp = co_await net::tcp_stream::connect(peer, token);
    if (!tcp) co_return tcp.error();
    (void)tcp->set_nodelay(true);
    result<tcp_stream> tls = tcp_stream::client(ctx, std::move(*tcp), server_name);
    if (!tls) co_return tls.error();
    if (result<void> h = co_await tls->handshake(token); !h) co_return h.error();
    co_return std::move(*tls);
}

task<result<tcp_stream>> connect(context ctx, std::string host, std::uint16_t port, std::stop_token token) {
    result<net::tcp_stream> tcp = co_await net::tcp_stream::connect(host, std::to_string(port));
    if (!tcp) co_return tcp.error();
    (void)tcp->set_nodelay(true);
    result<tcp_stream> tls = tcp_stream::client(ctx, std::move(*tcp), host);
    if (!tls) co_return tls.error();
    if (result<void> h = co_await tls->handshake(token); !h) co_return h.error();
    co_return std::move(*tls);
}

}  // namespace spindle::tls
