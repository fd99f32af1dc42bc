#!/usr/bin/env python3
"""The Kubernetes and KServe manifests in deploy/k8s (suite 'deploy').

Usage: test_manifests.py KILND SOURCE_ROOT

- `kubectl kustomize` renders deploy/k8s and deploy/k8s/kserve (offline).
- Every Kubernetes object validates strictly (unknown fields refused) against the schemas of
  Kubernetes 1.30 and 1.37 bundled in the PyPI package kubernetes-validate.
- KServe's resources have no published schema: check_kserve() checks the fields that matter,
  and the runtime's containers validate against Kubernetes' Container schema.
- The restricted Pod Security profile, the probes, the token Secret, the volumes, the Service,
  PDB and HPA references hold; each kilnd pod has a preStop sleep (kilnd refuses new connections
  on SIGTERM, so it must come after the endpoints stop naming the pod) and a grace period that
  covers the sleep, kilnd's drain_timeout_ms and a margin; the HPA's metric comes from a histogram that KILND's /metrics
  exports; `kilnd --check-config` accepts every container's environment and args.
- Broken variants (an unknown field, a wrong type, a missing restricted setting, no preStop, a
  grace period too short for the drain, a KServe runtime without kserve-container) are refused,
  so the checks above can fail.
"""
import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

KILND, ROOT = sys.argv[1], os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import deploy_docs  # noqa: E402
from test_python import rerun_under_test_python  # noqa: E402

rerun_under_test_python(["kubernetes_validate", "yaml"], "kubernetes-validate")
import kubernetes_validate  # noqa: E402
import yaml  # noqa: E402

K8S_VERSIONS = ["1.30.0", "1.37.0"]
# What the grace period must leave after the preStop sleep and kilnd's drain: the process's own
# exit (closing the job store, the handles) and the kubelet's timing.
GRACE_MARGIN_S = 5
PASSED, FAILURES = [], []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    (PASSED if cond else FAILURES).append(what)
    return cond


def render(folder):
    r = subprocess.run(["kubectl", "kustomize", os.path.join(ROOT, folder)], capture_output=True, text=True)
    check(r.returncode == 0, "kubectl kustomize %s renders: %s" % (folder, r.stderr.strip()[-300:]))
    return [d for d in yaml.safe_load_all(r.stdout) if d] if r.returncode == 0 else []


def schema_errors(obj):
    """The schema errors of one Kubernetes object, for every version checked ('' if none)."""
    errors = []
    for v in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, v, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append("%s: %s at %s" % (v, e.message, "/".join(map(str, e.path))))
        except kubernetes_validate.SchemaNotFoundError:
            errors.append("%s: no schema for %s %s" % (v, obj.get("apiVersion"), obj.get("kind")))
    return "; ".join(errors)


