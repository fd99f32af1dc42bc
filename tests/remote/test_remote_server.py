#!/usr/bin/env python3
"""Black-box tests of kilnd's /v1/tensor endpoint (docs/remote-protocol.md) over real sockets:
handshake errors, the endpoint turned off (remote.max_sessions 0), devices named as devices (cpu
is cpu:0), a normal session, pipelined ops with an error in the middle, isolation between
sessions, quotas, hostile operands, framing violations, and memory freed on disconnect — while
the daemon keeps serving its other endpoints and sessions.

Usage: test_remote_server.py KILND
"""
import http.client
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from remote_wire import *  # noqa: E402,F403

KILND = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="kilnd-remote-")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


class Daemon:
    def __init__(self, name, *args, env=None):
        self.data = os.path.join(TMP, name)
        os.makedirs(self.data, exist_ok=True)
        self.log = os.path.join(TMP, name + ".log")
        self.proc = subprocess.Popen([KILND, "--port", "0", "--data-dir", self.data, *args],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"), env=dict(ENV, **(env or {})))
        portfile = os.path.join(self.data, "kilnd.port")
        deadline = time.time() + 15
        while not os.path.exists(portfile):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("kilnd did not start: " + open(self.log).read())
            time.sleep(0.01)
        self.port = int(open(portfile).read())
        while self.req("GET", "/v2/health/ready")[0] != 200:
            if time.time() > deadline:
                raise RuntimeError("kilnd not ready")
            time.sleep(0.02)

    def req(self, method, path, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        c.request(method, path, headers=headers or {})
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, body

    def metric(self, name):
        st, body = self.req("GET", "/metrics")
        for line in body.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def wait_metric(self, name, value):
        """The gauge reaches value once the session's teardown hop is back (no timing assumed)."""
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.metric(name) == value:
                return True
            time.sleep(0.02)
        return False

    def session(self, device="cpu", headers=None):
        w = WS(self.port)
        st, _ = w.handshake(headers)
        check(st == 101, "upgrade answers 101 (got %s)" % st)
        w.send(hello(1, device))
        t, seq, f = w.next()
        check(t == WELCOME and seq == 1, "HELLO answered by WELCOME")
        w.welcome = f
        w.seq = 1
        return w

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = -9
        check(rc == 0, "kilnd exits 0 after SIGTERM (rc %s): %s" % (rc, open(self.log).read()[-2000:]))


def nseq(w):
    w.seq += 1
    return w.seq


def expect_closed(w, code, what):
    try:
        while True:
            w.next()
    except Closed as e:
        check(e.code == code, "%s: closed with %s (got %s %r)" % (what, code, e.code, e.reason))
    except (EOFError, OSError) as e:
        check(False, "%s: closed with %s (got %r)" % (what, code, e))


def errors_of(msgs):
    return {m[1]: m[2] for m in msgs if m[0] == ERROR}


def refused_upgrade(d, version="13", headers=None):
    """An upgrade kilnd answers with an HTTP error: (status, reason phrase, headers, JSON body)."""
    h = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": version,
         "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    h.update(headers or {})
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=20)
    try:
        c.request("GET", "/v1/tensor", headers=h)
        r = c.getresponse()
        body = r.read()
        try:
            body = json.loads(body)
        except ValueError:
            pass
        return r.status, r.reason, {k.lower(): v for k, v in r.getheaders()}, body
    finally:
        c.close()


def test_handshake(d):
    w = WS(d.port)
    st, _ = w.handshake(key="")
    check(st == 400, "missing Sec-WebSocket-Key -> 400 (got %s)" % st)
    w = WS(d.port)
    st, h = w.handshake(version="8")
    check(st == 426 and h.get("sec-websocket-version") == "13", "version 8 -> 426 naming 13 (got %s)" % st)
    st, reason, _, _ = refused_upgrade(d, version="8")
    check(st == 426 and reason == "Upgrade Required", "426's status line reads Upgrade Required (got %s %r)"
          % (st, reason))
    w = WS(d.port)
    st, _ = w.handshake({"Upgrade": None})
    check(st == 400, "no Upgrade header -> 400 (got %s)" % st)
    check(d.req("POST", "/v1/tensor")[0] == 405, "POST /v1/tensor -> 405")
    # protocol-level handshake: version range and device
    w = WS(d.port)
    w.handshake()
    w.send(hello(1, "cpu", lo=2, hi=5))
    t, seq, f = w.next()
    check(t == ERROR and f["code"] == E_VERSION and seq == 1, "HELLO 2..5 -> ERROR VERSION")
    expect_closed(w, 1008, "no common version")
    w = WS(d.port)
    w.handshake()
    w.send(hello(1, "cuda:7"))
    t, seq, f = w.next()
    check(t == ERROR and f["code"] == E_VERSION and "cuda:7" in f["text"], "unknown device -> ERROR VERSION")
    expect_closed(w, 1008, "unknown device")
    w = WS(d.port)
    w.handshake()
    w.send(sync(1))
    expect_closed(w, 1002, "first message not a HELLO")
    w = WS(d.port)
    w.handshake()
    w.send(hello(1) + sync(2))
    expect_closed(w, 1002, "HELLO not alone")
    # a wider client range settles on version 1
    w = WS(d.port)
    w.handshake()
    w.send(hello(1, "cpu", lo=1, hi=9, version=9))
    t, _, f = w.next()
    check(t == WELCOME and f["version"] == 1, "HELLO 1..9 -> WELCOME version 1")
    check(f["devices"] == ["cpu"] and f["dtype_mask"] & (1 << F32), "WELCOME lists cpu and f32")
    w.close()


def test_basic(d):
    w = d.session()
    b = w.welcome
    check(b["max_ids"] == 8 and b["max_queued_ops"] == 64 and b["max_live_bytes"] == 4096,
          "WELCOME carries the configured limits: %r" % b)
    w.send(alloc(2, 10, f32(1, 2, 3, 4)) + alloc(3, 11, f32(10, 20, 30, 40)) + alloc(4, 12, nbytes=16) +
           op(5, P_BINARY, [td(12, [4]), td(10, [4]), td(11, [4])], sub=B_ADD) + download(6, 12, 0, 16) + sync(7))
    got = w.until(7)
    check([m[0] for m in got] == [DATA, SYNC_DONE], "replies DATA then SYNC_DONE: %r" % got)
    check(unf32(got[0][2]["data"]) == [11, 22, 33, 44], "1..4 + 10..40 = 11..44")
    # a broadcast (stride 0) and a strided view: out[2,2] = a[2,2] * b[row] with b broadcast over rows
    w.send(upload(8, 10, 0, f32(1, 2, 3, 4)) + alloc(9, 13, f32(10, 100)) +
           op(10, P_BINARY, [td(12, [2, 2]), td(10, [2, 2]), td(13, [2, 2], strides=[0, 1])], sub=B_MUL) +
           download(11, 12, 0, 16))
    got = w.until(11)
    check(unf32(got[-1][2]["data"]) == [10, 200, 30, 400], "broadcast multiply: %r" % (got,))
    # a zero-filled alloc reads zeros; release then download -> BAD_ID
    w.send(alloc(12, 14, nbytes=8) + download(13, 14, 0, 8) + release(14, 14) + download(15, 14, 0, 8))
    got = w.until(15)
    check(got[0][0] == DATA and got[0][2]["data"] == bytes(8), "zeroed ALLOC reads zeros")
    check(got[-1][0] == ERROR and got[-1][2]["code"] == E_BAD_ID, "DOWNLOAD after RELEASE -> BAD_ID")
    w.close()


def test_pipelined_error(d):
    w = d.session()
    # seq 4 names an unknown id; seq 5 and 6 must still run and seq 7 read their result
    w.send(alloc(2, 1, f32(1, 2)) + alloc(3, 2, nbytes=8) +
           op(4, P_BINARY, [td(2, [2]), td(1, [2]), td(99, [2])], sub=B_ADD) +
           op(5, P_BINARY, [td(2, [2]), td(1, [2]), td(1, [2])], sub=B_ADD) +
           op(6, P_UNARY, [td(2, [2]), td(2, [2])], sub=28, f=(0.5, 0.0)) +
           download(7, 2, 0, 8) + sync(8))
    got = w.until(8)
    errs = errors_of(got)
    check(list(errs) == [4] and errs[4]["code"] == E_BAD_ID and errs[4]["failed_type"] == OP,
          "only seq 4 fails, with BAD_ID: %r" % (got,))
    check([m[1] for m in got] == [4, 7, 8], "replies in seq order: %r" % [m[1] for m in got])
    data = [m for m in got if m[0] == DATA]
    check(data and unf32(data[0][2]["data"]) == [2.5, 4.5], "later ops ran after the error")
    w.close()


def test_isolation(d):
    a = d.session()
    a.send(alloc(2, 5, f32(42, 43)) + sync(3))
    a.until(3)
    b = d.session()
    # same id number, different session: unknown to b
    b.send(download(2, 5, 0, 8) + release(3, 5) + op(4, P_COPY, [td(5, [2]), td(5, [2])]) + sync(5))
    errs = errors_of(b.until(5))
    check(errs.get(2, {}).get("code") == E_BAD_ID, "session b cannot read a's id 5")
    check(errs.get(3, {}).get("code") == E_BAD_ID, "session b cannot release a's id 5")
    check(errs.get(4, {}).get("code") == E_BAD_ID, "session b cannot use a's id 5 in an op")
    # b allocates its own id 5; both coexist
    b.send(alloc(6, 5, f32(7, 8)) + download(7, 5, 0, 8))
    check(unf32(b.until(7)[-1][2]["data"]) == [7, 8], "b's own id 5")
    a.send(download(4, 5, 0, 8))
    check(unf32(a.until(4)[-1][2]["data"]) == [42, 43], "a's id 5 untouched by b")
    a.close()
    b.close()


def test_quotas(d):
    w = d.session()
    # live bytes: 4096 per session
    w.send(alloc(2, 1, nbytes=4000) + alloc(3, 2, nbytes=200) + alloc(4, 3, nbytes=96) + sync(5))
    errs = errors_of(w.until(5))
    check(list(errs) == [3] and errs[3]["code"] == E_QUOTA, "ALLOC past max_live_bytes -> QUOTA: %r" % errs)
    w.send(release(6, 1, 3) + sync(7))
    check(not errors_of(w.until(7)), "release frees the quota")
    # ids: 8 per session
    msg = b"".join(alloc(10 + k, 100 + k, nbytes=4) for k in range(9)) + sync(19)
    w.send(msg)
    errs = errors_of(w.until(19))
    check(list(errs) == [18] and errs[18]["code"] == E_QUOTA, "ninth id -> QUOTA: %r" % errs)
    w.send(release(20, *range(100, 108)) + sync(21))
    check(not errors_of(w.until(21)), "ids released")
    # queued messages: 64 per session; 100 in one WebSocket message -> the last 36 refused in order
    msg = b"".join(sync(100 + k) for k in range(100))
    w.send(msg)
    got = []
    while len(got) < 100:
        got.append(w.next())
    check([m[1] for m in got] == list(range(100, 200)), "every message answered, in seq order")
    done = [m for m in got if m[0] == SYNC_DONE]
    quota = [m for m in got if m[0] == ERROR and m[2]["code"] == E_QUOTA]
    check(len(done) == 64 and len(quota) == 36 and quota[0][1] == 164,
          "64 queued, 36 refused with QUOTA (%d, %d)" % (len(done), len(quota)))
    # DATA larger than a message can carry
    w.send(alloc(300, 1, nbytes=4096) + download(301, 1, 0, 4096) + download(302, 1, 0, 2048))
    got = w.until(302)
    errs = errors_of(got)
    check(errs.get(301, {}).get("code") == E_QUOTA and got[-1][0] == DATA, "oversized DOWNLOAD -> QUOTA")
    # the session goes on
    w.send(release(399, 1) + alloc(400, 2, f32(3)) + download(401, 2, 0, 4))
    check(unf32(w.until(401)[-1][2]["data"]) == [3], "session usable after its quota errors")
    w.close()


def test_hostile_operands(d):
    w = d.session()
    w.send(alloc(2, 1, f32(1, 2, 3, 4)) + alloc(3, 2, nbytes=16) + alloc(4, 3, struct.pack("<4q", 0, 1, 5, -1)) + sync(5))
    check(not errors_of(w.until(5)), "setup")
    cases = [
        ("view past the end", op(0, P_COPY, [td(2, [4]), td(1, [4], offset=1)]), E_BAD_RANGE),
        ("stride past the end", op(0, P_COPY, [td(2, [4]), td(1, [4], strides=[2])]), E_BAD_RANGE),
        ("negative stride below 0", op(0, P_COPY, [td(2, [4]), td(1, [4], strides=[-1])]), E_BAD_RANGE),
        ("negative offset", op(0, P_COPY, [td(2, [4]), td(1, [4], offset=-1)]), E_MALFORMED),
        ("overflowing view", op(0, P_COPY, [td(2, [2, 2]), td(1, [2, 2], strides=[1 << 62, 1])]), E_BAD_RANGE),
        ("huge shape", op(0, P_FILL, [td(2, [1 << 40, 1 << 40], strides=[0, 0])], f=(1.0,)), E_BAD_SHAPE),
        ("huge zero-stride view", op(0, P_FILL, [td(2, [1 << 40], strides=[0])], f=(1.0,)), E_QUOTA),
        ("negative shape", op(0, P_FILL, [td(2, [-4], strides=[1])], f=(1.0,)), E_MALFORMED),
        ("bad dtype", op(0, P_FILL, [(2, 0, 9, [4], [1])], f=(1.0,)), E_MALFORMED),
        ("ndim 9", op(0, P_FILL, [td(2, [1] * 9)], f=(1.0,)), E_MALFORMED),
        ("unknown primitive", op(0, 99, [td(2, [4])]), E_MALFORMED),
        ("wrong operand count", op(0, P_BINARY, [td(2, [4]), td(1, [4])]), E_MALFORMED),
        ("shape mismatch", op(0, P_BINARY, [td(2, [4]), td(1, [4]), td(1, [3])]), E_BAD_SHAPE),
        ("sub-op out of range", op(0, P_BINARY, [td(2, [4]), td(1, [4]), td(1, [4])], sub=200), E_MALFORMED),
        ("index out of range", op(0, P_GATHER, [td(2, [4]), td(1, [4]), td(3, [4], dtype=I64)], i=(0,)),
         E_BAD_RANGE),
        ("negative index", op(0, P_INDEX_SELECT, [td(2, [1]), td(1, [4]), td(3, [1], dtype=I64, offset=3)],
                              i=(0,)), E_BAD_RANGE),
        # an output that shares bytes with the index would rewrite checked values while they are read
        ("scatter output over its index", op(0, P_SCATTER, [td(3, [4], dtype=F64), td(3, [2], dtype=I64),
                                                            td(1, [2], dtype=F64)], i=(0,), flags=4), E_BAD_RANGE),
        ("gather output over its index", op(0, P_GATHER, [td(3, [2], dtype=I64, offset=1), td(3, [4], dtype=I64),
                                                          td(3, [2], dtype=I64)], i=(0,)), E_BAD_RANGE),
        ("dim out of range", op(0, P_GATHER, [td(2, [4]), td(1, [4]), td(3, [4], dtype=I64)], i=(3,)),
         E_BAD_SHAPE),
        ("upload past the end", upload(0, 1, 12, f32(1, 2)), E_BAD_RANGE),
        ("download overflow", download(0, 1, (1 << 64) - 4, 8), E_MALFORMED),
        ("download past the end", download(0, 1, 8, 16), E_BAD_RANGE),
        ("alloc id 0", alloc(0, 0, nbytes=4), E_MALFORMED),
        ("alloc id in use", alloc(0, 1, nbytes=4), E_BAD_ID),
        ("alloc huge", alloc(0, 50, nbytes=1 << 62), E_QUOTA),
        ("alloc data short", header(ALLOC, 0, struct.pack("<QQB7x", 51, 100, 1) + bytes(10)), E_MALFORMED),
        ("op payload garbage", header(OP, 0, b"\xff" * 40), E_MALFORMED),
    ]
    for k, (what, m, code) in enumerate(cases):
        seq = 1000 + k
        m = m[:12] + struct.pack("<Q", seq) + m[20:]
        w.send(m + sync(seq + 500))
        got = w.until(seq + 500)
        errs = errors_of(got)
        if code is None:
            check(errs.get(seq) is not None, "%s -> some error, no crash: %r" % (what, got))
        else:
            check(errs.get(seq, {}).get("code") == code, "%s -> error %s: %r" % (what, code, got))
    # the index tensor [0, 1, 5, 1] has a 5: gather over 4 elements refuses; in range it works
    w.send(op(2000, P_GATHER, [td(2, [2]), td(1, [4]), td(3, [2], dtype=I64)], i=(0,)) + download(2001, 2, 0, 8))
    got = w.until(2001)
    check(unf32(got[-1][2]["data"]) == [1, 2] and not errors_of(got), "gather with in-range index works")
    # the same buffer may hold the index and the output where they do not overlap
    w.send(op(2002, P_GATHER, [td(3, [2], dtype=I64, offset=2), td(3, [4], dtype=I64), td(3, [2], dtype=I64)],
              i=(0,)) + download(2003, 3, 0, 32))
    got = w.until(2003)
    check(struct.unpack("<4q", got[-1][2]["data"]) == (0, 1, 0, 1) and not errors_of(got),
          "gather into a part of the index's buffer the index does not use works")
    w.close()


def test_framing(d):
    other = d.session()
    other.send(alloc(2, 1, f32(5)) + sync(3))
    other.until(3)
    cases = [
        ("text frame", lambda w: w.send(b"hi", opcode=1), 1003),
        ("unmasked frame", lambda w: w.send(sync(5), mask=False), 1002),
        ("oversized message", lambda w: w.send(bytes(70000)), 1009),
        ("garbage after a header", lambda w: w.send(sync(5) + b"\x01\x02\x03"), 1002),
        ("bad magic", lambda w: w.send(header(SYNC, 5, b"", magic=0x12345678)), 1002),
        ("wrong version", lambda w: w.send(header(SYNC, 5, b"", version=2)), 1002),
        ("length past the message", lambda w: w.send(header(SYNC, 5, b"", length=100)), 1002),
        ("unknown type", lambda w: w.send(header(0x42, 5, b"")), 1002),
        ("server type from a client", lambda w: w.send(header(DATA, 5, b"")), 1002),
        ("second HELLO", lambda w: w.send(hello(5)), 1002),
    ]
    for what, act, code in cases:
        w = d.session()
        w.send(alloc(2, 1, f32(1)) + sync(3))
        w.until(3)
        act(w)
        expect_closed(w, code, what)
        check(d.req("GET", "/v2/health/ready")[0] == 200, "ready after " + what)
        other.send(download(nseq(other) + 10, 1, 0, 4))
        check(unf32(other.next()[2]["data"]) == [5], "the other session still works after " + what)
    # a HELLO that fails to decode, and a frame cut in the middle of a connection
    w = WS(d.port)
    w.handshake()
    w.send(header(HELLO, 1, b"\x01\x00"))
    expect_closed(w, 1002, "short HELLO")
    w = d.session()
    w.raw(w.frame(sync(2))[:5])
    w.close()
    other.send(sync(100))
    check(other.until(100)[-1][0] == SYNC_DONE, "other session fine after a cut connection")
    other.close()


def test_disconnect_frees(d):
    check(d.wait_metric("kiln_remote_sessions", 0), "all earlier sessions gone")
    check(d.wait_metric("kiln_remote_live_bytes", 0), "no live bytes when no session holds any")
    w = d.session()
    w.send(alloc(2, 1, nbytes=1000) + alloc(3, 2, nbytes=24) + sync(4))
    w.until(4)
    check(d.wait_metric("kiln_remote_live_bytes", 1024), "gauge shows the session's 1024 bytes")
    check(d.metric("kiln_remote_live_ids") == 2, "gauge shows its 2 ids")
    w.close()
    check(d.wait_metric("kiln_remote_live_bytes", 0), "disconnect frees the session's bytes")
    check(d.wait_metric("kiln_remote_sessions", 0), "disconnect ends the session")


def test_session_limit_and_tokens():
    d = Daemon("limit", "--remote-max-sessions", "1", env={"KILN_API_TOKENS": "read:r3ad,admin:adm1n"})
    w = WS(d.port)
    st, h = w.handshake()
    check(st == 401 and "bearer" in h.get("www-authenticate", "").lower(), "no token -> 401 (got %s)" % st)
    w = WS(d.port)
    st, _ = w.handshake({"Authorization": "Bearer nope"})
    check(st == 401, "invalid token -> 401 (got %s)" % st)
    a = d.session(headers={"Authorization": "Bearer r3ad"})
    w = WS(d.port)
    st, h = w.handshake({"Authorization": "Bearer adm1n"})
    check(st == 503 and h.get("retry-after") == "1", "second session past remote.max_sessions=1 -> 503 (got %s)" % st)
    st, _, h, body = refused_upgrade(d, headers={"Authorization": "Bearer adm1n"})
    check(st == 503 and h.get("retry-after") == "1" and isinstance(body, dict)
          and "too many remote tensor sessions" in body.get("error", ""),
          "a full server says so, with Retry-After: %s %r %r" % (st, h, body))
    check(d.metric("kiln_remote_sessions_refused_total") == 2, "refusals counted")
    a.close()
    check(d.wait_metric("kiln_remote_sessions", 0), "the session ended")
    log = open(d.log, errors="replace").read()
    check(log.count("remote.max_sessions (1) sessions open: refusing new ones with 503") == 1 and
          "remote sessions accepted again; 2 were refused at remote.max_sessions" in log,
          "the log warns once for the run of refusals and says when sessions are taken again: %s" % log[-600:])
    b = d.session(headers={"Authorization": "Bearer adm1n"})
    b.send(alloc(2, 1, f32(1)) + sync(3))
    check(b.until(3)[-1][0] == SYNC_DONE, "a new session fits once the first is gone")
    # draining closes the open session with 1001
    d.proc.send_signal(signal.SIGTERM)
    expect_closed(b, 1001, "drain")
    d.stop()


def test_sessions_off():
    """remote.max_sessions 0 turns the endpoint off: a 404 saying so, which no client retries (no
    Retry-After), while the rest of kilnd serves as usual."""
    d = Daemon("off", "--remote-max-sessions", "0")
    try:
        for _ in range(2):  # the same answer every time, not a momentary refusal
            st, _, h, body = refused_upgrade(d)
            err = body.get("error", "") if isinstance(body, dict) else ""
            check(st == 404 and "retry-after" not in h and "turned off" in err and "remote.max_sessions is 0" in err,
                  "remote.max_sessions 0 -> 404 saying the endpoint is off, no Retry-After: %s %r %r" % (st, h, body))
        check(d.metric("kiln_remote_sessions_refused_total") == 0, "not counted as a refusal for a full server")
        check(d.req("GET", "/v2/health/ready")[0] == 200, "kilnd serves the rest as usual")
    finally:
        d.stop()


def hello_answer(d, device):
    """(type, fields) of the answer to a HELLO naming device, and the socket."""
    w = WS(d.port)
    w.handshake()
    w.send(hello(1, device))
    t, _, f = w.next()
    return t, f, w


def test_device_identity():
    """A HELLO names a device as a device, not as a string: cpu and cpu:0 are one, as vulkan and
    vulkan:0; a device configured with options is not offered (a HELLO carries none)."""
    d = Daemon("cpu0", "--devices", "cpu:0")
    try:
        for name in ("cpu", "cpu:0", "cpu:00"):
            t, f, w = hello_answer(d, name)
            check(t == WELCOME and f["devices"] == ["cpu"],
                  "kilnd driving cpu:0 welcomes a HELLO for %s, listing cpu: %r" % (name, f))
            if t == WELCOME:
                w.seq = 1
                w.send(alloc(2, 1, f32(1, 2)) + download(3, 1, 0, 8) + sync(4))
                got = w.until(4)
                check([m[0] for m in got] == [DATA, SYNC_DONE] and unf32(got[0][2]["data"]) == [1.0, 2.0],
                      "and the session computes there: %r" % got)
            w.close()
        t, f, w = hello_answer(d, "cpu:1")
        check(t == ERROR and f["code"] == E_VERSION and "'cpu:1'" in f["text"] and "(it drives: cpu)" in f["text"],
              "cpu:1 is refused, naming the devices offered: %r" % f)
        expect_closed(w, 1008, "cpu:1")
    finally:
        d.stop()
    d = Daemon("cpuopts", "--devices", "cpu,cpu?threads=2")
    try:
        t, f, w = hello_answer(d, "cpu")
        check(t == WELCOME and f["devices"] == ["cpu"],
              "WELCOME lists the device configured without options, never cpu?threads=2: %r" % f)
        w.close()
    finally:
        d.stop()
    d = Daemon("optsonly", "--devices", "cpu?threads=2")
    try:
        t, f, w = hello_answer(d, "cpu")
        check(t == ERROR and f["code"] == E_VERSION and "it offers none" in f["text"],
              "a HELLO for cpu never gets the cpu?threads=2 device: %r" % f)
        expect_closed(w, 1008, "cpu against cpu?threads=2")
        t, f, w = hello_answer(d, "cpu?threads=2")
        check(t == ERROR and f["code"] == E_PROTOCOL, "a HELLO cannot carry options: %r" % f)
        expect_closed(w, 1002, "cpu?threads=2 in a HELLO")
    finally:
        d.stop()
    try:
        d = Daemon("vulkan0", "--devices", "vulkan:0")
    except RuntimeError as e:
        print("SKIP: vulkan:0 does not open here: %s" % str(e)[-200:], flush=True)
        return
    try:
        for name in ("vulkan", "vulkan:0"):
            t, f, w = hello_answer(d, name)
            check(t == WELCOME and f["devices"] == ["vulkan:0"],
                  "kilnd driving vulkan:0 welcomes a HELLO for %s: %r" % (name, f))
            w.close()
    finally:
        d.stop()


def main():
    d = Daemon("main", "--remote-max-live-bytes", "4096", "--remote-max-ids", "8",
               "--remote-max-queued-ops", "64", "--remote-max-message-bytes", "4096")
    try:
        for t in (test_handshake, test_basic, test_pipelined_error, test_isolation, test_quotas,
                  test_hostile_operands, test_framing, test_disconnect_frees):
            try:
                t(d)
            except Exception as e:  # a protocol surprise fails the test, not the run
                check(False, "%s raised %r" % (t.__name__, e))
        check(d.proc.poll() is None, "kilnd still running")
        d.stop()
        test_session_limit_and_tokens()
        test_sessions_off()
        test_device_identity()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    if FAILURES:
        print("%d failure(s); logs in %s" % (len(FAILURES), TMP))
        sys.exit(1)
    shutil.rmtree(TMP, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
