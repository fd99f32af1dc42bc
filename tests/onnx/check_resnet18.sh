#!/bin/sh
# tests/onnx/check_resnet18.sh PARITY OUTDIR — torchvision ResNet-18 (random weights, ~45 MB,
# so generated here rather than committed) exported to ONNX, run by kiln and compared with
# ONNX Runtime. Skipped (exit 77) when the fixtures venv lacks torch, torchvision, onnx or
# onnxruntime.
set -eu
parity=$1
out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${KILN_FIXTURES_PYTHON:-$root/.venv-fixtures/bin/python}
if [ ! -x "$py" ] || ! "$py" -c 'import torch, torchvision, onnx, onnxruntime, safetensors' 2>/dev/null; then
    echo "skip: $py with torch, torchvision, onnx, onnxruntime and safetensors is needed"
    exit 77
fi
if [ ! -f "$out/resnet18.onnx" ] || [ ! -f "$out/resnet18.io.safetensors" ]; then
    "$py" "$root/tests/fixtures/gen_onnx_models.py" "$out" --resnet18
fi
exec "$parity" "$out" cpu resnet18
