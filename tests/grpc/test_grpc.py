#!/usr/bin/env python3
"""The gRPC service (grpc_port) against a real kilnd: tritonclient.grpc, unmodified, calls every
method kilnd implements and its answers are compared with the HTTP endpoints' for the same
inputs; every datatype kilnd serves goes through ModelInfer (raw and typed contents); errors
(unknown model, bad and missing tokens, a read token loading, an oversized message, a deadline)
carry the right status; ModelStreamInfer keeps 64 requests in flight and answers them in order;
and hostile HTTP/2 (a stream that never ends, a SETTINGS flood, a header block over the limit,
a length prefix past the body, too many streams) leaves the daemon serving.

Usage: test_grpc.py KILND FIXTURES   (FIXTURES is tests/fixtures)

Runs under KILN_TEST_PYTHON, the environment with tritonclient[grpc], hpack and numpy; without
them the test is skipped (exit 77) and says so.
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
import tempfile
import threading
import time
import zlib

KILND, FIX = sys.argv[1], sys.argv[2]

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from test_python import rerun_under_test_python  # noqa: E402

rerun_under_test_python(["tritonclient.grpc", "numpy", "hpack"], "tritonclient[grpc], hpack or numpy")

import grpc  # noqa: E402
import hpack  # noqa: E402
import numpy as np  # noqa: E402
import tritonclient.grpc as tg  # noqa: E402
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

FAILURES = []
ADMIN, READ = "adm1n-secret", "r3ad-secret"
LONG = "l0ng-" + "t0ken" * 140  # 705 bytes: kept whole within max_header_bytes, as over HTTP
AUTH = {"authorization": "Bearer " + ADMIN}
TMP = tempfile.mkdtemp(prefix="kilnd-grpc-")
EXPECTED = json.load(open(os.path.join(FIX, "serving", "expected.json")))
X = np.array(EXPECTED["input"], dtype=np.float32)
WANT = np.array(EXPECTED["logits"], dtype=np.float32)
MAX_BODY = 262144
# name, numpy type, KServe datatype (tests/fixtures/grpc/dtypes.onnx: x + x, Not(x) for BOOL)
TYPES = [("f32", np.float32, "FP32"), ("f64", np.float64, "FP64"), ("f16", np.float16, "FP16"),
         ("i64", np.int64, "INT64"), ("i32", np.int32, "INT32"), ("u8", np.uint8, "UINT8"), ("b", np.bool_, "BOOL")]


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)
    else:
        print("ok:", what, flush=True)


def fails_with(fn, code, text, what):
    """fn() must raise InferenceServerException with gRPC status code and text in its message."""
    try:
        fn()
    except InferenceServerException as e:
        ok = e.status() == "StatusCode." + code and text in (e.message() or "")
        check(ok, "%s: expected %s '%s', got %s %r" % (what, code, text, e.status(), e.message()))
        return
    check(False, "%s: expected %s, got success" % (what, code))


class Daemon:
    def __init__(self, name="data", extra=()):
        self.data = os.path.join(TMP, name)
        models = os.path.join(self.data, "models")
        os.makedirs(os.path.join(models, "dtypes", "1"))
        shutil.copytree(os.path.join(FIX, "serving", "mnist_mlp"), os.path.join(models, "mnist_mlp"))
        shutil.copy(os.path.join(FIX, "grpc", "dtypes.onnx"), os.path.join(models, "dtypes", "1", "model.onnx"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
        env["KILN_API_TOKENS"] = "admin:%s,read:%s,admin:%s" % (ADMIN, READ, LONG)
        self.log = os.path.join(TMP, name + ".log")
        self.proc = subprocess.Popen([KILND, "--port", "0", "--grpc-port", "0", "--data-dir", self.data,
                                      "--max-body-bytes", str(MAX_BODY)] + list(extra),
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"), env=env)
        ports = [os.path.join(self.data, f) for f in ("kilnd.port", "kilnd.grpc_port")]
        deadline = time.time() + 20
        while not all(os.path.exists(p) for p in ports):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("kilnd did not start: " + open(self.log).read())
            time.sleep(0.01)
        self.port = int(open(ports[0]).read())
        self.grpc_port = int(open(ports[1]).read())
        self.target = "127.0.0.1:%d" % self.grpc_port

    def http(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request(method, path, body=None if body is None else json.dumps(body),
                  headers={"Authorization": "Bearer " + ADMIN, "Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        c.close()
        return r.status, json.loads(raw) if raw[:1] in (b"{", b"[") else raw

    def metric(self, name):
        # a connection closed just before (a test at the connection limit) may not have been
        # counted out yet, and the daemon then answers 503 past its limit: asked again
        deadline = time.time() + 5
        status, text = self.http("GET", "/metrics")
        while status == 503 and time.time() < deadline:
            time.sleep(0.1)
            status, text = self.http("GET", "/metrics")
        if status != 200:
            raise AssertionError("GET /metrics: %d %r" % (status, text))
        for line in text.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = -9
        check(rc == 0, "kilnd exits 0 after SIGTERM (rc %s)" % rc)


def wait_ready(c, name):
    deadline = time.time() + 20
    while time.time() < deadline:
        if c.is_model_ready(name, headers=AUTH):
            return True
        time.sleep(0.02)
    return False


def dtype_inputs(rows=2):
    xs = {}
    for n, t, _ in TYPES:
        k = np.arange(rows * 3).reshape(rows, 3)
        xs[n] = (k % 2 == 0) if t == np.bool_ else (k % 100).astype(t)
    return xs


def grpc_inputs(xs):
    ins = []
    for n, _, dt in TYPES:
        i = tg.InferInput("in_" + n, list(xs[n].shape), dt)
        i.set_data_from_numpy(xs[n])
        ins.append(i)
    return ins


def http_infer(d, model, inputs):
    """inputs: [(name, datatype, array)] -> {output name: array} from HTTP's JSON answer."""
    body = {"inputs": [{"name": n, "datatype": dt, "shape": list(a.shape), "data": a.flatten().tolist()}
                       for n, dt, a in inputs]}
    st, r = d.http("POST", "/v2/models/%s/infer" % model, body)
    if st != 200:
        return {"error": r}
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r["outputs"]}