def name_of(obj):
    return "%s/%s" % (obj.get("kind"), obj.get("metadata", {}).get("name"))


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def restricted_problems(pod_spec):
    """What keeps a pod spec from the restricted Pod Security Standard (the fields it names)."""
    problems = []
    psc = pod_spec.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(flag):
            problems.append(flag)
    for v in pod_spec.get("volumes", []):
        if "hostPath" in v:
            problems.append("hostPath volume " + v["name"])
    for c in pod_spec.get("containers", []) + pod_spec.get("initContainers", []):
        sc = c.get("securityContext", {})
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
            problems.append(c["name"] + ": runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            problems.append(c["name"] + ": runAsUser 0")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(c["name"] + ": seccompProfile %s" % seccomp)
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(c["name"] + ": allowPrivilegeEscalation")
        if sc.get("privileged"):
            problems.append(c["name"] + ": privileged")
        caps = sc.get("capabilities", {})
        if caps.get("drop") != ["ALL"] or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(c["name"] + ": capabilities")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(c["name"] + ": readOnlyRootFilesystem")
    return problems


def drain_seconds(container):
    """kilnd's drain_timeout_ms for the container in seconds: from its args or environment, else
    the default docs/configuration.md (generated from kilnd's table) gives."""
    args = container.get("args", [])
    if "--drain-timeout-ms" in args:
        return int(args[args.index("--drain-timeout-ms") + 1]) / 1000
    value = env_of(container).get("KILN_DRAIN_TIMEOUT_MS", {}).get("value")
    if value is None:
        text = open(os.path.join(ROOT, "docs", "configuration.md")).read()
        value = re.search(r"^\| `drain_timeout_ms` \| integer \| `(\d+)`", text, re.M).group(1)
    return int(value) / 1000


def shutdown_problems(pod_spec):
    """What keeps a kilnd pod from stopping without refusing a connection or being killed: a
    preStop `/bin/sleep N` (the endpoints and kube-proxy learn of the termination after the
    kubelet; the hook runs before SIGTERM, which makes kilnd refuse new connections), and a
    terminationGracePeriodSeconds, counted from the hook's start, of at least the sleep, kilnd's
    drain and GRACE_MARGIN_S."""
    (c,) = pod_spec["containers"]
    cmd = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    if len(cmd) != 2 or cmd[0] != "/bin/sleep" or not str(cmd[1]).isdigit() or int(cmd[1]) < 1:
        return ["no preStop exec /bin/sleep N: %s" % cmd]
    sleep, drain = int(cmd[1]), drain_seconds(c)
    grace = pod_spec.get("terminationGracePeriodSeconds", 30)
    if grace < sleep + drain + GRACE_MARGIN_S:
        return ["terminationGracePeriodSeconds %s < preStop %d s + drain %g s + %d s"
                % (grace, sleep, drain, GRACE_MARGIN_S)]
    return []


def probe_target(probe, container):
    get = (probe or {}).get("httpGet", {})
    port = get.get("port")
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    return get.get("path"), ports.get(port, port)


def check_kilnd_pod(obj, models_read_only):
    spec = obj["spec"]["template"]["spec"]
    what = name_of(obj)
    check(restricted_problems(spec) == [], "%s meets the restricted profile: %s" % (what, restricted_problems(spec)))
    check(spec["securityContext"].get("runAsUser") == 10001, "%s runs as the image's uid 10001" % what)
    (c,) = spec["containers"]
    env = env_of(c)
    check(probe_target(c.get("livenessProbe"), c) == ("/v2/health/live", 8080), "%s: liveness on /v2/health/live" % what)
    check(probe_target(c.get("readinessProbe"), c) == ("/v2/health/ready", 8080), "%s: readiness on /v2/health/ready" % what)
    check(probe_target(c.get("startupProbe"), c)[0] in ("/v2/health/live", "/v2/health/ready"),
          "%s: a startup probe on a v2 health endpoint" % what)
    tokens = env.get("KILN_API_TOKENS", {})
    check("value" not in tokens and tokens.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "kilnd-tokens",
          "%s: KILN_API_TOKENS comes from the Secret kilnd-tokens" % what)
    check(not any("token" in a.lower() for a in c.get("args", [])), "%s: no token on the command line" % what)
    check(env.get("KILN_MODEL_REPOSITORY", {}).get("value") == "/mnt/models", "%s: KILN_MODEL_REPOSITORY=/mnt/models" % what)
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    claims = {t["metadata"]["name"] for t in obj["spec"].get("volumeClaimTemplates", [])}
    models = mounts.get("/mnt/models", {})
    check(bool(models.get("readOnly")) == models_read_only and
          volumes.get(models.get("name"), {}).get("persistentVolumeClaim", {}).get("claimName") == "kiln-models",
          "%s: the shared model volume at /mnt/models, %s" % (what, "read-only" if models_read_only else "writable"))
    data_dir = env.get("KILN_DATA_DIR", {}).get("value")
    data = mounts.get(data_dir, {})
    check(data and not data.get("readOnly") and (data.get("name") in claims or data.get("name") in volumes),
          "%s: the data folder %s on a writable volume" % (what, data_dir))
    tmp = mounts.get("/tmp", {})
    check("emptyDir" in volumes.get(tmp.get("name"), {}), "%s: /tmp is an emptyDir under the read-only root" % what)
    ann = obj["spec"]["template"]["metadata"].get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true" and int(ann.get("prometheus.io/port", 0)) == 8080
          and ann.get("prometheus.io/path") == "/metrics", "%s: Prometheus scrape annotations name port 8080 /metrics" % what)
    check(shutdown_problems(spec) == [],
          "%s: a preStop sleep, then a grace period that covers it and kilnd's drain: %s"
          % (what, shutdown_problems(spec)))
    return c


