#!/usr/bin/env python3
"""bench/engine/torch_ops.py — PyTorch's times for the engine benchmarks, at its best
settings: torch.set_num_threads(cores), inference_mode, ops written out-of-place as users
write them. Run with OMP_WAIT_POLICY=PASSIVE in the environment (driver.py sets it).

    python torch_ops.py GROUP     GROUP: elementwise | norm | conv2d | max_pool2d

Prints one JSON object per line: {"name": ..., "ms": median milliseconds, "torch": version}.
Shapes and values match engine-ops.c. KILN_BENCH_SECONDS bounds the time per figure.
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F


# name, batch, in and out channels, height, width, kernel, stride, padding, groups: the
# table in engine-ops.c
CONV_SHAPES = [
    ('conv2d_f32_3x3_b8_64to64_56x56', 8, 64, 64, 56, 56, 3, 1, 1, 1),
    ('conv2d_f32_1x1_b1_64to256_56x56', 1, 64, 256, 56, 56, 1, 1, 0, 1),
    ('conv2d_f32_1x1_b1_256to64_56x56', 1, 256, 64, 56, 56, 1, 1, 0, 1),
    ('conv2d_f32_1x1_s2_b1_256to512_56x56', 1, 256, 512, 56, 56, 1, 2, 0, 1),
    ('conv2d_f32_1x1_b1_1024to256_14x14', 1, 1024, 256, 14, 14, 1, 1, 0, 1),
    ('conv2d_f32_3x3_b1_64to64_56x56', 1, 64, 64, 56, 56, 3, 1, 1, 1),
    ('conv2d_f32_3x3_b1_128to128_28x28', 1, 128, 128, 28, 28, 3, 1, 1, 1),
    ('conv2d_f32_3x3_s2_b1_128to128_56x56', 1, 128, 128, 56, 56, 3, 2, 1, 1),
    ('conv2d_f32_3x3_b1_256to256_14x14', 1, 256, 256, 14, 14, 3, 1, 1, 1),
    ('conv2d_f32_7x7_s2_b1_3to64_224x224', 1, 3, 64, 224, 224, 7, 2, 3, 1),
    ('conv2d_f32_3x3_s2_b1_3to16_224x224', 1, 3, 16, 224, 224, 3, 2, 1, 1),
    ('conv2d_f32_dw3x3_s2_b1_16_112x112', 1, 16, 16, 112, 112, 3, 2, 1, 16),
    ('conv2d_f32_dw3x3_b1_88_28x28', 1, 88, 88, 28, 28, 3, 1, 1, 88),
    ('conv2d_f32_dw5x5_s2_b1_96_28x28', 1, 96, 96, 28, 28, 5, 2, 2, 96),
    ('conv2d_f32_dw5x5_b1_240_14x14', 1, 240, 240, 14, 14, 5, 1, 2, 240),
    ('conv2d_f32_dw5x5_b1_576_7x7', 1, 576, 576, 7, 7, 5, 1, 2, 576),
]


def measure(fn):
    budget = float(os.environ.get('KILN_BENCH_SECONDS', '1.5'))
    t0 = time.perf_counter()
    for _ in range(2):
        fn()
    per = (time.perf_counter() - t0) / 2
    reps = max(5, min(51, int(budget / max(per, 1e-6))))
    times = []
    for _ in range(reps):
        s = time.perf_counter()
        fn()
        times.append((time.perf_counter() - s) * 1e3)
    times.sort()
    return times[len(times) // 2] if reps % 2 else 0.5 * (times[reps // 2 - 1] + times[reps // 2])


def emit(name, ms):
    print(json.dumps({'name': name, 'ms': round(ms, 4), 'torch': torch.__version__}), flush=True)


def main():
    torch.set_num_threads(os.cpu_count() or 1)
    group = sys.argv[1]
    g = torch.Generator().manual_seed(0)

    def rand(*shape, lo=-1.0, hi=1.0):
        return torch.rand(*shape, generator=g) * (hi - lo) + lo

    with torch.inference_mode():
        if group == 'elementwise':
            n = 16 << 20
            a, b = rand(n, lo=-4, hi=4), rand(n, lo=-4, hi=4)
            emit('add_f32_16M', measure(lambda: a + b))
            emit('gelu_f32_16M', measure(lambda: F.gelu(a)))
            mask = torch.empty(n)
            emit('bernoulli_f32_16M', measure(lambda: mask.bernoulli_(0.9, generator=g)))
        elif group == 'norm':
            x = rand(4096, 1024, lo=-4, hi=4)
            w, b = rand(1024, lo=0.5, hi=1.5), rand(1024)
            emit('softmax_f32_4096x1024', measure(lambda: torch.softmax(x, -1)))
            emit('layer_norm_f32_4096x1024', measure(lambda: F.layer_norm(x, (1024,), w, b, 1e-5)))
        elif group == 'conv2d':
            for name, n, c, o, h, w_, k, stride, pad, groups in CONV_SHAPES:
                x, w, b = rand(n, c, h, w_), rand(o, c // groups, k, k, lo=-0.1, hi=0.1), rand(o)
                emit(name, measure(lambda: F.conv2d(x, w, b, stride=stride, padding=pad, groups=groups)))
        elif group == 'max_pool2d':
            x = rand(2, 32, 512, 512)
            emit('max_pool2d_f32_2x2_2x32x512x512', measure(lambda: F.max_pool2d(x, 2)))
            emit('max_pool2d_indices_f32_2x2_2x32x512x512',
                 measure(lambda: F.max_pool2d(x, 2, return_indices=True)))
        else:
            sys.exit(f'torch_ops.py: unknown group {group}')


if __name__ == '__main__':
    main()
