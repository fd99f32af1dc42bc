#!/usr/bin/env python3
"""HTTP details of kilnd seen from a raw socket: "Expect: 100-continue" gets the interim 100 before
the body is sent and the final answer after it (a body over max_body_bytes gets 413 at once, with
no 100; another expectation gets 417); whitespace after a bearer token is not part of it; and
with --log-access on, inference answered by a worker is logged as well as the requests the loop
answers itself.

Usage: test_http_details.py KILND FIXTURES   (FIXTURES is tests/fixtures)
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
TMP = tempfile.mkdtemp(prefix="kilnd-http-details-")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
FAILURES = []
READ = "r3ad-secret"
MAX_BODY = 1 << 20
EXPECTED = json.load(open(os.path.join(FIX, "serving", "expected.json")))


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


class Conn:
    """A raw HTTP/1.1 connection: what is sent is exactly what is written here."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def head(self, timeout):
        """The next response's status line and headers (up to the blank line), or None on timeout."""
        self.s.settimeout(timeout)
        try:
            while b"\r\n\r\n" not in self.buf:
                chunk = self.s.recv(65536)
                if not chunk:
                    return None
                self.buf += chunk
        except socket.timeout:
            return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        return head.decode() + "\r\n\r\n"

    def response(self, timeout=20):
        """(status, headers, body) of the next whole response."""
        head = self.head(timeout)
        if head is None:
            return 0, {}, b""
        lines = head.split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            chunk = self.s.recv(65536)
            if not chunk:
                break
            self.buf += chunk
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, headers, body

    def closed(self, timeout=5):
        self.s.settimeout(timeout)
        try:
            while True:
                chunk = self.s.recv(65536)
                if not chunk:
                    return True
        except (socket.timeout, ConnectionResetError):
            return False

    def close(self):
        self.s.close()


def infer_body():
    return json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784],
                                   "data": EXPECTED["input"][0]}]}).encode()


def request(path, body, extra=""):
    return ("POST %s HTTP/1.1\r\nHost: kilnd\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n%s\r\n" % (path, READ, len(body), extra)).encode()


def close_to(a, b, tol=1e-4):
    return len(a) == len(b) and all(abs(x - y) <= tol * (1 + abs(y)) for x, y in zip(a, b))