def documented_environment():
    """The KILN_* variables docs/configuration.md (generated from kilnd's table) lists."""
    text = open(os.path.join(ROOT, "docs", "configuration.md")).read()
    return set(re.findall(r"`(KILN_[A-Z0-9_]+)`", text))


def check_config_accepted(container, what, extra_args=()):
    """kilnd --check-config with the container's environment (secrets replaced) and args;
    every KILN_ variable is one kilnd reads (kilnd ignores names it does not know)."""
    unknown = sorted({e["name"] for e in container.get("env", [])} - documented_environment())
    check(unknown == [], "%s: every environment variable is a kilnd setting: %s" % (what, unknown))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    for e in container.get("env", []):
        env[e["name"]] = e.get("value", "admin:check-config-token")
    tmp = tempfile.mkdtemp(prefix="kiln-manifests-")
    for k in ("KILN_DATA_DIR",):
        if k in env:
            env[k] = tmp
    # the model volume is mounted at /mnt/models in the cluster, and kilnd refuses a
    # model_repository that does not exist: here a folder stands in for it
    env = {k: tmp if v == "/mnt/models" else v for k, v in env.items()}
    args = [a if a != "/mnt/models" else tmp for a in list(container.get("args", [])) + list(extra_args)]
    r = subprocess.run([KILND, "--check-config", *args], env=env, capture_output=True, text=True)
    shutil.rmtree(tmp, ignore_errors=True)
    check(r.returncode == 0, "%s: kilnd --check-config accepts its settings: %s" % (what, (r.stdout + r.stderr).strip()[-300:]))


