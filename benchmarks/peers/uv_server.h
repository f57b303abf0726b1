/* What the libuv peers (uv-echo, uv-http) share: the command line
 * spindle-echo-bench gives a server, the listener, the announcement
 * "NAME listening on HOST:PORT", and a clean exit (status 0) on SIGINT or
 * SIGTERM, which closes every handle (a handle's data, if set, is freed). */
#ifndef SPINDLE_PEERS_UV_SERVER_H
#define SPINDLE_PEERS_UV_SERVER_H

#include <uv.h>

/* Accepts a connection from `server` into `tcp`, whose handle's data is set
 * to `data` (the connection, freed when the handle closes), with Nagle off,
 * and starts reading; false (the handle closing) if the accept failed. */
int uv_server_accept(uv_stream_t* server, uv_tcp_t* tcp, void* data, uv_alloc_cb on_alloc, uv_read_cb on_read);

/* Closes the connection's handle; its data is freed once it is closed. */
void uv_server_close(uv_stream_t* stream);

/* Runs one loop serving connections with `on_connection`, which accepts
 * from the listener it is given; returns the process's exit status. */
int uv_server_main(int argc, char** argv, const char* name, int default_port, uv_connection_cb on_connection);

#endif
