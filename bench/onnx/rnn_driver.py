"""bench/onnx/rnn_driver.py KILN_RUNNER PYTHON DIR — the recurrent bench models of
tests/fixtures/gen_onnx_rnn.py (BENCH) in kiln (onnx-run) and ONNX Runtime (peers.py), in
alternating rounds (rounds.py, which also checks kiln's outputs against ONNX Runtime's), both
on KILN_BENCH_THREADS threads (default 2); prints bench/run's JSON lines with the time ratio
ORT/kiln."""
import json
import os

from rounds import Rounds

threads = os.environ.get("KILN_BENCH_THREADS", "2")
bench = Rounds("onnx_rnn", threads, {"KILN_CPU_THREADS": threads, "KILN_BENCH_THREADS": threads})
MODELS = []
for cell in ("lstm", "gru"):
    for layers in ("1u", "1b", "2u", "2b"):
        MODELS += [(f"{cell}_{layers}_small", 300), (f"{cell}_{layers}_large", 3)]
only = os.environ.get("KILN_BENCH_RNN")   # a comma-separated subset, for a quick look
if only:
    MODELS = [m for m in MODELS if m[0] in only.split(",")]

for name, n in MODELS:
    best = bench.best(name, n, ("ort",))
    k, p = best["kiln"], best["ort"]
    row = {"name": f"onnx_rnn_{name}_vs_ort", "unit": "ms", "kiln": round(k["ms"], 4), "peer": round(p["ms"], 4),
           "peer_name": p["version"] + f" ({threads} threads, ORT_ENABLE_ALL)", "ratio": round(p["ms"] / k["ms"], 4),
           "target": 1.0, "kiln_err_vs_ort": k["err"]}
    print(json.dumps(row), flush=True)
bench.finish()
