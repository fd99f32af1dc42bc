#!/usr/bin/env python3
"""Triton's system shared-memory extension against a real kilnd, over HTTP and gRPC, driven by
tritonclient.utils.shared_memory and tritonclient.http / tritonclient.grpc, unmodified: register,
status, infer with inputs and outputs in shared memory for every datatype kilnd serves (the
results compared with the same request sent without shared memory), unregister, re-register;
the bad cases (a key that does not exist, an object smaller than the region, a duplicate name,
a bad name, a missing or read-only token, an unknown region, an offset past the region, a size
too small for the tensor or for the output, an object shrunk after registering, unregistering
while requests use the region) with the daemon serving afterwards; CUDA shared memory refused.

Usage: test_shm.py KILND FIXTURES   (FIXTURES is tests/fixtures)
"""
import os
import queue
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_grpc as g  # noqa: E402  (re-runs under the test Python, as test_grpc.py does)

import numpy as np  # noqa: E402
import tritonclient.grpc as tg  # noqa: E402
import tritonclient.http as th  # noqa: E402
import tritonclient.utils.shared_memory as shm  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

check, AUTH, READ, X, WANT, TYPES = g.check, g.AUTH, g.READ, g.X, g.WANT, g.TYPES
PID = os.getpid()


def fails(fn, codes, text, what):
    """fn() must raise InferenceServerException whose status is one of codes and whose message has text."""
    try:
        fn()
    except InferenceServerException as e:
        st, m = str(e.status()), e.message() or ""
        check(st in codes and text in m, "%s: expected %s '%s', got %s %r" % (what, codes, text, st, m))
        return
    check(False, "%s: expected %s, got success" % (what, codes))


class Proto:
    """One protocol's client and its way of naming statuses."""

    def __init__(self, name, d):
        self.name = name
        if name == "http":
            self.c, self.m = th.InferenceServerClient("127.0.0.1:%d" % d.port), th
        else:
            self.c, self.m = tg.InferenceServerClient(d.target), tg

    def code(self, http, grpc):
        return [str(http)] if self.name == "http" else ["StatusCode." + grpc]

    def status(self, name=""):
        s = self.c.get_system_shared_memory_status(name, headers=AUTH, **({} if self.name == "http" else
                                                                          {"as_json": True}))
        if self.name == "grpc":
            s = [{"name": r["name"], "key": r["key"], "offset": int(r.get("offset", 0)),
                  "byte_size": int(r["byte_size"])} for r in s.get("regions", {}).values()]
        return sorted(s, key=lambda r: r["name"])

    def infer(self, model, inputs, outputs=None, headers=AUTH):
        """inputs: [(name, datatype, array, shm (region, offset) or None)]; outputs: [(name, shm or None)]."""
        ins = []
        for n, dt, a, where in inputs:
            i = self.m.InferInput(n, list(a.shape), dt)
            if where:
                i.set_shared_memory(where[0], a.nbytes, offset=where[1])
            else:
                i.set_data_from_numpy(a)
            ins.append(i)
        outs = None
        if outputs is not None:
            outs = []
            for n, where in outputs:
                o = self.m.InferRequestedOutput(n)
                if where:
                    o.set_shared_memory(where[0], where[2], offset=where[1])
                outs.append(o)
        # a copy: tritonclient.http adds Inference-Header-Content-Length to the dict it is given
        return self.c.infer(model, ins, outputs=outs, headers=dict(headers))


def dtype_arrays():
    xs = g.dtype_inputs(rows=3)
    return [("in_" + n, dt, xs[n]) for n, _, dt in TYPES], xs


