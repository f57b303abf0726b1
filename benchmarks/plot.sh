#!/bin/sh
# Runs the runtime benchmarks on spindle and on the peers that are built
# (asio-bench, uv-bench), a few rounds each, then the TCP echo servers
# (spindle-echo on each backend built, asio-echo, uv-echo) and the HTTP
# servers (spindle-http on each backend built, asio-http, uv-http, and
# nginx when it is installed) under spindle-echo-bench, and draws the
# medians beside each other as docs/benchmarks.svg with gnuplot (Debian:
# gnuplot-nox).
#
# Usage: benchmarks/plot.sh [build-dir] [rounds]      (defaults: build 3)
# PLOT_NETWORK=0 leaves the servers out (runtime panels only).
# Figures are the medians of the rounds; the raw lines are kept next to the
# plot as docs/benchmarks-data.txt. Run it on a quiet machine.
set -eu

build=${1:-build}
rounds=${2:-3}
network=${PLOT_NETWORK:-1}
here=$(cd "$(dirname "$0")/.." && pwd)
svg=$here/docs/benchmarks.svg
data=$here/docs/benchmarks-data.txt
command -v gnuplot > /dev/null || { echo "plot.sh: gnuplot is not installed (apt-get install gnuplot-nox)" >&2; exit 1; }
[ -x "$build/benchmarks/spindle-bench" ] || { echo "plot.sh: no $build/benchmarks/spindle-bench" >&2; exit 1; }
case $network in 0 | 1) ;; *) echo "plot.sh: PLOT_NETWORK must be 0 or 1" >&2; exit 1 ;; esac
if [ "$network" = 1 ]; then
    echo_bench=$build/benchmarks/spindle-echo-bench
    # meson puts the example wherever docs/ builds it: look it up.
    echo_server=$(find "$build" -name spindle-echo -type f -perm -u+x | head -n 1)
    http_server=$(find "$build" -name spindle-http -type f -perm -u+x | head -n 1)
    [ -x "$echo_bench" ] || { echo "plot.sh: no $echo_bench (PLOT_NETWORK=0 to leave the servers out)" >&2; exit 1; }
    [ -n "$echo_server" ] || { echo "plot.sh: no spindle-echo under $build (PLOT_NETWORK=0 to leave the servers out)" >&2; exit 1; }
    [ -n "$http_server" ] || { echo "plot.sh: no spindle-http under $build (PLOT_NETWORK=0 to leave the servers out)" >&2; exit 1; }
    # The backends this build has, as its --help names them: io_uring (or
    # kqueue) may be missing.
    backends=$("$echo_bench" --help | sed -n 's/.*the backends built, \([a-z_,]*\)).*/\1/p')
    [ -n "$backends" ] || backends=epoll
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One process per case: sleeping_tasks measures resident memory, which what
# an earlier case left in the allocator would distort.
cases="timers_fire timers_cancel sleeping_tasks spawn yield"
: > "$tmp/raw"
for round in $(seq "$rounds"); do
    for program in spindle-bench asio-bench uv-bench; do
        [ -x "$build/benchmarks/$program" ] || continue
        for c in $cases; do
            "$build/benchmarks/$program" "$c" | sed "s/^/${program%-bench} /" >> "$tmp/raw"
        done
    done
done

