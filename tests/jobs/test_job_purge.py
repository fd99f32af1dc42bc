#!/usr/bin/env python3
"""Removing ended jobs: DELETE /v1/jobs/{id}?purge=true on a succeeded and on a cancelled job (the
record, events and checkpoint folders go, the bytes freed are those the folders held, a registered
model version stays, and a restart does not bring the job back); the refusals (a plain DELETE of an
ended job, a queued or running job, a job a continuation resumes from, an unknown id, a bad purge
value); jobs.retention_count and jobs.retention_days applied at start and after a job ends; the
folders of jobs the store does not hold removed at start; `kiln jobs rm`; bad retention values.

A job is made to look old by writing its finished_ms in kiln.db while kilnd is stopped: the column
is what the retention rule reads, and a test cannot wait days.

Usage: test_job_purge.py KILND KILN_CLI
"""
import os
import shutil
import sqlite3
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND, CLI = sys.argv[1], sys.argv[2]
check = H.check
FINAL = ["succeeded", "failed", "cancelled"]
DAY_MS = 86400000
DAEMONS = []


def start(name, fresh=True, extra=()):
    """A kilnd on data dir name, killed at the end should a failed test leave it running."""
    DAEMONS.append(H.Daemon(KILND, name, fresh=fresh, extra=extra))
    return DAEMONS[-1]


def wait_state(d, jid, states, timeout=90):
    try:
        return d.wait_state(jid, states, timeout=timeout)
    except RuntimeError as e:
        check(False, str(e))
        return None


def folder_size(path):
    """(files, bytes) under path, as a purge counts them: regular files and their sizes."""
    files = size = 0
    for root, _, names in os.walk(path):
        for n in names:
            files += 1
            size += os.lstat(os.path.join(root, n)).st_size
    return files, size


def ckpt_dir(d, jid):
    return os.path.join(d.data, "checkpoints", "job-%d" % jid)


def long_spec(name):
    """A job that runs for minutes (many short epochs, a checkpoint after each) until cancelled."""
    s = H.spec(name, epochs=20000)
    del s["register_as"]
    return s


def submit(d, spec):
    st, j = d.req("POST", "/v1/jobs", spec)
    check(st == 201, "submit -> 201: %s %s" % (st, j))
    return j.get("id") if isinstance(j, dict) else None


def run_to_end(d, name, register=True):
    s = H.spec(name, epochs=2)
    if not register:
        del s["register_as"]
    jid = submit(d, s)
    job = wait_state(d, jid, FINAL)
    check(job is not None and job["state"] == "succeeded", "job %s succeeds" % jid)
    return jid


def running_with_checkpoint(d, name):
    """A long job once it is running and has written a checkpoint."""
    jid = submit(d, long_spec(name))
    deadline = time.time() + 60
    while time.time() < deadline:
        st, job = d.req("GET", "/v1/jobs/%d" % jid)
        if st == 200 and job["state"] == "running" and job["checkpoints"]:
            return jid
        time.sleep(0.05)
    check(False, "job %d runs and writes a checkpoint" % jid)
    return jid


def cancel(d, jid):
    st, c = d.req("DELETE", "/v1/jobs/%d" % jid)
    check(st in (200, 202), "DELETE of job %d (not ended) cancels it: %s %s" % (jid, st, c))
    job = wait_state(d, jid, FINAL)
    check(job is not None and job["state"] == "cancelled", "job %d ends cancelled" % jid)


def purge(d, jid):
    return d.req("DELETE", "/v1/jobs/%d?purge=true" % jid)


def check_purged(d, jid, what):
    st, _ = d.req("GET", "/v1/jobs/%d" % jid)
    check(st == 404, "%s: GET -> 404: %s" % (what, st))
    st, _ = d.req("GET", "/v1/jobs/%d/events" % jid)
    check(st == 404, "%s: its events -> 404: %s" % (what, st))
    st, lst = d.req("GET", "/v1/jobs?limit=1000")
    check(st == 200 and jid not in [j["id"] for j in lst["jobs"]], "%s: gone from the list" % what)
    check(not os.path.exists(ckpt_dir(d, jid)), "%s: its checkpoint folder is gone" % what)


