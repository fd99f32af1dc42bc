#!/usr/bin/env python3
"""`kiln predict` prints each output as its datatype says: a BOOL output as true/false (it printed
nan), an INT64 output as exact integers (it printed them as floats, rounded above 2^53), and the
"-> class N" hint only for a floating-point [batch, classes] output of more than one class (it was
added to every 2-D output). The model (written by tests/serving/onnx_min.py) takes x f32[b, 4] and
gives probs = x * 2 (FP32), flag = x > 2 (BOOL) and big = int64(x) + 2^60 + 1 (INT64).

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


def main():
    data = os.path.join(H.TMP, "predict")
    os.makedirs(data, exist_ok=True)
    write_model(data)
    d = H.Daemon(KILND, "predict", fresh=False)
    try:
        for _ in range(300):
            if d.req("GET", "/v2/models/multi/ready")[0] == 200:
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
    finally:
        d.stop()
    H.finish()
    H.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
