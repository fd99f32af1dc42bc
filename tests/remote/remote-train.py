#!/usr/bin/env python3
"""tests/remote/remote-train.py — the Fashion-MNIST MLP example trained on local "cpu" and on
remote://127.0.0.1:PORT/cpu (a kilnd started here) from the same seed: every step's loss must be
the same number to the last bit, and so must the test accuracy.

Usage: remote-train.py KILND FASHION_MNIST_EXAMPLE

A 1,280-image subset, batch 64, 2 epochs: 40 optimizer steps (Adam, cosine schedule), evaluated
on the first 1,000 test images. Exit 77 (skipped) when the dataset-fashion-mnist package is absent.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

KILND, EXAMPLE = sys.argv[1], sys.argv[2]
DATA = os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")

if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
    print("skipped: Fashion-MNIST not found in %s (install dataset-fashion-mnist)" % DATA)
    sys.exit(77)

tmp = tempfile.mkdtemp(prefix="kiln-remote-train-")
daemon = None
try:
    data_dir = os.path.join(tmp, "kilnd")
    os.makedirs(data_dir)
    log = open(os.path.join(tmp, "kilnd.log"), "wb")
    daemon = subprocess.Popen([KILND, "--port", "0", "--data-dir", data_dir], stdout=subprocess.DEVNULL, stderr=log)
    portfile = os.path.join(data_dir, "kilnd.port")
    deadline = time.time() + 20
    while not os.path.exists(portfile) or not open(portfile).read().strip():
        if daemon.poll() is not None or time.time() > deadline:
            raise SystemExit("kilnd did not start")
        time.sleep(0.01)
    port = int(open(portfile).read())

    def run(device, out):
        p = subprocess.run([EXAMPLE, "mlp", "2", "--subset", "1280", "--test-subset", "1000", "--batch", "64",
                            "--workers", "2", "--data", DATA, "--out", os.path.join(tmp, out), "--device", device,
                            "--print-losses"], capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise SystemExit("%s run failed (%d): %s" % (device, p.returncode, p.stderr[-2000:]))
        losses = [line.split()[3] for line in p.stdout.splitlines() if line.startswith("step ")]
        acc = [line for line in p.stdout.splitlines() if "test accuracy" in line]
        return losses, acc[0].split("test accuracy ")[1].split()[0] if acc else None

    spec = "remote://127.0.0.1:%d/cpu" % port
    local, local_acc = run("cpu", "local")
    remote, remote_acc = run(spec, "remote")
    assert len(local) == 40, "expected 40 steps, got %d" % len(local)
    assert len(remote) == len(local), "remote ran %d steps, local %d" % (len(remote), len(local))
    for i, (a, b) in enumerate(zip(local, remote)):
        assert a == b, "step %d: local loss %s, remote %s" % (i + 1, a, b)
    assert float(local[-1]) < float(local[0]) - 0.5, "the loss did not fall: %s -> %s" % (local[0], local[-1])
    assert local_acc == remote_acc, "test accuracy: local %s, remote %s" % (local_acc, remote_acc)
    print("%d steps, losses identical (first %s, last %s); test accuracy %s on both" %
          (len(local), local[0], local[-1], local_acc))
finally:
    if daemon and daemon.poll() is None:
        daemon.terminate()
        daemon.wait(timeout=30)
    shutil.rmtree(tmp, ignore_errors=True)
