#!/usr/bin/env python3
"""Black-box tests of training jobs over REST against a real kilnd: submit -> server-sent events ->
success -> the model is registered and answers /v2 inference; bad specs (400 naming the field);
cancel; SIGKILL during training, restart, the job resumes from its checkpoint and finishes; the
CLI's plain watch output. The data set is a small synthetic CSV written here, so the suite needs
no downloads and runs in seconds.

Usage: test_jobs.py KILND KILN_CLI
"""
import http.client
import json
import os
import threading
import socket
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

KILND, CLI = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="kilnd-jobs-")
DATA = os.path.join(TMP, "data")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)
    else:
        print("ok:", what, flush=True)


def write_csv(path, n, seed):
    """Three separable classes in four features."""
    rnd = random.Random(seed)
    with open(path, "w") as f:
        f.write("a,b,c,d,label\n")
        for _ in range(n):
            c = rnd.randrange(3)
            x = [rnd.gauss(2.0 if k == c else 0.0, 0.5) for k in range(4)]
            f.write(",".join("%.4f" % v for v in x) + ",%d\n" % c)


MLP = {
    "inputs": ["x"],
    "nodes": [
        {"name": "fc1", "layer": "Linear", "config": {"in_features": 4, "out_features": 16}, "inputs": ["x"]},
        {"name": "act", "op": "relu", "inputs": ["fc1"]},
        {"name": "fc2", "layer": "Linear", "config": {"in_features": 16, "out_features": 3}, "inputs": ["act"]},
    ],
    "outputs": ["fc2"],
}


def spec(name, epochs=2, train="train.csv", **extra):
    s = {
        "model": MLP,
        "data": {"type": "csv", "train": os.path.join(DATA, train), "label_column": "label", "valid_split": 0.2},
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
    def __init__(self, name, fresh=True):
        self.data = os.path.join(TMP, name)
        if fresh:
            shutil.rmtree(self.data, ignore_errors=True)
        os.makedirs(self.data, exist_ok=True)
        self.log = os.path.join(TMP, name + ".log")
        portfile = os.path.join(self.data, "kilnd.port")
        if os.path.exists(portfile):
            os.unlink(portfile)
        self.proc = subprocess.Popen([KILND, "--port", "0", "--data-dir", self.data, "--data-roots", DATA],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"), env=ENV)
        deadline = time.time() + 20
        while not os.path.exists(portfile):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("kilnd did not start: " + open(self.log).read())
            time.sleep(0.01)
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

    def wait_state(self, jid, states, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            st, j = self.req("GET", "/v1/jobs/%d" % jid)
            if st == 200 and j["state"] in states:
                return j
            time.sleep(0.05)
        raise RuntimeError("job %d never reached %s: %s" % (jid, states, j))

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def read_sse(d, jid, last_id=None, timeout=60):
    """The whole event stream of a job, as (id, type, data) tuples, until kilnd ends it."""
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=timeout)
    c.request("GET", "/v1/jobs/%d/events" % jid, headers={"Last-Event-ID": str(last_id)} if last_id else {})
    r = c.getresponse()
    assert r.status == 200, r.status
    assert r.getheader("Content-Type").startswith("text/event-stream")
    events, cur = [], {}
    for raw in r:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if "data" in cur:
                events.append((int(cur.get("id", 0)), cur.get("event", "message"), json.loads(cur["data"])))
            cur = {}
            continue
        if line.startswith(":"):
            continue
        k, _, v = line.partition(": ")
        cur[k] = v
    c.close()
    return events


def test_submit_stream_serve(d):
    st, j = d.req("POST", "/v1/jobs", spec("toy"))
    check(st == 201 and j.get("state") == "queued", "submit answers 201 queued: %s %s" % (st, j))
    jid = j["id"]
    events = read_sse(d, jid)
    types = [e[1] for e in events]
    states = [e[2]["state"] for e in events if e[1] == "state"]
    check(states == ["queued", "running", "succeeded"], "state events queued, running, succeeded: %s" % states)
    check("step" in types and types.count("epoch") == 2 and "checkpoint" in types,
          "step, epoch and checkpoint events streamed: %s" % types)
    ids = [e[0] for e in events]
    check(ids == sorted(ids) and len(set(ids)) == len(ids), "event ids increase")
    again = read_sse(d, jid, last_id=ids[2])
    check([e[0] for e in again] == ids[3:], "Last-Event-ID resumes after that event")
    st, job = d.req("GET", "/v1/jobs/%d" % jid)
    check(st == 200 and job["state"] == "succeeded" and job["progress"] == 1, "GET job: succeeded, progress 1")
    check(job["latest_epoch"] and job["latest_epoch"]["valid_accuracy"] > 0.8,
          "latest epoch metrics: valid_accuracy %s" % (job["latest_epoch"] or {}).get("valid_accuracy"))
    check(len(job["checkpoints"]) == 2, "two checkpoints kept (keep_last 2): %s" % job["checkpoints"])
    check(job["model"] == {"name": "toy", "version": 1}, "model registered as toy version 1: %s" % job["model"])
    # Served without a manual load, and already when the job read succeeded.
    st, _ = d.req("GET", "/v2/models/toy/ready")
    check(st == 200, "the trained model is ready on /v2")
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 4],
                        "data": [2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 0]}]}
    st, r = d.req("POST", "/v2/models/toy/infer", body)
    ok = st == 200
    if ok:
        out = r["outputs"][0]["data"]
        preds = [max(range(3), key=lambda c: out[row * 3 + c]) for row in range(3)]
        ok = preds == [0, 1, 2]
    check(ok, "inference with the trained model classifies the three prototypes: %s %s" % (st, r))
    st, lst = d.req("GET", "/v1/jobs?state=succeeded")
    check(st == 200 and [x["id"] for x in lst["jobs"]] == [jid], "list filtered by state")
    st, lst = d.req("GET", "/v1/jobs?state=bogus")
    check(st == 400 and "state" in lst["error"], "list with a bad state is 400")
    return jid


