#!/usr/bin/env bash
# spindle-http over TLS beside nginx over TLS, in one run, on loopback: the
# server on one core, the load on another (docs/benchmarks.md, "TLS").
#
# Usage: benchmarks/tls_vs_nginx.sh [BUILD_DIR] [ROUNDS] [SECONDS]
#   BUILD_DIR  a build with TLS and the examples (default: build)
#   ROUNDS     rounds of every case, medians reported (default: 3)
#   SECONDS    length of each load (default: 4)
#
# Needs nginx with ssl (Debian: nginx-light), openssl, curl and taskset
# (util-linux). Per case it prints one line per round, then the median:
#   handshakes  full handshakes per second (a new connection per request,
#               ECDSA P-256 certificate, X25519), and server CPU per handshake
#   keep-alive  HTTPS and plain HTTP requests per second over 50 connections,
#               and server CPU per request
#   bulk        MiB/s of 1 MiB responses (16 KiB records) to curl, and
#               server CPU per MiB
#   idle        server memory per idle TLS connection: 1,000 connections,
#               each after one keep-alive request (benchmarks/tls_idle.py),
#               against a server started fresh for it
# Server CPU is user + system time from /proc (all nginx processes), so a
# load that is the bottleneck still gives a fair cost per unit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=${1:-build}
rounds=${2:-3}
seconds=${3:-4}
http=$build/docs/examples/spindle-http
load=$build/docs/examples/spindle-load
for tool in nginx openssl curl taskset; do
    command -v "$tool" >/dev/null || { echo "tls_vs_nginx: $tool is not installed" >&2; exit 1; }
done
[[ -x $http && -x $load ]] || { echo "tls_vs_nginx: build $build first (with TLS and the examples)" >&2; exit 1; }
# 1,000 idle connections (and their descriptors) per server.
ulimit -n 8192 2>/dev/null || true
server_cpu=0
load_cpu=1
(( $(nproc) >= 2 )) || load_cpu=0

dir=$(mktemp -d)
chmod 755 "$dir"  # nginx's worker runs as another user
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/key.pem" -out "$dir/cert.pem" \
    -days 2 -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null
# The same 1 MiB body spindle-http's /bytes/1048576 answers.
mkdir -p "$dir/www/bytes"
python3 -c "import sys; sys.stdout.write(''.join(chr(97 + i % 26) for i in range(1 << 20)))" >"$dir/www/bytes/1048576"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# nginx: one worker on the server core, TLS and plain on two ports.
nginx_tls=$(free_port)
nginx_plain=$(free_port)
mkdir -p "$dir/nginx"
cat >"$dir/nginx/nginx.conf" <<EOF
worker_processes 1;
worker_cpu_affinity auto;
daemon off;
pid $dir/nginx/nginx.pid;
error_log $dir/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    default_type text/plain;
    client_body_temp_path $dir/nginx/body;
    proxy_temp_path $dir/nginx/proxy;
    fastcgi_temp_path $dir/nginx/fastcgi;
    uwsgi_temp_path $dir/nginx/uwsgi;
    scgi_temp_path $dir/nginx/scgi;
    keepalive_requests 100000000;
    ssl_certificate $dir/cert.pem;
    ssl_certificate_key $dir/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    server {
        listen 127.0.0.1:$nginx_tls ssl;
        listen 127.0.0.1:$nginx_plain;
        root $dir/www;
        location = / { return 200 "Hello, World!"; }
    }
}
EOF
taskset -c $server_cpu nginx -c "$dir/nginx/nginx.conf" -e "$dir/nginx/error.log" &
pids+=($!)
nginx_master=$!

spindle_tls=$(free_port)
spindle_plain=$(free_port)
taskset -c $server_cpu "$http" --port "$spindle_tls" --tls-cert "$dir/cert.pem" --tls-key "$dir/key.pem" >/dev/null &
pids+=($!)
spindle_tls_pid=$!
taskset -c $server_cpu "$http" --port "$spindle_plain" >/dev/null &
pids+=($!)
spindle_plain_pid=$!

for port in $nginx_tls $spindle_tls; do
    for _ in $(seq 100); do
        curl -s --cacert "$dir/cert.pem" "https://127.0.0.1:$port/" >/dev/null && break
        sleep 0.1
    done
done

# Clock ticks of user + system time of a process and its children.
ticks() {
    local total=0 p
    for p in "$1" $(pgrep -P "$1" || true); do
        read -r -a f <"/proc/$p/stat"
        total=$(( total + f[13] + f[14] ))
    done
    echo $total
}
hz=$(getconf CLK_TCK)

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# run_load PID ARGS...: prints "per_second cpu_us_per_unit" for one load.
run_load() {
    local pid=$1
    shift
    local before after out rate units
    before=$(ticks "$pid")
    out=$(taskset -c $load_cpu "$load" --duration "$seconds" "$@")
    after=$(ticks "$pid")
    if [[ $out != *" 0 errors"* ]]; then
        echo "tls_vs_nginx: load failed: $out" >&2
        exit 1
    fi
    if [[ " $* " == *" --reconnect "* ]]; then
        rate=$(sed -n 's/.* \([0-9.]*\) connections\/s.*/\1/p' <<<"$out")
    else
        rate=$(sed -n 's/.*: \([0-9.]*\) req\/s.*/\1/p' <<<"$out")
    fi
    units=$(awk -v r="$rate" -v s="$seconds" 'BEGIN { print r * s }')
    awk -v t=$(( after - before )) -v hz="$hz" -v u="$units" -v r="$rate" 'BEGIN { printf "%.0f %.1f\n", r, t / hz * 1e6 / u }'
}

