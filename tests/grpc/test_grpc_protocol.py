#!/usr/bin/env python3
"""kilnd's gRPC port keeps to gRPC over HTTP/2 (grpc/doc/PROTOCOL-HTTP2.md) where a request is not a
gRPC call, and bounds its connections:

- a content-type other than application/grpc is HTTP 415, a :method other than POST HTTP 405 with
  "allow: POST" (each with grpc-status and grpc-message for gRPC clients, as grpc-go sends them);
- a request without "te: trailers" is served (gRPC's own clients send it; grpc-go and grpc-java
  serve requests without it), one with another te value is reset (malformed HTTP/2, RFC 9113);
- a call refused while its client is still sending (an unknown method, a message over the limit,
  a refusal at the HTTP level) gets its status and then RST_STREAM(NO_ERROR), after the status;
  a call whose client had finished gets no reset; the connection goes on serving either way;
- past limits.max_connections (HTTP and gRPC together) a gRPC connection is sent GOAWAY
  ENHANCE_YOUR_CALM naming no stream and closed, an HTTP one 503 with Retry-After, a grpcio
  client fails fast; the connections within the limit are served meanwhile; a run of refusals is
  logged once, counted on /metrics, and the refused connections' descriptors come back.

Usage: test_grpc_protocol.py KILND FIXTURES   (FIXTURES is tests/fixtures)

Runs under KILN_TEST_PYTHON, as test_grpc.py (whose daemon and raw HTTP/2 client it uses).
"""
import os
import shutil
import socket
import struct
import time

import test_grpc as base  # also re-runs this script under KILN_TEST_PYTHON
from test_grpc import DATA, GOAWAY, HEADERS, INFER, RST_STREAM, H2, check, frame, message

import grpc
import numpy as np
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

NO_ERROR, PROTOCOL_ERROR, ENHANCE_YOUR_CALM = 0, 1, 11
LIVE = "/inference.GRPCInferenceService/ServerLive"
LIMIT = 3


def header(h, sid, name):
    for k, v in h.headers.get(sid, []):
        if k == name:
            return v
    return None


def rst_code(h, sid):
    for f in h.frames:
        if f[0] == RST_STREAM and f[2] == sid and len(f[3]) == 4:
            return struct.unpack(">I", f[3])[0]
    return None


def reset_after_status(h, sid):
    """Whether sid's RST_STREAM came after the HEADERS frame that ended its answer."""
    ends = [i for i, f in enumerate(h.frames) if f[0] == HEADERS and f[2] == sid and f[1] & 1]
    rsts = [i for i, f in enumerate(h.frames) if f[0] == RST_STREAM and f[2] == sid]
    return bool(ends and rsts) and ends[0] < rsts[0]


def headers_of(h, method="POST", content_type="application/grpc", te="trailers", path=INFER):
    hdr = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "kiln")]
    if content_type is not None:
        hdr.append(("content-type", content_type))
    if te is not None:
        hdr.append(("te", te))
    return h.enc.encode(hdr + [("authorization", "Bearer " + base.ADMIN)])


def still_serves(h, sid):
    h.send(h.request(sid, INFER, end=False) + frame(DATA, 1, sid, message(base.infer_body())))
    return h.read_until(lambda: h.status(sid) is not None, timeout=10) and h.status(sid) == 0