# ---- the methods, compared with HTTP ----------------------------------------------------------------

def test_health_and_metadata(d, c):
    check(c.is_server_live() is True, "ServerLive")
    check(c.is_server_ready() is True, "ServerReady")
    check(c.is_model_ready("mnist_mlp", headers=AUTH) is True, "ModelReady")
    check(c.is_model_ready("mnist_mlp", "1", headers=AUTH) is True, "ModelReady, version 1")
    check(c.is_model_ready("mnist_mlp", "7", headers=AUTH) is False, "ModelReady, a version that does not exist")
    check(c.is_model_ready("nosuch", headers=AUTH) is False, "ModelReady, a model that does not exist")
    meta = c.get_server_metadata(headers=AUTH, as_json=True)
    _, hmeta = d.http("GET", "/v2")
    check(meta["name"] == hmeta["name"] == "kiln" and meta["version"] == hmeta["version"] and
          meta["extensions"] == hmeta["extensions"], "ServerMetadata equals GET /v2: %s / %s" % (meta, hmeta))
    for model in ("mnist_mlp", "dtypes"):
        m = c.get_model_metadata(model, headers=AUTH, as_json=True)
        _, hm = d.http("GET", "/v2/models/" + model)
        for k in ("inputs", "outputs"):
            for t in m[k]:
                t["shape"] = [int(x) for x in t["shape"]]
        check(m["name"] == hm["name"] and m["versions"] == hm["versions"] and m["platform"] == hm["platform"] and
              m["inputs"] == hm["inputs"] and m["outputs"] == hm["outputs"],
              "ModelMetadata of %s equals HTTP's: %s / %s" % (model, m, hm))
    fails_with(lambda: c.get_model_metadata("nosuch", headers=AUTH), "NOT_FOUND", "unknown model 'nosuch'",
               "ModelMetadata of an unknown model")
    fails_with(lambda: c.get_model_metadata("mnist_mlp", "9", headers=AUTH), "NOT_FOUND", "no loaded version 9",
               "ModelMetadata of a version that is not loaded")
    # versions as the HTTP paths take them: no leading zeros, nothing past int64
    for bad in ("01", "99999999999999999999999", "1x"):
        fails_with(lambda: c.get_model_metadata("mnist_mlp", bad, headers=AUTH), "INVALID_ARGUMENT",
                   "invalid model version '%s'" % bad, "ModelMetadata of version %r" % bad)
        fails_with(lambda: c.is_model_ready("mnist_mlp", bad, headers=AUTH), "INVALID_ARGUMENT",
                   "invalid model version '%s'" % bad, "ModelReady of version %r" % bad)


def test_model_config(d, c):
    for model in ("mnist_mlp", "dtypes"):
        g = c.get_model_config(model, headers=AUTH, as_json=True)["config"]
        _, h = d.http("GET", "/v2/models/%s/config" % model)
        tensors = lambda ts: [(t["name"], t["data_type"], [int(x) for x in t.get("dims", [])]) for t in ts]
        same = (g["name"] == h["name"] and g["platform"] == h["platform"] and g["backend"] == h["backend"] and
                int(g.get("max_batch_size", 0)) == h["max_batch_size"] and
                tensors(g["input"]) == tensors(h["input"]) and tensors(g["output"]) == tensors(h["output"]) and
                g["default_model_filename"] == h["default_model_filename"] and
                g["instance_group"][0]["kind"] == h["instance_group"][0]["kind"] and
                g["instance_group"][0]["count"] == h["instance_group"][0]["count"])
        if "dynamic_batching" in h:
            gd, hd = g.get("dynamic_batching", {}), h["dynamic_batching"]
            same = same and gd.get("preferred_batch_size") == hd["preferred_batch_size"] and \
                int(gd.get("max_queue_delay_microseconds", 0)) == hd["max_queue_delay_microseconds"]
        else:
            same = same and "dynamic_batching" not in g
        hl = h["version_policy"].get("latest")
        same = same and (hl is None or g["version_policy"]["latest"]["num_versions"] == hl["num_versions"])
        check(same, "ModelConfig of %s equals HTTP's: %s / %s" % (model, g, h))


