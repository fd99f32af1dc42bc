#!/usr/bin/env python3
"""What kilnd does with the files and folders it is given, black-box, over real processes.

Usage: test_daemon_folders.py KILND SOURCE_ROOT

- One kilnd per data folder: a second start on it is refused before it touches anything there
  (port file, job store), naming the first one's pid; --check-config notes it; a kilnd killed
  with SIGKILL never blocks the next start.
- A configured model_repository is served as it is found: missing or not a folder stops the
  start, it is never created, example_models are never copied into it (the log says why);
  files beside the model folders are no models; a model folder or a version folder kilnd cannot
  read says so.
- A missing example_models folder stops the start.
- What kilnd creates (data folders, the lock, model and version folders) gets 0777 or 0666 under
  the umask, so under the image's umask 0002 a kilnd run later as another uid of group 0 uses it.
- --check-config refuses what a start refuses (log file, model folders, data folder), with the
  same message, and leaves nothing behind.
- api_tokens entries with a mistyped scope or a token listed twice, and a config file giving a
  key twice (or nested and dotted), are refused by name, never showing a token.
- The line naming the ports is written whatever log_level says.
- A device that cannot open stops the start before the listening line and the port files.
Standard library only.
"""
import http.client
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

KILND, SOURCE = sys.argv[1], sys.argv[2]
EXAMPLES = os.path.join(SOURCE, "examples", "models")
TMP = tempfile.mkdtemp(prefix="kilnd-folders-")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
FAILURES = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def request(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path, body=body, headers={"Connection": "close"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


class Daemon:
    """kilnd --port 0 on data, waited for until ready; argv may be prefixed (setpriv), and the
    umask set for it (the default: this process's)."""

    def __init__(self, name, data, *args, env=None, prefix=(), umask=-1):
        self.data = data
        self.log = os.path.join(TMP, name + ".log")
        portfile = os.path.join(data, "kilnd.port")
        self.proc = subprocess.Popen([*prefix, KILND, "--port", "0", "--data-dir", data, *args],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"), env=dict(ENV, **(env or {})),
                                     umask=umask)
        self.port = None
        deadline = time.time() + 30
        while time.time() < deadline and self.proc.poll() is None:
            try:
                port = int(open(portfile).read())
                if request(port, "GET", "/v2/health/ready")[0] == 200:
                    self.port = port
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        self.proc.kill()
        raise RuntimeError("kilnd %s did not become ready: %s" % (name, self.text()[-2000:]))

    def text(self):
        return open(self.log, errors="replace").read()

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)


def refused(*args, env=None):
    """A start that must fail: (exit code, stderr); (None, stderr) for one still running after 10 s,
    which is stopped then."""
    p = subprocess.Popen([KILND, "--port", "0", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env=dict(ENV, **(env or {})))
    try:
        _, err = p.communicate(timeout=10)
        return p.returncode, err
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        return None, err


def run_check(*args, env=None):
    return subprocess.run([KILND, "--check-config", *args], capture_output=True, text=True,
                          env=dict(ENV, **(env or {})), timeout=30)


def read_or_none(path):
    try:
        return open(path).read()
    except OSError:
        return None


def check_message(r):
    return r.stderr.strip().partition("kilnd: configuration error: ")[2]


def test_one_kilnd_per_data_dir():
    data = os.path.join(TMP, "shared")
    first = Daemon("first", data)
    try:
        port_before = read_or_none(os.path.join(data, "kilnd.port"))
        rc, err = refused("--data-dir", data)
        check(rc == 1 and "data_dir %s is in use by another kilnd (pid %d)" % (data, first.proc.pid) in err,
              "a second kilnd on the data folder is refused, naming the first one's pid: %r" % err[-400:])
        check("listening" not in err, "the refused one never bound a port")
        check(read_or_none(os.path.join(data, "kilnd.port")) == port_before,
              "the first one's port file is left as it was")
        check(request(first.port, "GET", "/v2/health/ready")[0] == 200, "the first one still serves")
        # a user who removes kilnd.lock as a stale file does not open the door to a second kilnd
        os.unlink(os.path.join(data, "kilnd.lock"))
        rc, err = refused("--data-dir", data)
        check(rc == 1 and "data_dir %s is in use by another kilnd" % data in err,
              "with kilnd.lock removed, a second kilnd is still refused: %r" % err[-400:])
        check(request(first.port, "GET", "/v2/health/ready")[0] == 200, "and the first one still serves")
        r = run_check("--data-dir", data)
        check(r.returncode == 0 and "in use by a running kilnd (pid %d)" % first.proc.pid in r.stdout,
              "--check-config notes the running kilnd without refusing the configuration: %r %r"
              % (r.stdout, r.stderr))
    finally:
        rc = first.stop(signal.SIGKILL)
    check(rc == -signal.SIGKILL, "the first one was killed (%s)" % rc)
    # the lock went with the process: nothing to clean up before the next start
    second = Daemon("after-kill", data)
    lock = os.path.join(data, "kilnd.lock")
    check((read_or_none(lock) or "").strip() == str(second.proc.pid), "the lock file names the running kilnd")
    check(second.stop() == 0, "a start after SIGKILL serves and stops cleanly")
    check(read_or_none(lock) == "", "a clean stop leaves the lock file empty")
    r = run_check("--data-dir", data)
    check(r.returncode == 0 and "note" not in r.stdout, "no note once no kilnd runs: %r" % r.stdout)


def test_damaged_job_store():
    # a kiln.db that is no SQLite database (damaged, or some other file) stops the start naming
    # the file and the way out; SQLite's own words ("file is not a database") named neither
    data = os.path.join(TMP, "damaged-db")
    os.makedirs(data)
    db = os.path.join(data, "kiln.db")
    with open(db, "wb") as f:
        f.write(os.urandom(3000))
    before = open(db, "rb").read()
    rc, err = refused("--data-dir", data)
    check(rc == 1 and "%s is damaged or is not kilnd's job store" % db in err and "move it away" in err,
          "a damaged job store stops the start, naming it and what to do: %r" % err[-400:])
    check(open(db, "rb").read() == before, "the damaged file is left as it was")

    # damage inside a store kilnd made (a page overwritten, the header intact) is found at start
    # too, not by whichever request first reads the page
    data = os.path.join(TMP, "damaged-page")
    d = Daemon("damaged-page", data)
    check(d.stop() == 0, "a store is made and closed")
    db = os.path.join(data, "kiln.db")
    size = os.path.getsize(db)
    check(size >= 4 * 4096 and not os.path.exists(db + "-wal"), "its pages are all in the file (%d bytes)" % size)
    with open(db, "r+b") as f:
        f.seek(2 * 4096)
        f.write(bytes(range(256)) * 16)
    before = open(db, "rb").read()
    rc, err = refused("--data-dir", data)
    check(rc == 1 and "%s is damaged or is not kilnd's job store" % db in err and "move it away" in err,
          "a page overwritten inside the store stops the start, naming it and what to do: %r" % err[-400:])
    check(open(db, "rb").read() == before, "the damaged file is left as it was")
    r = run_check("--data-dir", data)
    check(r.returncode == 1 and "%s is damaged or is not kilnd's job store" % db in r.stderr,
          "--check-config refuses it as the start does: %d %r" % (r.returncode, r.stderr[-300:]))
    check(open(db, "rb").read() == before, "and leaves the file as it was")
    # a sound store passes the check, beside a kilnd running on it
    sound = os.path.join(TMP, "sound-store")
    d = Daemon("sound-store", sound)
    try:
        r = run_check("--data-dir", sound)
        check(r.returncode == 0 and "configuration OK" in r.stdout,
              "a sound store passes the check while kilnd runs on it: %r %r" % (r.stdout, r.stderr))
    finally:
        d.stop()


def test_model_repository():
    data = os.path.join(TMP, "repo-data")
    missing = os.path.join(TMP, "nosuch-models")
    rc, err = refused("--data-dir", data, "--model-repository", missing)
    check(rc == 1 and "model_repository %s does not exist" % missing in err,
          "a missing model_repository stops the start: %r" % err[-400:])
    check(not os.path.exists(missing) and not os.path.exists(data),
          "neither the repository nor the data folder was created")
    afile = os.path.join(TMP, "some-file.json")
    open(afile, "w").write("{}")
    rc, err = refused("--data-dir", data, "--model-repository", afile)
    check(rc == 1 and "model_repository %s is not a folder" % afile in err, "a file is refused: %r" % err[-300:])

    # a configured repository is served as found: no examples copied in, files beside the
    # model folders are no models, and nothing is written
    repo = os.path.join(TMP, "emptyrepo")
    os.mkdir(repo)
    open(os.path.join(repo, "README.md"), "w").write("# models\n")
    open(os.path.join(repo, ".keep"), "w").write("")
    d = Daemon("emptyrepo", data, "--model-repository", repo, "--example-models", EXAMPLES)
    try:
        st, body = request(d.port, "POST", "/v2/repository/index", b"")
        check(st == 200 and json.loads(body) == [], "the index of the given repository is empty: %s %s" % (st, body))
    finally:
        d.stop()
    check(sorted(os.listdir(repo)) == [".keep", "README.md"], "nothing was copied into it: %s" % os.listdir(repo))
    log = d.text()
    check("example models in %s not copied: model_repository is set" % EXAMPLES in log,
          "the log says why the examples were not copied")
    check("README.md" not in log, "the README is not warned about")
    check(not os.path.exists(os.path.join(data, "models")), "no <data_dir>/models made beside a given repository")

    # the default repository is made and takes the examples
    fresh = os.path.join(TMP, "default-data")
    d = Daemon("default", fresh, "--example-models", EXAMPLES)
    try:
        st, body = request(d.port, "POST", "/v2/repository/index", b"")
        names = [m["name"] for m in json.loads(body)] if st == 200 else body
    finally:
        d.stop()
    check(names == ["cnn"] and os.path.isdir(os.path.join(fresh, "models", "cnn", "1")),
          "the examples are copied into <data_dir>/models: %s" % names)


def test_unreadable_model_folder():
    """A model folder kilnd cannot list, and a version folder it cannot search, say so in the
    index (not "no model.kiln or model.onnx"). As root (for whom mode 000 opens anyway) kilnd runs
    as another uid through setpriv."""
    as_other = os.geteuid() == 0
    if as_other and not shutil.which("setpriv"):
        print("skip: running as root without setpriv, kilnd cannot be run as another user", flush=True)
        return
    os.chmod(TMP, 0o755)
    repo = os.path.join(TMP, "locked-repo")
    shutil.copytree(EXAMPLES, repo)
    os.mkdir(os.path.join(repo, "locked"))
    os.chmod(os.path.join(repo, "locked"), 0)
    shutil.copytree(os.path.join(EXAMPLES, "cnn"), os.path.join(repo, "lockedversion"))
    locked_version = os.path.join(repo, "lockedversion", "1")
    os.chmod(locked_version, 0)
    data = os.path.join(TMP, "locked-data")
    os.mkdir(data)
    prefix = ()
    if as_other:
        os.chown(data, 65534, 65534)
        prefix = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    d = Daemon("locked", data, "--model-repository", repo, prefix=prefix)
    try:
        st, body = request(d.port, "POST", "/v2/repository/index", b"")
        rows = {m["name"]: m for m in json.loads(body)} if st == 200 else {}
    finally:
        d.stop()
        os.chmod(os.path.join(repo, "locked"), 0o755)
        os.chmod(locked_version, 0o755)
    reason = rows.get("locked", {}).get("reason", "")
    check("cannot read: Permission denied" in reason, "the unreadable folder's reason is given: %r" % reason)
    row = rows.get("lockedversion", {})
    check(row.get("version") == "1" and row.get("reason") == "cannot read: Permission denied",
          "the unreadable version folder's reason is given: %s" % row)
    check(rows.get("cnn", {}).get("state") == "READY", "the readable model beside it serves: %s" % rows.get("cnn"))


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_modes_follow_umask():
    """Folders kilnd creates get 0777 under the umask, its lock 0666: under the image's umask 0002
    they are group-writable, a model's version folder included (mkdtemp's 0700 once left the
    example model to the uid that copied it), and under umask 0 nothing narrows them further. As
    root, a kilnd then run as another uid of group 0 (OpenShift's rule) takes the lock on the same
    folder and serves the model."""
    os.chmod(TMP, 0o755)
    for umask, folder_mode, file_mode in ((0o002, 0o775, 0o664), (0o000, 0o777, 0o666)):
        top = os.path.join(TMP, "umask-%03o" % umask)
        data = os.path.join(top, "data")
        Daemon("umask-%03o" % umask, data, "--example-models", EXAMPLES, umask=umask).stop()
        models = os.path.join(data, "models")
        folders = {p: mode_of(p) for p in (top, data, models, os.path.join(models, "cnn"),
                                            os.path.join(models, "cnn", "1")) if os.path.isdir(p)}
        check(len(folders) == 5 and set(folders.values()) == {folder_mode},
              "under umask %03o the data folders, model folder and version folder are %o: %s"
              % (umask, folder_mode, {os.path.relpath(p, TMP): "%o" % m for p, m in folders.items()}))
        lock = mode_of(os.path.join(data, "kilnd.lock"))
        check(lock == file_mode, "under umask %03o the lock file is %o: %o" % (umask, file_mode, lock))
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        print("skip: another uid in group 0 needs root and setpriv to switch to it", flush=True)
        return
    data = os.path.join(TMP, "umask-002", "data")
    d = Daemon("other-uid", data, umask=0o002,
               prefix=("setpriv", "--reuid=12345", "--regid=0", "--clear-groups"))
    try:
        st, body = request(d.port, "POST", "/v2/repository/index", b"")
        rows = {m["name"]: m for m in json.loads(body)} if st == 200 else {}
    finally:
        rc = d.stop()
    check(rows.get("cnn", {}).get("state") == "READY",
          "uid 12345 in group 0 serves the model uid 0 copied under umask 0002: %s" % rows.get("cnn"))
    check(rc == 0, "and stops cleanly (%s)" % rc)


def test_example_models_missing():
    data = os.path.join(TMP, "ex-data")
    missing = os.path.join(TMP, "nosuch-examples")
    rc, err = refused("--data-dir", data, "--example-models", missing)
    check(rc == 1 and "example_models %s does not exist" % missing in err,
          "a missing example_models stops the start: %r" % err[-300:])
    r = run_check("--data-dir", data, "--example-models", missing)
    check(r.returncode == 1 and check_message(r) in err, "--check-config says the same: %r" % r.stderr)
    check(not os.path.exists(data), "no data folder left behind")


def test_check_config_matches_start():
    afile = os.path.join(TMP, "plain-file")
    open(afile, "w").write("x")
    cases = [
        (["--log-file", os.path.join(TMP, "nodir", "k.log")], "log_file: cannot open"),
        (["--model-repository", afile], "is not a folder"),
        (["--data-dir", "/proc/nope"], "data_dir: cannot create /proc/nope"),
        (["--data-dir", os.path.join(afile, "sub")], "data_dir: cannot create"),
    ]
    for args, words in cases:
        if "--data-dir" not in args:
            args = args + ["--data-dir", os.path.join(TMP, "parity-data")]
        r = run_check(*args)
        msg = check_message(r)
        check(r.returncode == 1 and words in msg and "OK" not in r.stdout,
              "--check-config %s is refused: %r" % (" ".join(args), r.stderr))
        rc, err = refused(*args)
        check(rc == 1 and msg and msg in err, "a start with %s fails with the same message: %r" % (" ".join(args), err))
    # what a check creates to find out, it removes again
    deep = os.path.join(TMP, "not-yet", "deep", "data")
    newlog = os.path.join(TMP, "new.log")
    r = run_check("--data-dir", deep, "--log-file", newlog)
    check(r.returncode == 0, "a configuration whose folders do not exist yet is OK: %r" % r.stderr)
    check(not os.path.exists(os.path.join(TMP, "not-yet")) and not os.path.exists(newlog),
          "the check left neither the data folder nor the log file behind")


def test_tokens_and_repeated_keys():
    for tokens, words in (("Admin:SECRET,read:AAA,admin:BBB", "api_tokens: entry 1 starts with 'Admin:'"),
                          ("read:AAA,write:SECRET", "api_tokens: entry 2 starts with 'write:'"),
                          ("read:SECRET,admin:SECRET", "api_tokens: entries 1 and 2 are the same token")):
        env = {"KILN_API_TOKENS": tokens}
        rc, err = refused("--data-dir", os.path.join(TMP, "tok"), env=env)
        check(rc == 1 and words in err and "SECRET" not in err, "tokens %s refused: %r" % (tokens, err[-300:]))
        r = run_check(env=env)
        check(r.returncode == 1 and words in r.stderr and "SECRET" not in r.stderr,
              "--check-config refuses tokens %s: %r" % (tokens, r.stderr))
    for doc, words in (('{"port": 1, "port": 2}', "port: given twice"),
                       ('{"limits": {"max_body_bytes": 10}, "limits.max_body_bytes": 1000}',
                        "limits.max_body_bytes: given twice")):
        path = os.path.join(TMP, "dup.json")
        open(path, "w").write(doc)
        r = run_check("--config", path)
        check(r.returncode == 1 and words in r.stderr and path in r.stderr, "%s refused: %r" % (doc, r.stderr))
        rc, err = refused("--config", path, "--data-dir", os.path.join(TMP, "dup"))
        check(rc == 1 and words in err, "a start with %s is refused: %r" % (doc, err[-300:]))


def test_port_logged_at_any_level():
    data = os.path.join(TMP, "quiet")
    d = Daemon("quiet", data, "--log-level", "error", "--grpc-port", "0")
    try:
        grpc_port = int(open(os.path.join(data, "kilnd.grpc_port")).read())
    finally:
        d.stop()
    lines = d.text().splitlines()
    check(lines and "notice" in lines[0] and "port=%d" % d.port in lines[0],
          "with log_level error the first line still names the port: %r" % lines[:3])
    check(any("grpc_port=%d" % grpc_port in l for l in lines), "and the gRPC port: %r" % lines)
    check(not any(" info " in l for l in lines), "nothing below error besides: %r" % lines)


def test_device_secret_not_shown():
    """A remote device's token in the configured devices never reaches the output, whether
    --check-config or a start refuses the device."""
    spec = "remote://127.0.0.1:1/cpu?token=topsecret42"
    data = os.path.join(TMP, "secret")
    r = run_check("--data-dir", data, "--devices", spec)
    check(r.returncode == 1 and "token=***" in r.stderr and "topsecret42" not in r.stdout + r.stderr,
          "--check-config names the device with its token masked: %r" % r.stderr)
    code, err = refused("--data-dir", data, "--devices", spec)
    check(code == 1 and "token=***" in err and "topsecret42" not in err,
          "a start names the device with its token masked: %r" % err)


def test_device_that_cannot_open():
    """A configured device that cannot open stops the start before kilnd says it listens: no
    "listening" line, no port file, exit 1 and the device named. cpu:3 fails on every machine;
    vulkan:99 too, whether or not this build has Vulkan."""
    for dev, words in (("cpu:3", "'cpu:3'"), ("vulkan:99", "'vulkan:99'")):
        data = os.path.join(TMP, "baddev")
        shutil.rmtree(data, ignore_errors=True)
        code, err = refused("--data-dir", data, "--devices", "cpu," + dev, "--grpc-port", "0")
        check(code == 1, "a start with device %s exits 1: %r" % (dev, code))
        check("listening" not in err, "and never logs a listening line: %r" % err[-600:])
        check(words in err and "error" in err, "the error names the device %s: %r" % (dev, err[-600:]))
        check(not os.path.exists(os.path.join(data, "kilnd.port"))
              and not os.path.exists(os.path.join(data, "kilnd.grpc_port")), "no port file is left behind")


def test_messages_name_the_cause():
    """What a start meets in its folders is named as it is: a dangling symbolic link, a folder where
    kiln.db belongs, a read-only file system (no chown can mend that one)."""
    base = os.path.join(TMP, "causes")
    os.makedirs(base)
    link = os.path.join(base, "data-link")
    os.symlink(os.path.join(base, "moved-away"), link)
    rc, err = refused("--data-dir", link)
    check(rc == 1 and "data_dir: %s is a symbolic link to %s, which does not exist" % (link, os.path.join(base, "moved-away"))
          in err, "a data_dir that is a dangling link is said so: %r" % err[-300:])
    data = os.path.join(base, "models-link")
    os.makedirs(data)
    os.symlink(os.path.join(base, "no-models"), os.path.join(data, "models"))
    rc, err = refused("--data-dir", data)
    check(rc == 1 and "models is a symbolic link to %s, which does not exist" % os.path.join(base, "no-models") in err
          and "read-only" not in err, "so is a models folder that is one, not called read-only: %r" % err[-400:])
    data = os.path.join(base, "db-folder")
    os.makedirs(os.path.join(data, "kiln.db"))
    rc, err = refused("--data-dir", data)
    want = "%s is a folder, not kilnd's job store file: move it away" % os.path.join(data, "kiln.db")
    check(rc == 1 and want in err, "a folder named kiln.db is said so: %r" % err[-300:])
    r = run_check("--data-dir", data)
    check(r.returncode == 1 and want in r.stderr, "by --check-config too: %r" % r.stderr[-300:])
    ro = os.path.join(base, "read-only")
    os.makedirs(ro)
    if os.geteuid() != 0 or subprocess.call(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", ro]) != 0:
        print("skip: a read-only file system needs root to mount")
        return
    try:
        rc, err = refused("--data-dir", ro)
        check(rc == 1 and "data_dir %s is on a read-only file system: mount it read-write" % ro in err
              and "chown" not in err, "a read-only file system is said so, without chown advice: %r" % err[-300:])
    finally:
        subprocess.call(["umount", ro])


def main():
    tests = (test_one_kilnd_per_data_dir, test_damaged_job_store, test_model_repository, test_unreadable_model_folder,
             test_modes_follow_umask, test_example_models_missing, test_check_config_matches_start, test_tokens_and_repeated_keys,
             test_port_logged_at_any_level, test_device_secret_not_shown, test_device_that_cannot_open,
             test_messages_name_the_cause)
    try:
        for t in tests:
            try:
                t()
            except Exception as e:  # one case gone wrong must not hide the others
                check(False, "%s stopped: %r" % (t.__name__, e))
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    if FAILURES:
        print("%d failure(s)" % len(FAILURES))
        return 1
    print("all folder checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
