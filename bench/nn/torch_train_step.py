"""bench/nn/torch_train_step.py — PyTorch's side of bench/nn/train-step.c: the same
models, the same step (forward, cross-entropy, backward, AdamW), timed the same way.

    torch_train_step.py transformer|cnn [STEPS]

Prints {"name", "ms" (median step), "rss_mb" (peak resident set of this process),
"torch"}. Run with threads = cores and OMP_WAIT_POLICY=PASSIVE by train_step.bench.
"""
import json
import os
import resource
import statistics
import sys
import time

import torch
from torch import nn

which = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else (10 if which == 'transformer' else 20)
torch.set_num_threads(os.cpu_count() or 1)
torch.manual_seed(1)

if which == 'transformer':
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, dropout=0.0,
                                               batch_first=True, activation='relu', norm_first=False)
            # enable_nested_tensor only matters with padding masks; the fast path is for inference
            self.encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
            self.head = nn.Linear(256, 10)

        def forward(self, x):
            return self.head(self.encoder(x).mean(dim=1))
    model = Model()
    x = torch.randn(16, 64, 256)
    y = torch.randint(0, 10, (16,))
elif which == 'cnn':
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    x = torch.randn(64, 1, 28, 28)
    y = torch.randint(0, 10, (64,))
else:
    sys.exit('usage: torch_train_step.py transformer|cnn [STEPS]')

opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
loss_fn = nn.CrossEntropyLoss()
times = []
for s in range(3 + steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    loss = loss.detach()
    opt.step()
    dt = (time.perf_counter() - t0) * 1e3
    if s >= 3:
        times.append(dt)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
print(json.dumps({'name': f'{which}_train_step', 'ms': statistics.median(times), 'rss_mb': rss,
                  'loss': loss.item(), 'torch': torch.__version__}))