def metric_families():
    """The metric families (name -> type) a freshly started kilnd exports on /metrics."""
    data = tempfile.mkdtemp(prefix="kiln-manifests-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    proc = subprocess.Popen([KILND, "--port", "0", "--data-dir", data], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        portfile = os.path.join(data, "kilnd.port")
        deadline = time.monotonic() + 30
        while not os.path.exists(portfile) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        port = int(open(portfile).read())
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)
    return {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")}


def check_hpa(hpa, objects, families):
    ref = hpa["spec"]["scaleTargetRef"]
    check(any(o["kind"] == ref["kind"] and o["metadata"]["name"] == ref["name"] for o in objects),
          "the HPA scales %s/%s, which the base defines" % (ref["kind"], ref["name"]))
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    check(len(names) == 1 and names[0].endswith("_mean"), "the HPA scales on one per-pod mean: %s" % names)
    base = names[0][:-len("_mean")] if names else ""
    check(families.get(base) == "histogram" and "queue" in base,
          "its source %s is a queue-time histogram kilnd's /metrics exports" % base)
    doc = open(os.path.join(ROOT, "docs", "deployment.md")).read()
    check(('as: "%s"' % names[0]) in doc and (base + "_sum") in doc and (base + "_count") in doc,
          "docs/deployment.md gives the adapter rule that derives %s" % names[0])


def check_selectors(objects):
    pods = {name_of(o): o["spec"]["template"]["metadata"]["labels"] for o in objects if o["kind"] in ("Deployment", "StatefulSet")}
    for o in objects:
        sel = None
        if o["kind"] == "Service":
            sel = o["spec"]["selector"]
        elif o["kind"] == "PodDisruptionBudget":
            sel = o["spec"]["selector"]["matchLabels"]
        if sel is None:
            continue
        hits = [n for n, labels in pods.items() if all(labels.get(k) == v for k, v in sel.items())]
        check(len(hits) == 1, "%s selects exactly one workload's pods: %s" % (name_of(o), hits))


# KServe: the fields of the resources that kilnd's runtime relies on. The sets of known keys
# are those of KServe's ServingRuntimeSpec and PredictorSpec.model that this runtime can use.
RUNTIME_SPEC_KEYS = {"annotations", "supportedModelFormats", "protocolVersions", "containers", "volumes",
                     "multiModel", "disabled", "nodeSelector", "affinity", "tolerations", "imagePullSecrets",
                     "labels", "builtInAdapter", "grpcEndpoint", "grpcDataEndpoint", "httpDataEndpoint",
                     "replicas", "storageHelper", "hostIPC", "workerSpec"}
MODEL_KEYS = {"modelFormat", "runtime", "protocolVersion", "storageUri", "storage", "args", "env", "resources",
              "ports", "volumeMounts", "securityContext", "image", "name", "readinessProbe", "livenessProbe"}
STORAGE_SCHEMES = ("s3://", "gs://", "pvc://", "https://", "http://", "hdfs://", "webhdfs://", "oci://", "hf://")


def kserve_problems(runtime, isvc):
    p = []
    if runtime.get("apiVersion") != "serving.kserve.io/v1alpha1" or runtime.get("kind") != "ClusterServingRuntime":
        p.append("runtime apiVersion/kind")
    spec = runtime.get("spec", {})
    p += ["runtime spec.%s unknown" % k for k in set(spec) - RUNTIME_SPEC_KEYS]
    if "v2" not in spec.get("protocolVersions", []):
        p.append("protocolVersions lacks v2")
    formats = {f.get("name") for f in spec.get("supportedModelFormats", []) if isinstance(f, dict)}
    if not formats or None in formats:
        p.append("supportedModelFormats")
    containers = spec.get("containers", [])
    main = [c for c in containers if c.get("name") == "kserve-container"]
    if len(main) != 1:
        p.append("no single kserve-container")
    else:
        c = main[0]
        args = c.get("args", [])
        if "--model-repository" not in args or args[args.index("--model-repository") + 1:][:1] != ["/mnt/models"]:
            p.append("args lack --model-repository /mnt/models")
        if 8080 not in [q.get("containerPort") for q in c.get("ports", [])]:
            p.append("no HTTP port 8080")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runtime"},
           "spec": {"containers": containers, "volumes": spec.get("volumes", [])}}
    err = schema_errors(pod)
    if err:
        p.append("containers: " + err)
    else:
        p += ["runtime " + q for q in restricted_problems(pod["spec"])]
    if isvc.get("apiVersion") != "serving.kserve.io/v1beta1" or isvc.get("kind") != "InferenceService":
        p.append("InferenceService apiVersion/kind")
    model = isvc.get("spec", {}).get("predictor", {}).get("model", {})
    p += ["model.%s unknown" % k for k in set(model) - MODEL_KEYS]
    if model.get("runtime") != runtime.get("metadata", {}).get("name"):
        p.append("InferenceService runtime is not %s" % runtime.get("metadata", {}).get("name"))
    if model.get("modelFormat", {}).get("name") not in formats:
        p.append("modelFormat not among the runtime's formats")
    if model.get("protocolVersion", "v1") not in spec.get("protocolVersions", []):
        p.append("protocolVersion not among the runtime's")
    if not str(model.get("storageUri", "")).startswith(STORAGE_SCHEMES):
        p.append("storageUri scheme")
    return p


