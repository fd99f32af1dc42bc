#!/usr/bin/env python3
"""tests/vulkan-nn/run-conformance.py — the conformance cases of some op families on vulkan:0,
compared with ref: passes only when cases ran and none failed or was skipped as unsupported (the
device's features decide what `supports` says; on a device with f16 and f64, such as lavapipe,
every case must run).

Usage: run-conformance.py PROBE CONFORMANCE [OPS]   (no OPS: every case of the harness)

Exit 77 (skipped) when vulkan:0 does not open on this machine.
"""
import subprocess
import sys

PROBE, CONFORMANCE = sys.argv[1:3]
OPS = sys.argv[3] if len(sys.argv) > 3 else ""
probe = subprocess.run([PROBE, "vulkan:0"], capture_output=True, text=True)
if probe.returncode != 0:
    print(probe.stdout.strip() or "skipped: vulkan:0 does not open")
    sys.exit(77)
print("device: " + probe.stdout.strip())
# the backend's own kernels: vulkan:0 without its default fusion (conformance-fused-vulkan-0 runs it fused)
cmd = [CONFORMANCE, "-b", "vulkan:0?fusion=off"] + (["-o", OPS] if OPS else [])
p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
out = p.stdout.splitlines()
for line in out:
    if line.startswith("FAIL") or line.startswith("conformance:") or "skipped" in line or "not tested" in line:
        print(line)
summary = [line for line in out if line.startswith("conformance:")]
if p.returncode != 0 or not summary:
    sys.exit("conformance exited %d: %s" % (p.returncode, p.stderr[-2000:]))
if " 0 failed, 0 skipped" not in summary[0] or summary[0].startswith("conformance: 0 passed"):
    sys.exit("not every case ran and passed: " + summary[0])
