#!/usr/bin/env python3
"""A remote tensor session whose client stops reading its replies (docs/remote-protocol.md,
"Flow control"): kilnd stops running the session's queued DOWNLOADs once its unsent replies pass
the session's bound, so its memory stays bounded (read from the kiln_remote_unsent_bytes gauge,
not from RSS or the clock); once the client reads again every reply arrives, in order and
intact. A client that reads nothing for the stall timeout (half of limits.idle_timeout_ms) is
closed with 1008 and a reason, after the replies queued before it. While such a session waits,
kilnd's loop sleeps: output moves on socket events, not on a timer that looks every millisecond
(counted as the loop thread's voluntary context switches, where /proc tells them).

Usage: test_remote_backpressure.py KILND
"""
import http.client
import os
import re
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
TMP = tempfile.mkdtemp(prefix="kilnd-backpressure-")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
FAILURES = []
MIB = 1 << 20
MAX_MESSAGE = 4 * MIB
# tensor-session.c: no hop starts past out_high = max(max_message_bytes, 8 MiB); one hop adds at
# most max_message_bytes plus one reply.
OUT_HIGH = max(MAX_MESSAGE, 8 * MIB)
BOUND = OUT_HIGH + 2 * MAX_MESSAGE + MIB
# How often the loop may block during a second in which a stalled session waits and nothing else
# happens: a few timers and the test's last /metrics connection closing. A loop that polled every
# millisecond would block about a thousand times.
LOOP_WAKEUPS_MAX = 50
PATTERN = bytes(range(256)) * (MIB // 256)


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


class Daemon:
    def __init__(self, *args):
        self.data = os.path.join(TMP, "data")
        os.makedirs(self.data, exist_ok=True)
        self.log = os.path.join(TMP, "kilnd.log")
        self.proc = subprocess.Popen([KILND, "--port", "0", "--data-dir", self.data, *args],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"), env=ENV)
        portfile = os.path.join(self.data, "kilnd.port")
        deadline = time.time() + 15
        while not os.path.exists(portfile):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("kilnd did not start: " + open(self.log).read())
            time.sleep(0.01)
        self.port = int(open(portfile).read())

    def metric(self, name):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        c.request("GET", "/metrics")
        body = c.getresponse().read().decode()
        c.close()
        for line in body.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def session(self):
        w = WS(self.port, timeout=30)
        st, _ = w.handshake()
        check(st == 101, "upgrade answers 101 (got %s)" % st)
        w.send(hello(1))
        t, seq, _ = w.next()
        check(t == WELCOME, "HELLO answered by WELCOME")
        w.send(alloc(2, 1, PATTERN))  # answered only when it fails
        return w

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = -9
        check(rc == 0, "kilnd exits 0 after SIGTERM (rc %s)" % rc)


def loop_wakeups(pid):
    """How many times kilnd's loop thread (its main thread) has blocked waiting for events so far:
    its voluntary context switches. None where /proc does not tell."""
    try:
        with open("/proc/%d/task/%d/status" % (pid, pid)) as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def queue_downloads(w, first, count, per_message=20):
    for s in range(first, first + count, per_message):
        w.send(b"".join(download(q, 1, 0, len(PATTERN)) for q in range(s, min(s + per_message, first + count))))


def read_downloads(w, first, count, what):
    """Every reply, in order and intact; returns how many arrived before a close."""
    for q in range(first, first + count):
        try:
            t, seq, f = w.next()
        except Closed as e:
            return q - first, e
        if not (t == DATA and seq == q and f["data"] == PATTERN):
            check(False, "%s: reply %d is DATA %d with the buffer (got type %#x seq %d, %d bytes)" %
                  (what, q, q, t, seq, len(f.get("data", b""))))
            return q - first, None
    return count, None


def test_bounded_then_resumes(d):
    w = d.session()
    n = 120  # 120 MiB of replies: far past the bound
    queue_downloads(w, 10, n)
    peak, deadline = 0.0, time.time() + 1.5
    while time.time() < deadline:
        v = d.metric("kiln_remote_unsent_bytes")
        if v is None:
            check(False, "/metrics has kiln_remote_unsent_bytes")
            break
        peak = max(peak, v)
        time.sleep(0.05)
    print("peak unsent bytes while the client did not read: %d (bound %d)" % (peak, BOUND), flush=True)
    check(peak > 0, "the gauge counts the replies the client has not read")
    check(peak <= BOUND, "unsent replies stay under the bound (peak %d > %d)" % (peak, BOUND))
    got, closed = read_downloads(w, 10, n, "after resuming")
    check(got == n and closed is None, "all %d replies arrive once the client reads (got %d, %s)" % (n, got, closed))
    w.send(sync(500))
    t, seq, _ = w.next()
    check(t == SYNC_DONE and seq == 500, "the session goes on after the backlog")
    w.close()


def test_stalled_client_closed(d):
    w = d.session()
    n = 40
    started = time.time()
    queue_downloads(w, 10, n)
    # The session waits once its unsent replies pass OUT_HIGH, until the client reads or the stall
    # timeout ends the wait; meanwhile the test leaves kilnd alone and counts its loop's wake-ups.
    deadline, unsent = time.time() + 20, 0
    while time.time() < deadline and unsent <= OUT_HIGH:
        unsent = d.metric("kiln_remote_unsent_bytes") or 0
        time.sleep(0.02)
    check(unsent > OUT_HIGH, "the session waits with its replies unread (%d bytes unsent)" % unsent)
    before = loop_wakeups(d.proc.pid)
    time.sleep(1)
    after = loop_wakeups(d.proc.pid)
    if before is None or after is None:
        print("loop wake-ups not counted: /proc does not tell a thread's context switches", flush=True)
    else:
        print("loop wake-ups during a second of the stalled session's wait: %d" % (after - before), flush=True)
        check(after - before < LOOP_WAKEUPS_MAX,
              "the loop sleeps while a stalled session waits (%d wake-ups)" % (after - before))
    # past the stall timeout (3 s), short of the server's own cut (3 s + 6 s)
    time.sleep(max(0.0, 4.5 - (time.time() - started)))
    got, closed = read_downloads(w, 10, n, "stalled")
    check(got < n, "a stalled session stops running its DOWNLOADs (all %d ran)" % n)
    check(closed is not None and closed.code == 1008 and "read none of its replies" in closed.reason,
          "a stalled client gets 1008 with a reason after what was queued (got %s)" % closed)
    w.close()
    deadline = time.time() + 20
    while time.time() < deadline and d.metric("kiln_remote_sessions") != 0:
        time.sleep(0.05)
    check(d.metric("kiln_remote_sessions") == 0, "the stalled session is gone")
    check(d.metric("kiln_remote_unsent_bytes") == 0, "nothing is left unsent")


def test_left_mid_batch(d):
    """A client that queues 2000 adds of 16M floats (tens of seconds of work) and leaves at once:
    what had not run is dropped, not run for nobody (the hop ran every op it had taken, holding the
    device and the session's memory for seconds), and counted in kiln_remote_messages_dropped_total."""
    n_ops, n = 2000, 1 << 24
    before = d.metric("kiln_remote_messages_dropped_total") or 0
    received = d.metric("kiln_remote_messages_total") or 0
    w = WS(d.port, timeout=30)
    st, _ = w.handshake()
    check(st == 101, "upgrade answers 101 (got %s)" % st)
    w.send(hello(1))
    t, _, _ = w.next()
    check(t == WELCOME, "HELLO answered by WELCOME")
    w.send(alloc(2, 1, nbytes=4 * n) + alloc(3, 2, nbytes=4 * n))
    w.send(b"".join(op(10 + k, P_BINARY, [td(2, [n]), td(1, [n]), td(2, [n])], sub=B_ADD) for k in range(n_ops)))
    # A reset discards what the server has not read yet: leave once it has taken the three WebSocket
    # messages (HELLO, the two ALLOCs, the adds; the counter counts protocol messages), so that the
    # adds are queued when the client goes.
    deadline = time.time() + 30
    while time.time() < deadline and (d.metric("kiln_remote_messages_total") or 0) < received + 3 + n_ops:
        time.sleep(0.01)
    w.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    w.close()  # a reset: the client is gone
    deadline = time.time() + 60
    while time.time() < deadline and d.metric("kiln_remote_sessions") != 0:
        time.sleep(0.05)
    check(d.metric("kiln_remote_sessions") == 0 and d.metric("kiln_remote_live_bytes") == 0,
          "the session is gone with its buffers")
    dropped = (d.metric("kiln_remote_messages_dropped_total") or 0) - before
    print("of %d queued adds, %d were dropped when the client left" % (n_ops, dropped), flush=True)
    check(dropped >= n_ops // 2, "most of the adds the client left behind are dropped, not run (%d of %d)"
          % (dropped, n_ops))
    log = open(d.log, errors="replace").read()
    closed = re.findall(r"remote session (\d+) on cpu closed: (\d+) messages run, (\d+) left unrun", log)
    check(closed and int(closed[-1][2]) == dropped and int(closed[-1][1]) + dropped == n_ops + 2,
          "the log says the session closed, with what ran and what was left: %s" % closed[-1:])
    got = (d.metric("kiln_remote_messages_total") or 0) - received
    check(got == n_ops + 3, "kiln_remote_messages_total counts protocol messages, as the log and the dropped "
          "counter do: %d received for HELLO, 2 ALLOCs and %d adds" % (got, n_ops))
    check(re.search(r"remote session %s opened on cpu" % (closed[-1][0] if closed else "?"), log) is not None,
          "and that it opened")


def main():
    d = Daemon("--remote-max-message-bytes", str(MAX_MESSAGE), "--idle-timeout-ms", "6000")
    try:
        test_bounded_then_resumes(d)
        test_stalled_client_closed(d)
        test_left_mid_batch(d)
    finally:
        d.stop()
        if FAILURES:
            print(open(d.log).read()[-3000:])
    shutil.rmtree(TMP, ignore_errors=True)
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
