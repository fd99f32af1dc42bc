"""bench/gpu/cuda_ops.py LIBKILN — kiln's cuda backend beside PyTorch on CUDA, in one process
on one GPU: elementwise add and gelu over 256 MiB of f32 (effective bandwidth, and add against
the device's copy bandwidth as PyTorch's clone measures it), and 8192x8192 matmul in f32 (exact,
TF32 off on both sides), TF32 (on on both) and bf16, the four linear layers of BERT-base at batch
8 and sequence 128 (x [1024, in] times a [out, in] weight plus a bias, f32 exact: kiln_linear
against torch.nn.functional.linear), and calls a second of a small linear (8x64 by 64x64), where
the host's cost per call decides. kiln is driven through libkiln's public C
API with ctypes. Each side warms up, then runs a timed loop ended by a device sync; the best of
ROUNDS rounds (KILN_BENCH_ROUNDS, default 3) counts. Prints bench/run's JSON lines; rows carry
"tf32" saying whether TF32 was allowed. A kiln result that is wrong fails the entry.

The rows time single ops on the plain backend (cuda:0?fusion=off): the fusion layer, on by
default on cuda, defers elementwise ops and never computes a result nobody reads, so a loop that
drops each result would time nothing."""
import ctypes
import json
import os
import sys
import time

import torch

lib = ctypes.CDLL(sys.argv[1])
P = ctypes.c_void_p
lib.kiln_device_open.restype = P
lib.kiln_device_open.argtypes = [ctypes.c_char_p]
lib.kiln_error.restype = ctypes.c_char_p
lib.kiln_full.restype = P
lib.kiln_full.argtypes = [P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_double]
for f in ("kiln_add", "kiln_matmul"):
    getattr(lib, f).restype = P
    getattr(lib, f).argtypes = [P, P]
lib.kiln_linear.restype = P
lib.kiln_linear.argtypes = [P, P, P]
lib.kiln_gelu.restype = P
lib.kiln_gelu.argtypes = [P, ctypes.c_bool]
lib.kiln_mean.restype = P
lib.kiln_mean.argtypes = [P, ctypes.c_int, P, ctypes.c_bool]
lib.kiln_item.restype = ctypes.c_double
lib.kiln_item.argtypes = [P]
lib.kiln_tensor_release.argtypes = [P]
lib.kiln_device_sync.argtypes = [P]
lib.kiln_device_close.argtypes = [P]
F32, BF16 = 0, 3
ROUNDS = int(os.environ.get("KILN_BENCH_ROUNDS", "3"))
dev_name = torch.cuda.get_device_name(0)
peer_base = "PyTorch %s CUDA on %s" % (torch.__version__.split("+")[0], dev_name)


def fail(msg):
    print("cuda_ops: " + msg, file=sys.stderr, flush=True)
    sys.exit(1)


def kopen(spec):
    d = lib.kiln_device_open(spec.encode())
    if not d:
        fail("cannot open %s: %s" % (spec, lib.kiln_error().decode()))
    return d


def kfull(dev, dt, shape, v):
    arr = (ctypes.c_int64 * len(shape))(*shape)
    t = lib.kiln_full(dev, dt, len(shape), arr, v)
    if not t:
        fail("kiln_full: " + lib.kiln_error().decode())
    return t


def ktime(dev, fn, iters):
    """seconds per call of fn (which returns a tensor, released at once), best round"""
    for _ in range(2):
        lib.kiln_tensor_release(fn())
    if lib.kiln_device_sync(dev):
        fail("sync: " + lib.kiln_error().decode())
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(iters):
            t = fn()
            if not t:
                fail("op: " + lib.kiln_error().decode())
            lib.kiln_tensor_release(t)
        if lib.kiln_device_sync(dev):
            fail("sync: " + lib.kiln_error().decode())
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def ttime(fn, iters):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def row(name, unit, kiln, peer, peer_name, tf32, **extra):
    r = {"name": name, "unit": unit, "kiln": round(kiln, 3), "peer": round(peer, 3), "peer_name": peer_name,
         "ratio": round(kiln / peer, 4), "tf32": tf32}
    r.update(extra)
    print(json.dumps(r), flush=True)


dev = kopen("cuda:0?fusion=off")
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

# --- elementwise over 256 MiB of f32
n = 256 * 1024 * 1024 // 4
ka = kfull(dev, F32, [n], 1.25)
kb = kfull(dev, F32, [n], 2.5)
chk = lib.kiln_add(ka, kb)
m = lib.kiln_mean(chk, 0, None, False)
got = lib.kiln_item(m) if m else float("nan")
lib.kiln_tensor_release(m)
lib.kiln_tensor_release(chk)
if got != 3.75:
    fail("add gave mean %r, expected 3.75 (%s)" % (got, lib.kiln_error().decode()))
