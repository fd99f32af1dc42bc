#!/usr/bin/env python3
"""Defences of kilnd's HTTP/1.1 server, over raw sockets: chunk data not
followed by CRLF is 400 at once (no smuggled second request, no wait for the request timeout);
header fields kilnd reads are kept whole up to max_header_bytes (a long bearer token, X-Request-Id,
Content-Type); a token no request could carry within max_header_bytes is refused at start, judged
on the final configuration (a config file's long token with the limit raised by the environment
starts and is let in; one lowered again by a flag is refused, naming both); a
transfer coding other than chunked is 501; percent-encoded path segments are decoded once (%2F and
%00 refused); and a request that stalls while arriving when SIGTERM comes is answered 503 after
the drain's short grace instead of holding the stop for drain_timeout_ms.

Usage: test_http_hardening.py KILND FIXTURES   (FIXTURES is tests/fixtures)
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

KILND, FIX = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="kilnd-http-hardening-")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
FAILURES = []
TOKEN = "t" * 3000  # far past the old 512-byte Authorization slot, well within 8192
DRAIN_MS = 20000


def check(cond, what):
    if not cond:
        FAILURES.append(what)
    print(("ok:   " if cond else "FAIL: ") + what, flush=True)


def exchange(port, data, timeout=10):
    """Everything kilnd sends back for data, until it closes (or timeout): (bytes, seconds, closed)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    t0 = time.time()
    s.sendall(data)
    buf, closed = b"", False
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                closed = True
                break
            buf += chunk
    except socket.timeout:
        pass
    s.close()
    return buf, time.time() - t0, closed


