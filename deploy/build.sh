#!/bin/sh
# deploy/build.sh [BUILD_DIR] [MESON_OPTION...] — configure (once) and compile kiln.
# Idempotent: a configured build directory is only recompiled, so the README's
# commands can be run again and again.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=${1:-build}
[ $# -gt 0 ] && shift
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@"
elif [ $# -gt 0 ]; then
    # Options given to a folder set up earlier (the README's run command sets up build/ without
    # --werror, then tests/run passes it) still apply.
    meson configure "$dir" "$@"
fi
meson compile -C "$dir"
