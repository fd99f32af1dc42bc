#!/usr/bin/env python3
"""Known HTTP/2 attacks on kilnd's gRPC port, by hand (test_grpc.py has the others): a client that
resets calls as fast as it opens them (rapid reset) is cut with GOAWAY ENHANCE_YOUR_CALM; a
streaming call whose client sends but opens no window for the answers is held to its window, and
its connection is cut at the stall limit (limits.idle_timeout_ms), as is one whose unary answers
wait behind a window of 0; a grpc-timeout of thousands of years is no deadline, not a wrapped
one; a content-type that only starts with application/grpc is refused (HTTP 415); and each cut is
logged. Meanwhile another client is answered.

Usage: test_grpc_hostile.py KILND FIXTURES   (FIXTURES is tests/fixtures)

Runs under KILN_TEST_PYTHON, as test_grpc.py (whose daemon and raw HTTP/2 client it uses).
"""
import shutil
import struct
import time

import test_grpc as base  # also re-runs this script under KILN_TEST_PYTHON
from test_grpc import DATA, GOAWAY, HEADERS, INFER, SETTINGS, WINDOW_UPDATE, H2, check, frame, message

import numpy as np
from tritonclient.grpc import service_pb2

RST_STREAM = 3
ENHANCE_YOUR_CALM = 11
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
IDLE_MS = 1500


def rss_kib(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def goaway_code(h):
    for f in h.frames:
        if f[0] == GOAWAY and len(f[3]) >= 8:
            return struct.unpack(">I", f[3][4:8])[0]
    return None


def dtypes_body(rows):
    """A dtypes request of rows x 3 per input; its answer is about as large (x + x, Not(x))."""
    q = service_pb2.ModelInferRequest(model_name="dtypes")
    for n, t, dt in base.TYPES:
        k = np.arange(rows * 3).reshape(rows, 3)
        a = (k % 2 == 0) if t == np.bool_ else (k % 100).astype(t)
        q.inputs.add(name="in_" + n, datatype=dt, shape=list(a.shape))
        q.raw_input_contents.append(a.tobytes())
    return q.SerializeToString()


def other_client_answered(d):
    h = H2(d)
    h.send(h.request(1, INFER, end=False) + frame(DATA, 1, 1, message(base.infer_body())))
    ok = h.read_until(lambda: h.status(1) is not None, timeout=10) and h.status(1) == 0
    h.close()
    return ok


class Windowed(H2):
    """An H2 client that keeps to kilnd's flow-control windows when it sends DATA, and opens
    none of its own (SETTINGS_INITIAL_WINDOW_SIZE 0): it sends and does not take answers."""

    def __init__(self, d):
        super().__init__(d)
        self.send(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 0)))
        self.sent_conn, self.sent_stream = 0, {}

    def windows(self, sid):
        initial = 65535
        for f in self.frames:
            if f[0] == SETTINGS and not f[1] & 1:
                for k in range(0, len(f[3]), 6):
                    key, value = struct.unpack(">HI", f[3][k:k + 6])
                    if key == 4:
                        initial = value
        inc = lambda s: sum(struct.unpack(">I", f[3])[0] & 0x7FFFFFFF for f in self.frames
                            if f[0] == WINDOW_UPDATE and f[2] == s)
        return 65535 + inc(0) - self.sent_conn, initial + inc(sid) - self.sent_stream.get(sid, 0)

    def send_within(self, sid, data, wait=1.0):
        """Sends what is left of earlier data on sid, then data, as the windows allow; False when
        they stay shut for wait seconds (the rest is kept for the next call)."""
        self.pending = getattr(self, "pending", b"") + data
        while self.pending:
            deadline = time.time() + wait
            while min(self.windows(sid)) <= 0:
                if time.time() > deadline or self.closed:
                    return False
                self.read_until(lambda: min(self.windows(sid)) > 0, timeout=0.1)
            n = min(16384, len(self.pending), *self.windows(sid))
            self.send(frame(DATA, 0, sid, self.pending[:n]))
            self.sent_conn += n
            self.sent_stream[sid] = self.sent_stream.get(sid, 0) + n
            self.pending = self.pending[n:]
        return True


def test_rapid_reset(d):
    """HEADERS, a small request and RST_STREAM, over and over on one connection: cut once past
    200 resets (nghttp2's own limit, 1000, is not reached), the queued work cancelled."""
    body = message(dtypes_body(1))
    h = H2(d)
    h.read_until(lambda: h.has(SETTINGS), timeout=2)
    sent = 0
    for chunk in range(9):
        batch = b""
        for k in range(100):
            sid = 1 + 2 * (chunk * 100 + k)
            batch += h.request(sid, INFER, end=False) + frame(DATA, 1, sid, body) + \
                frame(RST_STREAM, 0, sid, struct.pack(">I", 8))
        h.send(batch)
        if h.closed:
            break
        sent += 100
        h.read_until(lambda: h.has(GOAWAY), timeout=0.3)
        if h.has(GOAWAY):
            break
    check(goaway_code(h) == ENHANCE_YOUR_CALM and sent < 900,
          "rapid reset: GOAWAY ENHANCE_YOUR_CALM after %d of 900 reset calls (GOAWAY code %s)"
          % (sent, goaway_code(h)))
    h.close()
    check(other_client_answered(d), "after a rapid reset another client is answered")


