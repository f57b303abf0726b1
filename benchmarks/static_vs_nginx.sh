#!/usr/bin/env bash
# Static files: spindle-http --root beside nginx (one worker, sendfile on,
# no access log) under wrk on loopback, 1 KiB and 1 MiB files, in turn.
# Prints, per server and file, requests per second and the server's CPU per
# request (user + system, from /proc/PID/stat of the server and, for nginx,
# its worker). The servers run on CPU 0 and wrk on CPU 1 (where there are
# two). Bounded: SECONDS of wrk per figure, ROUNDS rounds.
# Needs wrk and nginx (Debian: wrk, nginx-light).
#
# Usage: benchmarks/static_vs_nginx.sh [BUILD_DIR] [SECONDS] [ROUNDS]
set -euo pipefail

build=${1:-build}
seconds=${2:-5}
rounds=${3:-3}
http=$build/docs/examples/spindle-http
for tool in wrk nginx; do command -v $tool >/dev/null || { echo "needs $tool" >&2; exit 2; }; done
[[ -x $http ]] || { echo "no $http" >&2; exit 2; }

work=$(mktemp -d)
chmod 755 "$work"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

mkdir "$work/root"
head -c 1024 /dev/urandom >"$work/root/f1k.bin"
head -c $((1024 * 1024)) /dev/urandom >"$work/root/f1m.bin"
chmod -R a+rX "$work/root"

ticks() {  # user + system clock ticks of the processes named
    local sum=0 p
    for p in "$@"; do
        read -r -a f <"/proc/$p/stat"
        sum=$((sum + f[13] + f[14]))
    done
    echo $sum
}
hz=$(getconf CLK_TCK)
server_cpu=() client_cpu=()
if command -v taskset >/dev/null && (($(nproc) >= 2)); then server_cpu=(taskset -c 0) client_cpu=(taskset -c 1); fi

# spindle-http, one loop.
"${server_cpu[@]}" "$http" --port 0 --root "$work/root" >"$work/spindle.out" 2>&1 &
spindle=$!
pids+=($spindle)
# nginx, one worker.
cat >"$work/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000000;
    default_type application/octet-stream;
    client_body_temp_path $work/body;
    proxy_temp_path $work/proxy;
    fastcgi_temp_path $work/fastcgi;
    uwsgi_temp_path $work/uwsgi;
    scgi_temp_path $work/scgi;
    server { listen 127.0.0.1:0; root $work/root; }
}
CONF
nginx_port=$((20000 + RANDOM % 40000))
sed -i "s/listen 127.0.0.1:0;/listen 127.0.0.1:$nginx_port;/" "$work/nginx.conf"
"${server_cpu[@]}" nginx -c "$work/nginx.conf" -e "$work/error.log" </dev/null >/dev/null 2>&1 &
pids+=($!)
sleep 1
spindle_port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/spindle.out" | head -1)
nginx_master=$(cat "$work/nginx.pid")
nginx_worker=$(pgrep -P "$nginx_master" | head -1)
[[ -n $spindle_port && -n $nginx_worker ]] || { echo "a server did not start" >&2; cat "$work/error.log" >&2; exit 1; }

measure() {  # $1 name, $2 port, $3 file, then the server's pids
    local name=$1 port=$2 file=$3
    shift 3
    local before after out reqs
    before=$(ticks "$@")
    out=$("${client_cpu[@]}" wrk -t1 -c50 -d"${seconds}s" "http://127.0.0.1:$port/$file")
    after=$(ticks "$@")
    reqs=$(echo "$out" | awk '/requests in/ { print $1 }')
    awk -v n="$name" -v f="$file" -v r="$reqs" -v t=$((after - before)) -v hz="$hz" -v s="$seconds" \
        'BEGIN { printf "static %s %s requests_per_s=%.0f server_cpu_us_per_request=%.2f\n", n, f, r / s, t / hz * 1e6 / r }'
}
for round in $(seq "$rounds"); do
    echo "round $round"
    for file in f1k.bin f1m.bin; do
        measure spindle "$spindle_port" "$file" "$spindle"
        measure nginx "$nginx_port" "$file" "$nginx_worker"
    done
done
