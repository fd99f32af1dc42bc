#!/bin/sh
# tests/fusion/conformance-gpu.sh CONFORMANCE SPEC: every conformance case on SPEC (a fused
# GPU device, "fused:cuda:0") against ref; exit 77 (skipped) when it does not open here,
# with the reason.
out=$("$1" -b "$2" 2>&1)
rc=$?
printf '%s\n' "$out"
if printf '%s\n' "$out" | grep -q "^backend $2: does not open here"; then
    echo "conformance on $2: skipped: the device does not open here"
    exit 77
fi
exit $rc