def test_protocol(p, d):
    tag = "%s: " % p.name
    key_in, key_out = "/kiln_test_in_%d_%s" % (PID, p.name), "/kiln_test_out_%d_%s" % (PID, p.name)
    ins, xs = dtype_arrays()
    in_bytes = sum(a.nbytes for _, _, a in ins)
    in_size = max(in_bytes, X.nbytes)   # the input region holds the dtype inputs, or mnist's input
    out_offset = 64     # the output region starts this far into its object
    h_in = shm.create_shared_memory_region("in", key_in, in_size)
    h_out = shm.create_shared_memory_region("out", key_out, out_offset + in_bytes + 16)
    try:
        check(p.status() == [], tag + "no region registered at first")
        p.c.register_system_shared_memory("in_" + p.name, key_in, in_size, headers=AUTH)
        p.c.register_system_shared_memory("out_" + p.name, key_out, in_bytes + 16, offset=out_offset, headers=AUTH)
        st = p.status()
        check(st == [{"name": "in_" + p.name, "key": key_in, "offset": 0, "byte_size": in_size},
                     {"name": "out_" + p.name, "key": key_out, "offset": out_offset, "byte_size": in_bytes + 16}],
              tag + "status lists both regions: %s" % st)
        one = p.status("out_" + p.name)
        check(len(one) == 1 and one[0]["offset"] == out_offset, tag + "status of one region: %s" % one)

        # Every datatype: inputs packed into one region, outputs into another at the same offsets.
        offs, at = {}, 0
        for n, dt, a in ins:
            offs[n] = at
            at += a.nbytes
        shm.set_shared_memory_region(h_in, [a for _, _, a in ins])
        r = p.infer("dtypes", [(n, dt, a, ("in_" + p.name, offs[n])) for n, dt, a in ins],
                    [("out_" + n[3:], ("out_" + p.name, offs[n], a.nbytes)) for n, dt, a in ins])
        plain = p.infer("dtypes", [(n, dt, a, None) for n, dt, a in ins])
        for n, t, dt in TYPES:
            o = r.get_output("out_" + n)
            shape = [int(s) for s in (o["shape"] if p.name == "http" else o.shape)]
            got = shm.get_contents_as_numpy(h_out, np.dtype(t), shape, offset=out_offset + offs["in_" + n])
            want = np.logical_not(xs[n]) if t == np.bool_ else (xs[n] + xs[n]).astype(t)
            check(shape == list(xs[n].shape) and np.array_equal(got, want) and
                  np.array_equal(got, plain.as_numpy("out_" + n)),
                  tag + "%s in and out through shared memory equals the answer without it" % dt)

        # Some inputs in shared memory, the others in the request (raw_input_contents then holds only
        # those, in order), the outputs in the response.
        mixed = [(n, dt, a, ("in_" + p.name, offs[n]) if k % 2 == 0 else None) for k, (n, dt, a) in enumerate(ins)]
        r = p.infer("dtypes", mixed)
        check(all(np.array_equal(r.as_numpy("out_" + n[3:]), plain.as_numpy("out_" + n[3:])) for n, _, _ in ins),
              tag + "every other input in shared memory: the same answers")

        # An input in shared memory, the output in the response.
        shm.set_shared_memory_region(h_in, [X])
        r = p.infer("mnist_mlp", [("input", "FP32", X, ("in_" + p.name, 0))])
        check(np.allclose(r.as_numpy("logits"), WANT, atol=1e-4), tag + "mnist_mlp with its input in shared memory")

        # Bad cases.
        code = p.code
        fails(lambda: p.c.register_system_shared_memory("nokey", "/kiln_test_missing_%d" % PID, 64, headers=AUTH),
              code(400, "INVALID_ARGUMENT"), "unable to open", tag + "a key that does not exist")
        fails(lambda: p.c.register_system_shared_memory("big", key_in, in_size + 1, headers=AUTH),
              code(400, "INVALID_ARGUMENT"), "fewer than offset + byte_size", tag + "a region past its object")
        fails(lambda: p.c.register_system_shared_memory("late", key_in, 8, offset=in_size, headers=AUTH),
              code(400, "INVALID_ARGUMENT"), "fewer than offset + byte_size", tag + "an offset past its object")
        fails(lambda: p.c.register_system_shared_memory("in_" + p.name, key_in, 8, headers=AUTH),
              code(409, "ALREADY_EXISTS"), "already registered", tag + "a duplicate name")
        fails(lambda: p.c.register_system_shared_memory("bad name!", key_in, 8, headers=AUTH),
              code(400, "INVALID_ARGUMENT"), "region name", tag + "a malformed name")
        fails(lambda: p.c.register_system_shared_memory("x", "../etc/passwd", 8, headers=AUTH),
              code(400, "INVALID_ARGUMENT"), "key is '/'", tag + "a malformed key")
        if p.name == "http":  # past 2^53: named, not the register body's generic shape
            fails(lambda: p.c.register_system_shared_memory("x", key_in, 8, offset=2 ** 60, headers=AUTH),
                  code(400, "INVALID_ARGUMENT"), "offset is 1.15292e+18, larger than any shared-memory region",
                  tag + "an offset past 2^53")
        if p.name == "http":  # JSON's \u0000 would cut the key short unseen ("/kiln..." then "../x")
            fails(lambda: p.c.register_system_shared_memory("x", key_in + "\x00../../etc", 8, headers=AUTH),
                  code(400, "INVALID_ARGUMENT"), "holds \\u0000 (a NUL character)", tag + "a key holding a NUL")
        fails(lambda: p.c.register_system_shared_memory("x", key_in, 8), code(401, "UNAUTHENTICATED"), "",
              tag + "register without a token")
        fails(lambda: p.c.register_system_shared_memory("x", key_in, 8, headers={"authorization": "Bearer " + READ}),
              code(403, "PERMISSION_DENIED"), "admin scope", tag + "register with a read token")
        fails(lambda: p.c.unregister_system_shared_memory(headers={"authorization": "Bearer " + READ}),
              code(403, "PERMISSION_DENIED"), "admin scope", tag + "unregister with a read token")
        fails(lambda: p.status("nosuch"), code(404, "NOT_FOUND"), "no shared memory region 'nosuch'",
              tag + "status of an unknown region")
        fails(lambda: p.c.unregister_system_shared_memory("nosuch", headers=AUTH), code(404, "NOT_FOUND"),
              "no shared memory region", tag + "unregister of an unknown region")
        fails(lambda: p.infer("mnist_mlp", [("input", "FP32", X, ("nosuch", 0))]), code(400, "INVALID_ARGUMENT"),
              "no shared memory region 'nosuch'", tag + "infer from an unknown region")
        fails(lambda: p.infer("mnist_mlp", [("input", "FP32", X, ("in_" + p.name, in_size - 16))]),
              code(400, "INVALID_ARGUMENT"), "past the end of region", tag + "an input offset past the region")

        def short_input():
            i = p.m.InferInput("input", list(X.shape), "FP32")
            i.set_shared_memory("in_" + p.name, X.nbytes - 4)
            return p.c.infer("mnist_mlp", [i], headers=dict(AUTH))
        fails(short_input, code(400, "INVALID_ARGUMENT"), "shape and datatype need", tag + "a byte size too small")
        fails(lambda: p.infer("mnist_mlp", [("input", "FP32", X, None)], [("logits", ("out_" + p.name, 0, 8))]),
              code(400, "INVALID_ARGUMENT"), "holds %d bytes" % WANT.nbytes, tag + "an output larger than its slice")
        fails(lambda: p.infer("mnist_mlp", [("input", "FP32", X, None)],
                              [("logits", ("out_" + p.name, in_bytes, 40))]),
              code(400, "INVALID_ARGUMENT"), "past the end of region", tag + "an output offset past the region")

        # Unregister, then the region is gone; re-register the same name and it works again.
        p.c.unregister_system_shared_memory("in_" + p.name, headers=AUTH)
        check([r["name"] for r in p.status()] == ["out_" + p.name], tag + "unregister removes only that region")
        fails(lambda: p.infer("mnist_mlp", [("input", "FP32", X, ("in_" + p.name, 0))]),
              code(400, "INVALID_ARGUMENT"), "no shared memory region", tag + "infer from an unregistered region")
        p.c.register_system_shared_memory("in_" + p.name, key_in, in_size, headers=AUTH)
        shm.set_shared_memory_region(h_in, [X])
        r = p.infer("mnist_mlp", [("input", "FP32", X, ("in_" + p.name, 0))],
                    [("logits", ("out_" + p.name, 8, WANT.nbytes))])
        got = shm.get_contents_as_numpy(h_out, np.float32, list(WANT.shape), offset=out_offset + 8)
        check(np.allclose(got, WANT, atol=1e-4), tag + "re-registered, input and output in shared memory")

        # ModelStreamInfer with the input and the output in shared memory, beside plain requests.
        if p.name == "grpc":
            got_q = queue.Queue()
            sc = tg.InferenceServerClient(d.target)
            sc.start_stream(callback=lambda result, error: got_q.put((result, error)), headers=AUTH)
            for k in range(6):
                i = tg.InferInput("input", list(X.shape), "FP32")
                o = tg.InferRequestedOutput("logits")
                if k % 2 == 0:
                    i.set_shared_memory("in_grpc", X.nbytes)
                    o.set_shared_memory("out_grpc", WANT.nbytes, offset=8)
                else:
                    i.set_data_from_numpy(X)
                sc.async_stream_infer("mnist_mlp", [i], outputs=[o], request_id="s%d" % k)
            answers = [got_q.get(timeout=30) for _ in range(6)]
            sc.stop_stream()
            sc.close()
            got = shm.get_contents_as_numpy(h_out, np.float32, list(WANT.shape), offset=out_offset + 8)
            ok = all(e is None for _, e in answers) and np.allclose(got, WANT, atol=1e-4) and all(
                np.allclose(r.as_numpy("logits"), WANT, atol=1e-4) for r, _ in answers[1::2])
            check(ok and [r.get_response().id for r, _ in answers] == ["s%d" % k for k in range(6)],
                  tag + "ModelStreamInfer with shared memory and without, in order: %s" % [e for _, e in answers])

        # Unregistered while requests use it: each answers right or says the region is gone.
        if p.name == "http":
            hc = th.InferenceServerClient("127.0.0.1:%d" % d.port, concurrency=8)
            i = th.InferInput("input", list(X.shape), "FP32")
            i.set_shared_memory("in_" + p.name, X.nbytes)
            pend = [hc.async_infer("mnist_mlp", [i], headers=dict(AUTH)) for _ in range(32)]
            p.c.unregister_system_shared_memory("in_" + p.name, headers=AUTH)
            good = bad = 0
            for q in pend:
                try:
                    good += np.allclose(q.get_result().as_numpy("logits"), WANT, atol=1e-4)
                except InferenceServerException as e:
                    bad += "no shared memory region" in (e.message() or "")
            hc.close()
            check(good + bad == 32, tag + "unregistering under load: %d answered, %d refused, none wrong" % (good, bad))
            p.c.register_system_shared_memory("in_" + p.name, key_in, in_size, headers=AUTH)

        # An object shrunk after registering is refused, not read past its end.
        path = "/dev/shm/" + key_in[1:]
        if os.path.exists(path):
            os.truncate(path, 16)
            fails(lambda: p.infer("mnist_mlp", [("input", "FP32", X, ("in_" + p.name, 0))]),
                  code(400, "INVALID_ARGUMENT"), "shrunk", tag + "an object shrunk after registering")
            os.truncate(path, in_size)
        else:
            print("skipped: the shrunk-object check needs /dev/shm")

        p.c.unregister_system_shared_memory(headers=AUTH)
        check(p.status() == [], tag + "unregister with no name removes every region")
        fails(lambda: p.c.get_cuda_shared_memory_status(headers=AUTH), code(501, "UNIMPLEMENTED"), "CUDA",
              tag + "CUDA shared memory is refused")
        check(p.c.is_server_live() and p.c.is_model_ready("mnist_mlp", headers=AUTH),
              tag + "the daemon serves after every bad case")
    finally:
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)


def main():
    d = g.Daemon()
    try:
        c = tg.InferenceServerClient(d.target)
        check(g.wait_ready(c, "mnist_mlp") and g.wait_ready(c, "dtypes"), "both models load")
        for name in ("http", "grpc"):
            test_protocol(Proto(name, d), d)
        # Regions registered at shutdown are unmapped with the table (ASan's leak check sees it).
        key = "/kiln_test_left_%d" % PID
        h = shm.create_shared_memory_region("left", key, 64)
        c.register_system_shared_memory("left", key, 64, headers=AUTH)
        shm.destroy_shared_memory_region(h)
        c.close()
    finally:
        d.stop()
        if g.FAILURES:
            print(open(d.log).read()[-4000:])
        shutil.rmtree(g.TMP, ignore_errors=True)
    if g.FAILURES:
        print("%d check(s) failed:" % len(g.FAILURES))
        for f in g.FAILURES:
            print("  " + f)
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
