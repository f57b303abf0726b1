#!/usr/bin/env python3
"""Server memory per idle TLS connection, on loopback.

Usage: tls_idle.py PORT CA_FILE SERVER_PID [CONNECTIONS]

Opens CONNECTIONS (default 1000) TLS connections to 127.0.0.1:PORT, one at a
time, each with one keep-alive HTTP request and its whole answer read, so
the server has served it once and waits again. Then it reads the server's
resident memory (VmRSS of SERVER_PID and its children), and prints

    idle_tls connections=N bytes_per_connection=B rss_kib=R rss_before_kib=R0

B = (R - R0) * 1024 / N. Every connection is closed before it exits.
"""

import resource
import socket
import ssl
import sys
import time


def rss_kib(pid):
    total = 0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    for p in pids:
        with open(f"/proc/{p}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def read_answer(conn):
    """Reads one HTTP/1.1 answer with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("closed before the answer's head")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("closed inside the answer's body")
        body += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(f"answer: {head.splitlines()[0]!r}")


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    port, ca, pid = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 64), hard))
    context = ssl.create_default_context(cafile=ca)
    before = rss_kib(pid)
    conns = []
    deadline = time.monotonic() + 120
    try:
        for _ in range(count):
            if time.monotonic() > deadline:
                sys.exit("tls_idle: gave up after 120 s")
            raw = socket.create_connection(("127.0.0.1", port), timeout=10)
            conn = context.wrap_socket(raw, server_hostname="localhost")
            conn.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            read_answer(conn)
            conns.append(conn)
        time.sleep(0.5)  # settled
        after = rss_kib(pid)
        print(f"idle_tls connections={len(conns)} bytes_per_connection={(after - before) * 1024 / len(conns):.0f} "
              f"rss_kib={after} rss_before_kib={before}", flush=True)
    finally:
        for conn in conns:
            conn.close()


if __name__ == "__main__":
    main()