def test_history(d, jid):
    """GET .../metrics and .../logs: the same rows the event stream carried, in pages."""
    events = read_sse(d, jid)
    st, m = d.req("GET", "/v1/jobs/%d/metrics" % jid)
    epochs = [e for e in events if e[1] == "epoch"]
    check(st == 200 and m["id"] == jid and m["kind"] == "epoch" and m["state"] == "succeeded"
          and [r["event_id"] for r in m["metrics"]] == [e[0] for e in epochs],
          "metrics: one row per epoch event, in order: %s" % [r.get("event_id") for r in m.get("metrics", [])])
    check(all(r["epoch"] == e[2]["epoch"] and r["valid_accuracy"] == e[2]["valid_accuracy"]
              and r["train_loss"] == e[2]["train_loss"] and r["time_ms"] > 0 for r, e in zip(m["metrics"], epochs)),
          "metrics rows carry the epoch's values")
    check(m["next_after"] == events[-1][0] and m["more"] is False, "next_after is the last event: %s" % m["next_after"])
    steps = [e for e in events if e[1] == "step"]
    st, m = d.req("GET", "/v1/jobs/%d/metrics?kind=step" % jid)
    check(st == 200 and [r["step"] for r in m["metrics"]] == [e[2]["step"] for e in steps]
          and all(r["loss"] == e[2]["loss"] for r, e in zip(m["metrics"], steps)),
          "kind=step: the step rows with their losses (%d)" % len(steps))
    # Pages of one row follow each other with next_after until more is false.
    rows, after, pages = [], 0, 0
    while pages < 100:
        st, p = d.req("GET", "/v1/jobs/%d/metrics?kind=step&limit=1&after=%d" % (jid, after))
        rows += p["metrics"]
        after = p["next_after"]
        pages += 1
        if not p["more"]:
            break
    check([r["event_id"] for r in rows] == [e[0] for e in steps] and pages == len(steps),
          "limit=1 pages through every step row once (%d pages)" % pages)
    logs = [e for e in events if e[1] == "log"]
    st, lg = d.req("GET", "/v1/jobs/%d/logs" % jid)
    check(st == 200 and [(r["event_id"], r["message"]) for r in lg["logs"]] == [(e[0], e[2]["message"]) for e in logs]
          and any(r["message"].startswith("training ") for r in lg["logs"]),
          "logs: every log line with its event id: %s" % [r["message"] for r in lg.get("logs", [])])
    st, lg2 = d.req("GET", "/v1/jobs/%d/logs?after=%d" % (jid, logs[0][0]))
    check(st == 200 and [r["event_id"] for r in lg2["logs"]] == [e[0] for e in logs[1:]], "logs?after= gives the later lines")
    st, lg3 = d.req("GET", "/v1/jobs/%d/logs?after=%d" % (jid, lg["next_after"]))
    check(st == 200 and lg3["logs"] == [] and lg3["next_after"] == lg["next_after"], "nothing after next_after")
    for path, want in (("/v1/jobs/9999/metrics", 404), ("/v1/jobs/9999/logs", 404),
                       ("/v1/jobs/%d/metrics?kind=batch" % jid, 400), ("/v1/jobs/%d/metrics?limit=0" % jid, 400),
                       ("/v1/jobs/%d/logs?limit=10001" % jid, 400), ("/v1/jobs/%d/logs?after=-1" % jid, 400),
                       ("/v1/jobs/%d/logs?after=x" % jid, 400)):
        st, j = d.req("GET", path)
        check(st == want and isinstance(j, dict) and j.get("error"), "GET %s -> %d with a JSON error: %s" % (path, want, j))
    for method, path in (("POST", "/v1/jobs/%d/metrics" % jid), ("DELETE", "/v1/jobs/%d/logs" % jid)):
        st, j = d.req(method, path)
        check(st == 405 and "GET" in j.get("error", ""), "%s %s -> 405" % (method, path))


