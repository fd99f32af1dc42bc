#!/usr/bin/env python3
"""Black-box tests of the built kilnd over real sockets.

Usage: test_daemon.py KILND KILN

Starts kilnd on an ephemeral port (--port 0) with a temporary data folder, reads the port from
<data_dir>/kilnd.port, and checks every endpoint, every bad-input case, the life cycle
(SIGHUP, SIGTERM drain) and the configuration rules. Standard library only.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

KILND, KILN = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="kilnd-test-")
FAILURES = []
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


class Daemon:
    def __init__(self, name, *args, env=None, wait_ready=True):
        self.data = os.path.join(TMP, name)
        self.log = os.path.join(TMP, name + ".stderr")
        e = dict(ENV)
        e.update(env or {})
        argv = [KILND, "--port", "0", "--data-dir", self.data, *args]
        self.errf = open(self.log, "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.errf, env=e)
        self.port = None
        portfile = os.path.join(self.data, "kilnd.port")
        deadline = time.time() + 10
        while time.time() < deadline:
            if os.path.exists(portfile):
                self.port = int(open(portfile).read())
                break
            if self.proc.poll() is not None:
                raise RuntimeError("kilnd exited early: " + open(self.log).read())
            time.sleep(0.01)
        if self.port is None:
            raise RuntimeError("kilnd did not write its port file")
        while wait_ready and time.time() < deadline:
            if request(self.port, "GET", "/v2/health/ready")[0] == 200:
                break
            time.sleep(0.01)

    def stop(self, sig=signal.SIGTERM):
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.errf.close()
        return rc


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(sock, buf=b""):
    """Reads one response; returns (status, headers, body, leftover) or None at EOF."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, headers, rest[:n], rest[n:]


def request(port, method, path, body=None, headers=""):
    with connect(port) as s:
        msg = "%s %s HTTP/1.1\r\nHost: t\r\n%s" % (method, path, headers)
        if body is not None:
            msg += "Content-Length: %d\r\n" % len(body)
        s.sendall(msg.encode() + b"\r\n" + (body or b""))
        r = read_response(s)
        return r[:3] if r else (None, {}, b"")


def closed_by_peer(sock, within=5.0):
    """True when the server closes the connection (EOF or reset) within the time given."""
    sock.settimeout(within)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def is_json_error(status, headers, body, code):
    if status != code:
        return False
    if headers.get("content-type") != "application/json":
        return False
    try:
        return isinstance(json.loads(body)["error"], str)
    except (ValueError, KeyError):
        return False


