#!/usr/bin/env python3
"""The status of an inference whose run fails says whose fault it is, and the error is whole.

kilnd A serves remote sessions of at most 1,000,000 bytes (--remote-max-live-bytes); kilnd B
serves models on remote://A/cpu and on cpu:

- "mem" (y = x * 2 on the remote device): x of 600,000 bytes fits, but y would take the session
  past its limit: memory in use, which may free up, so 503 with Retry-After (before: 400);
- "wide" (y = concat(x, x) on the remote device): y alone is more than the session may hold at
  this request's size, so 413 (a smaller batch fits; before: 400);
  both failing nodes have long names, so the engine's message runs past 256 characters: the
  JSON error carries it whole, up to the limit it names (before: cut at 200);
- "gather" (a Gather on cpu whose indices are the input): an index out of range is the
  request's data, still 400;
- afterwards the same models answer small requests (kilnd keeps serving);
- "elsewhere" names a device that is not configured: its load is refused listing the
  configured devices (before: only "e.g. vulkan:0").

Usage: test_run_failures.py KILND
"""
import http.client
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import kilnd_harness as H  # noqa: E402
import onnx_min as O  # noqa: E402

KILND = sys.argv[1]
FAILURES = []
LONG = "a_node_whose_name_is_long_enough_that_the_engine_message_passes_two_hundred_and_fifty_six_characters_" * 2


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def req(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body=None if body is None else json.dumps(body))
    r = c.getresponse()
    data = r.read()
    c.close()
    try:
        return r.status, json.loads(data), r.getheader("Retry-After")
    except ValueError:
        return r.status, data, r.getheader("Retry-After")


def infer(port, name, n, datatype="FP32", value=0.5):
    body = {"inputs": [{"name": "x", "datatype": datatype, "shape": [1, n], "data": [value] * n}]}
    return req(port, "POST", "/v2/models/%s/infer" % name, body)


def add_model(data, name, onnx_bytes, config):
    folder = os.path.join(data, "models", name, "1")
    os.makedirs(folder)
    with open(os.path.join(folder, "model.onnx"), "wb") as f:
        f.write(onnx_bytes)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)


def models(data, remote):
    x = O.value("x", O.FLOAT, ["b", "n"])
    two = O.tensor("two", O.FLOAT, [], [2.0])
    add_model(data, "mem", O.model([O.node("Mul", ["x", "two"], ["y"])], [x], [O.value("y", O.FLOAT, ["b", "n"])],
                                   [two]), {"device": remote})
    # node names: the first field of NodeProto is its inputs, so the name goes in by hand (field 3)
    mul = O.node("Mul", ["x", "two"], ["y"]) + O._bytes(3, LONG + "mul")
    add_model(data, "mem_named", O.model([mul], [x], [O.value("y", O.FLOAT, ["b", "n"])], [two]), {"device": remote})
    cat = O.node("Concat", ["x", "x"], ["y"], [O.attr_int("axis", 1)]) + O._bytes(3, LONG + "concat")
    add_model(data, "wide", O.model([cat], [x], [O.value("y", O.FLOAT, ["b", "m"])]), {"device": remote})
    table = O.tensor("table", O.FLOAT, [4, 2], [float(v) for v in range(8)])
    gather = O.node("Gather", ["table", "x"], ["y"], [O.attr_int("axis", 0)])
    add_model(data, "gather", O.model([gather], [O.value("x", O.INT64, ["b", "n"])],
                                      [O.value("y", O.FLOAT, ["b", "n", 2])], [table]), {"device": "cpu"})
    add_model(data, "elsewhere", O.model([O.node("Mul", ["x", "two"], ["y"])], [x],
                                         [O.value("y", O.FLOAT, ["b", "n"])], [two]), {"device": "vulkan:7"})


