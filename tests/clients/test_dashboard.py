#!/usr/bin/env python3
"""The `kiln watch` dashboard, driven in tmux against a real kilnd: a finished job's dashboard
shows its id, progress bars, both plots and the same numbers as GET /v1/jobs/{id}; resizing
redraws it at the new size (tiny sizes included); q leaves with status 0 and the terminal as it
was; Ctrl-C stops watching a running job (130); when kilnd is SIGKILLed mid-job the dashboard
keeps running, says so, and after a restart on the same port resumes with Last-Event-ID and shows
the job succeed; an unknown job is refused before the screen is taken over.

Usage: test_dashboard.py KILND KILN_CLI      (exit 77 when tmux is missing)
"""
import os
import re
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

if not shutil.which("tmux"):
    print("tmux is not installed: skipping")
    sys.exit(77)

KILND, CLI = sys.argv[1], sys.argv[2]
SOCK = "kiln-test-%d" % os.getpid()
check = H.check


def tmux(*args, check_rc=True):
    import subprocess
    r = subprocess.run(["tmux", "-u", "-L", SOCK, "-f", "/dev/null"] + list(args), capture_output=True, text=True)
    if check_rc and r.returncode != 0:
        raise RuntimeError("tmux %s: %s" % (args, r.stderr))
    return r.stdout


def start_pane(name, url, args, width=100, height=30, env=()):
    """kiln ARGS in a detached tmux window; the shell around it records the exit status and
    whether the terminal settings came back unchanged (and survives the Ctrl-C sent to kiln)."""
    script = ("trap true INT; before=$(stty -g); %s --url %s %s; rc=$?; after=$(stty -g); "
              "[ \"$before\" = \"$after\" ] && echo TTY-RESTORED; echo EXIT=$rc; sleep 600"
              % (CLI, url, " ".join(args)))
    tmux("new-session", "-d", "-s", name, "-x", str(width), "-y", str(height),
         "env", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "TERM=screen", *env, "sh", "-c", script)


def capture(name):
    return tmux("capture-pane", "-p", "-t", name)


def wait_screen(name, pred, what, timeout=90):
    deadline = time.time() + timeout
    scr = ""
    while time.time() < deadline:
        scr = capture(name)
        if pred(scr):
            return scr
        time.sleep(0.1)
    print("---- screen ----\n" + scr + "\n----------------")
    raise RuntimeError("the screen never showed " + what)


def alternate_on(name):
    return tmux("display", "-p", "-t", name, "#{alternate_on}").strip() == "1"


def sane(scr, width, height):
    """Every row fits, the header is on top and the footer at the bottom, nothing is doubled."""
    rows = scr.split("\n")
    if rows and rows[-1] == "":
        rows = rows[:-1]
    fits = all(len(r) <= width for r in rows)
    if width < 12:  # only the start of the header fits
        return fits and len(rows) <= height and rows[0].startswith(" kiln"[:width])
    return (fits and len(rows) <= height and rows[0].startswith(" kiln watch") and
            scr.count("kiln watch") == 1 and scr.count("Job   [") <= 1)


def test_finished_job(d):
    st, j = d.req("POST", "/v1/jobs", H.spec("dash", epochs=3))
    jid = j["id"]
    d.wait_state(jid, ["succeeded"], timeout=120)
    st, job = d.req("GET", "/v1/jobs/%d" % jid)
    step, ep = job["latest_step"], job["latest_epoch"]
    start_pane("fin", d.url, ["watch", str(jid)])
    scr = wait_screen("fin", lambda s: "job succeeded; model 'dash' is served" in s, "the final state")
    print(scr)
    check(alternate_on("fin"), "the dashboard takes the alternate screen")
    check(re.search(r"kiln watch\s+job %d\s+dash\s+succeeded" % jid, scr) is not None, "header: job id, name, state")
    check(re.search(r"Job\s+\[\u2588+\]\s+100%\s+epoch 3/3", scr) is not None, "the job's progress bar is full")
    check(re.search(r"Epoch\s+\[\u2588+\]\s+100%%\s+batch %d/%d" % (step["batches"], step["batches"]), scr) is not None,
          "the epoch's progress bar is full, with the batch count from REST")
    check("step %d" % step["step"] in scr, "the last step number matches REST (%d)" % step["step"])
    check("loss %.4f" % step["loss"] in scr, "the step loss matches REST (%.4f)" % step["loss"])
    check("valid loss %.4f acc %.4f" % (ep["valid_loss"], ep["valid_accuracy"]) in scr,
          "the validation metrics match REST (%.4f, %.4f)" % (ep["valid_loss"], ep["valid_accuracy"]))
    check("lr %.4g" % step["lr"] in scr, "the learning rate matches REST")
    check("Loss" in scr and "Accuracy" in scr and "\u2514" in scr, "both plots and their axes are drawn")
    check(any(0x2801 <= ord(c) <= 0x28ff for c in scr), "the plots have braille dots")
    check("model dash version 1 registered" in scr, "the log shows the model registration")

    # Resizing: smaller, tiny, larger; each time a clean redraw at the new size.
    for w, h in [(70, 20), (40, 10), (20, 3), (10, 2), (120, 40)]:
        tmux("resize-window", "-t", "fin", "-x", str(w), "-y", str(h))
        scr = wait_screen("fin", lambda s, w=w, h=h: sane(s, w, h) and ("succeeded" in s or h < 4 or w < 40),
                          "a clean redraw at %dx%d" % (w, h), timeout=20)
        check(True, "redrawn cleanly at %dx%d" % (w, h))
    check("Accuracy" in scr and "Loss" in scr, "at 120x40 both plots are back")

    # An exported COLUMNS/LINES that is not the terminal's size is not taken over the real one
    start_pane("envsize", d.url, ["watch", str(jid)], 100, 30, env=("COLUMNS=300", "LINES=10"))
    wait_screen("envsize", lambda s: "succeeded" in s and sane(s, 100, 30) and len(s.rstrip("\n").split("\n")) > 20,
                "the dashboard at the terminal's 100x30, not COLUMNS=300 LINES=10", timeout=20)
    check(True, "COLUMNS and LINES exported with other values: drawn at the terminal's size")
    tmux("send-keys", "-t", "envsize", "q")
    tmux("send-keys", "-t", "fin", "q")
    scr = wait_screen("fin", lambda s: "EXIT=" in s, "the exit status")
    check("EXIT=0" in scr, "q leaves with status 0")
    check("TTY-RESTORED" in scr, "the terminal settings are restored")
    check(not alternate_on("fin"), "the alternate screen is left")
    check("job %d: succeeded" % jid in scr, "the final state is printed after leaving")
    check("job %d: final valid_accuracy %.4f valid_loss %.4f" % (jid, ep["valid_accuracy"], ep["valid_loss"]) in scr,
          "and the final metrics, as the plain lines give them")


