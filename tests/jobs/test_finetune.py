#!/usr/bin/env python3
"""Fine-tuning over /v1/jobs against a real kilnd: (a) an ONNX file under the data roots (the test
CNN, tests/fixtures/onnx/cnn.onnx) trained on a small synthetic IDX set — the loss falls, the result
is an ONNX repository version that serves, answers differently from the original on the same input
while its nodes, opsets and initializer layout are the original's byte for byte, and its accuracy on
the validation set is the one the job reported; (b) a repository model from an earlier job, which
starts from that model's weights (its first step's loss is the old model's, not a fresh init's), for
a kiln model and for the ONNX version from (a); (c) specs naming a bad model, each a 400 naming the
field. The data is generated here; every job takes a second or two.

Usage: test_finetune.py KILND ONNX_FIXTURES_DIR
"""
import json
import math
import os
import random
import shutil
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402
from kilnd_harness import DATA, TMP, check  # noqa: E402

KILND, FIX = sys.argv[1], sys.argv[2]


# ---- data ---------------------------------------------------------------------------------------

def write_idx(prefix, n, seed):
    """Ten classes of 28x28 images: noise with a bright 10x5 bar whose place says the class."""
    rnd = random.Random(seed)
    imgs, labels = bytearray(), bytearray()
    for _ in range(n):
        c = rnd.randrange(10)
        r0, c0 = 2 + (c // 5) * 13, 1 + (c % 5) * 5
        px = bytearray(rnd.randrange(40) for _ in range(784))
        for r in range(r0, r0 + 10):
            for q in range(c0, c0 + 5):
                px[r * 28 + q] = 200 + rnd.randrange(56)
        imgs += px
        labels.append(c)
    with open(os.path.join(DATA, prefix + "-images.idx"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + imgs)
    with open(os.path.join(DATA, prefix + "-labels.idx"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + labels)
    return [[b / 255.0 for b in imgs[i * 784:(i + 1) * 784]] for i in range(n)], list(labels)


def read_safetensors(path):
    """name -> (shape, flat floats); the format is an 8-byte header length, JSON, raw bytes."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    out = {}
    for k, v in json.loads(raw[8:8 + n]).items():
        if k != "__metadata__":
            a, b = v["data_offsets"]
            out[k] = (v["shape"], list(struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])))
    return out


# ---- a protobuf reader, just enough to compare two ONNX files --------------------------------------

def pb_fields(buf):
    """The top-level fields of a protobuf message: (number, wire type, value bytes or int)."""
    out, i = [], 0

    def varint():
        nonlocal i
        v = shift = 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return v
    while i < len(buf):
        key = varint()
        num, wire = key >> 3, key & 7
        if wire == 0:
            out.append((num, 0, varint()))
        elif wire == 1:
            out.append((num, 1, buf[i:i + 8]))
            i += 8
        elif wire == 5:
            out.append((num, 5, buf[i:i + 4]))
            i += 4
        elif wire == 2:
            n = varint()
            out.append((num, 2, buf[i:i + n]))
            i += n
        else:
            raise ValueError("wire type %d" % wire)
    return out


def onnx_parts(path):
    """(model fields but the graph, graph fields but the initializers, initializers as
    name -> (dims, data_type, data bytes)). ModelProto.graph is 7, GraphProto.initializer 5;
    TensorProto: dims 1, data_type 2, float_data 4, name 8, raw_data 9."""
    model = pb_fields(open(path, "rb").read())
    graph = [v for n, w, v in model if n == 7][0]
    inits = {}
    rest = []
    for n, w, v in pb_fields(graph):
        if n != 5:
            rest.append((n, w, v))
            continue
        t = pb_fields(v)
        name = [x for k, _, x in t if k == 8][0].decode()
        dims = [x for k, _, x in t if k == 1]
        dtype = [x for k, _, x in t if k == 2][0]
        data = b"".join(bytes(x) for k, _, x in t if k in (4, 9))
        inits[name] = (dims, dtype, data)
    return [f for f in model if f[0] != 7], rest, inits


# ---- kilnd --------------------------------------------------------------------------------------

class Daemon(H.Daemon):
    """The harness's kilnd, with the fine-tuning tests' job and model helpers."""

    def __init__(self, name):
        super().__init__(KILND, name)

    def req(self, method, path, body=None, timeout=60):
        return super().req(method, path, body, timeout=timeout)

    def run_job(self, spec, timeout=120):
        """Submit, wait for the end, and return (job, step rows, epoch rows)."""
        st, j = self.req("POST", "/v1/jobs", spec)
        if st != 201:
            raise RuntimeError("submit: %s %s" % (st, j))
        deadline = time.time() + timeout
        while True:
            st, job = self.req("GET", "/v1/jobs/%d" % j["id"])
            if job["state"] in ("succeeded", "failed", "cancelled"):
                break
            if time.time() > deadline:
                raise RuntimeError("job %d did not finish: %s" % (j["id"], job))
            time.sleep(0.05)
        _, steps = self.req("GET", "/v1/jobs/%d/metrics?kind=step" % j["id"])
        _, epochs = self.req("GET", "/v1/jobs/%d/metrics" % j["id"])
        return job, steps["metrics"], epochs["metrics"]

    def wait_ready(self, name, version=None):
        path = "/v2/models/%s%s/ready" % (name, "/versions/%d" % version if version else "")
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.req("GET", path)[0] == 200:
                return True
            time.sleep(0.05)
        return False

    def infer(self, name, x, shape, version=None):
        path = "/v2/models/%s%s/infer" % (name, "/versions/%d" % version if version else "")
        st, r = self.req("POST", path, {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": x}]})
        if st != 200:
            raise RuntimeError("infer %s: %s %s" % (name, st, r))
        return r["outputs"][0]["data"]


def idx_data():
    return {"type": "idx",
            "train_images": os.path.join(DATA, "train-images.idx"), "train_labels": os.path.join(DATA, "train-labels.idx"),
            "valid_images": os.path.join(DATA, "valid-images.idx"), "valid_labels": os.path.join(DATA, "valid-labels.idx")}


MLP = {
    "inputs": ["x"],
    "nodes": [
        {"name": "fc1", "layer": "Linear", "config": {"in_features": 4, "out_features": 16}, "inputs": ["x"]},
        {"name": "act", "op": "relu", "inputs": ["fc1"]},
        {"name": "fc2", "layer": "Linear", "config": {"in_features": 16, "out_features": 3}, "inputs": ["act"]},
    ],
    "outputs": ["fc2"],
}


def csv_spec(model, epochs, lr, register_as):
    return {"model": model,
            "data": {"type": "csv", "train": os.path.join(DATA, "train.csv"), "label_column": "label",
                     "valid_split": 0.2},
            "optimizer": {"kind": "adam", "lr": lr}, "epochs": epochs, "batch_size": 16, "seed": 5,
            "register_as": register_as}


# ---- (a) an ONNX file ----------------------------------------------------------------------------

def test_onnx_file(d, valid):
    src = os.path.join(DATA, "cnn.onnx")
    job, steps, epochs = d.run_job({"model": {"onnx": src}, "data": idx_data(),
                                    "optimizer": {"kind": "adam", "lr": 0.003}, "epochs": 3, "batch_size": 32,
                                    "seed": 1, "register_as": "cnn_ft"})
    check(job["state"] == "succeeded", "ONNX fine-tuning job succeeds: %s" % job.get("error"))
    check(len(epochs) == 3 and len(steps) >= 3, "three epoch rows and step rows in the history")
    if job["state"] != "succeeded" or len(epochs) != 3:
        return
    check(epochs[-1]["train_loss"] < epochs[0]["train_loss"] and epochs[-1]["valid_loss"] < epochs[0]["valid_loss"]
          and steps[-1]["loss"] < 0.9 * steps[0]["loss"],
          "the loss falls: train %.3f -> %.3f, valid %.3f -> %.3f, step %.3f -> %.3f"
          % (epochs[0]["train_loss"], epochs[-1]["train_loss"], epochs[0]["valid_loss"], epochs[-1]["valid_loss"],
             steps[0]["loss"], steps[-1]["loss"]))
    check(job["model"] == {"name": "cnn_ft", "version": 1}, "registered as cnn_ft version 1: %s" % job["model"])
    dst = os.path.join(d.data, "models", "cnn_ft", "1", "model.onnx")
    check(os.path.isfile(dst), "the version is an ONNX file in the repository")
    check(d.wait_ready("cnn_ft"), "cnn_ft is ready on /v2")
    st, meta = d.req("GET", "/v2/models/cnn_ft")
    check(st == 200 and meta["platform"] == "onnx" and meta["inputs"][0]["shape"] == [-1, 1, 28, 28],
          "served as an ONNX model of the original's input: %s" % meta)
    # The original beside it: it answers what ONNX Runtime answered, the fine-tuned one does not.
    vdir = os.path.join(d.data, "models", "cnn_orig", "1")
    os.makedirs(vdir)
    shutil.copy(src, os.path.join(vdir, "model.onnx"))
    d.req("POST", "/v2/repository/models/cnn_orig/load")
    ref = read_safetensors(os.path.join(FIX, "cnn.b1.io.safetensors"))
    x, want = ref["in.x"][1], ref["out.logits"][1]
    orig = d.infer("cnn_orig", x, [1, 1, 28, 28])
    tuned = d.infer("cnn_ft", x, [1, 1, 28, 28])
    check(max(abs(a - b) for a, b in zip(orig, want)) < 1e-4, "the original serves ONNX Runtime's logits")
    diff = max(abs(a - b) for a, b in zip(tuned, want))
    check(diff > 1e-2, "the fine-tuned model answers differently on the same input (max diff %.4f)" % diff)
    # Its validation accuracy as served is the one the job reported.
    xs, ys = valid
    flat = [v for img in xs for v in img]
    out = d.infer("cnn_ft", flat, [len(xs), 1, 28, 28])
    preds = [max(range(10), key=lambda c: out[i * 10 + c]) for i in range(len(xs))]
    acc = sum(p == y for p, y in zip(preds, ys)) / len(ys)
    check(abs(acc - epochs[-1]["valid_accuracy"]) < 1e-9 and acc > 0.5,
          "served accuracy on the validation set %.4f is the reported %.4f" % (acc, epochs[-1]["valid_accuracy"]))
    # Only the initializers' data changed: the model's other fields, the graph's nodes, inputs,
    # outputs and every initializer's name, dims and type are the original's bytes.
    m0, g0, i0 = onnx_parts(src)
    m1, g1, i1 = onnx_parts(dst)
    check(m0 == m1, "ir_version, opset imports, producer and metadata unchanged")
    check(g0 == g1, "graph nodes, inputs, outputs unchanged (%d fields)" % len(g0))
    check(sorted(i0) == sorted(i1) and all(i0[k][:2] == i1[k][:2] and len(i0[k][2]) == len(i1[k][2]) for k in i0),
          "every initializer keeps its name, dims, type and size (%d)" % len(i0))
    changed = [k for k in i0 if i0[k][2] != i1[k][2]]
    check(any("weight" in k for k in changed) and len(changed) >= 4,
          "the trained initializers hold new values: %s" % sorted(changed))


# ---- (b) a repository model ----------------------------------------------------------------------

def test_repository_kiln(d):
    # (with a learning-rate scheduler: its free once resolved to kilnd's request scheduler's)
    fresh, fresh_steps, _ = d.run_job(dict(csv_spec(MLP, 1, 0.01, "scratch"), scheduler={"kind": "cosine"}), timeout=60)
    base, base_steps, base_epochs = d.run_job(csv_spec(MLP, 4, 0.01, "base"))
    check(fresh["state"] == "succeeded" and base["state"] == "succeeded", "the base jobs succeed")
    lrs = [r["lr"] for r in fresh_steps]
    check(len(lrs) >= 2 and abs(lrs[0] - 0.01) < 1e-3 and lrs[-1] < 1e-4 and lrs == sorted(lrs, reverse=True),
          "cosine without t_max anneals over the whole run: lr %s" % lrs)
    x = [2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 0]
    v1 = d.infer("base", x, [3, 4], 1) if d.wait_ready("base", 1) else []
    tuned, steps, epochs = d.run_job(csv_spec({"repository": "base", "version": 1}, 1, 0.001, "base"))
    check(tuned["state"] == "succeeded", "fine-tuning base version 1 succeeds: %s" % tuned.get("error"))
    if tuned["state"] != "succeeded":
        return
    # The same seed gives the same first batch, so the first steps' losses compare like for like.
    first, init, final = steps[0]["loss"], fresh_steps[0]["loss"], base_epochs[-1]["train_loss"]
    check(steps[0]["step"] == 1 and fresh_steps[0]["step"] == 1, "the first step of each job is in the history")
    check(init > 0.7 and first < 0.3 * init and abs(first - final) < 0.15,
          "the first step starts from base's weights: loss %.4f, base's final train loss %.4f, a fresh init's %.4f"
          % (first, final, init))
    logs = " ".join(l["message"] for l in d.req("GET", "/v1/jobs/%d/logs" % tuned["id"])[1]["logs"])
    check("fine-tuning base version 1" in logs, "the log names the starting model: %s" % logs)
    check(tuned["model"] == {"name": "base", "version": 2}, "registered as base version 2: %s" % tuned["model"])
    check(d.wait_ready("base", 2), "base version 2 is served")
    v2 = d.infer("base", x, [3, 4], 2)
    check(v1 and v1 != v2 and max(abs(a - b) for a, b in zip(v1, v2)) < 0.5 * max(abs(a) for a in v1),
          "version 2 is near version 1, not equal to it")
    preds = [max(range(3), key=lambda c: v2[r * 3 + c]) for r in range(3)]
    check(preds == [0, 1, 2], "version 2 still classifies the prototypes: %s" % preds)


def test_repository_onnx(d):
    """A fine-tuned ONNX version fine-tuned again: it starts where (a) ended."""
    _, _, before = d.run_job({"model": {"repository": "cnn_ft"}, "data": idx_data(), "epochs": 1, "batch_size": 32,
                              "seed": 1, "optimizer": {"kind": "sgd", "lr": 1e-9}})
    job, steps, epochs = d.run_job({"model": {"repository": "cnn_ft"}, "data": idx_data(),
                                    "optimizer": {"kind": "adam", "lr": 0.001}, "epochs": 1, "batch_size": 32,
                                    "seed": 1, "register_as": "cnn_ft"})
    check(job["state"] == "succeeded" and job["model"] == {"name": "cnn_ft", "version": 2},
          "fine-tuning the ONNX repository version gives cnn_ft version 2: %s %s" % (job.get("error"), job["model"]))
    # An lr of 1e-9 leaves the weights where they were, so its validation loss is the starting
    # model's; the real job's first step must be about that good, not a random init's ~2.3.
    if before and steps:
        check(steps[0]["loss"] < 0.8 * math.log(10) and abs(steps[0]["loss"] - before[0]["valid_loss"]) < 0.5,
              "starts from version 1: first step loss %.4f, version 1's validation loss %.4f"
              % (steps[0]["loss"], before[0]["valid_loss"]))
    check(os.path.isfile(os.path.join(d.data, "models", "cnn_ft", "2", "model.onnx")), "version 2 is an ONNX file")


# ---- (c) bad specs -------------------------------------------------------------------------------

def test_bad_specs(d):
    base = {"data": idx_data(), "epochs": 1}
    shutil.copy(os.path.join(DATA, "train-labels.idx"), os.path.join(DATA, "labels.onnx"))
    outside = os.path.join(TMP, "outside.onnx")
    shutil.copy(os.path.join(DATA, "cnn.onnx"), outside)
    os.symlink(outside, os.path.join(DATA, "link.onnx"))
    cases = [
        ({"onnx": outside}, "model.onnx", "outside the data roots"),
        ({"onnx": os.path.join(DATA, "link.onnx")}, "model.onnx", "outside the data roots"),
        ({"onnx": os.path.join(DATA, "missing.onnx")}, "model.onnx", "No such file"),
        ({"onnx": os.path.join(DATA, "labels.onnx")}, "model.onnx", "not an ONNX model"),
        ({"onnx": os.path.join(DATA, "train.csv")}, "model.onnx", "not an ONNX model"),
        ({"onnx": DATA}, "model.onnx", "not a regular file"),
        ({"onnx": ""}, "model.onnx", ""),
        ({"repository": "nosuchmodel"}, "model.repository", "no model 'nosuchmodel'"),
        ({"repository": "../base"}, "model.repository", ""),
        ({"repository": "base", "version": 99}, "model.version", "no valid version 99"),
        ({"repository": "base", "version": "1"}, "model.version", ""),
        ({"repository": "base", "extra": 1}, "model.extra", "unknown field"),
    ]
    # The graph's input does not fit CSV rows: the submit's dry run refuses it, naming the input
    # and the rank the graph declares (checked before any node runs).
    st, j = d.req("POST", "/v1/jobs", {"model": {"onnx": os.path.join(DATA, "cnn.onnx")}, "epochs": 1,
                                       "data": {"type": "csv", "train": os.path.join(DATA, "train.csv")}})
    err = j.get("error", "") if isinstance(j, dict) else ""
    check(st == 400 and "model:" in err and "has 2 dims; the model expects 4" in err,
          "an ONNX graph that does not fit the data is refused at submit with its input named: %s %s" % (st, err))
    for model, field, words in cases:
        st, j = d.req("POST", "/v1/jobs", dict(base, model=model))
        err = j.get("error", "") if isinstance(j, dict) else ""
        check(st == 400 and field + ":" in err and words in err, "model %s -> 400 naming %s: %s %s"
              % (json.dumps(model)[:80], field, st, err))


def main():
    write_idx("train", 256, 1)
    valid = write_idx("valid", 64, 2)
    shutil.copy(os.path.join(FIX, "cnn.onnx"), os.path.join(DATA, "cnn.onnx"))
    d = Daemon("main")
    try:
        test_onnx_file(d, valid)
        test_repository_kiln(d)
        test_repository_onnx(d)
        test_bad_specs(d)
    finally:
        d.stop()
    # a sanitizer's report (a leak at exit included) makes kilnd exit non-zero
    check(d.proc.returncode == 0, "kilnd exits 0 after SIGTERM (%s); log %s" % (d.proc.returncode, d.log))
    if H.FAILURES:
        print("\n%d failure(s); logs in %s" % (len(H.FAILURES), TMP))
        for f in H.FAILURES:
            print("  -", f)
        sys.exit(1)
    H.cleanup()
    print("all fine-tuning tests passed")


if __name__ == "__main__":
    main()
