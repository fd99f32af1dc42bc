#!/usr/bin/env python3
"""The Python client (clients/python) against a real kilnd. It is first installed with pip from a copy
of its folder (offline: no index, no build isolation, no dependencies) into a temporary target folder,
and everything below imports that installed copy: inference as JSON and as binary tensors on a kiln
model and an ONNX model with outputs checked against the fixtures' reference values; the tensor codec
of every datatype, BYTES included; errors as KilnError with status, message and problems; a job
submitted, its events streamed, wait(), its metric history and logs, the result served; events
resumed with Last-Event-ID across a SIGKILL and restart of kilnd; cancel, resume and purge; a bearer
token; connection errors (at once from events() and wait() when kilnd was never reached; after
reconnect_timeout once a stream was open); a spec holding NaN or an infinity refused before it is
sent, naming the field. Every element is checked against its datatype before anything is sent (a numpy
array is never cast: 0.7 for INT64 was sent as 0, -1 for UINT8 as 255; binary=True raised
struct.error or OverflowError; "false" for BOOL was True), on ONNX models with INT64, UINT8, FP16
and BOOL inputs; the README's error example is what kilnd answers.

Usage: test_python_client.py KILND CLIENT_SOURCE_DIR FIXTURES_DIR
"""
import json
import math
import os
import pathlib
import shutil
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serving"))
import kilnd_harness as H  # noqa: E402
import onnx_min as O  # noqa: E402
from kilnd_harness import check  # noqa: E402

KILND, CLIENT_SRC, FIX = sys.argv[1], sys.argv[2], sys.argv[3]

# The suite's interpreter (KILN_TEST_PYTHON, made by tests/run with numpy in it) runs this file
# when there is one, so the numpy paths are exercised, not skipped; by hand, without it, they
# are skipped with a line that says so.
TEST_PYTHON = os.environ.get("KILN_TEST_PYTHON", "")
if TEST_PYTHON and os.access(TEST_PYTHON, os.X_OK) and \
        os.path.abspath(sys.executable) != os.path.abspath(TEST_PYTHON) and not os.environ.get("KILN_REEXEC"):
    os.environ["KILN_REEXEC"] = "1"
    os.execv(TEST_PYTHON, [TEST_PYTHON] + sys.argv)
REQUIRE_NUMPY = bool(TEST_PYTHON)


def numpy_or_skip(what):
    """numpy, or None after a skip line; a failure instead when the suite's interpreter lacks it."""
    try:
        import numpy
        return numpy
    except ImportError:
        check(not REQUIRE_NUMPY, "%s: numpy is importable from KILN_TEST_PYTHON (%s)" % (what, TEST_PYTHON))
        print("skip: numpy is not installed; %s not tried" % what, flush=True)
        return None


def install_client():
    """pip install a copy of clients/python into H.TMP/site; returns the folder to import from.
    The package builds with its own standard-library backend, so no index is needed (--no-index)."""
    src = os.path.join(H.TMP, "kiln-client-src")
    shutil.copytree(CLIENT_SRC, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = os.path.join(H.TMP, "site")
    py = sys.executable
    if subprocess.run([py, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        venv = os.path.join(H.TMP, "venv")   # no pip beside this interpreter: a fresh venv brings one
        subprocess.run([py, "-m", "venv", venv], check=True)
        py = os.path.join(venv, "bin", "python")
    p = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check",
                        "--quiet", "--target", site, src], capture_output=True, text=True,
                       env=dict(H.ENV, PIP_NO_INPUT="1", PIP_ROOT_USER_ACTION="ignore"))
    check(p.returncode == 0 and os.path.isfile(os.path.join(site, "kiln_client", "client.py")),
          "pip installs the client offline: %s %s" % (p.stdout[-500:], p.stderr[-1500:]))
    dist = sorted(os.listdir(site)) if os.path.isdir(site) else []
    check(dist == ["kiln_client", "kiln_client-0.1.0.dist-info"], "installed as kiln-client 0.1.0: %s" % dist)
    return site


def test_documented_install():
    """The README's route on Debian 12, where PEP 668 forbids pip in the system Python: a virtual
    environment, then `pip install ./clients/python` in it, run from a folder holding a copy of the
    client as the README's command expects; the package imports from elsewhere afterwards."""
    system_python = shutil.which("python3") or sys.executable
    work = os.path.join(H.TMP, "user")
    shutil.copytree(CLIENT_SRC, os.path.join(work, "clients", "python"),
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    venv = os.path.join(H.TMP, "kiln-venv")
    p = subprocess.run([system_python, "-m", "venv", venv], capture_output=True, text=True)
    check(p.returncode == 0, "python3 -m venv makes the environment: %s" % p.stderr[-800:])
    p = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "./clients/python"], cwd=work,
                       capture_output=True, text=True,
                       env=dict(H.ENV, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1"))
    check(p.returncode == 0, "pip install ./clients/python in the venv, offline: %s" % p.stderr[-1500:])
    p = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                        "import kiln_client, os; print(os.path.dirname(kiln_client.__file__))"],
                       cwd=H.TMP, capture_output=True, text=True)
    check(p.returncode == 0 and p.stdout.strip().startswith(venv),
          "kiln_client imports from the venv: %s %s" % (p.stdout.strip(), p.stderr[-500:]))


def close(a, b, tol=1e-4):
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    out = {}
    for k, v in json.loads(raw[8:8 + n]).items():
        if k != "__metadata__":
            a, b = v["data_offsets"]
            out[k] = (v["shape"], list(struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])))
    return out


