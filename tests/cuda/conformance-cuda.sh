#!/bin/sh
# tests/cuda/conformance-cuda.sh CONFORMANCE: every conformance case on cuda:0 against
# ref; exit 77 (skipped) when no GPU opens here, with the reason.
out=$("$1" -b cuda:0 2>&1)
rc=$?
printf '%s\n' "$out"
if printf '%s\n' "$out" | grep -q "^backend cuda:0: does not open here"; then
    echo "conformance-cuda: skipped: no usable CUDA device"
    exit 77
fi
exit $rc
