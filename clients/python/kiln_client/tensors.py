"""Tensors as the KServe v2 protocol carries them: a name, a datatype, a shape and the elements in
row-major order, either as JSON "data" or as raw bytes in the binary tensor data extension (fixed-size
types little-endian; BYTES as a 4-byte little-endian length before each element).

Everything here is the standard library's struct and json; numpy is imported only when a caller
hands in an array or asks for one.
"""
import math
import numbers
import struct

# datatype -> struct format character (little-endian); BF16 and BYTES are handled by hand.
_FORMATS = {
    "BOOL": "?", "UINT8": "B", "INT8": "b", "UINT16": "H", "INT16": "h", "UINT32": "I", "INT32": "i",
    "UINT64": "Q", "INT64": "q", "FP16": "e", "FP32": "f", "FP64": "d",
}
DATATYPES = tuple(_FORMATS) + ("BF16", "BYTES")

_NUMPY_OF = {
    "BOOL": "bool", "UINT8": "uint8", "INT8": "int8", "UINT16": "uint16", "INT16": "int16", "UINT32": "uint32",
    "INT32": "int32", "UINT64": "uint64", "INT64": "int64", "FP16": "float16", "FP32": "float32",
    "FP64": "float64", "BF16": "float32", "BYTES": "object",
}
_DATATYPE_OF = {v: k for k, v in _NUMPY_OF.items() if k not in ("BF16", "BYTES")}


def element_size(datatype):
    """Bytes per element on the wire; 0 for BYTES (variable)."""
    if datatype == "BYTES":
        return 0
    if datatype == "BF16":
        return 2
    return struct.calcsize("<" + _FORMATS[datatype])


def _check_datatype(datatype):
    if datatype not in DATATYPES:
        raise ValueError("unknown datatype %r (known: %s)" % (datatype, ", ".join(DATATYPES)))


def _is_numpy(x):
    return type(x).__module__ == "numpy" and hasattr(x, "dtype") and hasattr(x, "tobytes")


def _count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _shape_and_flat(value):
    """The shape of a nested list (every level the same length) and its elements in order."""
    shape, level = [], value
    while isinstance(level, (list, tuple)):
        shape.append(len(level))
        if not level:
            break
        level = level[0]
    flat = []

    def walk(v, depth):
        if depth == len(shape):
            if isinstance(v, (list, tuple)):
                raise ValueError("ragged nested list: more levels than the first element has")
            flat.append(v)
            return
        if not isinstance(v, (list, tuple)) or len(v) != shape[depth]:
            raise ValueError("ragged nested list: every row of a level must have %d elements" % shape[depth])
        for item in v:
            walk(item, depth + 1)
    walk(value, 0)
    return shape, flat


def _bf16_bits(x):
    """The bfloat16 nearest to x (ties to even), as its 16 bits."""
    bits = struct.unpack("<I", struct.pack("<f", float(x)))[0]
    if math.isnan(x):
        return (bits >> 16) | 0x40
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _int_range(datatype):
    bits = 8 * struct.calcsize("<" + _FORMATS[datatype])
    return (0, 2 ** bits - 1) if datatype.startswith("U") else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)


# the integer datatypes' ranges (BOOL as 0..1)
_RANGES = dict({dt: _int_range(dt) for dt in _FORMATS if "INT" in dt}, BOOL=(0, 1))
# the smallest magnitude a finite float rounds from to infinity (round to nearest even; BF16 as
# _bf16_bits rounds, through float32)
_INF_FROM = {"FP16": 65520.0, "FP32": 2.0 ** 128 - 2.0 ** 103, "BF16": 2.0 ** 128 - 2.0 ** 119 - 2.0 ** 103}


class _Refused(ValueError):
    """An element the datatype cannot hold; the text says why, to follow its value."""


def _to_bytes(v):
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise _Refused(", which is not bytes or str")


def _number(v, what):
    """v as a Python int or float; _Refused for a string or anything else that is not a number."""
    if isinstance(v, (str, bytes, bytearray)):
        raise _Refused(", a string, not a %s" % what)
    if isinstance(v, numbers.Integral):
        return int(v)
    if _is_numpy(v) and v.dtype.kind == "b":
        return int(bool(v))
    if isinstance(v, numbers.Real):
        try:
            return float(v)
        except OverflowError:
            raise _Refused(", which is too large") from None
    raise _Refused(", which is not a %s" % what)


