#!/usr/bin/env python3
"""The container image, built and run the way docs/deployment.md says (suite 'deploy').

Usage: test_image.py SOURCE_ROOT

Runs the marked shell blocks of docs/deployment.md's "Containers" part in order, with the
suite's own container name, volume, host port and environment file (deploy_docs.py):
- image-build: the base image (deploy/base-image.sh, reused when podman already stores it) and
  `podman build` of deploy/Dockerfile from the source tree;
- image-tokens: an admin token into an environment file;
- image-run: `podman run` of the image on a named volume;
- image-check: readiness and the example model's metadata with the admin token.
Then, between the blocks, over HTTP on the published port:
- the image: runs as uid 10001, carries a HEALTHCHECK that `podman healthcheck run` passes,
  holds no compiler, has tini as its entry point and the /bin/sleep deploy/k8s's preStop hook
  runs; its size is printed;
- the container: PID 1 is tini, kilnd's umask is 0002 and the lock and model folders it made
  are group-writable, a process `podman exec` leaves orphaned is reaped, the stop timeout the
  run line gives is the container's;
- the example model (examples/models/cnn) answers the fixture's request with ONNX Runtime's
  logits (tests/fixtures/onnx/cnn.b1.io.safetensors);
- a tiny training job (a CSV copied into the volume with `podman cp`) succeeds and its model
  answers;
- image-stop: `podman stop` drains kilnd, which exits by itself with status 0 (a kill by
  podman after the grace period would read 137);
- image-run again on the same volume: the job is still there, succeeded, and both models give
  the same answers as before;
- then a container run as another uid in group 0 (`--user 12345:0`, OpenShift's rule), its port
  given as a flag after the image's name (the HEALTHCHECK follows it), on that
  volume: it starts, takes the lock, serves both models with the same answers and stops with
  status 0.
- image-clean removes the container and the volume (also after a failure).

Exit 77 (skip) only where podman is missing or can run no container at all, saying why.
"""
import http.client
import json
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_docs  # noqa: E402

FAILURES = []
TMP = tempfile.mkdtemp(prefix="kiln-image-")
IMAGE = "localhost/kiln/kilnd"
BASE = "localhost/kiln-base:bookworm"


PASSED = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    (PASSED if cond else FAILURES).append(what)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_block(name, blocks, names, env, log=None):
    script = deploy_docs.documented(blocks[name], names)
    print("== docs/deployment.md block %s ==\n%s" % (name, script), flush=True)
    out = open(log, "w") if log else subprocess.PIPE
    started = time.monotonic()
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env,
                       stdout=out, stderr=subprocess.STDOUT, text=True)
    text = open(log).read() if log else r.stdout
    print("(%.0f s, exit %d)" % (time.monotonic() - started, r.returncode), flush=True)
    if r.returncode != 0 or not log:
        print(text[-4000:], flush=True)
    if not check(r.returncode == 0, "block %s runs" % name):
        raise SystemExit(1)
    return text


def call(port, method, path, token=None, body=None, timeout=30):
    headers = {"Connection": "close"}
    if token:
        headers["Authorization"] = "Bearer " + token
    if body is not None:
        headers["Content-Type"] = "application/json"
        body = json.dumps(body)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        raw = r.read()
    finally:
        c.close()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        return r.status, raw


