#!/bin/sh
# tests/cuda/check-needed.sh READELF LIBKILN — libkiln links no CUDA library: the runtime is
# linked statically and cuBLASLt, cuDNN and NVRTC are loaded when a cuda device first opens
# (backends/cuda/cuda-libs.h), so a process that never opens one does not load them and
# libkiln loads on a machine without them.
set -eu
needed=$("$1" -d "$2" | grep NEEDED || true)
bad=$(printf '%s\n' "$needed" | grep -E 'libcuda|libcublas|libcudnn|libnvrtc' || true)
if [ -n "$bad" ]; then
    echo "libkiln links CUDA libraries it should load at run time:"
    printf '%s\n' "$bad"
    exit 1
fi
echo "libkiln needs no CUDA library ($(printf '%s\n' "$needed" | wc -l) NEEDED entries)"
