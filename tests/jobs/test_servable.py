#!/usr/bin/env python3
""""succeeded" means servable: the moment a client sees a training job succeeded (its event
stream, GET /v1/jobs/{id}, the kiln CLI's --watch, the Python client), /v2/models/{name}/ready is
200 and the job's version answers inference and metadata, with no waiting. Many short jobs
alternate new names with one name that gets a new version each time, so the swap is checked too:
the answer must carry the new version number and the outputs the new version's weights (read from
its model.kiln here) give. Then the failure paths: a version that cannot be served fails its job
with the reason and is removed, the old version keeps answering; a name the repository cannot
take fails the job. Last, the state a crash between "weights written" and "succeeded recorded"
leaves: the restarted daemon finishes the job from the written version without training again,
both from that state made on disk and after real kills the moment the version appears.

Usage: test_servable.py KILND KILN_CLI PYTHON_CLIENT_DIR
"""
import http.client
import json
import math
import os
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND, CLI, CLIENT_DIR = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, CLIENT_DIR)
import kiln_client as kc  # noqa: E402

ITERATIONS = 24
check = H.check
PROTOTYPES = [[2, 0, 0, 0], [0, 2, 0, 0], [0, 0, 2, 0], [0.5, -1, 1.5, 0.25]]


def short_spec(name, seed, **extra):
    """One epoch over 120 rows: a job of a fraction of a second."""
    s = H.spec(name, epochs=1, seed=seed, **extra)
    s["data"]["limit"] = 120
    s.pop("checkpoint")
    return s


def read_weights(path):
    """model.kiln is a safetensors file: name -> (shape, flat f32 values)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    out = {}
    for k, v in json.loads(raw[8:8 + n]).items():
        if k != "__metadata__":
            a, b = v["data_offsets"]
            out[k] = (v["shape"], struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b]))
    return out


def linear(w, x):
    (out_f, in_f), wv = w[0]
    bv = w[1][1]
    return [sum(wv[o * in_f + i] * x[i] for i in range(in_f)) + bv[o] for o in range(out_f)]


def expected_logits(d, name, version):
    """The MLP's forward pass on PROTOTYPES with the weights of that version, flattened."""
    wts = read_weights(os.path.join(d.data, "models", name, str(version), "model.kiln"))
    out = []
    for x in PROTOTYPES:
        h = [max(0.0, v) for v in linear((wts["fc1.weight"], wts["fc1.bias"]), x)]
        out += linear((wts["fc2.weight"], wts["fc2.bias"]), h)
    return out


def infer_body():
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [len(PROTOTYPES), 4],
                        "data": [v for row in PROTOTYPES for v in row]}]}


def serves(d, name, version, how):
    """Right now: ready is 200, metadata lists exactly that version, and inference answers from it
    with the outputs its weights give. Returns the list of problems (empty when it serves)."""
    bad = []
    st, _ = d.req("GET", "/v2/models/%s/ready" % name)
    if st != 200:
        bad.append("ready %s" % st)
    st, r = d.req("POST", "/v2/models/%s/infer" % name, infer_body())
    if st != 200 or r.get("model_version") != str(version):
        bad.append("infer %s model_version %s" % (st, r.get("model_version") if isinstance(r, dict) else r))
    else:
        want = expected_logits(d, name, version)
        got = r["outputs"][0]["data"]
        if len(got) != len(want) or any(not math.isclose(g, w, rel_tol=1e-4, abs_tol=1e-5) for g, w in zip(got, want)):
            bad.append("outputs %s are not version %d's %s" % (got, version, want))
    st, m = d.req("GET", "/v2/models/%s" % name)
    if st != 200 or m.get("versions") != [str(version)]:
        bad.append("metadata %s %s" % (st, m))
    if bad:
        print("  %s: %s version %d: %s" % (how, name, version, "; ".join(bad)), flush=True)
    return bad