def _converter(datatype):
    """The function that makes one element as the datatype holds it (a Python int, float, bool or
    bytes), raising _Refused for one it cannot hold: a string for a number, a fraction, NaN, an
    infinity or a value out of range for an integer or BOOL, a finite value that would become an
    infinity in a floating-point datatype. kilnd writes NaN and infinities as null in JSON, which
    has no such numbers: null reads as NaN (binary=True keeps infinities apart from NaN)."""
    if datatype == "BYTES":
        return _to_bytes
    if datatype.startswith(("FP", "BF")):
        limit = _INF_FROM.get(datatype, math.inf)

        def to_float(v):
            if type(v) is not float:
                if v is None:
                    return math.nan
                try:
                    v = float(_number(v, "number"))
                except OverflowError:
                    raise _Refused(", too large for %s" % datatype) from None
            if -limit < v < limit or not math.isfinite(v):
                return v
            raise _Refused(", too large for %s (it would become %sinf)" % (datatype, "-" if v < 0 else ""))
        return to_float
    if datatype == "BOOL":
        def to_bool(v):
            if type(v) is bool:
                return v
            n = v if type(v) is int else _number(v, "boolean")
            if n == 0 or n == 1:
                return bool(n)
            raise _Refused(", which is not a boolean (True, False, 0 or 1)")
        return to_bool
    lo, hi = _RANGES[datatype]

    def to_int(v):
        if type(v) is not int:
            v = _number(v, "number")
            if type(v) is float:
                if not v.is_integer():
                    raise _Refused(", which is not an integer")
                v = int(v)
        if lo <= v <= hi:
            return v
        raise _Refused(", outside the %s range %d..%d" % (datatype, lo, hi))
    return to_int


def _show(v):
    """An element as an error message quotes it (at most 40 characters)."""
    text = repr(v.item() if _is_numpy(v) and hasattr(v, "item") else v)
    return text if len(text) <= 40 else text[:40] + "..."


def _convert_all(name, datatype, flat):
    """Every element of flat (a list) converted; ValueError naming the input, the datatype and the
    first element it cannot hold (its row-major index and value), as `kiln predict` does."""
    convert = _converter(datatype)
    try:
        return [convert(v) for v in flat]
    except _Refused:
        pass
    for i, v in enumerate(flat):
        try:
            convert(v)
        except _Refused as e:
            raise ValueError("input %r (%s): element %d is %s%s" % (name, datatype, i, _show(v), e)) from None
    raise AssertionError("an element was refused once and not again")


