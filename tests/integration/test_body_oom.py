#!/usr/bin/env python3
"""kilnd out of memory for a request body: its address-space limit is lowered (prlimit on the
running process) to a little more than it uses, and a client sends a body that fits
max_body_bytes but not the memory left. kilnd must answer 503 with a JSON error saying it ran out
of memory (the connection had been reset without an answer), give the memory back, and go on
serving.

Usage: test_body_oom.py KILND   (skips, exit 77, under AddressSanitizer, whose reserved shadow
memory makes an address-space limit meaningless, or where prlimit(2) on a child is refused)
"""
import json
import os
import resource
import socket
import subprocess
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND = sys.argv[1]
HEADROOM = 128 << 20   # address space kilnd is left beyond what it has mapped
BODY = 768 << 20       # more than the headroom, less than max_body_bytes


def vm_size(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def post_huge(port):
    """Sends a BODY-byte POST from a thread and reads the answer here: status and body."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v2/models/none/infer HTTP/1.1\r\nHost: kilnd\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % BODY)

    def send():
        chunk = b" " * (1 << 20)
        try:
            for _ in range(BODY >> 20):
                s.sendall(chunk)
        except OSError:
            pass  # kilnd answered and stopped reading

    t = threading.Thread(target=send, daemon=True)
    t.start()
    buf = b""
    try:
        while b"\r\n\r\n" not in buf or len(buf.partition(b"\r\n\r\n")[2]) < 20:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    except OSError:
        pass
    s.close()
    head, _, rest = buf.partition(b"\r\n\r\n")
    status = int(head.split()[1]) if len(head.split()) > 1 else 0
    return status, rest


def main():
    ldd = subprocess.run(["ldd", KILND], capture_output=True, text=True).stdout
    if "libasan" in ldd or os.environ.get("ASAN_OPTIONS"):
        print("SKIP: under AddressSanitizer an address-space limit cannot stand for low memory")
        return 77
    d = H.Daemon(KILND, "body-oom", data_roots=False, extra=["--max-body-bytes", str(1 << 30)])
    try:
        limit = vm_size(d.proc.pid) + HEADROOM
        try:
            resource.prlimit(d.proc.pid, resource.RLIMIT_AS, (limit, limit))
        except (OSError, AttributeError) as e:
            print("SKIP: cannot lower kilnd's address-space limit: %s" % e)
            return 77
        status, body = post_huge(d.port)
        try:
            err = json.loads(body.decode()).get("error", "")
        except ValueError:
            err = None
        H.check(status == 503 and err is not None and "out of memory" in err,
                "a body past the memory left is answered 503 naming the cause: %s %r" % (status, body[:200]))
        st, _ = d.req("GET", "/v2/health/live")
        H.check(st == 200, "kilnd goes on serving (live: %s)" % st)
        # the memory came back: under the same limit a body of an eighth of the headroom reaches its handler
        st, doc = d.req("POST", "/v2/models/none/infer", body=b" " * (HEADROOM // 8) + b"{}")
        H.check(st == 404, "a body that fits is read whole and routed (got %s %r)" % (st, str(doc)[:120]))
    finally:
        d.stop()
    H.finish()
    H.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
