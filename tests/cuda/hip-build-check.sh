#!/bin/sh
# tests/cuda/hip-build-check.sh SRCDIR OUTDIR: the cuda backend's kernel sources compiled
# for AMD GPUs with hipcc through backends/cuda/vendor-hip.h, and linked into a shared
# object whose launchers must all be defined: a compile-and-link check (no AMD GPU needed).
set -eu
src=$1
out=$2
mkdir -p "$out"
hipcc=${HIPCC:-hipcc}
archs="--offload-arch=gfx90a --offload-arch=gfx1030"
objs=
for f in cuda-elementwise cuda-reduce cuda-index cuda-pool cuda-resize; do
    echo "hipcc: $f.cu"
    # rocm_agent_enumerator (which hipcc runs to look for a GPU) prints a traceback on a
    # machine without one; the explicit --offload-arch makes its answer irrelevant
    "$hipcc" -x hip -std=c++17 -O2 -fPIC -DKILN_CUDA_HIP $archs -I"$src" -I"$src/backends/cuda" \
        -c "$src/backends/cuda/$f.cu" -o "$out/$f.o" 2>"$out/$f.log" || { cat "$out/$f.log"; exit 1; }
    objs="$objs $out/$f.o"
done
"$hipcc" -shared $archs -o "$out/libkiln-hip-kernels.so" $objs -Wl,--no-undefined 2>"$out/link.log" ||
    { cat "$out/link.log"; exit 1; }
# every launcher of cuda-kernels.h is defined in the linked object
missing=0
for sym in $(sed -n 's/^int \(kcu_[a-z_]*\)(.*/\1/p' "$src/backends/cuda/cuda-kernels.h"); do
    if ! nm -D --defined-only "$out/libkiln-hip-kernels.so" | grep -q " $sym\$"; then
        echo "hip-build-check: $sym is not defined in the HIP build"
        missing=1
    fi
done
[ $missing -eq 0 ] || exit 1
echo "hip-build-check: the kernels compile and link for gfx90a and gfx1030"