def follow_stream(d, jid):
    """Reads the job's event stream; at its final state event (before reading further) returns
    (final state payload, model event payload or None)."""
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    c.request("GET", "/v1/jobs/%d/events" % jid)
    r = c.getresponse()
    cur, model = {}, None
    try:
        while True:
            raw = r.fp.readline()
            if not raw:
                return None, model
            line = raw.decode().rstrip("\r\n")
            if line:
                if not line.startswith(":"):
                    k, _, v = line.partition(": ")
                    cur[k] = v
                continue
            if "data" in cur:
                data = json.loads(cur["data"])
                if cur.get("event") == "model":
                    model = data
                if cur.get("event") == "state" and data.get("state") in ("succeeded", "failed", "cancelled"):
                    return data, model
            cur = {}
    finally:
        c.close()


def test_many_jobs(d):
    """ITERATIONS short jobs, even ones under new names, odd ones as the next version of 'swap'."""
    passed, swap_version = 0, 0
    client = kc.Client(d.url)
    for i in range(ITERATIONS):
        name = "swap" if i % 2 else "fresh%d" % i
        st, j = d.req("POST", "/v1/jobs", short_spec(name, seed=100 + i))
        jid = j["id"]
        how = ("python client" if i % 6 == 3 else "event stream")
        if how == "python client":
            job = client.wait(jid, timeout=120)
            state = job["state"]
            model = job.get("model")
        else:
            final, model = follow_stream(d, jid)
            state = final and final["state"]
        want_version = swap_version + 1 if name == "swap" else 1
        ok = state == "succeeded" and model == {"name": name, "version": want_version}
        bad = serves(d, name, want_version, how) if ok else ["state %s model %s" % (state, model)]
        st, job = d.req("GET", "/v1/jobs/%d" % jid)
        ok = ok and not bad and job["state"] == "succeeded" and job["model"] == model
        if name == "swap" and ok:
            swap_version = want_version
        passed += ok
        if not ok:
            check(False, "job %d (%s, %s) is servable when it reads succeeded: %s" % (jid, name, how, bad))
    check(passed == ITERATIONS, "%d/%d jobs: ready, the new version's number and outputs right after succeeded"
          % (passed, ITERATIONS))
    check(swap_version == ITERATIONS // 2, "'swap' went through %d versions, each served when its job succeeded"
          % swap_version)
    # The python client's own inference sees the swapped version too.
    r = client.infer("swap", PROTOTYPES)
    check(r.model_version == str(swap_version), "python client infer answers from version %s" % r.model_version)
    # Only the newest version is kept loaded; the older ones are still on disk.
    st, idx = d.req("POST", "/v2/repository/index")
    ready = sorted(int(m["version"]) for m in idx if m["name"] == "swap" and m["state"] == "READY")
    check(ready == [swap_version], "the index shows only the newest 'swap' version ready: %s" % ready)
    return swap_version


def test_cli(d, swap_version):
    path = os.path.join(H.TMP, "servable-spec.json")
    ok = 0
    for k in range(2):
        json.dump(short_spec("swap", seed=300 + k), open(path, "w"))
        p = subprocess.run([CLI, "train", "submit", path, "--watch"], capture_output=True, text=True,
                           env=dict(H.ENV, KILN_URL=d.url), timeout=120)
        swap_version += 1
        bad = serves(d, "swap", swap_version, "cli")
        ok += p.returncode == 0 and "succeeded" in p.stdout and not bad
    check(ok == 2, "kiln train submit --watch: the new version answers as soon as it exits (%d/2)" % ok)
    return swap_version


