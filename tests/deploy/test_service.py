#!/usr/bin/env python3
"""kilnd as a service manager runs it: the systemd unit, the readiness and watchdog protocol, and
the data-folder rules a container platform imposes.

Usage: test_service.py KILND SOURCE_DIR

- deploy/systemd/kilnd.service passes `systemd-analyze verify` with no warning (its ExecStart
  pointed at the built kilnd);
- with NOTIFY_SOCKET set (a path, then an abstract name), kilnd sends READY=1 only once
  /v2/health/ready answers 200, WATCHDOG=1 repeatedly at half WATCHDOG_USEC, STOPPING=1 when
  SIGTERM starts the drain, and exits 0; a WATCHDOG_PID naming another process means no pings;
  a malformed NOTIFY_SOCKET or WATCHDOG_USEC stops the start with a message naming it;
- (as root, through setpriv) a data folder another user owns is refused before kilnd binds, with
  a message naming the folder and the uid kilnd runs as; an arbitrary uid with group 0 and a
  group-writable folder (OpenShift's rule) starts and serves.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

KILND, SRC = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="kilnd-service-")
ENV = {k: v for k, v in os.environ.items()
       if not k.startswith("KILN_") and k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
FAILURES = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def http_status(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def test_unit_file():
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        check(False, "systemd-analyze is installed (deploy/install-deps.sh installs systemd)")
        return
    unit = open(os.path.join(SRC, "deploy", "systemd", "kilnd.service")).read()
    check("ExecStart=/usr/local/bin/kilnd" in unit and "Type=notify" in unit and "WatchdogSec=" in unit,
          "the unit runs the installed kilnd as Type=notify with a watchdog")
    path = os.path.join(TMP, "kilnd.service")
    with open(path, "w") as f:
        f.write(unit.replace("/usr/local/bin/kilnd", os.path.abspath(KILND)))
    p = subprocess.run([analyze, "verify", "--man=no", path], capture_output=True, text=True, env=ENV)
    noise = [l for l in (p.stdout + p.stderr).splitlines() if l.strip()]
    check(p.returncode == 0 and not noise, "systemd-analyze verify passes with no warning: %s" % noise)


class Notified:
    """kilnd started with a NOTIFY_SOCKET of our own; .messages collects what it sends."""

    def __init__(self, name, address, extra_env):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.2)
        self.data = os.path.join(TMP, name)
        env = dict(ENV, NOTIFY_SOCKET=address, **extra_env)
        self.log = open(os.path.join(TMP, name + ".log"), "wb")
        self.proc = subprocess.Popen([KILND, "--port", "0", "--data-dir", self.data], env=env,
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        self.messages = []

    def port(self):
        return int(open(os.path.join(self.data, "kilnd.port")).read())

    def wait_for(self, field, seconds=20):
        """Receives until a datagram holding `field` arrives; returns its fields or None."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                raw = self.sock.recv(4096).decode()
            except socket.timeout:
                if self.proc.poll() is not None:
                    return None
                continue
            fields = raw.split("\n")
            self.messages.append(fields)
            if field in fields:
                return fields
        return None

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()
        self.log.close()


def test_notify(address, name):
    n = Notified(name, address, {"WATCHDOG_USEC": "100000"})
    try:
        ready = n.wait_for("READY=1")
        check(ready is not None, "%s: READY=1 arrives" % name)
        if ready is None:
            return
        # READY=1 is sent after the state turned ready, so the endpoint already says 200.
        check(http_status(n.port(), "/v2/health/ready") == 200, "%s: /v2/health/ready is 200 when READY=1 arrives"
              % name)
        check(any(f.startswith("STATUS=ready on 127.0.0.1:") for f in ready), "%s: READY=1 comes with a STATUS= line: %s"
              % (name, ready))
        pings = 0
        for _ in range(3):
            if n.wait_for("WATCHDOG=1", seconds=10) is not None:
                pings += 1
        check(pings == 3, "%s: WATCHDOG=1 keeps coming (3 pings at a 50 ms period)" % name)
        n.proc.send_signal(signal.SIGTERM)
        stopping = n.wait_for("STOPPING=1")
        check(stopping is not None, "%s: STOPPING=1 arrives after SIGTERM" % name)
        check(n.proc.wait(timeout=30) == 0, "%s: kilnd exits 0 after the drain" % name)
    finally:
        n.close()


