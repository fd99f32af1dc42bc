#!/bin/sh
# tests/onnx/check_large.sh PARITY NAME — a bench-sized model (resnet50_b1: torchvision
# ResNet-50 at 224x224, ~100 MB; bert: a 12-layer BERT-base-shaped encoder with a padding
# mask, ~400 MB; random weights) exported to ONNX by tests/fixtures/gen_onnx_models.py
# --large into the fixture cache on first use (tests/fixtures/onnx-cache.sh), run by kiln
# on cpu and compared with ONNX Runtime. Skipped (exit 77), saying why, when no Python with
# the fixture packages is found.
set -eu
parity=$1
name=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rc=0
dir=$("$root/tests/fixtures/onnx-cache.sh" large "$name") || rc=$?
if [ "$rc" != 0 ]; then
    echo "$dir"
    exit "$rc"
fi
exec "$parity" "$dir" cpu "$name"
