#include "uv_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uv_tcp_t listener;
static uv_signal_t sigint_watcher, sigterm_watcher;

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

static void free_data(uv_handle_t* handle) { free(handle->data); }

void uv_server_close(uv_stream_t* stream) { uv_close((uv_handle_t*)stream, free_data); }

int uv_server_accept(uv_stream_t* server, uv_tcp_t* tcp, void* data, uv_alloc_cb on_alloc, uv_read_cb on_read) {
    uv_tcp_init(server->loop, tcp);
    tcp->data = data;
    if (uv_accept(server, (uv_stream_t*)tcp) != 0) {
        uv_server_close((uv_stream_t*)tcp);
        return 0;
    }
    uv_tcp_nodelay(tcp, 1);
    uv_read_start((uv_stream_t*)tcp, on_alloc, on_read);
    return 1;
}

int uv_server_main(int argc, char** argv, const char* name, int default_port, uv_connection_cb on_connection) {
    const char* host = "127.0.0.1";
    int port = default_port;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 < argc && strcmp(argv[i], "--host") == 0)
            host = argv[i + 1];
        else if (i + 1 < argc && strcmp(argv[i], "--port") == 0)
            port = atoi(argv[i + 1]);
        else if (i + 1 >= argc || strcmp(argv[i], "--backend") != 0) {
            fprintf(stderr, "usage: %s [--host ADDRESS] [--port N] [--backend IGNORED]\n", name);
            return 2;
        }
    }
    uv_loop_t* loop = uv_default_loop();
    struct sockaddr_in at;
    if (uv_ip4_addr(host, port, &at) != 0) return 2;
    uv_tcp_init(loop, &listener);
    listener.data = NULL;
    if (uv_tcp_bind(&listener, (const struct sockaddr*)&at, 0) != 0 || uv_listen((uv_stream_t*)&listener, 4096, on_connection) != 0) {
        fprintf(stderr, "%s: cannot listen on %s:%d\n", name, host, port);
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
    printf("%s listening on %s:%d\n", name, host, ntohs(((struct sockaddr_in*)&bound)->sin_port));
    fflush(stdout);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    return 0;
}
