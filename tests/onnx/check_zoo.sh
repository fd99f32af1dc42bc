#!/bin/sh
# tests/onnx/check_zoo.sh PARITY FUSED NAME IO DEVICES — one model of the ONNX model zoo
# (tests/fixtures/gen_onnx_zoo.py: random weights, exported by torch's dynamo exporter and
# by its TorchScript exporter), generated into the fixture cache on first use
# (tests/fixtures/onnx-cache.sh), then for each export:
#   - PARITY on each device of DEVICES (comma-separated): kiln's outputs against ONNX
#     Runtime's on every io set of IO (comma-separated suffixes, '-' for the one set
#     without a suffix), within 1e-4 relative;
#   - FUSED on cpu: the fused load against the unfused one on every io set, and a second
#     fused run against the first (fusion must not change what the graph means).
# Skipped (exit 77), saying why, when no Python with the fixture packages is found.
set -eu
parity=$1
fused=$2
name=$3
io=$4
devices=$5
root=$(cd "$(dirname "$0")/../.." && pwd)
rc=0
dir=$("$root/tests/fixtures/onnx-cache.sh" zoo "$name") || rc=$?
if [ "$rc" != 0 ]; then
    echo "$dir"
    exit "$rc"
fi
for exporter in dynamo script; do
    model=$name.$exporter
    specs=""
    ios=""
    for s in $(echo "$io" | tr ',' ' '); do
        set=$model
        [ "$s" = - ] || set=$model.$s
        specs="$specs $model:$set"
        ios="$ios${ios:+,}$set"
    done
    for dev in $(echo "$devices" | tr ',' ' '); do
        # shellcheck disable=SC2086 # one argument per io set
        "$parity" "$dir" "$dev" $specs || rc=1
    done
    "$fused" "$dir" "$model:$ios" || rc=1
done
exit $rc
