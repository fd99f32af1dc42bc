#!/usr/bin/env python3
"""tritonclient.http, unmodified, against kilnd: every public method of InferenceServerClient is
called and its result asserted, inference with gzip and deflate both ways included.

Usage: test_tritonclient.py KILND FIXTURES

FIXTURES is tests/fixtures (serving/mnist_mlp with serving/expected.json, and onnx/cnn.onnx).
Runs under KILN_TEST_PYTHON, the environment that has tritonclient[http] and numpy; without one
the test is skipped (exit 77) and says so. The methods tritonclient has that kilnd does not
implement (logging, trace and CUDA shared-memory extensions; loading with a configuration or files)
are called too, and must fail with kilnd's clear 501 message; the one method left out is listed
in NOT_CALLED with the reason.
"""
import base64
import gzip
import http.client
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib

KILND, FIX = sys.argv[1], sys.argv[2]

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from test_python import rerun_under_test_python  # noqa: E402

rerun_under_test_python(["tritonclient.http", "numpy", "gevent"], "tritonclient[http] or numpy")

import numpy as np  # noqa: E402
import tritonclient.http as th  # noqa: E402
from tritonclient._plugin import InferenceServerClientPlugin  # noqa: E402
from tritonclient.http.auth import BasicAuth  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

FAILURES = []
ADMIN, READ = "adm1n-secret", "r3ad-secret"
AUTH = {"Authorization": "Bearer " + ADMIN}    # for the requests sent by hand
TMP = tempfile.mkdtemp(prefix="kilnd-triton-")
EXPECTED = json.load(open(os.path.join(FIX, "serving", "expected.json")))
X = np.array(EXPECTED["input"], dtype=np.float32)
WANT = np.array(EXPECTED["logits"], dtype=np.float32)

# Public methods that are not calls to the server, with why they are left out.
NOT_CALLED = {
    "close": "closes the client's connection pool (called at the end, nothing to assert on the server)",
}


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


def fails_with(fn, status, text, what):
    """fn() must raise InferenceServerException carrying status and text from kilnd's error."""
    try:
        fn()
    except InferenceServerException as e:
        ok = str(e.status()) == str(status) and text in (e.message() or "")
        check(ok, "%s: expected %s '%s', got %s %r" % (what, status, text, e.status(), e.message()))
        return
    check(False, "%s: expected an error %s, got success" % (what, status))