def test_bad_specs(d):
    cases = [
        ({"data": {"type": "csv", "train": os.path.join(DATA, "train.csv")}}, "model"),
        (spec("x", epochs=0), "epochs"),
        (spec("x", optimizer={"kind": "adamx"}), "optimizer.kind"),
        (spec("x", register_as="../evil"), "register_as"),
        (spec("x", data={"type": "csv", "train": "/etc/passwd"}), "data.train"),
        (spec("x", data={"type": "csv", "train": os.path.join(DATA, "missing.csv")}), "data.train"),
        (spec("x", data={"type": "parquet"}), "data.type"),
        (spec("x", bogus=1), "bogus"),
        (spec("x", loss="hinge"), "loss"),
    ]
    for body, field in cases:
        st, j = d.req("POST", "/v1/jobs", body)
        check(st == 400 and isinstance(j, dict) and field in j.get("error", ""),
              "bad spec -> 400 naming %s: %s %s" % (field, st, j))
    st, j = d.req("POST", "/v1/jobs", "{not json")
    check(st == 400 and "body" in j["error"], "invalid JSON -> 400")
    # a body is bytes, not a C string: a NUL inside must be refused, never read past
    st, j = d.req("POST", "/v1/jobs", json.dumps(spec("x")).encode() + b"\x00 trailing")
    check(st == 400 and "NUL" in j.get("error", ""), "NUL byte in the body -> 400: %s %s" % (st, j))
    st, j = d.req("POST", "/v1/jobs", spec("x", epochs=0, optimizer={"kind": "adamx"}))
    check(st == 400 and len(j.get("problems", [])) == 2, "every problem is listed: %s" % j)
    st, j = d.req("GET", "/v1/jobs/9999")
    check(st == 404, "unknown job -> 404")
    st, j = d.req("GET", "/v1/jobs/abc")
    check(st == 404, "non-numeric job id -> 404")


def last_job_id(d):
    st, lst = d.req("GET", "/v1/jobs?limit=1000")
    return max([j["id"] for j in lst["jobs"]] or [0])


