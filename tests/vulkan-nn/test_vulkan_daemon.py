#!/usr/bin/env python3
"""tests/vulkan-nn/test_vulkan_daemon.py — kilnd driving vulkan:0, black-box over real sockets:

  serving  the example CNN (examples/models/cnn, ONNX) loaded twice, once with a config.json naming
           device "vulkan:0" and once "cpu"; both answer /v2 inference and agree within 1e-4 of the
           largest output;
  jobs     a training job submitted with "device": "vulkan:0" (a small MLP on a separable synthetic
           CSV) reaches succeeded, learns (valid accuracy > 0.8) and its registered model classifies
           the three class prototypes;
  remote   the conformance cases of the nn kernels run against remote://127.0.0.1:PORT/vulkan:0,
           the server's Vulkan device driven through the remote backend, and match ref.

Usage: test_vulkan_daemon.py PROBE KILND CONFORMANCE MODELS_DIR

Exit 77 (skipped) when vulkan:0 does not open on this machine.
"""
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

PROBE, KILND, CONFORMANCE, MODELS = sys.argv[1:5]
# the device under test: vulkan:0 unless KILN_TEST_DEVICE names another (cuda:0 on a GPU machine)
DEVICE = os.environ.get("KILN_TEST_DEVICE", "vulkan:0")
FAILURES = []

probe = subprocess.run([PROBE, DEVICE], capture_output=True, text=True)
if probe.returncode != 0:
    print(probe.stdout.strip() or "skipped: %s does not open" % DEVICE)
    sys.exit(77)

TMP = tempfile.mkdtemp(prefix="kilnd-vulkan-")
DATA = os.path.join(TMP, "data")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


class Daemon:
    def __init__(self, data_dir):
        self.log = os.path.join(TMP, "kilnd.log")
        self.proc = subprocess.Popen([KILND, "--port", "0", "--data-dir", data_dir, "--data-roots", DATA,
                                      "--devices", "cpu," + DEVICE],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"), env=ENV)
        portfile = os.path.join(data_dir, "kilnd.port")
        deadline = time.time() + 30
        while not os.path.exists(portfile) or not open(portfile).read().strip():
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit("kilnd did not start: " + open(self.log).read()[-2000:])
            time.sleep(0.02)
        self.port = int(open(portfile).read())

    def req(self, method, path, body=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request(method, path, body=None if body is None else json.dumps(body))
        r = c.getresponse()
        raw = r.read()
        c.close()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def add_model(data_dir, name, device):
    folder = os.path.join(data_dir, "models", name, "1")
    os.makedirs(folder)
    shutil.copy(os.path.join(MODELS, "cnn", "1", "model.onnx"), folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"max_batch_size": 8, "device": device}, f)


def test_serving(d):
    rnd = random.Random(5)
    x = [rnd.uniform(-1, 1) for _ in range(2 * 784)]
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 1, 28, 28], "data": x}]}
    deadline = time.time() + 60  # models load in the background after start
    while time.time() < deadline:
        st, meta = d.req("GET", "/v2/models/cnn_vulkan/ready")
        st2, _ = d.req("GET", "/v2/models/cnn_cpu/ready")
        if st == 200 and st2 == 200:
            break
        time.sleep(0.1)
    check(st == 200, "the model configured for vulkan:0 loads and is ready: %s %s" % (st, meta))
    outs = {}
    for name in ("cnn_vulkan", "cnn_cpu"):
        st, r = d.req("POST", "/v2/models/%s/infer" % name, body)
        check(st == 200, "%s answers inference: %s %s" % (name, st, str(r)[:300]))
        if st == 200:
            outs[name] = r["outputs"][0]["data"]
    if len(outs) == 2:
        a, b = outs["cnn_vulkan"], outs["cnn_cpu"]
        scale = max(abs(v) for v in b) or 1.0
        err = max(abs(p - q) for p, q in zip(a, b)) / scale
        check(len(a) == len(b) == 20 and err <= 1e-4, "vulkan:0 and cpu logits agree: max error %.2e" % err)


def test_metrics(d):
    """/metrics shows vulkan:0's allocator figures (the model's weights are in use there), and
    cpu's beside them (its buffer pool)."""
    st, text = d.req("GET", "/metrics")
    text = text.decode() if isinstance(text, bytes) else str(text)
    values = {}
    for line in text.splitlines():
        if line.startswith("kiln_device_memory"):
            key, _, v = line.rpartition(" ")
            values[key] = float(v)
    in_use = values.get('kiln_device_memory_bytes{device="%s",state="in_use"}' % DEVICE, 0)
    cached = values.get('kiln_device_memory_bytes{device="%s",state="cached"}' % DEVICE, -1)
    peak = values.get('kiln_device_memory_peak_bytes{device="%s"}' % DEVICE, 0)
    allocs = values.get('kiln_device_memory_allocations_total{device="%s"}' % DEVICE, 0)
    check(st == 200 and in_use > 0 and cached >= 0 and peak >= in_use and allocs >= 1,
          "/metrics: vulkan:0 memory in use %d, %d cached, peak %d, %d driver allocations"
          % (in_use, cached, peak, allocs))
    states = sorted(k.split('state="')[1].split('"')[0] for k in values
                    if k.startswith('kiln_device_memory_bytes{device="%s"' % DEVICE))
    check(states == ["cached", "in_use"], "its states are the parts of what it reserved, summing to it: %s" % states)
    cpu_in_use = values.get('kiln_device_memory_bytes{device="cpu",state="in_use"}', -1)
    cpu_peak = values.get('kiln_device_memory_peak_bytes{device="cpu"}', -1)
    check(cpu_in_use >= 0 and cpu_peak >= cpu_in_use,
          "/metrics: cpu's figures, memory in use %d, peak %d" % (cpu_in_use, cpu_peak))


