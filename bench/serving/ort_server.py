#!/usr/bin/env python3
"""The serving bench's peer: a small Python HTTP server answering KServe v2 JSON inference with
ONNX Runtime, the way one would write it by hand — http.server's ThreadingHTTPServer (a thread per
connection, HTTP/1.1 keep-alive), json, numpy and one InferenceSession shared by every thread.

It is set up at its best: TCP_NODELAY and one write per response (headers and body together, so
Nagle and delayed ACKs never stall a reply), intra_op_num_threads given on the command line (the
bench passes the core count), sequential execution mode and every graph optimization on.

Usage: ort_server.py MODEL_ONNX MODEL_NAME PORT_FILE [INTRA_OP_THREADS]
Listens on a free loopback port and writes it to PORT_FILE.
"""
import http.server
import json
import socket
import sys

import numpy as np
import onnxruntime as ort

DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}

path, model_name, port_file = sys.argv[1], sys.argv[2], sys.argv[3]
opts = ort.SessionOptions()
opts.intra_op_num_threads = int(sys.argv[4]) if len(sys.argv) > 4 else 0
opts.inter_op_num_threads = 1
opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
output_names = [o.name for o in session.get_outputs()]
infer_path = "/v2/models/%s/infer" % model_name


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def reply(self, status, body):
        head = ("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % (status, "OK" if status == 200 else "Error", len(body))).encode()
        self.wfile.write(head + body)

    def do_GET(self):
        self.reply(200 if self.path in ("/v2/health/ready", "/v2/health/live") else 404, b"")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != infer_path:
            self.reply(404, b'{"error":"unknown model"}')
            return
        try:
            req = json.loads(body)
            feeds = {i["name"]: np.asarray(i["data"], dtype=DTYPES[i["datatype"]]).reshape(i["shape"])
                     for i in req["inputs"]}
            outs = session.run(output_names, feeds)
        except Exception as e:  # noqa: BLE001 — any bad request is a 400 with the reason
            self.reply(400, json.dumps({"error": str(e)}).encode())
            return
        resp = {"model_name": model_name, "outputs": [
            {"name": n, "datatype": NAMES.get(o.dtype, "FP32"), "shape": list(o.shape), "data": o.ravel().tolist()}
            for n, o in zip(output_names, outs)]}
        if "id" in req:
            resp["id"] = req["id"]
        self.reply(200, json.dumps(resp).encode())


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


srv = Server(("127.0.0.1", 0), Handler)
with open(port_file + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
import os  # noqa: E402 — only for the atomic rename of the port file
os.rename(port_file + ".tmp", port_file)
srv.serve_forever()
