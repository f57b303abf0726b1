/* uv-http: the HTTP/1.1 keep-alive server of spindle-http's GET /, written on
 * libuv, for side-by-side runs under spindle-echo-bench --mode http
 * (--server). One loop; each connection owns a 16 KiB input buffer and an
 * output buffer. Per read it answers every complete request in the input
 * (pipelining: a request ends at its blank line; GET / gets the same 95 bytes
 * spindle-http sends, anything else 404 and the connection closed) into the
 * output buffer and writes that once, with uv_try_write first (as spindle's
 * send is tried first); what the socket does not take goes out through
 * uv_write, with reading stopped until it is done. A head over 16 KiB is
 * refused (431) and the connection closed. It parses less than spindle-http
 * (no headers beyond the blank line that ends them), so it is the cheaper of
 * the two by construction. Takes the command line spindle-echo-bench gives a
 * server (--backend is accepted and ignored: libuv uses epoll on Linux),
 * prints "uv-http listening on HOST:PORT", and exits 0 on SIGINT or SIGTERM. */

#include "uv_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The shortest head answered 200 is "GET / " and its blank line, 10 bytes:
 * the output holds the answers to a full input of them. */
enum { input_size = 16 * 1024, output_size = (input_size / 10 + 1) * 128 };

static const char ok_response[] =
    "HTTP/1.1 200 OK\r\nServer: uv-http\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n\r\nHello, World!";
static const char not_found[] =
    "HTTP/1.1 404 Not Found\r\nServer: uv-http\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
static const char too_large[] =
    "HTTP/1.1 431 Request Header Fields Too Large\r\nServer: uv-http\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

typedef struct {
    uv_tcp_t tcp;
    uv_write_t write;
    int closing_after_write;
    size_t buffered; /* bytes of an unfinished request at the start of input */
    char input[input_size];
    char output[output_size];
} connection;

static void on_read(uv_stream_t* stream, ssize_t n, const uv_buf_t* buf);

static void on_alloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf) {
    (void)suggested;
    connection* c = handle->data;
    *buf = uv_buf_init(c->input + c->buffered, (unsigned)(input_size - c->buffered));
}

static void on_written(uv_write_t* req, int status) {
    connection* c = req->data;
    if (status < 0 || c->closing_after_write) {
        uv_server_close((uv_stream_t*)&c->tcp);
        return;
    }
    uv_read_start((uv_stream_t*)&c->tcp, on_alloc, on_read);
}

/* The end of the head that starts at `p` (just past its blank line), or NULL. */
static const char* head_end(const char* p, const char* end) {
    for (const char* q = p; q + 4 <= end; ++q) {
        q = memchr(q, '\r', (size_t)(end - q));
        if (!q || q + 4 > end) return NULL;
        if (q[1] == '\n' && q[2] == '\r' && q[3] == '\n') return q + 4;
    }
    return NULL;
}

static void on_read(uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
    (void)buf;
    connection* c = stream->data;
    if (n < 0) {
        uv_server_close(stream);
        return;
    }
    if (n == 0) return;
    const char* p = c->input;
    const char* end = c->input + c->buffered + n;
    size_t out = 0;
    int close_after = 0;
    for (;;) {
        const char* next = head_end(p, end);
        if (!next) break;
        const int found = (size_t)(next - p) >= 6 && memcmp(p, "GET / ", 6) == 0;
        const char* reply = found ? ok_response : not_found;
        const size_t size = found ? sizeof ok_response - 1 : sizeof not_found - 1;
        memcpy(c->output + out, reply, size);
        out += size;
        p = next;
        if (!found) {
            close_after = 1;
            break;
        }
    }
    c->buffered = (size_t)(end - p);
    if (c->buffered == input_size) {
        memcpy(c->output + out, too_large, sizeof too_large - 1);
        out += sizeof too_large - 1;
        close_after = 1;
    } else if (c->buffered > 0 && p != c->input) {
        memmove(c->input, p, c->buffered);
    }
    if (out == 0) return;
    uv_buf_t pending = uv_buf_init(c->output, (unsigned)out);
    int sent = uv_try_write(stream, &pending, 1);
    if (sent == (int)out && !close_after) return;
    if (sent == (int)out || (sent < 0 && sent != UV_EAGAIN)) {
        uv_server_close(stream);
        return;
    }
    if (sent > 0) pending = uv_buf_init(c->output + sent, (unsigned)(out - (size_t)sent));
    uv_read_stop(stream);
    c->closing_after_write = close_after;
    c->write.data = c;
    if (uv_write(&c->write, stream, &pending, 1, on_written) != 0)
        uv_server_close(stream);
}

static void on_connection(uv_stream_t* server, int status) {
    if (status < 0) return;
    connection* c = malloc(sizeof *c);
    if (!c) return;
    c->buffered = 0;
    c->closing_after_write = 0;
    uv_server_accept(server, &c->tcp, c, on_alloc, on_read);
}

int main(int argc, char** argv) { return uv_server_main(argc, argv, "uv-http", 8080, on_connection); }
