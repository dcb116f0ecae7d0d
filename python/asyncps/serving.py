"""A client of ``ps_serve``'s REST form of the Open Inference Protocol
(KServe v2), standard library and numpy only::

    from asyncps.serving import ServingClient

    s = ServingClient("http://127.0.0.1:8000")      # ps_serve --http_port
    s.wait_ready(timeout=30)
    r = s.infer(images)                              # float32 (n, 784)
    r.outputs                                        # (n, 10) probabilities
    r.snapshot_version, r.snapshot_age_ms            # the parameters used

Requests and answers use the binary tensor data extension of the v2 REST
protocol by default (a JSON header, then the raw little-endian float32
values; about a quarter of JSON's bytes, and no number parsing);
``ServingClient(url, binary=False)`` (or ``infer(..., binary=False)``)
sends and reads plain JSON.

Any other v2 client works as well (e.g. over gRPC with the definition in
``proto/grpc_predict_v2.proto``). Refused requests raise ``ServingError``
with the HTTP status and the server's message (400 a bad request, 404 an
unknown model, 429 a full queue, 503 no parameters yet, 504 a deadline).
"""

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np

__all__ = ["InferResult", "ServingClient", "ServingError"]


class ServingError(Exception):
    """A request the server refused: ``status`` (HTTP) and its message."""

    def __init__(self, status, message):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass
class InferResult:
    outputs: np.ndarray  # float32 (rows, classes)
    snapshot_id: int  # which parameter snapshot computed it
    snapshot_version: int  # updates applied to those parameters
    snapshot_age_ms: int  # how old the snapshot was when it answered
    batch_rows: int  # rows of the batch the request ran in
    id: str = ""


class ServingClient:
    """Talks to one ``ps_serve`` REST endpoint (``http://host:port``)."""

    def __init__(self, url, model="mlp", timeout=30.0, binary=True):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.model = model
        self.timeout = float(timeout)
        self.binary = bool(binary)

    def _call(self, path, body=None, headers=None, with_headers=False):
        """(status, payload) or, with_headers, (status, payload, headers);
        a refusal's payload is the server's message. ``body``: bytes, or
        an object sent as JSON."""
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        request = urllib.request.Request(self.url + path, data=body,
                                         headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as r:
                answer = r.status, r.read(), r.headers
        except urllib.error.HTTPError as e:
            payload = e.read()
            try:
                message = json.loads(payload)["error"]
            except (ValueError, KeyError, TypeError):
                message = payload.decode(errors="replace")
            answer = e.code, message, e.headers
        return answer if with_headers else answer[:2]

    def live(self):
        """True when the server answers."""
        try:
            return self._call("/v2/health/live")[0] == 200
        except OSError:
            return False

    def ready(self):
        """True when the server holds parameters to compute with."""
        try:
            return self._call("/v2/health/ready")[0] == 200
        except OSError:
            return False

    def wait_ready(self, timeout=30.0):
        """Waits until ready(); TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url} not ready after {timeout} s")
            time.sleep(0.05)

    def metadata(self):
        """The model's name, versions, inputs and outputs (a dict)."""
        status, body = self._call(f"/v2/models/{self.model}")
        if status != 200:
            raise ServingError(status, body)
        return json.loads(body)

    def status(self):
        """The server's one-line status."""
        status, body = self._call("/status")
        if status != 200:
            raise ServingError(status, body)
        return body.decode().strip()

    def infer(self, rows, timeout_ms=None, request_id="", binary=None):
        """Computes the model on ``rows`` (array-like, (n, features) or one
        row of (features,)); returns an InferResult. Values must be finite
        (checked here: ValueError, nothing sent). ``binary`` (default: the
        client's) sends and reads the binary form, else JSON."""
        x = np.asarray(rows, dtype=np.float32)
        if x.ndim == 1:
            x = x[np.newaxis, :]
        if x.ndim != 2 or x.shape[0] == 0:
            raise ValueError(f"rows must be (n, features) with n >= 1, got shape {x.shape}")
        if not np.isfinite(x).all():
            raise ValueError("rows hold NaN or infinite values")
        binary = self.binary if binary is None else bool(binary)
        tensor = {"name": "input", "datatype": "FP32", "shape": list(x.shape)}
        body = {"inputs": [tensor]}
        parameters = {}
        if request_id:
            body["id"] = request_id
        if timeout_ms is not None:
            parameters["timeout_ms"] = int(timeout_ms)
        headers = None
        if binary:
            raw = x.astype("<f4", copy=False).tobytes()
            tensor["parameters"] = {"binary_data_size": len(raw)}
            parameters["binary_data_output"] = True
        else:
            tensor["data"] = x.ravel().tolist()
        if parameters:
            body["parameters"] = parameters
        if binary:
            header = json.dumps(body).encode()
            headers = {"Content-Type": "application/octet-stream",
                       "Inference-Header-Content-Length": str(len(header))}
            body = header + raw
        status, payload, answer_headers = self._call(
            f"/v2/models/{self.model}/infer", body, headers, with_headers=True)
        if status != 200:
            raise ServingError(status, payload)
        length = answer_headers.get("Inference-Header-Content-Length")
        json_length = len(payload) if length is None else int(length)
        answer = json.loads(payload[:json_length])
        out = answer["outputs"][0]
        if "data" in out:
            values = np.asarray(out["data"], dtype=np.float32)
        else:
            size = int(out["parameters"]["binary_data_size"])
            values = np.frombuffer(payload, dtype="<f4", count=size // 4,
                                   offset=json_length).astype(np.float32)
        params = answer.get("parameters", {})
        return InferResult(
            outputs=values.reshape(out["shape"]),
            snapshot_id=int(params.get("snapshot_id", 0)),
            snapshot_version=int(params.get("snapshot_version", 0)),
            snapshot_age_ms=int(params.get("snapshot_age_ms", 0)),
            batch_rows=int(params.get("batch_rows", 0)),
            id=answer.get("id", ""))