def test_infer(d, c):
    i = tg.InferInput("input", list(X.shape), "FP32")
    i.set_data_from_numpy(X)
    r = c.infer("mnist_mlp", [i], request_id="req-7", headers=AUTH)
    got = r.as_numpy("logits")
    http_out = http_infer(d, "mnist_mlp", [("input", "FP32", X)])
    check(got is not None and got.shape == WANT.shape and np.allclose(got, WANT, atol=1e-4) and
          np.array_equal(got, http_out["logits"].astype(np.float32)),
          "ModelInfer on mnist_mlp: the reference logits, and exactly HTTP's")
    check(r.get_response().id == "req-7" and r.get_response().model_version == "1", "ModelInfer echoes the id")
    # tritonclient's class_count (the classification extension): BYTES "<value>:<index>", the
    # top three of each row in the reference's order, the same strings HTTP answers
    r = c.infer("mnist_mlp", [i], outputs=[tg.InferRequestedOutput("logits", class_count=3)], headers=AUTH)
    got = r.as_numpy("logits")
    out = r.get_output("logits")
    top = np.argsort(-WANT, axis=1, kind="stable")[:, :3]
    st, hr = d.http("POST", "/v2/models/mnist_mlp/infer",
                    {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(X.shape),
                                 "data": X.flatten().tolist()}],
                     "outputs": [{"name": "logits", "parameters": {"classification": 3}}]})
    check(got is not None and out.datatype == "BYTES" and list(out.shape) == [len(X), 3] and
          [[int(s.split(b":")[1]) for s in row] for row in got] == top.tolist() and
          all(abs(float(s.split(b":")[0]) - WANT[k][int(s.split(b":")[1])]) < 1e-4 for k, row in enumerate(got)
              for s in row) and
          st == 200 and [s.decode() for s in got.flatten()] == hr["outputs"][0]["data"],
          "ModelInfer with class_count=3: the top three per row, as HTTP answers them: %s" % got)

    xs = dtype_inputs()
    r = c.infer("dtypes", grpc_inputs(xs), headers=AUTH)
    hout = http_infer(d, "dtypes", [("in_" + n, dt, xs[n]) for n, _, dt in TYPES])
    for n, t, dt in TYPES:
        got = r.as_numpy("out_" + n)
        want = np.logical_not(xs[n]) if t == np.bool_ else (xs[n] + xs[n]).astype(t)
        check(got is not None and got.dtype == np.dtype(t) and np.array_equal(got, want) and
              np.array_equal(got, hout["out_" + n].astype(t)),
              "ModelInfer %s: the right values and datatype, equal to HTTP's (%s)" % (dt, got))

    # A large answer (about 250 KB, past the client's flow-control window, sent in many DATA frames
    # straight from the answer's buffer): every value right.
    big = dtype_inputs(rows=3000)
    r = c.infer("dtypes", grpc_inputs(big), headers=AUTH)
    check(all(np.array_equal(r.as_numpy("out_" + n), np.logical_not(big[n]) if t == np.bool_ else
                             (big[n] + big[n]).astype(t)) for n, t, _ in TYPES),
          "ModelInfer with a 250 KB answer: every value right")

    # Compressed requests (gRPC message compression, grpc-encoding): inflated within the limit.
    for algo in ("gzip", "deflate"):
        i = tg.InferInput("input", list(X.shape), "FP32")
        i.set_data_from_numpy(X)
        r = c.infer("mnist_mlp", [i], headers=AUTH, compression_algorithm=algo)
        check(np.allclose(r.as_numpy("logits"), WANT, atol=1e-4), "ModelInfer with %s request compression" % algo)

    # Requested outputs: only the ones named come back.
    r = c.infer("dtypes", grpc_inputs(xs), outputs=[tg.InferRequestedOutput("out_i64")], headers=AUTH)
    names = [o.name for o in r.get_response().outputs]
    check(names == ["out_i64"] and np.array_equal(r.as_numpy("out_i64"), xs["i64"] * 2),
          "ModelInfer with a requested output returns that one only: %s" % names)

    # Typed contents (what tritonclient does not send): through the generated stub.
    with grpc.insecure_channel(d.target) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        q = service_pb2.ModelInferRequest(model_name="dtypes", id="typed")
        fields = {"f32": "fp32_contents", "f64": "fp64_contents", "i64": "int64_contents", "i32": "int_contents",
                  "u8": "uint_contents", "b": "bool_contents"}
        for n, t, dt in TYPES:
            tin = q.inputs.add(name="in_" + n, datatype=dt, shape=[2, 3])
            if n in fields:
                getattr(tin.contents, fields[n]).extend(xs[n].flatten().tolist())
        try:
            stub.ModelInfer(q, metadata=[("authorization", "Bearer " + ADMIN)])
            check(False, "typed contents without FP16's: refused (FP16 has no typed field)")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "in_f16" in e.details(),
                  "FP16 in typed contents is refused, naming the input: %s" % e.details())
        q2 = service_pb2.ModelInferRequest(model_name="mnist_mlp", id="typed")
        tin = q2.inputs.add(name="input", datatype="FP32", shape=list(X.shape))
        tin.contents.fp32_contents.extend(X.flatten().tolist())
        res = stub.ModelInfer(q2, metadata=[("authorization", "Bearer " + ADMIN)])
        got = np.frombuffer(res.raw_output_contents[0], dtype=np.float32).reshape(WANT.shape)
        check(res.id == "typed" and np.allclose(got, WANT, atol=1e-4), "ModelInfer with typed FP32 contents")
        # contents in another datatype's field, alone or beside the right one: refused naming both
        for extra in (False, True):
            q4 = service_pb2.ModelInferRequest(model_name="mnist_mlp")
            tin = q4.inputs.add(name="input", datatype="FP32", shape=list(X.shape))
            if extra:
                tin.contents.fp32_contents.extend(X.flatten().tolist())
            tin.contents.int64_contents.extend([1] * X.size)
            try:
                stub.ModelInfer(q4, metadata=[("authorization", "Bearer " + ADMIN)])
                check(False, "FP32 input with int64_contents (beside fp32: %s): refused" % extra)
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "int64_contents" in e.details()
                      and "fp32_contents" in e.details(),
                      "contents in the wrong field are refused naming it: %s" % e.details())
        # an id longer than limits.max_string_bytes (128 by default), as HTTP refuses it
        q5 = service_pb2.ModelInferRequest(model_name="mnist_mlp", id="i" * 200)
        tin = q5.inputs.add(name="input", datatype="FP32", shape=list(X.shape))
        tin.contents.fp32_contents.extend(X.flatten().tolist())
        rejected = d.metric('kiln_inference_requests_total{model="mnist_mlp",version="1",outcome="rejected"}') or 0
        try:
            stub.ModelInfer(q5, metadata=[("authorization", "Bearer " + ADMIN)])
            check(False, "a 200-byte id: refused")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 128 bytes" in e.details(),
                  "a 200-byte id is refused: %s" % e.details())
        after = d.metric('kiln_inference_requests_total{model="mnist_mlp",version="1",outcome="rejected"}')
        check(after == rejected + 1, "the refused id is counted as rejected, as over HTTP: %s -> %s" % (rejected, after))
        # a stream's error answers carry their request's id, as its results do
        reqs = []
        for rid, model, shape in (("s1", "mnist_mlp", list(X.shape)), ("s2", "nosuch", list(X.shape)),
                                  ("s3", "mnist_mlp", [1, 5])):
            qs = service_pb2.ModelInferRequest(model_name=model, id=rid)
            tin = qs.inputs.add(name="input", datatype="FP32", shape=shape)
            tin.contents.fp32_contents.extend([0.5] * int(np.prod(shape)))
            reqs.append(qs)
        answers = list(stub.ModelStreamInfer(iter(reqs), metadata=[("authorization", "Bearer " + ADMIN)]))
        got = [(a.infer_response.id, bool(a.error_message)) for a in answers]
        check(got == [("s1", False), ("s2", True), ("s3", True)],
              "ModelStreamInfer errors carry their ids: %s" % got)
        q3 = service_pb2.ModelInferRequest(model_name="dtypes")
        for n, t, dt in TYPES:
            tin = q3.inputs.add(name="in_" + n, datatype=dt, shape=[2, 3])
            q3.raw_input_contents.append(xs[n].tobytes()[:-1] if n == "i32" else xs[n].tobytes())
        try:
            stub.ModelInfer(q3, metadata=[("authorization", "Bearer " + ADMIN)])
            check(False, "raw contents one byte short: refused")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "in_i32" in e.details(),
                  "raw contents one byte short are refused, naming the input: %s" % e.details())