def test_purge(name):
    """A succeeded and a cancelled job purged; what stays, what goes, and a restart."""
    d = start(name)
    ok = run_to_end(d, "purge_kept")
    files, size = folder_size(ckpt_dir(d, ok))
    check(files > 0 and size > 0, "the succeeded job has checkpoint files: %d, %d bytes" % (files, size))
    st, e = d.req("DELETE", "/v1/jobs/%d" % ok)
    err = e.get("error", "") if isinstance(e, dict) else ""
    check(st == 409 and "already succeeded" in err and "has ended" in err and "?purge=true" in err,
          "a plain DELETE of the ended job -> 409 saying it has ended and that ?purge=true removes it: %s %s"
          % (st, e))
    for q, want in (("purge=yes", "purge: must be true or false"), ("purge=1", "must be true or false"),
                    ("purge", "must be true or false"), ("purge=true&purge=true", "more than once"),
                    ("prune=true", "unknown parameter 'prune'")):
        st, e = d.req("DELETE", "/v1/jobs/%d?%s" % (ok, q))
        check(st == 400 and want in e.get("error", ""), "DELETE ?%s -> 400 (%s): %s %s" % (q, want, st, e))
    st, e = d.req("DELETE", "/v1/jobs/%d?purge=false" % ok)
    check(st == 409 and "has ended" in e.get("error", ""), "?purge=false is a plain DELETE: %s %s" % (st, e))
    history = 0  # the metric history's rows, epoch and step, that the purge is to count
    for kind in ("epoch", "step"):
        st, m = d.req("GET", "/v1/jobs/%d/metrics?kind=%s&limit=10000" % (ok, kind))
        check(st == 200 and not m.get("more"), "the %s history before the purge: %s" % (kind, st))
        history += len(m["metrics"])
    st, p = purge(d, ok)
    check(st == 200 and p.get("id") == ok and p.get("purged") is True and p.get("state") == "succeeded",
          "purge of the succeeded job -> 200: %s %s" % (st, p))
    check(p.get("files_removed") == files and p.get("bytes_freed") == size and size > 0,
          "it says the files and bytes its checkpoints held (%d, %d): %s" % (files, size, p))
    check(history > 0 and p.get("metrics_removed") == history and p.get("events_removed", 0) > history,
          "and how many events went, the %d rows of its metric history among them: %s" % (history, p))
    check(p.get("model_kept") == {"name": "purge_kept", "version": 1} and "stays in the model repository"
          in p.get("note", ""), "the model version it registered is kept, and said so: %s" % p)
    check_purged(d, ok, "the purged succeeded job")
    check(os.path.isdir(os.path.join(d.data, "models", "purge_kept", "1")),
          "its model version is still in the repository")
    check(d.req("GET", "/v2/models/purge_kept/ready")[0] == 200, "and still served")
    st, e = purge(d, ok)
    check(st == 404 and "no job" in e.get("error", ""), "a second purge -> 404: %s %s" % (st, e))
    st, e = purge(d, 424242)
    check(st == 404 and e.get("error") == "no job 424242", "purge of an unknown id -> 404: %s %s" % (st, e))

    # a running job, and a queued one behind it: refused, and left as they were
    run = running_with_checkpoint(d, "purge_running")
    queued = submit(d, long_spec("purge_queued"))
    for jid, state in ((run, "running"), (queued, "queued")):
        st, e = purge(d, jid)
        err = e.get("error", "")
        check(st == 409 and ("is %s" % state) in err and "cancel it first" in err,
              "purge of the %s job -> 409 (cancel it first, then purge): %s %s" % (state, st, e))
        st, job = d.req("GET", "/v1/jobs/%d" % jid)
        check(st == 200 and job["state"] == state, "the %s job is untouched: %s" % (state, job.get("state")))
    cancel(d, queued)
    cancel(d, run)
    check(os.path.isdir(ckpt_dir(d, run)), "the cancelled job has checkpoints")

    # a job a continuation resumes from stays until the continuation ends
    st, r = d.req("POST", "/v1/jobs/%d/resume" % run)
    check(st == 201, "resume the cancelled job: %s %s" % (st, r))
    cont = r.get("id")
    wait_state(d, cont, ["running"])
    st, e = purge(d, run)
    check(st == 409 and ("job %d resumes from its checkpoints" % cont) in e.get("error", ""),
          "purge of the job a running continuation resumes from -> 409 naming it: %s %s" % (st, e))
    check(os.path.isdir(ckpt_dir(d, run)), "its checkpoints stay")
    cancel(d, cont)
    files, size = folder_size(ckpt_dir(d, run))
    st, p = purge(d, run)
    check(st == 200 and p.get("state") == "cancelled" and p.get("bytes_freed") == size and size > 0
          and p.get("files_removed") == files and p.get("model_kept") is None,
          "once it has ended, the cancelled job is purged (%d files, %d bytes): %s %s" % (files, size, st, p))
    check_purged(d, run, "the purged cancelled job")
    st, p = purge(d, queued)
    check(st == 200 and p.get("bytes_freed") == 0 and p.get("files_removed") == 0,
          "a job cancelled while queued had no files: %s %s" % (st, p))
    st, p = purge(d, cont)
    check(st == 200 and p.get("state") == "cancelled", "the continuation, once cancelled, too: %s %s" % (st, p))
    log = open(d.log).read()
    check(("job %d (succeeded) purged: " % ok) in log and ("job %d (cancelled) purged: " % run) in log,
          "each purge is logged")

    # what was purged stays purged
    d.stop()
    d = start(name, fresh=False)
    for jid in (ok, run, queued, cont):
        st, _ = d.req("GET", "/v1/jobs/%d" % jid)
        check(st == 404, "after a restart purged job %d answers 404: %s" % (jid, st))
    st, lst = d.req("GET", "/v1/jobs")
    check(st == 200 and lst["jobs"] == [], "the list after a restart is empty: %s" % lst)
    check(not os.path.exists(ckpt_dir(d, run)) and not os.path.exists(ckpt_dir(d, cont)), "no folder came back")
    new = run_to_end(d, "purge_after", register=False)
    check(new == cont + 1, "a new job gets a new id, never a purged one: %d after %d" % (new, cont))
    d.stop()


