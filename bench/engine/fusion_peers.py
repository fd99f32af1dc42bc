#!/usr/bin/env python3
"""bench/engine/fusion_peers.py — fusion.bench's driver: kiln fused beside kiln unfused
(fusion-bench, whose rows it passes on), then the same rows' fused times beside PyTorch
eager and torch.compile (fusion_torch.py), measured right after in the same run, and the
fused rows once more after them (the peer rows use the mean of the two fused times).

    fusion_peers.py [FILTER]

The Python with torch is $KILN_BENCH_PYTHON, else .venv-bench/bin/python (bench/lib/venv.sh
makes it); without one the peer rows are skipped with a line on stderr. PyTorch runs at its
best settings: threads = cores (or KILN_CPU_THREADS, which kiln uses too),
OMP_WAIT_POLICY=PASSIVE. Both sides use wall time, or both the process's CPU time with
KILN_BENCH_CLOCK=cpu (with one thread each: the work alone, what a loaded machine can
still measure).
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
SRC = os.environ.get('KILN_SRC', os.path.dirname(os.path.dirname(HERE)))
BUILD = os.environ.get('KILN_BUILD_DIR', os.path.join(SRC, 'build-bench'))

# (row, torch mode): the targets for kiln fused against the peer
TARGETS = {
    ('gelu(x*a+b)*c 64MiB, a b c per column', 'compile'): 1.0,
}


def torch_python():
    for py in (os.environ.get('KILN_BENCH_PYTHON'), os.path.join(SRC, '.venv-bench', 'bin', 'python')):
        if py and os.access(py, os.X_OK) and subprocess.run([py, '-c', 'import torch'], capture_output=True).returncode == 0:
            return py
    return None


def main():
    args = sys.argv[1:2]
    fused = {}
    bench = os.path.join(BUILD, 'bench', 'engine', 'fusion-bench')
    proc = subprocess.run([bench] + args, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout.splitlines():
        print(line, flush=True)
        row = json.loads(line)
        fused[row['name'][len('fusion/'):]] = row['kiln']
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    py = torch_python()
    if not py:
        print('fusion_peers.py: no python with torch (bench/lib/venv.sh makes .venv-bench); peer rows skipped',
              file=sys.stderr)
        return
    # the fused times again after PyTorch's, so that a load that changed in between moves
    # both sides: the peer rows take the mean of the two
    again = subprocess.run([bench] + args, stdout=subprocess.PIPE, text=True)
    # as many threads as kiln's cpu device uses (KILN_CPU_THREADS, else the cores)
    threads = os.environ.get('KILN_CPU_THREADS') or str(os.cpu_count() or 1)
    env = dict(os.environ, OMP_WAIT_POLICY='PASSIVE', OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    peers = subprocess.run([py, os.path.join(HERE, 'fusion_torch.py')] + args, stdout=subprocess.PIPE, text=True,
                           env=env)
    if again.returncode == 0:
        for line in again.stdout.splitlines():
            row = json.loads(line)
            name = row['name'][len('fusion/'):]
            if name in fused:
                if abs(row['kiln'] - fused[name]) > 0.2 * fused[name]:
                    print(f'fusion_peers.py: {name}: fused {fused[name]:.2f} ms before PyTorch, {row["kiln"]:.2f} ms '
                          'after (the load changed)', file=sys.stderr)
                fused[name] = 0.5 * (fused[name] + row['kiln'])
    for line in peers.stdout.splitlines():
        t = json.loads(line)
        name, mode = t['name'], t['mode']
        if 'skipped' in t:
            print(f'fusion_peers.py: {name}: torch {mode} skipped: {t["skipped"]}', file=sys.stderr)
            continue
        if name not in fused:
            continue
        row = {'name': f'fusion/{name} vs torch {mode}', 'unit': 'ms', 'kiln': round(fused[name], 4), 'peer': t['ms'],
               'peer_name': f'PyTorch {t["torch"]} {"torch.compile" if mode == "compile" else "eager"} '
                            f'({threads} threads, OMP_WAIT_POLICY=PASSIVE'
                            f'{", CPU time" if os.environ.get("KILN_BENCH_CLOCK") == "cpu" else ""})',
               'ratio': round(t['ms'] / fused[name], 3)}
        if (name, mode) in TARGETS:
            row['target'] = TARGETS[(name, mode)]
        print(json.dumps(row), flush=True)
    if peers.returncode != 0:
        sys.exit(peers.returncode)


if __name__ == '__main__':
    main()