def test_infer_errors(d, c):
    i = tg.InferInput("input", list(X.shape), "FP32")
    i.set_data_from_numpy(X)
    fails_with(lambda: c.infer("nosuch", [i], headers=AUTH), "NOT_FOUND", "unknown model 'nosuch'", "unknown model")
    bad = tg.InferInput("input", list(X.shape), "INT64")
    bad.set_data_from_numpy(X.astype(np.int64))
    fails_with(lambda: c.infer("mnist_mlp", [bad], headers=AUTH), "INVALID_ARGUMENT", "the model expects FP32",
               "wrong datatype")
    wrong = tg.InferInput("nope", list(X.shape), "FP32")
    wrong.set_data_from_numpy(X)
    fails_with(lambda: c.infer("mnist_mlp", [wrong], headers=AUTH), "INVALID_ARGUMENT",
               "the model has no input 'nope' (its inputs: input)", "unknown input")
    twice = tg.InferInput("input", list(X.shape), "FP32")
    twice.set_data_from_numpy(X)
    fails_with(lambda: c.infer("mnist_mlp", [i, twice], headers=AUTH), "INVALID_ARGUMENT",
               "input 'input' is given twice", "an input given twice")
    fails_with(lambda: c.infer("dtypes", grpc_inputs(dtype_inputs())[1:], headers=AUTH), "INVALID_ARGUMENT",
               "is missing: the model takes", "a missing input is named")
    # class_count on an output that holds no numbers to rank
    fails_with(lambda: c.infer("dtypes", grpc_inputs(dtype_inputs()), outputs=[tg.InferRequestedOutput("out_b", class_count=2)],
                               headers=AUTH), "INVALID_ARGUMENT", "output 'out_b' is BOOL: classification ranks numbers",
               "classification of a BOOL output")
    # Over the body limit: refused from the length prefix, before the message is kept.
    xs = dtype_inputs(rows=30000)
    fails_with(lambda: c.infer("dtypes", grpc_inputs(xs), headers=AUTH), "RESOURCE_EXHAUSTED",
               "larger than limits.max_body_bytes", "an oversized message")
    # Auth: no token, a wrong one, a read token loading.
    fails_with(lambda: c.infer("mnist_mlp", [i]), "UNAUTHENTICATED", "authorization", "no token")
    fails_with(lambda: c.infer("mnist_mlp", [i], headers={"authorization": "Bearer wrong"}), "UNAUTHENTICATED",
               "invalid bearer token", "a wrong token")
    fails_with(lambda: c.get_model_metadata("mnist_mlp", headers={"authorization": "Basic " + ADMIN}),
               "UNAUTHENTICATED", "invalid bearer token", "another scheme")
    read = {"authorization": "Bearer " + READ}
    check(c.get_model_metadata("mnist_mlp", headers=read, as_json=True)["name"] == "mnist_mlp",
          "a read token reads metadata")
    fails_with(lambda: c.load_model("mnist_mlp", headers=read), "PERMISSION_DENIED", "admin scope",
               "a read token may not load")
    fails_with(lambda: c.unload_model("mnist_mlp", headers=read), "PERMISSION_DENIED", "admin scope",
               "a read token may not unload")
    # A token of 705 bytes is kept whole, as HTTP keeps it (a fixed array had cut it to nothing).
    long_auth = {"authorization": "Bearer " + LONG}
    check(c.get_model_metadata("mnist_mlp", headers=long_auth, as_json=True)["name"] == "mnist_mlp",
          "a long token authorizes over gRPC")
    # A deadline the client gives up on. (One that has passed: a microsecond's is a race, now that
    # the batcher sends a batch early for its deadline instead of holding it for max_queue_delay_us;
    # kilnd's own answer to an expired deadline is test_raw's grpc-timeout 1n.)
    fails_with(lambda: c.infer("mnist_mlp", [i], headers=AUTH, client_timeout=-1), "DEADLINE_EXCEEDED", "",
               "a deadline that expires")
    check(c.is_server_live(), "the daemon serves after the errors")


