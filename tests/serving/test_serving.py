#!/usr/bin/env python3
"""Black-box tests of kilnd serving a model: KServe v2 JSON and binary inference (stdlib HTTP, and
tritonclient when KILN_TEST_PYTHON's environment has it), batching, the repository extension,
statistics, metrics, the idle device's pool trim, auth scopes, bad input, backpressure and SIGTERM
drain; an ONNX model (tests/fixtures/onnx/cnn.onnx, reference outputs from ONNX Runtime) served with
and without a config.json.

Usage: test_serving.py KILND FIXTURE_DIR
"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND, FIX = sys.argv[1], sys.argv[2]
TMP = H.TMP
ENV = H.ENV
EXPECTED = json.load(open(os.path.join(FIX, "expected.json")))
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


class Daemon(H.Daemon):
    """kilnd serving the fixture's mnist_mlp (setup may add to its data dir first), started with
    args and the variables in env, once the model is ready; req answers (status, headers, body)."""

    def __init__(self, name, *args, env=None, setup=None, token=None):
        self.token = token  # for the wait below, when kilnd asks for one
        def models(data):
            os.makedirs(os.path.join(data, "models"), exist_ok=True)
            shutil.copytree(os.path.join(FIX, "mnist_mlp"), os.path.join(data, "models", "mnist_mlp"))
            if setup:
                setup(data)

        super().__init__(KILND, name, extra=args, env=env, setup=models, data_roots=False)
        deadline = time.time() + 15
        while time.time() < deadline:
            st, _, _ = self.req("GET", "/v2/models/mnist_mlp/ready", headers=self.auth())
            if st == 200:
                break
            time.sleep(0.02)

    def auth(self):
        return {"Authorization": "Bearer " + self.token} if self.token else {}

    def req(self, method, path, body=None, headers=None, timeout=20):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        return r.status, hdrs, data

    def stop(self):
        rc = super().stop(timeout=30)
        rc = -9 if rc is None else rc  # killed: it did not stop in time
        with open(self.log, errors="replace") as f:
            check(rc == 0, "kilnd exits 0 after SIGTERM (rc %s)  (log: %s)" % (rc, f.read()[-2000:]))


def infer_body(rows, **extra):
    b = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [len(rows), 784], "data": rows}]}
    b.update(extra)
    return b


def close(a, b, tol=1e-4):
    return len(a) == len(b) and all(abs(x - y) <= tol * (1 + abs(y)) for x, y in zip(a, b))


def flat(rows):
    return [v for r in rows for v in r]


def test_basic(d):
    st, h, body = d.req("GET", "/v2")
    ext = json.loads(body)["extensions"]
    check(st == 200 and "model_repository" in ext and "statistics" in ext and "binary_tensor_data" in ext,
          "GET /v2 lists the extensions")
    st, _, body = d.req("GET", "/v2/models/mnist_mlp")
    meta = json.loads(body)
    check(st == 200 and meta["versions"] == ["1"] and meta["inputs"][0] ==
          {"name": "input", "datatype": "FP32", "shape": [-1, 784]}, "model metadata")
    st, _, _ = d.req("GET", "/v2/models/mnist_mlp/versions/1")
    check(st == 200, "versioned metadata")
    st, _, _ = d.req("GET", "/v2/models/mnist_mlp/versions/7")
    check(st == 404, "unknown version is 404")
    st, _, _ = d.req("GET", "/v2/models/mnist_mlp/versions/9223372036854775807/ready")
    check(st == 404, "the largest version there can be is looked up: 404")
    # openapi's ^[1-9][0-9]*$ within int64: "01" is not 1, and a number past the range is not clamped
    for bad in ("01", "0", "-1", "+1", "1a", "9223372036854775808", "99999999999999999999999"):
        for tail in ("", "/ready", "/config"):
            st, h, body = d.req("GET", "/v2/models/mnist_mlp/versions/%s%s" % (bad, tail))
            err = json.loads(body).get("error", "") if body else ""
            check(st == 400 and ("'%s'" % bad) in err, "version %r%s is 400 naming it: %s %s" % (bad, tail, st, body))
    st, _, body = d.req("POST", "/v2/models/mnist_mlp/versions/01/infer", infer_body(EXPECTED["input"][:1]))
    check(st == 400 and "'01'" in json.loads(body)["error"], "infer on version 01 is 400: %s" % body)
    st, _, _ = d.req("GET", "/v2/models/mnist_mlp/versions/1/ready")
    check(st == 200, "version 1 stays ready")
    st, h, body = d.req("POST", "/v2/models/mnist_mlp/infer", infer_body(EXPECTED["input"], id="req-1"),
                        headers={"X-Request-Id": "abc-123"})
    r = json.loads(body)
    check(st == 200 and r["id"] == "req-1" and r["outputs"][0]["shape"] == [4, 10], "JSON inference")
    check(close(r["outputs"][0]["data"], flat(EXPECTED["logits"])), "JSON inference matches numpy")
    check(h.get("x-request-id") == "abc-123", "X-Request-Id echoed")
    # nested data is the same as flat
    b = infer_body(EXPECTED["input"][:1])
    b["inputs"][0]["data"] = flat(EXPECTED["input"][:1])
    st, h, body = d.req("POST", "/v2/models/mnist_mlp/infer", b)
    check(st == 200 and close(json.loads(body)["outputs"][0]["data"], EXPECTED["logits"][0]), "flat data")
    check(h.get("x-request-id", "").startswith("kiln-"), "X-Request-Id generated")


def test_batch_stats(d):
    """batch_stats counts runs by their exact batch size, as Triton does (a run of 3 rows was
    reported as 4, and of 200 as 128), with their compute time."""
    st, _, _ = d.req("POST", "/v2/models/mnist_mlp/infer", infer_body(EXPECTED["input"][:3]))
    st2, _, body = d.req("GET", "/v2/models/mnist_mlp/stats")
    s = json.loads(body)["model_stats"][0]
    sizes = [b["batch_size"] for b in s["batch_stats"]]
    check(st == 200 and st2 == 200 and 3 in sizes and sizes == sorted(sizes) and
          all(b["compute_infer"]["count"] > 0 and b["compute_infer"]["ns"] > 0 for b in s["batch_stats"]) and
          sum(b["batch_size"] * b["compute_infer"]["count"] for b in s["batch_stats"]) == s["inference_count"],
          "batch_stats by exact batch size, ascending, adding up to inference_count: %s" % s["batch_stats"])


def test_binary(d):
    rows = EXPECTED["input"][:2]
    raw = struct.pack("<%df" % (2 * 784), *flat(rows))
    hdr = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 784],
                                  "parameters": {"binary_data_size": len(raw)}}],
                      "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
    st, h, body = d.req("POST", "/v2/models/mnist_mlp/infer", hdr + raw,
                        headers={"Inference-Header-Content-Length": str(len(hdr)),
                                 "Content-Type": "application/octet-stream"})
    check(st == 200 and "inference-header-content-length" in h, "binary inference answers with a header length")
    if st == 200:
        n = int(h["inference-header-content-length"])
        meta = json.loads(body[:n])
        vals = struct.unpack("<20f", body[n:])
        check(meta["outputs"][0]["parameters"]["binary_data_size"] == 80 and
              close(vals, flat(EXPECTED["logits"][:2])), "binary output matches numpy")
    # both "data" and binary bytes for one input: one of them would be dropped without a word
    both = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 784],
                                   "data": flat(rows), "parameters": {"binary_data_size": len(raw)}}]}).encode()
    st, _, body = d.req("POST", "/v2/models/mnist_mlp/infer", both + raw,
                        headers={"Inference-Header-Content-Length": str(len(both))})
    check(st == 400 and json.loads(body).get("error") ==
          "input 'input' has both \"data\" and binary_data_size: give its values in one of them",
          "an input with both data and binary_data_size is refused: %d %s" % (st, body[:200]))


def test_tritonclient(d):
    py = os.environ.get("KILN_TEST_PYTHON")
    if not py or subprocess.run([py, "-c", "import tritonclient.http, numpy"], capture_output=True).returncode:
        print("SKIP: tritonclient not installed (tests/run installs it into .venv-tests)")
        return
    script = r'''
import json, sys, numpy as np, tritonclient.http as th
port, fix = sys.argv[1], sys.argv[2]
e = json.load(open(fix + "/expected.json"))
c = th.InferenceServerClient("127.0.0.1:" + port)
assert c.is_server_live() and c.is_model_ready("mnist_mlp")
x = np.array(e["input"], dtype=np.float32)
want = np.array(e["logits"], dtype=np.float32)
for binary in (False, True):
    i = th.InferInput("input", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=binary)
    o = th.InferRequestedOutput("logits", binary_data=binary)
    r = c.infer("mnist_mlp", [i], outputs=[o])
    assert np.allclose(r.as_numpy("logits"), want, atol=1e-4), binary
print("tritonclient ok")
'''
    r = subprocess.run([py, "-c", script, str(d.port), FIX], capture_output=True, text=True)
    check(r.returncode == 0, "tritonclient JSON and binary inference: " + r.stdout + r.stderr[-1500:])


def read_safetensors(path):
    """name -> (shape, flat list of floats); F32 only, which is all the ONNX fixtures hold. The format
    is an 8-byte header length, a JSON header and the raw bytes, so the stdlib suffices."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    out = {}
    for k, v in json.loads(raw[8:8 + n]).items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = (v["shape"], list(struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])))
    return out