# run_bulk PID PORT: "MiB/s cpu_us_per_MiB" for 200 downloads of 1 MiB on one connection.
run_bulk() {
    local pid=$1 port=$2 before after start end
    local urls=()
    for i in $(seq 200); do urls+=(-o /dev/null "https://127.0.0.1:$port/bytes/1048576"); done
    before=$(ticks "$pid")
    start=$(date +%s.%N)
    taskset -c $load_cpu curl -sf --cacert "$dir/cert.pem" "${urls[@]}" || { echo "tls_vs_nginx: curl failed on port $port" >&2; exit 1; }
    end=$(date +%s.%N)
    after=$(ticks "$pid")
    awk -v t=$(( after - before )) -v hz="$hz" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f %.1f\n", 200 / (e - s), t / hz * 1e6 / 200 }'
}

# run_idle spindle|nginx: "bytes_per_connection" against a fresh server.
run_idle() {
    local port pid out
    port=$(free_port)
    if [[ $1 == spindle ]]; then
        taskset -c $server_cpu "$http" --port "$port" --tls-cert "$dir/cert.pem" --tls-key "$dir/key.pem" >/dev/null &
        pid=$!
    else
        sed "s/listen 127.0.0.1:$nginx_tls ssl;/listen 127.0.0.1:$port ssl;/; /listen 127.0.0.1:$nginx_plain;/d; s|pid .*;|pid $dir/nginx/idle.pid;|" \
            "$dir/nginx/nginx.conf" >"$dir/nginx/idle.conf"
        taskset -c $server_cpu nginx -c "$dir/nginx/idle.conf" -e "$dir/nginx/error.log" &
        pid=$!
    fi
    for _ in $(seq 100); do
        curl -s --cacert "$dir/cert.pem" "https://127.0.0.1:$port/" >/dev/null && break
        sleep 0.1
    done
    out=$(taskset -c $load_cpu python3 benchmarks/tls_idle.py "$port" "$dir/cert.pem" "$pid" 1000)
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    sed -n 's/.*bytes_per_connection=\([0-9]*\).*/\1 0/p' <<<"$out"
}

tls_args=(--mode http --tls --tls-ca "$dir/cert.pem" --tls-name localhost)
declare -A results
record() { results[$1]+="$2"$'\n'; echo "  $1: $2"; }

for round in $(seq "$rounds"); do
    echo "round $round"
    record "handshakes spindle" "$(run_load $spindle_tls_pid --port $spindle_tls "${tls_args[@]}" --reconnect --connections 16)"
    record "handshakes nginx" "$(run_load $nginx_master --port $nginx_tls "${tls_args[@]}" --reconnect --connections 16)"
    record "keep-alive https spindle" "$(run_load $spindle_tls_pid --port $spindle_tls "${tls_args[@]}" --connections 50)"
    record "keep-alive https nginx" "$(run_load $nginx_master --port $nginx_tls "${tls_args[@]}" --connections 50)"
    record "keep-alive http spindle" "$(run_load $spindle_plain_pid --port $spindle_plain --mode http --connections 50)"
    record "keep-alive http nginx" "$(run_load $nginx_master --port $nginx_plain --mode http --connections 50)"
    record "bulk spindle" "$(run_bulk $spindle_tls_pid $spindle_tls)"
    record "bulk nginx" "$(run_bulk $nginx_master $nginx_tls)"
    record "idle spindle" "$(run_idle spindle)"
    record "idle nginx" "$(run_idle nginx)"
done

echo
echo "medians of $rounds rounds (server on CPU $server_cpu, load on CPU $load_cpu, ${seconds} s each):"
printf '%-26s %14s %16s\n' case "per second" "server CPU (us)"
for key in "handshakes spindle" "handshakes nginx" "keep-alive https spindle" "keep-alive https nginx" \
           "keep-alive http spindle" "keep-alive http nginx" "bulk spindle" "bulk nginx" "idle spindle" "idle nginx"; do
    rate=$(awk '{ print $1 }' <<<"${results[$key]}" | grep . | median)
    cpu=$(awk '{ print $2 }' <<<"${results[$key]}" | grep . | median)
    if [[ $key == idle* ]]; then
        printf '%-26s %14s bytes per idle connection\n' "$key" "$rate"
        continue
    fi
    unit=$([[ $key == bulk* ]] && echo "MiB" || { [[ $key == handshakes* ]] && echo "handshake" || echo "request"; })
    printf '%-26s %14s %12s /%s\n' "$key" "$rate" "$cpu" "$unit"
done
