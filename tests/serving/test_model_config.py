#!/usr/bin/env python3
"""A model's config.json checked at load, through kilnd's repository API: a config that
contradicts the ONNX graph (input datatype or shape, output datatype or shape) or that has
an unknown, misspelt or repeated key is refused with a 400 naming the problem, and never
served as ready; configs that fit the graph load and answer correct results.

Usage: test_model_config.py KILND MODEL_ONNX
(MODEL_ONNX: examples/models/cnn/1/model.onnx, input x f32[N, 1, 28, 28], output logits f32[N, 10])
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

KILND, ONNX = sys.argv[1], sys.argv[2]
FAILURES = []


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
    return r.status, data


def add_model(data, name, config_text):
    folder = os.path.join(data, "models", name, "1")
    os.makedirs(folder)
    shutil.copy(ONNX, os.path.join(folder, "model.onnx"))
    if config_text is not None:
        with open(os.path.join(folder, "config.json"), "w") as f:
            f.write(config_text)


def infer(port, name, shape):
    n = 1
    for d in shape:
        n *= d
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": [0.25] * n}]}
    return req(port, "POST", "/v2/models/%s/infer" % name, body)


X = {"name": "x", "datatype": "FP32", "shape": [-1, 1, 28, 28]}
LOGITS = {"name": "logits", "datatype": "FP32", "shape": [-1, 10]}

# (name, config.json text, words the refusal must contain)
REFUSED = [
    ("in_shape", json.dumps({"inputs": [dict(X, shape=[-1, 3, 32, 32])]}),
     ["input 'x' has shape [-1, 3, 32, 32]", "model.onnx takes [-1, 1, 28, 28]"]),
    ("in_rank", json.dumps({"inputs": [dict(X, shape=[-1, 784])]}),
     ["input 'x' has shape [-1, 784]"]),
    ("in_dtype", json.dumps({"inputs": [dict(X, datatype="INT32")]}),
     ["input 'x' is INT32", "model.onnx takes FP32"]),
    ("in_missing_name", json.dumps({"inputs": [dict(X, name="image")]}),
     ["'x' is not listed in config.json"]),
    ("out_dtype", json.dumps({"outputs": [dict(LOGITS, datatype="INT32")]}),
     ["output 'logits' is INT32", "model.onnx gives FP32"]),
    ("out_shape", json.dumps({"outputs": [dict(LOGITS, shape=[-1, 7])]}),
     ["output 'logits' has shape [-1, 7]", "gives [-1, 10]"]),
    ("out_unknown", json.dumps({"outputs": [dict(LOGITS, name="probs")]}),
     ["output 'probs' is not an output of model.onnx"]),
    ("misspelt", json.dumps({"max_batch_sise": 8}),
     ["version 1", "unknown key 'max_batch_sise'", "max_batch_size"]),
    ("triton_names", json.dumps({"input": [X]}),
     ["unknown key 'input'", "did you mean 'inputs'"]),
    ("tensor_key", json.dumps({"inputs": [dict(X, dims=[1, 28, 28])]}),
     ["inputs[0]: unknown key 'dims'"]),
    ("batching_key", json.dumps({"max_batch_size": 8, "dynamic_batching": {"max_queue_delay": 5}}),
     ["dynamic_batching: unknown key 'max_queue_delay'"]),
    ("twice", '{"max_batch_size": 8, "max_batch_size": 0}',
     ["key 'max_batch_size' is given twice"]),
    ("preferred", json.dumps({"max_batch_size": 8, "dynamic_batching": {"preferred_batch_sizes": [4, 16]}}),
     ["preferred_batch_sizes[1] is 16", "1..max_batch_size (8)"]),
    # Triton's config.pbtxt names, which kilnd's own /config answers in: what config.json calls them
    ("triton_delay", json.dumps({"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 5}}),
     ["unknown key 'max_queue_delay_microseconds'", "did you mean 'max_queue_delay_us'"]),
    ("triton_group", json.dumps({"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}),
     ["unknown key 'instance_group'", "'instance_count' and 'device'"]),
    ("triton_platform", json.dumps({"name": "m", "platform": "onnxruntime_onnx"}),
     ["unknown key 'name'", "the model's folder names it"]),
    ("batch_range", json.dumps({"max_batch_size": 100000000}), ["max_batch_size must be an integer within 0..1048576"]),
    ("batching_null", json.dumps({"max_batch_size": 8, "dynamic_batching": None}),
     ["dynamic_batching must be an object", "0..3600000000 (an hour)"]),
    # a model that does not batch has nothing to batch: refused, not loaded with the batching dropped
    ("batching_unbatched", json.dumps({"max_batch_size": 0, "dynamic_batching": {}}),
     ["dynamic_batching needs max_batch_size 1 or more (it is 0)"]),
    ("batching_no_size", json.dumps({"dynamic_batching": {"max_queue_delay_us": 100}}),
     ["dynamic_batching needs max_batch_size 1 or more (it is not set, so 0)"]),
    # a version policy is one of three, spelt as Triton spells it; one that does not parse is refused, never
    # taken for the next (latest 0 with all served all; all: false served all; unknown keys were ignored)
    ("policy_all_false", json.dumps({"version_policy": {"all": False}}), ["version_policy.all must be {}"]),
    ("policy_two", json.dumps({"version_policy": {"latest": {"num_versions": 0}, "all": {}}}),
     ["version_policy must hold exactly one of latest, all and specific"]),
    ("policy_latest_0", json.dumps({"version_policy": {"latest": {"num_versions": 0}}}),
     ["version_policy.latest must be {\"num_versions\": N}, N within 1..1048576"]),
    ("policy_typo", json.dumps({"version_policy": {"latest": {"num_versions": 1, "typo": 3}}}),
     ["version_policy.latest: unknown key 'typo'"]),
    ("policy_all_key", json.dumps({"version_policy": {"all": {"num_versions": 1}}}),
     ["version_policy.all: unknown key 'num_versions'"]),
    ("policy_specific_empty", json.dumps({"version_policy": {"specific": {"versions": []}}}),
     ["version_policy.specific must be {\"versions\": [V, ...]}, at least one"]),
]

# (name, config.json text or None, the request shape that must run)
ACCEPTED = [
    ("no_config", None, [2, 1, 28, 28]),
    ("listed", json.dumps({"inputs": [X], "outputs": [LOGITS], "max_batch_size": 4}), [3, 1, 28, 28]),
    # config.json may fix a dim the graph leaves free (here the batch: then no batching)
    ("narrowed", json.dumps({"inputs": [dict(X, shape=[2, 1, 28, 28])], "outputs": [dict(LOGITS, shape=[2, 10])]}),
     [2, 1, 28, 28]),
    ("outputs_only", json.dumps({"outputs": [LOGITS], "max_batch_size": 2}), [1, 1, 28, 28]),
]


def repository_edges(d):
    """A Triton config.pbtxt is refused, naming config.json (it was ignored: its batching and version
    policy dropped without a word); a policy selecting more versions than kilnd serves at once is
    refused whole (past 16, the newest were left out and the load answered 200); a version the policy
    does not select says so in the index, not the reason another version failed."""
    port, data = d.port, d.data
    folder = os.path.join(data, "models", "pbtxt")
    os.makedirs(os.path.join(folder, "1"))
    shutil.copy(ONNX, os.path.join(folder, "1", "model.onnx"))
    with open(os.path.join(folder, "config.pbtxt"), "w") as f:
        f.write('max_batch_size: 8\ndynamic_batching { }\n')
    st, body = req(port, "POST", "/v2/repository/models/pbtxt/load")
    check(st == 400 and b"config.pbtxt is Triton's model configuration" in body and b"config.json" in body,
          "a config.pbtxt is refused, naming config.json: %d %r" % (st, body[:300]))
    folder = os.path.join(data, "models", "many")
    for v in range(1, 66):
        os.makedirs(os.path.join(folder, str(v)))
        shutil.copy(ONNX, os.path.join(folder, str(v), "model.onnx"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"version_policy": {"all": {}}}, f)
    st, body = req(port, "POST", "/v2/repository/models/many/load")
    check(st == 400 and b"selects 65 versions" in body and b"at most 64" in body,
          "a policy selecting 65 versions is refused whole: %d %r" % (st, body[:300]))
    check(req(port, "GET", "/v2/models/many/ready")[0] != 200, "and none of them is served")
    # versions 1..3 under latest 2, and a version 5 that is not valid
    folder = os.path.join(data, "models", "policy")
    for v in (1, 2, 3):
        os.makedirs(os.path.join(folder, str(v)))
        shutil.copy(ONNX, os.path.join(folder, str(v), "model.onnx"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"version_policy": {"latest": {"num_versions": 2}}}, f)
    os.makedirs(os.path.join(folder, "5"))
    open(os.path.join(folder, "5", "model.onnx"), "w").close()
    st, body = req(port, "POST", "/v2/repository/models/policy/load")
    check(st == 400 and b"version 5" in body, "the load naming the empty version 5 fails: %d %r" % (st, body[:200]))
    st, body = req(port, "POST", "/v2/repository/index", {})
    rows = {(r["name"], r.get("version")): r.get("reason", "") for r in json.loads(body) if r["name"] == "policy"}
    # 1 is not selected (it carried version 5's failure); 2 and 3 are, and their load failed over 5
    check(rows.get(("policy", "1")) == "not selected by the version policy" and
          all("version 5 is not valid" in rows.get(("policy", v), "") for v in ("2", "3")) and
          "empty" in rows.get(("policy", "5"), ""), "the index gives each version its own reason: %s" % rows)
    # a "specific" policy listing a version with no folder serves the others, and says so in the log
    folder = os.path.join(data, "models", "specific_gap")
    os.makedirs(os.path.join(folder, "1"))
    shutil.copy(ONNX, os.path.join(folder, "1", "model.onnx"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"version_policy": {"specific": {"versions": [1, 7]}}}, f)
    st, body = req(port, "POST", "/v2/repository/models/specific_gap/load")
    time.sleep(0.2)
    check(st == 200 and "model specific_gap: version_policy.specific lists version 7, which has no folder" in
          open(d.log).read(), "a listed version with no folder is logged: %d %r" % (st, body[:200]))


def devices_by_their_names():
    """A device listed as "cpu:0" serves a model whose config.json says "cpu" (what the device
    calls itself), and one device listed under two spellings is refused at start."""
    data = os.path.join(H.TMP, "named")
    os.makedirs(os.path.join(data, "models"))
    add_model(data, "on_cpu", json.dumps({"device": "cpu"}))
    out = subprocess.run([KILND, "--port", "0", "--data-dir", data, "--devices", "cpu,cpu:0"], env=H.ENV,
                         capture_output=True, text=True, timeout=30)
    check(out.returncode != 0 and "are the same device" in out.stderr,
          "--devices cpu,cpu:0 is refused: rc %d %r" % (out.returncode, out.stderr[-300:]))
    d = H.Daemon(KILND, "named", fresh=False, extra=["--devices", "cpu:0"], data_roots=False)
    try:
        port = d.port
        deadline = time.time() + 15
        st = 0
        while time.time() < deadline and st != 200:
            st, _ = req(port, "GET", "/v2/health/ready")
            time.sleep(0.02)
        st, body = infer(port, "on_cpu", [1, 1, 28, 28])
        check(st == 200, "a model on 'cpu' runs on the device listed as 'cpu:0': %d %r" % (st, body[:200]))
    finally:
        if d.stop(timeout=20) is None:
            check(False, "kilnd on --devices cpu:0 did not stop on SIGTERM")


def main():
    d = H.Daemon(KILND, "model-config", setup=lambda data: os.makedirs(os.path.join(data, "models")),
                 data_roots=False)
    data = d.data
    try:
        port = d.port
        for name, text, words in REFUSED:
            add_model(data, name, text)
            st, body = req(port, "POST", "/v2/repository/models/%s/load" % name)
            msg = ""
            try:
                msg = json.loads(body).get("error", "")
            except ValueError:
                pass
            check(st == 400, "%s: load answered %d (%r), want 400" % (name, st, body[:200]))
            for w in words:
                check(w in msg, "%s: the refusal %r does not say %r" % (name, msg, w))
            st, _ = req(port, "GET", "/v2/models/%s/ready" % name)
            check(st != 200, "%s: refused, yet ready answers 200" % name)
        for name, text, shape in ACCEPTED:
            add_model(data, name, text)
            st, body = req(port, "POST", "/v2/repository/models/%s/load" % name)
            check(st == 200, "%s: load answered %d (%r), want 200" % (name, st, body[:300]))
            st, body = infer(port, name, shape)
            check(st == 200, "%s: infer %s answered %d (%r)" % (name, shape, st, body[:300]))
            if st == 200:
                out = json.loads(body)["outputs"][0]
                check(out["datatype"] == "FP32" and out["shape"] == [shape[0], 10] and
                      len(out["data"]) == shape[0] * 10 and any(v != 0 for v in out["data"]),
                      "%s: output %r" % (name, {k: out[k] for k in ("datatype", "shape")}))
        # the same input on every accepted model gives the same logits (one graph, no casts)
        firsts = []
        for name, _, shape in ACCEPTED:
            st, body = infer(port, name, shape)
            if st == 200:
                firsts.append(json.loads(body)["outputs"][0]["data"][:10])
        check(len(firsts) == len(ACCEPTED) and all(
            max(abs(a - b) for a, b in zip(f, firsts[0])) < 1e-5 for f in firsts),
            "accepted models disagree on the same input: %r" % firsts)
        repository_edges(d)
    finally:
        if d.stop(timeout=20) is None:
            check(False, "kilnd did not stop on SIGTERM")
    devices_by_their_names()
    if FAILURES:
        print(open(d.log).read()[-3000:])
        print("%d failure(s)" % len(FAILURES))
        return 1
    H.cleanup()
    print("model config: %d refused, %d accepted, all as expected" % (len(REFUSED), len(ACCEPTED)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