def test_onnx(d):
    onnx_dir = os.path.join(os.path.dirname(os.path.abspath(FIX)), "onnx")
    ref = {b: read_safetensors(os.path.join(onnx_dir, "cnn.b%d.io.safetensors" % b)) for b in (1, 3)}
    # "cnn": no config.json at all; "cnn_batched": a config.json with batching and nothing else.
    for name, cfg in (("cnn", None), ("cnn_batched", {"max_batch_size": 8,
                                                      "dynamic_batching": {"max_queue_delay_us": 2000}})):
        vdir = os.path.join(d.data, "models", name, "1")
        os.makedirs(vdir)
        shutil.copy(os.path.join(onnx_dir, "cnn.onnx"), os.path.join(vdir, "model.onnx"))
        if cfg:
            json.dump(cfg, open(os.path.join(vdir, "config.json"), "w"))
        st, _, body = d.req("POST", "/v2/repository/models/%s/load" % name)
        check(st == 200, "load ONNX model %s: %s" % (name, body))
        st, _, body = d.req("GET", "/v2/models/" + name)
        meta = json.loads(body)
        check(st == 200 and meta["platform"] == "onnx" and
              meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1, 28, 28]}] and
              meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}] and
              meta["max_batch_size"] == (cfg or {}).get("max_batch_size", 0),
              "ONNX metadata from the graph: %s" % body)
        for b in (1, 3):
            xs, x = ref[b]["in.x"]
            ys, y = ref[b]["out.logits"]
            st, _, body = d.req("POST", "/v2/models/%s/infer" % name,
                                {"inputs": [{"name": "x", "datatype": "FP32", "shape": xs, "data": x}]})
            out = json.loads(body)["outputs"][0] if st == 200 else {}
            check(st == 200 and out.get("shape") == ys and close(out["data"], y),
                  "ONNX %s JSON inference b%d matches ONNX Runtime (%d %s)" % (name, b, st, body[:200]))
    # Concurrent single rows batch together and still come back each with its own row.
    xs, x = ref[3]["in.x"]
    _, y = ref[3]["out.logits"]
    per = len(x) // 3
    results = {}

    def one(i):
        k = i % 3
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": x[k * per:(k + 1) * per]}]}
        st, _, data = d.req("POST", "/v2/models/cnn_batched/infer", body)
        results[i] = st == 200 and close(json.loads(data)["outputs"][0]["data"], y[k * 10:(k + 1) * 10])
    ts = [threading.Thread(target=one, args=(i,)) for i in range(24)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    check(len(results) == 24 and all(results.values()), "24 concurrent ONNX requests each get their own row")
    st, _, body = d.req("GET", "/v2/models/cnn_batched/stats")
    s = json.loads(body)["model_stats"][0]
    check(s["execution_count"] < s["inference_count"], "concurrent ONNX requests were batched: %s" % s)
    py = os.environ.get("KILN_TEST_PYTHON")
    if py and subprocess.run([py, "-c", "import tritonclient.http, numpy"], capture_output=True).returncode == 0:
        script = r'''
import json, sys, numpy as np, tritonclient.http as th
port, x, y = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
c = th.InferenceServerClient("127.0.0.1:" + port)
x = np.array(x, dtype=np.float32).reshape(3, 1, 28, 28)
want = np.array(y, dtype=np.float32).reshape(3, 10)
for binary in (False, True):
    i = th.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=binary)
    r = c.infer("cnn_batched", [i], outputs=[th.InferRequestedOutput("logits", binary_data=binary)])
    assert np.allclose(r.as_numpy("logits"), want, rtol=1e-4, atol=1e-5), binary
print("tritonclient onnx ok")
'''
        r = subprocess.run([py, "-c", script, str(d.port), json.dumps(x), json.dumps(y)], capture_output=True,
                           text=True)
        check(r.returncode == 0, "tritonclient against the ONNX model: " + r.stdout + r.stderr[-1500:])
    st, _, body = d.req("POST", "/v2/models/cnn/infer",
                        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1, 27, 28], "data": [0.0] * 756}]})
    check(st == 400, "an ONNX input of the wrong shape is 400: %s" % body[:200])
    # A graph kilnd cannot load leaves a reason in the index and the server running.
    vdir = os.path.join(d.data, "models", "bad_onnx", "1")
    os.makedirs(vdir)
    open(os.path.join(vdir, "model.onnx"), "wb").write(b"\x08\x07garbage")
    st, _, body = d.req("POST", "/v2/repository/models/bad_onnx/load")
    check(st == 400 and "model.onnx" in json.loads(body).get("error", ""), "a broken ONNX load says why: %s" % body)
    for name in ("cnn", "cnn_batched", "bad_onnx"):
        shutil.rmtree(os.path.join(d.data, "models", name))
        d.req("POST", "/v2/repository/models/%s/unload" % name)


