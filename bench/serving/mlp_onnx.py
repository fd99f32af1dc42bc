#!/usr/bin/env python3
"""Writes the serving fixture's MLP 784-128-10 (tests/fixtures/serving/mnist_mlp/1/model.kiln) as an
ONNX model with a symbolic batch dim: Gemm(transB) -> Relu -> Gemm, input "input", output "logits".
The same weights then run in kilnd and in ONNX Runtime.

The protobuf is written by hand (a few message types, fields by number from onnx.proto) so that the
bench needs neither the onnx package nor torch's exporter, which requires it.

Usage: mlp_onnx.py MODEL_KILN OUT_ONNX
"""
import json
import struct
import sys


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num, value):
    """One protobuf field: ints as varints (wire type 0), bytes/str/nested messages length-delimited."""
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(num << 3 | 2) + varint(len(value)) + value


def tensor(name, shape, raw):
    # TensorProto: dims=1, data_type=2 (1: FLOAT), name=8, raw_data=9
    return b"".join(field(1, d) for d in shape) + field(2, 1) + field(8, name) + field(9, raw)


def value_info(name, dims):
    # ValueInfoProto{name=1, type=2{tensor_type=1{elem_type=1, shape=2{dim=1{dim_value=1 | dim_param=2}}}}}
    shape = b"".join(field(1, field(2, d) if isinstance(d, str) else field(1, d)) for d in dims)
    return field(1, name) + field(2, field(1, field(1, 1) + field(2, shape)))


def node(op, inputs, outputs, name, attrs=()):
    # NodeProto: input=1, output=2, name=3, op_type=4, attribute=5 (AttributeProto name=1, i=3, type=20: 2 INT)
    body = b"".join(field(1, i) for i in inputs) + b"".join(field(2, o) for o in outputs)
    body += field(3, name) + field(4, op)
    for k, v in attrs:
        body += field(5, field(1, k) + field(3, v) + field(20, 2))
    return body


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    out = {}
    for k, v in json.loads(raw[8:8 + n]).items():
        if k != "__metadata__":
            a, b = v["data_offsets"]
            assert v["dtype"] == "F32", k
            out[k] = (v["shape"], raw[8 + n + a:8 + n + b])
    return out


def main():
    w = read_safetensors(sys.argv[1])
    inits = [tensor(k, *w[k]) for k in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")]
    nodes = [node("Gemm", ["input", "fc1.weight", "fc1.bias"], ["h"], "fc1", [("transB", 1)]),
             node("Relu", ["h"], ["a"], "act"),
             node("Gemm", ["a", "fc2.weight", "fc2.bias"], ["logits"], "fc2", [("transB", 1)])]
    # GraphProto: node=1, name=2, initializer=5, input=11, output=12
    graph = b"".join(field(1, n) for n in nodes) + field(2, "mnist_mlp")
    graph += b"".join(field(5, t) for t in inits)
    graph += field(11, value_info("input", ["batch", 784])) + field(12, value_info("logits", ["batch", 10]))
    # ModelProto: ir_version=1, producer_name=2, graph=7, opset_import=8 (domain=1, version=2)
    model = field(1, 8) + field(2, "kiln bench/serving") + field(7, graph) + field(8, field(1, "") + field(2, 17))
    with open(sys.argv[2], "wb") as f:
        f.write(model)


if __name__ == "__main__":
    main()