ta = torch.full((n,), 1.25, device="cuda")
tb = torch.full((n,), 2.5, device="cuda")
nbytes = n * 4
k_add = ktime(dev, lambda: lib.kiln_add(ka, kb), 20)
t_add = ttime(lambda: torch.add(ta, tb), 20)
k_gelu = ktime(dev, lambda: lib.kiln_gelu(ka, False), 20)
t_gelu = ttime(lambda: torch.nn.functional.gelu(ta), 20)
t_copy = ttime(lambda: ta.clone(), 20)
gb = 1e9
row("cuda_add_f32_256MiB", "GB/s", 3 * nbytes / k_add / gb, 3 * nbytes / t_add / gb, peer_base + " add", False)
row("cuda_gelu_f32_256MiB", "GB/s", 2 * nbytes / k_gelu / gb, 2 * nbytes / t_gelu / gb, peer_base + " gelu", False)
row("cuda_add_f32_256MiB_vs_copy_bandwidth", "GB/s", 3 * nbytes / k_add / gb, 2 * nbytes / t_copy / gb,
    peer_base + " clone (device copy bandwidth)", False)
for t in (ka, kb):
    lib.kiln_tensor_release(t)
del ta, tb
torch.cuda.empty_cache()

# --- matmul 8192 x 8192
s = 8192
flops = 2.0 * s * s * s
tf = 1e12
for label, spec, dt, tdt, tf32 in (("f32", "cuda:0?fusion=off", F32, torch.float32, False),
                                   ("tf32", "cuda:0?fusion=off&tf32=on", F32, torch.float32, True),
                                   ("bf16", "cuda:0?fusion=off", BF16, torch.bfloat16, False)):
    d = dev if spec == "cuda:0?fusion=off" else kopen(spec)
    x = kfull(d, dt, [s, s], 1.0)
    y = kfull(d, dt, [s, s], 0.5)
    chk = lib.kiln_matmul(x, y)
    m = lib.kiln_mean(chk, 0, None, False) if chk else None
    got = lib.kiln_item(m) if m else float("nan")
    lib.kiln_tensor_release(m)
    lib.kiln_tensor_release(chk)
    if abs(got - 4096.0) > 1e-2 * 4096:
        fail("matmul %s gave mean %r, expected 4096 (%s)" % (label, got, lib.kiln_error().decode()))
    torch.backends.cuda.matmul.allow_tf32 = tf32
    tx = torch.full((s, s), 1.0, device="cuda", dtype=tdt)
    ty = torch.full((s, s), 0.5, device="cuda", dtype=tdt)
    k = ktime(d, lambda: lib.kiln_matmul(x, y), 5)
    t = ttime(lambda: torch.matmul(tx, ty), 5)
    row("cuda_matmul_8192_" + label, "TFLOP/s", flops / k / tf, flops / t / tf,
        peer_base + " matmul (allow_tf32=%s)" % tf32, tf32)
    lib.kiln_tensor_release(x)
    lib.kiln_tensor_release(y)
    if d != dev:
        lib.kiln_device_close(d)
    del tx, ty
    torch.cuda.empty_cache()

# --- the linear layers of BERT-base, batch 8 x sequence 128 tokens, f32 exact
torch.backends.cuda.matmul.allow_tf32 = False
tokens = 1024
for label, fin, fout in (("qkv", 768, 2304), ("out", 768, 768), ("ffn1", 768, 3072), ("ffn2", 3072, 768)):
    x = kfull(dev, F32, [tokens, fin], 0.5)
    w = kfull(dev, F32, [fout, fin], 0.25)
    b = kfull(dev, F32, [fout], 1.0)
    chk = lib.kiln_linear(x, w, b)
    m = lib.kiln_mean(chk, 0, None, False) if chk else None
    got = lib.kiln_item(m) if m else float("nan")
    lib.kiln_tensor_release(m)
    lib.kiln_tensor_release(chk)
    want = fin * 0.125 + 1.0
    if abs(got - want) > 1e-4 * want:
        fail("linear %s gave mean %r, expected %r (%s)" % (label, got, want, lib.kiln_error().decode()))
    tx = torch.full((tokens, fin), 0.5, device="cuda")
    tw = torch.full((fout, fin), 0.25, device="cuda")
    tb = torch.full((fout,), 1.0, device="cuda")
    lflops = 2.0 * tokens * fin * fout
    k = ktime(dev, lambda: lib.kiln_linear(x, w, b), 50)
    t = ttime(lambda: torch.nn.functional.linear(tx, tw, tb), 50)
    row("cuda_linear_bert_b8_%s_f32" % label, "TFLOP/s", lflops / k / tf, lflops / t / tf,
        peer_base + " nn.functional.linear [%d, %d] x [%d, %d]^T + bias (allow_tf32=False)" %
        (tokens, fin, fout, fin), False)
    for h in (x, w, b):
        lib.kiln_tensor_release(h)
    del tx, tw, tb

# --- a small linear, where the host's cost of a call decides
x = kfull(dev, F32, [8, 64], 0.5)
w = kfull(dev, F32, [64, 64], 0.25)
b = kfull(dev, F32, [64], 1.0)
tx = torch.full((8, 64), 0.5, device="cuda")
tw = torch.full((64, 64), 0.25, device="cuda")
tb = torch.full((64,), 1.0, device="cuda")
k = ktime(dev, lambda: lib.kiln_linear(x, w, b), 2000)
t = ttime(lambda: torch.nn.functional.linear(tx, tw, tb), 2000)
row("cuda_linear_small_calls", "calls/s", 1.0 / k, 1.0 / t,
    peer_base + " nn.functional.linear [8, 64] x [64, 64]^T + bias", False)
for h in (x, w, b):
    lib.kiln_tensor_release(h)
lib.kiln_device_close(dev)
