#!/usr/bin/env python3
"""The kiln CLI's and the Python client's config file, and the CLI's local usage errors, without a
kilnd (the address used, http://127.0.0.1:1, refuses every connection, so which one a command tried
shows in its message):

- the CLI's file is $KILN_CLI_CONFIG (else $XDG_CONFIG_HOME/kiln/cli.json): $KILN_CONFIG is kilnd's
  and is never read, so kilnd's keys are not an error and a CLI file named there is not used;
- a key other than url and token in the CLI's file is refused naming it (exit 2; ValueError in
  Python), so a misspelt "token" does not end in a 401 with no hint;
- `train submit DIR` is a local "cannot read" (exit 2), not a body sent to kilnd;
- a job id of 0 is a usage error (exit 2) like -1, for job, cancel, resume and watch;
- --token and --url without a value say that the option needs one;
- a host that never answers a connect is given up after 10 s.

Usage: test_cli_config.py KILN_CLI PYTHON_CLIENT_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402
from kilnd_harness import check  # noqa: E402

CLI, CLIENT_DIR = sys.argv[1], sys.argv[2]
sys.path.insert(0, CLIENT_DIR)
import kiln_client as kc  # noqa: E402

TMP = tempfile.mkdtemp(prefix="kiln-cli-config-")
XDG = os.path.join(TMP, "xdg")
os.makedirs(os.path.join(XDG, "kiln"))
BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
BASE_ENV.update(XDG_CONFIG_HOME=XDG, HOME=TMP)


def write(name, doc):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


KILND_FILE = write("kilnd.json", {"devices": ["cpu"], "port": 8080})
write(os.path.join("xdg", "kiln", "cli.json"), {"url": "http://127.0.0.1:1/xdg"})


def kiln(*args, **env):
    p = subprocess.run([CLI] + list(args), capture_output=True, text=True, env=dict(BASE_ENV, **env), timeout=30)
    return p.returncode, p.stderr


def test_cli_file():
    rc, err = kiln("jobs", KILN_CONFIG=KILND_FILE)
    check(rc == 2 and "cannot reach kilnd at http://127.0.0.1:1/xdg" in err and "unknown key" not in err,
          "KILN_CONFIG (kilnd's file) is not read; the default CLI file is: %s %r" % (rc, err))
    named = write("cli.json", {"url": "http://127.0.0.1:1/named", "token": "t"})
    rc, err = kiln("jobs", KILN_CONFIG=named)
    check(rc == 2 and "http://127.0.0.1:1/xdg" in err and "KILN_CLI_CONFIG" in err,
          "a CLI file named by KILN_CONFIG is not used, and the message says where the CLI's goes: %r" % err)
    rc, err = kiln("jobs", KILN_CLI_CONFIG=named, KILN_CONFIG=KILND_FILE)
    check(rc == 2 and "cannot reach kilnd at http://127.0.0.1:1/named" in err,
          "KILN_CLI_CONFIG names the CLI's file: %r" % err)
    typo = write("typo.json", {"url": "http://127.0.0.1:1/typo", "tokn": "x", "extra": 1})
    rc, err = kiln("jobs", KILN_CLI_CONFIG=typo)
    check(rc == 2 and "unknown keys 'tokn', 'extra'" in err and "cannot reach" not in err,
          "unknown keys in the CLI's file are refused naming them: %s %r" % (rc, err))
    p = subprocess.run([CLI, "--help"], capture_output=True, text=True, env=BASE_ENV, timeout=30)
    text = p.stdout.replace("$", "").replace("\n", " ")
    check(p.returncode == 0 and "KILN_CLI_CONFIG" in text and "KILN_CONFIG is kilnd's" in text,
          "--help states the rule")


def test_python_client_file():
    saved = {k: os.environ.pop(k, None) for k in ("KILN_URL", "KILN_TOKEN", "KILN_CONFIG", "KILN_CLI_CONFIG",
                                                  "XDG_CONFIG_HOME")}
    try:
        os.environ["XDG_CONFIG_HOME"] = XDG
        os.environ["KILN_CONFIG"] = write("cli-in-kiln-config.json", {"url": "http://127.0.0.1:1/wrong"})
        check(kc.Client().url == "http://127.0.0.1:1/xdg", "Python: KILN_CONFIG is not read, the default file is")
        os.environ["KILN_CLI_CONFIG"] = write("py.json", {"url": "http://127.0.0.1:1/py", "token": "t"})
        c = kc.Client()
        check(c.url == "http://127.0.0.1:1/py" and c.token == "t", "Python: KILN_CLI_CONFIG names the file")
        os.environ["KILN_CLI_CONFIG"] = write("py-typo.json", {"url": "http://127.0.0.1:1/py", "tokn": "t"})
        try:
            kc.Client()
            check(False, "Python: an unknown key raises")
        except ValueError as e:
            check("unknown key 'tokn'" in str(e), "Python: an unknown key raises naming it: %s" % e)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def test_usage_errors():
    url = "--url=http://127.0.0.1:1"
    rc, err = kiln(url, "train", "submit", TMP)
    check(rc == 2 and ("cannot read %s" % TMP) in err and "cannot reach" not in err,
          "train submit of a folder: a local read error, exit 2: %s %r" % (rc, err))
    for cmd in ("job", "cancel", "resume", "watch"):
        for jid in ("0", "000", "-1"):
            rc, err = kiln(url, cmd, jid)
            check(rc == 2 and "usage" in err and "cannot reach" not in err,
                  "kiln %s %s: a usage error, exit 2: %s %r" % (cmd, jid, rc, err))
    for opt in ("--token", "--url"):
        rc, err = kiln("jobs", opt)
        check(rc == 2 and "option %s needs a value" % opt in err, "%s without a value says so: %r" % (opt, err[:60]))
    rc, err = kiln(url, "watch", "0")
    check(rc == 2 and "'0' is not a job id" in err, "kiln watch 0 says 0 is not a job id: %r" % err[:120])
    rc, err = kiln(url, "jobs", "--state")
    check(rc == 2 and "--state needs a value" in err and "cannot reach" not in err,
          "kiln jobs --state without a value says so: %r" % err[:120])
    p = subprocess.run([CLI, url, "--version"], capture_output=True, text=True, env=BASE_ENV, timeout=30)
    check(p.returncode == 0 and re.fullmatch(r"kiln \d+\.\d+\.\d+\n", p.stdout) is not None,
          "kiln --version prints the client's version without asking a server: %d %r %r" %
          (p.returncode, p.stdout, p.stderr[:120]))


def fill_accept_queue(port):
    """Connections that fill a backlog-0 listener's accept queue: later SYNs are dropped, unanswered."""
    import socket
    fillers = []
    for _ in range(8):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(c)
    return fillers


