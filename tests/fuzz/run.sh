#!/usr/bin/env bash
# Fuzzes the targets of a build configured with -Dfuzz=enabled for a bounded
# time, one after the other, each on a copy of its seed corpus (the tree is
# never written to), then prints what each reached. Fails if any target
# reports a crash, a leak, a sanitizer finding, a timeout or a broken
# invariant. See docs/fuzzing.md.
#
# Usage: tests/fuzz/run.sh BUILD_DIR [TARGET...]
#
#   TARGET        http, resp, address, buffered_reader (default: every one built)
#
# Environment:
#   FUZZ_SECONDS  time per target, in seconds (default 60)
#   FUZZ_OUT      directory for the corpora, logs and crashing inputs (default:
#                 a temporary one, removed afterwards unless a target failed)
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 BUILD_DIR [TARGET...]" >&2
    exit 2
fi
build_dir=$(realpath "$1")
shift
source_dir=$(realpath "$(dirname "${BASH_SOURCE[0]}")")
seconds=${FUZZ_SECONDS:-60}

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    for exe in "$build_dir"/tests/fuzz/fuzz-*; do
        [[ -f $exe && -x $exe ]] && targets+=("${exe##*/fuzz-}")
    done
fi
if [[ ${#targets[@]} -eq 0 ]]; then
    echo "fuzz: no fuzz targets built in $build_dir (configure it with -Dfuzz=enabled)" >&2
    exit 1
fi

if [[ -n ${FUZZ_OUT:-} ]]; then
    out=$(realpath -m "$FUZZ_OUT")
    mkdir -p "$out"
    keep=true
else
    out=$(mktemp -d "${TMPDIR:-/tmp}/spindle-fuzz.XXXXXX")
    keep=false
fi

# Clang 14's sanitizer runtimes can crash on kernels with high mmap ASLR
# entropy (vm.mmap_rnd_bits > 28): run without ASLR where allowed, as CI does.
no_aslr=()
if setarch "$(uname -m)" -R true 2>/dev/null; then
    no_aslr=(setarch "$(uname -m)" -R)
fi
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# The figures libFuzzer prints last: "cov: 272 ft: 737 corp: 23/1450b ... exec/s: 9000".
figure() { sed -n "s/.* $1: \([0-9]*\).*/\1/p" "$2" | tail -n 1; }

failed=()
summary=()
total_cpu=0
for target in "${targets[@]}"; do
    exe=$build_dir/tests/fuzz/fuzz-$target
    if [[ ! -x $exe || ! -d $source_dir/$target ]]; then
        echo "fuzz: no target '$target' (looked for $exe and $source_dir/$target/)" >&2
        exit 1
    fi
    work=$out/$target
    mkdir -p "$work/corpus"
    cp -R "$source_dir/$target/." "$work/corpus/"
    args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
          -artifact_prefix="$work/")
    if [[ -f $source_dir/$target.dict ]]; then
        args+=(-dict="$source_dir/$target.dict")
    fi

    printf 'fuzz: %s for %ss\n' "$target" "$seconds"
    status=0
    TIMEFORMAT='%U %S'
    { time "${no_aslr[@]}" "$exe" "${args[@]}" "$work/corpus" >"$work/log" 2>&1; } 2>"$work/cpu" || status=$?
    read -r user sys <"$work/cpu"
    cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.0f", u + s }')
    total_cpu=$((total_cpu + cpu))

    # libFuzzer exits non-zero on whatever it found; the log is searched as
    # well, so that a report that did not stop the run still fails it.
    if [[ $status -ne 0 ]] ||
        grep -qE '^==[0-9]+==ERROR|runtime error:|invariant does not hold|^SUMMARY: ' "$work/log"; then
        failed+=("$target")
        echo "fuzz: $target FAILED (exit $status); the end of its log:" >&2
        tail -n 60 "$work/log" >&2
    fi
    summary+=("$(printf '%-16s %6s %10s %8s %6s %7s %7s' "$target" "$cpu" \
        "$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")" \
        "$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log")" \
        "$(figure cov "$work/log")" "$(figure ft "$work/log")" \
        "$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' "$work/log" | tail -n 1)")")
done

printf '\n%-16s %6s %10s %8s %6s %7s %7s\n' target 'cpu s' runs 'exec/s' cov ft corpus
printf '%s\n' "${summary[@]}"
printf 'total CPU time fuzzed: %ss\n' "$total_cpu"

if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz: FAILED: ${failed[*]}; inputs and logs are in $out" >&2
    exit 1
fi
if ! $keep; then
    rm -rf "$out"
fi