def test_endpoints(d):
    st, h, b = request(d.port, "GET", "/v2/health/live")
    check(st == 200, "live is 200")
    st, h, b = request(d.port, "GET", "/v2/health/ready")
    check(st == 200, "ready is 200 once started")
    st, h, b = request(d.port, "GET", "/v2")
    meta = json.loads(b)
    check(st == 200 and meta["name"] == "kiln" and isinstance(meta["extensions"], list), "GET /v2 metadata")
    # Triton's name for the system shared-memory extension kilnd serves (docs/shared-memory.md)
    check({"model_repository", "statistics", "binary_tensor_data", "system_shared_memory"} <= set(meta["extensions"]),
          "GET /v2 lists every extension served: %s" % meta["extensions"])
    out = subprocess.run([KILN, "--url", "http://127.0.0.1:%d" % d.port, "version"], capture_output=True, text=True)
    check(out.returncode == 0 and meta["version"] in out.stdout, "kiln version shows the server version")
    st, h, b = request(d.port, "GET", "/metrics")
    text = b.decode()
    check(st == 200 and h["content-type"].startswith("text/plain"), "metrics content type")
    check("kiln_process_uptime_seconds " in text, "metrics: uptime")
    # the standard process collector's metrics, as every Prometheus client library names them
    vals = {}
    for line in text.splitlines():
        if line.startswith("process_"):
            name, value = line.split()
            vals[name] = float(value)
    fds = len(os.listdir("/proc/%d/fd" % d.proc.pid))
    check(abs(vals.get("process_start_time_seconds", 0) - time.time()) < 600 and
          vals.get("process_cpu_seconds_total", 0) > 0 and
          vals.get("process_resident_memory_bytes", 0) > 1 << 20 and
          vals.get("process_virtual_memory_bytes", 0) >= vals.get("process_resident_memory_bytes", 0) and
          abs(vals.get("process_open_fds", -100) - fds) <= 2 and
          vals.get("process_max_fds", 0) >= vals.get("process_open_fds", 0),
          "metrics: the standard process_* series (%d fds open): %s" % (fds, vals))
    check("# TYPE process_cpu_seconds_total counter" in text and "# TYPE process_open_fds gauge" in text,
          "metrics: process_* types")
    # connections against limits.max_connections, both listeners together; refusals at 0 from the start
    check("kiln_connections_max 1024" in text and
          any(l.startswith("kiln_connections_open ") and float(l.split()[1]) >= 1 for l in text.splitlines()) and
          'kiln_connections_refused_total{listener="http"} 0' in text and
          'kiln_connections_refused_total{listener="grpc"} 0' in text,
          "metrics: connections open against the limit, refusals at 0: %s" %
          [l for l in text.splitlines() if l.startswith("kiln_connections")])
    # inference is labelled apart from the models route's probes and metadata reads
    request(d.port, "GET", "/v2/models/nosuch/ready")
    request(d.port, "POST", "/v2/models/nosuch/infer", body=b"{}")
    text = request(d.port, "GET", "/metrics")[2].decode()
    check('kiln_http_requests_total{route="/v2/models/*/infer",code="404"} 1' in text and
          'kiln_http_requests_total{route="/v2/models/*",code="404"} 1' in text and
          'kiln_http_request_duration_seconds_count{route="/v2/models/*/infer"} 1' in text,
          "metrics: /infer requests have their own route label: %s" %
          [l for l in text.splitlines() if "/v2/models" in l and "_bucket" not in l])
    check('kiln_http_requests_total{route="/v2",code="200"} 2' in text, "metrics: requests by route and code")
    check('kiln_http_request_duration_seconds_bucket{route="/v2/health/ready",le="+Inf"}' in text,
          "metrics: latency histogram")
    check("# TYPE kiln_http_request_duration_seconds histogram" in text, "metrics: histogram type")


def test_cli(d):
    url = "http://127.0.0.1:%d" % d.port
    for cmd in ("health", "server", "metrics", "version"):
        out = subprocess.run([KILN, "--url", url, cmd], capture_output=True, text=True)
        check(out.returncode == 0, "kiln %s exits 0" % cmd)
    out = subprocess.run([KILN, "server"], capture_output=True, text=True, env=dict(ENV, KILN_URL=url))
    check(out.returncode == 0 and '"kiln"' in out.stdout, "kiln reads KILN_URL")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    out = subprocess.run([KILN, "--url", "http://127.0.0.1:%d" % dead, "health"], capture_output=True, text=True)
    check(out.returncode == 2 and "cannot reach kilnd" in out.stderr, "kiln: clear error when unreachable")
    for port in ("99999", "0"):
        out = subprocess.run([KILN, "--url", "http://127.0.0.1:" + port, "health"], capture_output=True, text=True)
        check(out.returncode == 2 and "outside 1..65535" in out.stderr,
              "kiln: port %s refused as out of range, not tried (%r)" % (port, out.stderr))


def test_keep_alive_and_pipelining(d):
    with connect(d.port) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\n\r\n")
        r1 = read_response(s)
        s.sendall(b"GET /v2 HTTP/1.1\r\n\r\n")
        r2 = read_response(s)
        check(r1 and r1[0] == 200 and r2 and r2[0] == 200, "two requests on one keep-alive connection")
        burst = b"".join(b"GET /v2/health/ready?i=%d HTTP/1.1\r\nHost: t\r\n\r\n" % i for i in range(100))
        s.sendall(burst)
        got, left = 0, b""
        while got < 100:
            r = read_response(s, left)
            if not r or r[0] != 200:
                break
            got, left = got + 1, r[3]
        check(got == 100, "100 pipelined requests in one write get 100 responses (got %d)" % got)


