"""What the Python tests that drive a real kilnd share (tests/clients, tests/jobs, tests/serving):
kilnd on a free port with its data dir in a temporary folder, a small synthetic CSV data set (three
separable classes in four features, so a job trains in a second and needs no download), job specs,
and pass/fail bookkeeping. A test puts this folder on sys.path and imports it."""
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

TMP = tempfile.mkdtemp(prefix="kiln-clients-")
DATA = os.path.join(TMP, "data")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)
    else:
        print("ok:", what, flush=True)


def finish():
    if FAILURES:
        print("%d check(s) failed:" % len(FAILURES))
        for f in FAILURES:
            print("  " + f)
        sys.exit(1)
    print("all checks passed")


def cleanup():
    shutil.rmtree(TMP, ignore_errors=True)


def write_csv(path, n, seed):
    rnd = random.Random(seed)
    with open(path, "w") as f:
        f.write("a,b,c,d,label\n")
        for _ in range(n):
            c = rnd.randrange(3)
            x = [rnd.gauss(2.0 if k == c else 0.0, 0.5) for k in range(4)]
            f.write(",".join("%.4f" % v for v in x) + ",%d\n" % c)


os.makedirs(DATA, exist_ok=True)
write_csv(os.path.join(DATA, "train.csv"), 600, 1)

MLP = {
    "inputs": ["x"],
    "nodes": [
        {"name": "fc1", "layer": "Linear", "config": {"in_features": 4, "out_features": 16}, "inputs": ["x"]},
        {"name": "act", "op": "relu", "inputs": ["fc1"]},
        {"name": "fc2", "layer": "Linear", "config": {"in_features": 16, "out_features": 3}, "inputs": ["act"]},
    ],
    "outputs": ["fc2"],
}


def spec(name, epochs=2, **extra):
    s = {
        "model": MLP,
        "data": {"type": "csv", "train": os.path.join(DATA, "train.csv"), "label_column": "label",
                 "valid_split": 0.2},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "lr": 0.01},
        "epochs": epochs,
        "batch_size": 16,
        "seed": 3,
        "checkpoint": {"every_epochs": 1, "keep_last": 2},
        "register_as": name,
    }
    s.update(extra)
    return s


class Daemon:
    """kilnd --port 0 (or PORT, to come back where a killed one was) on a data dir under TMP.

    extra: more command-line arguments; env: variables added to ENV for this kilnd; setup: called
    with the data dir before kilnd starts (to put models there); data_roots=False leaves
    --data-roots DATA off the command line, for tests that run no training job."""

    def __init__(self, kilnd, name, fresh=True, port=0, extra=(), env=None, setup=None, data_roots=True):
        self.data = os.path.join(TMP, name)
        if fresh:
            shutil.rmtree(self.data, ignore_errors=True)
        os.makedirs(self.data, exist_ok=True)
        if setup:
            setup(self.data)
        self.log = os.path.join(TMP, name + ".log")
        portfile = os.path.join(self.data, "kilnd.port")
        if os.path.exists(portfile):
            os.unlink(portfile)
        environ = dict(ENV)
        environ.update(env or {})
        args = [kilnd, "--port", str(port), "--data-dir", self.data]
        args += ["--data-roots", DATA] if data_roots else []
        deadline = time.time() + 30
        while True:
            self.proc = subprocess.Popen(args + list(extra), stdout=subprocess.DEVNULL,
                                         stderr=open(self.log, "ab"), env=environ)
            while not os.path.exists(portfile) and self.proc.poll() is None and time.time() < deadline:
                time.sleep(0.01)
            if os.path.exists(portfile):
                break
            if self.proc.poll() is None or time.time() > deadline:
                self.proc.kill()
                raise RuntimeError("kilnd did not start: " + open(self.log).read())
            time.sleep(0.2)  # the old port may still be held for a moment: try again
        time.sleep(0.05)
        self.port = int(open(portfile).read())
        self.url = "http://127.0.0.1:%d" % self.port

    def req(self, method, path, body=None, headers=None, timeout=30):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        c.request(method, path, body=data, headers=headers or {})
        r = c.getresponse()
        raw = r.read()
        c.close()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw

    def metric(self, name):
        """The value of an unlabelled series on /metrics, or None when it is absent."""
        st, raw = self.req("GET", "/metrics")
        text = raw.decode() if isinstance(raw, bytes) else ""
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def wait_state(self, jid, states, timeout=90):
        deadline = time.time() + timeout
        j = None
        while time.time() < deadline:
            st, j = self.req("GET", "/v1/jobs/%d" % jid)
            if st == 200 and j["state"] in states:
                return j
            time.sleep(0.05)
        raise RuntimeError("job %d never reached %s: %s" % (jid, states, j))

    def stop(self, sig=None, timeout=30):
        """Sends sig (SIGTERM) and waits up to timeout seconds: kilnd's exit status, or None when it
        had not stopped by then and was killed."""
        import signal
        if self.proc.poll() is None:
            self.proc.send_signal(sig or signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


class Attached(Daemon):
    """Requests to a kilnd a test started itself (proc), on port, logging to log: for starts the
    harness's own cannot wait for, such as one whose port file cannot be written."""

    def __init__(self, proc, port, log):
        self.proc, self.port, self.log = proc, port, log
        self.data = None
        self.url = "http://127.0.0.1:%d" % port
