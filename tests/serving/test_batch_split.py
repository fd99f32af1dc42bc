#!/usr/bin/env python3
"""Dynamic batching only where the model's outputs split along the batch:

- "mix" (outputs y = x * 2 and m = x.mean(0), a dynamic dim 0, max_batch_size 4): m is not per
  row, so kilnd serves it unbatched, says so in its log naming 'm', and reports max_batch_size 0
  in the metadata and config. A lone request and 4 concurrent ones each get their own y and m
  (batched, all four got the mean over everyone's rows, or a 400 when alone);
- "good" (y = x * 2, s = x.sum(1, keepdim)): still batches (max_batch_size 4, fewer executions
  than inferences) and every request gets its own rows;
- "fixed" (input x fixed at [1, 4], max_batch_size 4): served unbatched with a warning naming x.

The warnings come from the scheduler's workers, through kilnd's logger: they are read from the
log_file, each a line in kilnd's format (time stamp, level "warn", message), and none goes to
stderr around it.

Its models and kilnd start are shared with test_input_names.py.

Usage: test_batch_split.py KILND
"""
import http.client
import json
import os
import re
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import kilnd_harness as H  # noqa: E402
import onnx_min as O  # noqa: E402

KILND = sys.argv[1]
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


def req(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, path, body=None if body is None else json.dumps(body))
    r = c.getresponse()
    data = r.read()
    c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data


def infer(port, name, rows, value):
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4], "data": [value] * (4 * rows)}]}
    st, doc = req(port, "POST", "/v2/models/%s/infer" % name, body)
    if st != 200:
        return st, doc
    return st, {o["name"]: (o["shape"], o["data"]) for o in doc["outputs"]}


def add_model(data, name, onnx_bytes, config):
    folder = os.path.join(data, "models", name, "1")
    os.makedirs(folder)
    with open(os.path.join(folder, "model.onnx"), "wb") as f:
        f.write(onnx_bytes)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)


def models(data):
    two = O.tensor("two", O.FLOAT, [], [2.0])
    mul = O.node("Mul", ["x", "two"], ["y"])
    x = O.value("x", O.FLOAT, ["b", 4])
    y = O.value("y", O.FLOAT, ["b", 4])
    batching = {"max_batch_size": 4, "dynamic_batching": {"max_queue_delay_us": 300000}}
    mean = O.node("ReduceMean", ["x"], ["m"], [O.attr_ints("axes", [0]), O.attr_int("keepdims", 0)])
    add_model(data, "mix", O.model([mul, mean], [x], [y, O.value("m", O.FLOAT, [4])], [two]), batching)
    rsum = O.node("ReduceSum", ["x"], ["s"], [O.attr_ints("axes", [1]), O.attr_int("keepdims", 1)])
    add_model(data, "good", O.model([mul, rsum], [x], [y, O.value("s", O.FLOAT, ["b", 1])], [two]), batching)
    add_model(data, "fixed", O.model([mul], [O.value("x", O.FLOAT, [1, 4])], [O.value("y", O.FLOAT, [1, 4])],
                                     [two]), batching)


def concurrent(port, name, n):
    res = {}

    def go(i):
        res[i] = infer(port, name, 1, float(i + 1))

    ts = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return res