def test_bad_input(d):
    cases = [
        ("malformed JSON", b"{not json", 400),
        ("wrong shape", infer_body([[0.0] * 783]), 400),
        ("data/shape mismatch", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 784],
                                             "data": [0.0] * 784}]}, 400),
        ("wrong datatype", {"inputs": [{"name": "input", "datatype": "INT64", "shape": [1, 784],
                                        "data": [0] * 784}]}, 400),
        ("unknown datatype", {"inputs": [{"name": "input", "datatype": "FP8", "shape": [1, 784], "data": []}]}, 400),
        ("unknown input", {"inputs": [{"name": "nope", "datatype": "FP32", "shape": [1, 784], "data": []}]}, 400),
        ("string data", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784],
                                     "data": ["a"] * 784}]}, 400),
        ("batch over max_batch_size", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [65, 784],
                                                   "data": [0.0] * (65 * 784)}]}, 400),
        ("too many elements", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1000000, 784],
                                           "data": []}]}, 413),
        ("a dim past limits.max_tensor_elements", {"inputs": [{"name": "input", "datatype": "FP32",
                                                                "shape": [1, 16777217], "data": []}]}, 413),
        ("a dim past 64 bits", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1e30], "data": []}]},
         413),
        ("unknown output", dict(infer_body([[0.0] * 784]), outputs=[{"name": "zzz"}]), 400),
        ("inputs not an array", {"inputs": 3}, 400),
    ]
    for what, body, want in cases:
        st, h, data = d.req("POST", "/v2/models/mnist_mlp/infer", body)
        ok = st == want and h.get("content-type") == "application/json" and "error" in json.loads(data)
        check(ok, "bad input %s -> %d (got %d %s)" % (what, want, st, data[:200]))
    # a wrong rank is named as such, even where a dim also differs ([1, 5, 784] for [-1, 784])
    st, _, data = d.req("POST", "/v2/models/mnist_mlp/infer",
                        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 5, 784], "data": []}]})
    check(st == 400 and "has 3 dims; the model expects 2" in json.loads(data).get("error", ""),
          "a wrong rank says so: %s" % data[:200])
    st, _, data = d.req("POST", "/v2/models/mnist_mlp/infer",
                        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 783], "data": [0.0] * 783}]})
    check(st == 400 and "dim 1 is 783; the model expects 784" in json.loads(data).get("error", ""),
          "a wrong dim says which: %s" % data[:200])
    # parameters that would otherwise be dropped without a word: a flag that is not a boolean,
    # parameters that are not an object, a classification count that is none (the extension's
    # answers: test_classification.py): each a 400 naming its place, never a 200 with something else
    one = infer_body([[0.0] * 784])
    for what, body, words in (
            ("binary_data \"yes\"", dict(one, outputs=[{"name": "logits", "parameters": {"binary_data": "yes"}}]),
             "output 'logits': parameters.binary_data must be true or false"),
            ("binary_data_output 1", dict(one, parameters={"binary_data_output": 1}),
             "the request: parameters.binary_data_output must be true or false"),
            ("request parameters a string", dict(one, parameters="x"), 'the request: "parameters" must be an object'),
            ("input parameters a list", {"inputs": [dict(one["inputs"][0], parameters=[1])]},
             "input 'input': \"parameters\" must be an object"),
            ("classification 0", dict(one, outputs=[{"name": "logits", "parameters": {"classification": 0}}]),
             "output 'logits': classification must be a whole number of classes from 1")):
        st, _, data = d.req("POST", "/v2/models/mnist_mlp/infer", body)
        err = json.loads(data).get("error", "") if st == 400 else ""
        check(st == 400 and words in err, "%s -> 400 naming it: %d %s" % (what, st, data[:300]))
    st, _, data = d.req("POST", "/v2/models/mnist_mlp/infer",
                        dict(one, outputs=[{"name": "logits", "parameters": {"binary_data": False}}],
                             parameters={"binary_data_output": False, "priority": 1}))
    check(st == 200 and len(json.loads(data)["outputs"][0]["data"]) == 10,
          "boolean flags and a parameter kilnd does not use still answer: %d %s" % (st, data[:200]))
    st, _, _ = d.req("POST", "/v2/models/nosuch/infer", infer_body([[0.0] * 784]))
    check(st == 404, "unknown model is 404")
    st, _, _ = d.req("GET", "/v2/models/..%2f/ready")
    check(st in (400, 404), "invalid model name refused")
    st, _, data = d.req("POST", "/v2/models/a%20b/infer", infer_body([[0.0] * 784]))
    check(st == 400 and "a model name is 1 to 128 characters of A-Z a-z 0-9 _ . -" in json.loads(data)["error"],
          "an invalid model name is refused with the rule: %d %s" % (st, data[:200]))
    st, _, _ = d.req("POST", "/v2/models/mnist_mlp/infer", b"x" * 100,
                     headers={"Inference-Header-Content-Length": "1000"})
    check(st == 400, "header length beyond the body is 400")
    # a JSON request sent with a header left from a binary one (tritonclient adds it to the
    # headers dict a caller passed): the error says what the header did
    body = json.dumps(infer_body([[0.0] * 784]))
    st, _, data = d.req("POST", "/v2/models/mnist_mlp/infer", body, headers={"Inference-Header-Content-Length": "143"})
    err = json.loads(data).get("error", "") if st == 400 else ""
    check(st == 400 and "Inference-Header-Content-Length says the JSON is the first 143 bytes of this %d-byte body"
          % len(body) in err, "a stale Inference-Header-Content-Length is named: %d %s" % (st, err))
    st, _, _ = d.req("GET", "/v2/models/mnist_mlp/ready")
    check(st == 200, "still serving after bad input")