def test_codec(kc):
    """Every datatype through the binary and the JSON encodings and back."""
    T = kc.Tensor
    cases = {
        "BOOL": [[True, False], [False, True]], "UINT8": [[0, 255]], "INT8": [[-128, 127]],
        "UINT16": [[0, 65535]], "INT16": [[-32768, 32767]], "UINT32": [[0, 4294967295]],
        "INT32": [[-2147483648, 2147483647]], "UINT64": [[0, 18446744073709551615]],
        "INT64": [[-9223372036854775808, 9223372036854775807]], "FP16": [[0.5, -65504.0]],
        "FP32": [[1.5, -2.25], [3.0, 1e-3]], "FP64": [[1e300, -1e-300]], "BF16": [[1.0, -2.5, 3.0]],
        "BYTES": [[b"", b"kiln"], ["text", b"\x00\xff"]],
    }
    check(sorted(cases) == sorted(kc.DATATYPES), "the codec covers every KServe datatype")
    for dt, value in cases.items():
        t = T("x", value, dt)
        back = T.from_binary("x", dt, t.shape, t.to_binary())
        want = t.data
        floats = dt in ("FP32", "FP16", "BF16")   # rounded to the datatype on the way
        ok = close(back.data, want, 1e-3) if floats else back.data == want
        nested = back.tolist() if floats else back.tolist() == T("x", datatype=dt, shape=t.shape, data=want).tolist()
        check(ok and back.shape == t.shape and nested, "%s survives the binary encoding: %s" % (dt, back.data))
        if dt != "BYTES":   # (BYTES as JSON below: text only)
            j = T("x", datatype=dt, shape=t.shape, data=json.loads(json.dumps(t.json_data())))
            check(close(j.data, want, 1e-3) if floats else j.data == want, "%s survives the JSON encoding" % dt)
        if dt == "BYTES":
            check(t.to_binary() == b"\x00\x00\x00\x00" + b"\x04\x00\x00\x00kiln" + b"\x04\x00\x00\x00text"
                  + b"\x02\x00\x00\x00\x00\xff", "BYTES: a 4-byte little-endian length before each element")
    t = T("x", ["kiln", "d\u00e9j\u00e0 vu"], "BYTES")
    check(t.json_data() == ["kiln", "d\u00e9j\u00e0 vu"] and t.data[1] == "d\u00e9j\u00e0 vu".encode()
          and T.from_json({"name": "x", "datatype": "BYTES", "shape": [2], "data": t.json_data()}).data == t.data,
          "BYTES as JSON: UTF-8 text")
    check(T("x", [[1.0, 2.0]], "BF16").to_binary() == b"\x80\x3f\x00\x40", "BF16 is the top half of the f32")
    check(T("x", [1, 2, 3]).datatype == "INT64" and T("x", [1.0, 2]).datatype == "FP32"
          and T("x", [True]).datatype == "BOOL" and T("x", ["a"]).datatype == "BYTES", "datatypes guessed from values")
    for bad, what, words in (([[1, 2], [3]], "ragged", "ragged"),
                             ([[1.5]], "fractional", "input 'x' (INT32): element 0 is 1.5, which is not an integer")):
        try:
            T("x", bad, "INT32")
            check(False, "a %s list is refused" % what)
        except ValueError as e:
            check(words in str(e), "a %s list is refused: %s" % (what, e))
    try:
        T("x", [b"\xff"], "BYTES").json_data()
        check(False, "non-UTF-8 BYTES cannot go as JSON")
    except ValueError as e:
        check("binary=True" in str(e), "non-UTF-8 BYTES as JSON: %s" % e)
    np = numpy_or_skip("the codec's numpy paths")
    if np is not None:
        a = np.arange(6, dtype=np.int16).reshape(2, 3)
        t = T("x", a)
        check(t.datatype == "INT16" and t.shape == [2, 3] and (t.numpy() == a).all(), "numpy arrays in and out")
        for dt, name in ((np.float32, "FP32"), (np.float64, "FP64"), (np.uint8, "UINT8"), (np.int64, "INT64"),
                         (np.bool_, "BOOL"), (np.float16, "FP16")):
            a = (np.arange(12).reshape(3, 4) % 5).astype(dt)
            t = T("x", a)
            check(t.datatype == name, "a numpy %s array is %s: %s" % (np.dtype(dt).name, name, t.datatype))
            for binary in (False, True):
                wire = (T.from_binary("x", name, t.shape, t.to_binary()) if binary
                        else T.from_json({"name": "x", "datatype": name, "shape": t.shape, "data": t.json_data()}))
                back = wire.numpy()
                check(back.dtype == a.dtype and back.shape == a.shape and (back == a).all(),
                      "numpy %s round trip (binary=%s)" % (name, binary))


def refused(what, call, words):
    """call() raises ValueError whose message holds words (a KilnError or any other exception fails)."""
    try:
        call()
        check(False, "%s is refused with ValueError (nothing raised)" % what)
    except ValueError as e:
        check(words in str(e), "%s is refused: %s (want %r)" % (what, e, words))
    except Exception as e:   # noqa: BLE001 (struct.error, OverflowError, KilnError: each a failure here)
        check(False, "%s is refused with ValueError, not %s: %s" % (what, type(e).__name__, e))