def test_unservable(d, swap_version):
    """A job on a device kilnd does not drive (ref, where kilnd serves only on cpu) could train but
    never serve its version: the submit refuses it, naming the devices, and nothing changes."""
    versions_before = sorted(int(v) for v in os.listdir(os.path.join(d.data, "models", "swap")) if v.isdigit())
    st, j = d.req("POST", "/v1/jobs", short_spec("swap", seed=7, device="ref"))
    err = j.get("error", "") if isinstance(j, dict) else ""
    check(st == 400 and "device" in err and "'ref'" in err and "cpu" in err,
          "a job on a device kilnd does not drive is refused at submit, naming the devices: %s %s" % (st, err))
    bad = serves(d, "swap", swap_version, "after a refused job")
    check(not bad, "the previous version %d still answers: %s" % (swap_version, bad))
    versions = sorted(int(v) for v in os.listdir(os.path.join(d.data, "models", "swap")) if v.isdigit())
    check(versions == versions_before, "no version was added: %s" % versions[-3:])
    # Under a new name: no model folder is made, and the name is not served.
    st, j = d.req("POST", "/v1/jobs", short_spec("refonly", seed=8, device="ref"))
    st_ready, _ = d.req("GET", "/v2/models/refonly/ready")
    check(st == 400 and not os.path.exists(os.path.join(d.data, "models", "refonly")) and st_ready != 200,
          "a new name on a device kilnd does not drive: refused, nothing made (submit %s, ready %s)" % (st, st_ready))
    # A name the repository cannot take: its folder is a file.
    open(os.path.join(d.data, "models", "taken"), "w").write("not a model folder\n")
    st, j = d.req("POST", "/v1/jobs", short_spec("taken", seed=9))
    final, _ = follow_stream(d, j["id"])
    check(final and final["state"] == "failed" and "repository" in final.get("error", ""),
          "a name the repository cannot take fails the job: %s" % final)


def test_crash_after_weights_written():
    """The state a crash between "weights written" and "succeeded recorded" leaves: the job is
    running in the store and its version, with the source.json naming it, is in the repository.
    Made here by killing a long job and putting that version in place; the restart must finish
    the job from it: no training, no second version, served, succeeded with the file's metrics."""
    d = H.Daemon(KILND, "crash")
    st, j = d.req("POST", "/v1/jobs", H.spec("crashed", epochs=400))
    jid = j["id"]
    job = d.wait_state(jid, ["running"])
    d.proc.kill()
    d.proc.wait()
    # A version trained elsewhere stands in for the one the job wrote.
    src = H.Daemon(KILND, "crash-src")
    st, j2 = src.req("POST", "/v1/jobs", short_spec("crashed", seed=5))
    src.wait_state(j2["id"], ["succeeded"])
    src.stop()
    vdir = os.path.join(d.data, "models", "crashed", "1")
    os.makedirs(vdir)
    for f in ("model.kiln", "config.json"):
        with open(os.path.join(src.data, "models", "crashed", "1", f), "rb") as a, open(os.path.join(vdir, f), "wb") as b:
            b.write(a.read())
    metrics = {"valid_accuracy": 0.5, "epochs": 7}
    json.dump({"source": "kilnd job %d created %d" % (jid, job["created_ms"]), "metrics": metrics},
              open(os.path.join(vdir, "source.json"), "w"))
    d2 = H.Daemon(KILND, "crash", fresh=False)
    try:
        job = d2.wait_state(jid, ["succeeded", "failed", "cancelled"], timeout=60)
        check(job["state"] == "succeeded" and job["model"] == {"name": "crashed", "version": 1},
              "after the restart the job succeeds with the version it had written: %s %s" % (job["state"], job["model"]))
        bad = serves(d2, "crashed", 1, "after restart")
        check(not bad, "the recovered version is served: %s" % bad)
        check(sorted(os.listdir(os.path.join(d2.data, "models", "crashed"))) == ["1"], "no second version was added")
        st, raw = d2.req("GET", "/v1/jobs/%d/events" % jid)
        events = [(b.split("\nevent: ")[1].split("\n")[0], json.loads(b.split("\ndata: ")[1]))
                  for b in raw.decode().split("\n\n") if "\ndata: " in b]
        restart = [k for k, (t, e) in enumerate(events) if e == {"state": "queued", "reason": "kilnd restarted"}]
        after = events[restart[-1] + 1:] if restart else []
        check([t for t, _ in after] == ["state", "model", "state"] and after[-1][1] == {"state": "succeeded", "metrics": metrics},
              "after the restart: running, model, succeeded with the metrics the version was written with, and no "
              "training in between: %s" % after)
        check("had written crashed version 1, which is loaded instead of training again" in open(d2.log).read(),
              "kilnd's log says why it did not train again")
    finally:
        d2.stop()
    check(d2.proc.returncode == 0, "kilnd exits 0 after SIGTERM (%s)" % d2.proc.returncode)