def status_of(resp):
    try:
        return int(resp.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def start(data, logpath, extra_env=None, args=()):
    env = dict(ENV, **(extra_env or {}))
    return subprocess.Popen([KILND, "--port", "0", "--data-dir", data, "--drain-timeout-ms", str(DRAIN_MS)]
                            + list(args), stdout=subprocess.DEVNULL, stderr=open(logpath, "wb"), env=env)


def wait_port(proc, data, logpath):
    portfile = os.path.join(data, "kilnd.port")
    deadline = time.time() + 30
    while not os.path.exists(portfile):
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("kilnd did not start: " + open(logpath).read())
        time.sleep(0.01)
    time.sleep(0.05)
    return int(open(portfile).read())


def auth():
    return b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"


def test_chunks(port):
    r, _, closed = exchange(port, b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n" + auth() +
                            b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n"
                            b"GET /v2/models/stats HTTP/1.1\r\nHost: x\r\n\r\n")
    check(status_of(r) == 400 and r.count(b"HTTP/1.1 ") == 1 and closed,
          "chunk data overrunning its size: one 400, nothing smuggled, closed (%r)" % r[:60])
    r, secs, closed = exchange(port, b"POST /v2/models/mnist_mlp/infer HTTP/1.1\r\nHost: x\r\n" + auth() +
                               b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n")
    check(status_of(r) == 400 and b'{"error":' in r and closed and secs < 5,
          "chunk without CRLF after its data: 400 at once (%.1fs, %r)" % (secs, r[:40]))
    r, _, _ = exchange(port, b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n" + auth() +
                       b"Transfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    check(status_of(r) == 501 and b"gzip" in r, "Transfer-Encoding gzip, chunked is 501 naming gzip (%r)" % r[:60])
    r, _, _ = exchange(port, b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n" + auth() +
                       b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n2;x=1\r\n{}\r\n0\r\nX-T: 1\r\n\r\n")
    check(status_of(r) == 200, "chunked with an extension and a trailer still works (%r)" % r[:40])


def test_long_fields(port):
    r, _, _ = exchange(port, b"GET /v2/models/stats HTTP/1.1\r\nHost: x\r\n" + auth() + b"Connection: close\r\n\r\n")
    check(status_of(r) == 200, "a 3000-byte bearer token is accepted (%r)" % r[:40])
    for n, kept in ((128, True), (129, False), (1000, False)):
        rid = b"r" * n
        r, _, _ = exchange(port, b"GET /v2/models/stats HTTP/1.1\r\nHost: x\r\n" + auth() + b"X-Request-Id: " +
                           rid + b"\r\nConnection: close\r\n\r\n")
        echoed = (b"X-Request-Id: " + rid + b"\r\n") in r
        check(status_of(r) == 200 and echoed == kept and (kept or b"X-Request-Id: kiln-" in r),
              "X-Request-Id of %d characters: 200, %s" % (n, "echoed" if kept else "replaced by a generated id"))
    long_ct = b"application/json; " + b"x=y; " * 100
    r, _, _ = exchange(port, b"GET /v2/models/stats HTTP/1.1\r\nHost: x\r\n" + auth() + b"Content-Type: " +
                       long_ct + b"\r\nAccept-Encoding: " + b"c1;q=0.1, " * 60 + b"gzip\r\n"
                       b"Connection: keep-alive, " + b"X-Hop, " * 40 + b"close\r\n\r\n")
    check(status_of(r) == 200, "long Content-Type, Accept-Encoding and Connection: no 431 (%r)" % r[:40])
    r, _, closed = exchange(port, b"GET /v2/models/stats HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n")
    check(status_of(r) == 431 and closed, "past max_header_bytes is still 431")


def test_paths(port):
    for path, want in ((b"/v2/models/mnist%5fmlp/ready", 200), (b"/v2/models/%6dnist_mlp", 200),
                       (b"/v2/models/%2e%2e%2fmnist_mlp/ready", 400), (b"/v2/models/mnist_mlp%00/ready", 400),
                       (b"/v2/models/%2e%2e/ready", 400), (b"/v2/models/%zz/ready", 400),
                       (b"/v2/health/l%69ve", 200)):
        r, _, _ = exchange(port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + auth() + b"Connection: close\r\n\r\n")
        check(status_of(r) == want and (want == 200 or b'{"error":' in r),
              "GET %s is %d (%r)" % (path.decode(), want, r[:40]))


def test_token_too_long_refused(data):
    logpath = os.path.join(TMP, "long-token.log")
    for env, args in (({"KILN_API_TOKENS": "admin:" + "t" * 8150}, ()),
                      ({"KILN_API_TOKENS": "admin:" + "t" * 600}, ("--max-header-bytes", "512"))):
        proc = start(data, logpath, env, args)
        try:
            rc = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        msg = open(logpath).read()
        check(rc not in (None, 0) and "max_header_bytes" in msg,
              "a token no request can carry is refused at start (rc %s): %s" % (rc, msg.strip()[-200:]))


def test_long_token_layers(data):
    """The token rule relates two settings, so it holds of the merged configuration: a token set in
    the config file fits once the environment raises max_header_bytes, whichever layer came first."""
    token = "l0ng" * 2250  # 9000 bytes: more than the default 8192-byte header block holds
    cfg = os.path.join(TMP, "long-token.json")
    with open(cfg, "w") as f:
        json.dump({"api_tokens": ["read:" + token]}, f)
    logpath = os.path.join(TMP, "long-token-layers.log")
    proc = start(data, logpath, {"KILN_MAX_HEADER_BYTES": "16384"}, ("--config", cfg))
    try:
        port = wait_port(proc, data, logpath)
        r, _, _ = exchange(port, b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                           token.encode() + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        check(status_of(r) == 200, "a file's 9000-byte token with KILN_MAX_HEADER_BYTES=16384 starts and is let "
              "in: %r" % r[:60])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=DRAIN_MS / 1000 + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with open(cfg, "w") as f:
        json.dump({"limits": {"max_header_bytes": 16384}, "api_tokens": ["read:" + token]}, f)
    proc = start(data, logpath, None, ("--config", cfg, "--max-header-bytes", "8192"))
    try:
        rc = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    msg = open(logpath).read()
    check(rc not in (None, 0) and "api_tokens: entry 1 (from config file %s) is a 9000-byte token" % cfg in msg
          and "limits.max_header_bytes (8192, from command-line flag --max-header-bytes;" in msg and token not in msg,
          "the file's limit lowered again by a flag is refused, naming both and where each came from (rc %s): %s"
          % (rc, msg.strip()[-300:]))


def test_drain(proc, port):
    socks = {}
    for label, data in (("half-sent header", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"),
                        ("half-sent body", b"POST /v2/models/mnist_mlp/infer HTTP/1.1\r\nHost: x\r\n" + auth() +
                         b"Content-Length: 100\r\n\r\n{"),
                        ("idle", None)):
        s = socket.create_connection(("127.0.0.1", port), timeout=DRAIN_MS / 1000 + 5)
        if data:
            s.sendall(data)
        socks[label] = s
    time.sleep(0.3)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=DRAIN_MS / 1000 + 10)
    except subprocess.TimeoutExpired:
        proc.kill()
    secs = time.time() - t0
    check(secs < 5, "SIGTERM with requests still arriving: kilnd gone in %.1fs (drain_timeout_ms %d)" %
          (secs, DRAIN_MS))
    for label, s in socks.items():
        buf = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except OSError:
            pass
        if label == "idle":
            check(buf == b"", "idle connection closed without an answer")
        else:
            check(status_of(buf) == 503 and b"Connection: close" in buf and b'{"error":' in buf,
                  "%s answered 503 with a JSON error and Connection: close (%r)" % (label, buf[:40]))


def main():
    data = os.path.join(TMP, "data")
    os.makedirs(os.path.join(data, "models"))
    shutil.copytree(os.path.join(FIX, "serving", "mnist_mlp"), os.path.join(data, "models", "mnist_mlp"))
    logpath = os.path.join(TMP, "kilnd.log")
    proc = start(data, logpath, {"KILN_API_TOKENS": "admin:" + TOKEN})
    try:
        port = wait_port(proc, data, logpath)
        deadline = time.time() + 30
        while time.time() < deadline:
            r, _, _ = exchange(port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            if status_of(r) == 200:
                break
            time.sleep(0.05)
        test_chunks(port)
        test_long_fields(port)
        test_paths(port)
        test_drain(proc, port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    test_token_too_long_refused(data)
    test_long_token_layers(data)
    if FAILURES:
        print(open(logpath).read()[-3000:])
        print("%d failure(s)" % len(FAILURES))
        return 1
    shutil.rmtree(TMP, ignore_errors=True)
    print("http hardening: chunks, long fields, tokens, transfer codings, paths and the drain as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
