#!/usr/bin/env python3
"""What a job spec promises, against a real kilnd: settings are applied or refused, never ignored;
what a dry run of the model shows is a 400 at submission; and a run ends honestly.

- refused at submission, every problem in one answer: a grad_accum that is not a positive integer,
  a hyper-parameter the optimizer kind does not have, a scheduler setting of another kind, a loss
  kind that is not a name, nesterov without momentum, a register_as past the 128-character limit;
- refused at submission by a dry run of the model on one item of the data's shape: a Linear that
  does not take the items, fewer class scores than the IDX labels' classes, a repository model for
  four features fine-tuned on 28x28 images;
- applied: grad_accum 4 makes one optimizer step of four batches;
- logits wider than the classes train and are served at their width;
- a CSV label of 999999 with three class scores fails naming the class count, not out of memory;
- a run whose loss becomes NaN fails naming the epoch and step, and registers nothing.

Usage: test_job_checks.py KILND   (KILN_TEST_PORT: a fixed port for kilnd instead of a free one)
"""
import gzip
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kilnd_harness as H  # noqa: E402

KILND = sys.argv[1]
PORT = int(os.environ.get("KILN_TEST_PORT", "0"))
check = H.check


def mlp(width=3, in_features=4):
    m = json.loads(json.dumps(H.MLP))
    m["nodes"][0]["config"]["in_features"] = in_features
    m["nodes"][2]["config"]["out_features"] = width
    return m


def write_idx(folder):
    """Two 28x28 images labelled 0 and 9, as Fashion-MNIST's files are laid out."""
    images = os.path.join(folder, "images.gz")
    labels = os.path.join(folder, "labels.gz")
    with gzip.open(images, "wb") as f:
        f.write(bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28]) + bytes(2 * 28 * 28))
    with gzip.open(labels, "wb") as f:
        f.write(bytes([0, 0, 8, 1, 0, 0, 0, 2, 0, 9]))
    return {"type": "idx", "train_images": images, "train_labels": labels}


def flat_linear(in_features, width):
    return {"inputs": ["x"], "nodes": [
        {"name": "flat", "op": "flatten", "start_dim": 1, "end_dim": -1, "inputs": ["x"]},
        {"name": "fc", "layer": "Linear", "config": {"in_features": in_features, "out_features": width},
         "inputs": ["flat"]}], "outputs": ["fc"]}


def refused(d, body, fields_and_words, what):
    st, j = d.req("POST", "/v1/jobs", body)
    problems = j.get("problems", []) if isinstance(j, dict) else []
    missing = [fw for fw in fields_and_words if not any(p.startswith(fw[0] + ":") and fw[1] in p for p in problems)]
    check(st == 400 and not missing, "%s -> 400 naming every problem: %s %s (missing %s)" % (what, st, j, missing))


def finished(d, body):
    st, j = d.req("POST", "/v1/jobs", body)
    if st != 201:
        return {"state": "refused", "error": j}
    return d.wait_state(j["id"], ["succeeded", "failed", "cancelled"])


def test_refused_settings(d):
    body = H.spec("settings", optimizer={"kind": "adam", "momentum": 0.9, "grad_accum": "banana"},
                  loss={"kind": 5}, scheduler={"kind": "cosine", "gamma": 0.5, "step_size": 3})
    refused(d, body, [("optimizer.grad_accum", "must be an integer"), ("optimizer.momentum", "adam has no momentum"),
                      ("loss.kind", "must be a loss name"), ("scheduler.gamma", "cosine has no gamma"),
                      ("scheduler.step_size", "cosine has no step_size")], "settings that would be ignored")
    refused(d, H.spec("neg", optimizer={"kind": "sgd", "grad_accum": -7}),
            [("optimizer.grad_accum", "-7 is out of range")], "grad_accum -7")
    refused(d, H.spec("nesterov", optimizer={"kind": "sgd", "nesterov": True}),
            [("optimizer.nesterov", "needs momentum > 0")], "nesterov without momentum")
    refused(d, H.spec("n" * 200), [("register_as", "a model name has at most 128")], "a 200-character register_as")


