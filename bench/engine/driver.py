#!/usr/bin/env python3
"""bench/engine/driver.py — runs one group of engine benchmarks and prints bench/run's
JSON lines (docs/benchmarks.md): kiln's figure from engine-ops (built in
$KILN_BUILD_DIR/bench/engine), the peer from the same engine-ops run when it is a C
routine, or from torch_ops.py run with $KILN_BENCH_PYTHON (falling back to the fixtures
environment .venv-fixtures) when it is PyTorch.

    driver.py GROUP      GROUP: matmul | elementwise | norm | conv2d | max_pool2d

ratio = peer_ms / kiln_ms, so above 1 means kiln is faster.

PyTorch runs at its best settings: torch.set_num_threads(cores), OMP_WAIT_POLICY=PASSIVE
and, as its CPU performance guide recommends, jemalloc or tcmalloc preloaded when one is
installed (Debian: libjemalloc2, libtcmalloc-minimal4). With an allocator available the
torch figures are measured both with and without it and each row keeps the faster; the
peer_name says which won.

kiln and PyTorch take turns for KILN_BENCH_ROUNDS rounds (default 3) and each keeps its
best round, so a load spike on the shared machine cannot favour either side.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get('KILN_SRC') or os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get('KILN_BUILD_DIR') or os.path.join(SRC, 'build-bench')

# Targets from the engine's performance goals; rows below them are flagged by bench/run.
C_PEER_TARGET = {'matmul': 0.95, 'elementwise': 0.9}
TORCH_TARGET = {'elementwise': 1.0, 'norm': 1.0, 'conv2d': 0.8, 'max_pool2d': 1.5}


def python_for_torch():
    for py in (os.environ.get('KILN_BENCH_PYTHON'),
               os.path.join(SRC, '.venv-bench', 'bin', 'python'),
               os.path.join(SRC, '.venv-fixtures', 'bin', 'python')):
        if py and os.access(py, os.X_OK):
            ok = subprocess.run([py, '-c', 'import torch'], capture_output=True).returncode == 0
            if ok:
                return py
    sys.exit('driver.py: no python with torch (set KILN_BENCH_PYTHON or run tests/fixtures/venv.sh)')


def allocator_preloads():
    """Installed malloc replacements PyTorch's tuning guide suggests preloading."""
    found = []
    for d in ('/usr/lib/x86_64-linux-gnu', '/usr/lib/aarch64-linux-gnu', '/usr/lib64', '/usr/lib'):
        for name in ('libjemalloc.so.2', 'libtcmalloc_minimal.so.4', 'libtcmalloc.so.4'):
            path = os.path.join(d, name)
            if os.path.exists(path) and not any(os.path.basename(f) == name for f in found):
                found.append(path)
    return found


def run_lines(cmd, env=None):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, text=True)
    if proc.returncode != 0:
        sys.exit(f'driver.py: {" ".join(cmd)} exited with {proc.returncode}')
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def emit(name, kiln, peer, peer_name, target):
    row = {'name': name, 'unit': 'ms', 'kiln': round(kiln, 4), 'peer': round(peer, 4),
           'peer_name': peer_name, 'ratio': round(peer / kiln, 4), 'target': target}
    print(json.dumps(row), flush=True)


def main():
    group = sys.argv[1]
    exe = os.path.join(BUILD, 'bench', 'engine', 'engine-ops')
    if not os.access(exe, os.X_OK):
        sys.exit(f'driver.py: {exe} is missing (build {BUILD} first)')
    threads = str(os.cpu_count() or 1)
    kiln_env = dict(os.environ)
    # The machine is shared and its load drifts, so kiln and PyTorch take turns: ROUNDS
    # rounds of (kiln, then PyTorch in each allocator setting), and each side keeps its
    # best round. Neither side gets more attempts than the other per setting.
    rounds = int(os.environ.get('KILN_BENCH_ROUNDS', '3'))
    kiln_best = {}
    torch_rows = {}
    py = python_for_torch() if group in TORCH_TARGET else None
    env = dict(os.environ, OMP_WAIT_POLICY='PASSIVE', OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    for _ in range(rounds):
        for r in run_lines([exe, group], env=kiln_env):
            best = kiln_best.setdefault(r['name'], dict(r))
            best['kiln'] = min(best['kiln'], r['kiln'])
            if 'peer' in r:  # the in-process C peer keeps its own best round too
                best['peer'] = min(best['peer'], r['peer'])
        if py is None:
            continue
        for preload in [None] + allocator_preloads():
            run_env = dict(env)
            if preload:
                run_env['LD_PRELOAD'] = preload
            label = ', ' + os.path.basename(preload).split('.')[0][3:] if preload else ''
            for r in run_lines([py, os.path.join(HERE, 'torch_ops.py'), group], env=run_env):
                r['setting'] = label
                best = torch_rows.get(r['name'])
                if best is None or r['ms'] < best['ms']:
                    torch_rows[r['name']] = r
    kiln_rows = list(kiln_best.values())
    for r in kiln_rows:
        name = r['name']
        if 'peer' in r:
            suffix = '_vs_c' if name in ('add_f32_16M', 'gelu_f32_16M') else ''
            emit(name + suffix, r['kiln'], r['peer'], r['peer_name'], C_PEER_TARGET.get(group))
        t = torch_rows.get(name)
        if t:
            suffix = '_vs_torch' if 'peer' in r else ''
            emit(name + suffix, r['kiln'], t['ms'],
                 f'PyTorch {t["torch"]} ({threads} threads, inference_mode, OMP_WAIT_POLICY=PASSIVE{t["setting"]})',
                 TORCH_TARGET[group])


if __name__ == '__main__':
    main()