# The echo servers: 100 connections of 64-byte messages, 1 and 16 in flight
# on each, 2 s per run, over loopback; the HTTP servers the same with GET /
# requests, 16 in flight meaning 16 pipelined. The bench starts each server on a
# free port, pinned to a core of its own, and stops it with SIGTERM after
# the run; its load generator is spindle on epoll whatever the server.
# Its server CPU per message is the server's whole life (user + system)
# over the messages echoed. A run marked FAILED (an error, a byte wrong, a
# server that did not exit 0) is kept as ok=0 and left out of the medians.
# Its lines are "round 1  depth 16  epoll  498913 msg/s ... cpu us/msg:
# server 0.82 (user 0.20, kernel 0.62), load 1.00": turned into key=value
# lines here.
echo_run() {  # label-prefix server-path backend-list mode
    "$echo_bench" --mode "$4" --server "$2" --backends "$3" --connections 100 --size 64 --depth 1,16 --duration 2 --rounds 1 \
        > "$tmp/echo.out" || echo "plot.sh: spindle-echo-bench --server $2 exited with status $?" >&2
    awk -v prefix="$1" -v mode="$4" '
        $1 != "round" || $3 != "depth" { next }
        {
            ok = 1; rate = p50 = p99 = errors = server = user = kernel = load = ""
            for (i = 6; i <= NF; ++i) {
                if ($i == "msg/s") rate = $(i - 1)
                else if ($i == "p50") p50 = $(i + 1)
                else if ($i == "p99") p99 = $(i + 1)
                else if ($i == "errors") errors = $(i - 1)
                else if ($i == "server") { server = $(i + 1); sub(/,$/, "", server) }
                else if ($i == "(user") { user = $(i + 1); sub(/,$/, "", user) }
                else if ($i == "kernel") { kernel = $(i + 1); sub(/\),$/, "", kernel) }
                else if ($i == "load") load = $(i + 1)
                else if ($i == "FAILED") ok = 0
            }
            if (!ok) print "plot.sh: echo run failed: " prefix ": " $0 > "/dev/stderr"
            printf "%s %s_d%s server_cpu_us_per_msg=%s server_user_us_per_msg=%s server_kernel_us_per_msg=%s load_cpu_us_per_msg=%s msg_per_s=%s p50_us=%s p99_us=%s errors=%s connections=100 size=64 depth=%s ok=%d\n",
                   prefix == "spindle" ? prefix "-" $5 : prefix, mode, $4, server, user, kernel, load, rate, p50, p99, errors, $4, ok
        }' "$tmp/echo.out"
}
if [ "$network" = 1 ]; then
    for round in $(seq "$rounds"); do
        # The bench flips its backends' order every round of its own; with
        # one round a call, the flip is done here.
        list=$backends
        [ $((round % 2)) = 1 ] || list=$(echo "$backends" | awk -F, '{ for (i = NF; i > 1; --i) printf "%s,", $i; print $1 }')
        echo_run spindle "$echo_server" "$list" echo >> "$tmp/raw"
        for peer in asio uv; do
            [ -x "$build/benchmarks/$peer-echo" ] || continue
            # The peers take --backend and ignore it: they use epoll.
            echo_run "$peer" "$build/benchmarks/$peer-echo" epoll echo >> "$tmp/raw"
        done
        echo_run spindle "$http_server" "$list" http >> "$tmp/raw"
        for peer in asio uv; do
            [ -x "$build/benchmarks/$peer-http" ] || continue
            echo_run "$peer" "$build/benchmarks/$peer-http" epoll http >> "$tmp/raw"
        done
        if command -v nginx > /dev/null; then
            echo_run nginx "$here/benchmarks/peers/nginx_http.sh" epoll http >> "$tmp/raw"
        fi
    done
fi
cp "$tmp/raw" "$data"

# Medians per (runtime, figure) into one small table per panel, the
# runtimes in the order they ran (spindle first).
awk -v dir="$tmp" '
    function field(name,   i, kv) {
        for (i = 3; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == name) return kv[2] }
        return ""
    }
    function keep(panel, runtime, v) {
        if (v == "") return
        if (!n[panel, runtime]++) order[panel] = order[panel] " " runtime
        val[panel, runtime, n[panel, runtime]] = v
    }
    $2 == "timers_fire"    { keep("timers_fire", $1, field("ns_per_op")) }
    $2 == "timers_cancel"  { keep("timers_cancel", $1, field("ns_per_op")) }
    $2 == "sleeping_tasks" { keep("sleeping_tasks", $1, field("bytes_per_task")) }
    $2 == "spawn"          { keep("spawn", $1, field("ns_per_op")) }
    $2 == "yield"          { keep("yield", $1, field("ns_per_op")) }
    # In ns, as the other panels.
    ($2 == "echo_d1" || $2 == "echo_d16" || $2 == "http_d1" || $2 == "http_d16") && field("ok") == 1 && (v = field("server_cpu_us_per_msg")) != "" {
        keep($2, $1, v * 1000)
        # The user part, drawn inside the bar (the rest is the kernel).
        if ((u = field("server_user_us_per_msg")) != "") keep($2 "_user", $1, u * 1000)
    }
    function median(panel, runtime,   k, m, i, j, t, a) {
        m = n[panel, runtime]
        for (i = 1; i <= m; ++i) a[i] = val[panel, runtime, i] + 0
        for (i = 1; i <= m; ++i) for (j = i + 1; j <= m; ++j) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
    }
    END {
        np = split("timers_fire timers_cancel sleeping_tasks spawn yield echo_d1 echo_d16 http_d1 http_d16", panels, " ")
        for (p = 1; p <= np; ++p) {
            file = dir "/" panels[p] ".dat"
            printf "" > file
            m = split(order[panels[p]], runtimes, " ")
            for (r = 1; r <= m; ++r) {
                printf "%s %.1f", runtimes[r], median(panels[p], runtimes[r]) >> file
                if (n[panels[p] "_user", runtimes[r]]) printf " %.1f", median(panels[p] "_user", runtimes[r]) >> file
                printf "\n" >> file
            }
            close(file)
        }
    }' "$tmp/raw"

