#!/usr/bin/env python3
"""A job on a device kilnd knows is lost: kilnd B drives remote://A/cpu, and A stops, so B's
readiness says the device's connection is lost.

- Submitted after the loss: 503 (the device is the server's, as inference answers) with a JSON
  error naming the device and saying it is lost; nothing is queued. (Before: 201, and the job
  failed later with "model: ... rand_uniform: cannot allocate ...: connection lost".)
- Queued while the device worked, behind a long job on cpu, and lost before it started: it fails
  with a reason that names the lost device.
- A job on cpu is still accepted.

Usage: test_job_lost_device.py KILND
"""
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import kilnd_harness as H  # noqa: E402
from kilnd_harness import check  # noqa: E402

KILND = sys.argv[1]


def wait(cond, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def main():
    # a data set large enough that a job on it runs until cancelled
    big = os.path.join(H.DATA, "big.csv")
    rnd = random.Random(2)
    with open(big, "w") as f:
        f.write("a,b,c,d,label\n")
        for _ in range(20000):
            c = rnd.randrange(3)
            f.write(",".join("%.3f" % rnd.gauss(2.0 if k == c else 0.0, 0.5) for k in range(4)) + ",%d\n" % c)
    a = H.Daemon(KILND, "a")
    remote = "remote://127.0.0.1:%d/cpu" % a.port
    b = H.Daemon(KILND, "b", extra=["--devices", "cpu," + remote])
    try:
        check(wait(lambda: b.req("GET", "/v2/health/ready")[0] == 200), "B is ready with the remote device")
        slow = H.spec("slow", epochs=1000, device="cpu")
        slow["data"] = {"type": "csv", "train": big, "label_column": "label"}
        slow.pop("register_as")
        st, doc = b.req("POST", "/v1/jobs", slow)
        check(st == 201, "a long job on cpu is accepted: %d %r" % (st, doc))
        slow_id = doc.get("id") if st == 201 else None
        check(slow_id is not None and wait(lambda: b.req("GET", "/v1/jobs/%d" % slow_id)[1]["state"] == "running"),
              "the long job runs")
        queued = H.spec("queued", epochs=1, device=remote)
        queued.pop("register_as")
        st, doc = b.req("POST", "/v1/jobs", queued)
        check(st == 201, "a job on the working remote device is accepted: %d %r" % (st, doc))
        queued_id = doc.get("id") if st == 201 else None

        a.stop()
        check(wait(lambda: b.req("GET", "/v2/health/ready")[0] == 503), "B's readiness says the device is lost")
        st, doc = b.req("POST", "/v1/jobs", queued)
        err = doc.get("error", "") if isinstance(doc, dict) else ""
        check(st == 503 and remote in err and "lost" in err,
              "a job on the lost device is refused with 503 naming it: %d %r" % (st, doc))
        st, jobs = b.req("GET", "/v1/jobs")
        check(st == 200 and len(jobs.get("jobs", [])) == 2, "the refused job was not stored: %r" % (jobs,))

        if slow_id is not None:
            b.req("DELETE", "/v1/jobs/%d" % slow_id)
        if queued_id is not None:
            j = b.wait_state(queued_id, ("failed", "succeeded", "cancelled"))
            reason = j.get("error") or ""
            check(j["state"] == "failed" and remote in reason and "lost" in reason and "rand_uniform" not in reason,
                  "the queued job fails naming the lost device: %s %r" % (j["state"], reason))

        cpu_job = H.spec("oncpu", epochs=1, device="cpu")
        cpu_job.pop("register_as")
        st, doc = b.req("POST", "/v1/jobs", cpu_job)
        check(st == 201, "a job on cpu is still accepted: %d %r" % (st, doc))
    finally:
        b.stop()
        a.stop()
    if H.FAILURES:
        print(open(b.log).read()[-3000:])
    else:
        H.cleanup()
    H.finish()


if __name__ == "__main__":
    main()