def test_http_level_refusals(d):
    h = H2(d)
    # text/plain, the client still sending: 415, then the stream reset with NO_ERROR
    h.send(frame(HEADERS, 0x4, 1, headers_of(h, content_type="text/plain")) +
           frame(DATA, 0, 1, message(base.infer_body())))
    h.read_until(lambda: rst_code(h, 1) is not None)
    check(header(h, 1, ":status") == "415" and h.status(1) == 3 and "application/grpc" in h.message_of(1),
          "content-type text/plain: HTTP 415, grpc-status INVALID_ARGUMENT saying why (%s, %s %r)"
          % (header(h, 1, ":status"), h.status(1), h.message_of(1)))
    check(rst_code(h, 1) == NO_ERROR and reset_after_status(h, 1),
          "the client still sending after the 415 is told to stop: RST_STREAM NO_ERROR after the status (%s)"
          % rst_code(h, 1))
    # the rest of that request arriving after the reset is dropped; the connection goes on
    h.send(frame(DATA, 1, 1, message(base.infer_body())))
    check(still_serves(h, 3), "after the 415 and its reset the connection serves a call")

    # no content-type at all: 415 too
    h.send(frame(HEADERS, 0x5, 5, headers_of(h, content_type=None)))
    h.read_until(lambda: h.status(5) is not None)
    check(header(h, 5, ":status") == "415" and rst_code(h, 5) is None,
          "no content-type: HTTP 415, and no reset for a request that had ended (%s, reset %s)"
          % (header(h, 5, ":status"), rst_code(h, 5)))

    # GET (ended with its headers): 405 with allow: POST, no reset
    h.send(frame(HEADERS, 0x5, 7, headers_of(h, method="GET")))
    h.read_until(lambda: h.status(7) is not None)
    check(header(h, 7, ":status") == "405" and header(h, 7, "allow") == "POST" and rst_code(h, 7) is None,
          "GET: HTTP 405 with allow: POST, no reset (%s, allow %r, reset %s, grpc-status %s %r)"
          % (header(h, 7, ":status"), header(h, 7, "allow"), rst_code(h, 7), h.status(7), h.message_of(7)))
    # PUT with a body on its way: 405, then RST_STREAM NO_ERROR
    h.send(frame(HEADERS, 0x4, 9, headers_of(h, method="PUT")) + frame(DATA, 0, 9, b"\0\0\0"))
    h.read_until(lambda: rst_code(h, 9) is not None)
    check(header(h, 9, ":status") == "405" and rst_code(h, 9) == NO_ERROR and reset_after_status(h, 9),
          "PUT with its body still coming: 405, then RST_STREAM NO_ERROR (%s, %s)"
          % (header(h, 9, ":status"), rst_code(h, 9)))

    # te: absent is served; te: gzip is malformed HTTP/2, reset by nghttp2 with PROTOCOL_ERROR
    h.send(frame(HEADERS, 0x4, 11, headers_of(h, te=None)) + frame(DATA, 1, 11, message(base.infer_body())))
    h.read_until(lambda: h.status(11) is not None, timeout=10)
    check(h.status(11) == 0, "a call without te: trailers is served (status %s %r)" % (h.status(11), h.message_of(11)))
    h.send(frame(HEADERS, 0x4, 13, headers_of(h, te="gzip")) + frame(DATA, 1, 13, message(base.infer_body())))
    h.read_until(lambda: rst_code(h, 13) is not None)
    check(rst_code(h, 13) == PROTOCOL_ERROR and h.status(13) is None,
          "te: gzip: the stream is reset with PROTOCOL_ERROR, unanswered (%s)" % rst_code(h, 13))
    check(still_serves(h, 15), "after the refusals the same connection still serves a call")
    h.close()