# The runtime panels in a row; with the servers, a second row of four
# panels below it (echo, then HTTP).
if [ "$network" = 1 ]; then height=760; else height=360; fi
cat > "$tmp/plot.gp" << EOF
net = $network
set terminal svg size 1300,$height font "sans,11" background rgb "white"
set output "$svg"
set multiplot title "spindle beside its peers (medians of $rounds rounds; lower is better)"
set style fill solid 0.8 border -1
set boxwidth 0.6
set yrange [0:*]
set offsets 0.3, 0.3, graph 0.08, 0    # room for the tallest label, and a lone bar not the panel wide
set grid ytics
set xtics nomirror noenhanced
unset key
set format y "%g"
set linetype 11 lc rgb '#d9822b'
set linetype 12 lc rgb '#3b6ea5'
set linetype 13 lc rgb '#8a4a10'
set linetype 14 lc rgb '#1f3d60'
panel(file) = sprintf("plot '%s' using 0:2:(strstrt(strcol(1), 'spindle') == 1 ? 11 : 12):xtic(1) with boxes lc variable, '' using 0:2:(sprintf('%%g', \$2)) with labels offset 0,0.7", file)
# The servers' panels: the user part of each bar darker, its value inside.
split_panel(file) = sprintf("plot '%s' using 0:2:(strstrt(strcol(1), 'spindle') == 1 ? 11 : 12):xtic(1) with boxes lc variable, '' using 0:3:(strstrt(strcol(1), 'spindle') == 1 ? 13 : 14) with boxes lc variable, '' using 0:2:(sprintf('%%g', \$2)) with labels offset 0,0.7, '' using 0:3:(sprintf('user %%g', \$3)) with labels offset 0,0.7 font ',9'", file)
# The title takes the top of the page; each panel its own cell below it.
top = net ? 0.94 / 2 : 0
row = net ? 0.94 / 2 : 0.94
at(column, width) = sprintf("set origin %g,%g; set size %g,%g", column * width, top, width, row)
eval at(0, 0.2)
set title "timers\\\\_fire\\n(CPU ns per timer)"
eval panel("$tmp/timers_fire.dat")
eval at(1, 0.2)
set title "timers\\\\_cancel\\n(ns per cancel)"
eval panel("$tmp/timers_cancel.dat")
eval at(2, 0.2)
set title "sleeping\\\\_tasks\\n(bytes per task)"
eval panel("$tmp/sleeping_tasks.dat")
eval at(3, 0.2)
set title "spawn\\n(ns per task)"
eval panel("$tmp/spawn.dat")
eval at(4, 0.2)
set title "yield\\n(ns per yield)"
eval panel("$tmp/yield.dat")
if (net) {
    top = 0
    set xtics rotate by -30
    eval at(0, 0.25)
    set title "TCP echo, 100 connections, 1 in flight\\n(server CPU ns per 64-byte message; dark: user)"
    eval split_panel("$tmp/echo_d1.dat")
    eval at(1, 0.25)
    set title "TCP echo, 100 connections, 16 in flight\\n(server CPU ns per 64-byte message)"
    eval split_panel("$tmp/echo_d16.dat")
    eval at(2, 0.25)
    set title "HTTP GET keep-alive, 100 connections\\n(server CPU ns per request)"
    eval split_panel("$tmp/http_d1.dat")
    eval at(3, 0.25)
    set title "HTTP, 16 pipelined per connection\\n(server CPU ns per request)"
    eval split_panel("$tmp/http_d16.dat")
}
unset multiplot
EOF
gnuplot "$tmp/plot.gp"
echo "plot.sh: wrote $svg and $data"