def test_silent_host():
    """A host that drops the connection's SYNs (here a listener whose backlog is full): the CLI gives up
    after its 10 s connect limit (it waited for the kernel's retries, more than two minutes)."""
    import socket
    import time
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = fill_accept_queue(port)
    time.sleep(0.2)
    started = time.time()
    p = subprocess.run([CLI, "--url=http://127.0.0.1:%d" % port, "health"], capture_output=True, text=True,
                       env=BASE_ENV, timeout=100)
    took = time.time() - started
    check(p.returncode == 2 and "Connection timed out" in p.stderr and 5 < took < 60,
          "a host that never answers the connect: exit 2 after the 10 s limit, not the kernel's minutes: "
          "%d after %.1f s %r" % (p.returncode, took, p.stderr[:160]))
    for c in fillers:
        c.close()
    listener.close()


JOB = b'{"id": 7, "state": "running", "register_as": "chunky", "spec": {"epochs": 1}}'
EVENTS = (b'retry: 1000\n\nid: 1\nevent: state\ndata: {"state": "running"}\n\n'
          b'id: 2\nevent: state\ndata: {"state": "succeeded"}\n\n')


def chunked(body, size):
    """body framed as chunks of size bytes, with an extension and a trailer as a proxy may send."""
    out = b""
    for i in range(0, len(body), size):
        part = body[i:i + size]
        out += b"%x%s\r\n%s\r\n" % (len(part), b";ext=1" if i == 0 else b"", part)
    return out + b"0\r\nX-Trailer: t\r\n\r\n"


def serve_one(listener, head, body):
    c, _ = listener.accept()
    c.recv(65536)
    c.sendall(head + body)
    return c


def test_chunked_from_a_proxy():
    """A reverse proxy re-frames responses without a length in chunks (nginx does, for an HTTP/1.1
    client), with boundaries anywhere, inside an event's line too: the CLI reads the payload."""
    import socket
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"

    def answer():
        serve_one(listener, head % b"application/json", chunked(JOB, 5)).close()
        serve_one(listener, head % b"text/event-stream", chunked(EVENTS, 3)).close()
    t = threading.Thread(target=answer)
    t.start()
    p = subprocess.run([CLI, "--url=http://127.0.0.1:%d" % port, "watch", "7", "--plain"], capture_output=True,
                       text=True, env=BASE_ENV, timeout=60)
    t.join(10)
    listener.close()
    check(p.returncode == 0 and "succeeded" in p.stdout,
          "a job and its events in 3- and 5-byte chunks are followed to the end: %d %r %r"
          % (p.returncode, p.stdout[-300:], p.stderr[-300:]))


def test_interrupt_while_connecting():
    """Ctrl-C while watch reconnects to a host that no longer answers: it stops at once (it waited
    out the 10 s connect limit first)."""
    import signal
    import socket
    import threading
    import time
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    head = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nConnection: close\r\n\r\n"

    def answer():
        serve_one(listener, head % b"application/json", JOB).close()
        stream = serve_one(listener, head % b"text/event-stream", EVENTS.split(b"id: 2")[0])
        fillers.extend(fill_accept_queue(port))  # full before the stream ends: the reconnect hangs
        time.sleep(0.2)
        stream.close()
    t = threading.Thread(target=answer)
    t.start()
    proc = subprocess.Popen([CLI, "--url=http://127.0.0.1:%d" % port, "watch", "7", "--plain"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=BASE_ENV)
    t.join(10)
    time.sleep(1.5)  # past the stream's end: reconnecting
    started = time.time()
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    took = time.time() - started
    check(proc.returncode == 130 and took < 3 and "stopped watching; job 7 goes on" in err,
          "Ctrl-C while reconnecting stops watch at once: %s after %.1f s %r" % (proc.returncode, took, err[-300:]))
    for c in fillers:
        c.close()
    listener.close()


def main():
    test_cli_file()
    test_chunked_from_a_proxy()
    test_interrupt_while_connecting()
    test_python_client_file()
    test_usage_errors()
    test_silent_host()
    shutil.rmtree(TMP, ignore_errors=True)
    H.cleanup()
    H.finish()


if __name__ == "__main__":
    main()
