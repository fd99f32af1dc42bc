#!/usr/bin/env python3
"""Replicas behave as replicas: two kilnd processes serving one read-only model folder.

Usage: test_replicas.py KILND FIXTURES_DIR

- The model folder (--model-repository) is read-only for kilnd: as root the replicas run as
  another uid (setpriv) over a root-owned folder; otherwise the folder's write bits are removed.
  Each replica keeps its writable state in its own data folder.
- Both replicas load every model and give bit-identical answers to the same requests, equal to
  the fixture's reference output.
- A rolling restart under steady load: client threads send inferences to both replicas, a new
  connection each, while each replica in turn gets SIGTERM, exits 0 and is started again on the
  same data folder. A connection the stopped replica refuses or resets before answering is sent
  to the other replica (what a load balancer does); every request that got an answer got 200,
  and every request was answered.
"""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

KILND, FIX = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="kilnd-replicas-")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
FAILURES = []
AS_OTHER_USER = os.geteuid() == 0 and shutil.which("setpriv") is not None
OTHER_UID = 65534


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def call(port, method, path, body=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers={"Connection": "close", "Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


class Replica:
    def __init__(self, name, models):
        self.name, self.models = name, models
        self.data = os.path.join(TMP, name)
        os.makedirs(self.data, exist_ok=True)
        if AS_OTHER_USER:
            os.chown(self.data, OTHER_UID, OTHER_UID)
        self.generation = 0
        self.start()

    def start(self):
        self.generation += 1
        portfile = os.path.join(self.data, "kilnd.port")
        if os.path.exists(portfile):
            os.unlink(portfile)
        argv = [KILND, "--port", "0", "--data-dir", self.data, "--model-repository", self.models]
        if AS_OTHER_USER:
            argv = ["setpriv", "--reuid=%d" % OTHER_UID, "--regid=%d" % OTHER_UID, "--clear-groups"] + argv
        self.log = os.path.join(TMP, "%s.%d.log" % (self.name, self.generation))
        self.proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"))
        deadline = time.time() + 30
        self.port = None
        while time.time() < deadline and self.proc.poll() is None:
            if os.path.exists(portfile):
                try:
                    port = int(open(portfile).read())
                    if call(port, "GET", "/v2/health/ready")[0] == 200 and \
                            call(port, "GET", "/v2/models/cnn/ready")[0] == 200 and \
                            call(port, "GET", "/v2/models/mnist_mlp/ready")[0] == 200:
                        self.port = port
                        return
                except (OSError, ValueError):
                    pass
            time.sleep(0.05)
        raise RuntimeError("replica %s did not become ready: %s" % (self.name, open(self.log).read()[-2000:]))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def make_model_folder():
    models = os.path.join(TMP, "models")
    shutil.copytree(os.path.join(FIX, "serving", "mnist_mlp"), os.path.join(models, "mnist_mlp"))
    os.makedirs(os.path.join(models, "cnn", "1"))
    shutil.copy(os.path.join(FIX, "onnx", "cnn.onnx"), os.path.join(models, "cnn", "1", "model.onnx"))
    for root, dirs, files in os.walk(models):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o555 if not AS_OTHER_USER else 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o444)
    os.chmod(models, 0o555 if not AS_OTHER_USER else 0o755)
    os.chmod(TMP, 0o755)
    return models


def mlp_request(seed):
    data = [((i * 7919 + seed * 104729) % 1000) / 1000.0 for i in range(784)]
    return json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": data}]})


def test_same_answers(a, b):
    ref = json.load(open(os.path.join(FIX, "serving", "expected.json")))
    x = ref["input"]
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [len(x), 784] if isinstance(x[0], list)
                                   else [1, 784], "data": x}]})
    outs = []
    for r in (a, b):
        status, raw = call(r.port, "POST", "/v2/models/mnist_mlp/infer", body)
        check(status == 200, "replica %s answers the reference request: %d %s" % (r.name, status, raw[:200]))
        outs.append(json.loads(raw)["outputs"][0]["data"] if status == 200 else None)
    flat = ref["logits"]
    while flat and isinstance(flat[0], list):
        flat = [v for row in flat for v in row]
    check(outs[0] is not None and outs[0] == outs[1], "both replicas give bit-identical logits")
    check(outs[0] is not None and all(abs(p - q) <= 1e-4 * max(1.0, abs(q)) for p, q in zip(outs[0], flat)),
          "and they equal the fixture's reference logits")
    for seed in range(5):
        answers = [call(r.port, "POST", "/v2/models/mnist_mlp/infer", mlp_request(seed))[1] for r in (a, b)]
        check(json.loads(answers[0])["outputs"] == json.loads(answers[1])["outputs"],
              "request %d: identical outputs from both replicas" % seed)
    for r in (a, b):
        check(not os.path.exists(os.path.join(r.models, "mnist_mlp", "1", ".kiln")) and
              sorted(os.listdir(r.models)) == ["cnn", "mnist_mlp"], "replica %s wrote nothing into the model folder"
              % r.name)
        check(os.path.exists(os.path.join(r.data, "kiln.db")), "replica %s keeps its job store in its data folder"
              % r.name)


def test_rolling_restart(replicas):
    stop = threading.Event()
    lock = threading.Lock()
    stats = {"answered": 0, "retries": 0, "bad": [], "unanswered": 0}

    def client(k):
        n = 0
        while not stop.is_set():
            body = mlp_request(k * 100000 + n)
            n += 1
            answered = False
            for attempt in range(20):
                r = replicas[(n + attempt) % len(replicas)]
                try:
                    status, raw = call(r.port, "POST", "/v2/models/mnist_mlp/infer", body, timeout=30)
                except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected,
                        BrokenPipeError) as e:
                    # Refused, or closed before any answer: the request was not accepted there.
                    with lock:
                        stats["retries"] += 1
                    time.sleep(0.01)
                    continue
                with lock:
                    if status == 200:
                        stats["answered"] += 1
                    else:
                        stats["bad"].append((r.name, status, raw[:200]))
                answered = True
                break
            if not answered:
                with lock:
                    stats["unanswered"] += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    for r in replicas:
        before = stats["answered"]
        rc = r.stop()
        check(rc == 0, "replica %s exits 0 on SIGTERM under load" % r.name)
        r.start()
        time.sleep(0.5)
        check(stats["answered"] > before, "requests kept being answered while %s restarted" % r.name)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    print("rolling restart: %d answered, %d connection retries, %d non-200, %d unanswered"
          % (stats["answered"], stats["retries"], len(stats["bad"]), stats["unanswered"]), flush=True)
    check(not stats["bad"], "no accepted request got anything but 200: %s" % stats["bad"][:5])
    check(stats["unanswered"] == 0, "every request was answered by some replica")


def main():
    models = make_model_folder()
    print("replicas run as %s; the model folder is read-only for them" %
          ("uid %d" % OTHER_UID if AS_OTHER_USER else "this user, with the folder's write bits removed"), flush=True)
    replicas = []
    try:
        replicas = [Replica("a", models), Replica("b", models)]
        test_same_answers(*replicas)
        test_rolling_restart(replicas)
        for r in replicas:
            check(r.stop() == 0, "replica %s exits 0 at the end" % r.name)
    finally:
        for r in replicas:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
        for root, dirs, _ in os.walk(TMP):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
        shutil.rmtree(TMP, ignore_errors=True)
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        sys.exit(1)
    print("all replica checks passed")


if __name__ == "__main__":
    main()