def test_stats_and_repository(d, c):
    g = c.get_inference_statistics("mnist_mlp", headers=AUTH, as_json=True)["model_stats"]
    _, h = d.http("GET", "/v2/models/mnist_mlp/stats")
    h = h["model_stats"]
    check(len(g) == len(h) == 1 and g[0]["name"] == h[0]["name"] and g[0]["version"] == h[0]["version"] and
          int(g[0]["inference_count"]) == h[0]["inference_count"] > 0 and
          int(g[0]["execution_count"]) == h[0]["execution_count"] and
          int(g[0]["inference_stats"]["success"]["count"]) == h[0]["inference_stats"]["success"]["count"],
          "ModelStatistics equals HTTP's: %s / %s" % (g, h))
    gb = [(int(b["batch_size"]), int(b["compute_infer"]["count"]), int(b["compute_infer"].get("ns", 0)))
          for b in g[0].get("batch_stats", [])]
    hb = [(b["batch_size"], b["compute_infer"]["count"], b["compute_infer"]["ns"]) for b in h[0]["batch_stats"]]
    check(gb == hb and hb and sum(size * n for size, n, _ in hb) == h[0]["inference_count"],
          "batch_stats by exact batch size, the same over gRPC as over HTTP, adding up to inference_count: "
          "%s / %s" % (gb, hb))
    every = c.get_inference_statistics(headers=AUTH, as_json=True)["model_stats"]
    check(sorted(s["name"] for s in every) == ["dtypes", "mnist_mlp"], "ModelStatistics of every model")
    fails_with(lambda: c.get_inference_statistics("nosuch", headers=AUTH), "NOT_FOUND", "unknown model",
               "statistics of an unknown model")

    idx = c.get_model_repository_index(headers=AUTH, as_json=True)["models"]
    _, hidx = d.http("POST", "/v2/repository/index", {})
    key = lambda rows: sorted((r["name"], r.get("version", ""), r["state"]) for r in rows)
    check(key(idx) == key(hidx) and len(idx) == 2, "RepositoryIndex equals HTTP's: %s" % idx)

    c.unload_model("dtypes", headers=AUTH)
    check(c.is_model_ready("dtypes", headers=AUTH) is False, "RepositoryModelUnload: not ready after")
    idx = c.get_model_repository_index(headers=AUTH, as_json=True)["models"]
    check([r["state"] for r in idx if r["name"] == "dtypes"] == ["UNAVAILABLE"], "the index shows it unloaded")
    fails_with(lambda: c.unload_model("dtypes", headers=AUTH), "NOT_FOUND", "is not loaded", "unloading it again")
    c.load_model("dtypes", headers=AUTH)
    check(c.is_model_ready("dtypes", headers=AUTH) is True, "RepositoryModelLoad: ready when it answers")
    fails_with(lambda: c.load_model("nosuch", headers=AUTH), "NOT_FOUND", "no model 'nosuch'", "loading an unknown model")
    fails_with(lambda: c.load_model("dtypes", headers=AUTH, config="{}"), "UNIMPLEMENTED", "configuration",
               "loading with a configuration")


def test_stream(d, c):
    results = []
    done = threading.Event()

    def cb(result, error):
        results.append((result, error))
        if len(results) == 66:
            done.set()

    c.start_stream(callback=cb, headers=AUTH)
    i = tg.InferInput("input", list(X.shape), "FP32")
    i.set_data_from_numpy(X)
    for k in range(66):
        if k == 40:
            c.async_stream_infer("nosuch", [i], request_id="r40")
        elif k == 41:
            bad = tg.InferInput("input", [1, 5], "FP32")
            bad.set_data_from_numpy(np.zeros((1, 5), np.float32))
            c.async_stream_infer("mnist_mlp", [bad], request_id="r41")
        else:
            c.async_stream_infer("mnist_mlp", [i], request_id="r%d" % k)
    done.wait(30)
    c.stop_stream()
    check(len(results) == 66, "ModelStreamInfer: 66 answers for 66 requests (%d)" % len(results))
    ids = [r.get_response().id if r else None for r, e in results]
    ok_ids = ["r%d" % k for k in range(66) if k not in (40, 41)]
    check([x for x in ids if x] == ok_ids, "ModelStreamInfer answers in request order with their ids")
    check(all(np.allclose(r.as_numpy("logits"), WANT, atol=1e-4) for r, e in results if r),
          "ModelStreamInfer results equal the reference")
    errs = [(k, str(e)) for k, (r, e) in enumerate(results) if e]
    check(len(errs) == 2 and errs[0][0] == 40 and "unknown model" in errs[0][1] and errs[1][0] == 41 and
          "784" in errs[1][1], "ModelStreamInfer errors arrive in place and the stream goes on: %s" % errs)


# ---- hostile HTTP/2, by hand ----------------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def message(body):
    return b"\0" + struct.pack(">I", len(body)) + body


class H2:
    def __init__(self, d):
        self.s = socket.create_connection(("127.0.0.1", d.grpc_port), timeout=5)
        self.enc, self.dec = hpack.Encoder(), hpack.Decoder()
        self.buf = b""
        self.frames = []        # (type, flags, stream, payload)
        self.headers = {}       # stream -> [(name, value)]
        self.closed = False
        self.s.sendall(PREFACE + frame(SETTINGS, 0, 0))

    def send(self, data):
        try:
            self.s.sendall(data)
        except OSError:
            self.closed = True

    def request(self, sid, path, extra=(), end=True):
        hdr = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "kiln"),
               ("content-type", "application/grpc"), ("te", "trailers"), ("authorization", "Bearer " + ADMIN)]
        return frame(HEADERS, 0x4 | (0x1 if end else 0), sid, self.enc.encode(hdr + list(extra)))

    def read_until(self, pred, timeout=5.0):
        deadline = time.time() + timeout
        while not pred() and not self.closed and time.time() < deadline:
            try:
                self.s.settimeout(max(0.05, deadline - time.time()))
                chunk = self.s.recv(65536)
            except socket.timeout:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self.buf += chunk
            while len(self.buf) >= 9:
                n = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) < 9 + n:
                    break
                ftype, flags = self.buf[3], self.buf[4]
                sid = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
                payload = self.buf[9:9 + n]
                self.buf = self.buf[9 + n:]
                self.frames.append((ftype, flags, sid, payload))
                if ftype == HEADERS:
                    self.headers.setdefault(sid, []).extend(self.dec.decode(payload))
                if ftype == SETTINGS and not flags & 1:
                    self.send(frame(SETTINGS, 1, 0))
        return pred()

    def status(self, sid):
        for k, v in self.headers.get(sid, []):
            if k == "grpc-status":
                return int(v)
        return None

    def message_of(self, sid):
        return dict(self.headers.get(sid, [])).get("grpc-message", "")

    def has(self, ftype, sid=None):
        return any(f[0] == ftype and (sid is None or f[2] == sid) for f in self.frames)

    def close(self):
        self.s.close()


def infer_body():
    q = service_pb2.ModelInferRequest(model_name="mnist_mlp")
    q.inputs.add(name="input", datatype="FP32", shape=list(X.shape))
    q.raw_input_contents.append(X.tobytes())
    return q.SerializeToString()


INFER = "/inference.GRPCInferenceService/ModelInfer"


