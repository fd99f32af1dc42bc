#!/usr/bin/env python3
"""bench/gpu/vulkan_driver.py — kiln on a GPU's vulkan:0 (bench/engine/vulkan-gpu) beside its peer
measured in the same run, printed as bench/run rows (one JSON object per line on stdout).

    vulkan_driver.py elementwise | matmul | resnet50 | cnn-step

  elementwise  add and gelu on 256 MiB f32 against the same device's copy bandwidth (kiln's own
               256 MiB copy on vulkan:0): the fraction of the memory ceiling each op reaches
  matmul       4096 x 4096 x 4096 f32 against PyTorch (cuBLAS) on CUDA, TF32 off on both sides
  resnet50     ResNet-50 inference at batch 1 and 32 (torchvision's graph, untrained weights,
               exported to ONNX here) against PyTorch eager on CUDA, strict f32 (TF32 off)
  cnn-step     one training step of the Fashion-MNIST CNN (batch 64, Adam) against PyTorch eager
               on CUDA

Skips cleanly — no row, one line on stderr, exit 77 — when no GPU Vulkan device exists (the
helper's exit 77) or, for the PyTorch peers, when torch has no CUDA device.
"""
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

SRC = os.environ.get("KILN_SRC", os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))))
BUILD = os.environ.get("KILN_BUILD_DIR", os.path.join(SRC, "build-bench"))
HELPER = os.path.join(BUILD, "bench", "engine", "vulkan-gpu")


def skip(why):
    print("vulkan_driver: skipped: " + why, file=sys.stderr)
    sys.exit(77)


def kiln(*args):
    if not os.path.exists(HELPER):
        skip("%s is not built (no Vulkan toolkit at configure time)" % HELPER)
    p = subprocess.run([HELPER] + [str(a) for a in args], capture_output=True, text=True, timeout=1800)
    if p.returncode == 77:
        skip(p.stderr.strip())
    if p.returncode != 0:
        sys.exit("vulkan_driver: %s failed (%d): %s" % (" ".join(map(str, args)), p.returncode, p.stderr[-2000:]))
    return {r["name"]: r for r in (json.loads(line) for line in p.stdout.splitlines() if line.strip())}


def torch_cuda():
    try:
        import torch
    except ImportError:
        skip("no torch for the CUDA peer")
    if not torch.cuda.is_available():
        skip("torch %s has no CUDA device for the peer" % torch.__version__)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def cuda_ms(torch, fn, seconds=2.0):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times, start = [], time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < seconds and len(times) < 200):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def row(name, unit, k, p, peer_name, ratio):
    print(json.dumps({"name": name, "unit": unit, "kiln": round(k, 4), "peer": round(p, 4), "peer_name": peer_name,
                      "ratio": round(ratio, 4)}), flush=True)


def peer_name(torch):
    return "PyTorch %s eager, %s" % (torch.__version__, torch.cuda.get_device_name(0))


def elementwise():
    r = kiln("elementwise")
    copy = r["copy_256MiB_f32"]["gbps"]
    for op in ("add", "gelu"):
        k = r["%s_256MiB_f32" % op]["gbps"]
        row("vulkan_%s_256MiB_f32_bandwidth" % op, "GB/s", k, copy, "kiln copy 256 MiB on the same vulkan:0", k / copy)


def matmul():
    r = kiln("matmul", 4096)["matmul_4096_f32"]
    torch = torch_cuda()
    a = torch.rand(4096, 4096, device="cuda")
    b = torch.rand(4096, 4096, device="cuda")
    ms = cuda_ms(torch, lambda: torch.matmul(a, b))
    peer = 2 * 4096 ** 3 / (ms * 1e-3) / 1e12
    row("vulkan_matmul_4096_f32", "TFLOP/s", r["tflops"], peer, peer_name(torch) + ", cuBLAS, TF32 off",
        r["tflops"] / peer)


def resnet50():
    torch = torch_cuda()
    import torchvision
    model = torchvision.models.resnet50(weights=None).eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "resnet50.onnx")
        # the exporter's progress lines go to stderr: stdout carries only JSON rows; the
        # TorchScript exporter (dynamo=False) keeps opset 17 and the dynamic batch as asked
        with contextlib.redirect_stdout(sys.stderr):
            torch.onnx.export(model, torch.rand(1, 3, 224, 224), path, input_names=["x"], output_names=["logits"],
                              dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17,
                              dynamo=False)
        cuda_model = model.cuda()
        for batch in (1, 32):
            k = kiln("onnx", path, batch)["resnet50.onnx_b%d_f32" % batch]["ms"]
            x = torch.rand(batch, 3, 224, 224, device="cuda")
            with torch.no_grad():
                p = cuda_ms(torch, lambda: cuda_model(x))
            row("vulkan_resnet50_b%d_f32_inference" % batch, "ms", k, p, peer_name(torch) + ", strict f32", p / k)


def cnn_step():
    r = kiln("cnn-step", 64)["fashion_cnn_train_step_b64_f32"]
    torch = torch_cuda()
    from torch import nn
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(64, 1, 28, 28, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.item()  # the loss read once per step, as kiln's loop does
    p = cuda_ms(torch, step)
    row("vulkan_fashion_cnn_train_step_b64_f32", "ms", r["ms"], p, peer_name(torch), p / r["ms"])


if __name__ == "__main__":
    modes = {"elementwise": elementwise, "matmul": matmul, "resnet50": resnet50, "cnn-step": cnn_step}
    if len(sys.argv) != 2 or sys.argv[1] not in modes:
        sys.exit("usage: vulkan_driver.py " + " | ".join(modes))
    modes[sys.argv[1]]()