def check_broken_variants(deployment, runtime, isvc):
    """Each checker refuses what it should, so a pass above means something."""
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["livenessProb"] = bad["spec"]["template"]["spec"]["containers"][0].pop("livenessProbe")
    check("livenessProb" in schema_errors(bad), "the schema check refuses a misspelled field")
    bad = copy.deepcopy(deployment)
    bad["spec"]["replicas"] = "two"
    check(schema_errors(bad) != "", "the schema check refuses a string where an integer belongs")
    bad = copy.deepcopy(deployment)
    del bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"]
    check(restricted_problems(bad["spec"]["template"]["spec"]) == ["kilnd: readOnlyRootFilesystem"],
          "the profile check refuses a writable root file system")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0].pop("lifecycle", None)
    check(shutdown_problems(bad["spec"]["template"]["spec"]) != [], "the shutdown check wants a preStop sleep")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 15
    check(shutdown_problems(bad["spec"]["template"]["spec"]) != [],
          "the shutdown check refuses a grace period that only just covers the sleep and the drain")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "KILN_DRAIN_TIMEOUT_MS", "value": "25000"})
    check(shutdown_problems(bad["spec"]["template"]["spec"]) != [],
          "the shutdown check counts a longer drain_timeout_ms set in the environment")
    bad = copy.deepcopy(runtime)
    bad["spec"]["containers"][0]["name"] = "kilnd"
    check("no single kserve-container" in kserve_problems(bad, isvc), "the KServe check wants kserve-container")
    bad = copy.deepcopy(runtime)
    bad["spec"]["containers"][0]["port"] = 8080
    check(any("port" in q for q in kserve_problems(bad, isvc)), "the KServe check validates the runtime's containers")
    bad = copy.deepcopy(isvc)
    bad["spec"]["predictor"]["model"]["runtime"] = "triton"
    check(kserve_problems(runtime, bad) != [], "the KServe check wants the InferenceService on the kiln runtime")


def main():
    if shutil.which("kubectl") is None:
        check(False, "kubectl is installed (deploy/install-deps.sh: kubernetes-client)")
        return 1
    objects = render("deploy/k8s")
    kinds = sorted(o["kind"] for o in objects)
    check(kinds == ["Deployment", "HorizontalPodAutoscaler", "PersistentVolumeClaim", "PodDisruptionBudget",
                    "Service", "Service", "StatefulSet"], "the base renders the expected objects: %s" % kinds)
    for o in objects:
        err = schema_errors(o)
        check(err == "", "%s validates against Kubernetes %s: %s" % (name_of(o), " and ".join(K8S_VERSIONS), err))
    by = {name_of(o): o for o in objects}
    server = check_kilnd_pod(by["Deployment/kilnd"], models_read_only=True)
    trainer = check_kilnd_pod(by["StatefulSet/kilnd-trainer"], models_read_only=False)
    claims = by["StatefulSet/kilnd-trainer"]["spec"].get("volumeClaimTemplates", [])
    check([t["metadata"]["name"] for t in claims] == ["data"], "the trainer's data folder is a persistent claim")
    check(by["Deployment/kilnd"]["spec"]["template"]["spec"]["securityContext"].get("fsGroup") == 10001,
          "the volumes are group-owned by the pod's group (fsGroup)")
    check_config_accepted(server, "Deployment/kilnd")
    check_config_accepted(trainer, "StatefulSet/kilnd-trainer")
    check_selectors(objects)
    check_hpa(by["HorizontalPodAutoscaler/kilnd"], objects, metric_families())

    kserve = render("deploy/k8s/kserve")
    runtime = next((o for o in kserve if o.get("kind") == "ClusterServingRuntime"), {})
    isvc = next((o for o in kserve if o.get("kind") == "InferenceService"), {})
    problems = kserve_problems(runtime, isvc)
    check(problems == [], "the KServe runtime and InferenceService hold the fields that matter: %s" % problems)
    if runtime:
        check_config_accepted(runtime["spec"]["containers"][0], "ClusterServingRuntime/kiln")
    check_broken_variants(by["Deployment/kilnd"], runtime, isvc)
    print("%d passed, %d failed" % (len(PASSED), len(FAILURES)))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
