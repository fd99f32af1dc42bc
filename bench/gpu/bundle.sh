#!/bin/sh
# bench/gpu/bundle.sh — pack a release build made here for a GPU machine that cannot build kiln
# itself (no package registry there, so no libuv, cJSON, OpenBLAS, SQLite or llhttp to build
# against). Writes .gpu-bundle/kiln-gpu.tar.xz at the repository root holding:
#   build-bench/...  the targets bench/gpu/run runs, at their build-tree paths (their run paths
#                    are relative, $ORIGIN/../.., so libkiln.so.0 is found beside them);
#   bin/wrk          the HTTP load generator the serving benches use, when this machine has it;
#   lib/             the shared libraries those targets need beyond glibc and the CUDA toolkit,
#                    copied from this machine; bench/gpu/run links only those the GPU machine
#                    lacks into its library path, so nothing there is shadowed;
#   fashion-mnist/   the first 6400 training and 1000 test images of Fashion-MNIST in the IDX
#                    format (counts rewritten), for the CNN training check.
# The CUDA libraries themselves (cudart, cuBLAS/cuBLASLt, NVRTC, cuDNN) are not packed: the GPU
# machine's toolkit provides them (same major version as this build's toolkit).
# Usage: bench/gpu/bundle.sh  (after `meson compile -C build-bench`, release, cuda and vulkan on)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build-bench
out=$root/.gpu-bundle
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
targets="libkiln.so.0.1.0 tests/conformance/conformance tests/cuda/test-cuda-device tests/cuda/test-cuda-rtc
tests/onnx/onnx_graphs tests/onnx/onnx_parity tests/fusion/test-fusion tests/vulkan/test-vulkan tests/vulkan-nn/test-nn-entries tests/vulkan-nn/vulkan-probe
bench/onnx/onnx-run bench/onnx/onnx-train-step bench/engine/vulkan-gpu bench/engine/fusion-bench examples/fashion_mnist daemon/kilnd"
for t in $targets; do
    if [ ! -f "$build/$t" ]; then
        echo "bundle.sh: $build/$t is missing (build build-bench with cuda and vulkan first)" >&2
        exit 1
    fi
    mkdir -p "$stage/build-bench/$(dirname "$t")"
    cp "$build/$t" "$stage/build-bench/$t"
done
ln -s libkiln.so.0.1.0 "$stage/build-bench/libkiln.so.0"
# wrk drives the serving benches; a GPU machine's image lacks it
tools=
if command -v wrk >/dev/null 2>&1; then
    mkdir -p "$stage/bin"
    cp "$(command -v wrk)" "$stage/bin/wrk"
    tools="$stage/bin/wrk"
fi
ln -s libkiln.so.0 "$stage/build-bench/libkiln.so"
# libraries beyond glibc, the compiler's runtime and the CUDA toolkit
mkdir -p "$stage/lib"
{
    for t in $targets; do ldd "$build/$t"; done
    [ -z "$tools" ] || ldd "$tools"
} | awk '$3 ~ /^\// {print $1, $3}' | sort -u |
    while read -r soname path; do
        case "$soname" in
        libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libgcc_s.so* | libstdc++.so* | ld-linux*) ;;
        libcuda* | libcublas* | libcudnn* | libnvrtc* | libkiln*) ;;
        *) cp -L "$path" "$stage/lib/$soname" ;;
        esac
    done
# a Fashion-MNIST subset: IDX headers hold the count (big-endian) at byte 4
data=${KILN_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ -f "$data/train-images-idx3-ubyte.gz" ]; then
    mkdir -p "$stage/fashion-mnist"
    python3 - "$data" "$stage/fashion-mnist" <<'EOF'
import gzip, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for prefix, n in (("train", 6400), ("t10k", 1000)):
    for kind, item in (("images-idx3", 784), ("labels-idx1", 1)):
        name = "%s-%s-ubyte.gz" % (prefix, kind)
        raw = gzip.open("%s/%s" % (src, name)).read()
        dims = raw[3]
        header = bytearray(raw[:4 + 4 * dims])
        struct.pack_into(">I", header, 4, n)
        with gzip.open("%s/%s" % (dst, name), "wb") as f:
            f.write(bytes(header) + raw[4 + 4 * dims: 4 + 4 * dims + n * item])
EOF
else
    echo "bundle.sh: no Fashion-MNIST in $data: the CNN check will skip" >&2
fi
mkdir -p "$out"
# xz -9 on one thread keeps a 64 MiB window: the programs share most of their bytes (each
# links the engine statically), so the later ones cost little; a GPU call carries 64 MiB in all
tar -C "$stage" -cf - . | xz -9 -T1 >"$out/kiln-gpu.tar.xz"
size=$(stat -c %s "$out/kiln-gpu.tar.xz")
echo "bundle.sh: $out/kiln-gpu.tar.xz, $((size >> 20)) MiB"
[ "$size" -lt $((48 << 20)) ] ||
    echo "bundle.sh: over 48 MiB: with the source tree it may not fit a 64 MiB transfer" >&2