def test_dry_run(d):
    idx = write_idx(H.DATA)
    refused(d, H.spec("narrow", model=flat_linear(784, 5), data=idx),
            [("model", "gives 5 class scores an item but the data has 10 classes")], "5 scores for 10 classes")
    refused(d, H.spec("linear100", model=flat_linear(100, 10), data=idx),
            [("model", "does not take the data's items (one item is a [1, 1, 28, 28] input)")],
            "a Linear of 100 inputs after flattening 784")
    refused(d, H.spec("csvwidth", model=mlp(in_features=7)),
            [("model", "does not take the data's items (one item is a [1, 4] input)")],
            "a Linear of 7 inputs for a CSV of 4 features")
    # a registered model for four features fine-tuned on images
    job = finished(d, H.spec("iris_iris", epochs=1))
    check(job["state"] == "succeeded", "a model to fine-tune is registered: %s" % job)
    refused(d, H.spec("tuned", model={"repository": "iris_iris"}, data=idx),
            [("model", "does not take the data's items (one item is a [1, 1, 28, 28] input)")],
            "fine-tuning a model of four features on 28x28 images")


def test_grad_accum(d):
    # 480 training rows in batches of 16: 30 batches an epoch, 8 updates of four (the last of two)
    job = finished(d, H.spec("accum", epochs=2, optimizer={"kind": "sgd", "lr": 0.05, "grad_accum": 4}))
    st, rows = d.req("GET", "/v1/jobs/%d/metrics" % job.get("id", 0))
    steps = [e["step"] for e in rows.get("metrics", [])] if st == 200 else []
    check(job["state"] == "succeeded" and steps == [8, 16],
          "grad_accum 4: one optimizer step every four batches (steps after each epoch %s)" % steps)


def test_wide_output(d):
    job = finished(d, H.spec("wide", epochs=2, model=mlp(width=10)))
    st, meta = d.req("GET", "/v2/models/wide")
    shape = meta["outputs"][0]["shape"] if st == 200 else None
    check(job["state"] == "succeeded" and shape == [-1, 10],
          "10 class scores for 3 classes train and serve at width 10: %s %s %s" % (job["state"], job.get("error"),
                                                                                  shape))


def test_huge_label(d):
    path = os.path.join(H.DATA, "huge_label.csv")
    H.write_csv(path, 60, 5)
    with open(path, "a") as f:
        f.write("0,0,0,0,999999\n")
    body = H.spec("huge", epochs=1)
    body["data"]["train"] = path
    job = finished(d, body)
    err = job.get("error") or ""
    check(job["state"] == "failed" and "1000000 classes" in err and "out of memory" not in err,
          "a label of 999999 with 3 class scores fails naming the class count: %s" % err)


def test_nan(d):
    job = finished(d, H.spec("diverged", epochs=2, optimizer={"kind": "sgd", "lr": 100}))
    err = job.get("error") or ""
    st, _ = d.req("GET", "/v2/models/diverged/ready")
    check(job["state"] == "failed" and "loss became NaN at epoch " in err and " step " in err and st != 200
          and not os.path.exists(os.path.join(d.data, "models", "diverged")),
          "a diverged run fails naming where, and registers nothing: %s %s (ready %s)" % (job["state"], err, st))
    # its progress is where it got to, though it failed between two of the store's updates
    # (the steps before the failing one, of epochs x batches)
    m = re.search(r" step (\d+)", err)
    st, steps = d.req("GET", "/v1/jobs/%d/metrics?kind=step&limit=1000" % job["id"])
    rows = steps.get("metrics", []) if st == 200 else []
    want = (int(m.group(1)) - 1) / (2 * rows[0]["batches"]) if m and rows else None
    check(want is not None and want > 1 / (2 * rows[0]["batches"]) and abs(job.get("progress", -1) - want) < 1e-9,
          "a failed run's progress is the steps it made: %s, want %s" % (job.get("progress"), want))


def main():
    d = H.Daemon(KILND, "checks", port=PORT)
    try:
        test_refused_settings(d)
        test_dry_run(d)
        test_grad_accum(d)
        test_wide_output(d)
        test_huge_label(d)
        test_nan(d)
    finally:
        d.stop()
    check(d.proc.returncode == 0, "kilnd exits 0 after SIGTERM (%s); log %s" % (d.proc.returncode, d.log))
    H.finish()
    H.cleanup()


if __name__ == "__main__":
    main()