def test_element_checks(kc):
    """Every element is checked against the datatype, from a nested list, flat data and a numpy array
    alike, with one message (kiln predict's): the input, the datatype, the row-major index, the value."""
    T = kc.Tensor
    for what, value, dt, words in (
            ("a fraction for INT64", [[1, 2], [3, 4.5]], "INT64",
             "input 'x' (INT64): element 3 is 4.5, which is not an integer"),
            ("NaN for INT64", [float("nan")], "INT64", "input 'x' (INT64): element 0 is nan, which is not an integer"),
            ("inf for INT32", [0, float("-inf")], "INT32",
             "input 'x' (INT32): element 1 is -inf, which is not an integer"),
            ("-1 for UINT8", [[-1, 0, 1]], "UINT8",
             "input 'x' (UINT8): element 0 is -1, outside the UINT8 range 0..255"),
            ("300 for UINT8", [[0, 300]], "UINT8",
             "input 'x' (UINT8): element 1 is 300, outside the UINT8 range 0..255"),
            ("128 for INT8", [128], "INT8", "input 'x' (INT8): element 0 is 128, outside the INT8 range -128..127"),
            ("2^63 for INT64", [2 ** 63], "INT64",
             "input 'x' (INT64): element 0 is 9223372036854775808, outside the INT64 range "
             "-9223372036854775808..9223372036854775807"),
            ("2^64 for UINT64", [2 ** 64], "UINT64", "outside the UINT64 range 0..18446744073709551615"),
            ('"false" for BOOL', ["false"], "BOOL",
             "input 'x' (BOOL): element 0 is 'false', a string, not a boolean"),
            ("2 for BOOL", [[1, 0, 2]], "BOOL",
             "input 'x' (BOOL): element 2 is 2, which is not a boolean (True, False, 0 or 1)"),
            ("0.5 for BOOL", [0.5], "BOOL", "input 'x' (BOOL): element 0 is 0.5, which is not a boolean"),
            ('"1.5" for FP32', [1.0, "1.5"], "FP32", "input 'x' (FP32): element 1 is '1.5', a string, not a number"),
            ('b"7" for INT64', [b"7"], "INT64", "input 'x' (INT64): element 0 is b'7', a string, not a number"),
            ("None for INT64", [None], "INT64", "input 'x' (INT64): element 0 is None, which is not a number"),
            ("70000 for FP16", [[0.0, 70000.0]], "FP16",
             "input 'x' (FP16): element 1 is 70000.0, too large for FP16 (it would become inf)"),
            ("-65520 for FP16", [-65520.0], "FP16",
             "input 'x' (FP16): element 0 is -65520.0, too large for FP16 (it would become -inf)"),
            ("1e39 for FP32", [1e39], "FP32", "input 'x' (FP32): element 0 is 1e+39, too large for FP32"),
            ("3.4e38 for BF16", [3.4e38], "BF16", "input 'x' (BF16): element 0 is 3.4e+38, too large for BF16"),
            ("10^400 for FP64", [10 ** 400], "FP64", "input 'x' (FP64): element 0 is 1000000000"),
            ("an int for BYTES", [b"ab", 5], "BYTES", "input 'x' (BYTES): element 1 is 5, which is not bytes or str")):
        refused("%s (a list)" % what, lambda: T("x", value, dt), words)
        flat = [v for row in value for v in row] if isinstance(value[0], list) else value
        refused("%s (flat data)" % what, lambda: T("x", datatype=dt, shape=[len(flat)], data=flat), words)
    # what fits is kept, exactly: the ends of the ranges, whole floats, 0/1 for BOOL, infinities and
    # the largest finite values for the floating-point datatypes
    for value, dt, want in (([2 ** 63 - 1, -2 ** 63, 2.0 ** 62, -0.0], "INT64", [2 ** 63 - 1, -2 ** 63, 2 ** 62, 0]),
                            ([0, 255, 7.0], "UINT8", [0, 255, 7]), ([2 ** 64 - 1], "UINT64", [2 ** 64 - 1]),
                            ([True, 0, 1, 1.0], "BOOL", [True, False, True, True]),
                            ([65504.0, -65519.0, float("inf")], "FP16", [65504.0, -65519.0, float("inf")]),
                            ([3.4028234663852886e38, 1], "FP32", [3.4028234663852886e38, 1.0])):
        t = T("x", value, dt)
        back = T.from_binary("x", dt, t.shape, t.to_binary()).data
        check(t.data == want and [type(v) for v in t.data] == [type(v) for v in want]
              and (back == want if dt != "FP16" else back == [65504.0, -65504.0, float("inf")]),
              "%s keeps %s as %s (binary: %s)" % (dt, value, t.data, back))
    # to_binary raises the same ValueError for data changed after the check (it was struct.error
    # and OverflowError)
    for dt, bad, words in (("UINT8", 300, "input 'x' (UINT8): element 1 is 300, outside the UINT8 range 0..255"),
                           ("FP16", 70000.0, "input 'x' (FP16): element 1 is 70000.0, too large for FP16"),
                           ("INT8", 0.5, "input 'x' (INT8): element 1 is 0.5, which is not an integer"),
                           ("BF16", 1e39, "input 'x' (BF16): element 1 is 1e+39, too large for BF16")):
        t = T("x", [1, 2], dt)
        t.data[1] = bad
        refused("to_binary() of %s %r" % (dt, bad), t.to_binary, words)
    np = numpy_or_skip("the element checks of numpy arrays")
    if np is None:
        return
    for what, a, dt, words in (
            ("[0.7, -1.9, 3.0] for INT64", np.array([[0.7, -1.9, 3.0]]), "INT64",
             "input 'x' (INT64): element 0 is 0.7, which is not an integer"),
            ("NaN for INT64", np.array([[1.0, np.nan]]), "INT64",
             "input 'x' (INT64): element 1 is nan, which is not an integer"),
            ("inf for UINT16", np.array([np.inf]), "UINT16",
             "input 'x' (UINT16): element 0 is inf, which is not an integer"),
            ("-1 for UINT8", np.array([[-1, 0, 1]]), "UINT8",
             "input 'x' (UINT8): element 0 is -1, outside the UINT8 range 0..255"),
            ("uint64 2^64-1 for INT64", np.array([0, 2 ** 64 - 1], dtype=np.uint64), "INT64",
             "input 'x' (INT64): element 1 is 18446744073709551615, outside the INT64 range"),
            ("int16 -129 for INT8", np.array([[5, -129]], dtype=np.int16), "INT8",
             "element 1 is -129, outside the INT8 range -128..127"),
            ("2 for BOOL", np.array([0, 1, 2]), "BOOL", "input 'x' (BOOL): element 2 is 2, which is not a boolean"),
            ('"false" for BOOL', np.array(["false"]), "BOOL",
             "input 'x' (BOOL): element 0 is 'false', a string, not a boolean"),
            ("70000 for FP16", np.array([[70000.0, 0.0]]), "FP16",
             "input 'x' (FP16): element 0 is 70000.0, too large for FP16"),
            ("1e39 for FP32", np.array([1e39]), "FP32", "input 'x' (FP32): element 0 is 1e+39, too large for FP32")):
        refused("a numpy array, %s" % what, lambda: T("x", a, dt), words)
    for a, dt, want in ((np.array([[1.0, -2.0, 3.0]]), "INT64", [1, -2, 3]),
                        (np.array([0, 255], dtype=np.int64), "UINT8", [0, 255]),
                        (np.array([1, 0]), "BOOL", [True, False]), (np.array([0.0, 1.0]), "BOOL", [False, True]),
                        (np.array([0.5, -65504.0, np.nan]), "FP16", [0.5, -65504.0, "nan"]),
                        (np.array([0.1, np.inf], dtype=np.float64), "FP32", [0.1, float("inf")])):
        t = T("x", a, dt)
        got = ["nan" if isinstance(v, float) and math.isnan(v) else v for v in t.data]
        check(got == want and t.datatype == dt, "a numpy %s array for %s: %s" % (a.dtype, dt, t.data))