def test_unsaved():
    """A job whose final state the store has not taken yet (the trigger below fails that write, as a
    full disk would) reads succeeded but is running in the store: its purge is refused, saying
    so, until the state is stored."""
    d = start("unsaved")
    db = sqlite3.connect(os.path.join(d.data, "kiln.db"), timeout=30)
    db.execute("CREATE TRIGGER test_store_full BEFORE UPDATE OF state ON jobs "
               "WHEN NEW.state IN ('succeeded', 'failed', 'cancelled') "
               "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
    db.commit()
    jid = submit(d, H.spec("unsaved_purge", epochs=1))
    job = wait_state(d, jid, FINAL)
    check(job is not None and job.get("state_saved") is False, "the job reads succeeded, not saved yet")
    st, e = purge(d, jid)
    check(st == 409 and "has not taken that yet" in e.get("error", ""),
          "its purge -> 409 until the store has its final state: %s %s" % (st, e))
    check(os.path.isdir(ckpt_dir(d, jid)), "its checkpoints stay")
    db.execute("DROP TRIGGER test_store_full")
    db.commit()
    db.close()
    deadline = time.time() + 30
    while time.time() < deadline and "state_saved" in d.req("GET", "/v1/jobs/%d" % jid)[1]:
        time.sleep(0.1)
    st, p = purge(d, jid)
    check(st == 200 and p.get("state") == "succeeded", "once stored, it is purged: %s %s" % (st, p))
    d.stop()


def test_orphans():
    """Folders of jobs the store issued but no longer holds (a purge cut short by a crash after its
    rows went) are removed at start; folders past the store's last id, made under another kiln.db,
    are kept and said, and new jobs take ids past them; the folders of jobs it holds stay."""
    d = start("orphans")
    a = run_to_end(d, "orphan_a", register=False)
    b = run_to_end(d, "orphan_b", register=False)
    d.stop()
    # what a purge leaves when kilnd dies between its transaction and the files
    db = sqlite3.connect(os.path.join(d.data, "kiln.db"))
    db.execute("DELETE FROM jobs WHERE id = ?", (a,))
    db.commit()
    db.close()
    stray = os.path.join(d.data, "checkpoints", "job-977", "step-000000001")
    os.makedirs(stray)
    with open(os.path.join(stray, "model.kiln"), "wb") as f:
        f.write(b"x" * 1000)
    scratch = os.path.join(d.data, "tmp", "job-978-model")
    os.makedirs(scratch)
    open(os.path.join(scratch, "config.json"), "w").write("{}")
    other = os.path.join(d.data, "checkpoints", "notes")
    os.makedirs(other)
    d = start("orphans", fresh=False)
    d.req("GET", "/v1/jobs")  # answered once the start, sweep included, is over
    check(not os.path.exists(ckpt_dir(d, a)), "the folder of the job whose row went is removed at start")
    check(os.path.isfile(os.path.join(stray, "model.kiln")) and os.path.isdir(scratch),
          "folders past the store's last job id (another kiln.db's) are kept")
    check(os.path.isdir(ckpt_dir(d, b)) and os.path.isdir(other), "the job's own folder and other folders stay")
    log = open(d.log).read()
    check(("checkpoints/job-%d belongs to no job in the job store" % a) in log
          and "removed, " in log, "the removal is logged, saying what went")
    check("2 job folder(s) (" in log and "up to job 978) were made under another kiln.db" in log
          and ("issued job ids up to %d only" % b) in log and "New jobs take ids past them." in log,
          "the kept folders are said once, with what to do")
    st, job = d.req("GET", "/v1/jobs/%d" % b)
    check(st == 200 and job["checkpoints"], "the job kilnd holds keeps its checkpoints")
    c = run_to_end(d, "orphan_c", register=False)
    check(c > 978, "a new job takes an id past the kept folders (%d)" % c)
    check(os.path.isfile(os.path.join(stray, "model.kiln")), "and the kept checkpoint is untouched")
    d.stop()


def test_store_emptied():
    """A kiln.db emptied to zero bytes (a failed restore, a truncating copy) opens as a new store;
    the checkpoints of the jobs it lost stay on disk, and the next job does not take their ids."""
    d = start("emptied")
    a = run_to_end(d, "emptied_a", register=False)
    d.stop()
    open(os.path.join(d.data, "kiln.db"), "wb").close()
    for suffix in ("-wal", "-shm"):
        if os.path.exists(os.path.join(d.data, "kiln.db" + suffix)):
            os.unlink(os.path.join(d.data, "kiln.db" + suffix))
    d = start("emptied", fresh=False)
    check(d.req("GET", "/v1/jobs/%d" % a)[0] == 404, "the emptied store has lost job %d" % a)
    check(os.path.isdir(ckpt_dir(d, a)) and os.listdir(ckpt_dir(d, a)),
          "its checkpoints are still on disk")
    b = run_to_end(d, "emptied_b", register=False)
    check(b > a, "the next job's id (%d) is past the kept folder's (%d)" % (b, a))
    check(os.path.isdir(ckpt_dir(d, a)) and os.path.isdir(ckpt_dir(d, b)), "both folders stay")
    d.stop()


def test_version_not_reused():
    """A version folder a user deletes from the repository keeps its number: the next job's model
    takes the number after it, since clients may know the old one."""
    d = start("version-reuse")
    run_to_end(d, "reuse")
    run_to_end(d, "reuse")
    folder = os.path.join(d.data, "models", "reuse")
    check(sorted(os.listdir(folder)) == ["1", "2", "config.json"] or sorted(os.listdir(folder)) == ["1", "2"],
          "two versions: %s" % os.listdir(folder))
    shutil.rmtree(os.path.join(folder, "2"))
    jid = run_to_end(d, "reuse")
    st, job = d.req("GET", "/v1/jobs/%d" % jid)
    got = (job.get("model") or {}).get("version") if st == 200 else None
    check(got == 3 and os.path.isdir(os.path.join(folder, "3")) and not os.path.exists(os.path.join(folder, "2")),
          "the next version is 3, not the deleted 2 again: %s %s" % (got, sorted(os.listdir(folder))))
    by_state = {st: d.metric('kiln_training_jobs{state="%s"}' % st)
                for st in ("queued", "running", "succeeded", "failed", "cancelled")}
    check(by_state == {"queued": 0, "running": 0, "succeeded": 3, "failed": 0, "cancelled": 0},
          "/metrics counts the store's jobs by state: %s" % by_state)
    st, _ = purge(d, jid)
    check(st == 200 and d.metric('kiln_training_jobs{state="succeeded"}') == 2, "a purged job leaves the count")
    d.stop()


def test_retention_count():
    d = start("retention-count")
    ids = [run_to_end(d, "keep_count") for _ in range(3)]
    d.stop()
    d = start("retention-count", fresh=False, extra=["--jobs-retention-count", "1"])
    for jid in ids[:2]:
        check(d.req("GET", "/v1/jobs/%d" % jid)[0] == 404, "at start, job %d beyond the newest 1 is purged" % jid)
        check(not os.path.exists(ckpt_dir(d, jid)), "with its checkpoints")
    check(d.req("GET", "/v1/jobs/%d" % ids[2])[0] == 200 and os.path.isdir(ckpt_dir(d, ids[2])),
          "the newest stays")
    log = open(d.log).read()
    check(log.count("purged by retention (jobs.retention_count 1") == 2, "one log line per purge")
    check(os.path.isdir(os.path.join(d.data, "models", "keep_count", "1")), "their model versions stay")
    # after a job ends, the one before it goes
    new = run_to_end(d, "keep_count")
    deadline = time.time() + 30
    while time.time() < deadline and d.req("GET", "/v1/jobs/%d" % ids[2])[0] != 404:
        time.sleep(0.05)
    st, lst = d.req("GET", "/v1/jobs")
    check([j["id"] for j in lst["jobs"]] == [new], "after the next job ends only it is left: %s"
          % [j["id"] for j in lst["jobs"]])
    # a job cancelled while queued ends too: behind a running job, cancelled, it is the newest
    run = running_with_checkpoint(d, "keep_running")
    q = submit(d, long_spec("keep_queued"))
    cancel(d, q)
    deadline = time.time() + 30
    while time.time() < deadline and d.req("GET", "/v1/jobs/%d" % new)[0] != 404:
        time.sleep(0.05)
    check(d.req("GET", "/v1/jobs/%d" % new)[0] == 404, "a job cancelled while queued applies retention too")
    check(d.req("GET", "/v1/jobs/%d" % run)[0] == 200, "the running job is never purged")
    cancel(d, run)
    d.stop()


def test_retention_days():
    d = start("retention-days")
    old = run_to_end(d, "keep_days", register=False)
    recent = run_to_end(d, "keep_days", register=False)
    d.stop()
    db = sqlite3.connect(os.path.join(d.data, "kiln.db"))
    ten_days_ago = int(time.time() * 1000) - 10 * DAY_MS
    db.execute("UPDATE jobs SET finished_ms = ? WHERE id = ?", (ten_days_ago, old))
    db.commit()
    db.close()
    d = start("retention-days", fresh=False)
    check(d.req("GET", "/v1/jobs/%d" % old)[0] == 200, "without jobs.retention_days nothing is purged")
    d.stop()
    d = start("retention-days", fresh=False, extra=["--jobs-retention-days", "7"])
    check(d.req("GET", "/v1/jobs/%d" % old)[0] == 404 and not os.path.exists(ckpt_dir(d, old)),
          "at start, the job that ended 10 days ago is purged with jobs.retention_days 7")
    check(d.req("GET", "/v1/jobs/%d" % recent)[0] == 200 and os.path.isdir(ckpt_dir(d, recent)),
          "the one that ended today stays")
    check(("job %d (succeeded) purged by retention (jobs.retention_days 7" % old) in open(d.log).read(),
          "the purge is logged")
    d.stop()


def test_cli():
    d = start("cli")
    env = dict(H.ENV, KILN_URL=d.url)
    done = run_to_end(d, "cli_rm")
    files, size = folder_size(ckpt_dir(d, done))
    p = subprocess.run([CLI, "jobs", "rm", str(done)], capture_output=True, text=True, env=env, timeout=60)
    check(p.returncode == 0 and ("job %d removed: %d files, %d bytes freed" % (done, files, size)) in p.stdout
          and "model cli_rm version 1, which it registered, stays in the repository" in p.stdout,
          "kiln jobs rm ID removes an ended job and says what went: %d %r %r" % (p.returncode, p.stdout, p.stderr))
    check(d.req("GET", "/v1/jobs/%d" % done)[0] == 404, "the job is gone")
    run = running_with_checkpoint(d, "cli_running")
    p = subprocess.run([CLI, "jobs", "rm", str(run)], capture_output=True, text=True, env=env, timeout=60)
    check(p.returncode == 1 and "HTTP 409" in p.stderr and "cancel it first" in p.stderr,
          "kiln jobs rm of a running job prints the server's error and exits 1: %d %r" % (p.returncode, p.stderr))
    # More jobs than one page of GET /v1/jobs (1000): `kiln jobs` follows next_after to the newest
    # (it showed the oldest 1000 only). They queue behind the running one and are cancelled queued.
    started = time.time()
    queued = [submit(d, long_spec("cli_page")) for _ in range(1001)]
    for jid in queued:
        st, c = d.req("DELETE", "/v1/jobs/%d" % jid)
        check(st in (200, 202) or jid is None, "cancel queued job %s: %s %s" % (jid, st, c))
    cancel(d, run)
    p = subprocess.run([CLI, "jobs"], capture_output=True, text=True, env=env, timeout=60)
    ids = [int(line.split()[0]) for line in p.stdout.splitlines()[1:]]
    check(p.returncode == 0 and ids == [run] + queued and p.stdout.splitlines()[0].split() ==
          ["ID", "STATE", "PROGRESS", "MODEL"], "kiln jobs lists all %d jobs, the newest last, over two pages "
          "(%.1f s to make them): %d rows, last %s" % (len(queued) + 1, time.time() - started, len(ids), ids[-1:]))
    header, first = p.stdout.splitlines()[0], p.stdout.splitlines()[1]
    check(header.index("MODEL") == first.index("-", first.index("%")), "the MODEL column lines up: %r / %r"
          % (header, first))
    p = subprocess.run([CLI, "jobs", "--state", "running"], capture_output=True, text=True, env=env, timeout=60)
    check(p.returncode == 0 and p.stdout.splitlines()[1:] == ["(no jobs)"], "a state filter with no match: %r"
          % p.stdout)
    p = subprocess.run([CLI, "cancel", str(run)], capture_output=True, text=True, env=env, timeout=60)
    check(p.returncode == 1 and "HTTP 409" in p.stderr and "kiln jobs rm %d removes it" % run in p.stderr,
          "kiln cancel of an ended job names the CLI's command that removes it: %d %r" % (p.returncode, p.stderr))
    p = subprocess.run([CLI, "jobs", "rm", str(done)], capture_output=True, text=True, env=env, timeout=60)
    check(p.returncode == 1 and "HTTP 404" in p.stderr, "an unknown job exits 1: %d %r" % (p.returncode, p.stderr))
    for args in (["jobs", "rm"], ["jobs", "rm", "0"], ["jobs", "rm", "x"], ["jobs", "rm", "1", "2"]):
        p = subprocess.run([CLI] + args, capture_output=True, text=True, env=env, timeout=60)
        check(p.returncode == 2 and "usage: kiln jobs rm JOB_ID" in p.stderr,
              "kiln %s is a usage error (exit 2): %d %r" % (" ".join(args), p.returncode, p.stderr))
    p = subprocess.run([CLI, "--help"], capture_output=True, text=True, env=env, timeout=60)
    check(p.returncode == 0 and "jobs rm ID" in p.stdout, "kiln --help lists jobs rm")
    p = subprocess.run([CLI, "jobs", "rm", "3"], capture_output=True, text=True,
                       env=dict(H.ENV, KILN_URL="http://127.0.0.1:1"), timeout=60)
    check(p.returncode == 2, "kilnd unreachable exits 2: %d" % p.returncode)
    d.stop()


def test_bad_retention_values():
    for args, env, want in (
            (["--jobs-retention-days", "-1"], {}, "jobs.retention_days: -1 is out of range 0..36500"),
            (["--jobs-retention-days", "36501"], {}, "jobs.retention_days: 36501 is out of range"),
            ([], {"KILN_JOBS_RETENTION_COUNT": "2000000"}, "jobs.retention_count: 2000000 is out of range 0..1000000"),
            ([], {"KILN_JOBS_RETENTION_COUNT": "ten"}, "jobs.retention_count: 'ten' is not an integer")):
        p = subprocess.run([KILND, "--check-config", "--data-dir", os.path.join(H.TMP, "check")] + args,
                           capture_output=True, text=True, env=dict(H.ENV, **env), timeout=60)
        check(p.returncode == 1 and want in p.stderr, "%s %s refused: %d %r" % (args, env, p.returncode, p.stderr))


try:
    test_purge("purge")
    test_unsaved()
    test_orphans()
    test_store_emptied()
    test_version_not_reused()
    test_retention_count()
    test_retention_days()
    test_cli()
    test_bad_retention_values()
finally:
    for d in DAEMONS:
        d.stop()
    H.cleanup()
H.finish()
