#!/bin/sh
# bench/lib/venv.sh — make (or reuse) .venv-bench at the repository root: a Python with the
# peers that engine benchmarks compare kiln against (torch CPU build, numpy, onnxruntime), and what
# exports the benchmark models (torchvision, onnx).
# bench/run calls it only for entries that ask for it; progress goes to stderr and the last
# line on stdout is the path of the venv's python.
#
#   bench/lib/venv.sh            create or reuse, print the python path
#   KILN_BENCH_PYTHON_BASE=...   the interpreter to build the venv from (default python3)
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/.venv-bench"
py="$venv/bin/python"
base=${KILN_BENCH_PYTHON_BASE:-python3}

say() { echo "venv.sh: $*" >&2; }

have_all() {
    [ -x "$py" ] && "$py" -c 'import torch, torchvision, numpy, onnx, onnxruntime' >/dev/null 2>&1
}

if have_all; then
    echo "$py"
    exit 0
fi

if [ ! -x "$py" ]; then
    say "creating $venv"
    "$base" -m venv "$venv" >&2
fi
"$py" -m pip install -q --upgrade pip >&2 || say "pip upgrade failed; going on with the bundled pip"

if ! "$py" -c 'import torch' >/dev/null 2>&1; then
    # The CPU-only wheels are a fraction of the size of the default (CUDA) ones.
    say "installing torch (CPU build)"
    if ! "$py" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu >&2; then
        say "download.pytorch.org unreachable or failing; installing torch from PyPI"
        "$py" -m pip install -q torch >&2
    fi
fi
say "installing torchvision (the ResNet exports), numpy, onnx and onnxruntime"
# torchvision from the index torch came from, so pip picks the build that matches it
"$py" -m pip install -q torchvision --index-url https://download.pytorch.org/whl/cpu >&2 ||
    "$py" -m pip install -q torchvision >&2
"$py" -m pip install -q numpy onnx onnxruntime safetensors >&2

if ! have_all; then
    say "torch, torchvision, numpy, onnx or onnxruntime still cannot be imported from $py"
    exit 1
fi
echo "$py"
