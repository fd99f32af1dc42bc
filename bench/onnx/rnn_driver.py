"""bench/onnx/rnn_driver.py KILN_RUNNER PYTHON DIR — the recurrent bench models of
tests/fixtures/gen_onnx_rnn.py (BENCH) in kiln (onnx-run) and ONNX Runtime (peers.py),
alternating rounds of fresh processes, each side keeping its best round (lowest median),
both on KILN_BENCH_THREADS threads (default 2); prints bench/run's JSON lines with the time
ratio ORT/kiln. A kiln output more than 1e-4 relative from ONNX Runtime's fails the entry
(exit 1) after the rows are printed, so a fast wrong answer cannot pass."""
import json
import os
import subprocess
import sys

runner, py, d = sys.argv[1:4]
peers = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers.py")
threads = os.environ.get("KILN_BENCH_THREADS", "2")
env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=threads, KILN_CPU_THREADS=threads,
           KILN_BENCH_THREADS=threads)
rounds = int(os.environ.get("KILN_BENCH_ROUNDS", "3"))
MODELS = []
for cell in ("lstm", "gru"):
    for layers in ("1u", "1b", "2u", "2b"):
        MODELS += [(f"{cell}_{layers}_small", 300), (f"{cell}_{layers}_large", 3)]
only = os.environ.get("KILN_BENCH_RNN")   # a comma-separated subset, for a quick look
if only:
    MODELS = [m for m in MODELS if m[0] in only.split(",")]


def run(cmd):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


bad = []
for name, n in MODELS:
    best = {}
    for r in range(rounds):
        for side in ("kiln", "ort"):
            if side == "kiln":
                res = run([runner, os.path.join(d, name + ".onnx"), os.path.join(d, name + ".io.safetensors"), str(n)])
            else:
                res = run([py, peers, side, d, name, str(n)])
            print(f"onnx_rnn: {name} round {r} {side}: {res}", file=sys.stderr, flush=True)
            if side not in best or res["ms"] < best[side]["ms"]:
                best[side] = res
    k, p = best["kiln"], best["ort"]
    if not k["err"] <= 1e-4:
        bad.append(f"{name}: kiln differs from ONNX Runtime by {k['err']:.3g} relative")
    row = {"name": f"onnx_rnn_{name}_vs_ort", "unit": "ms", "kiln": round(k["ms"], 4), "peer": round(p["ms"], 4),
           "peer_name": p["version"] + f" ({threads} threads, ORT_ENABLE_ALL)", "ratio": round(p["ms"] / k["ms"], 4),
           "target": 1.0, "kiln_err_vs_ort": k["err"]}
    print(json.dumps(row), flush=True)
for b in bad:
    print("onnx_rnn: PARITY FAILURE " + b, file=sys.stderr)
sys.exit(1 if bad else 0)