def test_raw(d, c):
    # A whole call by hand first, to show the client here speaks what kilnd expects.
    h = H2(d)
    h.send(h.request(1, INFER, end=False) + frame(DATA, 1, 1, message(infer_body())))
    check(h.read_until(lambda: h.status(1) is not None) and h.status(1) == 0, "a hand-made ModelInfer call: status 0")

    # The server's own deadline: grpc-timeout 1n has passed before the request can run.
    before = d.metric('kiln_inference_requests_total{model="mnist_mlp",version="1",outcome="timeout"}')
    waits = d.metric('kiln_inference_queue_seconds_count{model="mnist_mlp",version="1"}')
    failed = d.http("GET", "/v2/models/mnist_mlp/stats")[1]["model_stats"][0]["inference_stats"]["fail"]["count"]
    h.send(h.request(3, INFER, [("grpc-timeout", "1n")], end=False) + frame(DATA, 1, 3, message(infer_body())))
    h.read_until(lambda: h.status(3) is not None)
    after = d.metric('kiln_inference_requests_total{model="mnist_mlp",version="1",outcome="timeout"}')
    check(h.status(3) == 4 and after == before + 1,
          "grpc-timeout that passes in the queue: DEADLINE_EXCEEDED, counted as a timeout (%s, %s -> %s)"
          % (h.status(3), before, after))
    # it waited in the queue and failed: the queue's histogram and the statistics' fail count it
    check(d.metric('kiln_inference_queue_seconds_count{model="mnist_mlp",version="1"}') == waits + 1,
          "the timed-out request's wait is in kiln_inference_queue_seconds")
    check(d.http("GET", "/v2/models/mnist_mlp/stats")[1]["model_stats"][0]["inference_stats"]["fail"]["count"]
          == failed + 1, "the timed-out request is a failure in the statistics")

    # A length prefix past the body: the call ends inside a message.
    h.send(h.request(5, INFER, end=False) + frame(DATA, 1, 5, b"\0" + struct.pack(">I", 1000) + b"x" * 10))
    h.read_until(lambda: h.status(5) is not None)
    check(h.status(5) == 3 and "inside a message" in h.message_of(5),
          "a length prefix past the body: INVALID_ARGUMENT (%s %r)" % (h.status(5), h.message_of(5)))

    # Compression the call did not announce, one kilnd does not know, and a small gzip message that
    # inflates past the limit.
    comp = zlib.compressobj(wbits=31)
    bomb = comp.compress(b"\0" * (MAX_BODY * 4)) + comp.flush()
    z = H2(d)
    z.send(z.request(1, INFER, end=False) + frame(DATA, 1, 1, b"\1" + struct.pack(">I", 3) + b"abc") +
           z.request(3, INFER, [("grpc-encoding", "snappy")], end=False) +
           frame(DATA, 1, 3, b"\1" + struct.pack(">I", 3) + b"abc") +
           z.request(5, INFER, [("grpc-encoding", "gzip")], end=False) +
           frame(DATA, 1, 5, b"\1" + struct.pack(">I", len(bomb)) + bomb))
    z.read_until(lambda: all(z.status(k) is not None for k in (1, 3, 5)))
    check(z.status(1) == 13 and z.status(3) == 12 and "snappy" in z.message_of(3) and
          z.status(5) == 8 and "inflated" in z.message_of(5),
          "compression: unannounced INTERNAL, unknown UNIMPLEMENTED, past the limit once inflated "
          "RESOURCE_EXHAUSTED (%s %s %s, %d compressed bytes)" % (z.status(1), z.status(3), z.status(5), len(bomb)))
    z.close()

    # Response compression: a call that compresses its request and accepts that coding back gets
    # compressed answers (grpc-encoding in the response headers, the message's flag set); one that
    # does not accept it, or does not compress, gets them plain.
    xs = dtype_inputs(rows=100)  # a request that fits one DATA frame (16 KiB)
    q = service_pb2.ModelInferRequest(model_name="dtypes")
    for n, t, dt in TYPES:
        q.inputs.add(name="in_" + n, datatype=dt, shape=list(xs[n].shape))
        q.raw_input_contents.append(xs[n].tobytes())
    plain_body = q.SerializeToString()
    cases = {1: ("gzip", "identity,deflate,gzip", 31), 3: ("deflate", "identity,deflate,gzip", 15),
             5: ("gzip", "identity", 31), 7: (None, "identity,deflate,gzip", None)}
    z = H2(d)
    for sid, (enc, accept, wbits) in cases.items():
        extra = [("grpc-accept-encoding", accept)] + ([("grpc-encoding", enc)] if enc else [])
        if enc:
            co = zlib.compressobj(wbits=wbits)
            body = co.compress(plain_body) + co.flush()
            msg = b"\1" + struct.pack(">I", len(body)) + body
        else:
            msg = message(plain_body)
        z.send(z.request(sid, INFER, extra, end=False) + frame(DATA, 1, sid, msg))
    z.read_until(lambda: all(z.status(k) is not None for k in cases), timeout=10)
    for sid, (enc, accept, wbits) in cases.items():
        data = b"".join(f[3] for f in z.frames if f[0] == DATA and f[2] == sid)
        hdrs = dict(z.headers.get(sid, []))
        flag = data[0] if data else None
        payload = data[5:]
        want_coded = enc is not None and enc in accept
        try:
            if flag == 1:
                payload = zlib.decompress(payload, wbits)
            res = service_pb2.ModelInferResponse.FromString(payload)
            got = np.frombuffer(res.raw_output_contents[0], dtype=np.float32).reshape(xs["f32"].shape)
            right = np.array_equal(got, xs["f32"] * 2)
        except Exception as e:  # noqa: BLE001 - any decoding failure is the check failing
            right = "%s" % e
        check(z.status(sid) == 0 and right is True and (flag == 1) == want_coded and
              hdrs.get("grpc-encoding") == (enc if want_coded else None),
              "response compression with grpc-encoding %s, grpc-accept-encoding %s: %s (flag %s, %s, %d bytes)"
              % (enc, accept, "compressed" if want_coded else "plain", flag, right, len(data)) +
              " status %s %r" % (z.status(sid), z.message_of(sid)))
    z.close()

    # A length prefix past the limit: refused at once, the body never sent.
    h.send(h.request(7, INFER, end=False) + frame(DATA, 0, 7, b"\0" + struct.pack(">I", 1 << 31)))
    h.read_until(lambda: h.status(7) is not None)
    check(h.status(7) == 8 and "max_body_bytes" in h.message_of(7),
          "a length prefix past the limit: RESOURCE_EXHAUSTED before the body (%s)" % h.status(7))

    # A stream that never ends, with a grpc-timeout: answered DEADLINE_EXCEEDED when it passes.
    h.send(h.request(9, INFER, [("grpc-timeout", "300m")], end=False) + frame(DATA, 0, 9, b"\0\0\0"))
    h.read_until(lambda: h.status(9) is not None, timeout=4)
    check(h.status(9) == 4, "a request that never ends: DEADLINE_EXCEEDED after its grpc-timeout (%s)" % h.status(9))

    # A call reset by the client (RST_STREAM, CANCEL) while its request waits in the queue (the
    # fixture's model waits 3 ms to fill a batch): dropped unrun, and nothing is sent for it.
    before = d.metric('kiln_inference_requests_total{model="mnist_mlp",version="1",outcome="cancelled"}')
    h.send(h.request(13, INFER, end=False) + frame(DATA, 1, 13, message(infer_body())) +
           frame(RST_STREAM, 0, 13, struct.pack(">I", 8)))
    deadline = time.time() + 5
    while time.time() < deadline and \
            d.metric('kiln_inference_requests_total{model="mnist_mlp",version="1",outcome="cancelled"}') < before + 1:
        time.sleep(0.05)
    after = d.metric('kiln_inference_requests_total{model="mnist_mlp",version="1",outcome="cancelled"}')
    h.read_until(lambda: False, timeout=0.2)
    check(after == before + 1 and h.status(13) is None,
          "RST_STREAM cancels the queued request (cancelled %s -> %s, answer %s)" % (before, after, h.status(13)))

    # An unknown method and a PING (keepalive) on the same connection.
    h.send(h.request(15, "/inference.GRPCInferenceService/CudaSharedMemoryStatus", end=False) +
           frame(DATA, 1, 15, message(b"")) + frame(PING, 0, 0, b"12345678"))
    h.read_until(lambda: h.status(15) is not None and h.has(PING))
    check(h.status(15) == 12, "an unimplemented method: UNIMPLEMENTED (%s)" % h.status(15))
    check(any(f[0] == PING and f[1] & 1 and f[3] == b"12345678" for f in h.frames), "a PING is answered")
    h.close()

    # A stream that never ends and no deadline: holds only its own stream; others are served.
    h = H2(d)
    h.send(h.request(1, INFER, end=False) + frame(DATA, 0, 1, b"\0\0\0\0\x10abc"))
    check(c.is_server_live() and c.is_model_ready("mnist_mlp", headers=AUTH),
          "a stream that never ends does not stop other calls")
    h.close()

    # Too many concurrent streams: past SETTINGS_MAX_CONCURRENT_STREAMS they are refused.
    h = H2(d)
    h.read_until(lambda: h.has(SETTINGS), timeout=2)
    h.send(b"".join(h.request(1 + 2 * k, INFER, end=False) for k in range(150)))
    h.read_until(lambda: h.has(RST_STREAM) or h.has(GOAWAY), timeout=3)
    check(h.has(RST_STREAM) or h.has(GOAWAY), "streams past the concurrency cap are refused")
    h.close()

    # A header block over the limit: the stream (or the connection) is refused.
    h = H2(d)
    h.send(h.request(1, INFER, [("x-filler", "v" * 20000)]))
    h.read_until(lambda: h.has(RST_STREAM, 1) or h.has(GOAWAY) or h.status(1) is not None, timeout=3)
    check((h.has(RST_STREAM, 1) or h.has(GOAWAY) or h.closed) and h.status(1) in (None, 8),
          "a header block over the limit is refused")
    h.close()

    # A SETTINGS flood: kilnd keeps up or drops the connection; either way it keeps serving.
    h = H2(d)
    h.send(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65535)) * 20000)
    h.read_until(lambda: False, timeout=1)
    h.close()
    # Garbage instead of the preface.
    s = socket.create_connection(("127.0.0.1", d.grpc_port), timeout=5)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(4096))
    s.close()
    i = tg.InferInput("input", list(X.shape), "FP32")
    i.set_data_from_numpy(X)
    r = c.infer("mnist_mlp", [i], headers=AUTH)
    check(np.allclose(r.as_numpy("logits"), WANT, atol=1e-4), "after the hostile connections kilnd still infers")