def test_stream_without_window(d):
    """ModelStreamInfer, about 250 KB a message, from a client that opens no window: kilnd stops
    giving back window once the answers back up, its memory stays near that, and the call's
    connection is cut at the stall limit. Another client is answered meanwhile."""
    msg = message(dtypes_body(3000))
    count = 400  # 100 MB of requests, as much again of answers
    before = rss_kib(d.proc.pid)
    h = Windowed(d)
    h.send(h.request(1, STREAM_INFER, end=False))
    sent = 0
    while sent < count and h.send_within(1, msg):
        sent += 1
    grown = rss_kib(d.proc.pid) - before
    check(sent < count // 2, "a streaming client that takes no answers is held to its window "
          "(%d of %d messages of %d bytes went)" % (sent, count, len(msg)))
    # held: the backlog limit (4 MiB) and a window (1 MiB) of requests, and their answers, under
    # 16 MiB; 64 MiB leaves room for a sanitizer's quarantine of freed memory, and is well short
    # of the 200 MB that the whole call would leave waiting
    check(grown < 64 * 1024,
          "kilnd's memory stays near the backlog limit meanwhile (+%d KiB)" % grown)
    check(other_client_answered(d), "another client is answered while the streaming call is held")
    h.read_until(lambda: h.has(GOAWAY), timeout=IDLE_MS / 1000 * 4)
    check(goaway_code(h) == ENHANCE_YOUR_CALM, "the held call's connection is cut at the stall limit "
          "(GOAWAY code %s)" % goaway_code(h))
    h.close()

    # The same client opening its windows in the end: every held message is taken, every answer comes.
    h = Windowed(d)
    h.send(h.request(1, STREAM_INFER, end=False))
    sent = 0
    while sent < count and h.send_within(1, msg, wait=0.5):
        sent += 1
    held, total = sent, sent + 10
    h.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF - 65535)) +
           frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 0x7FFFFFFF)))
    if h.send_within(1, b"", wait=5):
        sent += 1  # the message held part way
    while sent < total and h.send_within(1, msg, wait=5):
        sent += 1
    h.send(frame(DATA, 1, 1))
    h.read_until(lambda: h.status(1) is not None, timeout=30)
    answers = b"".join(f[3] for f in h.frames if f[0] == DATA and f[2] == 1)
    n, off = 0, 0
    while off + 5 <= len(answers):
        off += 5 + struct.unpack(">I", answers[off + 1:off + 5])[0]
        n += 1
    check(held < count // 2 and sent == total and h.status(1) == 0 and n == total,
          "a held streaming call goes on once its client opens its windows (%d held, %d sent, %d "
          "answered, status %s %r)" % (held, sent, n, h.status(1), h.message_of(1)))
    h.close()


def test_unary_without_window(d):
    """Unary calls with large answers behind a window of 0: cut at the stall limit."""
    msg = message(dtypes_body(3000))
    h = Windowed(d)
    for k in range(4):
        sid = 1 + 2 * k
        h.send(h.request(sid, INFER, end=False))
        h.send_within(sid, msg)
        h.send(frame(DATA, 1, sid))
    h.read_until(lambda: h.has(GOAWAY), timeout=IDLE_MS / 1000 * 4)
    check(goaway_code(h) == ENHANCE_YOUR_CALM and not any(h.status(1 + 2 * k) is not None for k in range(4)),
          "unary answers behind a window of 0: the connection is cut at the stall limit (GOAWAY code %s)"
          % goaway_code(h))
    h.close()


def test_headers(d):
    h = H2(d)
    # 35868669H wraps 2^64 ns to 116 s short of it, 5124095H does once added to a clock past
    # 35 minutes since boot; 99999999H passes it. Each is thousands of years: no deadline.
    for sid, timeout in ((1, "35868669H"), (3, "5124095H"), (5, "99999999H")):
        h.send(h.request(sid, INFER, [("grpc-timeout", timeout)], end=False) +
               frame(DATA, 1, sid, message(base.infer_body())))
        h.read_until(lambda: h.status(sid) is not None)
        check(h.status(sid) == 0, "grpc-timeout %s is no deadline (status %s %r)"
              % (timeout, h.status(sid), h.message_of(sid)))
    hdr = [(":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "kiln"),
           ("content-type", "application/grpcfoo"), ("te", "trailers"), ("authorization", "Bearer " + base.ADMIN)]
    h.send(frame(HEADERS, 0x4, 7, h.enc.encode(hdr)) + frame(DATA, 1, 7, message(base.infer_body())))
    h.read_until(lambda: h.status(7) is not None)
    check(h.status(7) == 3 and dict(h.headers.get(7, [])).get(":status") == "415",
          "content-type application/grpcfoo: HTTP 415, INVALID_ARGUMENT (%s, %s)"
          % (dict(h.headers.get(7, [])).get(":status"), h.status(7)))
    # A protocol error nghttp2 answers with GOAWAY: kilnd logs it with nghttp2's reason.
    h.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0)))
    h.read_until(lambda: h.has(GOAWAY), timeout=3)
    h.close()


def main():
    d = base.Daemon("hostile", ["--idle-timeout-ms", str(IDLE_MS)])
    try:
        c = base.tg.InferenceServerClient(d.target)
        check(base.wait_ready(c, "mnist_mlp") and base.wait_ready(c, "dtypes"), "both models load")
        c.close()
        test_headers(d)
        test_rapid_reset(d)
        test_stream_without_window(d)
        test_unary_without_window(d)
        check(other_client_answered(d), "after the hostile clients kilnd still infers")
        time.sleep(0.2)
        log = open(d.log).read()
        check("(GOAWAY ENHANCE_YOUR_CALM): the client reset streams faster" in log and
              "flow-control windows let no answer through" in log and
              "window_size_increment == 0" in log,
              "kilnd logs each connection it cut and why")
    finally:
        d.stop()
        if base.FAILURES:
            print(open(d.log).read()[-4000:])
        shutil.rmtree(base.TMP, ignore_errors=True)
    if base.FAILURES:
        print("%d check(s) failed:" % len(base.FAILURES))
        for f in base.FAILURES:
            print("  " + f)
        raise SystemExit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