def write_csv(path, n, seed):
    """Three separable classes in four features."""
    rnd = random.Random(seed)
    with open(path, "w") as f:
        f.write("a,b,c,d,label\n")
        for _ in range(n):
            c = rnd.randrange(3)
            xs = [rnd.gauss(2.0 if k == c else 0.0, 0.5) for k in range(4)]
            f.write(",".join("%.4f" % v for v in xs) + ",%d\n" % c)


def test_job(d):
    write_csv(os.path.join(DATA, "train.csv"), 300, 11)
    spec = {
        "model": {"inputs": ["x"], "nodes": [
            {"name": "fc1", "layer": "Linear", "config": {"in_features": 4, "out_features": 16}, "inputs": ["x"]},
            {"name": "act", "op": "relu", "inputs": ["fc1"]},
            {"name": "fc2", "layer": "Linear", "config": {"in_features": 16, "out_features": 3}, "inputs": ["act"]}],
            "outputs": ["fc2"]},
        "data": {"type": "csv", "train": os.path.join(DATA, "train.csv"), "label_column": "label",
                 "valid_split": 0.2},
        "loss": "cross_entropy", "optimizer": {"kind": "adam", "lr": 0.01}, "epochs": 3, "batch_size": 16,
        "seed": 3, "device": DEVICE, "register_as": "toy_vulkan",
    }
    st, j = d.req("POST", "/v1/jobs", spec)
    check(st == 201, "a job naming device vulkan:0 is accepted: %s %s" % (st, j))
    if st != 201:
        return
    deadline = time.time() + 300
    while time.time() < deadline:
        st, job = d.req("GET", "/v1/jobs/%d" % j["id"])
        if st == 200 and job["state"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.1)
    check(job.get("state") == "succeeded", "the vulkan:0 job succeeded: %s %s" % (job.get("state"), job.get("error")))
    acc = (job.get("latest_epoch") or {}).get("valid_accuracy")
    check(acc is not None and acc > 0.8, "it learned: valid_accuracy %s" % acc)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 4], "data": [2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 0]}]}
    st, r = d.req("POST", "/v2/models/toy_vulkan/infer", body)
    ok = st == 200
    if ok:
        out = r["outputs"][0]["data"]
        ok = [max(range(3), key=lambda c: out[row * 3 + c]) for row in range(3)] == [0, 1, 2]
    check(ok, "the model trained on vulkan:0 classifies the three prototypes: %s %s" % (st, str(r)[:300]))


def test_remote(d):
    spec = "remote://127.0.0.1:%d/%s" % (d.port, DEVICE)
    ops = "matmul,linear,conv2d,conv2d_grad,max_pool2d,avg_pool2d,softmax,log_softmax,layer_norm,adam_step"
    p = subprocess.run([CONFORMANCE, "-b", spec, "-o", ops], capture_output=True, text=True, timeout=900)
    out = p.stdout.splitlines()
    for line in out:
        if line.startswith("FAIL") or line.startswith("conformance:"):
            print("  " + line)
    summary = [line for line in out if line.startswith("conformance:")]
    check(p.returncode == 0 and summary and " 0 failed, 0 skipped" in summary[0] and
          not summary[0].startswith("conformance: 0 passed"),
          "conformance of the nn kernels on %s: %s" % (spec, summary[0] if summary else p.stderr[-500:]))


daemon = None
try:
    os.makedirs(DATA)
    data_dir = os.path.join(TMP, "kilnd")
    add_model(data_dir, "cnn_vulkan", DEVICE)
    add_model(data_dir, "cnn_cpu", "cpu")
    daemon = Daemon(data_dir)
    test_serving(daemon)
    test_metrics(daemon)
    test_job(daemon)
    test_remote(daemon)
finally:
    if daemon:
        daemon.stop()
    if FAILURES:
        print(open(os.path.join(TMP, "kilnd.log")).read()[-3000:])
    shutil.rmtree(TMP, ignore_errors=True)
if FAILURES:
    print("%d check(s) failed" % len(FAILURES))
    sys.exit(1)
print("all checks passed")