def read_head_response(sock, buf=b""):
    """Reads the answer to a HEAD: the header block only, whatever its Content-Length says."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


def test_head(d):
    """HEAD wherever GET: GET's status and headers (its body's Content-Length), never a body, so the
    next response on a keep-alive connection is read right (RFC 9110 9.3.2)."""
    try:
        with connect(d.port) as s:
            s.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
            get = read_response(s)
            for path, want in (("/v2", 200), ("/v2/health/ready", 200), ("/v2/health/live", 200), ("/metrics", 200),
                               ("/nope", 404), ("/v2/repository/index", 405)):
                s.sendall(b"HEAD %s HTTP/1.1\r\nHost: x\r\n\r\nGET /v2 HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
                r = read_head_response(s)
                check(r and r[0] == want, "HEAD %s is %s like GET (got %s)" % (path, want, r and r[0]))
                if want == 200 and path != "/metrics":
                    st, h, b = request(d.port, "GET", path)
                    check(r and r[1].get("content-length") == str(len(b)) and r[1].get("content-type") ==
                          h.get("content-type"), "HEAD %s has GET's Content-Length and Content-Type" % path)
                if want == 405:
                    check(r and r[1].get("allow") == "POST", "HEAD where GET is not taken: 405, Allow: POST")
                after = read_response(s, r[2] if r else b"")
                check(after and after[0] == 200 and after[2] == get[2],
                      "after HEAD %s, the next response on the connection is whole and first" % path)
    except (OSError, ValueError, IndexError) as e:  # a body left behind garbles the next response
        check(False, "HEAD then GET on one connection: %r" % e)
    with connect(d.port) as s:
        s.sendall(b"HEAD /v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        check(data.endswith(b"\r\n\r\n") and data.count(b"HTTP/1.1") == 1, "HEAD's answer ends at its headers")


def test_chunked(d):
    with connect(d.port) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"4\r\nkiln\r\n3\r\n!!!\r\n0\r\n\r\n")
        r = read_response(s)
        check(r and r[0] == 200, "chunked request body accepted")
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(4):  # 4 x 512 bytes crosses max_body_bytes=1024
            s.sendall(b"200\r\n" + b"x" * 512 + b"\r\n")
        r = read_response(s)
        check(r and is_json_error(*r[:3], 413), "oversized chunked body is 413")
        check(closed_by_peer(s), "connection closes after 413 (chunked)")


def test_limits(d):
    with connect(d.port) as s:
        s.sendall(b"GET /v2 HTTP/1.1\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n")
        r = read_response(s)
        check(r and is_json_error(*r[:3], 431), "oversized header block is 431")
        check(r and r[1].get("connection") == "close", "431 says Connection: close")
        check(closed_by_peer(s), "connection closes after 431")
    with connect(d.port) as s:
        s.sendall(b"GET /v2 HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + b"y" * 5000)
        r = read_response(s)
        check(r and is_json_error(*r[:3], 413), "oversized body is 413")
        check(closed_by_peer(s), "connection closes after 413")


def test_malformed(d):
    for raw in (b"HELLO\r\n\r\n", b"GET / HTTP/7.0\r\n\r\n", b"GET /v2 HTTP/1.1\r\nNo colon here\r\n\r\n",
                b"GET /v2 HTTP/1.1\r\nContent-Length: -1\r\n\r\n", b"\x00\xff\x16\x03\x01garbage\r\n\r\n",
                b"GET\t/v2 HTTP/1.1\r\n\r\n"):
        with connect(d.port) as s:
            s.sendall(raw)
            r = read_response(s)
            check(r and is_json_error(*r[:3], 400), "malformed %r is 400" % raw[:20])
            check(closed_by_peer(s), "connection closes after 400 %r" % raw[:20])
    st, h, b = request(d.port, "GET", "/nope")
    check(is_json_error(st, h, b, 404), "unknown route is 404")
    st, h, b = request(d.port, "POST", "/v2/health/ready", body=b"{}")
    check(is_json_error(st, h, b, 405) and h.get("allow") == "GET, HEAD", "wrong method is 405 with Allow: GET, HEAD")
    # Junk of every byte value, in odd slices, must not hurt the daemon.
    for seed in range(20):
        with connect(d.port) as s:
            junk = bytes((i * 131 + seed * 17) % 256 for i in range(300))
            try:
                s.sendall(b"GET /v2 HTTP/1.1\r\n" + junk)
                s.shutdown(socket.SHUT_WR)
                closed_by_peer(s, 2)
            except OSError:
                pass
    check(request(d.port, "GET", "/v2/health/live")[0] == 200, "still serving after junk input")


def ws_close_code(sock, within=5.0):
    """Reads server frames until a close frame; returns its status code, or None (EOF, timeout)."""
    sock.settimeout(within)
    buf = b""
    try:
        while True:
            while len(buf) >= 2:
                n, at = buf[1] & 0x7F, 2
                if n == 126:
                    n, at = int.from_bytes(buf[2:4], "big"), 4
                elif n == 127:
                    n, at = int.from_bytes(buf[2:10], "big"), 10
                if len(buf) < at + n:
                    break
                if buf[0] & 0x0F == 8:
                    return int.from_bytes(buf[at:at + 2], "big") if n >= 2 else None
                buf = buf[at + n:]
            chunk = sock.recv(65536)
            if not chunk:
                return None
            buf += chunk
    except (socket.timeout, ConnectionResetError):
        return None


def test_websocket_frame_too_big(d):
    """A frame whose header declares more than a message may hold is refused with 1009 at the
    header: the server does not wait for a payload that would never be accepted."""
    with connect(d.port) as s:
        s.sendall(b"GET /v1/tensor HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        r = read_response(s)
        check(r and r[0] == 101, "WebSocket handshake on /v1/tensor (got %r)" % (r[:3] if r else None,))
        if r and r[0] == 101:
            # FIN + binary, masked, 64-bit length 2^40, the mask; no payload follows
            s.sendall(bytes([0x82, 0xFF]) + (1 << 40).to_bytes(8, "big") + b"\x01\x02\x03\x04")
            code = ws_close_code(s)
            check(code == 1009, "a frame header declaring 2^40 bytes is closed with 1009 (got %s)" % code)
    # the same split across writes, after a small complete frame, with a 16-bit length
    with connect(d.port) as s:
        s.sendall(b"GET /v1/tensor HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        r = read_response(s)
        if r and r[0] == 101:
            s.sendall(bytes([0x89, 0x80]) + b"\x00\x00\x00\x00" + bytes([0x02, 0xFF]))  # a ping, then a header
            time.sleep(0.05)
            s.sendall((1 << 62).to_bytes(8, "big") + b"\x00\x00\x00\x00")
            code = ws_close_code(s)
            check(code == 1009, "a first-fragment header split across writes is closed with 1009 (got %s)" % code)
    # control frames over 125 bytes or fragmented (RFC 6455 5.5): a close frame with 1002, not a drop
    for what, frame in (("a 200-byte ping", bytes([0x89, 0x80 | 126]) + (200).to_bytes(2, "big") + bytes(4 + 200)),
                        ("a fragmented ping", bytes([0x09, 0x83]) + bytes(4) + b"abc")):
        with connect(d.port) as s:
            s.sendall(b"GET /v1/tensor HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
            r = read_response(s)
            if r and r[0] == 101:
                s.sendall(frame)
                code = ws_close_code(s)
                check(code == 1002, "%s is closed with 1002 (got %s)" % (what, code))
    check(request(d.port, "GET", "/v2/health/live")[0] == 200, "still serving after oversized frames")


def test_timeouts(d):
    with connect(d.port) as s:
        s.sendall(b"GET /v2 HTTP/1.1\r\nHost: slow")
        t0 = time.time()
        r = read_response(s)
        check(r and is_json_error(*r[:3], 408), "stalled request gets 408")
        check(closed_by_peer(s), "stalled request's connection is dropped")
        check(time.time() - t0 < 5, "stalled client dropped after the request timeout")
    with connect(d.port) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\n\r\n")
        check(read_response(s)[0] == 200, "idle test: first request")
        check(closed_by_peer(s, 5), "idle keep-alive connection closed after the idle timeout")
    # a client that asks and never reads: cut after the idle timeout, and said in the log
    s = connect(d.port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n" * 2000)
    deadline = time.time() + 10
    said = False
    while time.time() < deadline and not said:
        time.sleep(0.1)
        said = "did not read its answers" in open(d.log, errors="replace").read()
    s.close()
    check(said, "a client that reads nothing is cut and the log says so")


def test_sighup(d_args):
    logfile = os.path.join(TMP, "hup.log")
    d = Daemon("hup", "--log-file", logfile, *d_args)
    os.rename(logfile, logfile + ".1")
    d.proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 5
    while time.time() < deadline and not os.path.exists(logfile):
        time.sleep(0.01)
    check(os.path.exists(logfile), "SIGHUP reopens the log file")
    check(request(d.port, "GET", "/v2/health/live")[0] == 200, "still serving after SIGHUP")
    check(d.stop() == 0, "exit 0 after SIGHUP and SIGTERM")
    check("log reopened" in open(logfile).read(), "reopened log receives lines")
    first = open(logfile + ".1").readline()
    check(str(d.port) in first, "first log line names the port")


def test_drain(d_args):
    d = Daemon("drain", "--drain-timeout-ms", "5000", *d_args)
    busy = connect(d.port)
    busy.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n")  # in flight, not finished
    idle = connect(d.port)
    idle.sendall(b"GET /v2/health/live HTTP/1.1\r\n\r\n")
    check(read_response(idle)[0] == 200, "drain: idle connection served first")
    time.sleep(0.05)
    d.proc.send_signal(signal.SIGTERM)
    check(closed_by_peer(idle, 3), "drain: idle connection closed at SIGTERM")
    check(d.proc.poll() is None, "drain: still running while a request is in flight")
    busy.sendall(b"\r\n")
    r = read_response(busy)
    check(r and r[0] == 200 and r[1].get("connection") == "close", "drain: in-flight request finishes")
    busy.close()
    rc = d.stop(sig=None)
    check(rc == 0, "SIGTERM drain exits 0 (got %s)" % rc)
    check(not os.path.exists(os.path.join(d.data, "kilnd.port")), "port file removed on exit")
    check(os.path.exists(os.path.join(d.data, "kiln.db")), "job store created in data_dir")


def test_drain_deadline(d_args):
    d = Daemon("deadline", "--drain-timeout-ms", "200", *d_args[:2], "--request-timeout-ms", "60000")
    stuck = connect(d.port)
    stuck.sendall(b"GET /v2 HTTP/1.1\r\nHost: never-finished")
    time.sleep(0.05)
    t0 = time.time()
    d.proc.send_signal(signal.SIGTERM)
    check(closed_by_peer(stuck, 5), "drain deadline: stuck connection cut")
    rc = d.stop(sig=None)
    check(rc == 0 and time.time() - t0 < 5, "drain deadline: exits 0 after drain_timeout_ms (got %s)" % rc)
    stuck.close()


def test_access_log():
    """log_access on: one line per response, in text and in JSON, with the request id that the
    model endpoints echo (given or generated) and the client's address."""
    for fmt in ("text", "json"):
        d = Daemon("access-" + fmt, "--log-access", "on", "--log-format", fmt)
        try:
            st, h, _ = request(d.port, "GET", "/v2/models/nosuch", headers="X-Request-Id: given-id.1\r\n")
            check(st == 404 and h.get("x-request-id") == "given-id.1", "%s: a given request id is echoed" % fmt)
            st, h, _ = request(d.port, "GET", "/v2/models/nosuch?x=a%20b")
            generated = h.get("x-request-id", "")
            check(st == 404 and generated.startswith("kiln-"), "%s: a request id is generated (%r)" % (fmt, generated))
            st, h, _ = request(d.port, "GET", "/v2/models/other", headers="X-Request-Id: bad id\r\n")
            replaced = h.get("x-request-id", "")
            check(replaced.startswith("kiln-") and replaced != generated, "%s: an unusable id is replaced" % fmt)
            request(d.port, "POST", "/v2/health/live", body=b"abc")
        finally:
            d.stop()
        lines = [l for l in open(d.log).read().splitlines() if "access" in l]
        if fmt == "json":
            recs = []
            for l in lines:
                try:
                    recs.append(json.loads(l))
                except ValueError:
                    check(False, "json: an access line that does not parse: %r" % l)
            recs = [r for r in recs if r.get("msg") == "access"]
            byid = {r["request_id"]: r for r in recs}
            r = byid.get("given-id.1", {})
            check(r.get("method") == "GET" and r.get("target") == "/v2/models/nosuch" and r.get("status") == 404
                  and r.get("peer", "").startswith("127.0.0.1:") and isinstance(r.get("ms"), float),
                  "json: the line of the given id has method, target, status, ms and peer: %r" % r)
            check(byid.get(generated, {}).get("target") == "/v2/models/nosuch?x=a%20b",
                  "json: the generated id is the one logged: %r" % byid.get(generated))
            post = [r for r in recs if r.get("method") == "POST"]
            check(len(post) == 1 and post[0]["status"] == 405 and post[0]["bytes_in"] == 3,
                  "json: the refused POST is logged with its 3 body bytes: %r" % post)
        else:
            check(any(" access GET /v2/models/nosuch 404 " in l and " id=given-id.1 " in l and " peer=127.0.0.1:" in l
                      for l in lines), "text: the line of the given id: %r" % lines)
            check(any(" id=%s " % generated in l and "/v2/models/nosuch?x=a%2520b" in l for l in lines),
                  "text: the generated id is the one logged (the target with % escaped as %25)")
            check(any(" access POST /v2/health/live 405 " in l and " in=3 " in l for l in lines),
                  "text: the refused POST with its body bytes: %r" % lines)
    d = Daemon("access-off")
    try:
        request(d.port, "GET", "/v2")
    finally:
        d.stop()
    check(not any(" access " in l for l in open(d.log).read().splitlines()), "no access lines by default")


