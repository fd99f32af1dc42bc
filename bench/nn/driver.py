"""bench/nn/driver.py KILN_EXE PYTHON TORCH_SCRIPT — runs each workload of train-step.c
and torch_train_step.py in turns (KILN_BENCH_ROUNDS rounds, default 2, each side keeping
its best step time), and prints bench/run's JSON lines: the step time (ratio
torch/kiln) and the peak resident memory (ratio torch/kiln), both above 1 when kiln is
better."""
import json
import os
import subprocess
import sys

kiln_exe, py, script = sys.argv[1:4]
threads = str(os.cpu_count() or 1)
torch_env = dict(os.environ, OMP_WAIT_POLICY='PASSIVE', OMP_NUM_THREADS=threads)
rounds = int(os.environ.get('KILN_BENCH_ROUNDS', '2'))
TARGET = {'transformer': 1.0, 'cnn': 1.0}


def run(cmd, env=None):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


for work in ('transformer', 'cnn'):
    kiln = torch = None
    for _ in range(rounds):
        k = run([kiln_exe, work])
        t = run([py, script, work], torch_env)
        kiln = k if kiln is None or k['ms'] < kiln['ms'] else kiln
        torch = t if torch is None or t['ms'] < torch['ms'] else torch
    peer = f"PyTorch {torch['torch']} ({threads} threads, OMP_WAIT_POLICY=PASSIVE)"
    for metric, unit in (('ms', 'ms'), ('rss_mb', 'MiB')):
        name = f'{work}_train_step' + ('' if metric == 'ms' else '_peak_rss')
        row = {'name': name, 'unit': unit, 'kiln': round(kiln[metric], 3), 'peer': round(torch[metric], 3),
               'peer_name': peer, 'ratio': round(torch[metric] / kiln[metric], 4), 'target': TARGET[work]}
        print(json.dumps(row), flush=True)
