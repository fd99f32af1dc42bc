#!/usr/bin/env python3
"""The job store past kilnd's file size limit (RLIMIT_FSIZE, set with prlimit on the running kilnd:
no privilege and no small file system needed). A write past it fails with EFBIG, which SQLite
reports as an I/O error rather than as a full disk; kilnd still answers it as the full disk it is:
submitting and purging are refused with 507 and an error that says the disk holding the job store
is full (before: 500, "disk I/O error"), reads keep working, and once the limit is lifted the same
requests work without a restart.

Usage: test_store_fsize.py KILND   (skips, exit 77, where prlimit(2) on a child is refused)
"""
import os
import resource
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
