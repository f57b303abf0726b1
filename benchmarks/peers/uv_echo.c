/* uv-echo: the TCP echo server of spindle-echo, written on libuv, for
 * side-by-side runs under spindle-echo-bench (--server). One loop; each
 * connection owns a 16 KiB read buffer and one write request. A read is
 * written back with uv_try_write (as spindle's send is tried first); what the
 * socket does not take goes out through uv_write, with reading stopped until
 * it is done, so a connection never holds more than one buffer. Takes the
 * command line spindle-echo-bench gives a server (--backend is accepted and
 * ignored: libuv uses epoll on Linux), prints "uv-echo listening on
 * HOST:PORT", and exits 0 on SIGINT or SIGTERM. */

#include "uv_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { buffer_size = 16 * 1024 };

typedef struct {
    uv_tcp_t tcp;
    uv_write_t write;
    char buffer[buffer_size];
} connection;

static void on_read(uv_stream_t* stream, ssize_t n, const uv_buf_t* buf);

static void on_alloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf) {
    (void)suggested;
    connection* c = handle->data;
    *buf = uv_buf_init(c->buffer, buffer_size);
}

static void on_written(uv_write_t* req, int status) {
    connection* c = req->data;
    if (status < 0) {
        uv_server_close((uv_stream_t*)&c->tcp);
        return;
    }
    uv_read_start((uv_stream_t*)&c->tcp, on_alloc, on_read);
}

static void on_read(uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
    connection* c = stream->data;
    if (n < 0) {
        uv_server_close(stream);
        return;
    }
    if (n == 0) return;
    uv_buf_t out = uv_buf_init(buf->base, (unsigned)n);
    int sent = uv_try_write(stream, &out, 1);
    if (sent == n) return;
    if (sent < 0 && sent != UV_EAGAIN) {
        uv_server_close(stream);
        return;
    }
    if (sent > 0) out = uv_buf_init(buf->base + sent, (unsigned)(n - sent));
    uv_read_stop(stream);
    c->write.data = c;
    if (uv_write(&c->write, stream, &out, 1, on_written) != 0) uv_server_close(stream);
}

static void on_connection(uv_stream_t* server, int status) {
    if (status < 0) return;
    connection* c = malloc(sizeof *c);
    if (!c) return;
    uv_server_accept(server, &c->tcp, c, on_alloc, on_read);
}

int main(int argc, char** argv) { return uv_server_main(argc, argv, "uv-echo", 7007, on_connection); }