def test_backpressure():
    """A queue of depth 1: requests past it are UNAVAILABLE at once, counted as overloaded."""
    d = Daemon("small", ["--max-queue-depth", "1", "--drain-timeout-ms", "1000"])
    try:
        c = tg.InferenceServerClient(d.target)
        check(wait_ready(c, "mnist_mlp"), "the small daemon loads its model")
        h = H2(d)
        h.send(b"".join(h.request(1 + 2 * k, INFER, end=False) + frame(DATA, 1, 1 + 2 * k, message(infer_body()))
                        for k in range(8)))
        h.read_until(lambda: all(h.status(1 + 2 * k) is not None for k in range(8)))
        codes = [h.status(1 + 2 * k) for k in range(8)]
        full = [1 + 2 * k for k in range(8) if codes[k] == 14]
        check(codes[0] == 0 and full and set(codes) <= {0, 14} and
              all("queue is full" in h.message_of(sid) for sid in full),
              "past the queue's depth: UNAVAILABLE, the queued one answered (%s)" % codes)
        overloaded = d.metric('kiln_inference_requests_total{model="mnist_mlp",version="1",outcome="overloaded"}')
        rejected = d.metric('kiln_inference_requests_total{model="mnist_mlp",version="1",outcome="rejected"}')
        check(overloaded == len(full) and rejected == 0,
              "the queue-full calls count as overloaded, not rejected (%s, %s)" % (overloaded, rejected))
        unavailable = d.metric('kiln_grpc_requests_total{method="ModelInfer",code="UNAVAILABLE"}')
        check(unavailable == len(full), "kiln_grpc_requests_total counts them UNAVAILABLE (%s)" % unavailable)
        h.close()
        c.close()
        # SIGTERM with a call that never ends: GOAWAY at once, the connection cut at the drain
        # deadline, and kilnd exits 0 (d.stop checks).
        h = H2(d)
        h.send(h.request(1, INFER, end=False) + frame(DATA, 0, 1, b"\0\0\0"))
        h.read_until(lambda: h.has(SETTINGS), timeout=2)
        t0 = time.time()
        d.proc.send_signal(signal.SIGTERM)
        h.read_until(lambda: h.has(GOAWAY), timeout=3)
        check(h.has(GOAWAY), "SIGTERM sends GOAWAY on an open gRPC connection")
        h.read_until(lambda: False, timeout=5)
        check(h.closed and time.time() - t0 < 5, "the connection is cut at the drain deadline")
        h.close()
        try:
            rc = d.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 0, "kilnd exits 0 after draining with a gRPC call open (rc %s)" % rc)
    finally:
        if d.proc.poll() is None:
            d.stop()


