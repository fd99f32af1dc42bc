#!/usr/bin/env python3
"""Checks onnx_resize.c's reference against ONNX Runtime (not run by the suite: it needs
onnxruntime). Usage:

    onnx_resize cpu --dump DIR && python resize_ort_check.py DIR

Each DIR/NAME.onnx runs on the input onnx_resize used (regenerated here with the same
generator) and its output is compared with DIR/NAME.f32, the test's reference."""
import glob
import os
import sys

import numpy as np
import onnxruntime as ort


def test_input():
    seed, vals = 12345, []
    for _ in range(1 * 2 * 5 * 7):
        seed = (seed * 1664525 + 1013904223) & 0xFFFFFFFF
        vals.append(np.float32(seed >> 8) / np.float32(1 << 24) * np.float32(4.0) - np.float32(2.0))
    return np.array(vals, dtype=np.float32).reshape(1, 2, 5, 7)


def main(d):
    x, worst, bad = test_input(), 0.0, 0
    paths = sorted(glob.glob(os.path.join(d, '*.onnx')))
    for p in paths:
        want = np.fromfile(p[:-5] + '.f32', dtype=np.float32)
        try:
            sess = ort.InferenceSession(p, providers=['CPUExecutionProvider'])
            got = sess.run(None, {'x': x})[0].ravel()
        except Exception as e:  # a model ONNX Runtime refuses is the test's bug
            bad += 1
            print('FAILS', os.path.basename(p), str(e)[:200])
            continue
        err = np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))) if got.size == want.size else np.inf
        worst = max(worst, err)
        if err > 1e-6:
            bad += 1
            print('DIFFERS', os.path.basename(p), err)
    print('%d models, %d differ, worst relative difference %.3g' % (len(paths), bad, worst))
    return 1 if bad or not paths else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