class Daemon:
    def __init__(self):
        self.data = os.path.join(TMP, "data")
        models = os.path.join(self.data, "models")
        os.makedirs(models)
        shutil.copytree(os.path.join(FIX, "serving", "mnist_mlp"), os.path.join(models, "mnist_mlp"))
        os.makedirs(os.path.join(models, "cnn", "1"))
        shutil.copy(os.path.join(FIX, "onnx", "cnn.onnx"), os.path.join(models, "cnn", "1", "model.onnx"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
        env["KILN_API_TOKENS"] = "admin:%s,read:%s" % (ADMIN, READ)
        self.log = os.path.join(TMP, "kilnd.log")
        self.proc = subprocess.Popen([KILND, "--port", "0", "--data-dir", self.data], stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "wb"), env=env)
        portfile = os.path.join(self.data, "kilnd.port")
        deadline = time.time() + 20
        while not os.path.exists(portfile):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("kilnd did not start: " + open(self.log).read())
            time.sleep(0.01)
        self.port = int(open(portfile).read())
        self.url = "127.0.0.1:%d" % self.port

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = -9
        check(rc == 0, "kilnd exits 0 after SIGTERM (rc %s)" % rc)


class Bearer(InferenceServerClientPlugin):
    """Adds the bearer token kilnd asks for to every request tritonclient makes."""

    def __init__(self, token):
        self.token = token

    def __call__(self, request):
        request.headers["Authorization"] = "Bearer " + self.token


def test_auth_plugins(c):
    """kilnd runs with tokens: tritonclient's plugins carry them (register_plugin, plugin,
    unregister_plugin); a read token may not load, Basic auth is the wrong scheme."""
    c.unregister_plugin()
    check(c.is_server_live(), "health needs no token")
    fails_with(lambda: c.get_model_metadata("mnist_mlp"), 401, "a bearer token is required", "no token")
    c.register_plugin(BasicAuth("user", ADMIN))
    fails_with(lambda: c.get_model_metadata("mnist_mlp"), 401, "a bearer token is required", "Basic auth")
    c.unregister_plugin()
    c.register_plugin(Bearer("wrong"))
    fails_with(lambda: c.get_model_metadata("mnist_mlp"), 401, "invalid bearer token", "a wrong token")
    read = Bearer(READ)
    c.unregister_plugin()
    c.register_plugin(read)
    check(c.plugin() is read, "plugin() is the one registered")
    check(c.get_model_metadata("mnist_mlp")["name"] == "mnist_mlp", "a read token reads metadata")
    fails_with(lambda: c.load_model("mnist_mlp"), 403, "lacks the admin scope", "a read token may not load")
    c.unregister_plugin()
    check(c.plugin() is None, "unregister_plugin removes it")
    fails_with(lambda: c.get_model_config("mnist_mlp"), 401, "a bearer token is required", "no token after unregister")
    c.register_plugin(Bearer(ADMIN))


def wait_ready(c, name):
    deadline = time.time() + 20
    while time.time() < deadline:
        if c.is_model_ready(name):
            return True
        time.sleep(0.02)
    return False


def infer_inputs(binary):
    i = th.InferInput("input", list(X.shape), "FP32")
    i.set_data_from_numpy(X, binary_data=binary)
    return [i], [th.InferRequestedOutput("logits", binary_data=binary)]


def test_health_and_metadata(c):
    check(c.is_server_live() is True, "is_server_live")
    check(c.is_server_ready() is True, "is_server_ready")
    check(c.is_model_ready("mnist_mlp") is True, "is_model_ready")
    check(c.is_model_ready("mnist_mlp", "1") is True, "is_model_ready, version 1")
    check(c.is_model_ready("mnist_mlp", "7") is False, "is_model_ready, a version that does not exist")
    check(c.is_model_ready("nosuch") is False, "is_model_ready, a model that does not exist")
    meta = c.get_server_metadata()
    check(meta["name"] == "kiln" and {"model_repository", "statistics", "binary_tensor_data",
                                      "system_shared_memory"} <= set(meta["extensions"]),
          "get_server_metadata: %s" % meta)
    m = c.get_model_metadata("mnist_mlp")
    check(m["name"] == "mnist_mlp" and m["versions"] == ["1"] and m["platform"] == "kiln" and
          m["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 784]}] and
          m["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}], "get_model_metadata: %s" % m)
    check(c.get_model_metadata("mnist_mlp", "1") == m, "get_model_metadata, version 1")
    fails_with(lambda: c.get_model_metadata("nosuch"), 404, "unknown model 'nosuch'", "metadata of an unknown model")


def test_model_config(c):
    cfg = c.get_model_config("mnist_mlp")
    # From tests/fixtures/serving/mnist_mlp/1/config.json: batching on, so dims leave the batch dim out.
    check(cfg["name"] == "mnist_mlp" and cfg["backend"] == "kiln" and cfg["platform"] == "kiln" and
          cfg["max_batch_size"] == 64, "get_model_config header: %s" % cfg)
    check([(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]] == [("input", "TYPE_FP32", [784])],
          "get_model_config input: %s" % cfg["input"])
    check([(t["name"], t["data_type"], t["dims"]) for t in cfg["output"]] == [("logits", "TYPE_FP32", [10])],
          "get_model_config output: %s" % cfg["output"])
    check(cfg.get("dynamic_batching") == {"preferred_batch_size": [8, 16, 32], "max_queue_delay_microseconds": 3000,
                                          "preserve_ordering": False},
          "get_model_config dynamic_batching: %s" % cfg.get("dynamic_batching"))
    ig = cfg["instance_group"]
    check(len(ig) == 1 and ig[0]["kind"] == "KIND_CPU" and ig[0]["count"] == 1 and ig[0]["gpus"] == [],
          "get_model_config instance_group: %s" % ig)
    check(cfg["version_policy"] == {"latest": {"num_versions": 1}} and cfg["default_model_filename"] == "model.kiln",
          "get_model_config version policy and file: %s" % cfg)
    check(c.get_model_config("mnist_mlp", "1") == cfg, "get_model_config, version 1")
    # An ONNX model with no config.json: no batching, so dims are the graph's whole shape.
    onnx = c.get_model_config("cnn")
    check(onnx["platform"] == "onnx" and onnx["backend"] == "kiln" and onnx["max_batch_size"] == 0 and
          "dynamic_batching" not in onnx and onnx["default_model_filename"] == "model.onnx" and
          [(t["name"], t["data_type"], t["dims"]) for t in onnx["input"]] == [("x", "TYPE_FP32", [-1, 1, 28, 28])] and
          [(t["name"], t["dims"]) for t in onnx["output"]] == [("logits", [-1, 10])],
          "get_model_config of the ONNX model: %s" % onnx)
    fails_with(lambda: c.get_model_config("mnist_mlp", "9"), 404, "has no loaded version 9",
               "config of a version that is not loaded")


def test_infer(c):
    runs = 0
    for binary in (False, True):
        for req_alg in (None, "gzip", "deflate"):
            for resp_alg in (None, "gzip", "deflate"):
                inputs, outputs = infer_inputs(binary)
                r = c.infer("mnist_mlp", inputs, outputs=outputs, request_id="r-%d" % runs,
                            request_compression_algorithm=req_alg, response_compression_algorithm=resp_alg)
                runs += 1
                got = r.as_numpy("logits")
                check(got is not None and got.shape == (4, 10) and np.allclose(got, WANT, atol=1e-4),
                      "infer binary=%s request=%s response=%s matches numpy" % (binary, req_alg, resp_alg))
                check(r.get_response()["id"] == "r-%d" % (runs - 1), "infer echoes the request id")
    # async_infer, compressed both ways, several in flight
    pending = []
    for k in range(4):
        inputs, outputs = infer_inputs(k % 2 == 1)
        pending.append(c.async_infer("mnist_mlp", inputs, outputs=outputs, request_compression_algorithm="gzip",
                                     response_compression_algorithm="deflate" if k % 2 else "gzip"))
    for k, p in enumerate(pending):
        got = p.get_result().as_numpy("logits")
        check(got is not None and np.allclose(got, WANT, atol=1e-4), "async_infer %d matches numpy" % k)
    runs += len(pending)
    # the body helpers: a request built by generate_request_body, sent gzip'ed by hand, its answer
    # (gzip'ed by kilnd, which the headers must say) read back by parse_response_body
    inputs, outputs = infer_inputs(True)
    body, json_size = th.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    conn = http.client.HTTPConnection(c_url_host, c_url_port, timeout=20)
    hdrs = dict(AUTH, **{"Content-Encoding": "gzip", "Accept-Encoding": "gzip",
                         "Content-Type": "application/octet-stream"})
    if json_size is not None:
        hdrs["Inference-Header-Content-Length"] = str(json_size)
    conn.request("POST", "/v2/models/mnist_mlp/infer", body=gzip.compress(body), headers=hdrs)
    resp = conn.getresponse()
    raw = resp.read()
    check(resp.status == 200 and resp.getheader("Content-Encoding") == "gzip",
          "a gzip'ed request is answered with a gzip'ed response (%d %s)" % (resp.status, resp.getheaders()))
    if resp.status == 200:
        hl = resp.getheader("Inference-Header-Content-Length")
        r = th.InferenceServerClient.parse_response_body(gzip.decompress(raw),
                                                         header_length=int(hl) if hl else None)
        check(np.allclose(r.as_numpy("logits"), WANT, atol=1e-4), "parse_response_body reads kilnd's answer")
    # deflate is the zlib format, as RFC 9110 and tritonclient have it
    conn.request("POST", "/v2/models/mnist_mlp/infer", body=zlib.compress(body),
                 headers=dict(hdrs, **{"Content-Encoding": "deflate", "Accept-Encoding": "deflate"}))
    resp = conn.getresponse()
    raw = resp.read()
    check(resp.status == 200 and resp.getheader("Content-Encoding") == "deflate" and zlib.decompress(raw),
          "deflate both ways by hand (%d)" % resp.status)
    conn.close()
    runs += 2
    fails_with(lambda: c.infer("mnist_mlp", infer_inputs(False)[0], request_compression_algorithm="gzip",
                               outputs=[th.InferRequestedOutput("nope")]),
               400, "nope", "a compressed request for an unknown output is a plain 400")
    return runs


def test_statistics(c, runs):
    s = c.get_inference_statistics("mnist_mlp")
    st = s["model_stats"]
    check(len(st) == 1 and st[0]["name"] == "mnist_mlp" and st[0]["version"] == "1", "statistics of one model: %s" % s)
    if st:
        inf = st[0]["inference_stats"]
        check(inf["success"]["count"] == runs and st[0]["inference_count"] == 4 * runs,
              "statistics count every request (%d) and row (%d): %s" % (runs, 4 * runs, st[0]))
        # fail: the request for an unknown output refused just before (a request to the model that
        # failed, as Triton counts it); compute: each request that succeeded, as success counts them
        check(inf["fail"]["count"] == 1 and inf["queue"]["count"] == runs and inf["success"]["ns"] > 0 and
              inf["compute_infer"]["count"] == runs and inf["compute_input"]["count"] == runs and
              set(inf) >= {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                           "cache_hit", "cache_miss"}, "statistics fields as Triton has them: %s" % inf)
        check(1 <= st[0]["execution_count"] <= runs and st[0]["last_inference"] > 0, "executions: %s" % st[0])
    check(c.get_inference_statistics("mnist_mlp", "1") == s, "statistics, version 1")
    every = c.get_inference_statistics()
    names = sorted((m["name"], m["version"]) for m in every["model_stats"])
    check(names == [("cnn", "1"), ("mnist_mlp", "1")], "statistics of every model: %s" % names)


def test_repository(c):
    idx = {e["name"]: e for e in c.get_model_repository_index()}
    check(idx.get("mnist_mlp") == {"name": "mnist_mlp", "version": "1", "state": "READY", "reason": ""} and
          idx.get("cnn", {}).get("state") == "READY", "get_model_repository_index: %s" % idx)
    c.unload_model("cnn")
    check(c.is_model_ready("cnn") is False, "unload_model: cnn is no longer ready")
    idx = {e["name"]: e for e in c.get_model_repository_index()}
    check(idx.get("cnn") == {"name": "cnn", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
          "the index says cnn was unloaded: %s" % idx.get("cnn"))
    fails_with(lambda: c.infer("cnn", [th.InferInput("x", [1, 1, 28, 28], "FP32")]), 503, "not ready",
               "inference on an unloaded model")
    c.load_model("cnn")
    check(wait_ready(c, "cnn"), "load_model: cnn is ready again")
    x = np.zeros((1, 1, 28, 28), dtype=np.float32)
    i = th.InferInput("x", [1, 1, 28, 28], "FP32")
    i.set_data_from_numpy(x)
    check(c.infer("cnn", [i]).as_numpy("logits").shape == (1, 10), "the reloaded ONNX model answers")
    fails_with(lambda: c.load_model("cnn", config=json.dumps({"max_batch_size": 4})), 501,
               "does not take a model configuration or files", "load_model with a config override")
    fails_with(lambda: c.load_model("nosuch"), 404, "no model 'nosuch'", "load_model of an unknown model")
    fails_with(lambda: c.unload_model("nosuch"), 404, "not loaded", "unload_model of an unknown model")
    # files= cannot go through this tritonclient (it hands bytes to json.dumps); the request it
    # means to send is sent by hand and refused the same way.
    conn = http.client.HTTPConnection(c_url_host, c_url_port, timeout=20)
    conn.request("POST", "/v2/repository/models/cnn/load",
                 body=json.dumps({"parameters": {"file:1/model.onnx": base64.b64encode(b"onnx").decode()}}),
                 headers=AUTH)
    resp = conn.getresponse()
    check(resp.status == 501 and "does not take a model configuration or files" in json.loads(resp.read())["error"],
          "a load with files is refused with 501")
    conn.close()
    check(c.is_model_ready("cnn"), "cnn still serves after the refused loads")


def test_unimplemented_extensions(c):
    log = "does not implement Triton's logging extension"
    fails_with(lambda: c.get_log_settings(), 501, log, "get_log_settings")
    fails_with(lambda: c.update_log_settings({"log_verbose_level": 1}), 501, log, "update_log_settings")
    trace = "does not implement Triton's trace extension"
    fails_with(lambda: c.get_trace_settings(), 501, trace, "get_trace_settings")
    fails_with(lambda: c.get_trace_settings(model_name="mnist_mlp"), 501, trace, "get_trace_settings of a model")
    fails_with(lambda: c.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}), 501, trace,
               "update_trace_settings")
    fails_with(lambda: c.update_trace_settings(model_name="mnist_mlp", settings={"trace_rate": "1"}), 501, trace,
               "update_trace_settings of a model")
    # System shared memory is served (tests/grpc/test_shm.py drives it); CUDA shared memory is not.
    check(c.get_system_shared_memory_status() == [], "get_system_shared_memory_status: no region registered")
    fails_with(lambda: c.register_system_shared_memory("r", "/kiln_shm_missing_%d" % os.getpid(), 64), 400,
               "unable to open shared memory key", "register_system_shared_memory of a key that does not exist")
    c.unregister_system_shared_memory()
    shm = "does not implement the CUDA shared-memory extension"
    calls = {
        "get_cuda_shared_memory_status": lambda: c.get_cuda_shared_memory_status(),
        "register_cuda_shared_memory": lambda: c.register_cuda_shared_memory("r", "aGFuZGxl", 0, 64),
        "unregister_cuda_shared_memory": lambda: c.unregister_cuda_shared_memory("r"),
    }
    for name, call in calls.items():
        fails_with(call, 501, shm, name)
    check(c.is_server_ready(), "still ready after the unimplemented extensions")


CALLED = {
    "is_server_live", "is_server_ready", "is_model_ready", "get_server_metadata", "get_model_metadata",
    "get_model_config", "get_model_repository_index", "load_model", "unload_model", "get_inference_statistics",
    "infer", "async_infer", "generate_request_body", "parse_response_body", "get_log_settings",
    "update_log_settings", "get_trace_settings", "update_trace_settings", "get_system_shared_memory_status",
    "register_plugin", "plugin", "unregister_plugin",
    "register_system_shared_memory", "unregister_system_shared_memory", "get_cuda_shared_memory_status",
    "register_cuda_shared_memory", "unregister_cuda_shared_memory",
}


def main():
    global c_url_host, c_url_port
    public = {n for n, _ in inspect.getmembers(th.InferenceServerClient, callable) if not n.startswith("_")}
    check(public == CALLED | set(NOT_CALLED),
          "every public method is called or listed with a reason; new: %s, gone: %s"
          % (sorted(public - CALLED - set(NOT_CALLED)), sorted((CALLED | set(NOT_CALLED)) - public)))
    d = Daemon()
    c_url_host, c_url_port = "127.0.0.1", d.port
    c = th.InferenceServerClient(d.url, concurrency=4)
    try:
        c.register_plugin(Bearer(ADMIN))
        check(wait_ready(c, "mnist_mlp") and wait_ready(c, "cnn"), "both models load")
        test_auth_plugins(c)
        test_health_and_metadata(c)
        test_model_config(c)
        runs = test_infer(c)
        test_statistics(c, runs)
        test_repository(c)
        test_unimplemented_extensions(c)
    finally:
        c.close()
        d.stop()
    if FAILURES:
        print(open(d.log).read()[-3000:])
        print("%d failure(s)" % len(FAILURES))
        return 1
    shutil.rmtree(TMP, ignore_errors=True)
    print("tritonclient: all checks passed")
    return 0


c_url_host, c_url_port = None, None
sys.exit(main())
