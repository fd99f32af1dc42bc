"""bench/onnx/driver.py KILN_RUNNER PYTHON DIR — for each bench model, alternate rounds of kiln
(onnx-run), ONNX Runtime and PyTorch eager (peers.py), each a fresh process, each side keeping
its best round (lowest median); then print bench/run's JSON lines: time ratios ORT/kiln and
PyTorch/kiln, and peak resident memory ratios. A kiln output that differs from ONNX
Runtime's by more than 1e-4 relative fails the entry (exit 1) after printing what it has,
so a fast wrong answer cannot pass."""
import json
import os
import subprocess
import sys

runner, py, d = sys.argv[1:4]
peers = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers.py")
threads = str(os.cpu_count() or 1)
env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=threads)
rounds = int(os.environ.get("KILN_BENCH_ROUNDS", "3"))
MODELS = [("resnet50_b1", 10), ("resnet50_b8", 3), ("bert", 5), ("mobilenetv3_full", 30)]
TARGET = {"ort": 0.8, "torch": 1.0}


def run(cmd):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


bad = []
for name, n in MODELS:
    best = {}
    for r in range(rounds):
        for side in ("kiln", "ort", "torch"):
            if side == "kiln":
                res = run([runner, os.path.join(d, name + ".onnx"), os.path.join(d, name + ".io.safetensors"), str(n)])
            else:
                res = run([py, peers, side, d, name, str(n)])
            print(f"onnx: {name} round {r} {side}: {res}", file=sys.stderr, flush=True)
            if side not in best or res["ms"] < best[side]["ms"]:
                best[side] = res
    k = best["kiln"]
    if not k["err"] <= 1e-4:
        bad.append(f"{name}: kiln differs from ONNX Runtime by {k['err']:.3g} relative")
    for side in ("ort", "torch"):
        p = best[side]
        peer = p["version"] + f" ({threads} threads" + (", ORT_ENABLE_ALL)" if side == "ort" else ", inference_mode)")
        for metric, unit, suffix in (("ms", "ms", ""), ("rss_mb", "MiB", "_peak_rss")):
            row = {"name": f"onnx_{name}_vs_{side}{suffix}", "unit": unit, "kiln": round(k[metric], 3),
                   "peer": round(p[metric], 3), "peer_name": peer,
                   "ratio": round(p[metric] / k[metric], 4), "kiln_err_vs_ort": k["err"]}
            if metric == "ms":
                row["target"] = TARGET[side]
            print(json.dumps(row), flush=True)
for b in bad:
    print("onnx: PARITY FAILURE " + b, file=sys.stderr)
sys.exit(1 if bad else 0)
