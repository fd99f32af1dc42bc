#!/bin/sh
# tests/onnx/check_large.sh PARITY OUTDIR NAME — a bench-sized model (resnet50_b1: torchvision
# ResNet-50, ~100 MB; bert: a 12-layer BERT-base-shaped encoder with a padding mask, ~400 MB;
# random weights) exported to ONNX by tests/fixtures/gen_onnx_models.py --large into OUTDIR
# on first use, run by kiln and compared with ONNX Runtime. Too large to commit, so made
# here. Skipped (exit 77) when the fixtures venv lacks torch, torchvision, onnx or
# onnxruntime.
set -eu
parity=$1
out=$2
name=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${KILN_FIXTURES_PYTHON:-$root/.venv-fixtures/bin/python}
if [ ! -x "$py" ] || ! "$py" -c 'import torch, torchvision, onnx, onnxruntime, safetensors' 2>/dev/null; then
    echo "skip: $py with torch, torchvision, onnx, onnxruntime and safetensors is needed"
    exit 77
fi
if [ ! -f "$out/$name.onnx" ] || [ ! -f "$out/$name.io.safetensors" ]; then
    mkdir -p "$out"
    "$py" "$root/tests/fixtures/gen_onnx_models.py" "$out" --large "$name"
fi
exec "$parity" "$out" cpu "$name"
