#!/usr/bin/env python3
"""The gRPC service as an operator sees it: /metrics counts every call by method and status code
(kiln_grpc_requests_total) with its duration (kiln_grpc_request_duration_seconds), errors
included; a grpc-timeout shorter than the model's batching delay is met (the batch goes early for
it, not after the delay); and RepositoryModelLoad refuses a load whose newest version is broken,
naming it, while the old version keeps answering.

Usage: test_grpc_operations.py KILND MODEL_ONNX
(MODEL_ONNX: examples/models/cnn/1/model.onnx, input x f32[N, 1, 28, 28], output logits f32[N, 10])

Runs under KILN_TEST_PYTHON, the environment with tritonclient[grpc] and numpy; without them the
test is skipped (exit 77) and says so.
"""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

KILND, ONNX = sys.argv[1], sys.argv[2]

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from test_python import rerun_under_test_python  # noqa: E402

rerun_under_test_python(["tritonclient.grpc", "numpy"], "tritonclient[grpc] or numpy")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import tritonclient.grpc as tg  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

TMP = tempfile.mkdtemp(prefix="kilnd-grpc-ops-")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
FAILURES = []
DELAY_S = 15


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)
    else:
        print("ok:", what, flush=True)


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def calls(m, method, code):
    return m.get('kiln_grpc_requests_total{method="%s",code="%s"}' % (method, code), 0.0)


def grpc_error(fn):
    try:
        fn()
    except InferenceServerException as e:
        return e.status(), e.message() or ""
    return "OK", ""


def x_input():
    i = tg.InferInput("x", [1, 1, 28, 28], "FP32")
    i.set_data_from_numpy(np.full((1, 1, 28, 28), 0.25, dtype=np.float32))
    return i


def write_version(models, version, config, onnx_bytes=None):
    folder = os.path.join(models, "cnn", str(version))
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    if onnx_bytes is None:
        shutil.copy(ONNX, os.path.join(folder, "model.onnx"))
    else:
        open(os.path.join(folder, "model.onnx"), "wb").write(onnx_bytes)
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write(config)


def main():
    data = os.path.join(TMP, "data")
    models = os.path.join(data, "models")
    slow_batch = json.dumps({"max_batch_size": 4, "dynamic_batching": {"max_queue_delay_us": DELAY_S * 1000000}})
    write_version(models, 1, slow_batch)
    logpath = os.path.join(TMP, "kilnd.log")
    proc = subprocess.Popen([KILND, "--port", "0", "--grpc-port", "0", "--data-dir", data],
                            stdout=subprocess.DEVNULL, stderr=open(logpath, "wb"), env=ENV)
    try:
        ports = [os.path.join(data, f) for f in ("kilnd.port", "kilnd.grpc_port")]
        deadline = time.time() + 30
        while not all(os.path.exists(p) for p in ports):
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("kilnd did not start: " + open(logpath).read())
            time.sleep(0.01)
        port, gport = (int(open(p).read()) for p in ports)
        c = tg.InferenceServerClient("127.0.0.1:%d" % gport)
        while time.time() < deadline and not c.is_model_ready("cnn"):
            time.sleep(0.02)
        before = metrics(port)

        # A 5 s grpc-timeout against a 15 s batching delay: answered, well within the timeout.
        t0 = time.time()
        status, msg = grpc_error(lambda: c.infer("cnn", [x_input()], client_timeout=5))
        took = time.time() - t0
        check(status == "OK", "grpc-timeout 5 s, batching delay %d s: the call succeeds (%s %r)" % (DELAY_S, status, msg))
        check(took < 5, "answered within the call's timeout (%.1f s)" % took)

        # Errors are counted too: an unknown model, and a method the service does not know.
        status, _ = grpc_error(lambda: c.infer("nosuch", [x_input()]))
        check(status == "StatusCode.NOT_FOUND", "ModelInfer of an unknown model: NOT_FOUND (%s)" % status)
        channel = grpc.insecure_channel("127.0.0.1:%d" % gport)
        try:
            channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")(b"", timeout=10)
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
        channel.close()
        check(code == grpc.StatusCode.UNIMPLEMENTED, "an unknown method: UNIMPLEMENTED (%s)" % code)

        # A broken newest version: RepositoryModelLoad refuses, naming it; version 1 still answers.
        write_version(models, 2, json.dumps({"max_batch_sise": 32}))
        status, msg = grpc_error(lambda: c.load_model("cnn"))
        check(status == "StatusCode.INVALID_ARGUMENT" and "version 2" in msg and "max_batch_sise" in msg,
              "RepositoryModelLoad with a broken version 2: INVALID_ARGUMENT naming it (%s %r)" % (status, msg))
        r = c.infer("cnn", [x_input()], client_timeout=5)
        check(r.get_response().model_version == "1", "version 1 still answers after the refused load")

        after = metrics(port)
        check(calls(after, "ModelInfer", "OK") - calls(before, "ModelInfer", "OK") == 2,
              "two ModelInfer calls counted OK: %s" % calls(after, "ModelInfer", "OK"))
        check(calls(after, "ModelInfer", "NOT_FOUND") - calls(before, "ModelInfer", "NOT_FOUND") == 1,
              "the unknown model counted NOT_FOUND")
        check(calls(after, "other", "UNIMPLEMENTED") - calls(before, "other", "UNIMPLEMENTED") == 1,
              "the unknown method counted UNIMPLEMENTED under method=\"other\"")
        check(calls(after, "RepositoryModelLoad", "INVALID_ARGUMENT") == 1,
              "the refused load counted INVALID_ARGUMENT")
        key = 'kiln_grpc_request_duration_seconds_count{method="ModelInfer"}'
        check(after.get(key, 0) - before.get(key, 0) == 3, "three ModelInfer durations observed: %s" % after.get(key))
        key = 'kiln_grpc_request_duration_seconds_bucket{method="ModelInfer",le="+Inf"}'
        check(after.get(key, 0) - before.get(key, 0) == 3, "the duration histogram has its +Inf bucket")
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            check(False, "kilnd did not stop on SIGTERM")
    if FAILURES:
        print(open(logpath).read()[-3000:])
        print("%d failure(s)" % len(FAILURES))
        return 1
    shutil.rmtree(TMP, ignore_errors=True)
    print("gRPC operations: call metrics, deadlines under batching and refused loads as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
