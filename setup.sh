#!/usr/bin/env bash
# Install build dependencies (Debian/Ubuntu), configure and build spindle.
#
# Usage: ./setup.sh [BUILD_DIR] [extra meson options...]
#
#   BUILD_DIR   build directory, relative to the repository root (default: build)
#   options     passed to `meson setup`, e.g. -Dwerror=true -Db_sanitize=address
#
# The compiler is taken from CC/CXX when a build directory is first configured,
# e.g. `CC=clang CXX=clang++ ./setup.sh build-clang`.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

build_dir=build
if [[ $# -gt 0 && $1 != -* ]]; then
    build_dir=$1
    shift
fi

log() { echo "setup: $*"; }

as_root() {
    if [[ $EUID -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        log "need root (or sudo) to run: $*" >&2
        exit 1
    fi
}

is_installed() {
    # shellcheck disable=SC2016  # ${Status} is a dpkg-query field, not a shell variable
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]
}

has_candidate() {
    apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [^(]'
}

apt_updated=false
apt_update_once() {
    if ! $apt_updated; then
        log "apt-get update"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        apt_updated=true
    fi
}

# --- 1. packages -------------------------------------------------------------
# redis-tools (redis-cli, redis-benchmark) and wrk are what the example
# services are tested against; libssl-dev is OpenSSL 3 for spindle::tls,
# whose tests run the openssl command and curl against it. cmake lets meson
# write the CMake package (spindleConfig.cmake) that tests/consumer/check.sh
# builds a program against.
packages=(meson ninja-build pkg-config cmake g++ clang libspdlog-dev catch2 liburing-dev redis-tools wrk libssl-dev openssl curl)

missing=()
for pkg in "${packages[@]}"; do
    is_installed "$pkg" || missing+=("$pkg")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    apt_update_once
fi

# Sanitizer runtimes for clang (ASan/UBSan/TSan) and libFuzzer (-Dfuzz).
# Depending on the release they ship in libclang-rt-dev / libclang-rt-<N>-dev
# (Debian 12: clang-14 does not depend on it), or inside clang's own packages.
clang_major() {
    apt-cache policy clang 2>/dev/null |
        sed -n 's/^ *Candidate: \([0-9]*:\)\{0,1\}\([0-9][0-9]*\).*/\2/p'
}
clang_major=$(clang_major)
if [[ -z $clang_major ]]; then
    # No package lists yet (e.g. a slim container image): fetch them once.
    apt_update_once
    clang_major=$(clang_major)
fi
rt_pkg=
for candidate in libclang-rt-dev ${clang_major:+libclang-rt-$clang_major-dev}; do
    if is_installed "$candidate" || has_candidate "$candidate"; then
        rt_pkg=$candidate
        break
    fi
done
if [[ -z $rt_pkg ]]; then
    log "no libclang-rt package in this release; using the runtimes bundled with clang"
elif ! is_installed "$rt_pkg"; then
    missing+=("$rt_pkg")
fi

if [[ ${#missing[@]} -gt 0 ]]; then
    apt_update_once
    log "installing: ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    log "all packages already installed"
fi

# --- 2. configure ------------------------------------------------------------
if [[ ! -f $build_dir/build.ninja ]]; then
    log "configuring $build_dir${*:+ with $*}"
    meson setup "$build_dir" --wrap-mode=nodownload "$@"
elif [[ $# -gt 0 ]]; then
    log "reconfiguring $build_dir with $*"
    meson setup --reconfigure "$build_dir" --wrap-mode=nodownload "$@"
else
    log "$build_dir already configured"
fi

# --- 3. build ----------------------------------------------------------------
log "building $build_dir"
meson compile -C "$build_dir"
log "done: $build_dir"