class Tensor:
    """One tensor: .name, .datatype, .shape (list of ints) and .data (the elements, flat, as Python
    numbers, bools or bytes for BYTES)."""

    def __init__(self, name, value=None, datatype=None, shape=None, data=None):
        """Tensor(name, value[, datatype]) from a nested list, a scalar or a numpy array, or
        Tensor(name, datatype=..., shape=..., data=flat) as given."""
        self.name = name
        if data is not None:
            if datatype is None or shape is None:
                raise ValueError("a Tensor from flat data needs its datatype and shape")
            _check_datatype(datatype)
            self.datatype, self.shape = datatype, [int(d) for d in shape]
            self.data = _convert_all(name, datatype, list(data))
        elif _is_numpy(value):
            dt = datatype or _DATATYPE_OF.get(str(value.dtype))
            if dt is None:
                kind = value.dtype.kind
                dt = "BYTES" if kind in "OSU" else None
            if dt is None:
                raise ValueError("numpy dtype %s has no KServe datatype" % value.dtype)
            _check_datatype(dt)
            self.datatype, self.shape = dt, [int(d) for d in value.shape]
            # the array's values, checked as a list's are: an array is never cast to the datatype
            # (a float array given for INT64 would be truncated, a negative one wrap in UINT8)
            self.data = _convert_all(name, dt, value.reshape(-1).tolist())
        else:
            shape, flat = _shape_and_flat(value)
            dt = datatype or _guess(flat)
            _check_datatype(dt)
            self.datatype, self.shape = dt, shape
            self.data = _convert_all(name, dt, flat)
        if len(self.data) != _count(self.shape):
            raise ValueError("tensor %r: %d elements for shape %s" % (name, len(self.data), self.shape))

    def __repr__(self):
        return "Tensor(%r, %s, shape=%s)" % (self.name, self.datatype, self.shape)

    def tolist(self):
        """The elements nested as the shape says (a scalar for shape [])."""
        def nest(flat, shape):
            if not shape:
                return flat[0]
            if len(shape) == 1:
                return list(flat)
            step = _count(shape[1:])
            return [nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]
        return nest(self.data, self.shape)

    def numpy(self):
        """A numpy array of the tensor (BYTES: an object array of bytes; BF16: float32)."""
        import numpy as np
        if self.datatype == "BYTES":
            a = np.empty(len(self.data), dtype=object)
            a[:] = self.data
            return a.reshape(self.shape)
        return np.array(self.data, dtype=_NUMPY_OF[self.datatype]).reshape(self.shape)

    # ---- the wire ----

    def to_binary(self):
        """The raw bytes of the binary tensor data extension; ValueError, as the constructor raises
        it, for an element the datatype cannot hold (.data changed since)."""
        try:
            if self.datatype == "BYTES":
                return b"".join(struct.pack("<I", len(b)) + b for b in self.data)
            if self.datatype == "BF16":
                return struct.pack("<%dH" % len(self.data), *(_bf16_bits(v) for v in self.data))
            return struct.pack("<%d%s" % (len(self.data), _FORMATS[self.datatype]), *self.data)
        except (struct.error, OverflowError, TypeError, ValueError) as e:
            why = e
        _convert_all(self.name, self.datatype, self.data)
        raise ValueError("input %r (%s): cannot be encoded: %s" % (self.name, self.datatype, why))

    def finite(self):
        """Whether every element is a finite number (JSON can carry no NaN or infinity)."""
        if not self.datatype.startswith(("FP", "BF")):
            return True
        return all(math.isfinite(v) for v in self.data)

    def json_data(self):
        """The elements for a JSON "data" member (BYTES as text; non-UTF-8 bytes cannot go as JSON)."""
        if self.datatype == "BYTES":
            try:
                return [b.decode("utf-8") for b in self.data]
            except UnicodeDecodeError:
                raise ValueError("tensor %r holds bytes that are not UTF-8; send it with binary=True" % self.name)
        return list(self.data)

    @classmethod
    def from_binary(cls, name, datatype, shape, raw):
        _check_datatype(datatype)
        n = _count(shape)
        if datatype == "BYTES":
            data, i = [], 0
            while i < len(raw):
                if i + 4 > len(raw):
                    raise ValueError("BYTES tensor %r: a length prefix runs past the data" % name)
                k = struct.unpack_from("<I", raw, i)[0]
                if i + 4 + k > len(raw):
                    raise ValueError("BYTES tensor %r: an element runs past the data" % name)
                data.append(bytes(raw[i + 4:i + 4 + k]))
                i += 4 + k
            if len(data) != n:
                raise ValueError("BYTES tensor %r: %d elements for shape %s" % (name, len(data), shape))
        elif datatype == "BF16":
            if len(raw) != 2 * n:
                raise ValueError("tensor %r: %d bytes for %d BF16 elements" % (name, len(raw), n))
            data = [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in struct.unpack("<%dH" % n, raw)]
        else:
            size = element_size(datatype)
            if len(raw) != size * n:
                raise ValueError("tensor %r: %d bytes for %d %s elements" % (name, len(raw), n, datatype))
            data = list(struct.unpack("<%d%s" % (n, _FORMATS[datatype]), raw))
        return cls(name, datatype=datatype, shape=shape, data=data)

    @classmethod
    def from_json(cls, obj):
        """A tensor from a JSON output object with "data" (flat or nested)."""
        data = obj.get("data", [])
        _, flat = _shape_and_flat(data) if isinstance(data, list) else ([], [data])
        return cls(obj["name"], datatype=obj["datatype"], shape=obj["shape"], data=flat)


def _guess(flat):
    if flat and all(isinstance(v, bool) for v in flat):
        return "BOOL"
    if flat and all(isinstance(v, (str, bytes, bytearray)) for v in flat):
        return "BYTES"
    if flat and all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        return "INT64"
    return "FP32"
