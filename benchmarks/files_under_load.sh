#!/usr/bin/env bash
# spindle-http --root under a mixed load, on loopback: 4 clients download a
# 50 MiB file over and over and 4 POST 10 MiB bodies to /sha256, while
# GET /metrics is asked every 10 ms on a keep-alive connection of its own
# (spindle-http-ping). Prints the ping's p50, p99 and max (request written to
# the response's last byte read), the downloads and hashes done,
# and the stall warnings the server logged (loop_options::stall_threshold,
# 25 ms). Bounded: SECONDS of load, every curl with a time limit.
#
# Usage: benchmarks/files_under_load.sh [BUILD_DIR] [SECONDS] [THREADS]
#   DOWNLOADERS=N and HASHERS=N change the 4 and 4; KEEP_LOG=FILE keeps
#   the server's log; SERVER_CPUS=LIST, LOAD_CPUS=LIST and PING_CPUS=LIST
#   pin the server, the eight clients and the ping (taskset lists).
set -euo pipefail

build=${1:-build}
seconds=${2:-12}
threads=${3:-2}
http=$build/docs/examples/spindle-http
ping=$build/benchmarks/spindle-http-ping
[[ -x $http && -x $ping ]] || { echo "no $http or $ping: build the examples and benchmarks first" >&2; exit 2; }
command -v curl >/dev/null || { echo "needs curl" >&2; exit 2; }

work=$(mktemp -d)
server=
cleanup() {
    if [[ -n $server ]]; then kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true; fi
    if [[ -n ${KEEP_LOG:-} ]]; then cp "$work/log" "$KEEP_LOG"; fi
    rm -rf "$work"
}
trap cleanup EXIT

mkdir "$work/root"
head -c $((50 * 1024 * 1024)) /dev/urandom >"$work/root/big.bin"
head -c $((10 * 1024 * 1024)) /dev/urandom >"$work/body.bin"

pin() {  # $1: a CPU list or nothing, then the command (run in its place)
    local cpus=$1
    shift
    if [[ -n $cpus ]]; then exec taskset -c "$cpus" "$@"; else exec "$@"; fi
}
(pin "${SERVER_CPUS:-}" "$http" --port 0 --threads "$threads" --root "$work/root") >"$work/out" 2>"$work/log" &
server=$!
port=
for _ in $(seq 100); do
    port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/out" "$work/log" | head -1)
    [[ -n $port ]] && break
    sleep 0.05
done
[[ -n $port ]] || { echo "the server did not start" >&2; exit 1; }
url=http://127.0.0.1:$port
end=$(($(date +%s) + seconds))

load() {  # $1: download or hash; counts what completed in $work/$1.N
    local kind=$1 n=$2 done=0
    while (($(date +%s) < end)); do
        if [[ $kind == download ]]; then
            (pin "${LOAD_CPUS:-}" curl -s -m 30 -o /dev/null "$url/big.bin") && done=$((done + 1))
        else
            (pin "${LOAD_CPUS:-}" curl -s -m 30 -o /dev/null -H 'Expect:' --data-binary @"$work/body.bin" "$url/sha256") && done=$((done + 1))
        fi
    done
    echo "$done" >"$work/$kind.$n"
}
pids=()
for n in $(seq "${DOWNLOADERS:-4}"); do
    load download "$n" &
    pids+=($!)
done
for n in $(seq "${HASHERS:-4}"); do
    load hash "$n" &
    pids+=($!)
done
sleep 1  # the load under way
pings=$(pin "${PING_CPUS:-}" "$ping" "$port" /metrics $((seconds - 2)) 10)
wait "${pids[@]}"

field() { echo "$pings" | sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
downloads=$({ cat "$work"/download.* 2>/dev/null || true; } | awk '{ s += $1 } END { print s + 0 }')
hashes=$({ cat "$work"/hash.* 2>/dev/null || true; } | awk '{ s += $1 } END { print s + 0 }')
stalls=$(grep -c -i 'stall' "$work/log" || true)
echo "files_under_load pings=$(field pings) ping_p50_ms=$(field p50_ms) ping_p99_ms=$(field p99_ms) ping_max_ms=$(field max_ms) ping_failed=$(field failed) downloads_50mib=$downloads hashes_10mib=$hashes stall_warnings=$stalls threads=$threads seconds=$seconds"
