/* What the libuv peers (uv-echo, uv-http) share: the command line
 * spindle-echo-bench gives a server, the listener, the announcement
 * "NAME listening on HOST:PORT", and a clean exit (status 0) on SIGINT or
 * SIGTERM, which closes every handle (a handle's data, if set, is freed). */
#ifndef SPINDLE_PEERS_UV_SERVER_H
#define SPINDLE_PEERS_UV_SERVER_H

#include <uv.h>

/* Runs one loop serving connections with `on_connection`, which accepts
 * from the listener it is given; returns the process's exit status. */
int uv_server_main(int argc, char** argv, const char* name, int default_port, uv_connection_cb on_connection);

#endif
