#!/usr/bin/env python3
"""kilnd's input checks name the input at fault: one given twice is "input 'x' is given twice",
one the model does not have is "the model has no input 'z' (its inputs: x)", never only a count of
inputs (both were "the model takes 1 input(s), the request has 2"); and an id that is not UTF-8
is refused rather than echoed into an answer that would not be JSON. Served over HTTP by the
"good" model of test_batch_split.py.

Usage: test_input_names.py KILND
"""
import http.client
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_batch_split as T  # noqa: E402
from test_batch_split import check, req  # noqa: E402


def test_input_names(port, log):
    x = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}
    st, doc = req(port, "POST", "/v2/models/good/infer", {"inputs": [x, x]})
    check(st == 400 and "input 'x' is given twice" in str(doc), "an input given twice is named: %d %r" % (st, doc))
    z = dict(x, name="z")
    st, doc = req(port, "POST", "/v2/models/good/infer", {"inputs": [x, z]})
    check(st == 400 and "the model has no input 'z' (its inputs: x)" in str(doc),
          "an unknown input is named, with the model's inputs: %d %r" % (st, doc))
    st, doc = req(port, "POST", "/v2/models/good/infer", {"inputs": [z]})
    check(st == 400 and "the model has no input 'z' (its inputs: x)" in str(doc),
          "an unknown input in place of x is named: %d %r" % (st, doc))
    st, doc = req(port, "POST", "/v2/models/good/infer", {"inputs": []})
    check(st == 400 and "input 'x' is missing: the model takes 1 input(s), the request has 0" in str(doc),
          "a missing input is named: %d %r" % (st, doc))
    # An id of raw bytes that are not UTF-8 would be echoed into the answer, making it
    # invalid JSON: refused with a 400 that is itself valid JSON.
    raw = json.dumps({"id": "IDX", "inputs": [x]}).encode().replace(b"IDX", b"\xff\xfe")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v2/models/good/infer", body=raw)
    r = c.getresponse()
    data = r.read()
    c.close()
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    check(r.status == 400 and doc is not None and "UTF-8" in doc.get("error", ""),
          "an id that is not UTF-8 is refused with a JSON 400: %d %r" % (r.status, data[:120]))



def main():
    rc = T.run([test_input_names])
    if rc == 0:
        print("input names: a duplicate or unknown input is named in the 400")
    return rc


if __name__ == "__main__":
    sys.exit(main())
