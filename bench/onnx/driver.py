"""bench/onnx/driver.py KILN_RUNNER PYTHON DIR — for each bench model, alternate rounds of kiln
(onnx-run), ONNX Runtime and PyTorch eager (peers.py; rounds.py runs them and checks kiln's
outputs against ONNX Runtime's), then print bench/run's JSON lines: time ratios ORT/kiln and
PyTorch/kiln, and peak resident memory ratios."""
import json
import os

from rounds import Rounds

bench = Rounds("onnx", str(os.cpu_count() or 1))
MODELS = [("resnet50_b1", 10), ("resnet50_b8", 3), ("bert", 5), ("mobilenetv3_full", 30)]
TARGET = {"ort": 0.8, "torch": 1.0}

for name, n in MODELS:
    best = bench.best(name, n, ("ort", "torch"))
    k = best["kiln"]
    for side in ("ort", "torch"):
        p = best[side]
        peer = p["version"] + f" ({bench.threads} threads" + (", ORT_ENABLE_ALL)" if side == "ort" else ", inference_mode)")
        for metric, unit, suffix in (("ms", "ms", ""), ("rss_mb", "MiB", "_peak_rss")):
            row = {"name": f"onnx_{name}_vs_{side}{suffix}", "unit": unit, "kiln": round(k[metric], 3),
                   "peer": round(p[metric], 3), "peer_name": peer,
                   "ratio": round(p[metric] / k[metric], 4), "kiln_err_vs_ort": k["err"]}
            if metric == "ms":
                row["target"] = TARGET[side]
            print(json.dumps(row), flush=True)
bench.finish()