def test_kill_when_version_appears(kills=10):
    """A real SIGKILL in that window: the test watches for the version folder's rename and kills
    kilnd the moment it sees it, when the job is loading its model or recording its success. Any
    instant is allowed to land anywhere; what must hold after the restart is the same: the job
    succeeded, exactly one version, served, and the job's "model" event names it."""
    landed, ok = 0, 0
    for k in range(kills):
        d = H.Daemon(KILND, "kill%d" % k)
        st, j = d.req("POST", "/v1/jobs", short_spec("killed", seed=40 + k))
        vdir = os.path.join(d.data, "models", "killed", "1")
        deadline = time.time() + 60
        while not os.path.isdir(vdir) and time.time() < deadline and d.proc.poll() is None:
            pass
        d.proc.kill()
        d.proc.wait()
        d2 = H.Daemon(KILND, "kill%d" % k, fresh=False)
        try:
            job = d2.wait_state(j["id"], ["succeeded", "failed", "cancelled"], timeout=60)
            bad = serves(d2, "killed", 1, "after a kill") if job["state"] == "succeeded" else [job["state"]]
            versions = sorted(os.listdir(os.path.join(d2.data, "models", "killed")))
            good = not bad and job["model"] == {"name": "killed", "version": 1} and versions == ["1"]
            if not good:
                print("  kill %d: %s %s versions %s" % (k, bad, job.get("model"), versions), flush=True)
            ok += good
            landed += "had written killed version 1" in open(d2.log).read()
        finally:
            d2.stop()
    check(ok == kills, "killed as the version appeared, restarted: succeeded with one served version (%d/%d; %d "
          "restarts found the job unfinished with its version written)" % (ok, kills, landed))


def test_class_names_served(d):
    """A CSV whose labels are names: the registered version carries them as labels.txt (its
    output's label_filename), so the classification extension answers with them."""
    names = ["owl", "cat", "dog"]  # numbered in order of first appearance
    path = os.path.join(H.DATA, "named.csv")
    with open(os.path.join(H.DATA, "train.csv")) as src, open(path, "w") as dst:
        for k, line in enumerate(src):
            cells = line.rstrip("\n").split(",")
            dst.write(line if k == 0 else ",".join(cells[:-1] + [names[int(cells[-1])]]) + "\n")
    s = short_spec("named", seed=7)
    s["data"]["train"] = path
    st, j = d.req("POST", "/v1/jobs", s)
    final = d.wait_state(j["id"], ("succeeded", "failed")) if st == 201 else None
    check(final and final["state"] == "succeeded", "a job on named labels succeeds: %s" % final)
    st, cfg = d.req("GET", "/v2/models/named/config")
    check(st == 200 and cfg["output"][0]["label_filename"] == "labels.txt",
          "the registered version names its label file: %s" % (cfg.get("output") if st == 200 else cfg))
    body = infer_body()
    body["outputs"] = [{"name": "fc2", "parameters": {"classification": 3}}]
    st, r = d.req("POST", "/v2/models/named/infer", body)
    got = r["outputs"][0]["data"] if st == 200 else []
    flat = expected_logits(d, "named", 1)
    order = []  # class k is the k-th name to appear in the file
    for line in open(path).readlines()[1:]:
        name = line.strip().split(",")[-1]
        order += [name] if name not in order else []
    want = [["%d:%s" % (k, order[k]) for k in sorted(range(3), key=lambda k: (-row[k], k))]
            for row in (flat[i:i + 3] for i in range(0, len(flat), 3))]
    check(st == 200 and [s.split(":", 1)[1] for s in got] == [w for row in want for w in row],
          "the classification extension answers the data's class names, in the model's order: %s / %s"
          % (got, want))


def main():
    d = H.Daemon(KILND, "main")
    try:
        test_class_names_served(d)
        v = test_many_jobs(d)
        v = test_cli(d, v)
        test_unservable(d, v)
    finally:
        d.stop()
    check(d.proc.returncode == 0, "kilnd exits 0 after SIGTERM (%s); log %s" % (d.proc.returncode, d.log))
    test_crash_after_weights_written()
    test_kill_when_version_appears()
    H.finish()
    H.cleanup()


if __name__ == "__main__":
    main()
