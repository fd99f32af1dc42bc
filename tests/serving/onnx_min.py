"""A few-line ONNX writer for tests that need a model of a given shape: the protobuf fields of
ModelProto, GraphProto, NodeProto, TensorProto and ValueInfoProto that kilnd reads, encoded by
hand, so that the tests need neither the onnx package nor a checked-in file.

    model(nodes=[node("Mul", ["x", "two"], ["y"])],
          inputs=[value("x", FLOAT, ["b", 4])], outputs=[value("y", FLOAT, ["b", 4])],
          initializers=[tensor("two", FLOAT, [], [2.0])])  # -> bytes of model.onnx
"""
import struct

FLOAT, UINT8, INT32, INT64, BOOL, DOUBLE = 1, 2, 6, 7, 9, 11


def _varint(v):
    v &= (1 << 64) - 1  # negative int64 as two's complement, as protobuf does
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _key(field, wire):
    return _varint(field << 3 | wire)


def _int(field, v):
    return _key(field, 0) + _varint(v)


def _bytes(field, b):
    if isinstance(b, str):
        b = b.encode()
    return _key(field, 2) + _varint(len(b)) + b


def tensor(name, dtype, dims, values):
    """An initializer: TensorProto with raw_data (little-endian)."""
    fmt = {FLOAT: "f", DOUBLE: "d", INT64: "q", INT32: "i", UINT8: "B", BOOL: "?"}[dtype]
    raw = struct.pack("<%d%s" % (len(values), fmt), *values)
    return b"".join([_int(1, d) for d in dims] + [_int(2, dtype), _bytes(8, name), _bytes(9, raw)])


def value(name, dtype, shape):
    """ValueInfoProto: a dim is an int (fixed) or a str (symbolic)."""
    dims = b"".join(_bytes(1, _int(1, d) if isinstance(d, int) else _bytes(2, d)) for d in shape)
    tensor_type = _int(1, dtype) + _bytes(2, dims)
    return _bytes(1, name) + _bytes(2, _bytes(1, tensor_type))


def attr_int(name, v):
    return _bytes(1, name) + _int(20, 2) + _int(3, v)


def attr_ints(name, vs):
    return _bytes(1, name) + _int(20, 7) + b"".join(_int(8, v) for v in vs)


def node(op, inputs, outputs, attrs=()):
    return b"".join([_bytes(1, i) for i in inputs] + [_bytes(2, o) for o in outputs] + [_bytes(4, op)]
                    + [_bytes(5, a) for a in attrs])


def model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = b"".join([_bytes(1, n) for n in nodes] + [_bytes(2, "g")] + [_bytes(5, t) for t in initializers]
                     + [_bytes(11, v) for v in inputs] + [_bytes(12, v) for v in outputs])
    return _int(1, 8) + _bytes(7, graph) + _bytes(8, _bytes(1, "") + _int(2, opset))
