#!/usr/bin/env python3
"""The dynamic batcher never lets a request's deadline pass while it waits for a batch to fill: a
model whose dynamic_batching.max_queue_delay_us (15 s) is longer than limits.infer_timeout_ms
(2 s) answers a lone request, and two requests, well before the delay is up rather than with a
503 "timed out" once it is; kilnd warns at load that the delay is longer than the timeout.

Usage: test_batch_deadline.py KILND MODEL_ONNX
(MODEL_ONNX: examples/models/cnn/1/model.onnx, input x f32[N, 1, 28, 28], output logits f32[N, 10])
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

KILND, ONNX = sys.argv[1], sys.argv[2]
FAILURES = []
DELAY_S = 15


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


def infer(port, results, i):
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0.25] * 784}]}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=DELAY_S + 10)
    t0 = time.time()
    c.request("POST", "/v2/models/cnn/infer", body=json.dumps(body))
    r = c.getresponse()
    data = r.read()
    c.close()
    results[i] = (r.status, data, time.time() - t0)


def add_model(data):
    folder = os.path.join(data, "models", "cnn", "1")
    os.makedirs(folder)
    shutil.copy(ONNX, os.path.join(folder, "model.onnx"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"max_batch_size": 4, "dynamic_batching": {"max_queue_delay_us": DELAY_S * 1000000}}, f)


def main():
    d = H.Daemon(KILND, "batch-deadline", extra=["--infer-timeout-ms", "2000"], setup=add_model, data_roots=False)
    logpath = d.log
    try:
        port = d.port
        deadline = time.time() + 30
        st = 0
        while st != 200 and time.time() < deadline:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/v2/models/cnn/ready")
            st = c.getresponse().status
            c.close()
            time.sleep(0.02)
        check(st == 200, "the model loads")
        for n in (1, 2):
            results = {}
            ts = [threading.Thread(target=infer, args=(port, results, i)) for i in range(n)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            for i in range(n):
                status, body, took = results.get(i, (0, b"", 0))
                check(status == 200, "%d request(s) waiting for a batch of 4: answered %d %r" % (n, status, body[:200]))
                check(took < DELAY_S - 5, "%d request(s): answered in %.1f s, well before the %d s batching delay"
                      % (n, took, DELAY_S))
        log = open(logpath).read()
        check("max_queue_delay_us (15000000)" in log and "limits.infer_timeout_ms (2000 ms)" in log,
              "the load warns that the batching delay is longer than the timeout: %r" % log[-1500:])
    finally:
        if d.stop(timeout=20) is None:
            check(False, "kilnd did not stop on SIGTERM")
    if FAILURES:
        print(open(logpath).read()[-3000:])
        print("%d failure(s)" % len(FAILURES))
        return 1
    H.cleanup()
    print("batch deadline: requests answered before their deadline, not after the batching delay")
    return 0


if __name__ == "__main__":
    sys.exit(main())
