#!/bin/sh
# tests/storage/check_torch_resnet.sh COMPARE OUTDIR — a real torchvision ResNet-18
# state_dict (random init, fixed seed; ~45 MB, so generated here rather than committed)
# read by kiln and compared tensor by tensor with PyTorch's own copy. Skipped (exit 77)
# when the fixtures venv (.venv-fixtures, see tests/fixtures/venv.sh) lacks torchvision.
set -eu
compare=$1
out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${KILN_FIXTURES_PYTHON:-$root/.venv-fixtures/bin/python}
if [ ! -x "$py" ] || ! "$py" -c 'import torch, torchvision, safetensors' 2>/dev/null; then
    echo "skip: $py with torch, torchvision and safetensors is needed to write resnet18.pt"
    exit 77
fi
if [ ! -f "$out/resnet18.pt" ] || [ ! -f "$out/resnet18.safetensors" ]; then
    "$py" "$root/tests/fixtures/gen_torch_files.py" --resnet18 "$out"
fi
exec "$compare" "$out/resnet18.pt" "$out/resnet18.safetensors"
