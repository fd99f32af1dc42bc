"""The kilnd client: KServe v2 health, metadata, the model repository and inference (JSON or the
binary tensor data extension), and training jobs under /v1/jobs (submit, list, cancel, resume,
server-sent events with reconnection, wait, the metric history and the logs).

One HTTP/1.1 connection per call (http.client), so a Client may be shared by threads.
"""
import http.client
import json
import math
import os
import socket
import time
import urllib.parse

from .tensors import Tensor

FINAL_STATES = ("succeeded", "failed", "cancelled")


class KilnError(Exception):
    """kilnd answered with an error: .status (the HTTP status), .message (its "error"), and
    .problems (every problem of a rejected job spec, else an empty list)."""

    def __init__(self, message, status=None, problems=None):
        super().__init__(message if status is None else "HTTP %d: %s" % (status, message))
        self.status = status
        self.message = message
        self.problems = list(problems or [])


class KilnConnectionError(KilnError):
    """kilnd could not be reached (status None)."""

    def __init__(self, message):
        super().__init__(message, None)


class Event:
    """One server-sent event of a job: .id (int), .type ("state", "log", "step", "epoch",
    "checkpoint", "model") and .data (the parsed JSON)."""

    __slots__ = ("id", "type", "data")

    def __init__(self, id, type, data):
        self.id, self.type, self.data = id, type, data

    def __repr__(self):
        return "Event(%r, %r, %r)" % (self.id, self.type, self.data)


class InferResult:
    """An inference answer: .model_name, .model_version, .id and .outputs (a list of Tensor)."""

    def __init__(self, header, outputs):
        self.model_name = header.get("model_name")
        self.model_version = header.get("model_version")
        self.id = header.get("id")
        self.outputs = outputs

    def output(self, name=None):
        """The output of that name; without a name, the only (or first) output."""
        if name is None:
            if not self.outputs:
                raise KeyError("the answer has no outputs")
            return self.outputs[0]
        for t in self.outputs:
            if t.name == name:
                return t
        raise KeyError("no output %r (outputs: %s)" % (name, [t.name for t in self.outputs]))

    def __repr__(self):
        return "InferResult(%r, outputs=%s)" % (self.model_name, self.outputs)


