"""A small WebSocket client and encoder of the remote tensor protocol (docs/remote-protocol.md),
written from the specification for the black-box tests of kilnd's /v1/tensor endpoint. Only the
standard library; frames are built by hand so that tests can also send malformed ones.
"""
import base64
import os
import socket
import struct

MAGIC = 0x544E4C4B  # b"KLNT"
VERSION = 1
HDR = struct.Struct("<IHHIQI")  # magic, version, type, flags, seq, length: 24 bytes

HELLO, ALLOC, UPLOAD, OP, DOWNLOAD, RELEASE, SYNC = 1, 2, 3, 4, 5, 6, 7
WELCOME, DATA, SYNC_DONE, ERROR = 0x81, 0x82, 0x83, 0x84
(E_MALFORMED, E_BAD_ID, E_BAD_RANGE, E_BAD_SHAPE, E_QUOTA, E_NOT_SUPPORTED, E_DEVICE, E_VERSION,
 E_PROTOCOL) = range(1, 10)

# kiln_dtype numbering
F32, F64, F16, BF16, I64, I32, U8, BOOL = range(8)
# primitive numbers
(P_FILL, P_ARANGE, P_COPY, P_RNG, P_UNARY, P_BINARY, P_WHERE, P_REDUCE, P_ARG_REDUCE, P_CUMSUM, P_SORT,
 P_GATHER, P_SCATTER, P_INDEX_SELECT, P_INDEX_ADD, P_MATMUL) = range(1, 17)
B_ADD, B_SUB, B_MUL = 0, 1, 2


def header(mtype, seq, payload, version=VERSION, magic=MAGIC, flags=0, length=None):
    return HDR.pack(magic, version, mtype, flags, seq, len(payload) if length is None else length) + payload


def hello(seq=1, device="cpu", lo=1, hi=1, version=VERSION):
    d = device.encode()
    return header(HELLO, seq, struct.pack("<HHB", lo, hi, len(d)) + d, version=version)


def alloc(seq, tid, data=None, nbytes=None):
    if data is None:
        return header(ALLOC, seq, struct.pack("<QQB7x", tid, nbytes, 0))
    return header(ALLOC, seq, struct.pack("<QQB7x", tid, len(data) if nbytes is None else nbytes, 1) + data)


def upload(seq, tid, offset, data):
    return header(UPLOAD, seq, struct.pack("<QQQ", tid, offset, len(data)) + data)


def download(seq, tid, offset, length):
    return header(DOWNLOAD, seq, struct.pack("<QQQ", tid, offset, length))


def release(seq, *ids):
    return header(RELEASE, seq, struct.pack("<II", len(ids), 0) + b"".join(struct.pack("<Q", i) for i in ids))


def sync(seq):
    return header(SYNC, seq, b"")


def td(tid, shape, dtype=F32, strides=None, offset=0):
    """An operand: a view of buffer tid (contiguous unless strides are given)."""
    if strides is None:
        strides, s = [], 1
        for n in reversed(shape):
            strides.insert(0, s)
            s *= n
    return (tid, offset, dtype, list(shape), list(strides))


def op(seq, prim, operands, sub=0, flags=0, f=(), i=()):
    p = struct.pack("<HBBBBBB", prim, sub, flags, len(operands), len(f), len(i), 0)
    p += b"".join(struct.pack("<d", x) for x in f)
    p += b"".join(struct.pack("<q", x) for x in i)
    for o in operands:
        if o is None:
            p += bytes(24)
            continue
        tid, offset, dtype, shape, strides = o
        p += struct.pack("<QqBB6x", tid, offset, dtype, len(shape))
        p += b"".join(struct.pack("<q", x) for x in shape) + b"".join(struct.pack("<q", x) for x in strides)
    return header(OP, seq, p)


def f32(*xs):
    return struct.pack("<%df" % len(xs), *xs)


