"""bench/onnx/peers.py ort|torch DIR NAME [RUNS] — time one bench model in ONNX Runtime or in
PyTorch eager, at each one's best settings, and print one JSON line {"ms" (median), "min_ms",
"rss_mb" (peak resident set of this process), "version", "err" (ORT only: against the
outputs stored when the model was generated)}.

ONNX Runtime: CPU execution provider, intra_op_num_threads = cores, inter-op 1, graph
optimizations ORT_ENABLE_ALL, sequential execution
(KILN_BENCH_THREADS, when set, replaces the core count). PyTorch: the model rebuilt from
tests/fixtures/gen_onnx_models.py with the exported weights (NAME.pt),
torch.set_num_threads(cores), inference_mode; OMP_WAIT_POLICY=PASSIVE comes from the
driver's environment. Both warm up twice, as kiln's runner does.
"""
import json
import os
import resource
import statistics
import sys
import time

import numpy as np

side, d, name = sys.argv[1:4]
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 10
threads = int(os.environ.get("KILN_BENCH_THREADS", 0)) or os.cpu_count() or 1


def load_io():
    from safetensors.numpy import load_file
    io = load_file(os.path.join(d, name + ".io.safetensors"))
    feeds = {k[3:]: v for k, v in io.items() if k.startswith("in.")}
    outs = {k[4:]: v for k, v in io.items() if k.startswith("out.")}
    return feeds, outs


def timed(fn):
    for _ in range(2):
        fn()
    t = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = fn()
        t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t), min(t), r


feeds, want = load_io()
res = {}
if side == "ort":
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(os.path.join(d, name + ".onnx"), so, providers=["CPUExecutionProvider"])
    ms, mn, out = timed(lambda: sess.run(None, feeds))
    err = 0.0
    for o, r in zip(sess.get_outputs(), out):
        w = want[o.name]
        err = max(err, float(np.max(np.abs(r - w)) / max(float(np.max(np.abs(w))), 1e-12)))
    res = {"version": "ONNX Runtime " + ort.__version__, "err": err}
else:
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures"))
    import gen_onnx_models as gen
    torch.set_num_threads(threads)
    m, _ = gen.large_model(name)
    m.load_state_dict(torch.load(os.path.join(d, name + ".pt")))
    args = [torch.from_numpy(v) for v in feeds.values()]
    with torch.inference_mode():
        ms, mn, _ = timed(lambda: m(*args))
    res = {"version": "PyTorch " + torch.__version__.split("+")[0]}
res.update(ms=ms, min_ms=mn, rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
print(json.dumps(res), flush=True)
