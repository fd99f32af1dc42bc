#!/usr/bin/env python3
"""Training and the drain (docs/deployment.md, "Stopping"), and two request details of the jobs
API:

- SIGTERM stops training when the drain starts, not when it ends: the running job stops at the
  end of its current step and stays running in the store (read from kiln.db after exit), the
  queued job never starts, and the next kilnd resumes the first. A remote session whose client
  reads nothing holds the drain open for drain_timeout_ms, which is when training used to go on.
- A job spec that is not valid UTF-8 gets a 400 whose body is valid JSON naming the problem.
- Last-Event-ID with optional whitespace around it (RFC 9110 section 5.5) resumes a stream.

Usage: test_job_drain.py KILND
"""
import json
import os
import socket
import sqlite3
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "remote"))
import kilnd_harness as H  # noqa: E402
import remote_wire as W  # noqa: E402

KILND = sys.argv[1]
check = H.check
DRAIN_MS = 4000


def raw_request(port, head, body=b""):
    """One request written byte for byte; the response's status and body."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(head + body)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    head_out, _, rest = buf.partition(b"\r\n\r\n")
    status = int(head_out.split()[1]) if len(head_out.split()) > 1 else 0
    length = 0
    for line in head_out.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    s.close()
    return status, rest[:length] if length else rest


def test_non_utf8_spec(d):
    body = b'{"model":"fashion_mlp","data":{"type":"\xff","limit":100}}'
    st, out = raw_request(d.port, b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body), body)
    try:
        text = json.dumps(json.loads(out.decode("utf-8")))
    except ValueError as e:
        text = None
        check(False, "the 400 for a non-UTF-8 spec is valid JSON: %s %r" % (e, out[:200]))
    check(st == 400, "a spec that is not UTF-8 -> 400 (got %s)" % st)
    check(text is not None and "UTF-8" in text, "the 400 names the problem: %s" % text)


def sse_status(port, jid, last_event_id):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"GET /v1/jobs/%d/events HTTP/1.1\r\nHost: x\r\nLast-Event-ID:%s\r\n\r\n" % (jid, last_event_id))
    buf = b""
    while b"\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
    s.close()
    return int(buf.split()[1]) if len(buf.split()) > 1 else 0


def test_last_event_id_ows(d, jid):
    for v in (b" 3 ", b"3 ", b"\t3\t", b"3"):
        st = sse_status(d.port, jid, v)
        check(st == 200, "Last-Event-ID:%r resumes the stream (got %s)" % (v, st))
    st = sse_status(d.port, jid, b" 3x ")
    check(st == 400, "Last-Event-ID: 3x is still refused (got %s)" % st)


def latest_step(d, jid):
    st, j = d.req("GET", "/v1/jobs/%d" % jid)
    return (j.get("latest_step") or {}).get("step", 0) if st == 200 else 0


def stalled_session(port):
    """A remote session with replies queued that its client never reads: its connection stays
    until drain_timeout_ms."""
    w = W.WS(port)
    st, _ = w.handshake()
    check(st == 101, "the remote session opens (got %s)" % st)
    w.send(W.hello(1))
    w.next()
    w.send(W.alloc(2, 1, nbytes=1 << 20))
    w.send(b"".join(W.download(q, 1, 0, 1 << 20) for q in range(10, 50)))
    return w


def test_sigterm_stops_training():
    d = H.Daemon(KILND, "drain", extra=["--drain-timeout-ms", str(DRAIN_MS)])
    st, a = d.req("POST", "/v1/jobs", H.spec("drain_a", epochs=100000,
                                             checkpoint={"every_epochs": 1, "keep_last": 2}))
    check(st == 201, "job A accepted: %s %s" % (st, a))
    st, b = d.req("POST", "/v1/jobs", H.spec("drain_b", epochs=1))
    check(st == 201, "job B accepted: %s %s" % (st, b))
    a, b = a["id"], b["id"]
    test_non_utf8_spec(d)
    test_last_event_id_ows(d, a)
    deadline = time.time() + 60
    while time.time() < deadline and latest_step(d, a) < 200:
        time.sleep(0.05)
    s1, t1 = latest_step(d, a), time.time()
    time.sleep(0.5)
    s2, t2 = latest_step(d, a), time.time()
    rate = (s2 - s1) / (t2 - t1)
    check(s2 > s1, "job A is training (steps %d -> %d)" % (s1, s2))
    w = stalled_session(d.port)
    # The session holds the drain open only once its replies are queued behind a full socket: wait
    # for kilnd to hold unsent bytes (its hop runs on the worker the training shares) rather than
    # for a fixed time.
    deadline, unsent = time.time() + 60, 0
    while time.time() < deadline and unsent < (1 << 20):
        unsent = d.metric("kiln_remote_unsent_bytes") or 0
        time.sleep(0.02)
    check(unsent >= 1 << 20, "the session's replies wait behind a full socket (%d bytes unsent)" % unsent)
    at_term = latest_step(d, a)
    t0 = time.time()
    d.proc.send_signal(15)
    rc = d.proc.wait(timeout=60)
    took = time.time() - t0
    w.close()
    check(rc == 0, "kilnd exits 0 after SIGTERM (rc %s)" % rc)
    check(took >= DRAIN_MS / 2000, "the stalled session held the drain open (%.1f s)" % took)
    db = sqlite3.connect(os.path.join(d.data, "kiln.db"))
    state_a = db.execute("SELECT state FROM jobs WHERE id = ?", (a,)).fetchone()[0]
    state_b, started_b = db.execute("SELECT state, started_ms FROM jobs WHERE id = ?", (b,)).fetchone()
    last = db.execute("SELECT max(json_extract(payload, '$.step')) FROM job_events WHERE job_id = ? "
                      "AND type = 'step'", (a,)).fetchone()[0] or 0
    db.close()
    check(state_a == "running", "job A stays running in the store, to resume (%s)" % state_a)
    check(state_b == "queued" and started_b is None, "job B never started (%s, started %s)" % (state_b, started_b))
    # Stopped at the end of the step under way: well short of the steps the drain's seconds
    # would have given it (rate steps a second before the SIGTERM).
    check(last - at_term < rate * (0.5 + took / 4), "job A stopped when the drain began: step %d at SIGTERM, "
          "%d in the store after a %.1f s drain at %.0f steps/s" % (at_term, last, took, rate))
    d = H.Daemon(KILND, "drain", fresh=False)
    deadline = time.time() + 60
    while time.time() < deadline and latest_step(d, a) <= last:
        time.sleep(0.05)
    check(latest_step(d, a) > last, "the next kilnd resumes job A (step %d -> %d)" % (last, latest_step(d, a)))
    st, _ = d.req("DELETE", "/v1/jobs/%d" % a)
    check(st == 202, "job A can be cancelled after resuming (got %s)" % st)
    d.stop()


def main():
    try:
        test_sigterm_stops_training()
    finally:
        H.cleanup()
    H.finish()


if __name__ == "__main__":
    main()