def test_bad_data(d):
    """The "data" arrays are checked and converted on the worker, the rest of the body on the loop;
    the answers must be those of one strict pass over the whole body: a syntax error anywhere wins
    (at the byte it is at), then errors in document order."""
    row = ",".join(["0.5"] * 784)

    def body(data, name="input", outputs=""):
        return ('{"inputs":[{"name":"%s","datatype":"FP32","shape":[1,784],"data":%s}]%s}'
                % (name, data, outputs)).encode()
    syntax_at = body("[" + row + ",]").index(b",]") + 1  # the ']' where a value should be
    cut = body("[" + row)[:-2]  # the array ends with the input's '}'
    cases = [
        ("a trailing comma in data", body("[" + row + ",]"),
         "request body is not valid JSON: expected a value at byte %d" % syntax_at),
        ("a syntax error in data beats an unknown input", body("[" + row + ",]", name="nope"),
         "request body is not valid JSON: expected a value at byte %d" % (syntax_at - 1)),
        ("data nested past the depth limit", body("[" + "[" * 62 + "]" * 62 + "]"),
         "request body is not valid JSON: nested too deeply at byte 129"),
        ("an unterminated data array", cut, "request body is not valid JSON: expected ',' or ']' at byte %d" % (len(cut) - 1)),
        ("a float out of range", body("[" + row.replace("0.5", "1e39", 1) + "]"),
         "input 'input': FP32 data must be finite and within the FP32 range"),
        ("a string holding a bracket", body("[" + row.replace("0.5", '"]"', 1) + "]"),
         "input 'input': data elements must be numbers"),
        ("bad data beats a later unknown output",
         body("[" + row.replace("0.5", '"a"', 1) + "]", outputs=',"outputs":[{"name":"zzz"}]'),
         "input 'input': data elements must be numbers"),
        ("too few elements", body("[" + ",".join(["0.5"] * 783) + "]"),
         "input 'input': shape holds 784 elements but data has 783"),
        ("too many elements", body("[" + row + ",0.5]"), "input 'input': more data elements than the shape holds"),
    ]
    for what, b, want in cases:
        st, h, data = d.req("POST", "/v2/models/mnist_mlp/infer", b)
        got = json.loads(data).get("error") if h.get("content-type") == "application/json" else data[:200]
        check(st == 400 and got == want, "bad data, %s -> 400 %r (got %d %r)" % (what, want, st, got))
    # binary tensor data beside a "data" array nobody converts: the array's syntax still counts
    hdr = b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,784],"parameters":{"binary_data_size":3136},"data":[1,]}]}'
    st, _, data = d.req("POST", "/v2/models/mnist_mlp/infer", hdr + bytes(3136),
                        headers={"Inference-Header-Content-Length": str(len(hdr))})
    check(st == 400 and json.loads(data).get("error") == "request body is not valid JSON: expected a value at byte 110",
          "a malformed data array beside binary data is 400 (got %d %s)" % (st, data[:200]))

    # Good and bad requests batched together: the bad ones are refused, the rest answered right.
    _, _, before = d.req("GET", "/metrics")
    rows = EXPECTED["input"]
    results, errors = {}, []

    def one(i):
        try:
            if i % 3 == 2:
                b = body("[" + row.replace("0.5", "null", 1) + "]")
            else:
                b = json.dumps(infer_body([rows[i % 4]]))
            st, _, data = d.req("POST", "/v2/models/mnist_mlp/infer", b)
            results[i] = (st, json.loads(data))
        except Exception as ex:  # noqa: BLE001
            errors.append(ex)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(48)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    ok = not errors and len(results) == 48
    for i, (st, j) in sorted(results.items()):
        if i % 3 == 2:
            ok = ok and st == 400 and j.get("error") == "input 'input': data elements must be numbers"
        else:
            ok = ok and st == 200 and close(j["outputs"][0]["data"], EXPECTED["logits"][i % 4])
    check(ok, "good and bad requests at once: bad ones 400, good ones right (%s)" % (errors[:1] or
          [r for r in results.items() if (r[0] % 3 == 2) != (r[1][0] == 400)][:1]))
    _, _, after = d.req("GET", "/metrics")

    def rejected(text):
        for line in text.decode().splitlines():
            if line.startswith('kiln_inference_requests_total{model="mnist_mlp",version="1",outcome="rejected"}'):
                return float(line.split()[-1])
        return 0.0
    check(rejected(after) - rejected(before) == 16,
          "data refused on the worker counts as rejected (%s -> %s)" % (rejected(before), rejected(after)))


def test_duplicate_keys(d):
    """A key given twice in one object of an inference body means what each reader makes of it (the
    scanner took the first, Python's json takes the last), so it is a 400 naming the key, wherever
    the object is, however the key is spelt, in an object of many keys too; the same keys once each
    are answered."""
    row = ",".join(["0.5"] * 784)
    inp = '{"name":"input","datatype":"FP32","shape":[1,784],"data":[%s]%%s}' % row
    many = ",".join('"k%d":%d' % (i, i) for i in range(5000))

    def body(input_extra="", extra=""):
        return ('{"inputs":[' + inp % input_extra + ']' + extra + '}').encode()
    hdr = b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,784],"parameters":{"binary_data_size":3136,' \
          b'"binary_data_size":3136}}]}'
    cases = [
        ("data twice in an input", body(',"data":[%s]' % row), "data", {}),
        ("data twice, the repeat escaped", body(',"d\\u0061ta":[%s]' % row), "data", {}),
        ("name twice in an input", body(',"name":"input"'), "name", {}),
        ("inputs twice", body(extra=',"inputs":[]'), "inputs", {}),
        ("in the request's parameters", body(extra=',"parameters":{"a":1,"b":2,"a":3}'), "a", {}),
        ("in a requested output", body(extra=',"outputs":[{"name":"logits","name":"logits"}]'), "name", {}),
        ("in an object of 5001 keys", body(extra=',"parameters":{%s,"k2500":0}' % many), "k2500", {}),
        ("in a binary request's header", hdr + bytes(3136), "binary_data_size",
         {"Inference-Header-Content-Length": str(len(hdr))}),
    ]
    for what, b, key, headers in cases:
        st, h, data = d.req("POST", "/v2/models/mnist_mlp/infer", b, headers=headers)
        err = json.loads(data).get("error", "") if h.get("content-type") == "application/json" else data[:200]
        check(st == 400 and ("duplicate key '%s'" % key) in err,
              "duplicate key, %s -> 400 naming '%s' (got %d %r)" % (what, key, st, err))
    good = dict(infer_body(EXPECTED["input"][:1]), parameters={"k%d" % i: i for i in range(5000)})
    st, _, data = d.req("POST", "/v2/models/mnist_mlp/infer", good)
    check(st == 200 and close(json.loads(data)["outputs"][0]["data"], EXPECTED["logits"][0]),
          "5000 distinct keys in parameters are answered (got %d %s)" % (st, data[:200]))


