#!/usr/bin/env python3
"""kilnd out of file descriptors: its open-file limit is lowered (prlimit on the running process,
which needs no privilege for one's own child) until no new descriptor can be had, and clients
connect to the HTTP and gRPC ports. kilnd must keep serving the connection it already has, log
the condition once per port (not once per accept attempt: libuv's own accept loop, with its
spare descriptor gone, retries without end and logs every failure while serving nothing), leave
the new clients waiting in the listen backlog rather than cutting them, and accept and answer
them once the limit is raised again, saying so in the log.

Usage: test_fd_limit.py KILND   (skips, exit 77, where prlimit(2) on a child is refused)
"""
import os
import resource
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND = sys.argv[1]
GET = b"GET /v2/health/live HTTP/1.1\r\nHost: kilnd\r\n\r\n"
HTTP_PAUSED = "HTTP: cannot accept connections: Too many open files"
GRPC_PAUSED = "gRPC: cannot accept connections: Too many open files"


def answer(sock, timeout=10):
    """The first bytes kilnd sends on sock (b"" when it closed the connection, None on timeout)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(4096)
    except socket.timeout:
        return None
    except ConnectionResetError:
        return b""


def log_lines(d):
    """kilnd's log so far; its first 4 MiB, should it have flooded."""
    with open(d.log, errors="replace") as f:
        return f.read(4 << 20).splitlines()


def main():
    d = H.Daemon(KILND, "fd-limit", extra=["--grpc-port", "0"], data_roots=False)
    grpc_port = int(open(os.path.join(d.data, "kilnd.grpc_port")).read())
    pid = d.proc.pid
    held = socket.create_connection(("127.0.0.1", d.port))  # accepted before the limit bites
    held.sendall(GET)
    H.check((answer(held) or b"").startswith(b"HTTP/1.1 200"), "a keep-alive connection is answered")
    try:
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        # 3: descriptors 0-2 are taken, so every new one (an accepted socket, a file) is refused
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, hard))
    except (OSError, AttributeError) as e:
        d.stop()
        H.cleanup()
        print("SKIP: cannot lower kilnd's open-file limit:", e)
        sys.exit(77)
    try:
        waiting = socket.create_connection(("127.0.0.1", d.port))
        waiting.sendall(GET)
        grpc_waiting = socket.create_connection(("127.0.0.1", grpc_port))
        time.sleep(1.5)  # several retry periods (KD_LISTENER_RETRY_MS) at the limit

        lines = log_lines(d)
        H.check(sum(HTTP_PAUSED in line for line in lines) == 1,
                "the HTTP port logs running out of descriptors once (%d lines say so)"
                % sum(HTTP_PAUSED in line for line in lines))
        H.check(sum(GRPC_PAUSED in line for line in lines) <= 1,
                "the gRPC port logs it at most once (%d lines)" % sum(GRPC_PAUSED in line for line in lines))
        H.check(len(lines) < 20, "the log stays short at the limit (%d lines)" % len(lines))
        H.check(any("open-file limit 3" in line for line in lines), "the line names the limit")
        H.check(d.proc.poll() is None, "kilnd is still running at the limit")
        H.check(answer(waiting, timeout=0.2) is None,
                "a client that connected at the limit waits, not cut (libuv would accept and close it)")
        held.sendall(GET)
        got = answer(held)
        H.check(got is not None and got.startswith(b"HTTP/1.1 200"),
                "the connection kilnd already had is served at the limit: %r" % (got[:40] if got else got))

        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        got = answer(waiting)
        H.check(got is not None and got.startswith(b"HTTP/1.1 200"),
                "once the limit is raised the waiting client is answered: %r" % (got[:40] if got else got))
        got = answer(grpc_waiting)
        # the gRPC service greets each accepted connection with its SETTINGS frame (type 4)
        H.check(got is not None and len(got) >= 9 and got[3] == 4,
                "the waiting gRPC client is accepted and greeted: %r" % (got[:12] if got else got))
        st, _ = d.req("GET", "/v2/health/ready", timeout=10)
        H.check(st == 200, "a new connection is served after the limit was raised: %d" % st)
        lines = log_lines(d)
        H.check(any("HTTP: accepting connections again after" in line for line in lines),
                "the log says when the HTTP port accepts again")
        for s in (held, waiting, grpc_waiting):
            s.close()
    finally:
        rc = d.stop(timeout=10)
        H.check(rc == 0, "kilnd stops cleanly (exit status %s)" % rc)
        if H.FAILURES:
            print("".join(line + "\n" for line in log_lines(d)[-20:]))
        H.cleanup()
    H.finish()


main()
