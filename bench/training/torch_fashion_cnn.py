"""bench/training/torch_fashion_cnn.py — the PyTorch side of fashion_cnn.bench: one epoch
of the same CNN as examples/fashion_mnist.c (conv 32 + BN + ReLU + pool, conv 64 + BN +
ReLU + pool, fc 128, fc 10) on the same Fashion-MNIST IDX files, batch 64, Adam 1e-3 with
a per-step cosine decay over the epoch, the same normalization, 2 threads. Prints one
JSON object: epoch_seconds, test_accuracy, peak_rss_mb.

    python torch_fashion_cnn.py DATA_DIR [EPOCHS]
"""
import gzip
import json
import resource
import sys
import time

import numpy as np
import torch
from torch import nn


def idx(path):
    with gzip.open(path, 'rb') as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    data = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    torch.set_num_threads(2)
    torch.manual_seed(42)
    norm = lambda a: torch.from_numpy(((a.astype(np.float32) / 255.0) - 0.2860) / 0.3530).unsqueeze(1)
    xtr, ytr = norm(idx(data + '/train-images-idx3-ubyte.gz')), torch.from_numpy(idx(data + '/train-labels-idx1-ubyte.gz').astype(np.int64))
    xte, yte = norm(idx(data + '/t10k-images-idx3-ubyte.gz')), torch.from_numpy(idx(data + '/t10k-labels-idx1-ubyte.gz').astype(np.int64))
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = (len(xtr) + 63) // 64
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * steps)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1234)
    secs = 0.0
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(xtr), generator=g)
        t0 = time.perf_counter()
        for b in range(steps):
            i = perm[b * 64:(b + 1) * 64]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xtr[i]), ytr[i])
            loss.backward()
            opt.step()
            sched.step()
        secs = time.perf_counter() - t0
    model.eval()
    correct = 0
    with torch.no_grad():
        for b in range(0, len(xte), 500):
            correct += (model(xte[b:b + 500]).argmax(1) == yte[b:b + 500]).sum().item()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({'epoch_seconds': secs, 'test_accuracy': correct / len(xte), 'peak_rss_mb': rss}))


if __name__ == '__main__':
    main()
