#!/usr/bin/env python3
"""A load of a model whose version policy selects a version that cannot be served is refused: the
load answers 400 naming the version and its reason, and what was served before keeps serving
(inference answers, from the old version). Each broken newest version is tried: config.json with
a misspelt key, config.json that is not JSON, a version_policy that selects nothing, an empty
model.onnx, a truncated model.onnx. A broken version the policy does not select does not fail the
load, and once the newest version is fixed the load brings it in.

Usage: test_version_load.py KILND MODEL_ONNX
(MODEL_ONNX: examples/models/cnn/1/model.onnx, input x f32[N, 1, 28, 28], output logits f32[N, 10])
"""
import http.client
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND, ONNX = sys.argv[1], sys.argv[2]
FAILURES = []
MODELS = os.path.join(H.TMP, "version-load", "models")


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


def req(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, path, body=json.dumps(body) if body is not None else None)
    r = c.getresponse()
    data = r.read()
    c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data


def write_version(version, config, onnx_bytes=None):
    folder = os.path.join(MODELS, "cnn", str(version))
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    if onnx_bytes is None:
        shutil.copy(ONNX, os.path.join(folder, "model.onnx"))
    else:
        open(os.path.join(folder, "model.onnx"), "wb").write(onnx_bytes)
    if config is not None:
        with open(os.path.join(folder, "config.json"), "w") as f:
            f.write(config)


def infer(port):
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0.25] * 784}]}
    return req(port, "POST", "/v2/models/cnn/infer", body)


def index_row(port, version):
    st, rows = req(port, "POST", "/v2/repository/index")
    for r in rows if st == 200 else []:
        if r["name"] == "cnn" and r["version"] == str(version):
            return r
    return None


GOOD = json.dumps({"max_batch_size": 4})
ONNX_BYTES = open(ONNX, "rb").read()
# (what, config.json text, model.onnx bytes or None for the good one, words the refusal must hold)
BROKEN = [
    ("a misspelt key", json.dumps({"max_batch_sise": 32}), None, ["unknown key 'max_batch_sise'"]),
    ("config.json not JSON", "garbage", None, ["config.json"]),
    ("a policy of no versions", json.dumps({"version_policy": {"latest": {"num_versions": 0}}}), None,
     ["version_policy.latest must be {\"num_versions\": N}, N within 1.."]),
    ("an empty model.onnx", GOOD, b"", ["model.onnx is empty"]),
    ("a truncated model.onnx", GOOD, ONNX_BYTES[:1000], ["model.onnx"]),
]


def main():
    d = H.Daemon(KILND, "version-load", setup=lambda data: write_version(1, GOOD), data_roots=False)
    try:
        port = d.port
        deadline = time.time() + 30
        st = 0
        while st != 200 and time.time() < deadline:
            st, _ = req(port, "GET", "/v2/models/cnn/ready")
            time.sleep(0.02)
        check(st == 200, "version 1 is served at start")
        for what, config, onnx, words in BROKEN:
            write_version(2, config, onnx)
            st, body = req(port, "POST", "/v2/repository/models/cnn/load")
            msg = body.get("error", "") if isinstance(body, dict) else ""
            check(st == 400, "%s in version 2: the load answers %d %r, want 400" % (what, st, body))
            check("version 2" in msg and all(w in msg for w in words),
                  "%s: the refusal %r names version 2 and says %r" % (what, msg, words))
            st, body = infer(port)
            check(st == 200 and body.get("model_version") == "1",
                  "%s: version 1 still answers: %d %r" % (what, st, str(body)[:200]))
            r1, r2 = index_row(port, 1), index_row(port, 2)
            check(r1 is not None and r1["state"] == "READY", "%s: the index shows version 1 READY: %r" % (what, r1))
            check(r2 is not None and r2["state"] == "UNAVAILABLE" and r2["reason"],
                  "%s: the index shows version 2 UNAVAILABLE with its reason: %r" % (what, r2))
        # A broken version the policy does not select is no reason to refuse the load.
        write_version(1, json.dumps({"max_batch_size": 4, "version_policy": {"specific": {"versions": [1]}}}))
        write_version(2, json.dumps({"max_batch_sise": 32}))
        st, body = req(port, "POST", "/v2/repository/models/cnn/load")
        check(st == 200, "a broken version 2 outside the policy (specific [1]) loads: %d %r" % (st, body))
        # All versions: the broken one is selected, so the load is refused.
        write_version(1, json.dumps({"max_batch_size": 4, "version_policy": {"all": {}}}))
        st, body = req(port, "POST", "/v2/repository/models/cnn/load")
        check(st == 400 and "version 2" in body.get("error", ""),
              "policy all with a broken version 2: 400 naming it: %d %r" % (st, body))
        # Fixed: the load brings version 2 in, and it answers.
        write_version(1, GOOD)
        write_version(2, GOOD)
        st, body = req(port, "POST", "/v2/repository/models/cnn/load")
        check(st == 200 and body == {}, "version 2 fixed: the load answers 200 {}: %d %r" % (st, body))
        st, body = infer(port)
        check(st == 200 and body.get("model_version") == "2", "version 2 answers once loaded: %d" % st)
    finally:
        if d.stop(timeout=20) is None:
            check(False, "kilnd did not stop on SIGTERM")
    if FAILURES:
        print(open(d.log).read()[-3000:])
        print("%d failure(s)" % len(FAILURES))
        return 1
    H.cleanup()
    print("version load: %d broken newest versions refused, the old one served throughout" % len(BROKEN))
    return 0


if __name__ == "__main__":
    sys.exit(main())
