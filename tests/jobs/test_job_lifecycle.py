#!/usr/bin/env python3
"""How a job ends, whatever happens around it: an accepted cancel is kept through SIGTERM and
SIGKILL (the job ends cancelled on the next start, never resumed), a cancel that arrives after the
last step still takes effect (or is refused with a 409, never accepted and then ignored), a final
state the job store refuses to write is kept, reported and written once the store takes writes
again, POST .../resume makes one continuation at a time, and the metric history of a job resumed
after a crash holds each epoch and step once.

The store that refuses writes is made with a trigger the test adds to kiln.db, which fails every
move of a job to a final state with SQLite's "database or disk is full" until it is dropped: the
same failed write a full disk gives, at the same place in kilnd.

Usage: test_job_lifecycle.py KILND
"""
import http.client
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND = sys.argv[1]
check = H.check
FINAL = ["succeeded", "failed", "cancelled"]
TRAIN = os.path.join(H.DATA, "train.csv")
HUGE = os.path.join(H.DATA, "huge.csv")
DAEMONS = []


def start(name, fresh=True):
    """A kilnd on data dir name, killed at the end should a failed test leave it running."""
    DAEMONS.append(H.Daemon(KILND, name, fresh=fresh))
    return DAEMONS[-1]


def write_huge():
    """A million rows (about 30 MB): loading it takes a noticeable moment, and an epoch over it
    a second or so. Rows repeat in blocks, which the tests do not mind and which writes fast."""
    block = os.path.join(H.DATA, "block.csv")
    H.write_csv(block, 2000, 7)
    lines = open(block).read().split("\n", 1)
    with open(HUGE, "w") as f:
        f.write(lines[0] + "\n")
        f.write(lines[1] * 500)


def huge_spec(name, epochs, **extra):
    return H.spec(name, epochs=epochs, data={"type": "csv", "train": HUGE, "label_column": "label",
                                             "valid_split": 0.2}, **extra)


def wait_state(d, jid, states, timeout=60):
    """The job once its state is one of states, or None (a failed check) when it never is."""
    try:
        return d.wait_state(jid, states, timeout=timeout)
    except RuntimeError as e:
        check(False, str(e))
        return None


def read_sse(d, jid, on_event=None, last_id=None, timeout=120):
    """The job's event stream (after last_id) as (id, type, data), read until kilnd ends it or for
    at most timeout seconds; on_event sees each event as it comes."""
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=timeout)
    c.request("GET", "/v1/jobs/%d/events" % jid, headers={"Last-Event-ID": str(last_id)} if last_id else {})
    r = c.getresponse()
    events, cur, deadline = [], {}, time.time() + timeout
    for raw in r:
        if time.time() > deadline:
            check(False, "the event stream of job %d ends within %d s" % (jid, timeout))
            break
        line = raw.decode().rstrip("\r\n")
        if not line:
            if "data" in cur:
                events.append((int(cur.get("id", 0)), cur.get("event"), json.loads(cur["data"])))
                if on_event:
                    on_event(events[-1])
            cur = {}
            continue
        if not line.startswith(":"):
            k, _, v = line.partition(": ")
            cur[k] = v
    c.close()
    return events