def test_expect_continue(port):
    body = infer_body()
    c = Conn(port)
    c.send(request("/v2/models/mnist_mlp/infer", body, "Expect: 100-continue\r\nX-Request-Id: expect-1\r\n"))
    interim = c.head(timeout=5)
    check(interim == "HTTP/1.1 100 Continue\r\n\r\n",
          "Expect: 100-continue: the 100 comes before the body is sent (got %r)" % interim)
    c.send(body)
    st, _, data = c.response()
    ok = st == 200 and close_to(json.loads(data)["outputs"][0]["data"], EXPECTED["logits"][0])
    check(ok, "after the 100 and the body, the inference answers right: %d %r" % (st, data[:200]))
    # The same connection goes on: a request without Expect gets no 100.
    c.send(request("/v2/models/mnist_mlp/infer", body) + body)
    st, _, _ = c.response()
    check(st == 200, "the next request on the connection is answered without a 100: %d" % st)
    c.close()

    # Declared too large: 413 at once, no 100 before it, and the connection closes.
    c = Conn(port)
    c.send(("POST /v2/models/mnist_mlp/infer HTTP/1.1\r\nHost: kilnd\r\nAuthorization: Bearer %s\r\n"
            "Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (READ, MAX_BODY + 1)).encode())
    st, _, data = c.response(timeout=5)
    check(st == 413 and (b"limits.max_body_bytes (%d bytes)" % MAX_BODY) in data,
          "a declared body over the limit: 413 first, naming the limit, no 100: %d %r"
          % (st, data[:200]))
    check(c.closed(), "the connection closes after the 413")
    c.close()

    # An expectation kilnd cannot meet: 417 with a JSON error.
    c = Conn(port)
    c.send(request("/v2/models/mnist_mlp/infer", body, "Expect: 200-ok\r\n"))
    st, _, data = c.response(timeout=5)
    check(st == 417 and "error" in json.loads(data or b"{}"), "Expect: 200-ok: 417 with an error: %d %r"
          % (st, data[:200]))
    c.close()


def test_bearer_whitespace(port):
    for value in ("Bearer %s " % READ, "Bearer %s\t" % READ, "Bearer   %s  " % READ):
        c = Conn(port)
        c.send(("GET /v2/models/mnist_mlp HTTP/1.1\r\nHost: kilnd\r\nAuthorization: %s\r\n\r\n" % value).encode())
        st, _, data = c.response()
        check(st == 200, "Authorization %r: whitespace around the token is not part of it: %d %r"
              % (value, st, data[:200]))
        c.close()
    c = Conn(port)
    c.send(("GET /v2/models/mnist_mlp HTTP/1.1\r\nHost: kilnd\r\nAuthorization: Bearer %s x\r\n\r\n" % READ)
           .encode())
    st, _, _ = c.response()
    check(st == 401, "a token followed by more than whitespace stays unknown: %d" % st)
    c.close()


def test_access_log(port, logpath):
    body = infer_body()
    c = Conn(port)
    c.send(request("/v2/models/mnist_mlp/infer", body, "X-Request-Id: access-ok-1\r\n") + body)
    st, _, _ = c.response()
    check(st == 200, "inference answers: %d" % st)
    bad = b'{"inputs": []}'
    c.send(request("/v2/models/mnist_mlp/infer", bad, "X-Request-Id: access-bad-1\r\n") + bad)
    st, _, _ = c.response()
    check(st == 400, "a bad inference is refused: %d" % st)
    c.close()
    lines = []
    deadline = time.time() + 5
    while time.time() < deadline:
        lines = [l for l in open(logpath).read().splitlines() if "access POST /v2/models/mnist_mlp/infer" in l]
        if any("id=access-ok-1" in l for l in lines) and any("id=access-bad-1" in l for l in lines):
            break
        time.sleep(0.05)
    ok = [l for l in lines if "id=access-ok-1" in l]
    check(len(ok) == 1 and " 200 " in ok[0] and "in=%d" % len(body) in ok[0],
          "the worker-answered inference is logged once, with its status and body size: %r" % ok)
    check(len([l for l in lines if "id=access-bad-1" in l and " 400 " in l]) == 1,
          "the refused inference is logged once: %r" % lines)
    check(len([l for l in lines if "id=expect-1" in l and " 200 " in l]) == 1,
          "the inference sent after a 100 Continue is logged: %r" % lines)


def main():
    data = os.path.join(TMP, "data")
    os.makedirs(os.path.join(data, "models"))
    shutil.copytree(os.path.join(FIX, "serving", "mnist_mlp"), os.path.join(data, "models", "mnist_mlp"))
    env = dict(ENV, KILN_API_TOKENS="read:" + READ)
    logpath = os.path.join(TMP, "kilnd.log")
    proc = subprocess.Popen([KILND, "--port", "0", "--data-dir", data, "--log-access", "on",
                             "--max-body-bytes", str(MAX_BODY)],
                            stdout=subprocess.DEVNULL, stderr=open(logpath, "wb"), env=env)
    try:
        portfile = os.path.join(data, "kilnd.port")
        deadline = time.time() + 30
        while not os.path.exists(portfile):
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("kilnd did not start: " + open(logpath).read())
            time.sleep(0.01)
        port = int(open(portfile).read())
        while time.time() < deadline:
            c = Conn(port)
            c.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: kilnd\r\n\r\n")
            st, _, _ = c.response()
            c.close()
            if st == 200:
                break
            time.sleep(0.02)
        test_expect_continue(port)
        test_bearer_whitespace(port)
        test_access_log(port, logpath)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            check(False, "kilnd did not stop on SIGTERM")
    if FAILURES:
        print(open(logpath).read()[-3000:])
        print("%d failure(s)" % len(FAILURES))
        return 1
    shutil.rmtree(TMP, ignore_errors=True)
    print("http details: Expect, bearer whitespace and the access log as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
