#!/usr/bin/env python3
"""The classification extension over HTTP (gRPC's side is in tests/grpc/test_grpc.py): an output
asked with "parameters": {"classification": N} answers the top N classes per batch item as BYTES
strings "<value>:<index>[:<label>]", in JSON or as binary data; labels come from the output's
label_filename (in the version folder, else the model folder; CRLF lines; a quote and UTF-8 kept);
a model that does not batch ranks its whole output; a count past the classes is cut to them. Bad
counts, classes into shared memory and label files that are missing, outside the folder or not text
are refused by name.

Usage: test_classification.py KILND FIXTURE_DIR (tests/fixtures/serving: mnist_mlp, expected.json)
"""
import http.client
import json
import os
import shutil
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND, FIX = sys.argv[1], sys.argv[2]
EXPECTED = json.load(open(os.path.join(FIX, "expected.json")))
ROWS = EXPECTED["input"][:2]
LOGITS = EXPECTED["logits"][:2]
LABELS = ["zero", "one", "two \"2\"", "three", "quatre é", "five", "six", "seven", "eight", "nine"]
check = H.check


def model(data, name, config_edit, labels_at=None, labels_text=None):
    """mnist_mlp copied as name, its config.json edited; a label file written at labels_at
    ("version" or "model") with labels_text."""
    dst = os.path.join(data, "models", name)
    shutil.copytree(os.path.join(FIX, "mnist_mlp"), dst)
    cpath = os.path.join(dst, "1", "config.json")
    cfg = json.load(open(cpath))
    config_edit(cfg)
    json.dump(cfg, open(cpath, "w"))
    if labels_at:
        folder = dst if labels_at == "model" else os.path.join(dst, "1")
        with open(os.path.join(folder, "labels.txt"), "wb") as f:
            f.write(labels_text)


def with_labels(name):
    def edit(cfg):
        cfg["outputs"][0]["label_filename"] = name
    return edit


def setup(data):
    os.makedirs(os.path.join(data, "models"))
    crlf = "\r\n".join(LABELS).encode() + b"\r\n"
    model(data, "labelled", with_labels("labels.txt"), "version", crlf)
    model(data, "model_labels", with_labels("labels.txt"), "model", "\n".join(LABELS[:4]).encode())  # no last '\n'
    model(data, "plain", lambda cfg: None)
    model(data, "unbatched", lambda cfg: cfg.update(max_batch_size=0, dynamic_batching=None) or
          cfg.pop("dynamic_batching"))
    # refused at load, each naming the problem
    model(data, "no_file", with_labels("missing.txt"))
    model(data, "bad_name", with_labels("../labels.txt"))
    model(data, "binary_labels", with_labels("labels.txt"), "version", b"a\nb\x00c\n")
    model(data, "latin1_labels", with_labels("labels.txt"), "version", b"setosa\ncaf\xe9\n")
    model(data, "overlong_labels", with_labels("labels.txt"), "version", b"a\nb\n\xc0\xaf\n")


def wait_ready(d, name, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if d.req("GET", "/v2/models/%s/ready" % name)[0] == 200:
            return True
        time.sleep(0.02)
    return False


def http_raw(d, method, path, body):
    """(status, lower-cased headers, raw body): for answers with binary data behind the JSON."""
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    c.request(method, path, body=body)
    r = c.getresponse()
    raw = r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, raw


def infer(d, name, count, binary=False, rows=ROWS):
    out = {"name": "logits", "parameters": {"classification": count}}
    if binary:
        out["parameters"]["binary_data"] = True
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [len(rows), 784],
                        "data": [v for r in rows for v in r]}], "outputs": [out]}
    return d.req("POST", "/v2/models/%s/infer" % name, body)


def strings_from_binary(raw, json_len):
    """The JSON header and the BYTES strings of the one binary output behind it."""
    head, tail, got = json.loads(raw[:json_len]), raw[json_len:], []
    while tail:
        (n,) = struct.unpack("<I", tail[:4])
        got.append(tail[4:4 + n].decode())
        tail = tail[4 + n:]
    return head, got


def expected(logits, count, labels):
    """What the extension should answer for rows of logits: top count per row, ties to the lower index."""
    want = []
    for row in logits:
        order = sorted(range(len(row)), key=lambda k: (-row[k], k))[:count]
        want.append([(row[k], k, labels[k] if labels and k < len(labels) else None) for k in order])
    return want


def same(strings, want):
    """strings (flat) against want ([(value, index, label)] per row): index and label exact, the
    value to the six decimals Triton writes."""
    flat = [w for row in want for w in row]
    if len(strings) != len(flat):
        return False
    for s, (v, k, label) in zip(strings, flat):
        parts = s.split(":", 2)
        if int(parts[1]) != k or abs(float(parts[0]) - v) > 2e-6 or len(parts[0].split(".")[1]) != 6:
            return False
        if (parts[2] if len(parts) == 3 else None) != label:
            return False
    return True


