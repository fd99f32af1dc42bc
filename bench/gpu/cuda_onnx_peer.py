"""bench/gpu/cuda_onnx_peer.py DIR NAME RUNS [tf32] [compile] [train] — PyTorch on CUDA for one bench
model of tests/fixtures/gen_onnx_models.py (rebuilt from its definition with the exported
weights), inference_mode, cudnn.benchmark on; TF32 off for matmuls and convolutions (kiln's
cuda device computes exact f32 by default) unless "tf32" is given, which turns it on for both;
eager unless "compile" is given (torch.compile, default mode, compiled during the warm-up).
With "train", a run is an SGD step instead (momentum 0.9, lr 1e-3, cross-entropy against labels
i mod classes, batch norm in eval form as kiln's exported graph has it: bench/onnx/onnx-train-step.c).
Warm-up runs (two, or five compiled), then RUNS timed runs each ended by a synchronize. Prints
one JSON line {"ms" (median), "min_ms", "version"}."""
import json
import os
import statistics
import sys
import time

import torch
from safetensors.numpy import load_file

d, name, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures"))
import gen_onnx_models as gen  # noqa: E402

tf32 = "tf32" in sys.argv[4:]
compiled = "compile" in sys.argv[4:]
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = tf32
torch.backends.cuda.matmul.allow_tf32 = tf32
m, _ = gen.large_model(name)
m.load_state_dict(torch.load(os.path.join(d, name + ".pt")))
m = m.cuda()
if compiled:
    m = torch.compile(m)
io = load_file(os.path.join(d, name + ".io.safetensors"))
args = [torch.from_numpy(v).cuda() for k, v in io.items() if k.startswith("in.")]
t = []
if "train" in sys.argv[4:]:
    x = args[0]
    opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
    out = m(x)
    labels = torch.arange(out.shape[0], device="cuda") % out.shape[1]
    for i in range(runs + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(m(x), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= 2:
            t.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"ms": statistics.median(t), "min_ms": min(t),
                      "version": "PyTorch %s CUDA on %s" % (torch.__version__.split("+")[0],
                                                            torch.cuda.get_device_name(0))}))
    sys.exit(0)
with torch.inference_mode():
    warm = 5 if compiled else 2
    for i in range(runs + warm):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        m(*args)
        torch.cuda.synchronize()
        if i >= warm:
            t.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({"ms": statistics.median(t), "min_ms": min(t),
                  "version": "PyTorch %s CUDA on %s" % (torch.__version__.split("+")[0],
                                                        torch.cuda.get_device_name(0))}))
