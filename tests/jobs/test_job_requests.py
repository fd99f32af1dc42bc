#!/usr/bin/env python3
"""Requests about jobs that are refused up front rather than answered wrongly or failing late:
the list's last page (next_after null), query parameters (percent-decoded; unknown, repeated and
too long ones a 400 naming them), resume_from_job with a checkpoint past the job's epochs or of
another model, and register_as into a model repository kilnd cannot write (400 at submission;
a repository that turns read-only while the job waits fails it saying so).

The read-only repository needs kilnd to run without write access to a folder: as root it runs as
another uid (setpriv) over a root-owned folder, otherwise the folder's write bits are removed.

Usage: test_job_requests.py KILND
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND = sys.argv[1]
check = H.check
FINAL = ["succeeded", "failed", "cancelled"]
AS_OTHER_USER = os.geteuid() == 0 and shutil.which("setpriv") is not None
OTHER_UID = 65534


def wait_state(d, jid, states, timeout=60):
    try:
        return d.wait_state(jid, states, timeout=timeout)
    except RuntimeError as e:
        check(False, str(e))
        return None


def plain_spec(epochs=1, **extra):
    s = H.spec("unused", epochs=epochs, **extra)
    del s["register_as"]
    return s


def test_list_and_queries(d):
    ids = []
    for _ in range(3):
        st, j = d.req("POST", "/v1/jobs", plain_spec())
        ids.append(j["id"])
    for jid in ids:
        wait_state(d, jid, FINAL)

    def listed(query):
        st, body = d.req("GET", "/v1/jobs" + query)
        return st, ([x["id"] for x in body["jobs"]], body["next_after"]) if st == 200 else body

    check(listed("?limit=3") == (200, (ids, None)), "exactly limit jobs: one page, next_after null: %s"
          % (listed("?limit=3"),))
    check(listed("?limit=2") == (200, (ids[:2], ids[1])), "a page short of the end: next_after its last id")
    check(listed("?limit=2&after=%d" % ids[1]) == (200, (ids[2:], None)), "the last page: next_after null")
    check(listed("?state=succ%65eded&limit=%32") == (200, (ids[:2], ids[1])),
          "values are percent-decoded: %s" % (listed("?state=succ%65eded&limit=%32"),))
    check(listed("?after=" + "0" * 40 + "%d" % ids[0]) == (200, (ids[1:], None)),
          "a long value is read whole, not cut short")
    for path, words in (("/v1/jobs?stat=running", "'stat'"), ("/v1/jobs?state=queued&state=running", "'state'"),
                        ("/v1/jobs?limit=" + "1" * 200, "limit"), ("/v1/jobs?state=%zz", "state"),
                        ("/v1/jobs/%d/metrics?knd=step" % ids[0], "'knd'"),
                        ("/v1/jobs/%d/logs?kind=step" % ids[0], "'kind'"),
                        ("/v1/jobs/%d/events?limit=5" % ids[0], "'limit'"),
                        ("/v1/jobs/%d?verbose=1" % ids[0], "'verbose'")):
        st, body = d.req("GET", path)
        err = body.get("error", "") if isinstance(body, dict) else ""
        check(st == 400 and words in err, "GET %s -> 400 naming %s: %s %s" % (path[:60], words, st, err))
    st, body = d.req("DELETE", "/v1/jobs/%d?force=1" % ids[0])
    check(st == 400 and "'force'" in body.get("error", ""), "DELETE with an unknown parameter -> 400: %s" % body)
    st, body = d.req("GET", "/v1/jobs/%d/metrics?kind=step&after=0&limit=10000" % ids[0])
    check(st == 200 and body["kind"] == "step" and body["metrics"], "known parameters still answer")


def mlp(hidden, first="fc1"):
    m = json.loads(json.dumps(H.MLP))
    m["nodes"][0]["name"] = first
    m["nodes"][0]["config"]["out_features"] = hidden
    m["nodes"][1]["inputs"] = [first]
    m["nodes"][2]["config"]["in_features"] = hidden
    return m


def test_resume_checks(d):
    st, a = d.req("POST", "/v1/jobs", plain_spec(epochs=3))
    job = wait_state(d, a["id"], FINAL)
    check(job and job["state"] == "succeeded" and job["checkpoints"][-1]["epoch"] == 3, "a job of 3 epochs ran")
    before = d.req("GET", "/v1/jobs?limit=1000")[1]["jobs"]
    for extra, words in (({"epochs": 2}, "epoch 3, past this job's epochs (2)"),
                         ({"epochs": 5, "model": mlp(8)}, "'fc1.weight' is [16, 4] in the checkpoint, [8, 4]"),
                         ({"epochs": 5, "model": mlp(16, "dense")}, "'dense.weight' is not in the checkpoint")):
        st, body = d.req("POST", "/v1/jobs", plain_spec(resume_from_job=a["id"], **extra))
        err = body.get("error", "") if isinstance(body, dict) else ""
        check(st == 400 and "resume_from_job:" in err and words in err,
              "resume_from_job %s -> 400 (%s): %s %s" % (sorted(extra), words, st, err))
    # ids are written as the server writes them: "01" and "+1" name no job
    for tail in ("01", "+%d" % a["id"], "0"):
        st, body = d.req("GET", "/v1/jobs/%s" % tail)
        check(st == 404 and ("'%s' is not a job id" % tail) in body.get("error", ""),
              "GET /v1/jobs/%s -> 404: %s %s" % (tail, st, body))
    # a trailing slash names no job, as /v2/health/ is no health endpoint
    st, body = d.req("GET", "/v1/jobs/%d/" % a["id"])
    check(st == 404 and "no such job path" in body.get("error", ""), "GET /v1/jobs/N/ -> 404: %s %s" % (st, body))
    # 0 is no job (it had meant "no resume" without a word); a body on resume or DELETE (a new
    # epoch count there) would be ignored, so it is refused, pointing at resume_from_job
    st, body = d.req("POST", "/v1/jobs", plain_spec(resume_from_job=0))
    check(st == 400 and "resume_from_job: 0 is out of range [1, " in body.get("error", ""),
          "resume_from_job 0 -> 400: %s %s" % (st, body))
    st, body = d.req("POST", "/v1/jobs/%d/resume" % a["id"], {"epochs": 5})
    check(st == 400 and "resume takes no body" in body.get("error", "") and
          '"resume_from_job": %d' % a["id"] in body.get("error", ""), "resume with a body -> 400: %s %s" % (st, body))
    st, body = d.req("DELETE", "/v1/jobs/%d" % a["id"], "{}")
    check(st == 400 and "takes no body" in body.get("error", ""), "DELETE with a body -> 400: %s %s" % (st, body))
    st, body = d.req("POST", "/v1/jobs/%d/resume" % a["id"], " \r\n")
    check(st == 409, "resume with a blank body is a plain resume (409: the job succeeded): %s %s" % (st, body))
    check(d.req("GET", "/v1/jobs?limit=1000")[1]["jobs"] == before, "none of them became a job")
    st, b = d.req("POST", "/v1/jobs", plain_spec(epochs=5, resume_from_job=a["id"]))
    check(st == 201, "the same model to more epochs -> 201: %s %s" % (st, b))
    job = wait_state(d, b.get("id", 0), FINAL)
    st, m = d.req("GET", "/v1/jobs/%d/metrics" % b.get("id", 0))
    check(job and job["state"] == "succeeded" and [r["epoch"] for r in m["metrics"]] == [4, 5],
          "it trains epochs 4 and 5: %s" % [r["epoch"] for r in m.get("metrics", [])])


class Daemon(H.Daemon):
    """kilnd over a model repository it cannot write: as another uid when the test runs as root."""

    def __init__(self, name, models):
        data = os.path.join(H.TMP, name)
        os.makedirs(data, exist_ok=True)
        if AS_OTHER_USER:
            os.chown(data, OTHER_UID, OTHER_UID)
        self.data, self.log = data, os.path.join(H.TMP, name + ".log")
        argv = [KILND, "--port", "0", "--data-dir", data, "--data-roots", H.DATA, "--model-repository", models]
        if AS_OTHER_USER:
            argv = ["setpriv", "--reuid=%d" % OTHER_UID, "--regid=%d" % OTHER_UID, "--clear-groups"] + argv
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"), env=H.ENV)
        portfile = os.path.join(data, "kilnd.port")
        deadline = time.time() + 30
        while not os.path.exists(portfile) and self.proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        if not os.path.exists(portfile):
            self.proc.kill()
            raise RuntimeError("kilnd did not start: " + open(self.log).read())
        time.sleep(0.05)
        self.port = int(open(portfile).read())


def set_writable(models, writable):
    if AS_OTHER_USER:
        os.chown(models, OTHER_UID if writable else 0, OTHER_UID if writable else 0)
    else:
        os.chmod(models, 0o755 if writable else 0o555)


def test_read_only_repository():
    if not AS_OTHER_USER and os.geteuid() == 0:
        print("skip: the read-only repository needs setpriv when run as root")
        return
    os.chmod(H.TMP, 0o755)
    models = os.path.join(H.TMP, "ro-models")
    os.makedirs(models)
    set_writable(models, False)
    d = Daemon("read-only", models)
    try:
        st, body = d.req("POST", "/v1/jobs", H.spec("short", epochs=1))
        err = body.get("error", "") if isinstance(body, dict) else ""
        check(st == 400 and "register_as:" in err and "read-only" in err,
              "register_as into a read-only repository -> 400 saying so: %s %s" % (st, err))
        st, j = d.req("POST", "/v1/jobs", plain_spec())
        job = wait_state(d, j.get("id", 0), FINAL)
        check(st == 201 and job and job["state"] == "succeeded", "a job that registers nothing still runs")
        # Writable when submitted, read-only by the time the job has trained.
        set_writable(models, True)
        st, blocker = d.req("POST", "/v1/jobs", plain_spec(epochs=1000))
        wait_state(d, blocker["id"], ["running"])
        st, late = d.req("POST", "/v1/jobs", H.spec("short", epochs=1))
        check(st == 201, "submitted while the repository is writable -> 201: %s %s" % (st, late))
        set_writable(models, False)
        d.req("DELETE", "/v1/jobs/%d" % blocker["id"])
        job = wait_state(d, late.get("id", 0), FINAL)
        err = (job or {}).get("error") or ""
        check(job and job["state"] == "failed" and "register_as:" in err and "read-only" in err,
              "turned read-only meanwhile, the job fails saying so: %s" % err)
        check(os.listdir(models) == [], "nothing was left in the repository")
    finally:
        d.stop()
        set_writable(models, True)


def main():
    d = H.Daemon(KILND, "requests")
    try:
        test_list_and_queries(d)
        test_resume_checks(d)
    finally:
        d.stop()
    test_read_only_repository()
    H.finish()
    H.cleanup()


if __name__ == "__main__":
    main()