def versions(d, name):
    folder = os.path.join(d.data, "models", name)
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_cancel_outlives_stop(sig):
    """DELETE answered 202, then kilnd stops before the run has seen the flag (it is still loading
    its data): the job ends cancelled, on this stop (SIGTERM) or on the next start (SIGKILL)."""
    what = signal.Signals(sig).name
    d = start("cancel-" + what)
    st, j = d.req("POST", "/v1/jobs", huge_spec("never_" + what.lower(), 2))
    jid = j["id"]
    wait_state(d, jid, ["running"])
    st, c = d.req("DELETE", "/v1/jobs/%d" % jid)
    check(st == 202 and c.get("state") == "cancelling", "%s: DELETE of the running job -> 202: %s %s" % (what, st, c))
    d.stop(sig)
    d = start("cancel-" + what, fresh=False)
    job = wait_state(d, jid, FINAL)
    if job:
        check(job["state"] == "cancelled" and job["model"] is None,
              "%s: the cancelled job is still cancelled after the restart, not resumed: %s %s"
              % (what, job["state"], job["model"]))
        check(not any(m.startswith("training ") for m in job["logs"]),
              "%s: it never trained: %s" % (what, job["logs"]))
        states = [e[2]["state"] for e in read_sse(d, jid) if e[1] == "state"]
        check(states[-1] == "cancelled" and states.count("cancelled") == 1,
              "%s: its events end with one cancelled state: %s" % (what, states))
        st, c = d.req("DELETE", "/v1/jobs/%d" % jid)
        check(st == 409, "%s: a second DELETE -> 409: %s %s" % (what, st, c))
    check(versions(d, "never_" + what.lower()) == [], "%s: no model version was added" % what)
    d.stop()


def test_cancel_after_last_step():
    """DELETE the moment the last step's event arrives, while the job validates (a large
    validation set), checkpoints and registers: 202 and the job ends cancelled with no version
    added, or 409 saying why and the job succeeds; never 202 and then succeeded."""
    d = start("late-cancel")
    spec = H.spec("late", epochs=1, data={"type": "csv", "train": TRAIN, "valid": HUGE, "label_column": "label"})
    st, j = d.req("POST", "/v1/jobs", spec)
    jid = j["id"]
    answers = []

    def on_event(ev):
        e = ev[2]
        if ev[1] == "step" and not answers and e["epoch"] == e["epochs"] and e["batch"] + 1 == e["batches"]:
            answers.append(d.req("DELETE", "/v1/jobs/%d" % jid))

    read_sse(d, jid, on_event)
    job = wait_state(d, jid, FINAL)
    check(len(answers) == 1, "the last step's event came and the DELETE was sent")
    if not answers or not job:
        d.stop()
        return
    st, body = answers[0]
    print("   (the DELETE after the last step was answered %d)" % st)
    if st == 202:
        check(job["state"] == "cancelled" and job["model"] is None and versions(d, "late") == [],
              "202 after the last step: the job ends cancelled and registers nothing: %s %s %s"
              % (job["state"], job["model"], versions(d, "late")))
        check(d.req("GET", "/v2/models/late/ready")[0] != 200, "and nothing is served under its name")
    else:
        # (a DELETE held up past the job's end on a busy machine finds it succeeded: also a 409)
        err = body.get("error", "") if isinstance(body, dict) else ""
        check(st == 409 and ("finished training" in err or "already succeeded" in err),
              "otherwise 409 saying training has finished: %s %s" % (st, body))
        check(job["state"] == "succeeded", "and the job succeeds: %s" % job["state"])
    d.stop()