def test_reset_after_refusal(d):
    h = H2(d)
    # an unknown method is refused at its headers: the client's message is not waited for
    h.send(h.request(1, "/inference.GRPCInferenceService/NoSuchMethod", end=False) + frame(DATA, 0, 1, b"\0\0\0"))
    h.read_until(lambda: rst_code(h, 1) is not None)
    check(h.status(1) == 12 and header(h, 1, ":status") == "200" and rst_code(h, 1) == NO_ERROR and
          reset_after_status(h, 1),
          "an unknown method, its message still coming: UNIMPLEMENTED at once, then RST_STREAM NO_ERROR "
          "(status %s, reset %s)" % (h.status(1), rst_code(h, 1)))
    # a length prefix past the limit: RESOURCE_EXHAUSTED before the body, then the reset
    h.send(h.request(3, INFER, end=False) + frame(DATA, 0, 3, b"\0" + struct.pack(">I", base.MAX_BODY + 1)))
    h.read_until(lambda: rst_code(h, 3) is not None)
    check(h.status(3) == 8 and rst_code(h, 3) == NO_ERROR and reset_after_status(h, 3),
          "a message over the limit, its body still coming: RESOURCE_EXHAUSTED, then RST_STREAM NO_ERROR "
          "(status %s, reset %s)" % (h.status(3), rst_code(h, 3)))
    # a client that ignores the reset and goes on sending: dropped, the connection stays
    h.send(frame(DATA, 0, 3, b"x" * 16000) * 4 + frame(DATA, 1, 3, b"x"))
    # an unknown method whose client had finished, and a call that succeeds: no reset
    h.send(h.request(5, "/other.Service/Method", end=False) + frame(DATA, 1, 5, message(b"")))
    h.read_until(lambda: h.status(5) is not None)
    check(h.status(5) == 12 and "unknown service or method" in h.message_of(5) and rst_code(h, 5) is None,
          "an unknown method whose request had ended: UNIMPLEMENTED, no reset (%s %r, reset %s)"
          % (h.status(5), h.message_of(5), rst_code(h, 5)))
    check(still_serves(h, 7) and rst_code(h, 7) is None, "a successful call on that connection: no reset")
    check(not h.has(GOAWAY) and not h.closed, "the connection survives the refusals and the ignored reset")
    h.close()


def test_grpcio_unaffected(d):
    """grpcio (tritonclient's transport, and a bare channel) sends te: trailers and POST: served."""
    c = tg.InferenceServerClient(d.target)
    i = tg.InferInput("input", list(base.X.shape), "FP32")
    i.set_data_from_numpy(base.X)
    r = c.infer("mnist_mlp", [i], headers=base.AUTH)
    check(np.allclose(r.as_numpy("logits"), base.WANT, atol=1e-4), "tritonclient.grpc infers as before")
    c.close()
    ch = grpc.insecure_channel(d.target)
    try:
        ch.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")(b"", timeout=10)
        check(False, "a grpcio call to an unknown method fails")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNIMPLEMENTED, "a grpcio call to an unknown method: UNIMPLEMENTED (%s)"
              % e.code())
    ch.close()


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def goaway_of(h):
    """(last stream id, error code) of the first GOAWAY h got, or None."""
    for f in h.frames:
        if f[0] == GOAWAY and len(f[3]) >= 8:
            return struct.unpack(">I", f[3][:4])[0] & 0x7FFFFFFF, struct.unpack(">I", f[3][4:8])[0]
    return None


def served_connection(d):
    """An H2 connection kilnd serves (one whose call is answered), retried while the limit still
    counts a connection that has just closed."""
    deadline = time.time() + 10
    while time.time() < deadline:
        h = H2(d)
        if still_serves(h, 1):
            return h
        h.close()
        time.sleep(0.2)
    return None


