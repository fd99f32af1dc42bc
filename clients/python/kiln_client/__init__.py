"""kiln_client: a standard-library Python client for kilnd — KServe v2 inference (JSON and the
binary tensor data extension), the model repository, and training jobs (/v1/jobs). See README.md.

    from kiln_client import Client
    kiln = Client("http://127.0.0.1:8080")
    job = kiln.submit({"model": "fashion_mlp", "data": {"type": "fashion_mnist"}, "register_as": "f"})
    kiln.wait(job)
    print(kiln.infer("f", [[[[0.5] * 28] * 28]]).output().tolist())
"""
from .client import Client, Event, InferResult, KilnConnectionError, KilnError
from .tensors import DATATYPES, Tensor

__all__ = ["Client", "Event", "InferResult", "KilnConnectionError", "KilnError", "Tensor", "DATATYPES"]
__version__ = "0.1.0"