def wait_ready(port, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if call(port, "GET", "/v2/health/ready", timeout=2)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def wait_model_ready(port, token, model, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if call(port, "GET", "/v2/models/%s/ready" % model, token, timeout=2)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def podman(env, *args, check_rc=True):
    r = subprocess.run(["podman", *args], env=env, capture_output=True, text=True)
    if check_rc and r.returncode != 0:
        print("podman %s: %s" % (" ".join(args), r.stderr.strip()), flush=True)
    return r


def safetensors(path):
    """{name: (shape, [float])} of an F32 safetensors file."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["shape"], list(struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])))
    return out


def close(got, want):
    return len(got) == len(want) and all(abs(p - q) <= 1e-4 * max(1.0, abs(q)) for p, q in zip(got, want))


def infer(port, token, model, name, shape, data):
    st, j = call(port, "POST", "/v2/models/%s/infer" % model, token,
                 {"inputs": [{"name": name, "datatype": "FP32", "shape": shape, "data": data}]})
    return st, (j["outputs"][0]["data"] if st == 200 else j)


def write_csv(path, n, seed):
    """Three separable classes in four features (as tests/jobs does)."""
    rnd = random.Random(seed)
    with open(path, "w") as f:
        f.write("a,b,c,d,label\n")
        for _ in range(n):
            c = rnd.randrange(3)
            x = [rnd.gauss(2.0 if k == c else 0.0, 0.5) for k in range(4)]
            f.write(",".join("%.4f" % v for v in x) + ",%d\n" % c)


JOB = {
    "model": {"inputs": ["x"], "outputs": ["fc2"], "nodes": [
        {"name": "fc1", "layer": "Linear", "config": {"in_features": 4, "out_features": 16}, "inputs": ["x"]},
        {"name": "act", "op": "relu", "inputs": ["fc1"]},
        {"name": "fc2", "layer": "Linear", "config": {"in_features": 16, "out_features": 3}, "inputs": ["act"]}]},
    "data": {"type": "csv", "train": "/var/lib/kiln/datasets/toy.csv", "label_column": "label", "valid_split": 0.2},
    "loss": "cross_entropy", "optimizer": {"kind": "adam", "lr": 0.01}, "epochs": 2, "batch_size": 16,
    "seed": 3, "checkpoint": {"every_epochs": 1, "keep_last": 2}, "register_as": "toy",
}
TOY_INPUT = [2.1, 0.1, -0.2, 0.3]


def answers(port, token, fixture):
    xs, xv = fixture["in.x"]
    return {"cnn": infer(port, token, "cnn", "x", xs, xv), "toy": infer(port, token, "toy", "x", [1, 4], TOY_INPUT)}


def prestop_command():
    """deploy/k8s/deployment.yaml's preStop exec command (a flow list of strings), or []."""
    text = open(os.path.join(ROOT, "deploy", "k8s", "deployment.yaml")).read()
    m = re.search(r"preStop:\s*exec:\s*command: \[(.*)\]", text)
    return json.loads("[%s]" % m.group(1)) if m else []


def podman_exec(env, container, script):
    return podman(env, "exec", container, "sh", "-c", script, check_rc=False)


def check_container(env, container):
    """What the entry point (tini, umask 0002, exec kilnd) and the run line give the container."""
    r = podman_exec(env, container, "cat /proc/1/comm")
    check(r.stdout.strip() == "tini", "PID 1 in the container is tini: %r" % (r.stdout + r.stderr))
    r = podman_exec(env, container, 'for s in /proc/[0-9]*/status; do '
                    'grep -q "^Name:[[:space:]]*kilnd$" "$s" && grep "^Umask:" "$s"; done; true')
    check(r.stdout.split() == ["Umask:", "0002"], "kilnd runs with umask 0002: %r" % r.stdout)
    r = podman(env, "exec", container, "stat", "-c", "%a %n", "/var/lib/kiln/kilnd.lock", "/var/lib/kiln/models",
               "/var/lib/kiln/models/cnn", "/var/lib/kiln/models/cnn/1")
    modes = {line.split()[1]: int(line.split()[0], 8) & 0o777 for line in r.stdout.splitlines()}
    want = {"/var/lib/kiln/kilnd.lock": 0o664, "/var/lib/kiln/models": 0o775, "/var/lib/kiln/models/cnn": 0o775,
            "/var/lib/kiln/models/cnn/1": 0o775}
    check(modes == want, "the lock and the model folders kilnd made are group-writable: %s"
          % {k: "%o" % v for k, v in modes.items()})
    podman_exec(env, container, "sleep 0.2 & exit 0")
    time.sleep(1.5)
    r = podman_exec(env, container, 'grep -l "^State:[[:space:]]*Z" /proc/[0-9]*/status; true')
    check(r.stdout.strip() == "", "a process orphaned by podman exec is reaped, no zombie left: %r" % r.stdout)
    r = podman(env, "inspect", container, "--format", "{{.Config.StopTimeout}}")
    check(r.stdout.strip() == "30", "the container's stop timeout is the run line's 30 s: %r" % r.stdout.strip())


def inspect_image(env):
    r = podman(env, "image", "inspect", IMAGE)
    if not check(r.returncode == 0, "the image %s exists after the build" % IMAGE):
        return
    info = json.loads(r.stdout)[0]
    cfg = info.get("Config", {})
    size = info.get("Size", 0)
    print("image %s: %.1f MB (%d bytes)" % (IMAGE, size / 1e6, size), flush=True)
    check(cfg.get("User") == "10001:0", "the image runs as uid 10001, group 0: %r" % cfg.get("User"))
    hc = info.get("Healthcheck") or cfg.get("Healthcheck") or {}
    check("health" in " ".join(hc.get("Test", [])), "the image carries its HEALTHCHECK: %r" % hc)
    r = podman(env, "run", "--rm", "--network", "none", "--entrypoint", "sh", IMAGE, "-c",
               "for p in cc gcc clang meson ninja pkg-config; do command -v $p; done; true")
    check(r.returncode == 0 and r.stdout.strip() == "", "no compiler or build tool in the image: %r" % r.stdout)
    check((cfg.get("Entrypoint") or [""])[0] == "/usr/bin/tini", "the entry point is tini: %r" % cfg.get("Entrypoint"))
    hook = prestop_command()
    r = podman(env, "run", "--rm", "--network", "none", "--entrypoint", hook[0], IMAGE, "0") if hook else None
    check(r is not None and r.returncode == 0, "the image runs deploy/k8s's preStop command %s" % hook)


def main():
    if shutil.which("podman") is None:
        print("skip: podman is not installed (deploy/install-deps.sh installs it)", flush=True)
        return 77
    blocks = deploy_docs.doc_blocks(ROOT)
    for name in ("image-build", "image-tokens", "image-run", "image-check", "image-stop", "image-clean"):
        if not check(name in blocks, "docs/deployment.md marks the block %s" % name):
            return 1
    suffix = "%d-%d" % (os.getpid(), int(time.time()))
    port = free_port()
    names = deploy_docs.Names(suffix, port, os.path.join(TMP, "kilnd.env"))
    other = names.container + "-uid12345"
    fixture = safetensors(os.path.join(ROOT, "tests", "fixtures", "onnx", "cnn.b1.io.safetensors"))

    # The base image needs no running container: make it (or find it) first, then see whether
    # containers run here at all, with the host's settings or deploy/containers.conf.
    r = subprocess.run([os.path.join(ROOT, "deploy", "base-image.sh")], capture_output=True, text=True)
    if not check(r.returncode == 0, "deploy/base-image.sh makes or finds the base image"):
        print(r.stderr[-3000:])
        return 1
    env, why = deploy_docs.podman_env(ROOT, r.stdout.strip().splitlines()[-1])
    if env is None:
        print("skip: podman can run no container on this host: %s" % why, flush=True)
        return 77

    try:
        run_block("image-build", blocks, names, env, log=os.path.join(TMP, "build.log"))
        inspect_image(env)
        # Each source change leaves a build stage of about 550 MB behind; keep the last hour's
        # (the cache of the next run) and drop older ones, so repeated runs do not fill the disk.
        podman(env, "image", "prune", "-f", "--filter", "label=io.kiln.stage=build", "--filter", "until=1h")

        run_block("image-tokens", blocks, names, env)
        run_block("image-run", blocks, names, env)
        token = open(names.env_file).read().split("admin:", 1)[1].split()[0]
        check(wait_ready(port), "kilnd in the container is ready on the published port %d" % port)
        out = run_block("image-check", blocks, names, env)
        check('"name":"cnn"' in out.replace(" ", ""), "the documented check shows the example model")
        check(call(port, "GET", "/v2/models/cnn")[0] == 401, "the model endpoints need a token")
        r = podman(env, "exec", names.container, "id", "-u")
        check(r.stdout.strip() == "10001", "kilnd runs as uid 10001 in the container: %r" % r.stdout)
        r = podman(env, "healthcheck", "run", names.container, check_rc=False)
        check(r.returncode == 0, "the image's HEALTHCHECK passes on a ready kilnd: %s" % r.stdout.strip())
        check_container(env, names.container)

        st, logits = infer(port, token, "cnn", "x", *fixture["in.x"])
        check(st == 200 and close(logits, fixture["out.logits"][1]),
              "the example model answers with ONNX Runtime's logits: %s %s" % (st, str(logits)[:200]))

        csv = os.path.join(TMP, "toy.csv")
        write_csv(csv, 240, 7)
        r = podman(env, "exec", names.container, "mkdir", "-p", "/var/lib/kiln/datasets")
        r = podman(env, "cp", csv, "%s:/var/lib/kiln/datasets/toy.csv" % names.container)
        check(r.returncode == 0, "podman cp puts a dataset into the data volume")
        st, j = call(port, "POST", "/v1/jobs", token, JOB)
        check(st == 201, "a training job is accepted: %s %s" % (st, j))
        job = j.get("id") if isinstance(j, dict) else None
        deadline = time.monotonic() + 180
        state = None
        while job and time.monotonic() < deadline:
            state = call(port, "GET", "/v1/jobs/%d" % job, token)[1].get("state")
            if state in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.5)
        check(state == "succeeded", "the job succeeds: %s" % state)
        before = answers(port, token, fixture)
        check(all(st == 200 for st, _ in before.values()), "both models answer before the stop: %s" % before)

        out = run_block("image-stop", blocks, names, env)
        codes = [w for w in out.split() if w.isdigit()]
        check(codes == ["0"], "kilnd drained and exited by itself with status 0 (the documented inspect "
              "prints %s)" % codes)

        run_block("image-run", blocks, names, env)
        check(wait_ready(port), "a new container on the same volume is ready")
        st, j = call(port, "GET", "/v1/jobs/%d" % job, token) if job else (0, {})
        check(st == 200 and j.get("state") == "succeeded" and (j.get("model") or {}).get("name") == "toy",
              "the job survived the new container: %s %s" % (st, str(j)[:300]))
        # /v2/health/ready says the server takes requests; models load in the background after
        # it, so each model's own readiness is awaited before it is asked
        for model in ("cnn", "toy"):
            wait_model_ready(port, token, model)
        after = answers(port, token, fixture)
        check(after == before, "both models survived and give the same answers: %s" % after)
        r = podman(env, "logs", names.container)
        logs = r.stdout + r.stderr
        check("example model" not in logs, "the example models were not copied again into a used volume")

        # OpenShift's rule: an arbitrary uid in group 0, on the volume uid 10001 has used
        podman(env, "stop", names.container)
        podman(env, "rm", names.container)
        # (and with its port given as a flag after the image's name, which the HEALTHCHECK follows)
        r = podman(env, "run", "-d", "--name", other, "--user", "12345:0", "-p", "%d:9000" % port, "-v",
                   "%s:/var/lib/kiln" % names.volume, "--env-file", names.env_file, "--stop-timeout", "30", IMAGE,
                   "--port", "9000")
        check(r.returncode == 0 and wait_ready(port), "a container run as uid 12345, group 0, on the same volume "
              "is ready")
        r = podman(env, "healthcheck", "run", other, check_rc=False)
        check(r.returncode == 0, "the HEALTHCHECK follows a port given as a flag (9000): %s" % r.stdout.strip())
        for model in ("cnn", "toy"):
            wait_model_ready(port, token, model)
        as_other = answers(port, token, fixture)
        check(as_other == before, "it serves both models with the same answers: %s" % as_other)
        podman(env, "stop", other)
        r = podman(env, "inspect", other, "--format", "{{.State.ExitCode}}")
        check(r.stdout.strip() == "0", "it stops by itself with status 0: %r" % r.stdout.strip())
    finally:
        podman(env, "rm", "-f", other, check_rc=False)
        run_block("image-clean", blocks, names, env)
        shutil.rmtree(TMP, ignore_errors=True)
    left = podman(env, "volume", "exists", names.volume, check_rc=False).returncode
    check(left != 0, "the documented clean-up removed the volume")
    print("%d passed, %d failed" % (len(PASSED), len(FAILURES)))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
