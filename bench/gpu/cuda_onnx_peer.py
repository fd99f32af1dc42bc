"""bench/gpu/cuda_onnx_peer.py DIR NAME RUNS — PyTorch eager on CUDA for one bench model of
tests/fixtures/gen_onnx_models.py (rebuilt from its definition with the exported weights),
inference_mode, cudnn.benchmark on and TF32 off (kiln's cuda device computes exact f32 by
default); two warm-up runs, then RUNS timed runs each ended by a synchronize. Prints one JSON
line {"ms" (median), "min_ms", "version"}."""
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

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
m, _ = gen.large_model(name)
m.load_state_dict(torch.load(os.path.join(d, name + ".pt")))
m = m.cuda()
io = load_file(os.path.join(d, name + ".io.safetensors"))
args = [torch.from_numpy(v).cuda() for k, v in io.items() if k.startswith("in.")]
t = []
with torch.inference_mode():
    for i in range(runs + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        m(*args)
        torch.cuda.synchronize()
        if i >= 2:
            t.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({"ms": statistics.median(t), "min_ms": min(t),
                  "version": "PyTorch %s CUDA on %s" % (torch.__version__.split("+")[0],
                                                        torch.cuda.get_device_name(0))}))