def main():
    d = H.Daemon(KILND, "classification", setup=setup, data_roots=False)
    try:
        for name in ("labelled", "model_labels", "plain", "unbatched"):
            check(wait_ready(d, name), "%s loads" % name)

        st, r = infer(d, "labelled", 3)
        o = r["outputs"][0] if st == 200 else {}
        check(st == 200 and o.get("datatype") == "BYTES" and o.get("shape") == [2, 3] and
              same(o["data"], expected(LOGITS, 3, LABELS)),
              "classification 3 with labels (CRLF lines): the top three per row: %s %s" % (st, r))
        # the same as binary data: the serialized BYTES layout behind the JSON
        c = http_raw(d, "POST", "/v2/models/labelled/infer",
                       json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 784],
                                               "data": [v for r in ROWS for v in r]}],
                                   "outputs": [{"name": "logits",
                                                "parameters": {"classification": 3, "binary_data": True}}]}))
        st, hdrs, raw = c
        jl = int(hdrs.get("inference-header-content-length", "0"))
        head, strings = strings_from_binary(raw, jl) if st == 200 and jl else ({}, [])
        bo = head.get("outputs", [{}])[0]
        check(st == 200 and bo.get("datatype") == "BYTES" and bo.get("shape") == [2, 3] and
              bo.get("parameters", {}).get("binary_data_size") == len(raw) - jl and
              strings == (o.get("data") or []),
              "the same classes as binary data: %s %s %s" % (st, head, strings))

        st, r = infer(d, "labelled", 10)
        o = r["outputs"][0] if st == 200 else {}
        check(st == 200 and same(o["data"], expected(LOGITS, 10, LABELS)) and "4:quatre é" in str(o["data"]),
              "every class with its label, UTF-8 kept: %s" % r)
        st, r = infer(d, "model_labels", 10)
        o = r["outputs"][0] if st == 200 else {}
        check(st == 200 and o.get("shape") == [2, 10] and same(o["data"], expected(LOGITS, 10, LABELS[:4])),
              "labels from the model folder (no last newline); indexes past them have none: %s" % r)
        st, r = infer(d, "plain", 50)
        o = r["outputs"][0] if st == 200 else {}
        check(st == 200 and o.get("shape") == [2, 10] and same(o["data"], expected(LOGITS, 10, None)),
              "no labels, a count past the classes cut to them: %s" % r)
        st, r = infer(d, "unbatched", 4)
        flat = [v for row in LOGITS for v in row]
        o = r["outputs"][0] if st == 200 else {}
        check(st == 200 and o.get("shape") == [4] and same(o["data"], expected([flat], 4, None)),
              "a model that does not batch: the top of its whole output, shape [4]: %s" % r)

        st, cfg = d.req("GET", "/v2/models/labelled/config")
        check(st == 200 and cfg["output"][0]["label_filename"] == "labels.txt",
              "the model config names the label file: %s" % cfg.get("output"))
        st, cfg = d.req("GET", "/v2/models/plain/config")
        check(st == 200 and cfg["output"][0]["label_filename"] == "", "no label file: \"\"")
        st, meta = d.req("GET", "/v2")
        check("classification" in meta.get("extensions", []), "the server lists the extension: %s" % meta)

        for count, words in ((0, "classification must be a whole number of classes from 1 to 1048576"),
                             (-2, "classification must be a whole number of classes from 1"),
                             (1 << 21, "classification must be a whole number of classes from 1 to 1048576"),
                             ("3", "classification must be a whole number of classes"),
                             (1.5, "classification must be a whole number of classes")):
            st, r = infer(d, "plain", count)
            check(st == 400 and ("output 'logits': " + words) in r.get("error", ""),
                  "classification %r -> 400: %s %s" % (count, st, r))

        for name, words in (("no_file", "label_filename 'missing.txt' is in neither the version nor the model folder"),
                            ("bad_name", "label_filename must be the name of a file in the version or the model folder"),
                            ("binary_labels", "label_filename 'labels.txt' holds a NUL byte"),
                            # labels go into JSON answers as they are: bytes that are no UTF-8
                            # made those invalid JSON
                            ("latin1_labels", "label_filename 'labels.txt' is not UTF-8 text (line 2, byte 10)"),
                            ("overlong_labels", "label_filename 'labels.txt' is not UTF-8 text (line 3, byte 4)")):
            st, r = d.req("POST", "/v2/repository/models/%s/load" % name)
            err = r.get("error", "") if isinstance(r, dict) else ""
            check(st == 400 and words in err, "%s is refused at load: %s %s" % (name, st, err))
    finally:
        d.stop()
    H.finish()


if __name__ == "__main__":
    try:
        main()
    finally:
        H.cleanup()