def test_batching(d):
    rows = EXPECTED["input"]
    results, errors = {}, []

    def one(i):
        try:
            st, _, body = d.req("POST", "/v2/models/mnist_mlp/infer", infer_body([rows[i % 4]]))
            results[i] = (st, json.loads(body))
        except Exception as ex:  # noqa: BLE001
            errors.append(ex)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    ok = not errors and all(results[i][0] == 200 and close(results[i][1]["outputs"][0]["data"],
                                                           EXPECTED["logits"][i % 4]) for i in range(32))
    check(ok, "32 concurrent requests answered with unbatched results (%s)" % errors[:1])
    st, _, body = d.req("GET", "/v2/models/mnist_mlp/stats")
    s = json.loads(body)["model_stats"][0]
    check(s["execution_count"] < s["inference_count"], "concurrent requests were batched: %s" % s)
    st, _, body = d.req("GET", "/metrics")
    text = body.decode()
    for name in ("kiln_inference_requests_total{model=\"mnist_mlp\",version=\"1\",outcome=\"success\"}",
                 "kiln_inference_batch_size_bucket", "kiln_inference_queue_seconds", "kiln_inference_compute_seconds",
                 "kiln_inference_queue_depth", "kiln_inference_in_flight", "kiln_process_resident_memory_bytes"):
        check(name in text, "/metrics has " + name)