def test_drain_accepted_call():
    """A call whose message was still arriving when SIGTERM came is one the GOAWAY accepted: it is
    answered OK, and kilnd then exits 0."""
    d = Daemon("drain", ["--drain-timeout-ms", "5000"])
    try:
        c = tg.InferenceServerClient(d.target)
        check(wait_ready(c, "mnist_mlp"), "the draining daemon loads its model")
        c.close()
        h = H2(d)
        msg = message(infer_body())
        h.send(h.request(1, INFER, end=False) + frame(DATA, 0, 1, msg[:len(msg) // 2]))
        h.read_until(lambda: h.has(SETTINGS), timeout=2)
        d.proc.send_signal(signal.SIGTERM)
        h.read_until(lambda: h.has(GOAWAY), timeout=3)
        check(h.has(GOAWAY), "SIGTERM sends GOAWAY while a call's message is half sent")
        h.send(frame(DATA, 1, 1, msg[len(msg) // 2:]))
        h.read_until(lambda: h.status(1) is not None, timeout=5)
        check(h.status(1) == 0, "the half-sent call is answered OK after the GOAWAY (status %s, %s)"
              % (h.status(1), h.message_of(1) if h.status(1) else ""))
        h.close()
        try:
            rc = d.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 0, "kilnd exits 0 once the accepted call is answered (rc %s)" % rc)
    finally:
        if d.proc.poll() is None:
            d.stop()


def test_drain_idle_stream():
    """A streaming call with nothing in flight does not hold the stop: it ends with UNAVAILABLE
    when the drain begins (it had held every stop for all of drain_timeout_ms), its answers
    delivered first, and kilnd exits 0 without waiting for the timeout."""
    d = Daemon("drain-stream", ["--drain-timeout-ms", "60000"])
    try:
        c = tg.InferenceServerClient(d.target)
        check(wait_ready(c, "mnist_mlp"), "the draining daemon loads its model")
        results, got = [], threading.Event()

        def cb(result, error):
            results.append((result, error))
            got.set()

        c.start_stream(callback=cb, headers=AUTH)
        i = tg.InferInput("input", list(X.shape), "FP32")
        i.set_data_from_numpy(X)
        c.async_stream_infer("mnist_mlp", [i], request_id="before-stop")
        got.wait(10)
        got.clear()
        d.proc.send_signal(signal.SIGTERM)
        try:
            rc = d.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            rc = None
        got.wait(5)
        log = open(d.log, errors="replace").read()
        check(rc == 0 and "drain_timeout_ms passed" not in log,
              "kilnd exits 0 without waiting out drain_timeout_ms for an idle stream (rc %s): %s" % (rc, log[-600:]))
        errs = [str(e) for r, e in results if e]
        check(len(results) == 2 and results[0][0] is not None and results[0][0].get_response().id == "before-stop"
              and errs and "StatusCode.UNAVAILABLE" in errs[0] and "kilnd is shutting down" in errs[0],
              "the stream's answer came first, then UNAVAILABLE saying why: %s" % results)
        try:
            c.stop_stream()
        except Exception:  # noqa: BLE001 - the stream is already ended by the server
            pass
        c.close()
    finally:
        if d.proc.poll() is None:
            d.stop()


def test_access_log():
    """With log_access on, each gRPC call is logged as it ends, as each HTTP response is: calls
    were in no log line at all."""
    d = Daemon("access", extra=["--log-access", "on"])
    try:
        c = tg.InferenceServerClient(d.target)
        check(c.is_server_live(), "live over gRPC")
        try:
            c.get_model_metadata("nosuch", headers=AUTH)
        except Exception:
            pass
        c.close()
    finally:
        d.stop()
    log = open(d.log, errors="replace").read()
    check(re.search(r" info  access grpc ServerLive OK [0-9.]+ms peer=127\.0\.0\.1:\d+", log) and
          re.search(r" info  access grpc ModelMetadata NOT_FOUND [0-9.]+ms peer=", log),
          "each gRPC call has an access line: %r" % [l for l in log.splitlines() if "access" in l])


def main():
    d = Daemon()
    try:
        c = tg.InferenceServerClient(d.target)
        check(wait_ready(c, "mnist_mlp") and wait_ready(c, "dtypes"), "both models load")
        test_health_and_metadata(d, c)
        test_model_config(d, c)
        test_infer(d, c)
        test_infer_errors(d, c)
        test_stats_and_repository(d, c)
        test_stream(d, c)
        test_raw(d, c)
        c.close()
        test_backpressure()
        test_drain_accepted_call()
        test_drain_idle_stream()
        test_access_log()
    finally:
        d.stop()
        if FAILURES:
            print(open(d.log).read()[-4000:])
        shutil.rmtree(TMP, ignore_errors=True)
    if FAILURES:
        print("%d check(s) failed:" % len(FAILURES))
        for f in FAILURES:
            print("  " + f)
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