def main():
    a = b = None
    try:
        a = H.Daemon(KILND, "a", extra=["--remote-max-live-bytes", "1000000"], data_roots=False)
        remote = "remote://127.0.0.1:%d/cpu" % a.port
        b = H.Daemon(KILND, "b", extra=["--devices", "cpu," + remote], setup=lambda data: models(data, remote),
                     data_roots=False)
        port = b.port
        deadline = time.time() + 30
        while time.time() < deadline and not all(
                req(port, "GET", "/v2/models/%s/ready" % m)[0] == 200 for m in ("mem", "mem_named", "wide", "gather")):
            time.sleep(0.05)

        st, doc, retry = infer(port, "mem", 150000)
        err = doc.get("error", "") if isinstance(doc, dict) else ""
        check(st == 503 and retry is not None and "remote.max_live_bytes" in err,
              "out of memory on the device: 503 with Retry-After: %d %r %.300s" % (st, retry, err))
        st, doc, retry = infer(port, "mem_named", 150000)
        err = doc.get("error", "") if isinstance(doc, dict) else ""
        check(st == 503 and retry is not None and len(err) > 256 and LONG in err and err.endswith(" in use)"),
              "out of memory, the message whole past 256 characters: %d %d chars %r" % (st, len(err), err[-120:]))
        st, doc, retry = infer(port, "wide", 150000)
        err = doc.get("error", "") if isinstance(doc, dict) else ""
        check(st == 413 and len(err) > 256 and LONG in err and err.endswith("its remote.max_live_bytes)"),
              "one buffer past the device's limit at this size: 413, the message whole: %d %d chars %r"
              % (st, len(err), err[-120:]))
        st, doc, _ = infer(port, "gather", 1, "INT64", 7)
        check(st == 400 and isinstance(doc, dict) and doc.get("error"),
              "an index out of range from the request's data: still 400: %d %r" % (st, doc))

        for name, n, dt, v in (("mem", 4, "FP32", 0.5), ("mem_named", 4, "FP32", 0.5), ("wide", 4, "FP32", 0.5),
                               ("gather", 1, "INT64", 3)):
            st, doc, _ = infer(port, name, n, dt, v)
            check(st == 200, "%s answers a small request afterwards: %d %r" % (name, st, str(doc)[:200]))
        st, doc, retry = infer(port, "mem", 150000)
        check(st == 503 and retry is not None, "the same request fails the same way again: %d" % st)
        # the server-side failures are in b's log, the one caused by the request's data is not
        log = open(b.log, errors="replace").read()
        check(len(re.findall(r" warn  model mem version 1: inference failed \(out of memory\): .*"
                             r"remote\.max_live_bytes", log)) == 2 and
              re.search(r" warn  model wide version 1: inference failed \(too large for the device\): ", log) and
              "model gather version 1: inference failed" not in log,
              "failures of memory and device size are logged at warn, bad data is not: %r" % log[-1500:])

        st, doc, _ = req(port, "POST", "/v2/repository/models/elsewhere/load")
        err = doc.get("error", "") if isinstance(doc, dict) else ""
        check(st == 400 and "model 'elsewhere' version 1: device 'vulkan:7' is not one of the configured devices "
              "(cpu, %s: the devices setting" % remote in err, "a model on a device not configured: the load lists the configured ones: %d %r" % (st, err))
        st, index, _ = req(port, "POST", "/v2/repository/index")
        reason = [m.get("reason", "") for m in index if m.get("name") == "elsewhere"] if st == 200 else []
        check(reason and "(cpu, %s: the devices setting" % remote in reason[0],
              "the index gives the same reason: %r" % reason)
        # the model's own endpoints give the reason whole (it was cut at 160 characters, mid-word)
        st, doc, _ = req(port, "GET", "/v2/models/elsewhere")
        err = doc.get("error", "") if isinstance(doc, dict) else ""
        check(st == 503 and reason and len(reason[0]) > 160 and
              err == reason[0] + "; once that is fixed, POST /v2/repository/models/elsewhere/load loads it",
              "GET /v2/models/elsewhere: 503 with the load's reason whole: %d %r / %r" % (st, err, reason))
    finally:
        for d in (b, a):
            if d:
                d.stop(timeout=20)
    if FAILURES:
        for f in ("a.log", "b.log"):
            p = os.path.join(H.TMP, f)
            if os.path.exists(p):
                print("---", f, open(p).read()[-3000:])
        print("%d failure(s)" % len(FAILURES))
        return 1
    H.cleanup()
    print("run failures: 503 for memory, 413 for a buffer past a device limit, 400 for bad data, whole messages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
