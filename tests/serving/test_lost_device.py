#!/usr/bin/env python3
"""kilnd with a device that is lost while it serves (a GPU fault): the counting decorator's
lose_on option loses counting:cpu at its first matmul, which the first inference reaches.
Before: server and model ready. After: the inference that hit it answers 503 (the server's
fault, not the input's), /v2/health/ready and the model's ready answer 503 naming the device,
the repository index shows the version UNAVAILABLE with that reason, and a model on the
healthy cpu device next to it still answers.

Usage: test_lost_device.py KILND FIXTURE_DIR
"""
import http.client
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND, FIX = sys.argv[1], sys.argv[2]
FAILURES = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def req(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body=None if body is None else json.dumps(body))
    r = c.getresponse()
    raw = r.read()
    c.close()
    try:
        return r.status, json.loads(raw) if raw else None
    except ValueError:
        return r.status, raw


def add_model(data, name, device):
    dst = os.path.join(data, "models", name)
    shutil.copytree(os.path.join(FIX, "mnist_mlp"), dst)
    cfg_path = os.path.join(dst, "1", "config.json")
    cfg = json.load(open(cfg_path))
    cfg["device"] = device
    json.dump(cfg, open(cfg_path, "w"))


def add_models(data):
    add_model(data, "on_lost", "counting:cpu")
    add_model(data, "on_cpu", "cpu")


d = None
try:
    d = H.Daemon(KILND, "lost", setup=add_models, data_roots=False,
                 extra=["--devices", "cpu,counting:cpu", "--device-options", "counting:lose_on=matmul"])
    port = d.port
    deadline = time.time() + 30
    while time.time() < deadline:
        if all(req(port, "GET", "/v2/models/%s/ready" % m)[0] == 200 for m in ("on_lost", "on_cpu")):
            break
        time.sleep(0.05)
    check(req(port, "GET", "/v2/health/ready")[0] == 200, "the server is ready before the loss")
    check(req(port, "GET", "/v2/models/on_lost/ready")[0] == 200, "the model is ready before the loss")

    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": [0.25] * 784}]}
    st, r = req(port, "POST", "/v2/models/on_lost/infer", body)
    check(st == 503 and "lost" in str(r), "the inference that meets the lost device: 503 %s" % str(r)[:200])
    st, r = req(port, "GET", "/v2/health/ready")
    check(st == 503 and "counting:cpu" in str(r) and "lost" in str(r),
          "/v2/health/ready names the lost device: %s %s" % (st, r))
    st, r = req(port, "GET", "/v2/models/on_lost/ready")
    check(st == 503 and "lost" in str(r), "the model's ready: %s %s" % (st, r))
    st, rows = req(port, "POST", "/v2/repository/index")
    row = [x for x in rows or [] if x.get("name") == "on_lost"]
    check(st == 200 and row and row[0]["state"] == "UNAVAILABLE" and "counting:cpu" in row[0]["reason"],
          "the index shows the version unavailable with the device's reason: %s" % row)
    row = [x for x in rows or [] if x.get("name") == "on_cpu"]
    check(row and row[0]["state"] == "READY", "the model on the healthy device stays READY: %s" % row)
    st, r = req(port, "POST", "/v2/models/on_cpu/infer", body)
    check(st == 200 and len(r["outputs"][0]["data"]) == 10, "the model on cpu still answers: %s" % st)

    # a lose_on that names no entry stops the start, naming the option
    bad = subprocess.run([KILND, "--port", "0", "--data-dir", os.path.join(H.TMP, "bad"), "--devices",
                          "counting:cpu", "--device-options", "counting:lose_on=nosuch"],
                         capture_output=True, text=True, timeout=60, env=H.ENV)
    check(bad.returncode != 0 and "lose_on" in bad.stderr and "nosuch" in bad.stderr,
          "an unknown lose_on entry is refused: rc %d %s" % (bad.returncode, bad.stderr.strip()[-200:]))
finally:
    if d:
        d.stop(timeout=30)
    if FAILURES and d:
        print(open(d.log).read()[-3000:])
    H.cleanup()
if FAILURES:
    print("%d check(s) failed" % len(FAILURES))
    sys.exit(1)
print("all checks passed")