def test_running_ctrl_c(d):
    st, j = d.req("POST", "/v1/jobs", H.spec("long", epochs=5000))
    jid = j["id"]
    start_pane("run", d.url, ["watch", str(jid)], 90, 25)
    scr = wait_screen("run", lambda s: "running" in s and re.search(r"step [1-9]", s), "a running job with steps")
    check(re.search(r"ETA \d+(s|m\d\ds|h\d\dm)", scr) is not None, "a running job shows an ETA")
    check("following job %d" % jid in scr, "the footer says the stream is followed")
    # q on a job that goes on: not 0, which says the job succeeded (`kiln train submit --watch && deploy`)
    start_pane("quit", d.url, ["watch", str(jid)], 90, 25)
    wait_screen("quit", lambda s: "following job %d" % jid in s, "the second dashboard following the job")
    tmux("send-keys", "-t", "quit", "q")
    scr = wait_screen("quit", lambda s: "EXIT=" in s, "the exit status after q")
    check("EXIT=3" in scr and "job %d is running and goes on" % jid in scr,
          "q on a running job leaves with status 3 and says the job goes on")
    check("TTY-RESTORED" in scr and not alternate_on("quit"), "the terminal is restored after q")
    tmux("send-keys", "-t", "run", "C-c")
    scr = wait_screen("run", lambda s: "EXIT=" in s, "the exit status after Ctrl-C")
    check("EXIT=130" in scr, "Ctrl-C leaves with status 130")
    check("TTY-RESTORED" in scr and not alternate_on("run"), "the terminal is restored after Ctrl-C")
    check("job %d goes on" % jid in scr, "Ctrl-C says the job goes on")
    st, job = d.req("GET", "/v1/jobs/%d" % jid)
    check(job["state"] == "running", "Ctrl-C in the dashboard does not touch the job")
    d.req("DELETE", "/v1/jobs/%d" % jid)
    d.wait_state(jid, ["cancelled"])


def test_reconnect(tmp):
    d = H.Daemon(KILND, "reconnect")
    port = d.port
    st, j = d.req("POST", "/v1/jobs", H.spec("again", epochs=150))
    jid = j["id"]
    start_pane("rec", d.url, ["watch", str(jid), "--exit-on-end"], 100, 30)
    wait_screen("rec", lambda s: re.search(r"epoch [2-9]\d*/150|epoch 1\d+/150", s), "a job past its first epoch")
    d.stop(signal.SIGKILL)
    scr = wait_screen("rec", lambda s: "connection lost" in s or "cannot reach" in s, "the lost connection")
    check(alternate_on("rec"), "the dashboard stays up while kilnd is down")
    d = H.Daemon(KILND, "reconnect", fresh=False, port=port)
    scr = wait_screen("rec", lambda s: "EXIT=" in s, "the end of the job after the restart", timeout=240)
    st, job = d.req("GET", "/v1/jobs/%d" % jid)
    check(job["state"] == "succeeded", "the job resumed and succeeded: %s" % job["state"])
    check("EXIT=0" in scr and "job %d: succeeded" % jid in scr, "--exit-on-end leaves with the job's success")
    d.stop()


def test_unknown_job(d):
    start_pane("unk", d.url, ["watch", "987654"], 80, 10)
    scr = wait_screen("unk", lambda s: "EXIT=" in s, "the exit status")
    check("EXIT=1" in scr and "987654" in scr, "an unknown job: exit 1 and kilnd's message")
    check("TTY-RESTORED" in scr, "the terminal is untouched")


def main():
    d = H.Daemon(KILND, "dash")
    try:
        test_finished_job(d)
        test_running_ctrl_c(d)
        test_unknown_job(d)
        test_reconnect(H.TMP)
    finally:
        tmux("kill-server", check_rc=False)
        d.stop()
        H.cleanup()
    H.finish()


main()