def run_check(*args, env=None):
    return subprocess.run([KILND, "--check-config", *args], capture_output=True, text=True, env=dict(ENV, **(env or {})))


def test_config():
    good = os.path.join(TMP, "good.json")
    with open(good, "w") as f:
        json.dump({"port": 0, "limits": {"max_body_bytes": 2048}, "log_format": "json"}, f)
    bad = os.path.join(TMP, "bad.json")
    with open(bad, "w") as f:
        json.dump({"port": 0, "limits": {"max_bodybytes": 1}}, f)
    r = run_check("--config", good)
    check(r.returncode == 0, "--check-config accepts a good file")
    r = run_check("--config", bad)
    check(r.returncode == 1 and "limits.max_bodybytes" in r.stderr and bad in r.stderr,
          "--check-config names the unknown key and the file")
    r = run_check(env={"KILN_PORT": "70000"})
    check(r.returncode == 1 and "port" in r.stderr and "KILN_PORT" in r.stderr, "bad env value names KILN_PORT")
    # said, not refused: a misspelt setting, and the environment over the file's value, by the
    # check on stderr and by a start in its log
    r = run_check("--config", good, env={"KILN_LOGLEVEL": "debug", "KILN_LOG_FORMAT": "text"})
    check(r.returncode == 0 and "warning: environment variable KILN_LOGLEVEL is not a kilnd setting" in r.stderr
          and "did you mean KILN_LOG_LEVEL" in r.stderr
          and "log_format: the environment variable KILN_LOG_FORMAT (text) overrides the value in config file"
          in r.stderr, "--check-config warns of a misspelt variable and of the environment over the file: %r"
          % r.stderr)
    start = subprocess.Popen([KILND, "--port", "0", "--data-dir", os.path.join(TMP, "notes")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(ENV, KILN_PROT="9000"))
    first = start.stdout.readline()
    start.terminate()
    start.communicate(timeout=30)
    check(" warn " in first and "KILN_PROT is not a kilnd setting" in first and "KILN_PORT" in first,
          "a start logs the misspelt variable first: %r" % first)
    r = run_check("--log-level", "chatty")
    check(r.returncode == 1 and "log_level" in r.stderr and "--log-level" in r.stderr, "bad flag names the flag")
    r = subprocess.run([KILND, "--help"], capture_output=True, text=True)
    check(r.returncode == 0 and "--max-body-bytes" in r.stdout and "KILN_IDLE_TIMEOUT_MS" in r.stdout, "--help")
    r = subprocess.run([KILND, "--version"], capture_output=True, text=True)
    check(r.returncode == 0 and r.stdout.startswith("kilnd "), "--version")
    r = subprocess.run([KILND, "--bogus"], capture_output=True, text=True)
    check(r.returncode == 1 and "--bogus" in r.stderr, "unknown flag stops the start")

    # --check-config makes the checks a start makes: what a start refuses, it refuses with the
    # same message, and what it calls OK is not refused by them.
    tokens = {"KILN_API_TOKENS": "admin:secret"}
    for args, words, env in ((["--host", "0.0.0.0"], "refusing to listen on 0.0.0.0 without api_tokens", None),
                             (["--device-options", "cpu:threads=abc"], "got 'abc'", None),
                             (["--device-options", "cpu:threads"], "device_options", None),
                             (["--devices", "cpu,cuda:99"], "device 'cuda:99'", None),
                             (["--host", "127.0.0.300"], "cannot resolve host '127.0.0.300'", tokens),
                             (["--grpc-port", "18095"], "port and grpc_port are both 18095", None)):
        port = ["--port", "18095"] if "--grpc-port" in args else ["--port", "0"]
        r = run_check(*port, *args, env=env)
        msg = r.stderr.strip().partition("kilnd: configuration error: ")[2]
        check(r.returncode == 1 and words in msg and "OK" not in r.stdout,
              "--check-config %s refused: %r %r" % (" ".join(args), r.stdout, r.stderr))
        start = subprocess.run([KILND, *port, "--data-dir", os.path.join(TMP, "refused"), *args],
                               capture_output=True, text=True, env=dict(ENV, **(env or {})), timeout=30)
        check(start.returncode == 1 and msg and msg in start.stderr,
              "a start with %s fails with --check-config's message %r: %r" % (" ".join(args), msg, start.stderr))
    for args, env in ((["--host", "0.0.0.0"], {"KILN_API_TOKENS": "admin:secret"}),
                      (["--devices", "cpu", "--device-options", "cpu:threads=2"], None)):
        r = run_check(*args, env=env)
        check(r.returncode == 0 and "configuration OK" in r.stdout,
              "--check-config %s is OK: %r" % (" ".join(args), r.stderr))

    # A start that cannot bind fails with a message and exit 1.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = busy.getsockname()[1]
        r = subprocess.run([KILND, "--port", str(taken), "--data-dir", os.path.join(TMP, "busy")],
                           capture_output=True, text=True, env=ENV, timeout=10)
        check(r.returncode == 1 and "address already in use" in r.stderr, "port in use: exit 1 with a message")

    # Precedence file < env < flag, observed through where the daemon writes its port file.
    dirs = {k: os.path.join(TMP, "prec-" + k) for k in ("file", "env", "flag")}
    cfg = os.path.join(TMP, "prec.json")
    with open(cfg, "w") as f:
        json.dump({"data_dir": dirs["file"], "port": 1}, f)

    def started_in(args, env):
        e = dict(ENV, **env)
        p = subprocess.Popen([KILND, "--config", cfg, "--port", "0", *args], stderr=subprocess.DEVNULL, env=e)
        deadline = time.time() + 10
        where = None
        while time.time() < deadline and where is None:
            for k, path in dirs.items():
                if os.path.exists(os.path.join(path, "kilnd.port")):
                    where = k
            time.sleep(0.01)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=10)
        return where

    check(started_in([], {}) == "file", "precedence: file alone")
    check(started_in([], {"KILN_DATA_DIR": dirs["env"]}) == "env", "precedence: env over file")
    check(started_in(["--data-dir", dirs["flag"]], {"KILN_DATA_DIR": dirs["env"]}) == "flag",
          "precedence: flag over env")


def main():
    args = ["--idle-timeout-ms", "400", "--request-timeout-ms", "400", "--max-body-bytes", "1024",
            "--max-header-bytes", "4096"]
    d = Daemon("main", *args)
    try:
        test_endpoints(d)
        test_cli(d)
        test_keep_alive_and_pipelining(d)
        test_head(d)
        test_chunked(d)
        test_limits(d)
        test_malformed(d)
        test_websocket_frame_too_big(d)
        test_timeouts(d)
    finally:
        rc = d.stop()
    check(rc == 0, "main daemon exits 0 on SIGTERM (got %s)" % rc)
    check(" error " not in open(d.log).read(), "no errors logged by the main daemon")
    test_sighup(args)
    test_drain(args)
    test_drain_deadline(args)
    test_access_log()
    test_config()
    if FAILURES:
        print("%d failure(s)" % len(FAILURES))
        print(open(d.log).read()[-3000:])
        return 1
    print("all daemon integration checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