def test_unrunnable_specs(d, done):
    """A spec that cannot run is a 400 at submission naming the field and the value, never a job that
    fails when it starts or quietly does something else: resume_from_job with nothing to resume from,
    a model the engine does not build, a device this server cannot open, a key given twice (cJSON
    read the first, Python's json the last, so GET showed a spec other than the one that ran)."""
    # a job with no checkpoint: cancelled while queued behind a long one
    st, a = d.req("POST", "/v1/jobs", spec("big", epochs=500, train="big.csv"))
    st, q = d.req("POST", "/v1/jobs", spec("never"))
    d.req("DELETE", "/v1/jobs/%d" % q["id"])
    d.req("DELETE", "/v1/jobs/%d" % a["id"])
    d.wait_state(a["id"], ["cancelled", "succeeded", "failed"])
    unknown_layer = json.loads(json.dumps(MLP))
    unknown_layer["nodes"][1] = {"name": "act", "layer": "Nope", "inputs": ["fc1"]}
    dangling = json.loads(json.dumps(MLP))
    dangling["nodes"][2]["inputs"] = ["nowhere"]
    raw = json.dumps(spec("dup"))
    cases = [
        (spec("x", resume_from_job=999999), "resume_from_job", "there is no job 999999"),
        (spec("x", resume_from_job=q["id"]), "resume_from_job", "job %d has no checkpoint" % q["id"]),
        (spec("x", model=unknown_layer), "model", 'unknown layer "Nope"'),
        (spec("x", model=dangling), "model", "nowhere"),
        (spec("x", device="cuda:9"), "device", "'cuda:9'"),
        (spec("x", device="nosuch:0"), "device", "'nosuch:0'"),
        (raw[:-1] + ', "data": {"type": "csv", "train": "%s"}}' % os.path.join(DATA, "big.csv"), "data",
         "duplicate key 'data' in the job spec"),
        (raw.replace('"lr": 0.01', '"lr": 0.01, "lr": 0.5'), "optimizer.lr", "duplicate key 'lr' in optimizer"),
        (raw.replace('"in_features": 4', '"in_features": 4, "in_features": 5'), "model.nodes[0].config.in_features",
         "duplicate key 'in_features' in model.nodes[0].config"),
        (raw.replace('"epochs": 2', '"epochs": 2, "\\u0065pochs": 9'), "epochs", "duplicate key 'epochs'"),
    ]
    before = last_job_id(d)
    for body, field, words in cases:
        st, j = d.req("POST", "/v1/jobs", body)
        err = j.get("error", "") if isinstance(j, dict) else ""
        check(st == 400 and field + ":" in err and words in err,
              "unrunnable spec -> 400 naming %s (%s): %s %s" % (field, words, st, err))
    check(last_job_id(d) == before, "no refused spec became a job")
    st, j = d.req("POST", "/v1/jobs/%d/resume" % q["id"])
    check(st == 409 and "no checkpoint" in j.get("error", ""),
          "resume of a job without a checkpoint -> 409: %s %s" % (st, j))

    # The good specs still run: resume_from_job of a job with checkpoints, on a device given.
    st, j = d.req("POST", "/v1/jobs", spec("again", resume_from_job=done, device="cpu"))
    check(st == 201, "resume_from_job of a job with checkpoints -> 201: %s %s" % (st, j))
    job = d.wait_state(j["id"], ["succeeded", "failed", "cancelled"])
    check(job["state"] == "succeeded" and any(m.startswith("resumed from checkpoint at step") for m in job["logs"]),
          "it resumed from that job's checkpoint: %s %s" % (job["state"], job["logs"]))

    # Valid at submission, but the checkpoint is gone when the job starts: it fails saying so, and
    # never trains from step 0 as if nothing had been asked.
    st, src = d.req("POST", "/v1/jobs", spec("src", epochs=1))
    d.wait_state(src["id"], ["succeeded"])
    st, a = d.req("POST", "/v1/jobs", spec("big", epochs=500, train="big.csv"))
    d.wait_state(a["id"], ["running"])
    st, c = d.req("POST", "/v1/jobs", spec("src2", resume_from_job=src["id"]))
    check(st == 201, "a job resuming another is queued: %s %s" % (st, c))
    shutil.rmtree(os.path.join(d.data, "checkpoints", "job-%d" % src["id"]))
    d.req("DELETE", "/v1/jobs/%d" % a["id"])
    job = d.wait_state(c["id"], ["succeeded", "failed", "cancelled"])
    err = job.get("error") or ""
    check(job["state"] == "failed" and "resume_from_job" in err and "no checkpoint" in err
          and not any(m.startswith("training ") for m in job["logs"]),
          "its checkpoint gone, the job fails saying so and trains nothing: %s %s %s" % (job["state"], err,
                                                                                          job["logs"]))