def test_watchdog_other_pid():
    n = Notified("other-pid", os.path.join(TMP, "other.sock"), {"WATCHDOG_USEC": "20000", "WATCHDOG_PID": "1"})
    try:
        check(n.wait_for("READY=1") is not None, "WATCHDOG_PID of another process: READY=1 still arrives")
        n.proc.send_signal(signal.SIGTERM)
        n.wait_for("STOPPING=1")
        n.proc.wait(timeout=30)
        pings = [m for m in n.messages if "WATCHDOG=1" in m]
        check(not pings, "WATCHDOG_PID of another process: no WATCHDOG=1 is sent (%d were)" % len(pings))
    finally:
        n.close()


def refused_start(env, data, name):
    p = subprocess.run([KILND, "--port", "0", "--data-dir", data], env=dict(ENV, **env), capture_output=True,
                       text=True, timeout=30)
    return p.returncode, p.stderr


def test_bad_notify_values():
    rc, err = refused_start({"NOTIFY_SOCKET": "relative/socket"}, os.path.join(TMP, "bad1"), "bad socket")
    check(rc != 0 and "NOTIFY_SOCKET 'relative/socket'" in err, "a relative NOTIFY_SOCKET is refused by name: %s"
          % err.strip()[-200:])
    rc, err = refused_start({"NOTIFY_SOCKET": os.path.join(TMP, "unused.sock"), "WATCHDOG_USEC": "soon"},
                            os.path.join(TMP, "bad2"), "bad watchdog")
    check(rc != 0 and "WATCHDOG_USEC 'soon'" in err, "a malformed WATCHDOG_USEC is refused by name: %s"
          % err.strip()[-200:])


def test_data_dir_permissions():
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        print("skip: the other-user cases need root and setpriv (util-linux) to change uid", flush=True)
        return
    # Everything kilnd needs to read must be reachable by another uid.
    os.chmod(TMP, 0o755)
    owned = os.path.join(TMP, "owned-by-root")
    os.mkdir(owned, 0o755)
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", KILND, "--port", "0",
                        "--data-dir", owned], env=ENV, capture_output=True, text=True, timeout=30)
    check(p.returncode != 0, "a data folder owned by another user stops the start (exit %d)" % p.returncode)
    check("data_dir %s is not writable" % owned in p.stderr and "uid 65534" in p.stderr,
          "the message names the folder and the uid: %s" % p.stderr.strip()[-300:])
    check("listening" not in p.stderr and not os.path.exists(os.path.join(owned, "kilnd.port")),
          "the refusal comes before kilnd binds")
    # OpenShift runs an arbitrary uid with group 0; a group-0, group-writable folder must do.
    shared = os.path.join(TMP, "group-zero")
    os.mkdir(shared)
    os.chown(shared, 0, 0)
    os.chmod(shared, 0o2775)
    proc = subprocess.Popen(["setpriv", "--reuid=1000870000", "--regid=0", "--clear-groups", KILND, "--port", "0",
                             "--data-dir", shared], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(TMP, "group-zero.log"), "wb"))
    try:
        port = None
        deadline = time.time() + 20
        while time.time() < deadline and proc.poll() is None:
            pf = os.path.join(shared, "kilnd.port")
            if os.path.exists(pf) and http_status(int(open(pf).read()), "/v2/health/ready") == 200:
                port = int(open(pf).read())
                break
            time.sleep(0.05)
        check(port is not None, "an arbitrary uid with group 0 starts on a group-writable folder: %s"
              % open(os.path.join(TMP, "group-zero.log")).read()[-300:])
        check(os.stat(os.path.join(shared, "kiln.db")).st_uid == 1000870000, "its job store belongs to that uid")
        proc.send_signal(signal.SIGTERM)
        check(proc.wait(timeout=30) == 0, "and exits 0 after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main():
    try:
        test_unit_file()
        test_notify(os.path.join(TMP, "notify.sock"), "path socket")
        test_notify("@kiln-test-notify-%d" % os.getpid(), "abstract socket")
        test_watchdog_other_pid()
        test_bad_notify_values()
        test_data_dir_permissions()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        sys.exit(1)
    print("all service checks passed")


if __name__ == "__main__":
    main()