def test_startup_readiness():
    """/v2/health/ready is 503 until every model found at start has finished loading: loaded, or
    failed (a model that cannot load does not hold readiness). Loads asked for later do not
    touch readiness, and a drain during the start-up loads never turns into ready."""
    cnn = os.path.join(os.path.dirname(os.path.abspath(FIX)), "onnx", "cnn.onnx")
    data = os.path.join(TMP, "startup")
    names = ["m%d" % i for i in range(1, 25)]
    for name in names + ["broken"]:
        v = os.path.join(data, "models", name, "1")
        os.makedirs(v)
        if name == "broken":  # passes the repository scan, fails on the worker
            open(os.path.join(v, "model.onnx"), "wb").write(b"not an onnx model")
            continue
        shutil.copy(cnn, os.path.join(v, "model.onnx"))
        json.dump({"instance_count": 4}, open(os.path.join(v, "config.json"), "w"))
    log = os.path.join(TMP, "startup.log")
    proc = subprocess.Popen([KILND, "--port", "0", "--data-dir", data], stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"), env=ENV)
    d = Daemon.__new__(Daemon)
    d.proc, d.log, d.data = proc, log, data
    portfile = os.path.join(data, "kilnd.port")
    deadline = time.time() + 30
    while not os.path.exists(portfile) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    d.port = int(open(portfile).read())
    try:
        while time.time() < deadline:
            st, _, body = d.req("GET", "/v2/health/ready")
            if st == 200:
                break
            check(st == 503 and "starting" in json.loads(body)["error"], "503 'starting' before: %s %s" % (st, body))
            time.sleep(0.002)
        check(st == 200, "ready once the start-up loads finished (a failed one included)")
        not_ready = [n for n in names if d.req("GET", "/v2/models/%s/ready" % n)[0] != 200]
        check(not not_ready, "when /v2/health/ready first says 200, every model is ready: %s are not" % not_ready)
        lines = open(log).read().splitlines()
        at = [i for i, l in enumerate(lines) if "state ready" in l]
        loads = [i for i, l in enumerate(lines) if " loaded (" in l or "broken failed to load" in l]
        check(len(at) == 1 and len(loads) == len(names) + 1 and max(loads) < at[0],
              "'state ready' is logged after every start-up load's line: %s" % lines[-6:])
        st, _, body = d.req("POST", "/v2/repository/index")
        check(any(e["name"] == "broken" and e["state"] == "UNAVAILABLE" and e["reason"] for e in json.loads(body)),
              "the model that failed shows in the index with its reason: %s" % body[:300])
        # a load asked for later: readiness stays 200 while it runs
        late = os.path.join(data, "models", "late", "1")
        os.makedirs(late)
        shutil.copy(cnn, os.path.join(late, "model.onnx"))
        json.dump({"instance_count": 8}, open(os.path.join(late, "config.json"), "w"))
        c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
        c.request("POST", "/v2/repository/models/late/load")
        during = [d.req("GET", "/v2/health/ready")[0] for _ in range(5)]
        rows = [e for e in json.loads(d.req("POST", "/v2/repository/index")[2]) if e["name"] == "late"]
        check(all(e["reason"] == "loading" for e in rows if e["state"] == "LOADING"),
              "a model being loaded says so in the index: %s" % rows)
        r = c.getresponse()
        r.read()
        c.close()
        check(r.status == 200 and during == [200] * 5, "a later load leaves readiness alone: %s" % during)
    finally:
        d.stop()
    # SIGTERM while the start-up loads run: draining, and never ready after that
    data2 = os.path.join(TMP, "startup-drain")
    shutil.copytree(os.path.join(data, "models"), os.path.join(data2, "models"))
    log2 = os.path.join(TMP, "startup-drain.log")
    proc = subprocess.Popen([KILND, "--port", "0", "--data-dir", data2], stdout=subprocess.DEVNULL,
                            stderr=open(log2, "wb"), env=ENV)
    while not os.path.exists(os.path.join(data2, "kilnd.port")) and proc.poll() is None:
        time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    lines = open(log2).read().splitlines()
    drain = [i for i, l in enumerate(lines) if "state draining" in l]
    check(rc == 0 and drain and not any("state ready" in l for l in lines[drain[0]:]),
          "a drain during the start-up loads does not turn ready: %s" % lines[-6:])


def test_repository(d):
    st, _, body = d.req("POST", "/v2/repository/index")
    idx = json.loads(body)
    check(st == 200 and idx[0]["name"] == "mnist_mlp" and idx[0]["state"] == "READY", "repository index")
    st, _, _ = d.req("POST", "/v2/repository/models/mnist_mlp/unload")
    check(st == 200, "unload")
    st, h, body = d.req("POST", "/v2/models/mnist_mlp/infer", infer_body([[0.0] * 784]))
    check(st == 503 and json.loads(body).get("error") ==
          "model 'mnist_mlp' is not ready: unloaded; POST /v2/repository/models/mnist_mlp/load loads it"
          and "retry-after" not in h,
          "an unloaded model answers 503 saying how to load it, with no Retry-After, since it does not end by "
          "itself: %d %s %s" % (st, h.get("retry-after"), body[:200]))
    # a second version appears; load swaps to it
    src = os.path.join(d.data, "models", "mnist_mlp")
    shutil.copytree(os.path.join(src, "1"), os.path.join(src, "2"))
    st, _, body = d.req("POST", "/v2/repository/models/mnist_mlp/load")
    check(st == 200, "load: %s" % body)
    st, _, body = d.req("GET", "/v2/models/mnist_mlp")
    check(json.loads(body).get("versions") == ["2"], "load serves the new version: %s" % body)
    st, _, _ = d.req("POST", "/v2/models/mnist_mlp/infer", infer_body([[0.0] * 784]))
    _, _, text = d.req("GET", "/metrics")
    v2 = [l for l in text.decode().splitlines()
          if l.startswith('kiln_inference_requests_total{model="mnist_mlp",version="2",outcome="success"} ')]
    check(st == 200 and v2 == ['kiln_inference_requests_total{model="mnist_mlp",version="2",outcome="success"} 1'],
          "the metrics label the version that answered: %s" % v2)
    check('kiln_inference_requests_total{model="mnist_mlp",version="2",outcome="timeout"} 0' in text.decode() and
          'kiln_inference_queue_seconds_count{model="mnist_mlp",version="2"}' in text.decode(),
          "a loaded version's series are there at 0 before their first event")
    # a reload of what is already served keeps the version's statistics, as /metrics keeps its series
    _, _, body = d.req("GET", "/v2/models/mnist_mlp/stats")
    before = json.loads(body)["model_stats"][0]
    st, _, _ = d.req("POST", "/v2/repository/models/mnist_mlp/load")
    _, _, body = d.req("GET", "/v2/models/mnist_mlp/stats")
    after = json.loads(body)["model_stats"][0]
    check(st == 200 and before["inference_count"] >= 1 and after["inference_count"] == before["inference_count"]
          and after["inference_stats"]["success"] == before["inference_stats"]["success"],
          "a reload keeps the version's statistics: %s -> %s" % (before["inference_count"], after["inference_count"]))
    st, _, _ = d.req("POST", "/v2/repository/models/nosuch/load")
    check(st == 404, "loading an unknown model is 404")
    os.makedirs(os.path.join(d.data, "models", "broken", "1"))
    open(os.path.join(d.data, "models", "broken", "1", "model.kiln"), "w").write("junk")
    st, _, body = d.req("POST", "/v2/repository/models/broken/load")
    check(st == 400 and "error" in json.loads(body), "a broken model's load is 400 with a reason")
    with open(d.log, errors="replace") as f:
        said = [l for l in f.read().splitlines() if "model broken not loaded: " in l]
    check(len(said) == 1 and " warn " in said[0] and json.loads(body)["error"] in said[0],
          "a load refused over the API is logged at warn with its reason: %s" % said)
    st, _, body = d.req("POST", "/v2/repository/index")
    check(any(e["name"] == "broken" and e["state"] != "READY" and e["reason"] for e in json.loads(body)),
          "the index says why a model is not served")
    st, _, _ = d.req("GET", "/v2/models/mnist_mlp/ready")
    check(st == 200, "serving continues after a failed load")


def test_folder_gone(d):
    """A model still served after its folder left the repository stays in the index, READY with a
    reason saying its folder is gone; it answers until unloaded, and then a load is a 404."""
    models = os.path.join(d.data, "models")
    one = [[0.0] * 784]
    shutil.copytree(os.path.join(FIX, "mnist_mlp"), os.path.join(models, "gone_mlp"))
    st, _, body = d.req("POST", "/v2/repository/models/gone_mlp/load")
    check(st == 200, "gone_mlp loads: %s" % body)
    os.rename(os.path.join(models, "gone_mlp"), os.path.join(TMP, "gone_mlp_moved"))
    for req_body in (None, {"ready": True}):
        st, _, body = d.req("POST", "/v2/repository/index", req_body)
        rows = [e for e in json.loads(body) if e["name"] == "gone_mlp"] if st == 200 else []
        check(len(rows) == 1 and rows[0]["version"] == "1" and rows[0]["state"] == "READY"
              and "folder is gone from the model repository" in rows[0]["reason"]
              and "cannot be loaded again" in rows[0]["reason"],
              "a served model whose folder was moved away stays in the index (%s), READY, saying why: %s"
              % (req_body, rows))
    names = [e["name"] for e in json.loads(body)]
    check(names == sorted(names), "the index stays in name order: %s" % names)
    st, _, body = d.req("POST", "/v2/models/gone_mlp/infer", infer_body(one))
    check(st == 200 and len(json.loads(body)["outputs"][0]["data"]) == 10, "and it still answers: %s" % body[:200])
    st, _, body = d.req("POST", "/v2/repository/models/gone_mlp/unload")
    check(st == 200, "it unloads: %s" % body)
    st, _, body = d.req("POST", "/v2/models/gone_mlp/infer", infer_body(one))
    check(st == 404, "once unloaded it no longer answers: %d %s" % (st, body[:200]))
    st, _, body = d.req("POST", "/v2/repository/models/gone_mlp/load")
    check(st == 404 and "no model 'gone_mlp' in the repository" in json.loads(body).get("error", ""),
          "a load after that is a 404 naming the model: %d %s" % (st, body[:200]))
    st, _, body = d.req("POST", "/v2/repository/index")
    check(not any(e["name"] == "gone_mlp" for e in json.loads(body)), "and the index no longer lists it: %s" % body)
    # one version's folder deleted while it serves: listed beside the versions still in the folder
    two = os.path.join(models, "gone_v")
    shutil.copytree(os.path.join(FIX, "mnist_mlp", "1"), os.path.join(two, "1"))
    shutil.copytree(os.path.join(FIX, "mnist_mlp", "1"), os.path.join(two, "2"))
    st, _, body = d.req("POST", "/v2/repository/models/gone_v/load")
    check(st == 200, "gone_v loads version 2: %s" % body)
    shutil.rmtree(os.path.join(two, "2"))
    st, _, body = d.req("POST", "/v2/repository/index")
    rows = [(e["version"], e["state"], "folder is gone" in e["reason"]) for e in json.loads(body)
            if e["name"] == "gone_v"]
    check(rows == [("1", "UNAVAILABLE", False), ("2", "READY", True)],
          "a served version whose folder was deleted is listed READY after the one left: %s" % rows)
    st, _, body = d.req("POST", "/v2/repository/models/gone_v/load")
    st2, _, body2 = d.req("GET", "/v2/models/gone_v")
    check(st == 200 and json.loads(body2).get("versions") == ["1"],
          "a load then serves the version left: %s %s" % (body, body2))


def kilnd_version():
    out = subprocess.run([KILND, "--version"], capture_output=True, text=True).stdout.split()
    return out[-1] if out else ""


def test_warmed_autotune():
    # A model ships autotune.tsv beside model.kiln: its kernel choices are merged into the
    # data directory's cache when the model loads; a corrupt one is ignored with a log line.
    entry = "%s\tcpu/shipped/1t\tfused-block n2^30 i4 r1 g0 cached\t2048\n" % kilnd_version()

    def warmed(data):
        with open(os.path.join(data, "models", "mnist_mlp", "1", "autotune.tsv"), "w") as f:
            f.write("kiln-autotune 1\n" + entry)

    d = Daemon("autotune", setup=warmed)
    try:
        st, _, _ = d.req("GET", "/v2/models/mnist_mlp/ready")
        check(st == 200, "a model with a warmed autotune file loads")
        cache = os.path.join(d.data, "autotune.tsv")
        text = open(cache).read() if os.path.exists(cache) else ""
        check(entry in text, "the shipped kernel choice is in the data directory's cache: %r" % text)
    finally:
        d.stop()

    def corrupt(data):
        with open(os.path.join(data, "models", "mnist_mlp", "1", "autotune.tsv"), "w") as f:
            f.write("kiln-autotune 1\nnot four fields\n")

    d = Daemon("autotune-corrupt", setup=corrupt)
    try:
        st, _, _ = d.req("GET", "/v2/models/mnist_mlp/ready")
        check(st == 200, "a model with a corrupt autotune file still loads")
    finally:
        d.stop()
    log = open(d.log).read()
    check(re.search(r" warn  model mnist_mlp version 1: .*autotune.*corrupt", log),
          "the corrupt autotune file is logged as a warning naming the model: %r" % log[-1000:])

    # libkiln's own warnings (entries of another kiln version dropped from the shipped file, the
    # data directory's cache ignored as corrupt) are lines of kilnd's log in its format: they
    # were bare text lines on stderr, breaking a JSON log
    def stale(data):
        with open(os.path.join(data, "models", "mnist_mlp", "1", "autotune.tsv"), "w") as f:
            f.write("kiln-autotune 1\n0.0.9\tcpu/shipped/1t\tfused-block n2^30 i4 r1 g0 cached\t2048\n")
        with open(os.path.join(data, "autotune.tsv"), "w") as f:
            f.write("garbage\n")

    d = Daemon("autotune-json", "--log-format", "json", setup=stale)
    try:
        st, _, _ = d.req("GET", "/v2/models/mnist_mlp/ready")
        check(st == 200, "a model with another version's autotune file loads")
    finally:
        d.stop()
    lines = [l for l in open(d.log, "rb").read().decode().splitlines() if l]
    parsed = []
    for l in lines:
        try:
            parsed.append(json.loads(l))
        except ValueError:
            check(False, "every log line is JSON: %r" % l)
    warned = [p["msg"] for p in parsed if p.get("level") == "warn" and "autotune" in p.get("msg", "")]
    check(any("from another kiln version dropped" in m for m in warned) and
          any("ignored (corrupt at line 1" in m for m in warned),
          "libkiln's autotune warnings are warn lines of the JSON log: %s" % warned)


def test_idle_trim():
    # With limits.pool_idle_trim_ms short, the cpu worker hands the buffers a request freed back to
    # the system once the device is idle: /metrics counts the trim, and the pool's cached bytes
    # (which held the request's buffers when it was answered) are 0. Polled with a generous
    # deadline; how soon the trim comes is not checked.
    d = Daemon("idle-trim", "--log-level", "debug", env={"KILN_POOL_IDLE_TRIM_MS": "100"})
    values = {}
    try:
        st, _, body = d.req("POST", "/v2/models/mnist_mlp/infer", infer_body(EXPECTED["input"]))
        check(st == 200, "idle trim: inference answers: %s" % body[:200])
        deadline = time.time() + 60
        while time.time() < deadline:
            _, _, text = d.req("GET", "/metrics")
            values = {k: float(v) for k, _, v in (line.rpartition(" ") for line in text.decode().splitlines())
                      if k.startswith("kiln_device_")}
            if (values.get('kiln_device_pool_trims_total{device="cpu"}', 0) >= 1 and
                    values.get('kiln_device_memory_bytes{device="cpu",state="cached"}') == 0):
                break
            time.sleep(0.05)
    finally:
        d.stop()
    check(values.get('kiln_device_pool_trims_total{device="cpu"}', 0) >= 1 and
          values.get('kiln_device_pool_released_bytes_total{device="cpu"}', 0) > 0 and
          values.get('kiln_device_memory_bytes{device="cpu",state="cached"}') == 0,
          "the idle cpu pool was trimmed: %s" % values)
    log = open(d.log).read()
    check(re.search(r" debug device cpu: idle for 100 ms; [1-9][0-9]* bytes of cached buffers released", log),
          "the trim is logged at level debug: %r" % log[-1000:])


def test_queue_full():
    # A long batching delay keeps the first request queued, so the next finds the queue full.
    d = Daemon("queue", env={"KILN_MAX_QUEUE_DEPTH": "1"})
    cfg = os.path.join(d.data, "models", "mnist_mlp", "1", "config.json")
    c = json.load(open(cfg))
    c["dynamic_batching"] = {"max_queue_delay_us": 400000}
    json.dump(c, open(cfg, "w"))
    check(d.req("POST", "/v2/repository/models/mnist_mlp/load")[0] == 200, "reload with a long queue delay")
    body = json.dumps(infer_body([[0.5] * 784]))
    statuses = []

    def one():
        st, h, _ = d.req("POST", "/v2/models/mnist_mlp/infer", body)
        statuses.append((st, h.get("retry-after")))
    ts = [threading.Thread(target=one) for _ in range(24)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    check(any(s == 503 and ra for s, ra in statuses), "a full queue answers 503 with Retry-After")
    check(all(s in (200, 503) for s, _ in statuses), "queue full: only 200 or 503 (%s)" % statuses)
    # overload is told apart from bad requests: a full queue is "overloaded", never "rejected"
    _, _, text = d.req("GET", "/metrics")
    counts = {}
    for line in text.decode().splitlines():
        if line.startswith('kiln_inference_requests_total{model="mnist_mlp",version="1",outcome="'):
            counts[line.split('outcome="')[1].split('"')[0]] = float(line.split()[-1])
    full = sum(1 for s, _ in statuses if s == 503)
    check(counts.get("overloaded") == full and counts.get("rejected", 0) == 0,
          "%d queue-full answers counted as outcome=\"overloaded\", none as rejected: %s" % (full, counts))
    # the statistics extension counts them as failed requests, as Triton's "fail" counts every
    # failed request (they were missing, and a full queue showed a 100% success rate)
    _, _, body = d.req("GET", "/v2/models/mnist_mlp/stats")
    inf = json.loads(body)["model_stats"][0]["inference_stats"]
    ok = sum(1 for s, _ in statuses if s == 200)
    check(inf["fail"]["count"] == full and inf["success"]["count"] == ok and inf["queue"]["count"] == ok and
          inf["compute_infer"]["count"] == ok, "stats: %d failed, %d succeeded: %s" % (full, ok, inf))
    d.stop()


def test_auth():
    p = subprocess.run([KILND, "--port", "0", "--host", "0.0.0.0", "--data-dir", os.path.join(TMP, "noauth")],
                       capture_output=True, text=True, env=ENV, timeout=20)
    check(p.returncode != 0 and "api_tokens" in p.stderr, "binding beyond loopback without tokens is refused")
    d = Daemon("auth", env={"KILN_API_TOKENS": "admin:adm1n,read:r3ad"}, token="r3ad")
    st, h, _ = d.req("GET", "/v2/models/mnist_mlp")
    check(st == 401 and "www-authenticate" in h, "no token is 401")
    st, _, _ = d.req("GET", "/v2/models/mnist_mlp", headers={"Authorization": "Bearer wrong"})
    check(st == 401, "a wrong token is 401")
    st, _, _ = d.req("POST", "/v2/models/mnist_mlp/infer", infer_body([[0.0] * 784]),
                     headers={"Authorization": "Bearer r3ad"})
    check(st == 200, "read token may infer")
    st, _, _ = d.req("POST", "/v2/repository/models/mnist_mlp/unload", headers={"Authorization": "Bearer r3ad"})
    check(st == 403, "read token may not unload")
    st, _, body = d.req("POST", "/v2/repository/models/mnist_mlp/load", headers={"Authorization": "Bearer adm1n"})
    check(st == 200, "admin token may load (got %s %r)" % (st, body[:300]))
    st, _, _ = d.req("GET", "/v2/health/ready")
    check(st == 200, "health probes need no token")
    d.stop()


def test_drain():
    d = Daemon("drain", env={"KILN_DRAIN_TIMEOUT_MS": "5000"})
    body = json.dumps(infer_body([[0.25] * 784] * 64))
    out = []

    def one():
        try:
            st, _, _ = d.req("POST", "/v2/models/mnist_mlp/infer", body)
            out.append(st)
        except Exception as ex:  # noqa: BLE001
            out.append(repr(ex))
    ts = [threading.Thread(target=one) for _ in range(8)]
    for t in ts:
        t.start()
    time.sleep(0.05)
    d.proc.send_signal(signal.SIGTERM)
    for t in ts:
        t.join()
    try:
        rc = d.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        d.proc.kill()
        rc = -9
    check(rc == 0, "kilnd exits 0 after a drain with requests in flight (rc %s)" % rc)
    check(all(s == 200 or "Connection" in str(s) for s in out) and 200 in out,
          "SIGTERM drain answers in-flight requests, never 503: %s" % out)


def test_drain_half_sent():
    """A request whose body was still arriving when SIGTERM came is accepted: it gets its answer."""
    d = Daemon("drain-half", env={"KILN_DRAIN_TIMEOUT_MS": "5000"})
    body = json.dumps(infer_body([[0.5] * 784])).encode()
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    s.sendall(b"POST /v2/models/mnist_mlp/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body[:len(body) // 2])
    time.sleep(0.1)
    d.proc.send_signal(signal.SIGTERM)
    # The listener closing is the sign the drain has begun.
    t0 = time.time()
    refused = False
    while time.time() - t0 < 5 and not refused:
        try:
            socket.create_connection(("127.0.0.1", d.port), timeout=1).close()
            time.sleep(0.02)
        except OSError:
            refused = True
    check(refused, "the listener closes at SIGTERM")
    s.sendall(body[len(body) // 2:])
    raw = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        raw += chunk
    s.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1 ") else 0
    check(status == 200 and b"connection: close" in head.lower(),
          "a request half-sent before SIGTERM is answered 200 with Connection: close: %s" % raw[:200])
    check(status == 200 and len(json.loads(payload)["outputs"][0]["data"]) == 10,
          "and its answer holds the 10 logits")
    try:
        rc = d.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        d.proc.kill()
        rc = -9
    check(rc == 0, "kilnd exits 0 once the half-sent request is answered (rc %s)" % rc)


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def read_all(s):
    raw = b""
    while True:
        chunk = s.recv(1 << 16)
        if not chunk:
            return raw
        raw += chunk


def test_connection_edges(d):
    """Pipelined requests whose answers are not read are parsed only as fast as their answers leave
    (kilnd held every answer of a write at once: 1000 requests of /metrics, 25 MB); a
    request followed by a half-close is answered; a refused Upgrade says Connection: close."""
    one = len(d.req("GET", "/metrics")[2])
    req = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n"
    n = 1000
    before = rss_kb(d.proc.pid)
    socks = []
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
        s.sendall(req * n)
        socks.append(s)
    time.sleep(1.5)
    grown = (rss_kb(d.proc.pid) - before) / 1024
    check(grown < 20, "2 connections of %d pipelined /metrics (%d KB each), none read: kilnd grew %.1f MB, not "
          "the %.0f MB of their answers" % (n, one // 1024, grown, 2 * n * one / 2 ** 20))
    check(d.req("GET", "/v2/health/live")[0] == 200, "another client is served meanwhile")
    s = socks.pop()
    s.shutdown(socket.SHUT_WR)
    raw = read_all(s)
    check(raw.count(b"HTTP/1.1 200 OK") == n, "read at last, every pipelined request is answered, in order: %d of %d"
          % (raw.count(b"HTTP/1.1 200 OK"), n))
    for s in socks:
        s.close()
    # a complete request, then shutdown(SHUT_WR): the answer still comes
    body = b"{}"
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    s.sendall(b"POST /v2/repository/models/mnist_mlp/load HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n" + body)
    s.shutdown(socket.SHUT_WR)
    raw = read_all(s)
    # answered, then closed (read_all returns at the close). Its Connection header may say either:
    # when the load ends before kilnd has read the half-close, it cannot know of it yet
    check(raw.startswith(b"HTTP/1.1 200") and raw.count(b"HTTP/1.1") == 1,
          "a load request then a half-close is answered 200, and the connection closed: %r" % raw[:160])
    body = json.dumps(infer_body(EXPECTED["input"][:1])).encode()
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    s.sendall(b"POST /v2/models/mnist_mlp/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)
              + body)
    s.shutdown(socket.SHUT_WR)
    raw = read_all(s)
    check(raw.startswith(b"HTTP/1.1 200") or (raw.startswith(b"HTTP/1.1 503") and
                                               b"the client closed its side of the connection" in raw),
          "an inference then a half-close gets an answer: its result, or why it was dropped: %r" % raw[:200])
    for upgrade in (b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n",
                    b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 12\r\n"
                    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"):
        s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
        s.sendall(b"GET /v1/tensor HTTP/1.1\r\nHost: t\r\n" + upgrade + b"\r\n")
        raw = read_all(s)
        head = raw.partition(b"\r\n\r\n")[0].lower()
        check(b"connection: close" in head and b"keep-alive" not in head,
              "a refused Upgrade's answer says the connection closes, as it does: %r" % raw[:200])
        s.close()


def main():
    d = Daemon("main")
    try:
        test_basic(d)
        test_batch_stats(d)
        test_binary(d)
        test_tritonclient(d)
        test_onnx(d)
        test_bad_input(d)
        test_bad_data(d)
        test_duplicate_keys(d)
        test_batching(d)
        test_repository(d)
        test_folder_gone(d)
        test_connection_edges(d)
    finally:
        d.stop()
    test_warmed_autotune()
    test_idle_trim()
    test_startup_readiness()
    test_queue_full()
    test_auth()
    test_drain()
    test_drain_half_sent()
    H.cleanup()
    if FAILURES:
        print("%d failure(s)" % len(FAILURES))
        return 1
    print("serving: all checks passed")
    return 0


sys.exit(main())
