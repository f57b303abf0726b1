#!/usr/bin/env bash
# Checks that spindle can be installed and used from outside its tree.
#
# Usage: tests/consumer/check.sh [BUILD_DIR]
#
#   BUILD_DIR   an existing (unsanitized) build of spindle to install; without
#               it, a build of the libraries alone is configured here
#               (-Dtests=disabled -Dbenchmarks=disabled -Dexamples=disabled)
#
# Checks, each in temporary directories removed on exit:
#   1. `meson install` puts no reactor header or library in the prefix
#   2. every installed header compiles on its own (-std=c++20 -fsyntax-only),
#      with the flags of `pkg-config --cflags spindle` alone
#   3. main.cpp built with `c++ -std=c++20 main.cpp $(pkg-config --cflags --libs spindle)`
#      (no --static) runs: a task, a sleep, a TCP round trip on 127.0.0.1
#   3b. with TLS built, tls_main.cpp built with `pkg-config --cflags --libs spindle-tls` runs
#   4. the same programs built by CMake (CMakeLists.txt here): find_package(spindle)
#      through CMAKE_PREFIX_PATH finds the installed package, spindle::spindle
#      (and spindle::tls, required when TLS is built) link, and both run; with
#      g++ the compile lines carry -foptimize-sibling-calls, with clang they do not
#   5. the same program as a meson project with spindle in subprojects/spindle
#      (--wrap-mode=nodownload), which builds no spindle tests, benchmarks or
#      examples there, runs
# The compiler is $CXX (default c++); check 4 needs cmake (setup.sh installs it).
# Exits non-zero if any check failed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
build_dir=
if [[ $# -gt 0 ]]; then
    build_dir=$(cd "$1" && pwd)
fi
cxx=${CXX:-c++}
pkg_config=${PKG_CONFIG:-pkg-config}

work=$(mktemp -d "${TMPDIR:-/tmp}/spindle-consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT

log() { echo "consumer: $*"; }

failures=()
fail() {
    failures+=("$1")
    echo "consumer: FAILED: $1" >&2
}

# Runs a command with its output in a log file; shows the end of it on failure.
quietly() {
    local out=$work/last.log
    if "$@" >"$out" 2>&1; then
        return 0
    fi
    tail -n 30 "$out" >&2
    return 1
}

# --- install ----------------------------------------------------------------
if [[ -n $build_dir ]]; then
    # An existing build installs under its own prefix, so it goes to a
    # DESTDIR here, and the copy of spindle.pc gets that staged prefix.
    log "installing $build_dir into a staging directory"
    quietly meson install -C "$build_dir" --destdir "$work/destdir"
    pc=$(find "$work/destdir" -name spindle.pc -path '*/pkgconfig/*' | head -n 1)
    [[ -n $pc ]] || { echo "consumer: no spindle.pc installed" >&2; exit 1; }
    old_prefix=$(sed -n 's/^prefix=//p' "$pc")
    for var in includedir libdir; do
        if ! grep -q "^$var=\${prefix}/" "$pc"; then
            echo "consumer: $var in spindle.pc is not under \${prefix}; configure the build with --prefix instead" >&2
            exit 1
        fi
    done
    sed -i "s|^prefix=.*|prefix=$work/destdir$old_prefix|" "$pc"
    [[ ! -f $(dirname "$pc")/spindle-tls.pc ]] || sed -i "s|^prefix=.*|prefix=$work/destdir$old_prefix|" "$(dirname "$pc")/spindle-tls.pc"
    prefix=$work/destdir$old_prefix
else
    log "building the libraries alone, installing into a temporary prefix"
    # Unoptimised and without debug information: what is checked here is
    # what gets installed and how it is found, and this builds in half the time.
    quietly meson setup "$work/build" "$repo" --wrap-mode=nodownload --prefix="$work/prefix" \
        -Dtests=disabled -Dbenchmarks=disabled -Dexamples=disabled -Doptimization=0 -Ddebug=false
    quietly meson install -C "$work/build"
    prefix=$work/prefix
    pc=$(find "$prefix" -name spindle.pc -path '*/pkgconfig/*' | head -n 1)
    [[ -n $pc ]] || { echo "consumer: no spindle.pc installed" >&2; exit 1; }
fi
PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export PKG_CONFIG_PATH
log "pkg-config --cflags --libs spindle: $("$pkg_config" --cflags --libs spindle)"

# --- 1. the reactor stays private ---------------------------------------------
log "checking that no reactor header or library is installed"
leaked=$(find "$prefix" \( -path '*/spindle/reactor' -o -name '*spindle-reactor*' \) -print)
if [[ -n $leaked ]]; then
    echo "$leaked" >&2
    fail "reactor files installed"
fi

# --- 2. each installed header on its own --------------------------------------
include_dir=$prefix/include
mapfile -t headers < <(cd "$include_dir" && find spindle -type f \( -name '*.hpp' -o -name '*.h' \) | sort)
log "compiling each of ${#headers[@]} installed headers on its own"
read -r -a cflags <<<"$("$pkg_config" --cflags spindle)"
# One compiler per core; each header's log is its own file, named after it.
check_header() {
    local log_file=$work/headers/${1//\//_}.log
    echo "#include <$1>" | "$cxx" -std=c++20 -fsyntax-only "${@:2}" -x c++ - >"$log_file" 2>&1 || echo "$1" >>"$log_file.failed"
}
export -f check_header
export cxx work
mkdir -p "$work/headers"
printf '%s\0' "${headers[@]}" | xargs -0 -P "$(nproc)" -I{} bash -c 'check_header "$@"' _ {} "${cflags[@]}"
bad_headers=()
for header in "${headers[@]}"; do
    log_file=$work/headers/${header//\//_}.log
    if [[ -f $log_file.failed ]]; then
        bad_headers+=("$header")
        echo "--- $header:" >&2
        grep -m 3 'error' "$log_file" >&2 || tail -n 3 "$log_file" >&2
    fi
done
if [[ ${#bad_headers[@]} -gt 0 ]]; then
    fail "${#bad_headers[@]} of ${#headers[@]} headers do not compile on their own: ${bad_headers[*]}"
fi

# --- 3. pkg-config --------------------------------------------------------------
log "building main.cpp with $cxx -std=c++20 \$(pkg-config --cflags --libs spindle)"
read -r -a pc_flags <<<"$("$pkg_config" --cflags --libs spindle)"
if quietly "$cxx" -std=c++20 "$here/main.cpp" -o "$work/consumer-pkgconfig" "${pc_flags[@]}"; then
    log "running it"
    timeout 60 "$work/consumer-pkgconfig" || fail "the pkg-config build of main.cpp failed when run"
else
    fail "main.cpp does not build with pkg-config"
fi

# --- 3b. pkg-config, TLS ----------------------------------------------------------
if [[ -f $(dirname "$pc")/spindle-tls.pc ]]; then
    log "building tls_main.cpp with $cxx -std=c++20 \$(pkg-config --cflags --libs spindle-tls)"
    read -r -a tls_flags <<<"$("$pkg_config" --cflags --libs spindle-tls)"
    if quietly "$cxx" -std=c++20 "$here/tls_main.cpp" -o "$work/consumer-tls" "${tls_flags[@]}"; then
        timeout 60 "$work/consumer-tls" || fail "the pkg-config build of tls_main.cpp failed when run"
    else
        fail "tls_main.cpp does not build with pkg-config spindle-tls"
    fi
else
    log "spindle-tls.pc not installed (built without TLS): no TLS consumer"
fi

# --- 4. CMake -------------------------------------------------------------------
# The prefix installed above, so nothing of spindle is built again; no build
# type, so the programs compile without optimisation, as in check 5.
cmake_build=$work/cmake-build
cmake_args=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)
! command -v ninja >/dev/null || cmake_args+=(-G Ninja)
with_tls=false
if [[ -f $(dirname "$pc")/spindle-tls.pc ]]; then
    with_tls=true
    cmake_args+=(-DCONSUMER_TLS=ON)
fi
log "building main.cpp$($with_tls && echo ' and tls_main.cpp') with CMake: find_package(spindle) through CMAKE_PREFIX_PATH"
if ! command -v cmake >/dev/null; then
    fail "cmake not found (setup.sh installs it)"
elif [[ -z $(find "$prefix" -name spindleConfig.cmake -path '*/cmake/spindle/*') ]]; then
    fail "no spindleConfig.cmake installed (was cmake found when spindle was configured?)"
elif quietly cmake -S "$here" -B "$cmake_build" "${cmake_args[@]}"; then
    # Found in the prefix, not in a spindle installed elsewhere on the system.
    spindle_dir=$(sed -n 's/^spindle_DIR:PATH=//p' "$cmake_build/CMakeCache.txt")
    log "find_package(spindle): $spindle_dir"
    [[ $spindle_dir == "$prefix"/* ]] || fail "find_package(spindle) found a package outside the installed prefix"
    # The flag is for g++ only ($<COMPILE_LANG_AND_ID:CXX,GNU>); clang, which
    # also defines __GNUC__, must not get it.
    defines=$("$cxx" -dM -E -x c++ /dev/null)
    expect_flag=false
    [[ $defines != *__GNUC__* || $defines == *__clang__* ]] || expect_flag=true
    got_flag=false
    grep -q -- '-foptimize-sibling-calls' "$cmake_build/compile_commands.json" && got_flag=true
    [[ $got_flag == "$expect_flag" ]] ||
        fail "-foptimize-sibling-calls on the CMake compile lines: $got_flag, expected $expect_flag"
    if quietly cmake --build "$cmake_build" -j "$(nproc)"; then
        log "running it"
        timeout 60 "$cmake_build/consumer" || fail "the CMake build of main.cpp failed when run"
        if $with_tls; then
            timeout 60 "$cmake_build/tls-consumer" || fail "the CMake build of tls_main.cpp failed when run"
        fi
    else
        fail "main.cpp does not build with CMake"
    fi
else
    fail "cmake could not configure tests/consumer (find_package(spindle))"
fi

# --- 5. meson subproject ------------------------------------------------------
log "building tests/consumer as a meson project with spindle as a subproject"
mkdir -p "$work/project/subprojects"
cp "$here/meson.build" "$here/main.cpp" "$work/project/"
ln -s "$repo" "$work/project/subprojects/spindle"
# --force-fallback-for: neither the spindle.pc installed above nor one on the
# system may stand in for the subproject.
if quietly meson setup "$work/project-build" "$work/project" \
    --wrap-mode=nodownload --force-fallback-for=spindle -Doptimization=0 -Ddebug=false; then
    # As a subproject, 'auto' builds none of spindle's own programs.
    own=$(meson introspect --targets "$work/project-build" |
        grep -o '"name": "\(test-[a-z_]*\|spindle-[a-z]*bench\|spindle-echo\|readme-example\)"' || true)
    if [[ -n $own ]]; then
        echo "$own" >&2
        fail "the spindle subproject configures its tests, benchmarks or examples"
    fi
    if quietly meson compile -C "$work/project-build" consumer; then
        log "running it"
        timeout 60 "$work/project-build/consumer" || fail "the subproject build of main.cpp failed when run"
    else
        fail "main.cpp does not build with spindle as a subproject"
    fi
else
    fail "meson setup of the consumer project"
fi

if [[ ${#failures[@]} -gt 0 ]]; then
    log "${#failures[@]} check(s) failed:"
    printf '  %s\n' "${failures[@]}"
    exit 1
fi
log "all checks passed"
