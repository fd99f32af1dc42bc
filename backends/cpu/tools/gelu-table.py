#!/usr/bin/env python3
"""Writes backends/cpu/cpu-gelu-table.h: the piecewise polynomials of the AVX-512 gelu.

q(u) = erfc(u) / 2 (so gelu(x) = x - x*q(|x|/sqrt2) for x > 0 and x*q(|x|/sqrt2) otherwise)
is fitted piecewise, one polynomial per segment in the local variable s in [-1/2, 1/2]
(the segment's position scaled to its width, less its index and 1/2): for AVX-512 on 32
segments of width 1/4 covering u in [0, 8), degree 8; for AVX2 on 8 segments of width 1/2
covering [0, 4), degree 9. Each fit minimizes the
relative error (least squares at Chebyshev nodes, reweighted toward the minimax error), so
the tail where q is tiny keeps its relative accuracy. The exact fits are within 1e-9
relative; evaluated in f32 the error is set by f32 rounding (see cpu-math512.h).

Usage: gelu-table.py > backends/cpu/cpu-gelu-table.h    (needs numpy)
"""
import math

import numpy as np

# (name, segments, width, degree): the 16-wide form picks among 32 segments with vpermt2ps,
# the 8-wide one among 8 with vpermps, so it takes wider segments and one more degree.
TABLES = [("kz_gelu_q", 32, 0.25, 8), ("kv_gelu_q", 8, 0.5, 9)]


def fit(k, width, degree):
    n = 600
    s = np.cos(np.pi * (np.arange(n) + 0.5) / n) * 0.5
    u = k * width + (s + 0.5) * width
    q = np.array([0.5 * math.erfc(v) for v in u])
    v = np.vander(s, degree + 1, increasing=True)
    w, lw = 1 / q, np.ones(n)
    for _ in range(40):
        sw = np.sqrt(lw)
        c = np.linalg.lstsq(v * (w * sw)[:, None], q * w * sw, rcond=None)[0]
        err = np.abs(v @ c - q) * w
        lw = lw * err
        lw /= lw.sum()
    return c


def emit(name, segments, width, degree):
    coefs = np.array([fit(k, width, degree) for k in range(segments)]).T  # [degree + 1][segments]
    macro = name.upper().replace("_Q", "")
    print("#define %s_SEGMENTS %d" % (macro, segments))
    print("#define %s_DEGREE %d" % (macro, degree))
    print("/* clang-format off */")
    print("static const float %s[%d][%d] __attribute__((aligned(64))) = {" % (name, degree + 1, segments))
    for row in coefs:
        vals = ["%.9ef" % np.float32(x) for x in row]
        print("    {")
        for i in range(0, len(vals), 4):
            print("        " + ", ".join(vals[i:i + 4]) + ",")
        print("    },")
    print("};")
    print("/* clang-format on */")
    print()


def main():
    print("/* backends/cpu/cpu-gelu-table.h — written by backends/cpu/tools/gelu-table.py; do not edit.")
    print(" * Row j of each table holds the coefficient of s^j of each segment of erfc(u)/2:")
    print(" * kz_gelu_q for the AVX-512 gelu (32 segments of width 1/4), kv_gelu_q for the AVX2")
    print(" * one (8 segments of width 1/2). */")
    print("#ifndef KILN_CPU_GELU_TABLE_H")
    print("#define KILN_CPU_GELU_TABLE_H")
    print()
    for t in TABLES:
        emit(*t)
    print("#endif /* KILN_CPU_GELU_TABLE_H */")


if __name__ == "__main__":
    main()
