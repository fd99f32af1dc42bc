"""bench/onnx/rounds.py — what the ONNX bench drivers (driver.py, rnn_driver.py) share.

A driver is started as DRIVER KILN_RUNNER PYTHON DIR. For each bench model it alternates
rounds of fresh processes, kiln (KILN_RUNNER, bench/onnx/onnx-run) and each peer (peers.py
under PYTHON), each side keeping its best round (lowest median); kiln's output must be within
1e-4 relative of ONNX Runtime's, or the model is a parity failure: the driver prints its rows
anyway and finish() exits 1 at the end, so a fast wrong answer cannot pass."""
import json
import os
import subprocess
import sys

PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers.py")
PARITY = 1e-4


class Rounds:
    """tag prefixes the progress lines on stderr; threads (a string) is what OpenMP, and
    whatever else the caller puts in extra_env, are told to use."""

    def __init__(self, tag, threads, extra_env=None):
        self.runner, self.py, self.dir = sys.argv[1:4]
        self.tag = tag
        self.threads = threads
        self.env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=threads, **(extra_env or {}))
        self.rounds = int(os.environ.get("KILN_BENCH_ROUNDS", "3"))
        self.bad = []

    def _run(self, cmd):
        out = subprocess.run(cmd, stdout=subprocess.PIPE, env=self.env, text=True, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    def best(self, name, n, peers):
        """{side: its best round's result} for "kiln" and each of peers, n runs a round."""
        best = {}
        for r in range(self.rounds):
            for side in ("kiln",) + tuple(peers):
                if side == "kiln":
                    res = self._run([self.runner, os.path.join(self.dir, name + ".onnx"),
                                     os.path.join(self.dir, name + ".io.safetensors"), str(n)])
                else:
                    res = self._run([self.py, PEERS, side, self.dir, name, str(n)])
                print(f"{self.tag}: {name} round {r} {side}: {res}", file=sys.stderr, flush=True)
                if side not in best or res["ms"] < best[side]["ms"]:
                    best[side] = res
        if not best["kiln"]["err"] <= PARITY:
            self.bad.append(f"{name}: kiln differs from ONNX Runtime by {best['kiln']['err']:.3g} relative")
        return best

    def finish(self):
        for b in self.bad:
            print(f"{self.tag}: PARITY FAILURE " + b, file=sys.stderr)
        sys.exit(1 if self.bad else 0)
