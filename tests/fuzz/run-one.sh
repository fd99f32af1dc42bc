#!/bin/sh
# tests/fuzz/run-one.sh FUZZER SEED_CORPUS WORK_DIR SECONDS — one bounded libFuzzer run,
# as the meson suite 'fuzz' calls it. New inputs go to WORK_DIR (in the build tree), so
# the committed seed corpus is never written to; a crash leaves its reproducer there too.
# -error_exitcode=1: libFuzzer's own default for a crash is 77, which meson reads as a skip,
# so a crash passed as "SKIP" in a green run.
set -eu
fuzzer=$1 seeds=$2 work=$3 seconds=$4
mkdir -p "$work"
exec env ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}" \
    "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -error_exitcode=1 \
    -artifact_prefix="$work/" "$work" "$seeds"