def unf32(b):
    return list(struct.unpack("<%df" % (len(b) // 4), b))


def parse(msg):
    """The protocol messages of one WebSocket message: [(type, seq, fields)]."""
    out, off = [], 0
    while off < len(msg):
        magic, ver, mtype, flags, seq, length = HDR.unpack_from(msg, off)
        p = msg[off + 24:off + 24 + length]
        off += 24 + length
        if mtype == ERROR:
            code, failed, tlen = struct.unpack_from("<IHH", p)
            out.append((mtype, seq, {"code": code, "failed_type": failed, "text": p[8:8 + tlen].decode()}))
        elif mtype == WELCOME:
            v, _, mask, mmb, mlb, mids, mq, nd = struct.unpack_from("<HHIQQIIB", p)
            devs, pos = [], 40
            for _ in range(nd):
                n = p[pos]
                devs.append(p[pos + 1:pos + 1 + n].decode())
                pos += 1 + n
            out.append((mtype, seq, {"version": v, "dtype_mask": mask, "max_message_bytes": mmb,
                                     "max_live_bytes": mlb, "max_ids": mids, "max_queued_ops": mq,
                                     "devices": devs}))
        elif mtype == DATA:
            out.append((mtype, seq, {"data": p}))
        else:
            out.append((mtype, seq, {}))
    return out


class Closed(Exception):
    def __init__(self, code, reason):
        super().__init__("closed %s %r" % (code, reason))
        self.code, self.reason = code, reason


class WS:
    """One client connection. connect() returns the handshake's status and headers."""

    def __init__(self, port, timeout=20):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.pending = []

    def handshake(self, headers=None, key=None, version="13", path="/v1/tensor"):
        key = key if key is not None else base64.b64encode(os.urandom(16)).decode()
        h = {"Host": "127.0.0.1", "Upgrade": "websocket", "Connection": "Upgrade",
             "Sec-WebSocket-Version": version}
        if key:
            h["Sec-WebSocket-Key"] = key
        h.update(headers or {})
        req = "GET %s HTTP/1.1\r\n" % path + "".join("%s: %s\r\n" % kv for kv in h.items() if kv[1] is not None)
        self.sock.sendall((req + "\r\n").encode())
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
        hdrs = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        return status, hdrs

    def frame(self, payload, opcode=2, fin=True, mask=True, rsv=0):
        b0 = (0x80 if fin else 0) | rsv << 4 | opcode
        n = len(payload)
        if n < 126:
            h = struct.pack("!BB", b0, (0x80 if mask else 0) | n)
        elif n < 65536:
            h = struct.pack("!BBH", b0, (0x80 if mask else 0) | 126, n)
        else:
            h = struct.pack("!BBQ", b0, (0x80 if mask else 0) | 127, n)
        if mask:
            k = os.urandom(4)
            payload = bytes(c ^ k[i & 3] for i, c in enumerate(payload)) if n < 4096 else _xor(payload, k)
            h += k
        return h + payload

    def send(self, payload, **kw):
        self.sock.sendall(self.frame(payload, **kw))

    def raw(self, data):
        self.sock.sendall(data)

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("connection closed without a close frame")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self):
        """The next binary message's protocol messages; raises Closed on a close frame."""
        data = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            if b1 & 0x80:
                raise AssertionError("the server masked a frame")
            payload = self._read(n)
            opcode = b0 & 0x0F
            if opcode == 8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                try:
                    self.send(payload[:2], opcode=8)
                except OSError:
                    pass
                raise Closed(code, payload[2:].decode(errors="replace"))
            if opcode == 9:
                self.send(payload, opcode=10)
                continue
            if opcode == 10:
                continue
            data += payload
            if b0 & 0x80:
                return parse(data)

    def next(self):
        """The next protocol message."""
        while not self.pending:
            self.pending.extend(self.recv())
        return self.pending.pop(0)

    def until(self, seq):
        """Every message up to and including the reply to seq."""
        got = []
        while True:
            m = self.next()
            got.append(m)
            if m[1] == seq and m[0] in (DATA, SYNC_DONE, ERROR, WELCOME):
                return got

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def _xor(payload, k):
    n = len(payload)
    key = (k * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")
