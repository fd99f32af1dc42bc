#!/usr/bin/env python3
"""tests/remote/test_remote_client_conformance.py — the conformance suite (tests/conformance: every
op x dtype x shape case, views, guard buffers, error cases, threads) run against
remote://127.0.0.1:PORT/cpu, a kilnd started here, and compared with ref as every backend is.

Usage: test_remote_client_conformance.py KILND CONFORMANCE
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

KILND, CONFORMANCE = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(prefix="kiln-remote-conf-")
daemon = None
try:
    log = open(os.path.join(tmp, "kilnd.log"), "wb")
    daemon = subprocess.Popen([KILND, "--port", "0", "--data-dir", tmp], stdout=subprocess.DEVNULL, stderr=log)
    portfile = os.path.join(tmp, "kilnd.port")
    deadline = time.time() + 20
    while not os.path.exists(portfile) or not open(portfile).read().strip():
        if daemon.poll() is not None or time.time() > deadline:
            raise SystemExit("kilnd did not start")
        time.sleep(0.01)
    spec = "remote://127.0.0.1:%d/cpu" % int(open(portfile).read())
    p = subprocess.run([CONFORMANCE, "-b", spec], capture_output=True, text=True, timeout=900)
    out = p.stdout.splitlines()
    for line in out:
        if line.startswith("FAIL") or line.startswith("conformance:") or "not tested" in line:
            print(line)
    summary = [line for line in out if line.startswith("conformance:")]
    assert p.returncode == 0 and summary, "conformance exited %d: %s" % (p.returncode, p.stderr[-2000:])
    # the remote device really was tested: every case ran on it, none skipped
    assert " 0 failed, 0 skipped" in summary[0], summary[0]
    assert any(("1 target backend" in line) for line in out), "the remote device was not a target"
finally:
    if daemon and daemon.poll() is None:
        daemon.terminate()
        daemon.wait(timeout=30)
    shutil.rmtree(tmp, ignore_errors=True)