def _config_file():
    """The CLI's config file, as the kiln CLI reads it: $KILN_CLI_CONFIG, else
    $XDG_CONFIG_HOME/kiln/cli.json or ~/.config/kiln/cli.json ($KILN_CONFIG is kilnd's file and
    is not read). A missing default file is {}; a named file that cannot be read, one that is not
    a JSON object of "url" and "token" strings, or one with another key raises ValueError (a
    misspelt "token" would otherwise end in a 401 with no hint)."""
    path = os.environ.get("KILN_CLI_CONFIG")
    named = bool(path)
    if not named:
        base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
        path = os.path.join(base, "kiln", "cli.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except FileNotFoundError:
        if named:
            raise ValueError("config file %s (KILN_CLI_CONFIG) does not exist" % path) from None
        return {}
    except (OSError, ValueError) as e:
        raise ValueError("config file %s: %s" % (path, e)) from None
    if not isinstance(cfg, dict) or any(not isinstance(cfg.get(k, ""), str) for k in ("url", "token")):
        raise ValueError('config file %s: expected a JSON object {"url": "http://...", "token": "..."}' % path)
    unknown = sorted(set(cfg) - {"url", "token"})
    if unknown:
        raise ValueError("config file %s: unknown key%s %s (it may hold url and token; kilnd's file is another, "
                         "named by KILN_CONFIG)" % (path, "s" if len(unknown) > 1 else "",
                                                    ", ".join(repr(k) for k in unknown)))
    return cfg


class Client:
    def __init__(self, url=None, token=None, timeout=60.0):
        """url: $KILN_URL, then the CLI config file's "url" ($KILN_CLI_CONFIG, else
        ~/.config/kiln/cli.json; ValueError for a file with an unknown key), then
        http://127.0.0.1:8080; token likewise ($KILN_TOKEN, the file's "token"). timeout:
        seconds per request."""
        cfg = None
        if not url:
            url = os.environ.get("KILN_URL")
        if not url:
            cfg = _config_file()
            url = cfg.get("url")
        if token is None:
            token = os.environ.get("KILN_TOKEN")
        if token is None:
            cfg = _config_file() if cfg is None else cfg
            token = cfg.get("token")
        url = url or "http://127.0.0.1:8080"
        if "://" not in url:
            url = "http://" + url
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("url must be http://host[:port] or https://host[:port]: %r" % url)
        self.url = url.rstrip("/")
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")
        self.token = token or None
        self.timeout = timeout
        # events(): how long kilnd may stay unreachable before the stream gives up
        self.reconnect_timeout = 60.0
        self._meta = {}

    # ---- HTTP ----

    def _connect(self, timeout):
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout)

    def _headers(self, extra=None):
        h = {"Accept": "application/json"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        h.update(extra or {})
        return h

    def _send(self, method, path, body=None, headers=None, timeout=None):
        """(status, headers, raw body); KilnConnectionError when kilnd cannot be reached."""
        conn = self._connect(self.timeout if timeout is None else timeout)
        try:
            conn.request(method, self._prefix + path, body=body, headers=self._headers(headers))
            r = conn.getresponse()
            return r.status, r, r.read()
        except (OSError, http.client.HTTPException) as e:
            raise KilnConnectionError("cannot reach kilnd at %s: %s" % (self.url, e or type(e).__name__)) from None
        finally:
            conn.close()

    @staticmethod
    def _error(status, raw):
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            return KilnError(doc["error"], status, doc.get("problems"))
        return KilnError(raw.decode("utf-8", "replace").strip() or http.client.responses.get(status, "error"), status)

    def _json(self, method, path, body=None, ok=(200,)):
        data = None if body is None else _dumps(body)
        st, _, raw = self._send(method, path, data, {"Content-Type": "application/json"} if data else None)
        if st not in ok:
            raise self._error(st, raw)
        return json.loads(raw) if raw else None

    def _status(self, path):
        st, _, _ = self._send("GET", path)
        return st == 200

    # ---- health, metadata, repository ----

    def live(self):
        return self._status("/v2/health/live")

    def ready(self):
        return self._status("/v2/health/ready")

    def server_metadata(self):
        return self._json("GET", "/v2")

    @staticmethod
    def _model_path(name, version=None):
        p = "/v2/models/" + urllib.parse.quote(name, safe="")
        return p + ("/versions/%s" % int(version) if version is not None else "")

    def model_metadata(self, name, version=None):
        return self._json("GET", self._model_path(name, version))

    def model_ready(self, name, version=None):
        return self._status(self._model_path(name, version) + "/ready")

    def models(self):
        return self._json("POST", "/v2/repository/index", {})

    def load(self, name):
        self._meta.clear()
        return self._json("POST", "/v2/repository/models/%s/load" % urllib.parse.quote(name, safe=""))

    def unload(self, name):
        self._meta.clear()
        return self._json("POST", "/v2/repository/models/%s/unload" % urllib.parse.quote(name, safe=""))

    # ---- inference ----

    def _inputs_meta(self, name, version):
        key = (name, version)
        if key not in self._meta:
            self._meta[key] = self.model_metadata(name, version).get("inputs", [])
        return self._meta[key]

    def _as_tensors(self, name, inputs, version):
        """inputs as a list of Tensor; plain values take their name and datatype from the model."""
        if isinstance(inputs, Tensor):
            return [inputs]
        if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(t, Tensor) for t in inputs):
            return list(inputs)
        if isinstance(inputs, dict):
            items = list(inputs.items())
            if not all(isinstance(t, Tensor) for _, t in items):
                meta = {m["name"]: m for m in self._inputs_meta(name, version)}
            else:
                meta = {}
        else:
            meta_list = self._inputs_meta(name, version)
            if len(meta_list) != 1:
                raise ValueError("model %s has %d inputs: pass a dict name -> tensor" % (name, len(meta_list)))
            items = [(meta_list[0]["name"], inputs)]
            meta = {meta_list[0]["name"]: meta_list[0]}
        out = []
        for key, value in items:
            if isinstance(value, Tensor):
                out.append(value)
                continue
            # an array is not cast to the model's datatype (astype truncates and wraps): its
            # values are checked as a list's are, and refused with ValueError when they do not fit
            out.append(Tensor(key, value, datatype=meta.get(key, {}).get("datatype")))
        return out

    def infer(self, name, inputs, outputs=None, binary=False, version=None, request_id=None):
        """POST /v2/models/{name}[/versions/{v}]/infer. inputs: one tensor (for a one-input model),
        a dict name -> tensor, or a list of Tensor; a tensor is a nested list, a numpy array or a
        Tensor. outputs: names to return (default all). binary: send inputs and ask for outputs
        in the binary tensor data extension."""
        tensors = self._as_tensors(name, inputs, version)
        header = {"inputs": []}
        if request_id is not None:
            header["id"] = str(request_id)
        chunks = []
        for t in tensors:
            d = {"name": t.name, "datatype": t.datatype, "shape": t.shape}
            # JSON has no NaN or infinity: such a tensor goes in the binary extension even
            # when the rest of the request is JSON (KServe lets each input choose)
            if binary or not t.finite():
                raw = t.to_binary()
                d["parameters"] = {"binary_data_size": len(raw)}
                chunks.append(raw)
            else:
                d["data"] = t.json_data()
            header["inputs"].append(d)
        if outputs is not None:
            header["outputs"] = [{"name": o, "parameters": {"binary_data": True}} if binary else {"name": o}
                                 for o in ([outputs] if isinstance(outputs, str) else outputs)]
        elif binary:
            header["parameters"] = {"binary_data_output": True}
        text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
        if chunks:
            body = text + b"".join(chunks)
            hdrs = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(text))}
        else:
            body, hdrs = text, {"Content-Type": "application/json"}
        st, resp, raw = self._send("POST", self._model_path(name, version) + "/infer", body, hdrs)
        if st != 200:
            raise self._error(st, raw)
        return _decode_infer(resp, raw)

    # ---- jobs ----

    def submit(self, spec):
        """POST /v1/jobs with a dict, a JSON string or the path of a JSON file (str or
        os.PathLike, a pathlib.Path); the new job's id."""
        if isinstance(spec, (bytes, bytearray)):
            spec = spec.decode()
        if isinstance(spec, str) and spec.lstrip().startswith("{"):
            spec = json.loads(spec)
        elif isinstance(spec, (str, os.PathLike)):   # a path-like is a path, whatever its name
            with open(spec) as f:
                spec = json.load(f)
        return int(self._json("POST", "/v1/jobs", spec, ok=(201,))["id"])

    def job(self, id):
        return self._json("GET", "/v1/jobs/%d" % int(id))

    def jobs(self, state=None):
        """Every job (all pages), oldest first, optionally only those in one state."""
        out, after = [], 0
        while True:
            q = {"after": after, "limit": 1000}
            if state:
                q["state"] = state
            page = self._json("GET", "/v1/jobs?" + urllib.parse.urlencode(q))
            out += page["jobs"]
            if page.get("next_after") is None:
                return out
            after = page["next_after"]

    def cancel(self, id):
        """DELETE /v1/jobs/{id}: the answer ({"id", "state": "cancelled" or "cancelling"})."""
        return self._json("DELETE", "/v1/jobs/%d" % int(id), ok=(200, 202))

    def purge(self, id):
        """DELETE /v1/jobs/{id}?purge=true: remove an ended job (its record, events, metric history
        and checkpoints); the answer: id, purged, state, bytes_freed, files_removed, events_removed,
        metrics_removed, model_kept (the version it registered, which stays; None when none), note
        (with model_kept) and left_behind (only when a file could not be removed). KilnError 409
        for a job that has not ended (cancel it, wait, then purge), 404 for an unknown id."""
        return self._json("DELETE", "/v1/jobs/%d?purge=true" % int(id))

    def resume(self, id):
        """A failed or cancelled job continues as a new job; its id."""
        return int(self._json("POST", "/v1/jobs/%d/resume" % int(id), ok=(201,))["id"])

    def _history(self, id, what, query):
        rows, after = [], query.pop("after", 0) or 0
        while True:
            q = dict(query, after=after, limit=10000)
            page = self._json("GET", "/v1/jobs/%d/%s?%s" % (int(id), what, urllib.parse.urlencode(q)))
            rows += page[what]
            after = page["next_after"]
            if not page["more"]:
                return rows

    def metrics(self, id, kind="epoch"):
        """GET /v1/jobs/{id}/metrics, every page: one dict per epoch (kind="step": per recorded
        step), each with event_id and time_ms."""
        return self._history(id, "metrics", {"kind": kind})

    def logs(self, id, after=0):
        """GET /v1/jobs/{id}/logs: the log lines ({"message", "event_id", "time_ms"}) after that
        event id; pass the last line's event_id to read only newer ones."""
        return self._history(id, "logs", {"after": after})

    def events(self, id, last_event_id=None, _deadline=None):
        """The job's events (Event) from the start, or after last_event_id, until its final state.
        KilnConnectionError at once when the first connection fails (kilnd was never reached).
        Once a stream was open, a dropped connection is resumed with Last-Event-ID, and
        KilnConnectionError comes once kilnd stays unreachable for reconnect_timeout seconds (60
        by default)."""
        last = last_event_id
        retry, down_since, opened = 1.0, None, False
        while True:
            timeout = 75.0   # kilnd pings every 15 s, so a silent minute means the connection is gone
            if _deadline is not None:
                timeout = min(timeout, max(0.01, _deadline - time.monotonic()))
            conn = self._connect(timeout)
            final = False
            try:
                hdrs = self._headers({"Accept": "text/event-stream"})
                if last is not None:
                    hdrs["Last-Event-ID"] = str(last)
                conn.request("GET", self._prefix + "/v1/jobs/%d/events" % int(id), headers=hdrs)
                r = conn.getresponse()
                if r.status != 200:
                    raise self._error(r.status, r.read())
                down_since, opened = None, True
                for ev, r_ms in _parse_sse(r):
                    if _deadline is not None and time.monotonic() >= _deadline:
                        raise TimeoutError("job %d did not end in time" % int(id))
                    if r_ms is not None:
                        retry = r_ms / 1000.0
                        continue
                    last = ev.id if ev.id is not None else last
                    if ev.type == "state" and isinstance(ev.data, dict) and ev.data.get("state") in FINAL_STATES:
                        final = True
                    yield ev
            except KilnError:
                raise
            except (OSError, http.client.HTTPException) as e:
                expired = _deadline is not None and time.monotonic() >= _deadline
                # never reached: at once, unless wait()'s own timeout cut the first attempt short
                if not opened and not (expired and isinstance(e, socket.timeout)):
                    raise KilnConnectionError("cannot reach kilnd at %s: %s"
                                              % (self.url, e or type(e).__name__)) from None
                if expired:
                    raise TimeoutError("job %d did not end in time" % int(id)) from None
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since > self.reconnect_timeout:
                    raise KilnConnectionError("lost kilnd at %s: %s" % (self.url, e)) from None
            finally:
                conn.close()
            if final:
                return
            if _deadline is not None and time.monotonic() >= _deadline:
                raise TimeoutError("job %d did not end in time" % int(id))
            time.sleep(min(retry, 5.0) if down_since else 0.05)

    def wait(self, id, timeout=None):
        """Follow the job's events until it ends; the job (as job(id)). TimeoutError after timeout s;
        KilnConnectionError at once when kilnd cannot be reached."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in self.events(id, _deadline=deadline):
            pass
        return self.job(id)


def _dumps(body):
    """body as JSON; ValueError naming the field that holds NaN or an infinity (JSON has no such
    numbers, and kilnd would refuse the whole request as "not valid JSON")."""
    try:
        return json.dumps(body, allow_nan=False).encode()
    except ValueError as e:
        found = _nonfinite(body, "") if "Out of range float" in str(e) else None
        if found is None:
            raise
        where, value = found
        raise ValueError("field %s is %r: JSON has no NaN or infinity; nothing was sent"
                         % (where or "(the whole value)", value)) from None


def _nonfinite(value, where):
    """(path, value) of the first NaN or infinity in value, as "data.columns[2]"; else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    if isinstance(value, dict):
        items = (("%s.%s" % (where, k) if where else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = (("%s[%d]" % (where, i), v) for i, v in enumerate(value))
    else:
        return None
    for w, v in items:
        found = _nonfinite(v, w)
        if found:
            return found
    return None


def _decode_infer(resp, raw):
    hlen = resp.getheader("Inference-Header-Content-Length")
    if hlen is not None:
        n = int(hlen)
        if n < 0 or n > len(raw):
            raise KilnError("Inference-Header-Content-Length %d exceeds the body (%d bytes)" % (n, len(raw)), 200)
        header, binary = json.loads(raw[:n]), memoryview(raw)[n:]
    else:
        header, binary = json.loads(raw), memoryview(b"")
    outs, at = [], 0
    for o in header.get("outputs", []):
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if at + size > len(binary):
                raise KilnError("output %r: binary_data_size %d runs past the body" % (o.get("name"), size), 200)
            outs.append(Tensor.from_binary(o["name"], o["datatype"], o["shape"], bytes(binary[at:at + size])))
            at += size
        else:
            outs.append(Tensor.from_json(o))
    return InferResult(header, outs)


def _parse_sse(stream):
    """(Event, None) per event and (None, ms) per retry: field, from a text/event-stream response
    (the WHATWG rules: "field: value" lines, one leading space dropped, ":" comments, a blank
    line ends an event, data lines joined with newlines)."""
    ev_id, ev_type, data = None, None, []
    while True:
        raw = stream.readline()
        if not raw:
            return
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                text = "\n".join(data)
                try:
                    payload = json.loads(text)
                except ValueError:
                    payload = text
                yield Event(ev_id, ev_type or "message", payload), None
            ev_type, data = None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            ev_type = value
        elif field == "id":
            try:
                ev_id = int(value)
            except ValueError:
                ev_id = None
        elif field == "retry" and value.isdigit():
            yield None, int(value)