def infer_requests(d, model):
    """The inference requests kilnd has had for model, whatever their outcome (a refused one too)."""
    raw = d.req("GET", "/metrics")[1]
    text = raw.decode() if isinstance(raw, bytes) else ""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('kiln_inference_requests_total{model="%s",' % model))


def write_typed_models(models):
    """ONNX models whose input x [b, 3] is INT64 (y = x + 0, INT64), or UINT8, FP16 or BOOL (y = x
    as FP64, which holds every value of each exactly)."""
    def write(name, dtype, nodes, out_dtype, inits=()):
        os.makedirs(os.path.join(models, name, "1"))
        with open(os.path.join(models, name, "1", "model.onnx"), "wb") as f:
            f.write(O.model(nodes, [O.value("x", dtype, ["b", 3])], [O.value("y", out_dtype, ["b", 3])], inits))
    write("m_i64", O.INT64, [O.node("Add", ["x", "zero"], ["y"])], O.INT64, [O.tensor("zero", O.INT64, [], [0])])
    for name, dtype in (("m_u8", O.UINT8), ("m_f16", 10), ("m_bool", O.BOOL)):   # 10: ONNX FLOAT16
        write(name, dtype, [O.node("Cast", ["x"], ["y"], [O.attr_int("to", O.DOUBLE)])], O.DOUBLE)


def test_typed_inputs(kc, d):
    """infer() on models with INT64, UINT8, FP16 and BOOL inputs: what fits arrives exactly, as JSON and
    binary, from a list and a numpy array; what does not is refused with ValueError before anything is
    sent (a numpy array was cast, silently: 0.7 sent as 0, NaN as INT64's minimum, -1 as 255)."""
    c = kc.Client(d.url)
    for m in ("m_i64", "m_u8", "m_f16", "m_bool"):
        c.load(m)
        check(c.model_ready(m), "the %s model is ready" % m)
    big = [[2 ** 63 - 1, -2 ** 63, 2 ** 53 + 1]]
    for binary in (False, True):
        for model, value, want in (("m_i64", big, big), ("m_i64", [[1.0, -2.0, 3]], [[1, -2, 3]]),
                                   ("m_u8", [[0, 255, 7]], [[0.0, 255.0, 7.0]]),
                                   ("m_f16", [[0.5, -65504, 1e-3]], [[0.5, -65504.0, 0.0010004043579101562]]),
                                   ("m_bool", [[True, 0, 1]], [[1.0, 0.0, 1.0]])):
            got = c.infer(model, value, binary=binary).output().tolist()
            check(got == want, "%s takes %s (binary=%s): %s" % (model, value, binary, got))
    before = {m: infer_requests(d, m) for m in ("m_i64", "m_u8", "m_f16", "m_bool")}
    np = numpy_or_skip("numpy inputs for integer, FP16 and BOOL models")
    for binary in (False, True):
        cases = [("m_u8", [[300, 0, 1]], "input 'x' (UINT8): element 0 is 300, outside the UINT8 range 0..255"),
                 ("m_u8", [[1, 0, -1]], "input 'x' (UINT8): element 2 is -1, outside the UINT8 range 0..255"),
                 ("m_f16", [[70000.0, 0, 0]],
                  "input 'x' (FP16): element 0 is 70000.0, too large for FP16 (it would become inf)"),
                 ("m_i64", [[0, 1, 2.5]], "input 'x' (INT64): element 2 is 2.5, which is not an integer"),
                 ("m_bool", [["false", False, True]],
                  "input 'x' (BOOL): element 0 is 'false', a string, not a boolean"),
                 ("m_bool", {"x": [[0, 1, 2]]}, "input 'x' (BOOL): element 2 is 2, which is not a boolean")]
        if np is not None:
            cases += [("m_i64", np.array([[0.7, -1.9, 3.0]]),
                       "input 'x' (INT64): element 0 is 0.7, which is not an integer"),
                      ("m_i64", np.array([[1.0, np.nan, 3.0]]),
                       "input 'x' (INT64): element 1 is nan, which is not an integer"),
                      ("m_u8", np.array([[-1, 0, 1]]),
                       "input 'x' (UINT8): element 0 is -1, outside the UINT8 range 0..255"),
                      ("m_f16", np.array([[0.0, 0.0, -7e4]]),
                       "input 'x' (FP16): element 2 is -70000.0, too large for FP16"),
                      ("m_bool", {"x": np.array([[1, 0, 3]])},
                       "input 'x' (BOOL): element 2 is 3, which is not a boolean")]
        for model, value, words in cases:
            refused("%s for %s (binary=%s)" % (value if isinstance(value, list) else repr(value), model, binary),
                    lambda: c.infer(model, value, binary=binary), words)
    after = {m: infer_requests(d, m) for m in before}
    check(all(before[m] > 0 for m in before) and after == before,
          "a refused input is never sent: inference requests %s before, %s after" % (before, after))
    if np is not None:
        for binary in (False, True):
            for model, a, want in (("m_i64", np.array([[1.0, -2.0, 3.0]]), [[1, -2, 3]]),
                                   ("m_i64", np.array(big, dtype=np.int64), big),
                                   ("m_u8", np.array([[0, 255, 7]], dtype=np.int64), [[0.0, 255.0, 7.0]]),
                                   ("m_f16", np.array([[0.5, -65504.0, 1e-3]]),
                                    [[0.5, -65504.0, 0.0010004043579101562]]),
                                   ("m_bool", np.array([[1, 0, 1]]), [[1.0, 0.0, 1.0]])):
                got = c.infer(model, a, binary=binary).output().tolist()
                check(got == want, "%s takes a numpy %s array %s (binary=%s): %s"
                      % (model, a.dtype, a.tolist(), binary, got))


