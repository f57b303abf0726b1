/* uv-echo: the TCP echo server of spindle-echo, written on libuv, for
 * side-by-side runs under spindle-echo-bench (--server). One loop; each
 * connection owns a 16 KiB read buffer and one write request. A read is
 * written back with uv_try_write (as spindle's send is tried first); what the
 * socket does not take goes out through uv_write, with reading stopped until
 * it is done, so a connection never holds more than one buffer. Takes the
 * command line spindle-echo-bench gives a server (--backend is accepted and
 * ignored: libuv uses epoll on Linux), prints "uv-echo listening on
 * HOST:PORT", and exits 0 on SIGINT or SIGTERM. */

#include <uv.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { buffer_size = 16 * 1024 };

typedef struct {
    uv_tcp_t tcp;
    uv_write_t write;
    char buffer[buffer_size];
} connection;

static uv_tcp_t listener;
static uv_signal_t sigint_watcher, sigterm_watcher;

static void on_read(uv_stream_t* stream, ssize_t n, const uv_buf_t* buf);

static void on_close(uv_handle_t* handle) { free(handle->data); }

static void on_alloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf) {
    (void)suggested;
    connection* c = handle->data;
    *buf = uv_buf_init(c->buffer, buffer_size);
}

static void on_written(uv_write_t* req, int status) {
    connection* c = req->data;
    if (status < 0) {
        uv_close((uv_handle_t*)&c->tcp, on_close);
        return;
    }
    uv_read_start((uv_stream_t*)&c->tcp, on_alloc, on_read);
}

static void on_read(uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
    connection* c = stream->data;
    if (n < 0) {
        uv_close((uv_handle_t*)stream, on_close);
        return;
    }
    if (n == 0) return;
    uv_buf_t out = uv_buf_init(buf->base, (unsigned)n);
    int sent = uv_try_write(stream, &out, 1);
    if (sent == n) return;
    if (sent < 0 && sent != UV_EAGAIN) {
        uv_close((uv_handle_t*)stream, on_close);
        return;
    }
    if (sent > 0) out = uv_buf_init(buf->base + sent, (unsigned)(n - sent));
    uv_read_stop(stream);
    c->write.data = c;
    if (uv_write(&c->write, stream, &out, 1, on_written) != 0) uv_close((uv_handle_t*)stream, on_close);
}

static void on_connection(uv_stream_t* server, int status) {
    if (status < 0) return;
    connection* c = malloc(sizeof *c);
    if (!c) return;
    uv_tcp_init(server->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t*)&c->tcp) != 0) {
        uv_close((uv_handle_t*)&c->tcp, on_close);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t*)&c->tcp, on_alloc, on_read);
}

static void on_any_close(uv_handle_t* handle) {
    if (handle->data && handle != (uv_handle_t*)&listener && handle != (uv_handle_t*)&sigint_watcher &&
        handle != (uv_handle_t*)&sigterm_watcher)
        free(handle->data);
}

static void close_each(uv_handle_t* handle, void* arg) {
    (void)arg;
    if (!uv_is_closing(handle)) uv_close(handle, on_any_close);
}

static void on_signal(uv_signal_t* watcher, int signum) {
    (void)signum;
    uv_walk(watcher->loop, close_each, NULL);
}

int main(int argc, char** argv) {
    const char* host = "127.0.0.1";
    int port = 7007;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--host") == 0)
            host = argv[i + 1];
        else if (strcmp(argv[i], "--port") == 0)
            port = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--backend") != 0) {
            fprintf(stderr, "usage: uv-echo [--host ADDRESS] [--port N] [--backend IGNORED]\n");
            return 2;
        }
    }
    uv_loop_t* loop = uv_default_loop();
    struct sockaddr_in at;
    if (uv_ip4_addr(host, port, &at) != 0) return 2;
    uv_tcp_init(loop, &listener);
    listener.data = NULL;
    if (uv_tcp_bind(&listener, (const struct sockaddr*)&at, 0) != 0 || uv_listen((uv_stream_t*)&listener, 4096, on_connection) != 0) {
        fprintf(stderr, "uv-echo: cannot listen on %s:%d\n", host, port);
        return 1;
    }
    struct sockaddr_storage bound;
    int len = sizeof bound;
    uv_tcp_getsockname(&listener, (struct sockaddr*)&bound, &len);
    uv_signal_init(loop, &sigint_watcher);
    uv_signal_init(loop, &sigterm_watcher);
    sigint_watcher.data = sigterm_watcher.data = NULL;
    uv_signal_start(&sigint_watcher, on_signal, SIGINT);
    uv_signal_start(&sigterm_watcher, on_signal, SIGTERM);
    printf("uv-echo listening on %s:%d\n", host, ntohs(((struct sockaddr_in*)&bound)->sin_port));
    fflush(stdout);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    return 0;
}
