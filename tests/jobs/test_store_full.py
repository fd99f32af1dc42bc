#!/usr/bin/env python3
"""The job store on a full disk: kilnd's data folder on a small tmpfs, filled by a file. While it is
full, submitting, resuming and purging jobs are refused with 507 and an error that says the disk
holding the job store is full, reads keep working, kiln.db passes integrity_check and kilnd keeps
running; once the filler is deleted the same requests work without a restart, and after a restart
every job that had been acknowledged is still there.

Usage: test_store_full.py KILND   (skips, exit 77, when it cannot mount a tmpfs: it needs root)
"""
import os
import sqlite3
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND = sys.argv[1]
FINAL = ["succeeded", "failed", "cancelled"]
FULL_TEXT = "no space left on the disk holding the job store"


def fill(folder):
    """Writes a file until the file system refuses more; its path."""
    path = os.path.join(folder, "filler")
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return path


def integrity(data):
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(data, "kiln.db"), uri=True)
    try:
        return db.execute("PRAGMA integrity_check").fetchall()
    finally:
        db.close()


def main():
    mnt = os.path.join(H.TMP, "small")
    os.makedirs(mnt)
    if os.geteuid() != 0 or subprocess.call(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt]) != 0:
        H.cleanup()
        print("SKIP: mounting a small tmpfs needs root")
        sys.exit(77)
    d = None
    try:
        d = H.Daemon(KILND, "small/data")
        st, j = d.req("POST", "/v1/jobs", H.spec("before", epochs=1))
        H.check(st == 201, "a job is accepted while there is space: %d %s" % (st, j))
        first = j["id"]
        H.check(d.wait_state(first, FINAL)["state"] == "succeeded", "it succeeds")
        st, j = d.req("POST", "/v1/jobs", H.spec("cancelled", epochs=500))
        second = j["id"]
        d.wait_state(second, ["running"])
        # cancelled once it has a checkpoint, so that a resume of it is possible (and refused
        # only for the full disk below)
        deadline = time.time() + 60
        while time.time() < deadline and not (d.req("GET", "/v1/jobs/%d" % second)[1].get("checkpoints") or []):
            time.sleep(0.02)
        d.req("DELETE", "/v1/jobs/%d" % second)
        d.wait_state(second, FINAL)

        filler = fill(mnt)
        st, r = d.req("POST", "/v1/jobs", H.spec("while-full", epochs=1))
        H.check(st == 507 and FULL_TEXT in r.get("error", ""),
                "a submission while the disk is full is a 507 naming the disk: %d %s" % (st, r))
        st, r = d.req("POST", "/v1/jobs/%d/resume" % second)
        H.check(st == 507 and FULL_TEXT in r.get("error", ""), "so is a resume: %d %s" % (st, r))
        st, r = d.req("DELETE", "/v1/jobs/%d?purge=true" % first)
        H.check(st == 507 and FULL_TEXT in r.get("error", "") and "nothing was removed" in r["error"],
                "so is a purge, which removes nothing: %d %s" % (st, r))
        st, r = d.req("GET", "/v1/jobs")
        H.check(st == 200 and [x["id"] for x in r["jobs"]] == [first, second], "reads keep working: %d" % st)
        H.check(d.proc.poll() is None, "kilnd keeps running")
        H.check(integrity(d.data) == [("ok",)], "kiln.db passes integrity_check while full")

        os.unlink(filler)
        st, j = d.req("POST", "/v1/jobs", H.spec("after", epochs=1))
        H.check(st == 201, "once space is freed a submission is accepted without a restart: %d %s" % (st, j))
        third = j.get("id")
        if third:
            H.check(d.wait_state(third, FINAL)["state"] == "succeeded", "and the job succeeds")
        st, r = d.req("DELETE", "/v1/jobs/%d?purge=true" % first)
        H.check(st == 200, "the purge works again: %d %s" % (st, r))
        H.check(d.stop() == 0, "kilnd stops cleanly")
        H.check(integrity(d.data) == [("ok",)], "kiln.db passes integrity_check after the stop")

        d = H.Daemon(KILND, "small/data", fresh=False)
        st, r = d.req("GET", "/v1/jobs")
        H.check(st == 200 and [(x["id"], x["state"]) for x in r["jobs"]] == [(second, "cancelled"),
                                                                              (third, "succeeded")],
                "after a restart every acknowledged job is there, the purged one gone: %s" % r)
        H.check(d.stop() == 0, "it stops cleanly")
        d = None

        # a start on the full disk: serving goes on, jobs are a 507 until there is room, and then
        # come without a restart (the log is kept off the full disk to read the port from it)
        filler = fill(mnt)
        log = os.path.join(H.TMP, "start-full.log")
        proc = subprocess.Popen([KILND, "--port", "0", "--data-dir", os.path.join(mnt, "data"),
                                 "--data-roots", H.DATA], stdout=subprocess.DEVNULL, stderr=open(log, "wb"),
                                env=H.ENV)
        try:
            port = None
            deadline = time.time() + 30
            while port is None and proc.poll() is None and time.time() < deadline:
                for line in open(log).read().splitlines():
                    if " listening on " in line and " port=" in line:
                        port = int(line.split(" port=")[1].split()[0])
                time.sleep(0.05)
            H.check(port is not None, "kilnd starts on the full disk: %s" % open(log).read()[-600:])
            if port is not None:
                d = H.Attached(proc, port, log)
                st, _ = d.req("GET", "/v2/health/ready")
                H.check(st == 200, "and is ready (%d)" % st)
                st, r = d.req("GET", "/v1/jobs")
                H.check(st == 507 and "could not open its job store" in r.get("error", "")
                        and FULL_TEXT in r["error"], "the job routes say why they are unavailable: %d %s" % (st, r))
                text = open(log).read()
                H.check("kilnd serves its models without it" in text and "kilnd starts without it" in text,
                        "the log says what the full disk stopped, and that the start goes on")
                os.unlink(filler)
                deadline = time.time() + 30
                while time.time() < deadline and d.req("GET", "/v1/jobs")[0] != 200:
                    time.sleep(0.2)
                st, r = d.req("GET", "/v1/jobs")
                H.check(st == 200 and [x["id"] for x in r["jobs"]] == [second, third],
                        "once space is freed, the job store opens with its jobs, without a restart: %d %s" % (st, r))
                st, j = d.req("POST", "/v1/jobs", H.spec("after-full-start", epochs=1))
                H.check(st == 201 and d.wait_state(j["id"], FINAL)["state"] == "succeeded",
                        "and a job submitted then runs: %d %s" % (st, j))
                d = None
        finally:
            proc.terminate()
            H.check(proc.wait(timeout=60) == 0, "that kilnd stops cleanly")
    finally:
        if d:
            d.stop()
        subprocess.call(["umount", mnt])
        H.cleanup()
    H.finish()


main()