def test_unsaved_final_state():
    """The store fails every write of a final state (as a full disk does): the job reads succeeded
    with state_saved false (not running forever), DELETE and resume get 409 (never cancelled as if
    queued), the next job still runs, and once the store takes writes the states are written."""
    d = start("unsaved")
    db = sqlite3.connect(os.path.join(d.data, "kiln.db"), timeout=30)
    db.execute("CREATE TRIGGER test_store_full BEFORE UPDATE OF state ON jobs "
               "WHEN NEW.state IN ('succeeded', 'failed', 'cancelled') "
               "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
    db.commit()
    plain = H.spec("unsaved_plain", epochs=1)
    del plain["register_as"]
    st, a = d.req("POST", "/v1/jobs", plain)
    st, b = d.req("POST", "/v1/jobs", H.spec("unsaved_model", epochs=1))
    for jid, what in ((a["id"], "a job"), (b["id"], "a job that registers a model")):
        job = wait_state(d, jid, FINAL, timeout=30)
        check(job is not None and job["state"] == "succeeded" and job.get("state_saved") is False,
              "%s whose final state the store refused reads succeeded, state_saved false: %s"
              % (what, job and (job["state"], job.get("state_saved"))))
        stored = db.execute("SELECT state FROM jobs WHERE id = ?", (jid,)).fetchone()[0]
        check(stored == "running", "the store still says %s" % stored)
        st, c = d.req("DELETE", "/v1/jobs/%d" % jid)
        check(st == 409 and "succeeded" in c.get("error", ""), "DELETE -> 409, not cancelled: %s %s" % (st, c))
        st, c = d.req("POST", "/v1/jobs/%d/resume" % jid)
        check(st == 409, "resume -> 409: %s %s" % (st, c))
    st, lst = d.req("GET", "/v1/jobs")
    check(st == 200 and [(x["state"], x.get("state_saved")) for x in lst["jobs"]] == [("succeeded", False)] * 2,
          "the list gives both as succeeded, not saved: %s" % lst)
    db.execute("DROP TRIGGER test_store_full")
    db.commit()
    deadline = time.time() + 30
    while time.time() < deadline:
        rows = db.execute("SELECT state FROM jobs ORDER BY id").fetchall()
        if rows == [("succeeded",), ("succeeded",)]:
            break
        time.sleep(0.1)
    check(rows == [("succeeded",), ("succeeded",)], "once the store takes writes, both are stored: %s" % rows)
    st, job = d.req("GET", "/v1/jobs/%d" % b["id"])
    check("state_saved" not in job and job["model"] == {"name": "unsaved_model", "version": 1},
          "the job that registered a model has it recorded: %s" % job.get("model"))
    states = [e[2]["state"] for e in read_sse(d, a["id"], timeout=20) if e[1] == "state"]
    check(states == ["queued", "running", "succeeded"], "its event stream ends with the final state: %s" % states)
    db.close()
    d.stop()
    check(d.proc.returncode == 0, "kilnd exits 0 (%s)" % d.proc.returncode)


def test_resume_once():
    """POST .../resume twice: the second is a 409 naming the continuation while it is queued or
    running; once that one has ended, a new continuation may be made."""
    d = start("resume-once")
    spec = huge_spec("src", 3, checkpoint={"every_epochs": 0, "every_steps": 500, "keep_last": 2})
    st, a = d.req("POST", "/v1/jobs", spec)
    deadline = time.time() + 60
    job = {}
    while time.time() < deadline and not job.get("checkpoints"):
        st, job = d.req("GET", "/v1/jobs/%d" % a["id"])
        time.sleep(0.02)
    d.req("DELETE", "/v1/jobs/%d" % a["id"])
    wait_state(d, a["id"], ["cancelled"])
    st, blocker = d.req("POST", "/v1/jobs", huge_spec("blocker", 50))
    wait_state(d, blocker["id"], ["running"])
    st, c = d.req("POST", "/v1/jobs/%d/resume" % a["id"])
    check(st == 201 and c.get("resumes") == a["id"], "the first resume -> 201: %s %s" % (st, c))
    st, e = d.req("POST", "/v1/jobs/%d/resume" % a["id"])
    check(st == 409 and ("job %d" % c.get("id", -1)) in e.get("error", ""),
          "the second resume -> 409 naming job %s: %s %s" % (c.get("id"), st, e))
    d.req("DELETE", "/v1/jobs/%d" % c["id"])
    st, e = d.req("POST", "/v1/jobs/%d/resume" % a["id"])
    check(st == 201, "once the continuation is cancelled, a new one -> 201: %s %s" % (st, e))
    st, lst = d.req("GET", "/v1/jobs?state=queued")
    check(st == 200 and [x["id"] for x in lst["jobs"]] == [e.get("id")], "one continuation queued: %s" % lst)
    for jid in (e.get("id"), blocker["id"]):
        d.req("DELETE", "/v1/jobs/%d" % jid)
    wait_state(d, blocker["id"], FINAL)
    d.stop()


def test_history_after_crash():
    """6 epochs, a checkpoint every 2, SIGKILL after epoch 3: the job resumes from epoch 2 and
    trains epoch 3 again. Its history then holds epochs 1..6 once each and step rows in order."""
    d = start("history")
    spec = huge_spec("hist", 6, checkpoint={"every_epochs": 2, "keep_last": 2})
    st, j = d.req("POST", "/v1/jobs", spec)
    jid = j["id"]
    # an epoch is 50000 rows: under the sanitizers on a loaded 2-core machine the first three
    # took more than 120 s, so the wait is long (the kill still lands within an epoch of 3)
    deadline, epochs, seen = time.time() + 300, [], 0
    while time.time() < deadline and 3 not in epochs:
        st, m = d.req("GET", "/v1/jobs/%d/metrics" % jid)
        epochs, seen = [r["epoch"] for r in m.get("metrics", [])], m.get("next_after", 0)
        time.sleep(0.005)
    d.proc.kill()
    d.proc.wait()
    check(epochs and max(epochs) in (3, 4, 5), "killed after epoch 3 and before the end: %s" % epochs)
    d = start("history", fresh=False)
    job = wait_state(d, jid, FINAL, timeout=180)
    check(job is not None and job["state"] == "succeeded", "the job resumes and succeeds")
    st, m = d.req("GET", "/v1/jobs/%d/metrics" % jid)
    check([r["epoch"] for r in m["metrics"]] == [1, 2, 3, 4, 5, 6],
          "one metric row per epoch: %s" % [r["epoch"] for r in m["metrics"]])
    st, s = d.req("GET", "/v1/jobs/%d/metrics?kind=step" % jid)
    steps = [r["step"] for r in s["metrics"]]
    check(steps == sorted(set(steps)), "step rows in order, none twice: %s" % steps)
    events = read_sse(d, jid)
    ids = [e[0] for e in events]
    check(ids == sorted(set(ids)), "event ids keep increasing")
    # A client that had read up to `seen` before the kill and reconnects gets every epoch from
    # the one trained again on: ids are never given twice.
    later = [e[2]["epoch"] for e in read_sse(d, jid, last_id=seen) if e[1] == "epoch"]
    check(later and later == list(range(later[0], 7)) and later[0] <= 4,
          "reconnecting after event %d gives the epochs from the resumed one on: %s" % (seen, later))
    cks = [e[2]["step"] for e in events if e[1] == "checkpoint"]
    check(cks == sorted(set(cks)) and len(cks) == 3, "one checkpoint event each at epochs 2, 4, 6: %s" % cks)
    d.stop()


def test_log_rotation_during_stop():
    """SIGHUP (a log rotation) while a SIGTERM'd kilnd waits for its trainer to reach a step
    boundary: the stop goes on and ends 0. Closing the signal handles had given SIGHUP back its
    default action, which killed kilnd with 129 and left the job's outcome unrecorded."""
    d = start("hup-on-stop")
    st, j = d.req("POST", "/v1/jobs", huge_spec("hup_on_stop", 2))
    wait_state(d, j["id"], ["running"])
    d.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    d.proc.send_signal(signal.SIGHUP)
    try:
        d.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        d.proc.kill()
        d.proc.wait()
    check(d.proc.returncode == 0, "kilnd exits 0 after SIGTERM then SIGHUP: %s; log %s" % (d.proc.returncode, d.log))


def main():
    write_huge()
    try:
        test_cancel_outlives_stop(signal.SIGTERM)
        test_cancel_outlives_stop(signal.SIGKILL)
        test_log_rotation_during_stop()
        test_cancel_after_last_step()
        test_unsaved_final_state()
        test_resume_once()
        test_history_after_crash()
    finally:
        os.unlink(HUGE)
        for d in DAEMONS:
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
    H.finish()
    H.cleanup()


if __name__ == "__main__":
    main()