def test_mix(port, log):
    st, meta = req(port, "GET", "/v2/models/mix")
    check(st == 200 and meta.get("max_batch_size") == 0, "mix: metadata says max_batch_size 0: %r" % (meta,))
    st, cfg = req(port, "GET", "/v2/models/mix/config")
    check(st == 200 and cfg.get("max_batch_size") == 0 and "dynamic_batching" not in cfg,
          "mix: config says it does not batch: %r" % (cfg,))
    st, out = infer(port, "mix", 1, 1.0)
    check(st == 200 and out.get("m") == ([4], [1.0] * 4) and out.get("y") == ([1, 4], [2.0] * 4),
          "mix: a lone request gets its own outputs: %d %r" % (st, out))
    res = concurrent(port, "mix", 4)
    for i in range(4):
        st, out = res[i]
        v = float(i + 1)
        check(st == 200 and out.get("m") == ([4], [v] * 4) and out.get("y") == ([1, 4], [2 * v] * 4),
              "mix: concurrent request %d gets its own m and y: %d %r" % (i, st, out))
    check("model mix version 1 is served unbatched" in log and "output 'm' has shape [4]" in log,
          "mix: the log says it is served unbatched because of output 'm': %r" % log[-2000:])
    line = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z warn  model mix version 1 is served unbatched .*'m'.*$"
    check(re.search(line, log, re.M), "mix: the warning is a line in kilnd's log format: %r" % log[-2000:])


def test_good(port, log):
    st, meta = req(port, "GET", "/v2/models/good")
    check(st == 200 and meta.get("max_batch_size") == 4, "good: still batches: %r" % (meta,))
    res = concurrent(port, "good", 4)
    for i in range(4):
        st, out = res[i]
        v = float(i + 1)
        check(st == 200 and out.get("y") == ([1, 4], [2 * v] * 4) and out.get("s") == ([1, 1], [4 * v]),
              "good: concurrent request %d gets its own rows: %d %r" % (i, st, out))
    st, stats = req(port, "GET", "/v2/models/good/stats")
    s = stats["model_stats"][0] if st == 200 else {}
    check(s.get("inference_count") == 4 and 0 < s.get("execution_count", 0) < 4,
          "good: the 4 requests ran in fewer executions: %r" % ({k: s.get(k) for k in
                                                                 ("inference_count", "execution_count")},))
    check("model good version 1 is served unbatched" not in log, "good: no warning about it: %r" % log[-2000:])


def test_fixed(port, log):
    st, meta = req(port, "GET", "/v2/models/fixed")
    check(st == 200 and meta.get("max_batch_size") == 0, "fixed: metadata says max_batch_size 0: %r" % (meta,))
    check("model fixed version 1 is served unbatched" in log and "input 'x' has a fixed batch (shape [1, 4])" in log,
          "fixed: the log says its input has a fixed batch: %r" % log[-2000:])
    st, out = infer(port, "fixed", 1, 3.0)
    check(st == 200 and out.get("y") == ([1, 4], [6.0] * 4), "fixed: a request runs: %d %r" % (st, out))


def run(tests):
    """Starts kilnd on the models above and runs each of tests(port, log); 0 when all passed."""
    # kilnd's own log in its file; the harness keeps stderr in d.log, where no warning may go
    logpath = os.path.join(H.TMP, "batch-split-kilnd.log")
    if os.path.exists(logpath):
        os.unlink(logpath)
    d = H.Daemon(KILND, "batch-split", setup=models, data_roots=False, extra=["--log-file", logpath])
    errpath = d.log
    try:
        port = d.port
        deadline = time.time() + 30
        st = 0
        while st != 200 and time.time() < deadline:
            st = req(port, "GET", "/v2/health/ready")[0]
            time.sleep(0.02)
        check(st == 200, "kilnd ready with its models")
        log = open(logpath).read()
        err = open(errpath).read()
        check("served unbatched" not in err, "no warning goes to stderr around kilnd's log: %r" % err[-2000:])
        for t in tests:
            t(port, log)
    finally:
        if d.stop(timeout=20) is None:
            check(False, "kilnd did not stop on SIGTERM")
    if FAILURES:
        print(open(logpath).read()[-3000:])
        print(open(errpath).read()[-3000:])
        print("%d failure(s)" % len(FAILURES))
        return 1
    H.cleanup()
    return 0


def main():
    rc = run([test_mix, test_good, test_fixed])
    if rc == 0:
        print("batch split: only models whose outputs follow the batch are batched")
    return rc


if __name__ == "__main__":
    sys.exit(main())
