#!/usr/bin/env python3
"""The container image's entry point, from deploy/Dockerfile, run on the built kilnd (suite 'deploy').

Usage: test_entrypoint.py KILND SOURCE_ROOT

Without podman or an image build (test_image.py runs the real image):
- ENTRYPOINT is tini, then `/bin/sh -c SCRIPT kilnd`: tini is PID 1 in the container (it reaps
  orphans and passes signals on), and the runtime stage installs it; HEALTHCHECK and
  STOPSIGNAL SIGTERM are still there.
- SCRIPT, run here with the built kilnd in place of /usr/local/bin/kilnd and a parent umask of
  0022: the process it starts becomes kilnd itself (exec, so signals reach it), with umask 0002,
  the container's arguments intact (a data folder whose name holds a space), and a lock file of
  mode 0664; SIGTERM to it drains kilnd to exit status 0.
- Where tini is installed here, the whole chain once more, SIGTERM sent to tini.
Standard library only.
"""
import http.client
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

KILND, ROOT = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
PASSED, FAILURES = [], []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    (PASSED if cond else FAILURES).append(what)
    return cond


def ready(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request("GET", "/v2/health/ready")
        return c.getresponse().status == 200
    finally:
        c.close()


def wait_ready(proc, data):
    portfile = os.path.join(data, "kilnd.port")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if ready(int(open(portfile).read())):
                return True
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return False


def kilnd_pid(pid):
    """pid itself when it runs kilnd, else its only child that does (tini's), else None."""
    try:
        if os.path.realpath("/proc/%d/exe" % pid) == os.path.realpath(KILND):
            return pid
        children = open("/proc/%d/task/%d/children" % (pid, pid)).read().split()
    except OSError:
        return None
    return next((int(c) for c in children if os.path.realpath("/proc/%s/exe" % c) == os.path.realpath(KILND)), None)


def umask_of(pid):
    m = re.search(r"^Umask:\s*([0-7]+)", open("/proc/%d/status" % pid).read(), re.M)
    return int(m.group(1), 8) if m else None


def run_chain(what, argv, tmp):
    """Start argv (the entry point with its arguments), check kilnd behind it, stop it with
    SIGTERM to the first process, as podman stop does to the container's PID 1."""
    data = os.path.join(tmp, what.replace(" ", "-"), "data dir")
    os.makedirs(os.path.dirname(data))
    log = open(os.path.join(tmp, what.replace(" ", "-") + ".log"), "wb")
    proc = subprocess.Popen([*argv, "--port", "0", "--data-dir", data], env=ENV, umask=0o022,
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        if not check(wait_ready(proc, data), "%s: kilnd starts with the arguments after the image name, a data "
                     "folder whose name holds a space included" % what):
            print(open(log.name, errors="replace").read()[-2000:], flush=True)
            return
        pid = kilnd_pid(proc.pid)
        check(pid is not None, "%s: kilnd runs as %s" % (what, "the process itself (exec)" if argv[0] == "/bin/sh"
                                                        else "the init's child"))
        if argv[0] == "/bin/sh":
            check(pid == proc.pid, "%s: the shell exec'd kilnd, so the stop signal reaches it" % what)
        if pid:
            umask = umask_of(pid)
            check(umask == 0o002, "%s: kilnd's umask is 0002 under a parent umask of 0022: %s"
                  % (what, oct(umask) if umask is not None else None))
        lock = stat.S_IMODE(os.stat(os.path.join(data, "kilnd.lock")).st_mode)
        check(lock == 0o664, "%s: the lock file is group-writable, 0664: %o" % (what, lock))
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        check(rc == 0, "%s: SIGTERM to the first process drains kilnd, which exits 0: %s" % (what, rc))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def main():
    text = open(os.path.join(ROOT, "deploy", "Dockerfile")).read()
    m = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    entrypoint = json.loads(m.group(1)) if m else []
    if not check(len(entrypoint) == 6 and entrypoint[:4] == ["/usr/bin/tini", "--", "/bin/sh", "-c"],
                 "ENTRYPOINT is tini, then a shell script: %s" % entrypoint):
        return 1
    script = entrypoint[4]
    check(re.match(r'umask 0002 && exec /usr/local/bin/kilnd "\$@"$', script) is not None,
          "the script sets umask 0002 and execs kilnd with the container's arguments: %r" % script)
    check(entrypoint[5] == "kilnd", "the script's $0 is kilnd (its error messages name it): %r" % entrypoint[5])
    check(re.search(r"--no-install-recommends tini\b", text) is not None, "the runtime stage installs tini")
    check(re.search(r"^HEALTHCHECK ", text, re.M) is not None and re.search(r"^STOPSIGNAL SIGTERM$", text, re.M),
          "HEALTHCHECK and STOPSIGNAL SIGTERM are kept")

    tmp = tempfile.mkdtemp(prefix="kiln-entrypoint-")
    try:
        here = script.replace("/usr/local/bin/kilnd", KILND)
        run_chain("the script", ["/bin/sh", "-c", here, entrypoint[5]], tmp)
        tini = shutil.which("tini")
        if tini:
            run_chain("tini and the script", [tini, "--", "/bin/sh", "-c", here, entrypoint[5]], tmp)
        else:
            print("note: tini is not installed here; the image test runs the chain with it", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (len(PASSED), len(FAILURES)))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
