"""Check that Python's safetensors package (and PyTorch, when installed) read a file
kiln wrote: every dtype, the values, the transposed view and the metadata.

Usage: check_python_reads.py ST_WRITE_SAMPLE_BINARY
Exits 77 (skipped) when the safetensors package is not importable.
"""
import os
import subprocess
import sys
import tempfile

# Run under the interpreter the test environment names (a venv with the packages).
py = os.environ.get("KILN_TEST_PYTHON")
if py and os.path.exists(py) and not os.environ.get("KILN_TEST_PYTHON_REEXEC"):
    os.environ["KILN_TEST_PYTHON_REEXEC"] = "1"
    os.execv(py, [py] + sys.argv)

try:
    import numpy as np
    from safetensors import safe_open
except ImportError as e:
    print(f"skipped: {e} (tests/run installs numpy and safetensors in .venv-tests)")
    sys.exit(77)

writer = sys.argv[1]
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "kiln.safetensors")
    subprocess.run([writer, path], check=True)
    base = np.arange(-5, 7).reshape(3, 4)
    want = {
        "t.f32": base.astype(np.float32), "t.f64": base.astype(np.float64),
        "t.f16": base.astype(np.float16), "t.i64": base.astype(np.int64),
        "t.i32": base.astype(np.int32), "t.u8": base.astype(np.uint8),
        "t.bool": (base % 3 == 0), "view": base.astype(np.float32).T,
    }
    with safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"writer": "kiln"}, f.metadata()
        assert set(f.keys()) == set(want) | {"t.bf16"}, sorted(f.keys())
        for name, w in want.items():
            got = f.get_tensor(name)
            assert got.dtype == w.dtype, (name, got.dtype, w.dtype)
            assert got.shape == w.shape, (name, got.shape, w.shape)
            assert np.array_equal(got, w), (name, got, w)
    try:
        import torch
        from safetensors.torch import load_file
        t = load_file(path)["t.bf16"]
        assert t.dtype == torch.bfloat16 and torch.equal(t.float(), torch.arange(-5., 7.).reshape(3, 4))
        print("bf16 checked with torch")
    except ImportError:
        print("bf16 not checked: torch is not installed (numpy has no bfloat16)")
print("python read the kiln file correctly")
