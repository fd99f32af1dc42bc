#!/usr/bin/env python3
"""The job store past kilnd's file size limit (RLIMIT_FSIZE, set with prlimit on the running kilnd:
no privilege and no small file system needed). A write past it fails with EFBIG, which SQLite
reports as an I/O error rather than as a full disk; kilnd still answers it as the full disk it is:
submitting and purging are refused with 507 and an error that says the disk holding the job store
is full (before: 500, "disk I/O error"), reads keep working, and once the limit is lifted the same
requests work without a restart.

First, a store another process holds locked (a backup tool mid-write): a submission waits out
the store's busy timeout and is a 500 naming the lock, and the refusal is in kilnd's log too. A
store whose read fails (its event table renamed away underneath kilnd) makes a job's event stream
a 500 that says so, not an empty 200 stream.

Usage: test_store_fsize.py KILND   (skips, exit 77, where prlimit(2) on a child is refused)
"""
import os
import resource
import sqlite3
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND = sys.argv[1]
FINAL = ["succeeded", "failed", "cancelled"]
FULL_TEXT = "no space left on the disk holding the job store"
UNLIMITED = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)


def main():
    d = H.Daemon(KILND, "store-fsize")
    try:
        st, j = d.req("POST", "/v1/jobs", H.spec("before", epochs=1))
        H.check(st == 201, "a job is accepted while files may grow: %d %s" % (st, j))
        first = j["id"]
        H.check(d.wait_state(first, FINAL)["state"] == "succeeded", "it succeeds")

        holder = sqlite3.connect(os.path.join(d.data, "kiln.db"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        st, r = d.req("POST", "/v1/jobs", H.spec("while-locked", epochs=1))
        holder.execute("ROLLBACK")
        holder.close()
        H.check(st == 500 and "database is locked" in r.get("error", ""),
                "a submission while another process holds the store's write lock: 500 naming it: %d %s" % (st, r))
        log = open(d.log).read()
        H.check("error /v1/jobs: 500 job store:" in log.replace("  ", " ") and "database is locked" in log,
                "and kilnd logs the refusal")

        events = "/v1/jobs/%d/events" % first
        st, whole = d.req("GET", events)
        H.check(st == 200 and b"event: state" in whole, "a job's events are read: %d" % st)
        holder = sqlite3.connect(os.path.join(d.data, "kiln.db"), isolation_level=None)
        holder.execute("ALTER TABLE job_events RENAME TO job_events_away")
        st, r = d.req("GET", events)
        holder.execute("ALTER TABLE job_events_away RENAME TO job_events")
        holder.close()
        H.check(st == 500 and "job store:" in str(r) and "job_events" in str(r),
                "when the store cannot be read, the event stream is a 500 saying so: %d %r" % (st, r))
        H.check(("%s: 500 job store:" % events) in open(d.log).read(), "and kilnd logs it")
        st, again = d.req("GET", events)
        H.check(st == 200 and again == whole, "once it can be read, the same events come back: %d" % st)
        try:
            resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
        except (OSError, AttributeError) as e:
            print("SKIP: cannot set kilnd's file size limit:", e)
            sys.exit(77)
        st, r = d.req("POST", "/v1/jobs", H.spec("while-limited", epochs=1))
        H.check(st == 507 and FULL_TEXT in r.get("error", ""),
                "a submission past the file size limit is a 507 naming the disk: %d %s" % (st, r))
        st, r = d.req("DELETE", "/v1/jobs/%d?purge=true" % first)
        H.check(st == 507 and FULL_TEXT in r.get("error", "") and "nothing was removed" in r["error"],
                "so is a purge, which removes nothing: %d %s" % (st, r))
        st, r = d.req("GET", "/v1/jobs")
        H.check(st == 200 and [x["id"] for x in r["jobs"]] == [first], "reads keep working: %d %s" % (st, r))
        H.check(d.proc.poll() is None, "kilnd keeps running")

        resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, UNLIMITED)
        st, j = d.req("POST", "/v1/jobs", H.spec("after", epochs=1))
        H.check(st == 201, "once the limit is lifted a submission is accepted without a restart: %d %s" % (st, j))
        if st == 201:
            H.check(d.wait_state(j["id"], FINAL)["state"] == "succeeded", "and the job succeeds")
        st, r = d.req("DELETE", "/v1/jobs/%d?purge=true" % first)
        H.check(st == 200, "the purge works again: %d %s" % (st, r))
    finally:
        rc = d.stop()
        H.check(rc == 0, "kilnd stops cleanly (exit status %s)" % rc)
        H.cleanup()
    H.finish()


main()