def test_cancel(d):
    st, j = d.req("POST", "/v1/jobs", spec("big", epochs=500, train="big.csv"))
    jid = j["id"]
    d.wait_state(jid, ["running"])
    st, j = d.req("DELETE", "/v1/jobs/%d" % jid)
    check(st == 202 and j["state"] == "cancelling", "DELETE of a running job -> 202 cancelling")
    job = d.wait_state(jid, ["cancelled", "succeeded", "failed"], timeout=30)
    check(job["state"] == "cancelled", "the running job ends cancelled")
    st, j = d.req("DELETE", "/v1/jobs/%d" % jid)
    check(st == 409, "cancelling a cancelled job -> 409")
    # A queued job behind a running one is cancelled at once.
    st, a = d.req("POST", "/v1/jobs", spec("big", epochs=500, train="big.csv"))
    st, b = d.req("POST", "/v1/jobs", spec("toy2"))
    st, j = d.req("DELETE", "/v1/jobs/%d" % b["id"])
    check(st == 200 and j["state"] == "cancelled", "DELETE of a queued job -> cancelled")
    d.req("DELETE", "/v1/jobs/%d" % a["id"])
    d.wait_state(a["id"], ["cancelled"])


def test_resume_after_sigkill():
    d = Daemon("restart")
    st, j = d.req("POST", "/v1/jobs", spec("resumed", epochs=6, train="big.csv"))
    jid = j["id"]
    # Wait for a checkpoint, then kill the daemon mid-training.
    deadline = time.time() + 60
    ckpts = []
    while time.time() < deadline and len(ckpts) < 1:
        st, job = d.req("GET", "/v1/jobs/%d" % jid)
        ckpts = job["checkpoints"]
        time.sleep(0.02)
    check(job["state"] == "running" and ckpts, "job running with a checkpoint before SIGKILL")
    d.proc.kill()
    d.proc.wait()
    d2 = Daemon("restart", fresh=False)
    job = d2.wait_state(jid, ["succeeded", "failed", "cancelled"], timeout=120)
    check(job["state"] == "succeeded", "after SIGKILL and restart the job finishes: %s" % job.get("error"))
    logs = " ".join(job["logs"])
    check("resumed from checkpoint" in logs, "it resumed from its checkpoint: %s" % job["logs"])
    events = read_sse(d2, jid)
    states = [e[2]["state"] for e in events if e[1] == "state"]
    check(states[-1] == "succeeded" and "queued" in states[1:], "events show the requeue: %s" % states)
    # A job reads succeeded only once its model answers.
    st, _ = d2.req("GET", "/v2/models/resumed/ready")
    check(st == 200, "the resumed job's model is served")
    d2.stop()


def test_cli(d):
    path = os.path.join(TMP, "spec.json")
    json.dump(spec("clitoy"), open(path, "w"))
    env = dict(ENV, KILN_URL=d.url)
    p = subprocess.run([CLI, "train", "submit", path, "--watch"], capture_output=True, text=True, env=env, timeout=120)
    out = p.stdout
    check(p.returncode == 0, "kiln train submit --watch exits 0 (%d): %s" % (p.returncode, p.stderr))
    for want in ("queued", "job ", "running", "epoch 1/2", "epoch 2/2 done", "checkpoint at step",
                 "model clitoy version 1 registered", "succeeded", "final valid_accuracy"):
        check(want in out, "watch output has '%s'" % want)
    p = subprocess.run([CLI, "jobs"], capture_output=True, text=True, env=env)
    check(p.returncode == 0 and "clitoy" in p.stdout and "succeeded" in p.stdout, "kiln jobs lists the job")
    p = subprocess.run([CLI, "predict", "clitoy", "--json", "[[2,0,0,0],[0,0,2,0]]"], capture_output=True, text=True,
                       env=env)
    check(p.returncode == 0 and "class 0" in p.stdout and "class 2" in p.stdout,
          "kiln predict prints the classes: %s %s" % (p.stdout, p.stderr))
    p = subprocess.run([CLI, "job", "424242"], capture_output=True, text=True, env=env)
    check(p.returncode == 1 and "no job 424242" in p.stderr, "kiln job on a missing job says so")
    p = subprocess.run([CLI, "jobs"], capture_output=True, text=True, env=dict(ENV, KILN_URL="http://127.0.0.1:1"))
    check(p.returncode == 2 and "cannot reach kilnd" in p.stderr and p.stdout == "",
          "an unreachable daemon is a clear error, with no table header before it: %r" % p.stdout)
    test_cli_refusals(env)


