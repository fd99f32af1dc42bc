#!/usr/bin/env python3
"""Writes backends/cpu/cpu-gelu-table.h: the piecewise polynomials of the AVX-512 gelu.

q(u) = erfc(u) / 2 (so gelu(x) = x - x*q(|x|/sqrt2) for x > 0 and x*q(|x|/sqrt2) otherwise)
is fitted on 32 segments of width 1/4 covering u in [0, 8), one polynomial of degree 8 per
segment in the local variable s = 4u - k - 1/2 in [-1/2, 1/2]. Each fit minimizes the
relative error (least squares at Chebyshev nodes, reweighted toward the minimax error), so
the tail where q is tiny keeps its relative accuracy. The exact fits are within 1e-9
relative; evaluated in f32 the error is set by f32 rounding (see cpu-math512.h).

Usage: gelu-table.py > backends/cpu/cpu-gelu-table.h    (needs numpy)
"""
import math

import numpy as np

SEGMENTS, WIDTH, DEGREE = 32, 0.25, 8


def fit(k):
    n = 600
    s = np.cos(np.pi * (np.arange(n) + 0.5) / n) * 0.5
    u = k * WIDTH + (s + 0.5) * WIDTH
    q = np.array([0.5 * math.erfc(v) for v in u])
    v = np.vander(s, DEGREE + 1, increasing=True)
    w, lw = 1 / q, np.ones(n)
    for _ in range(40):
        sw = np.sqrt(lw)
        c = np.linalg.lstsq(v * (w * sw)[:, None], q * w * sw, rcond=None)[0]
        err = np.abs(v @ c - q) * w
        lw = lw * err
        lw /= lw.sum()
    return c


def main():
    coefs = np.array([fit(k) for k in range(SEGMENTS)]).T  # [DEGREE + 1][SEGMENTS]
    print("/* backends/cpu/cpu-gelu-table.h — written by backends/cpu/tools/gelu-table.py; do not edit.")
    print(" * Row j holds the coefficient of s^j of each of the %d segments of erfc(u)/2. */" % SEGMENTS)
    print("#ifndef KILN_CPU_GELU_TABLE_H")
    print("#define KILN_CPU_GELU_TABLE_H")
    print()
    print("#define KZ_GELU_SEGMENTS %d" % SEGMENTS)
    print("#define KZ_GELU_DEGREE %d" % DEGREE)
    print()
    print("/* clang-format off */")
    print("static const float kz_gelu_q[KZ_GELU_DEGREE + 1][KZ_GELU_SEGMENTS] __attribute__((aligned(64))) = {")
    for row in coefs:
        vals = ["%.9ef" % np.float32(x) for x in row]
        print("    {")
        for i in range(0, len(vals), 4):
            print("        " + ", ".join(vals[i:i + 4]) + ",")
        print("    },")
    print("};")
    print("/* clang-format on */")
    print()
    print("#endif /* KILN_CPU_GELU_TABLE_H */")


if __name__ == "__main__":
    main()
