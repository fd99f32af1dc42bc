#!/usr/bin/env python3
"""deploy/compose.yaml runs the container docs/deployment.md documents (suite 'deploy').

Usage: test_compose.py SOURCE_ROOT

podman-compose parses the file and prints, in a dry run, the `podman run` it would execute;
that command and the documented `podman run` line (the image-run block) must set the same
image, published port, volume, tokens file and environment, and nothing else but the names
and labels compose adds. The file's stop_grace_period must be the run line's --stop-timeout,
which podman-compose 1.0 does not pass on (it ignores stop_grace_period): so every stop,
restart or down in the documented compose block must carry -t with the same seconds, and its
down must, in the dry run, stop the container with `podman stop -t` those seconds.
The dry run still creates the project's volume and network: they are removed afterwards.
"""
import os
import shlex
import shutil
import subprocess
import sys

ROOT = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import deploy_docs  # noqa: E402
from test_python import rerun_under_test_python  # noqa: E402

rerun_under_test_python(["yaml"], "PyYAML")
import yaml  # noqa: E402

PASSED, FAILURES = [], []
# Options compose adds for its own bookkeeping: container name, labels, project network.
COMPOSE_ONLY = {"--name", "--label", "--net", "--network", "--network-alias"}
WITH_VALUE = {"--name", "--label", "--net", "--network", "--network-alias", "-p", "--publish", "-v", "--volume",
              "--env-file", "-e", "--env", "--restart", "--stop-timeout", "--health-cmd", "--user", "-u",
              "--read-only", "--ulimit", "--entrypoint", "--hostname"}


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    (PASSED if cond else FAILURES).append(what)
    return cond


def run_options(words):
    """{option: [values]} and the image of a `podman run` command line."""
    i = words.index("run") + 1
    opts = {}
    while i < len(words) and words[i].startswith("-"):
        w = words[i]
        if "=" in w and w.startswith("--"):
            name, value = w.split("=", 1)
        elif w in WITH_VALUE:
            name, value = w, words[i + 1]
            i += 1
        else:
            name, value = w, True
        opts.setdefault({"--publish": "-p", "--volume": "-v", "--env": "-e"}.get(name, name), []).append(value)
        i += 1
    return opts, words[i:]


def main():
    blocks = deploy_docs.doc_blocks(ROOT)
    if not check("image-run" in blocks and "compose" in blocks, "docs/deployment.md marks image-run and compose"):
        return 1
    doc_words = shlex.split(blocks["image-run"].replace("\\\n", " "))
    doc_opts, doc_rest = run_options(doc_words)
    stop_timeout = (doc_opts.get("--stop-timeout") or [""])[0]
    check(stop_timeout.isdigit() and int(stop_timeout) > 10,
          "the documented run line gives the container a stop timeout longer than kilnd's 10 s drain: %r"
          % stop_timeout)
    compose_lines = [shlex.split(line, comments=True) for line in blocks["compose"].splitlines()]
    stops = [w for w in compose_lines if w[:1] == ["podman-compose"] and set(w) & {"down", "stop", "restart"}]
    check(stops and all("-t" in w and w[w.index("-t") + 1:][:1] == [stop_timeout] for w in stops),
          "every documented podman-compose stop, restart and down passes -t %s: %s" % (stop_timeout, stops))

    compose_file = os.path.join(ROOT, "deploy", "compose.yaml")
    spec = yaml.safe_load(open(compose_file))
    check(list(spec.get("services", {})) == ["kilnd"], "compose.yaml defines the one service kilnd")
    svc = spec["services"]["kilnd"]
    grace = str(svc.get("stop_grace_period", ""))
    check(grace == stop_timeout + "s",
          "stop_grace_period %s is the run line's --stop-timeout %s" % (grace, stop_timeout))
    build = svc.get("build", {})
    check(build.get("dockerfile") == "deploy/Dockerfile" and
          os.path.realpath(os.path.join(ROOT, "deploy", build.get("context", ""))) == ROOT,
          "compose builds deploy/Dockerfile from the repository root")

    if shutil.which("podman-compose") is None:
        check(False, "podman-compose is installed (deploy/install-deps.sh)")
        return 1
    project = "kilncompose%d" % os.getpid()
    try:
        r = subprocess.run(["podman-compose", "--dry-run", "-p", project, "-f", compose_file, "up", "-d"],
                           cwd=ROOT, capture_output=True, text=True)
        runs = [line for line in r.stdout.splitlines() if line.startswith("podman run ")]
        if not check(r.returncode == 0 and len(runs) == 1,
                     "podman-compose parses compose.yaml and would run one container"):
            print(r.stdout[-2000:], r.stderr[-2000:], flush=True)
            return 1
        for words in stops:
            if "down" not in words:
                continue
            r = subprocess.run(["podman-compose", "--dry-run", "-p", project, *words[1:]], cwd=ROOT,
                               capture_output=True, text=True)
            podman_stops = [line for line in r.stdout.splitlines() if line.startswith("podman stop ")]
            check(r.returncode == 0 and len(podman_stops) == 1
                  and podman_stops[0].startswith("podman stop -t %s " % stop_timeout),
                  "the documented %s stops the container with podman stop -t %s: %s"
                  % (" ".join(words), stop_timeout, podman_stops or r.stderr[-300:]))
    finally:
        subprocess.run(["podman", "volume", "rm", "-f", project + "_kiln-data"], capture_output=True)
        subprocess.run(["podman", "network", "rm", "-f", project + "_default"], capture_output=True)
    opts, rest = run_options(shlex.split(runs[0]))
    print("documented: %s\ncompose:    %s" % (" ".join(doc_words), runs[0]), flush=True)

    check(rest == doc_rest, "the same image and command: %s / %s" % (rest, doc_rest))
    check(opts.get("-p") == doc_opts.get("-p"), "the same published port: %s" % opts.get("-p"))
    vols = [v.replace(project + "_", "", 1) for v in opts.get("-v", [])]
    check(vols == doc_opts.get("-v"), "the same volume (compose prefixes the project): %s" % vols)
    env_files = [os.path.relpath(f, ROOT) for f in opts.get("--env-file", [])]
    check(env_files == doc_opts.get("--env-file"), "the same tokens file: %s" % env_files)
    check(sorted(opts.get("-e", [])) == sorted(doc_opts.get("-e", [])), "the same environment: %s" % opts.get("-e"))
    # podman-compose 1.0 drops stop_grace_period (checked against --stop-timeout above); a later
    # one that passes it on must pass the same seconds
    check(opts.get("--stop-timeout", [stop_timeout]) == [stop_timeout],
          "compose passes no other stop timeout: %s" % opts.get("--stop-timeout"))
    extra = sorted(set(opts) - set(doc_opts) - COMPOSE_ONLY)
    missing = sorted(set(doc_opts) - set(opts) - {"--name", "--stop-timeout"})
    check(extra == [] and missing == [], "no other option on either side: compose adds %s, lacks %s" % (extra, missing))
    print("%d passed, %d failed" % (len(PASSED), len(FAILURES)))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
