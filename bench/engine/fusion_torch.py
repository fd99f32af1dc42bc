#!/usr/bin/env python3
"""bench/engine/fusion_torch.py — PyTorch's times for the rows of fusion-bench.c, eager and
through torch.compile (TorchInductor's generated C++ for the CPU), at PyTorch's best
settings: torch.set_num_threads(cores, or OMP_NUM_THREADS), OMP_WAIT_POLICY=PASSIVE in the
environment (the caller, fusion_peers.py, sets it), inference_mode for the op rows.
KILN_BENCH_CLOCK=cpu times the process's CPU time instead of wall time.

    python fusion_torch.py [FILTER]

Prints one JSON object per line: {"name": row, "mode": "eager" | "compile", "ms": median
milliseconds, "torch": version}; a mode that cannot run here prints {"name", "mode",
"skipped": reason} instead. Shapes, value ranges and steps match fusion-bench.c's
workloads; torch.compile's first calls (compilation) are not timed. KILN_BENCH_SECONDS
bounds the time per figure.
"""
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# KILN_BENCH_CLOCK=cpu: the process's CPU time, as fusion-bench measures it then (with one
# thread each, the work alone, steady on a shared and loaded machine)
clock = time.process_time if os.environ.get('KILN_BENCH_CLOCK') == 'cpu' else time.perf_counter


def measure(fn, budget_scale=1.0):
    budget = float(os.environ.get('KILN_BENCH_SECONDS', '1.5')) * budget_scale
    for _ in range(2):
        fn()
    t0 = clock()
    fn()
    per = clock() - t0
    reps = max(5, min(51, int(budget / max(per, 1e-6))))
    times = []
    for _ in range(reps):
        s = clock()
        fn()
        times.append((clock() - s) * 1e3)
    times.sort()
    return times[len(times) // 2]


def emit(name, mode, ms=None, skipped=None):
    row = {'name': name, 'mode': mode, 'torch': torch.__version__}
    if skipped is None:
        row['ms'] = round(ms, 4)
    else:
        row['skipped'] = skipped
    print(json.dumps(row), flush=True)


def rand(g, *shape, lo=-2.0, hi=2.0):
    return torch.rand(*shape, generator=g) * (hi - lo) + lo


def op_rows(want):
    g = torch.Generator().manual_seed(42)
    rows = []
    x = rand(g, 4096, 4096)
    a, b, c = rand(g, 4096), rand(g, 4096), rand(g, 4096)
    rows.append(('gelu(x*a+b)*c 64MiB, a b c per column', lambda x, a, b, c: F.gelu(x * a + b) * c, (x, a, b, c)))
    af, bf, cf = rand(g, 4096, 4096), rand(g, 4096, 4096), rand(g, 4096, 4096)
    rows.append(('gelu(x*a+b)*c 64MiB, a b c full', lambda x, a, b, c: F.gelu(x * a + b) * c, (x, af, bf, cf)))
    lx, lr, lw, lb = rand(g, 8192, 768), rand(g, 8192, 768), rand(g, 768), rand(g, 768)
    rows.append(('layer_norm(x+r)+dropout [8192,768]',
                 lambda x, r, w, b: F.dropout(F.layer_norm(x + r, (768,), w, b, 1e-5), 0.1, training=True),
                 (lx, lr, lw, lb)))
    rows.append(('layer_norm(x+r) [8192,768]', lambda x, r, w, b: F.layer_norm(x + r, (768,), w, b, 1e-5),
                 (lx, lr, lw, lb)))
    q, k = rand(g, 96, 128, 64), rand(g, 96, 128, 64)
    rows.append(('softmax(QK^T/sqrt(d)) [96,128,128]', lambda q, k: torch.softmax((q @ k.transpose(-2, -1)) / 8.0, -1),
                 (q, k)))
    lx, lw, lb = rand(g, 2048, 1024), rand(g, 1024, 4096), rand(g, 4096)
    rows.append(('gelu(x@W+b) [2048,1024]x[1024,4096]', lambda x, w, b: F.gelu(x @ w + b), (lx, lw, lb)))
    for name, fn, args in rows:
        if want and want not in name:
            continue
        with torch.inference_mode():
            emit(name, 'eager', measure(lambda: fn(*args)))
            try:
                compiled = torch.compile(fn)
                emit(name, 'compile', measure(lambda: compiled(*args)))
            except Exception as e:  # no C++ toolchain, an inductor failure: say so
                emit(name, 'compile', skipped=f'{type(e).__name__}: {str(e).splitlines()[0][:160]}')


class CNN(nn.Module):
    """fusion-bench.c's cnn_spec: 2 conv (+relu, maxpool), 2 fc."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(3136, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def train_rows(want):
    g = torch.Generator().manual_seed(9)
    specs = [('train step Fashion-MNIST CNN b64 Adam', True), ('train step Transformer block d256 s128 b16 Adam', False)]
    for name, cnn in specs:
        if want and want not in name:
            continue
        torch.manual_seed(3)
        if cnn:
            model = CNN()
            x = torch.rand(64, 1, 28, 28, generator=g)
            y = torch.randint(0, 10, (64,), generator=g)
        else:
            model = nn.TransformerEncoderLayer(256, 4, 1024, 0.1, activation='gelu', batch_first=True)
            x = torch.randn(16, 128, 256, generator=g)
            y = None
        for mode in ('eager', 'compile'):
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            try:
                fwd = torch.compile(model) if mode == 'compile' else model

                def step():
                    out = fwd(x)
                    loss = F.cross_entropy(out, y) if cnn else (out * out).mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    return loss.item()

                emit(name, mode, measure(step, 2.0))
            except Exception as e:
                emit(name, mode, skipped=f'{type(e).__name__}: {str(e).splitlines()[0][:160]}')


def infer_rows(want):
    """fusion-bench.c's inference rows: torchvision's ResNet-50 (the layout bench-resnet.c
    builds), batch norms calibrated on one batch of two (momentum 1) then eval mode, under
    inference_mode; eager and torch.compile."""
    try:
        import torchvision
    except ImportError as e:
        for b in (1, 8):
            name = f'inference ResNet-50 b{b} 224x224'
            if not want or want in name:
                for mode in ('eager', 'compile'):
                    emit(name, mode, skipped=f'no torchvision: {e}')
        return
    for b in (1, 8):
        name = f'inference ResNet-50 b{b} 224x224'
        if want and want not in name:
            continue
        torch.manual_seed(3)
        model = torchvision.models.resnet50(weights=None)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.momentum = 1.0
        g = torch.Generator().manual_seed(11)
        with torch.no_grad():
            model.train()
            model(torch.randn(2, 3, 224, 224, generator=g))
        model.eval()
        x = torch.randn(b, 3, 224, 224, generator=g)
        for mode in ('eager', 'compile'):
            try:
                fwd = torch.compile(model) if mode == 'compile' else model
                with torch.inference_mode():
                    emit(name, mode, measure(lambda: fwd(x)[0, 0].item(), 2.0))
            except Exception as e:
                emit(name, mode, skipped=f'{type(e).__name__}: {str(e).splitlines()[0][:160]}')


def main():
    torch.set_num_threads(int(os.environ.get('OMP_NUM_THREADS') or os.cpu_count() or 1))
    want = sys.argv[1] if len(sys.argv) > 1 else None
    op_rows(want)
    train_rows(want)
    infer_rows(want)


if __name__ == '__main__':
    main()