def test_readme_error(kc, d):
    """The README's error example prints what kilnd answers. Its "fashion" model (fashion_mlp, as the
    README trains it) has the input of the cnn example model, which stands in for it here."""
    c = kc.Client(d.url)
    text = open(os.path.join(CLIENT_SRC, "README.md")).read()
    call = 'kiln.infer("fashion", [[0.5] * 783])'
    printed = [line.split("#", 1)[1].strip() for line in text.splitlines() if "print(e.status, e.message)" in line]
    check(call in text and len(printed) == 1, "the README's error example: %s" % printed)
    check(c.model_metadata("cnn")["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1, 28, 28]}],
          "cnn's input is fashion_mlp's: x FP32 [-1, 1, 28, 28]")
    try:
        c.infer("cnn", [[0.5] * 783])
        check(False, "the README's error example raises KilnError")
    except kc.KilnError as e:
        answer = "%s %s" % (e.status, e.message)
        check(printed[:1] == [answer], "the README's error example prints %s; kilnd answers %r" % (printed, answer))


def test_inference(kc, d):
    c = kc.Client(d.url)
    check(c.live() and c.ready(), "live() and ready()")
    meta = c.server_metadata()
    check(meta["name"] == "kiln" and "binary_tensor_data" in meta["extensions"], "server_metadata(): %s" % meta)
    for name in ("mnist_mlp", "cnn"):
        c.load(name)
    check(c.model_ready("mnist_mlp") and c.model_ready("cnn", 1), "model_ready() after load()")
    idx = {(m["name"], m["version"]): m["state"] for m in c.models()}
    check(idx.get(("mnist_mlp", "1")) == "READY" and idx.get(("cnn", "1")) == "READY", "models(): %s" % idx)
    check(c.model_metadata("cnn")["platform"] == "onnx", "model_metadata()")
    exp = json.load(open(os.path.join(FIX, "serving", "expected.json")))
    x, want = exp["input"], [v for row in exp["logits"] for v in row]
    for binary in (False, True):
        r = c.infer("mnist_mlp", x, binary=binary)
        out = r.output()
        check(r.model_name == "mnist_mlp" and out.name == "logits" and out.datatype == "FP32" and out.shape == [4, 10]
              and close(out.data, want), "kiln model, binary=%s: the reference logits (max diff %.2e)"
              % (binary, max(abs(a - b) for a, b in zip(out.data, want))))
        check(close([v for row in out.tolist() for v in row], want) and len(out.tolist()) == 4, "tolist() nests rows")
    r = c.infer("mnist_mlp", {"input": x}, outputs=["logits"], binary=True, version=1, request_id="r-1")
    check(r.id == "r-1" and r.model_version == "1" and close(r.output("logits").data, want),
          "a dict of inputs, named outputs, a version and an id")
    r = c.infer("mnist_mlp", [kc.Tensor("input", x, "FP32")])
    check(close(r.output().data, want), "a list of Tensor")
    # NaN both ways in a JSON request: the NaN input goes in the binary extension (JSON has
    # none), the row it poisons comes back as kilnd's JSON null and reads as NaN; the other
    # rows are untouched
    poisoned = [list(row) for row in x]
    poisoned[1][0] = float("nan")
    out = c.infer("mnist_mlp", poisoned).output()
    rows = [out.data[i * 10:(i + 1) * 10] for i in range(4)]
    check(all(math.isnan(v) for v in rows[1]) and close(rows[0] + rows[2] + rows[3], want[:10] + want[20:]),
          "a NaN input in a JSON request, NaN outputs read back: %s" % rows[1][:3])
    ref = {b: read_safetensors(os.path.join(FIX, "onnx", "cnn.b%d.io.safetensors" % b)) for b in (1, 3)}
    for b in (1, 3):
        xs, xv = ref[b]["in.x"]
        ys, yv = ref[b]["out.logits"]
        t = kc.Tensor("x", datatype="FP32", shape=xs, data=xv)
        for binary in (False, True):
            out = c.infer("cnn", t, binary=binary).output()
            check(out.shape == ys and close(out.data, yv), "ONNX model, batch %d, binary=%s: ONNX Runtime's logits"
                  % (b, binary))
    np = numpy_or_skip("numpy inputs and outputs of infer()")
    if np is not None:
        xs, xv = ref[3]["in.x"]
        a = np.array(xv, dtype=np.float64).reshape(xs)   # cast to the model's FP32 by the client
        for binary in (False, True):
            out = c.infer("cnn", a, binary=binary).output().numpy()
            check(out.dtype == np.float32 and out.shape == (3, 10)
                  and close(out.reshape(-1).tolist(), ref[3]["out.logits"][1]),
                  "a numpy input and output (binary=%s)" % binary)
    # Errors are KilnError with kilnd's status and message.
    for call, status, words in (
            (lambda: c.infer("nosuch", [[1.0]]), 404, "nosuch"),
            (lambda: c.infer("mnist_mlp", [[0.5] * 783]), 400, "784"),
            (lambda: c.infer("mnist_mlp", [kc.Tensor("input", [[b"ab"] * 784], "BYTES")], binary=True), 400, "BYTES"),
            (lambda: c.model_metadata("nosuch"), 404, "nosuch"),
            (lambda: c.job(999999), 404, "no job 999999"),
            (lambda: c.metrics(999999), 404, "no job"),
            (lambda: list(c.events(999999)), 404, "no job"),
            (lambda: c.logs(999999), 404, "no job"),
            (lambda: c.load("../x"), 400, "")):
        try:
            call()
            check(False, "an error answer raises KilnError (%d)" % status)
        except kc.KilnError as e:
            check(e.status == status and words in e.message and str(e).startswith("HTTP %d: " % status),
                  "KilnError %s: %s" % (status, e))
    try:
        c.submit({"model": "fashion_mlp", "epochs": 0, "data": {"type": "csv"}})
        check(False, "a bad job spec raises")
    except kc.KilnError as e:
        check(e.status == 400 and len(e.problems) >= 2 and any(p.startswith("epochs:") for p in e.problems),
              "a rejected spec lists every problem: %s" % e.problems)
    # NaN or an infinity in a spec is refused before anything is sent, naming the field (it went
    # out as invalid JSON and came back as kilnd's 400 "not valid JSON")
    for what, spec, words in (
            ("NaN epochs", {"model": "fashion_mlp", "epochs": float("nan")}, "field epochs is nan"),
            ("an infinite lr", {"model": "fashion_mlp", "optimizer": {"kind": "adam", "lr": float("inf")}},
             "field optimizer.lr is inf"),
            ("-inf in a list", {"model": "fashion_mlp", "data": {"type": "csv", "x": [1.0, float("-inf")]}},
             "field data.x[1] is -inf"),
            ("NaN in a JSON string", '{"model": "fashion_mlp", "epochs": NaN}', "field epochs is nan")):
        refused("a spec with %s" % what, lambda: c.submit(spec), words)
    check(c.jobs() == [], "no job came of a refused spec")


def test_job(kc, d):
    c = kc.Client(d.url)
    jid = c.submit(H.spec("pyjob", epochs=2))
    events = list(c.events(jid))
    types = [e.type for e in events]
    states = [e.data["state"] for e in events if e.type == "state"]
    check(states == ["queued", "running", "succeeded"] and types.count("epoch") == 2 and "step" in types
          and "model" in types, "events(): the whole stream to the final state: %s" % types)
    ids = [e.id for e in events]
    check(ids == list(range(1, len(ids) + 1)), "event ids 1..n")
    later = list(c.events(jid, last_event_id=ids[3]))
    check([e.id for e in later] == ids[4:], "events(last_event_id=) resumes after it")
    job = c.wait(jid)
    check(job["state"] == "succeeded" and job["model"] == {"name": "pyjob", "version": 1}, "wait(): %s" % job["state"])
    rows = c.metrics(jid)
    check([r["epoch"] for r in rows] == [1, 2] and rows[-1]["valid_accuracy"] == job["latest_epoch"]["valid_accuracy"],
          "metrics(): the epoch rows")
    check(len(c.metrics(jid, "step")) == types.count("step"), "metrics(kind='step')")
    logs = c.logs(jid)
    check(any("registered as pyjob" in l["message"] for l in logs)
          and c.logs(jid, after=logs[-1]["event_id"]) == [], "logs() and logs(after=)")
    deadline = time.time() + 10
    while not c.model_ready("pyjob") and time.time() < deadline:
        time.sleep(0.05)
    out = c.infer("pyjob", [[2, 0, 0, 0], [0, 2, 0, 0], [0, 0, 2, 0]]).output()
    preds = [max(range(3), key=lambda k: row[k]) for row in out.tolist()]
    check(preds == [0, 1, 2], "the trained model serves and classifies the prototypes: %s" % preds)
    # A JSON string, a file path and a pathlib.Path (any os.PathLike; it raised TypeError) submit too.
    path = os.path.join(H.TMP, "spec.json")
    json.dump(H.spec("pyjob2", epochs=1), open(path, "w"))
    j2, j3 = c.submit(path), c.submit(json.dumps(H.spec("pyjob3", epochs=1)))
    check(c.wait(j2)["state"] == "succeeded" and c.wait(j3, timeout=60)["state"] == "succeeded",
          "submit() of a file path and of a JSON string")
    path4 = pathlib.Path(H.TMP) / "{spec4}.json"   # a path-like is a path even when its name starts with {
    json.dump(H.spec("pyjob4", epochs=1), open(path4, "w"))
    try:
        j4 = c.submit(path4)
        check(c.wait(j4, timeout=60)["state"] == "succeeded" and c.job(j4)["spec"]["register_as"] == "pyjob4",
              "submit() of a pathlib.Path")
    except TypeError as e:
        j4 = None
        check(False, "submit() of a pathlib.Path: %s" % e)
    listed = [j["id"] for j in c.jobs()]
    check(listed == sorted(listed) and {jid, j2, j3, j4} <= set(listed) and
          [j["id"] for j in c.jobs(state="succeeded")] == [jid, j2, j3, j4], "jobs() and jobs(state=)")


def test_purge(kc, d):
    """purge(): DELETE /v1/jobs/{id}?purge=true removes an ended job and answers what went; a job
    that has not ended is kilnd's 409, an unknown one its 404."""
    c = kc.Client(d.url)
    if not callable(getattr(c, "purge", None)):
        check(False, "Client.purge() exists")
        return
    jid = c.wait(c.submit(H.spec("pypurge", epochs=2)))["id"]
    n_events = len(list(c.events(jid)))
    n_metrics = len(c.metrics(jid)) + len(c.metrics(jid, "step"))
    ans = c.purge(jid)
    check(ans.get("id") == jid and ans.get("purged") is True and ans.get("state") == "succeeded"
          and ans.get("events_removed") == n_events and ans.get("metrics_removed") == n_metrics
          and ans.get("files_removed", 0) > 0 and ans.get("bytes_freed", 0) > 0 and "left_behind" not in ans,
          "purge() of a succeeded job: %s (%d events, %d metric rows)" % (ans, n_events, n_metrics))
    check(ans.get("model_kept") == {"name": "pypurge", "version": 1} and "pypurge" in ans.get("note", "")
          and c.model_ready("pypurge"), "the version the purged job registered stays and is served")
    for what, call in (("job()", lambda: c.job(jid)), ("a second purge()", lambda: c.purge(jid)),
                       ("purge() of an unknown id", lambda: c.purge(999999))):
        try:
            call()
            check(False, "%s after the purge raises KilnError 404" % what)
        except kc.KilnError as e:
            check(e.status == 404, "%s after the purge: %s" % (what, e))
    check(jid not in [j["id"] for j in c.jobs()], "the purged job is gone from jobs()")
    run = c.submit(H.spec("pypurge2", epochs=100000))
    try:
        c.purge(run)
        check(False, "purge() of a job that has not ended raises KilnError 409")
    except kc.KilnError as e:
        check(e.status == 409 and "cancel" in e.message, "purge() of a job that has not ended: %s" % e)
    c.cancel(run)
    check(c.wait(run, timeout=60)["state"] == "cancelled", "the running job ends cancelled")
    ans = c.purge(run)
    check(ans.get("state") == "cancelled" and ans.get("model_kept") is None and "note" not in ans,
          "purge() of a cancelled job that registered nothing: %s" % ans)


def test_reconnect_cancel(kc, daemons):
    """Events across a SIGKILL and restart of kilnd, then cancel, resume, and wait's timeout."""
    d = daemons[0]
    c = kc.Client(d.url)
    c.reconnect_timeout = 30
    jid = c.submit(H.spec("longjob", epochs=100000, checkpoint={"every_epochs": 5, "keep_last": 1}))
    seen, restarted, cancelled = [], False, False
    try:
        for ev in c.events(jid):
            seen.append(ev)
            if not restarted and ev.type == "checkpoint":
                # kilnd dies under the open stream and comes back on the same port
                d.proc.send_signal(signal.SIGKILL)
                d.proc.wait()
                daemons[0] = H.Daemon(KILND, "main", fresh=False, port=d.port)
                restarted = True
            running = sum(1 for e in seen if e.type == "state" and e.data["state"] == "running")
            if restarted and not cancelled and ev.type == "epoch" and running >= 2:
                c.cancel(jid)
                cancelled = True
    except kc.KilnError as e:
        check(False, "the stream survives the restart: %s" % e)
    ids = [e.id for e in seen]
    states = [e.data["state"] for e in seen if e.type == "state"]
    # Resuming from the checkpoint removes the step and epoch events recorded after it (a log
    # event says so; docs/jobs.md), so ids the stream had not sent before the kill may be gone:
    # the ids only grow, and every event the store still holds reached the stream.
    stored = [e.id for e in c.events(jid, last_event_id=0)]
    missed = sorted(set(stored) - set(ids))
    check(restarted and ids == sorted(set(ids)) and not missed,
          "events() reconnected with Last-Event-ID: no stored event lost, none repeated (%d events, %d stored; "
          "missed %s)" % (len(ids), len(stored), missed[:10]))
    removed_log = [e for e in seen if e.type == "log" and "removed" in json.dumps(e.data)]
    gaps = sorted(set(range(1, ids[-1] + 1)) - set(ids)) if ids else []
    check(not gaps or removed_log, "ids skipped only where a log event says events were removed (gaps %s)" % gaps[:10])
    check(states[-1] == "cancelled" and states.count("queued") == 2, "the requeue after the restart, then the "
          "cancel, arrive in the stream: %s" % states)
    check(c.wait(jid)["state"] == "cancelled", "wait() on a finished job returns it at once")
    nid = c.resume(jid)
    check(nid > jid and c.job(nid)["spec"]["resume_from_job"] == jid, "resume() gives a new job continuing it")
    try:
        c.wait(nid, timeout=0.3)
        check(False, "wait(timeout=) raises TimeoutError on a running job")
    except TimeoutError:
        check(True, "wait(timeout=) raises TimeoutError on a running job")
    ans = c.cancel(nid)
    check(ans["state"] in ("cancelling", "cancelled") and c.wait(nid)["state"] == "cancelled", "cancel(): %s" % ans)
    try:
        c.cancel(nid)
        check(False, "cancelling a cancelled job raises")
    except kc.KilnError as e:
        check(e.status == 409, "cancelling a cancelled job: 409 %s" % e.message)


def test_token_and_connection(kc):
    cfg = os.path.join(H.TMP, "tokens.json")
    json.dump({"api_tokens": ["admin:s3cret"]}, open(cfg, "w"))
    d = H.Daemon(KILND, "tokens", extra=["--config", cfg])
    try:
        try:
            kc.Client(d.url).jobs()
            check(False, "no token: 401")
        except kc.KilnError as e:
            check(e.status == 401, "no token: %s" % e)
        check(kc.Client(d.url, token="s3cret").jobs() == [], "a bearer token")
        conf = os.path.join(H.TMP, "cli.json")
        json.dump({"url": d.url, "token": "s3cret"}, open(conf, "w"))
        saved = {k: os.environ.pop(k, None) for k in ("KILN_URL", "KILN_TOKEN")}
        os.environ["KILN_CLI_CONFIG"] = conf
        try:
            c = kc.Client()
            check(c.url == d.url and c.jobs() == [], "url and token from the CLI's config file")
            os.environ["KILN_URL"] = "http://127.0.0.1:1"
            check(kc.Client().url == "http://127.0.0.1:1", "KILN_URL before the config file")
        finally:
            os.environ.pop("KILN_CLI_CONFIG", None)
            os.environ.pop("KILN_URL", None)
            os.environ.update({k: v for k, v in saved.items() if v is not None})
    finally:
        d.stop()
    check(d.proc.returncode == 0, "kilnd with tokens exits 0 after SIGTERM (%s)" % d.proc.returncode)
    # a kilnd never reached is KilnConnectionError at once, from events() and wait() too (events()
    # retried for the whole reconnect_timeout, 60 s, and wait(timeout=) raised a bare TimeoutError)
    dead = kc.Client("http://127.0.0.1:1", timeout=5)
    for what, call in (("live()", dead.live), ("job()", lambda: dead.job(1)),
                       ("infer()", lambda: dead.infer("m", kc.Tensor("x", [1.0]))),
                       ("events()", lambda: list(dead.events(1))), ("wait()", lambda: dead.wait(1)),
                       ("wait(timeout=2)", lambda: dead.wait(1, timeout=2))):
        t0 = time.monotonic()
        try:
            call()
            check(False, "%s on an unreachable kilnd raises" % what)
        except kc.KilnConnectionError as e:
            took = time.monotonic() - t0
            check(e.status is None and "cannot reach kilnd at http://127.0.0.1:1" in str(e) and took < 1.5,
                  "%s on an unreachable kilnd: KilnConnectionError in %.2f s: %s" % (what, took, e))
        except Exception as e:   # noqa: BLE001 (TimeoutError among them)
            check(False, "%s on an unreachable kilnd raises KilnConnectionError, not %s: %s"
                  % (what, type(e).__name__, e))
    # a stream that was open keeps retrying, and gives up reconnect_timeout after kilnd went away
    d = H.Daemon(KILND, "gone")
    c = kc.Client(d.url)
    c.reconnect_timeout = 1.0
    jid = c.submit(H.spec("gonejob", epochs=100000))
    seen, t0 = [], None
    try:
        for ev in c.events(jid):
            seen.append(ev)
            if len(seen) == 1:
                d.proc.send_signal(signal.SIGKILL)
                d.proc.wait()
                t0 = time.monotonic()
        check(False, "events() from a kilnd killed under the stream raises")
    except kc.KilnConnectionError as e:
        took = time.monotonic() - t0 if t0 else -1
        check(seen and "lost kilnd" in str(e) and 1.0 <= took < 10,
              "events() after kilnd went away mid-stream: retried %.1f s, then %s" % (took, e))


def main():
    site = install_client()
    sys.path.insert(0, site)
    import kiln_client as kc
    check(os.path.dirname(kc.__file__) == os.path.join(site, "kiln_client"), "the installed copy is the one tested")
    test_codec(kc)
    test_element_checks(kc)
    test_documented_install()
    daemons = [H.Daemon(KILND, "main")]
    d = daemons[0]
    try:
        models = os.path.join(d.data, "models")
        shutil.copytree(os.path.join(FIX, "serving", "mnist_mlp"), os.path.join(models, "mnist_mlp"))
        os.makedirs(os.path.join(models, "cnn", "1"))
        shutil.copy(os.path.join(FIX, "onnx", "cnn.onnx"), os.path.join(models, "cnn", "1", "model.onnx"))
        write_typed_models(models)
        test_inference(kc, d)
        test_typed_inputs(kc, d)
        test_readme_error(kc, d)
        test_job(kc, d)
        test_purge(kc, d)
        test_reconnect_cancel(kc, daemons)
    finally:
        daemons[0].stop()
    # a sanitizer's report (a leak at exit included) makes kilnd exit non-zero
    check(daemons[0].proc.returncode == 0, "kilnd exits 0 after SIGTERM (%s); log %s"
          % (daemons[0].proc.returncode, daemons[0].log))
    test_token_and_connection(kc)
    H.finish()
    H.cleanup()


if __name__ == "__main__":
    main()
