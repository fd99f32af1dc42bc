#!/usr/bin/env python3
"""tests/vulkan-nn/fashion-cnn.py — the Fashion-MNIST CNN example (2 conv + batch norm + 2 fc,
Adam, cosine schedule) trained for one short epoch on "cpu" and on "vulkan:0" from the same seed:
the last step's training loss must agree within 1e-3 relative and the test accuracy within one
point. Both runs start from the same initial weights (Philox draws depend only on seed, offset and
index, on every backend), see the same batches in the same order, and differ only in how each
device orders and rounds its sums.

Usage: fashion-cnn.py PROBE FASHION_MNIST_EXAMPLE [TRAIN_IMAGES TEST_IMAGES]

Exit 77 (skipped) when the dataset-fashion-mnist package is absent or vulkan:0 does not open.
"""
import os
import shutil
import subprocess
import sys
import tempfile

PROBE, EXAMPLE = sys.argv[1], sys.argv[2]
# the device under test: vulkan:0 unless KILN_TEST_DEVICE names another (cuda:0 on a GPU machine)
DEVICE = os.environ.get("KILN_TEST_DEVICE", "vulkan:0")
TRAIN = int(sys.argv[3]) if len(sys.argv) > 3 else 640
TEST = int(sys.argv[4]) if len(sys.argv) > 4 else 500
DATA = os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")

if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
    print("skipped: Fashion-MNIST not found in %s (install dataset-fashion-mnist)" % DATA)
    sys.exit(77)
probe = subprocess.run([PROBE, DEVICE], capture_output=True, text=True)
if probe.returncode != 0:
    print(probe.stdout.strip() or "skipped: %s does not open" % DEVICE)
    sys.exit(77)

tmp = tempfile.mkdtemp(prefix="kiln-vulkan-cnn-")
try:
    def run(device):
        p = subprocess.run([EXAMPLE, "cnn", "1", "--subset", str(TRAIN), "--test-subset", str(TEST), "--batch", "64",
                            "--workers", "1", "--data", DATA, "--out", os.path.join(tmp, device.replace(":", "")),
                            "--device", device, "--print-losses", "--json"],
                           capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            raise SystemExit("%s run failed (%d): %s" % (device, p.returncode, p.stderr[-2000:]))
        losses = [float(line.split()[3]) for line in p.stdout.splitlines() if line.startswith("step ")]
        acc = [line for line in p.stdout.splitlines() if "test accuracy" in line]
        if not losses or not acc:
            raise SystemExit("%s run printed no losses or accuracy: %s" % (device, p.stdout[-2000:]))
        return losses, float(acc[0].split("test accuracy ")[1].split()[0])

    cpu, cpu_acc = run("cpu")
    vk, vk_acc = run(DEVICE)
    steps = (TRAIN + 63) // 64
    assert len(cpu) == steps and len(vk) == steps, "expected %d steps: cpu %d, %s %d" % (steps, len(cpu), DEVICE,
                                                                                      len(vk))
    worst = max(abs(a - b) / abs(a) for a, b in zip(cpu, vk))
    print("%d steps; loss cpu %.6f -> %.6f, %s %.6f -> %.6f; worst relative step difference %.2e" %
          (steps, cpu[0], cpu[-1], DEVICE, vk[0], vk[-1], worst))
    print("test accuracy on %d images: cpu %.4f, %s %.4f" % (TEST, cpu_acc, DEVICE, vk_acc))
    assert cpu[-1] < cpu[0], "the cpu loss did not fall: %s -> %s" % (cpu[0], cpu[-1])
    rel = abs(cpu[-1] - vk[-1]) / abs(cpu[-1])
    # rounding differences compound step by step: 1e-3 over the default ten steps, proportionally
    # more over a longer run
    tol = 1e-3 * max(1.0, steps / 10.0)
    assert rel <= tol, "last loss differs by %.2e relative, over %.0e (cpu %r, %s %r)" % (
        rel, tol, cpu[-1], DEVICE, vk[-1])
    assert abs(cpu_acc - vk_acc) <= 0.01, "test accuracy differs by more than one point: cpu %s, %s %s" % (
        cpu_acc, DEVICE, vk_acc)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