def cli(args, env):
    return subprocess.run([CLI] + args, capture_output=True, text=True, env=env, timeout=60)


def test_cli_refusals(env):
    """What the CLI refuses before sending, each with its reason; nothing is sent for a part of
    the input, a token that would split the request, or a number that would go as null."""
    two = os.path.join(TMP, "two.json")
    open(two, "w").write("[[2,0,0,0]]\n[[0,0,2,0]]\n")
    for args, want in (
            (["predict", "clitoy", "--json", "[[2,0,0,0]], [[0,0,2,0]]"], "has more after its JSON value (at byte 11)"),
            (["predict", "clitoy", "--file", two], "has more after its JSON value (at byte 12)"),
            (["predict", "clitoy", "--json", "[[1e400,0,0,0]]"], "holds a number too large"),
            (["predict", "clitoy", "--json"], "--json needs a value"),
            (["predict", "ünï", "--json", "[[1]]"], "'ünï' is no model name"),
            (["load", "a/b"], "'a/b' is no model name"),
            (["jobs", "--state", "RUNNING"], "--state 'RUNNING' is no job state"),
            (["jobs", "--state", "queued", "--state", "failed"], "--state is given twice"),
            (["job", "0001"], "usage: kiln job JOB_ID")):
        p = cli(args, env)
        check(p.returncode == 2 and want in p.stderr and p.stdout == "",
              "kiln %s: refused, saying so: %d %r" % (" ".join(args), p.returncode, p.stderr[-300:]))
    for token in ("tok\r\nX-Injected: yes", "tok\n"):
        p = cli(["jobs"], dict(env, KILN_TOKEN=token))
        check(p.returncode == 2 and "the token from KILN_TOKEN holds a control character" in p.stderr,
              "a token holding %r is refused before sending: %r" % (token, p.stderr))
    # something that is not kilnd answers with an empty body: said so, not "HTTP 404: "
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]

    def answer():
        c, _ = srv.accept()
        c.recv(65536)
        c.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        c.close()
    t = threading.Thread(target=answer)
    t.start()
    p = cli(["models"], dict(env, KILN_URL="http://127.0.0.1:%d" % port))
    t.join(10)
    srv.close()
    check(p.returncode == 1 and "HTTP 404 with no body: not kilnd's answer" in p.stderr,
          "an empty answer from something else is said to be no answer of kilnd's: %r" % p.stderr)


def main():
    os.makedirs(DATA)
    write_csv(os.path.join(DATA, "train.csv"), 300, 1)
    write_csv(os.path.join(DATA, "big.csv"), 6000, 2)
    d = Daemon("main")
    try:
        jid = test_submit_stream_serve(d)
        test_history(d, jid)
        test_bad_specs(d)
        test_cancel(d)
        test_unrunnable_specs(d, jid)
        test_cli(d)
    finally:
        d.stop()
    # a sanitizer's report (a leak at exit included) makes kilnd exit non-zero
    check(d.proc.returncode == 0, "kilnd exits 0 after SIGTERM (%s); log %s" % (d.proc.returncode, d.log))
    test_resume_after_sigkill()
    if FAILURES:
        print("\n%d failure(s); logs in %s" % (len(FAILURES), TMP))
        for f in FAILURES:
            print("  -", f)
        sys.exit(1)
    shutil.rmtree(TMP, ignore_errors=True)
    print("all job tests passed")


if __name__ == "__main__":
    main()
