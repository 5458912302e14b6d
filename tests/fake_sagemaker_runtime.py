"""A SageMaker control plane and runtime on loopback that serve real Triton tarballs from S3.

The smoke test talks to SageMaker through boto3; so do the tests, against this server, over HTTP:
nothing in boto3 is patched, so request signing, serialisation, error parsing and read timeouts
are botocore's own. The wire formats follow botocore's service models:

- ``sagemaker`` (protocol ``json`` 1.1): ``POST /`` with ``X-Amz-Target: SageMaker.<Operation>``;
  errors are ``{"__type": "ValidationException", "message": ...}`` with status 400.
- ``sagemaker-runtime`` (``rest-json``): ``POST /endpoints/{EndpointName}/invocations`` with the
  target in ``X-Amzn-SageMaker-Target-Model``. An error of the container (any status but 200) is
  relayed as SageMaker does: status 424, ``x-amzn-ErrorType: ModelError`` and a body with
  ``OriginalStatusCode``/``OriginalMessage``. SageMaker's own refusals (unknown endpoint, a
  target missing in S3) are ``ValidationError`` 400.

Invocations behave like the Triton container in multi-model mode: on the first request for a
target the tarball is fetched from ``<ModelDataUrl><TargetModel>``, unpacked with
:func:`model_build.verify.safe_extract`, its config checked and its model opened with
:func:`model_build.verify.open_model` (ONNX Runtime / torch); the body is decoded with the codec,
checked against the config, run, and answered with :func:`model_build.verify.encode_response`
and the SageMaker binary content type. Loaded models are cached, so the first call is cold.

Faults a test can ask for, per target: an error status (e.g. 507 for out of GPU memory), a stall
(bounded, ended early by :meth:`FakeSageMaker.close`), a wrong output shape, or a plain JSON answer.
Every invocation is recorded (bounded) with its body so tests can decode what was sent.
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
from botocore.exceptions import ClientError

from model_build.errors import ModelBuildError
from model_build.triton_config import check_config, default_filename
from model_build.verify import (
    SAGEMAKER_BINARY_CONTENT_TYPE,
    check_request,
    decode_request,
    encode_response,
    locate_model,
    open_model,
    parse_request_header,
    safe_extract,
)

#: Bodies above this are refused (413) instead of read: a fake must stay bounded.
MAX_BODY_BYTES = 32 * 1024 * 1024
#: No stall lasts longer than this, whatever a test asks.
MAX_STALL_SECONDS = 10.0
#: Invocations kept for inspection (oldest dropped first).
MAX_RECORDS = 1000
_INVOKE_PATH = re.compile(r"^/endpoints/([^/]+)/invocations$")
_HEADER_SIZE = re.compile(r"json-header-size\s*=\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Invocation:
    """One request the runtime received."""

    endpoint: str
    target: str
    content_type: str
    body: bytes


@dataclass
class Fault:
    """What to do instead of (or on top of) a normal answer for one target."""

    status: int | None = None  # container status to relay as ModelError (e.g. 507)
    validation_error: bool = False  # SageMaker's own 400 ValidationError
    message: str = ""
    stall_seconds: float = 0.0
    wrong_shape: bool = False
    json_answer: bool = False


@dataclass
class _Endpoint:
    name: str
    config_name: str
    model_name: str
    model_data_url: str
    status: str = "InService"
    created: float = field(default_factory=time.time)


class _Loaded:
    """A model loaded from its tarball, as the container holds it after the first invocation."""

    def __init__(self, directory: Path, target: str) -> None:
        model_dir, _ = locate_model(directory, model=target)
        self.config = check_config((model_dir / "config.pbtxt").read_text(encoding="utf-8"), model=target)
        versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
        if not versions:
            raise ModelBuildError(f"model {target!r}: no version directory")
        self.version = versions[-1]
        self.runner = open_model(model_dir / str(self.version) / default_filename(self.config), self.config,
                                 model=target)
        self.lock = threading.Lock()  # one inference at a time per model, like one instance


class FakeSageMaker:
    """Threaded HTTP server on 127.0.0.1 playing both SageMaker APIs; use as a context manager."""

    def __init__(self, s3_client: Any) -> None:
        self.s3_client = s3_client
        self.endpoints: dict[str, _Endpoint] = {}
        self.faults: dict[str, Fault] = {}
        self.invocations: deque[Invocation] = deque(maxlen=MAX_RECORDS)
        self.control_calls: deque[tuple[str, dict[str, Any]]] = deque(maxlen=MAX_RECORDS)
        self._models: dict[tuple[str, str], _Loaded] = {}
        self._load_locks: dict[tuple[str, str], threading.Lock] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._tmp = tempfile.TemporaryDirectory(prefix="fake-sagemaker-")
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="fake-sagemaker", daemon=True)
        self._thread.start()

    # -- configuration ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_endpoint(self, name: str, model_data_url: str, *, status: str = "InService") -> None:
        """An endpoint whose config's first variant uses a MultiModel model at ``model_data_url``."""
        with self._lock:
            self.endpoints[name] = _Endpoint(
                name=name, config_name=f"{name}-config", model_name=f"{name}-model",
                model_data_url=model_data_url, status=status,
            )

    def set_fault(self, target: str, fault: Fault) -> None:
        with self._lock:
            self.faults[target] = fault

    def clear(self) -> None:
        """Forget faults and recorded calls (loaded models stay cached, as on a live instance)."""
        with self._lock:
            self.faults.clear()
            self.invocations.clear()
            self.control_calls.clear()

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        self._closing.set()  # ends stalls at once
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._tmp.cleanup()

    def __enter__(self) -> FakeSageMaker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- control plane ---------------------------------------------------------------------

    def control(self, operation: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.control_calls.append((operation, request))
        with self._lock:
            endpoints = list(self.endpoints.values())
        arn = "arn:aws:sagemaker:us-east-1:123456789012"
        if operation == "DescribeEndpoint":
            ep = next((e for e in endpoints if e.name == request.get("EndpointName")), None)
            if ep is None:
                return _not_found(f"Could not find endpoint \"{request.get('EndpointName')}\".")
            return 200, {
                "EndpointName": ep.name, "EndpointArn": f"{arn}:endpoint/{ep.name}",
                "EndpointConfigName": ep.config_name, "EndpointStatus": ep.status,
                "ProductionVariants": [{"VariantName": "AllTraffic", "CurrentInstanceCount": 1}],
                "CreationTime": ep.created, "LastModifiedTime": ep.created,
            }
        if operation == "DescribeEndpointConfig":
            ep = next((e for e in endpoints if e.config_name == request.get("EndpointConfigName")), None)
            if ep is None:
                return _not_found(f"Could not find endpoint configuration \"{request.get('EndpointConfigName')}\".")
            return 200, {
                "EndpointConfigName": ep.config_name, "EndpointConfigArn": f"{arn}:endpoint-config/{ep.config_name}",
                "ProductionVariants": [{
                    "VariantName": "AllTraffic", "ModelName": ep.model_name,
                    "InitialInstanceCount": 1, "InstanceType": "ml.g5.xlarge",
                }],
                "CreationTime": ep.created,
            }
        if operation == "DescribeModel":
            ep = next((e for e in endpoints if e.model_name == request.get("ModelName")), None)
            if ep is None:
                return _not_found(f"Could not find model \"{request.get('ModelName')}\".")
            return 200, {
                "ModelName": ep.model_name, "ModelArn": f"{arn}:model/{ep.model_name}",
                "CreationTime": ep.created,
                "ExecutionRoleArn": "arn:aws:iam::123456789012:role/fake",
                "PrimaryContainer": {
                    "Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/sagemaker-tritonserver:25.04-py3",
                    "Mode": "MultiModel", "ModelDataUrl": ep.model_data_url,
                },
            }
        return 400, {"__type": "UnknownOperationException", "message": f"unknown operation {operation}"}

    # -- runtime ---------------------------------------------------------------------------

    def invoke(self, endpoint_name: str, target: str, content_type: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """Status, headers and body of the runtime's answer to one invocation."""
        self.invocations.append(Invocation(endpoint_name, target, content_type, body))
        with self._lock:
            ep = self.endpoints.get(endpoint_name)
            fault = self.faults.get(target, Fault())
        if ep is None:
            return _runtime_error(400, "ValidationError", f"Endpoint {endpoint_name} of account 123456789012 not found.")
        if fault.stall_seconds:
            self._closing.wait(min(fault.stall_seconds, MAX_STALL_SECONDS))
        if fault.validation_error:
            return _runtime_error(400, "ValidationError", fault.message or "Invalid TargetModel.")
        if fault.status is not None:
            return _model_error(fault.status, fault.message or json.dumps({"error": "injected failure"}))
        try:
            loaded = self._load(ep, target)
        except _DownloadFailed as failed:
            return _runtime_error(400, "ValidationError", str(failed))
        except ModelBuildError as error:  # Triton refuses to load the model: 400 from the container
            return _model_error(400, json.dumps({"error": f"failed to load '{target}': {error}"}))
        match = _HEADER_SIZE.search(content_type)
        try:
            header_length = int(match.group(1)) if match else len(body)
            header = parse_request_header(body, header_length)
            arrays = decode_request(body, header_length)
            requested = [o["name"] for o in header.get("outputs", [])] or [o.name for o in loaded.config.output]
            check_request(loaded.config, arrays, requested_outputs=requested, model=target)
        except ModelBuildError as error:
            return _model_error(400, json.dumps({"error": str(error)}))
        feeds = {}
        mbs = loaded.config.max_batch_size
        for io_ in loaded.config.input:
            array = arrays[io_.name]
            if io_.HasField("reshape"):
                array = array.reshape(([array.shape[0]] if mbs >= 1 else []) + list(io_.reshape.shape))
            feeds[io_.name] = array
        with loaded.lock:
            produced = loaded.runner.run(feeds, [o.name for o in loaded.config.output])
        outputs: dict[str, np.ndarray] = {}
        for io_ in loaded.config.output:
            if io_.name not in requested:
                continue
            array = produced[io_.name]
            if io_.HasField("reshape"):
                array = array.reshape(([array.shape[0]] if mbs >= 1 else []) + list(io_.dims))
            if fault.wrong_shape:
                array = array.reshape(array.shape[0], -1)[:, :-1]  # one value short per row
            outputs[io_.name] = array
        if fault.json_answer:
            document = {
                "model_name": target, "model_version": str(loaded.version),
                "outputs": [
                    {"name": name, "datatype": wire_datatype_of(value), "shape": list(value.shape),
                     "data": value.reshape(-1).tolist()}
                    for name, value in outputs.items()
                ],
            }
            return 200, {"Content-Type": "application/json"}, json.dumps(document).encode()
        response, header_len = encode_response(outputs, model_name=target, model_version=str(loaded.version))
        return 200, {"Content-Type": SAGEMAKER_BINARY_CONTENT_TYPE.format(header_len)}, response

    def _load(self, ep: _Endpoint, target: str) -> _Loaded:
        key = (ep.model_data_url, target)
        with self._lock:
            if key in self._models:
                return self._models[key]
            lock = self._load_locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                if key in self._models:
                    return self._models[key]
            match = re.fullmatch(r"s3://([^/]+)/?(.*)", ep.model_data_url)
            if match is None:
                raise _DownloadFailed(f"Invalid model data url {ep.model_data_url}")
            bucket = match.group(1)
            s3_key = match.group(2).rstrip("/") + "/" + target if match.group(2).strip("/") else target
            workdir = Path(self._tmp.name) / uuid.uuid4().hex
            workdir.mkdir()
            tarball = workdir / "model.tar.gz"
            try:
                self.s3_client.download_file(bucket, s3_key, str(tarball))
            except ClientError as error:
                raise _DownloadFailed(
                    f"Failed to download model data(bucket: {bucket}, key: {s3_key}). "
                    f"{error.response.get('Error', {}).get('Code')}"
                ) from None
            root = workdir / "model"
            root.mkdir()
            safe_extract(tarball, root, model=target)
            loaded = _Loaded(root, target)
            with self._lock:
                self._models[key] = loaded
            return loaded


class _DownloadFailed(Exception):
    pass


def wire_datatype_of(array: np.ndarray) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return "BYTES" if array.dtype == np.object_ else str(np_to_triton_dtype(array.dtype))


def _not_found(message: str) -> tuple[int, dict[str, Any]]:
    return 400, {"__type": "ValidationException", "message": message}


def _runtime_error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json", "x-amzn-ErrorType": f"{code}:http://internal.amazon.com/coral/com.amazon.sagemaker/"}, json.dumps({"message": message}).encode()


def _model_error(container_status: int, container_body: str) -> tuple[int, dict[str, str], bytes]:
    """What SageMaker answers when the container answers ``container_status``."""
    kind = "server" if container_status >= 500 else "client"
    body = {
        "ErrorCode": f"{kind.upper()}_ERROR_FROM_MODEL",
        "LogStreamArn": "arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/fake",
        "Message": f"Received {kind} error ({container_status}) from primary with message \"{container_body}\".",
        "OriginalMessage": container_body,
        "OriginalStatusCode": container_status,
    }
    headers = {
        "Content-Type": "application/json",
        "x-amzn-ErrorType": "ModelError:http://internal.amazon.com/coral/com.amazon.sagemaker/",
    }
    return 424, headers, json.dumps(body).encode()


class _Handler(BaseHTTPRequestHandler):
    """Routes both APIs; HTTP/1.1 keep-alive like AWS, with a socket timeout so idle connections end."""

    protocol_version = "HTTP/1.1"
    timeout = 5
    server_fake: FakeSageMaker

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests read the records
        pass

    def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (read timeout)
            self.close_connection = True

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._send(413, {"Content-Type": "application/json"}, b'{"message": "body too large"}')
            return
        body = self.rfile.read(length)
        fake = self.server_fake
        target_header = self.headers.get("X-Amz-Target")
        if self.path == "/" and target_header:
            operation = target_header.partition(".")[2]
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                request = {}
            status, document = fake.control(operation, request)
            self._send(status, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(document).encode())
            return
        match = _INVOKE_PATH.match(self.path)
        if match is None:
            self._send(404, {"Content-Type": "application/json"}, b'{"message": "unknown route"}')
            return
        target = self.headers.get("X-Amzn-SageMaker-Target-Model", "")
        content_type = self.headers.get("Content-Type", "")
        try:
            status, headers, answer = fake.invoke(unquote(match.group(1)), target, content_type, body)
        except Exception as error:  # a bug in the fake must not hang the client: answer 500
            status, headers, answer = _runtime_error(500, "InternalFailure", f"fake server error: {error!r}")
        self._send(status, headers, answer)


__all__ = ["MAX_STALL_SECONDS", "FakeSageMaker", "Fault", "Invocation"]
