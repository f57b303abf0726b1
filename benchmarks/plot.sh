#!/bin/sh
# Runs the runtime benchmarks on spindle and on the peers that are built
# (asio-bench, uv-bench), a few rounds each, and draws the medians beside each
# other as docs/benchmarks.svg with gnuplot (Debian: gnuplot-nox).
#
# Usage: benchmarks/plot.sh [build-dir] [rounds]      (defaults: build 3)
# Figures are the medians of the rounds; the raw lines are kept next to the
# plot as docs/benchmarks-data.txt. Run it on a quiet machine.
set -eu

build=${1:-build}
rounds=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
svg=$here/docs/benchmarks.svg
data=$here/docs/benchmarks-data.txt
command -v gnuplot > /dev/null || { echo "plot.sh: gnuplot is not installed (apt-get install gnuplot-nox)" >&2; exit 1; }
[ -x "$build/benchmarks/spindle-bench" ] || { echo "plot.sh: no $build/benchmarks/spindle-bench" >&2; exit 1; }

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
cp "$tmp/raw" "$data"

# Medians per (runtime, figure) into one small table per panel.
awk -v dir="$tmp" '
    function field(name,   i, kv) {
        for (i = 3; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == name) return kv[2] }
        return ""
    }
    function keep(panel, runtime, v) { if (v != "") { n[panel, runtime]++; val[panel, runtime, n[panel, runtime]] = v } }
    $2 == "timers_fire"    { keep("timers_fire", $1, field("ns_per_op")) }
    $2 == "timers_cancel"  { keep("timers_cancel", $1, field("ns_per_op")) }
    $2 == "sleeping_tasks" { keep("sleeping_tasks", $1, field("bytes_per_task")) }
    $2 == "spawn"          { keep("spawn", $1, field("ns_per_op")) }
    $2 == "yield"          { keep("yield", $1, field("ns_per_op")) }
    function median(panel, runtime,   k, m, i, j, t, a) {
        m = n[panel, runtime]
        for (i = 1; i <= m; ++i) a[i] = val[panel, runtime, i] + 0
        for (i = 1; i <= m; ++i) for (j = i + 1; j <= m; ++j) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
    }
    END {
        split("timers_fire timers_cancel sleeping_tasks spawn yield", panels, " ")
        split("spindle asio uv", runtimes, " ")
        for (p = 1; p <= 5; ++p) {
            file = dir "/" panels[p] ".dat"
            printf "" > file
            for (r = 1; r <= 3; ++r)
                if (n[panels[p], runtimes[r]] > 0) printf "%s %.1f\n", runtimes[r], median(panels[p], runtimes[r]) >> file
            close(file)
        }
    }' "$tmp/raw"

cat > "$tmp/plot.gp" << EOF
set terminal svg size 1100,360 font "sans,11" background rgb "white"
set output "$svg"
set multiplot layout 1,5 title "spindle beside its peers (medians of $rounds rounds; lower is better)"
set style fill solid 0.8 border -1
set boxwidth 0.6
set yrange [0:*]
set grid ytics
set xtics nomirror
unset key
set format y "%g"
set linetype 11 lc rgb '#d9822b'
set linetype 12 lc rgb '#3b6ea5'
panel(file) = sprintf("plot '%s' using 0:2:(\$0 == 0 ? 11 : 12):xtic(1) with boxes lc variable, '' using 0:2:(sprintf('%%g', \$2)) with labels offset 0,0.7", file)
set title "timers\\\\_fire\\n(CPU ns per timer)"
eval panel("$tmp/timers_fire.dat")
set title "timers\\\\_cancel\\n(ns per cancel)"
eval panel("$tmp/timers_cancel.dat")
set title "sleeping\\\\_tasks\\n(bytes per task)"
eval panel("$tmp/sleeping_tasks.dat")
set title "spawn\\n(ns per task)"
eval panel("$tmp/spawn.dat")
set title "yield\\n(ns per yield)"
eval panel("$tmp/yield.dat")
unset multiplot
EOF
gnuplot "$tmp/plot.gp"
echo "plot.sh: wrote $svg and $data"
