#!/usr/bin/env bash
# nginx-http: nginx (one worker, `return 200 "Hello, World!"`, no access log)
# behind the command line spindle-echo-bench gives a server, for
# `spindle-echo-bench --mode http --server benchmarks/peers/nginx_http.sh`.
# --backend is accepted and ignored (nginx uses epoll on Linux); --port 0
# picks a free port. Prints "nginx listening on HOST:PORT" once nginx
# accepts connections, and on SIGTERM or SIGINT stops nginx, waits for it
# and exits 0. nginx runs as this script's child and its master reaps its
# worker, so the script's resource usage, as its parent sees it, holds all
# of nginx's CPU time (and a few milliseconds of this script's).
# Needs nginx (Debian: nginx-light).
set -euo pipefail

host=127.0.0.1
port=0
while (( $# >= 2 )); do
    case $1 in
        --host) host=$2 ;;
        --port) port=$2 ;;
        --backend) ;;
        *) echo "usage: nginx_http.sh [--host ADDRESS] [--port N] [--backend IGNORED]" >&2; exit 2 ;;
    esac
    shift 2
done
(( $# == 0 )) || { echo "usage: nginx_http.sh [--host ADDRESS] [--port N] [--backend IGNORED]" >&2; exit 2; }
command -v nginx >/dev/null || { echo "nginx_http.sh: nginx is not installed" >&2; exit 1; }

dir=$(mktemp -d)
chmod 755 "$dir"  # nginx's worker may run as another user
nginx_pid=
cleanup() {
    [[ -n $nginx_pid ]] && kill "$nginx_pid" 2>/dev/null && wait "$nginx_pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 0' TERM INT

# Starts nginx on port $1 and waits until it accepts; false if it exited.
start_on() {
    cat >"$dir/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    default_type text/plain;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    keepalive_requests 100000000;
    server {
        listen $host:$1;
        location = / { return 200 "Hello, World!"; }
    }
}
CONF
    nginx -c "$dir/nginx.conf" -e "$dir/error.log" </dev/null >/dev/null 2>&1 &
    nginx_pid=$!
    for _ in $(seq 200); do
        kill -0 "$nginx_pid" 2>/dev/null || { wait "$nginx_pid" 2>/dev/null || true; nginx_pid=; return 1; }
        (exec 3<>"/dev/tcp/$host/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

if (( port != 0 )); then
    start_on "$port" || { echo "nginx_http.sh: nginx did not start on $host:$port" >&2; cat "$dir/error.log" >&2; exit 1; }
else
    # A free port: try unprivileged ones at random until nginx binds one.
    for _ in $(seq 20); do
        port=$(( 20000 + RANDOM % 40000 ))
        start_on "$port" && break
        port=0
    done
    (( port != 0 )) || { echo "nginx_http.sh: nginx did not start" >&2; cat "$dir/error.log" >&2; exit 1; }
fi
echo "nginx listening on $host:$port"
wait "$nginx_pid"
