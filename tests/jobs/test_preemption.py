#!/usr/bin/env python3
"""Inference preempts training in a real kilnd: while a training job runs, inference requests to
a served model (the serving fixture's MLP) make the job's steps yield, which /metrics counts in
kiln_training_yields_total and kiln_training_wait_seconds_total; every request is answered with
the fixture's logits, and the job still finishes and registers its model. A second kilnd with
training.max_wait_ms = 0 shows the gate off: the same load makes no yields.

Nothing here is timed: the load runs until the counter has risen (or the job has ended, which
fails the check), so a slow or loaded machine only makes the test take longer.

Usage: test_preemption.py KILND FIXTURES_SERVING
"""
import http.client
import json
import os
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402
from kilnd_harness import DATA, TMP, check  # noqa: E402

KILND, FIX = sys.argv[1], sys.argv[2]
EXPECTED = json.load(open(os.path.join(FIX, "expected.json")))
BODY = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784],
                               "data": EXPECTED["input"][0]}]})


SPEC = {
    "model": {
        "inputs": ["x"],
        "nodes": [
            {"name": "fc1", "layer": "Linear", "config": {"in_features": 4, "out_features": 64}, "inputs": ["x"]},
            {"name": "act", "op": "relu", "inputs": ["fc1"]},
            {"name": "fc2", "layer": "Linear", "config": {"in_features": 64, "out_features": 3}, "inputs": ["act"]},
        ],
        "outputs": ["fc2"],
    },
    "data": {"type": "csv", "train": os.path.join(DATA, "train.csv"), "label_column": "label"},
    "loss": "cross_entropy",
    "optimizer": {"kind": "adam", "lr": 0.01},
    "epochs": 100,
    "batch_size": 8,
    "seed": 5,
    "register_as": "preempted",
}


class Daemon(H.Daemon):
    """The harness's kilnd with the serving fixture's MLP in its repository, ready to answer."""

    def __init__(self, name, *flags):
        models = os.path.join(TMP, name, "models")
        os.makedirs(models, exist_ok=True)
        shutil.copytree(os.path.join(FIX, "mnist_mlp"), os.path.join(models, "mnist_mlp"))
        super().__init__(KILND, name, fresh=False, extra=flags)
        deadline = time.time() + 20
        while self.req("GET", "/v2/models/mnist_mlp/ready")[0] != 200:
            if time.time() > deadline:
                raise RuntimeError("the model did not load: " + open(self.log).read())
            time.sleep(0.02)

    def metric(self, name):
        st, text = self.req("GET", "/metrics")
        for line in text.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise RuntimeError("no %s in /metrics" % name)

    def job_state(self, jid):
        return self.req("GET", "/v1/jobs/%d" % jid)[1]["state"]

    def stop(self):
        super().stop()
        # A sanitizer report at exit (a leak included) makes the exit status non-zero.
        check(self.proc.returncode == 0, "kilnd exited 0 after SIGTERM (%s)" % self.proc.returncode)


class Load:
    """Clients sending the fixture's row back to back until told to stop; each answer checked."""

    def __init__(self, d, clients=3):
        self.d, self.stop_flag, self.bad, self.sent = d, threading.Event(), [], 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def run(self):
        want = EXPECTED["logits"][0]
        c = http.client.HTTPConnection("127.0.0.1", self.d.port, timeout=30)
        while not self.stop_flag.is_set():
            c.request("POST", "/v2/models/mnist_mlp/infer", body=BODY)
            r = c.getresponse()
            raw = r.read()
            ok = r.status == 200
            if ok:
                got = json.loads(raw)["outputs"][0]["data"]
                ok = len(got) == 10 and all(abs(a - b) <= 1e-4 * (1 + abs(b)) for a, b in zip(got, want))
            with self.lock:
                self.sent += 1
                if not ok:
                    self.bad.append((r.status, raw[:200]))
        c.close()

    def finish(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join()


def run_job_under_load(d, stop_when):
    """Submits the job, loads the server while it runs until stop_when() or the job ends; returns
    (job id, whether the job was still running when the load stopped, the load)."""
    st, j = d.req("POST", "/v1/jobs", SPEC)
    check(st == 201, "job submitted (%d %s)" % (st, j))
    jid = j["id"]
    while d.job_state(jid) == "queued":
        time.sleep(0.01)
    load = Load(d)
    running = True
    while not stop_when():
        if d.job_state(jid) != "running":
            running = False
            break
        time.sleep(0.01)
    load.finish()
    return jid, running, load


def wait_final(d, jid):
    deadline = time.time() + 120
    while time.time() < deadline:
        s = d.job_state(jid)
        if s in ("succeeded", "failed", "cancelled"):
            return s
        time.sleep(0.05)
    return "timeout"


def main():
    H.write_csv(os.path.join(DATA, "train.csv"), 2000, 1)

    # The gate on, with a short bound so that training still moves under this constant load.
    d = Daemon("gated", "--training-max-wait-ms", "20")
    try:
        check(d.metric("kiln_training_yields_total") == 0, "no yields before any training")
        jid, running, load = run_job_under_load(d, lambda: d.metric("kiln_training_yields_total") >= 5)
        check(running, "the job was still running when its steps had yielded to inference")
        check(not load.bad and load.sent > 0, "%d inference answers, all the fixture's logits (%s)"
              % (load.sent, load.bad[:2]))
        check(d.metric("kiln_training_yields_total") >= 5, "kiln_training_yields_total rose under inference load")
        check(d.metric("kiln_training_wait_seconds_total") > 0, "kiln_training_wait_seconds_total > 0")
        steps_mid = d.metric("kiln_training_steps_total")
        check(steps_mid > 0, "training steps went through the gate (%g)" % steps_mid)
        state = wait_final(d, jid)
        check(state == "succeeded", "the job finished after the load (%s)" % state)
        check(d.metric("kiln_training_steps_total") > steps_mid, "steps went on after the load stopped")
        st, j = d.req("GET", "/v1/jobs/%d" % jid)
        check(st == 200 and j.get("state") == "succeeded", "job record says succeeded")
        check("yielded to inference" in open(d.log).read(), "the job's log line reports its yields")
    finally:
        d.stop()

    # The gate off: steps never wait, however much inference there is.
    d = Daemon("ungated", "--training-max-wait-ms", "0")
    try:
        st, j = d.req("POST", "/v1/jobs", dict(SPEC, epochs=3))
        check(st == 201, "ungated job submitted")
        jid = j["id"]
        load = Load(d)
        state = wait_final(d, jid)
        load.finish()
        check(state == "succeeded", "ungated job succeeded (%s)" % state)
        check(not load.bad and load.sent > 0, "ungated: %d inference answers, all right" % load.sent)
        check(d.metric("kiln_training_yields_total") == 0, "ungated: no yields")
        check(d.metric("kiln_training_steps_total") > 0, "ungated: steps still counted")
    finally:
        d.stop()


if __name__ == "__main__":
    try:
        main()
    finally:
        H.cleanup()
    if H.FAILURES:
        print("%d check(s) failed" % len(H.FAILURES))
        sys.exit(1)
    print("all preemption checks passed")
