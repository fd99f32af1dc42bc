"""bench/onnx/resample_driver.py KILN_RUNNER DIR — writes one-node GridSample and RoiAlign
models (onnx.helper) and their inputs into DIR, with ONNX Runtime's outputs, then alternates
rounds of kiln (KILN_RUNNER: bench/onnx/onnx-run, median of its runs) and ONNX Runtime (median
of as many runs) and prints bench/run's JSON lines with the best median of each side."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from safetensors.numpy import save_file

RUNNER, DIR = sys.argv[1], sys.argv[2]
THREADS = int(os.environ.get("KILN_CPU_THREADS") or os.cpu_count() or 1)
RUNS, ROUNDS = 20, 3
rng = np.random.default_rng(0)
F = TensorProto.FLOAT


def model(name, node, inputs):
    g = helper.make_graph([node], name, [helper.make_tensor_value_info(k, t, s) for k, t, s in inputs],
                          [helper.make_tensor_value_info("y", F, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)])
    m.ir_version = 8
    return m


def cases():
    x = rng.standard_normal((1, 32, 112, 112), dtype=np.float32)
    grid = (rng.random((1, 112, 112, 2), dtype=np.float32) * 2.2 - 1.1).astype(np.float32)
    for mode in ("bilinear", "nearest", "bicubic"):
        n = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode="zeros")
        yield ("gridsample_%s_1x32x112x112" % mode,
               model(mode, n, [("x", F, list(x.shape)), ("grid", F, list(grid.shape))]), {"x": x, "grid": grid})
    fmap = rng.standard_normal((2, 64, 50, 68), dtype=np.float32)
    corner = rng.random((200, 2), dtype=np.float32) * np.array([60, 42], dtype=np.float32)
    size = rng.random((200, 2), dtype=np.float32) * 20 + 2
    rois = np.concatenate([corner, corner + size], axis=1).astype(np.float32)
    batch = rng.integers(0, 2, 200).astype(np.int64)
    n = helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], output_height=7, output_width=7, sampling_ratio=2,
                         spatial_scale=1.0)
    yield ("roialign_200rois_2x64x50x68_7x7",
           model("roi", n, [("x", F, list(fmap.shape)), ("rois", F, [200, 4]), ("batch", TensorProto.INT64, [200])]),
           {"x": fmap, "rois": rois, "batch": batch})


def ort_session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def ort_median(sess, feeds):
    sess.run(None, feeds)
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def kiln_run(path, io):
    out = subprocess.run([RUNNER, path, io, str(RUNS)], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    os.makedirs(DIR, exist_ok=True)
    for name, m, feeds in cases():
        path, io = os.path.join(DIR, name + ".onnx"), os.path.join(DIR, name + ".io.safetensors")
        onnx.save(m, path)
        sess = ort_session(path)
        tensors = {"in." + k: v for k, v in feeds.items()}
        for o, r in zip(sess.get_outputs(), sess.run(None, feeds)):
            tensors["out." + o.name] = np.ascontiguousarray(r)
        save_file(tensors, io)
        best_k, best_o, err = float("inf"), float("inf"), 0.0
        for _ in range(ROUNDS):
            k = kiln_run(path, io)
            best_k, err = min(best_k, k["ms"]), max(err, k["err"])
            best_o = min(best_o, ort_median(sess, feeds))
        if err > 1e-4:
            raise SystemExit("%s: kiln differs from ONNX Runtime by %g" % (name, err))
        print(json.dumps({"name": "onnx_" + name + "_vs_ort", "unit": "ms", "kiln": round(best_k, 3),
                          "peer": round(best_o, 3),
                          "peer_name": "ONNX Runtime %s (%d threads, ORT_ENABLE_ALL)" % (ort.__version__, THREADS),
                          "ratio": round(best_o / best_k, 4), "kiln_err_vs_ort": err}), flush=True)


main()