def test_connection_limit():
    d = base.Daemon("limit", ["--max-connections", str(LIMIT)])
    try:
        c = tg.InferenceServerClient(d.target)
        check(base.wait_ready(c, "mnist_mlp"), "the limited daemon loads its model")
        c.close()
        held = [served_connection(d) for _ in range(LIMIT)]
        check(all(held), "%d connections, the limit, are served" % LIMIT)
        if not all(held):
            return
        fds = fd_count(d.proc.pid)
        log_before = len(open(d.log).read())

        over = H2(d)
        over.send(over.request(1, INFER, end=False) + frame(DATA, 1, 1, message(base.infer_body())))
        over.read_until(lambda: over.closed, timeout=5)
        check(goaway_of(over) == (0, ENHANCE_YOUR_CALM) and over.closed and over.status(1) is None,
              "a gRPC connection past the limit: GOAWAY ENHANCE_YOUR_CALM naming no stream, then closed, "
              "its call unanswered (GOAWAY %s, closed %s)" % (goaway_of(over), over.closed))
        over.close()

        s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: kilnd\r\n\r\n")
        got = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        s.close()
        check(got.startswith(b"HTTP/1.1 503") and b"Retry-After: 1\r\n" in got and
              b"max_connections" in got and b"Connection: close" in got,
              "an HTTP connection past the limit: 503 with Retry-After, then closed: %r" % got[:200])

        t0 = time.time()
        refused = tg.InferenceServerClient(d.target)
        try:
            refused.is_server_live(client_timeout=10)
            check(False, "a grpcio client past the limit is refused")
        except InferenceServerException as e:
            check(e.status() == "StatusCode.UNAVAILABLE" and time.time() - t0 < 5,
                  "a grpcio client past the limit fails fast, UNAVAILABLE (%s in %.1f s: %s)"
                  % (e.status(), time.time() - t0, e.message()))
        refused.close()

        # a burst of refusals, more than may be answered at once (64): each told or cut, none kept
        burst = []
        for _ in range(100):
            try:
                burst.append(socket.create_connection(("127.0.0.1", d.grpc_port), timeout=5))
            except OSError:
                pass
        check(all(still_serves(h, 3) for h in held), "the connections within the limit are served meanwhile")
        for b in burst:
            b.close()
        deadline = time.time() + 5
        while fd_count(d.proc.pid) > fds and time.time() < deadline:
            time.sleep(0.1)
        check(fd_count(d.proc.pid) <= fds and d.proc.poll() is None,
              "the refused connections' descriptors come back (%d, %d before the burst)"
              % (fd_count(d.proc.pid), fds))

        held.pop().close()
        held.pop().close()
        time.sleep(0.3)
        c = tg.InferenceServerClient(d.target)
        i = tg.InferInput("input", list(base.X.shape), "FP32")
        i.set_data_from_numpy(base.X)
        try:
            r = c.infer("mnist_mlp", [i], headers=base.AUTH)
            ok = np.allclose(r.as_numpy("logits"), base.WANT, atol=1e-4)
        except InferenceServerException as e:
            ok = str(e)
        check(ok is True, "once connections close, a grpcio client is served again: %s" % ok)
        c.close()
        # the last held connection goes before /metrics is read: grpcio closes its channel
        # asynchronously, and with that one still open the scrape itself could be refused and
        # start a second run of refusals in the log
        for h in held:
            h.close()
        time.sleep(0.2)
        refused_grpc = d.metric('kiln_connections_refused_total{listener="grpc"}')
        refused_http = d.metric('kiln_connections_refused_total{listener="http"}')
        check(refused_grpc >= 100 and refused_http >= 1,
              "/metrics counts the refusals by listener (grpc %s, http %s)" % (refused_grpc, refused_http))
        log = open(d.log).read()[log_before:]
        check(log.count("refused a connection from") == 1 and "serving connections again (one closed); " in log
              and "at limits.max_connections (" in log and "HTTP and gRPC together)" in log,
              "the run of refusals is logged once, and its end with the count (%d lines)"
              % log.count("refused a connection from"))
    finally:
        d.stop()
        if base.FAILURES:
            print(open(d.log).read()[-3000:])


def main():
    d = base.Daemon("protocol")
    try:
        c = tg.InferenceServerClient(d.target)
        check(base.wait_ready(c, "mnist_mlp"), "the model loads")
        c.close()
        test_http_level_refusals(d)
        test_reset_after_refusal(d)
        test_grpcio_unaffected(d)
    finally:
        d.stop()
        if base.FAILURES:
            print(open(d.log).read()[-3000:])
    try:
        test_connection_limit()
    finally:
        shutil.rmtree(base.TMP, ignore_errors=True)
    if base.FAILURES:
        print("%d check(s) failed:" % len(base.FAILURES))
        for f in base.FAILURES:
            print("  " + f)
        raise SystemExit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
