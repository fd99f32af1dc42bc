#!/usr/bin/env python3
"""`kiln predict` prints each output as its datatype says: a BOOL output as true/false (it printed
nan), an INT64 output as exact integers (it printed them as floats, rounded above 2^53), and the
"-> class N" hint only for a floating-point [batch, classes] output of more than one class (it was
added to every 2-D output). The model (written by tests/serving/onnx_min.py) takes x f32[b, 4] and
gives probs = x * 2 (FP32), flag = x > 2 (BOOL) and big = int64(x) + 2^60 + 1 (INT64).

INT64 inputs reach the model exactly (cJSON's doubles made 9007199254740993 into ...992), as a
bare nested array, a KServe body and a --file; a value out of the datatype's range or not a whole
number is refused before anything is sent, naming the input and the element. The model "ints"
takes x i64[b, 3] and gives y = x + 1.

Usage: test_predict.py KILND KILN_CLI
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "serving"))
import kilnd_harness as H  # noqa: E402
import onnx_min as O  # noqa: E402
from kilnd_harness import check  # noqa: E402

KILND, CLI = sys.argv[1], sys.argv[2]
BIG = 2 ** 60 + 1  # a double cannot hold it: printed through one it would end in ...976


def write_model(data):
    folder = os.path.join(data, "models", "multi", "1")
    os.makedirs(folder, exist_ok=True)
    nodes = [O.node("Mul", ["x", "two"], ["probs"]), O.node("Greater", ["x", "two"], ["flag"]),
             O.node("Cast", ["x"], ["xi"], [O.attr_int("to", O.INT64)]), O.node("Add", ["xi", "big0"], ["big"])]
    b = ["b", 4]
    onnx = O.model(nodes, [O.value("x", O.FLOAT, b)],
                   [O.value("probs", O.FLOAT, b), O.value("flag", O.BOOL, b), O.value("big", O.INT64, b)],
                   [O.tensor("two", O.FLOAT, [], [2.0]), O.tensor("big0", O.INT64, [], [BIG])])
    with open(os.path.join(folder, "model.onnx"), "wb") as f:
        f.write(onnx)
    folder = os.path.join(data, "models", "flags", "1")
    os.makedirs(folder, exist_ok=True)
    onnx = O.model([O.node("Not", ["b"], ["nb"]), O.node("Cast", ["b"], ["d"], [O.attr_int("to", O.DOUBLE)]),
                    O.node("Mul", ["d", "tiny"], ["small"]), O.node("Mul", ["d", "huge"], ["large"])],
                   [O.value("b", O.BOOL, ["n", 3])],
                   [O.value("nb", O.BOOL, ["n", 3]), O.value("small", O.DOUBLE, ["n", 3]),
                    O.value("large", O.DOUBLE, ["n", 3])],
                   [O.tensor("tiny", O.DOUBLE, [], [1.5e-300]), O.tensor("huge", O.DOUBLE, [], [2.5e300])])
    with open(os.path.join(folder, "model.onnx"), "wb") as f:
        f.write(onnx)
    folder = os.path.join(data, "models", "ints", "1")
    os.makedirs(folder, exist_ok=True)
    onnx = O.model([O.node("Add", ["x", "one"], ["y"])], [O.value("x", O.INT64, ["b", 3])],
                   [O.value("y", O.INT64, ["b", 3])], [O.tensor("one", O.INT64, [], [1])])
    with open(os.path.join(folder, "model.onnx"), "wb") as f:
        f.write(onnx)


def predict(d, model, *args):
    p = subprocess.run([CLI, "--url=" + d.url, "predict", model] + list(args), capture_output=True, text=True,
                       env=H.ENV, timeout=60)
    return p.returncode, p.stdout, p.stderr


def infer_requests(d, model):
    """The inference requests kilnd has had for model, whatever their outcome (a refused one too)."""
    raw = d.req("GET", "/metrics")[1]
    text = raw.decode() if isinstance(raw, bytes) else ""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('kiln_inference_requests_total{model="%s",' % model))


def test_int64_inputs(d):
    # 2^53 + 1, the smallest a double cannot hold, and both ends of the INT64 range
    row = [2 ** 53 + 1, -2 ** 63, 2 ** 63 - 2]
    want = "  [%d, %d, %d]" % tuple(v + 1 for v in row)
    rc, out, err = predict(d, "ints", "--json", json.dumps([row]))
    check(rc == 0 and out.splitlines()[1:] == [want],
          "a bare INT64 array reaches the model exactly: rc %d %r %r (want %r)" % (rc, out, err, want))
    # whole numbers written with an exponent or a fraction are whole numbers still, as kilnd reads them
    text = ('{"inputs": [{"name": "x", "datatype": "INT64", "shape": [2, 3], "data": [[%d, %d, %d], '
            '[1e3, 2.50e1, -0]]}]}' % tuple(row))
    rc, out, err = predict(d, "ints", "--json", text)
    check(rc == 0 and out.splitlines()[1:] == [want, "  [1001, 26, 1]"],
          "a KServe body's nested INT64 data reaches the model exactly: rc %d %r %r" % (rc, out, err))
    path = os.path.join(H.TMP, "ints.json")
    with open(path, "w") as f:
        f.write(text)
    rc, out, err = predict(d, "ints", "--file", path)
    check(rc == 0 and out.splitlines()[1:] == [want, "  [1001, 26, 1]"],
          "the same from --file: rc %d %r %r" % (rc, out, err))

    before = infer_requests(d, "ints")
    for args, words in (
            (["--json", "[[1, 9223372036854775808, 3]]"],
             "input 'x' (INT64): element 1 is 9223372036854775808, outside the INT64 range "
             "-9223372036854775808..9223372036854775807"),
            (["--json", "[[1, 2, 3], [4, -9223372036854775809, 6]]"],
             "input 'x' (INT64): element 4 is -9223372036854775809, outside the INT64 range"),
            (["--json", "[[1, 2.5, 3]]"], "input 'x' (INT64): element 1 is 2.5, which is not an integer"),
            (["--json", json.dumps({"inputs": [{"name": "x", "datatype": "INT64", "shape": [1, 3],
                                                "data": [1, 2, 1e-3]}]})],
             "input 'x' (INT64): element 2 is 0.001, which is not an integer"),
            (["--json", json.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 3],
                                                "data": [1, 2147483648, 3]}]})],
             "input 'x' (INT32): element 1 is 2147483648, outside the INT32 range -2147483648..2147483647"),
            (["--json", json.dumps({"inputs": [{"name": "x", "datatype": "UINT64", "shape": [1, 3],
                                                "data": [0, 18446744073709551615, -1]}]})],
             "input 'x' (UINT64): element 2 is -1, outside the UINT64 range 0..18446744073709551615")):
        rc, out, err = predict(d, "ints", *args)
        check(rc == 2 and out == "" and words in err,
              "%s is refused, naming the input and element: rc %d %r (want %r)" % (args[1], rc, err, words))
    after = infer_requests(d, "ints")
    check(before > 0 and after == before,
          "a refused input is never sent: %s inference requests before, %s after" % (before, after))


def test_binary_outputs(d):
    """Outputs asked as binary data (binary_data_output, or one output's binary_data) print as the
    JSON answer does: it printed nan for every value, with exit status 0."""
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [0, 1, 2, 3, 3, 2, 1, 0.5]}]}
    rc, want, err = predict(d, "multi", "--json", json.dumps(body))
    check(rc == 0 and "probs" in want and "nan" not in want, "the JSON answer: rc %d %r %r" % (rc, want, err))
    asks = [{"binary_data_output": True}, None]
    for params in asks:
        b = dict(body)
        if params:
            b["parameters"] = params
        else:  # one output binary, the others as JSON, in the answer's order
            b["outputs"] = [{"name": "probs"}, {"name": "flag", "parameters": {"binary_data": True}},
                            {"name": "big", "parameters": {"binary_data": True}}]
        rc, out, err = predict(d, "multi", "--json", json.dumps(b))
        check(rc == 0 and out == want, "binary outputs (%s) print as JSON ones: rc %d %r (want %r) %r"
              % (params or "per output", rc, out, want, err))
    # the model has no config.json, so it does not batch: its whole output is ranked (ties: lower index)
    outs = []
    for binary in (False, True):
        b = dict(body, outputs=[{"name": "probs", "parameters": {"classification": 2, "binary_data": binary}}])
        rc, out, err = predict(d, "multi", "--json", json.dumps(b))
        outs.append(out)
        check(rc == 0 and out == 'probs (BYTES 2):\n  ["6.000000:3", "6.000000:4"]\n',
              "classes asked as %s BYTES print as strings: rc %d %r %r" % ("binary" if binary else "JSON", rc, out, err))


def test_bool_input_and_fp64(d):
    """A bare nested array of booleans for a BOOL input (refused before); FP64 values far from 1 print
    with an exponent (1.5e-300 printed as 0.0000, 2.5e300 as three hundred digits)."""
    rc, out, err = predict(d, "flags", "--json", "[[true, false, true]]")
    check(rc == 0 and "[false, true, false]" in out, "BOOL in, BOOL out: rc %d %r %r" % (rc, out, err))
    check("[1.5000e-300, 0.0000, 1.5000e-300]" in out, "tiny FP64 with an exponent: %r" % out)
    check("[2.5000e+300, 0.0000, 2.5000e+300]" in out and len(max(out.splitlines(), key=len)) < 80,
          "huge FP64 with an exponent: %r" % out)


def main():
    data = os.path.join(H.TMP, "predict")
    os.makedirs(data, exist_ok=True)
    write_model(data)
    d = H.Daemon(KILND, "predict", fresh=False)
    try:
        for _ in range(300):
            if all(d.req("GET", "/v2/models/%s/ready" % m)[0] == 200 for m in ("multi", "ints", "flags")):
                break
            H.time.sleep(0.02)
        p = subprocess.run([CLI, "--url=" + d.url, "predict", "multi", "--json", json.dumps([[0, 1, 2, 3]])],
                           capture_output=True, text=True, env=H.ENV, timeout=60)
        out = p.stdout
        lines = {ln.split(" ")[0]: i for i, ln in enumerate(out.splitlines()) if not ln.startswith(" ")}
        rows = out.splitlines()
        row = (lambda name: rows[lines[name] + 1].strip() if name in lines else "")
        check(p.returncode == 0, "kiln predict runs: rc %d %r" % (p.returncode, p.stderr))
        check(row("probs") == "[0.0000, 2.0000, 4.0000, 6.0000]  -> class 3",
              "FP32 [1, 4] scores keep their 4 places and the class hint: %r" % row("probs"))
        check(row("flag") == "[false, false, false, true]", "BOOL prints true/false, no hint: %r" % row("flag"))
        want = "[%d, %d, %d, %d]" % (BIG, BIG + 1, BIG + 2, BIG + 3)
        check(row("big") == want, "INT64 prints exact integers, no hint: %r (want %r)" % (row("big"), want))
        check("nan" not in out, "no nan anywhere: %r" % out)
        test_int64_inputs(d)
        test_binary_outputs(d)
        test_bool_input_and_fp64(d)
    finally:
        d.stop()
    # A long bearer token is sent whole (the CLI cut it to 500 bytes: a 401 for a token kilnd takes)
    token = "b" * 600
    d = H.Daemon(KILND, "predict-token", env={"KILN_API_TOKENS": "admin:" + token}, data_roots=False)
    try:
        for tok, want_rc in ((token, 0), (token[:500], 1)):
            p = subprocess.run([CLI, "--url=" + d.url, "--token", tok, "models"], capture_output=True, text=True,
                               env=H.ENV, timeout=60)
            check(p.returncode == want_rc and (want_rc == 0 or "401" in p.stderr),
                  "a %d-byte token: exit %d (want %d) %r" % (len(tok), p.returncode, want_rc, p.stderr[:120]))
    finally:
        d.stop()
    H.finish()
    H.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
