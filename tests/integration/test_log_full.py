#!/usr/bin/env python3
"""kilnd's log file when it cannot grow: the disk holding it full, here a file size limit
(RLIMIT_FSIZE, set with prlimit on the running kilnd: no privilege and no small file system
needed; a write past it fails as one on a full disk does, with EFBIG for ENOSPC). kilnd must
keep serving (the limit must not kill it with SIGXFSZ), and once the log can be written again,
its next line is preceded by one saying how many lines were lost and why, with the line a short
write cut ended there rather than run together with the next.

Usage: test_log_full.py KILND   (skips, exit 77, where prlimit(2) on a child is refused)
"""
import os
import re
import resource
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND = sys.argv[1]
REQUESTS_WHILE_FULL = 5
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def main():
    log_file = os.path.join(H.TMP, "kilnd-file.log")
    d = H.Daemon(KILND, "log-full", extra=["--log-file", log_file, "--log-access", "on"], data_roots=False)
    pid = d.proc.pid
    try:
        st, _ = d.req("GET", "/v2/health/live")
        H.check(st == 200, "kilnd answers")
        size = os.path.getsize(log_file)
        try:
            # room for part of the next access line only: that write comes up short, the rest fail
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (size + 40, resource.RLIM_INFINITY))
        except (OSError, AttributeError) as e:
            print("SKIP: cannot set kilnd's file size limit:", e)
            sys.exit(77)
        statuses = [d.req("GET", "/v2/health/live")[0] for _ in range(REQUESTS_WHILE_FULL)]
        H.check(statuses == [200] * REQUESTS_WHILE_FULL and d.proc.poll() is None,
                "kilnd keeps answering while its log cannot grow: %s, exit status %s" % (statuses, d.proc.poll()))
        H.check(os.path.getsize(log_file) == size + 40, "the log stopped at the limit")
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        st, _ = d.req("GET", "/v2/health/live")
        H.check(st == 200, "kilnd answers once the log can grow again")
        with open(log_file, errors="replace") as f:
            lines = f.read().splitlines()
        lost = [line for line in lines if "log line(s) lost" in line]
        H.check(len(lost) == 1, "one line tells of the lost lines: %s" % lost)
        H.check(lost and "%d log line(s) lost: the log could not be written (File too large)"
                % REQUESTS_WHILE_FULL in lost[0],
                "it counts the %d access lines lost, and says why: %s" % (REQUESTS_WHILE_FULL, lost))
        merged = [line for line in lines if len(STAMP.findall(line)) != 1]
        H.check(not merged, "every line holds one timestamp, none run into the next: %s" % merged)
        H.check(lines and "access GET /v2/health/live 200" in lines[-1], "the line after the note is written whole")
    finally:
        rc = d.stop(timeout=10)
        H.check(rc == 0, "kilnd stops cleanly (exit status %s)" % rc)
        H.cleanup()
    H.finish()


main()
