"""``python -m model_build endpoint``: a SageMaker multi-model endpoint on this machine, on the real Triton.

One process serves, on ``127.0.0.1:<port>``:

- the SageMaker **runtime** API (``POST /endpoints/local/invocations`` with
  ``X-Amzn-SageMaker-Target-Model``), so ``boto3.client("sagemaker-runtime", endpoint_url=...)``
  works unchanged; errors come back as SageMaker shapes them (``ValidationError`` 400, the
  container's errors as ``ModelError`` 424 with ``OriginalStatusCode``);
- the three **control-plane** calls the smoke test makes (``DescribeEndpoint``,
  ``DescribeEndpointConfig``, ``DescribeModel`` for the endpoint ``local``), so
  ``python -m model_build smoke --endpoint local`` finds the release the same way it does on AWS.

Behind it, :mod:`model_build.tools.local_endpoint.model_cache` plays SageMaker's part of MME and the real
``tritonserver`` loads and runs the models. A server that dies (killed, crashed) is started
again, as SageMaker restarts a model container that exits: calls in flight and calls until the
new one is ready answer 503 ``ServiceUnavailable`` at once, then each target loads again on its
next use (:class:`_Servers`). Deviations from the GPU endpoint are printed in the
ready line and listed in docs/local-endpoint.md: python-based ``onnxruntime``/``pytorch`` backends on CPU,
``KIND_GPU`` served as ``KIND_CPU``, and TensorRT plans (``tensorrt_plan``) refused with one plain error.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.tools.local_endpoint.model_cache import (
    EndpointError,
    ModelCache,
    validation_error,
)
from triton_mme_cdk.model_build.tools.local_endpoint.served_release import Release, read_release
from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import (
    TritonServer,
    check_port_free,
    stack_shm_settings,
    temporary_dir,
    triton_server,
)

ENDPOINT_NAME = "local"
#: SageMaker's real-time ``InvokeEndpoint`` takes a body of at most 6 MB: the ``BodyBlob`` shape
#: of botocore's ``sagemaker-runtime`` service model has ``max: 6291456`` (6 MiB). A larger body
#: is refused, as the service refuses it, with a 413 ``ValidationError`` naming the limit, before
#: it is read.
MAX_BODY_BYTES = 6 * 1024 * 1024
_INVOKE_PATH = re.compile(r"^/endpoints/([^/]+)/invocations$")
_ERROR_NAMESPACE = ":http://internal.amazon.com/coral/com.amazon.sagemaker/"
_ARN = "arn:aws:sagemaker:local:000000000000"
DEVIATIONS = ("python-based onnxruntime/pytorch backends on CPU", "KIND_GPU served as KIND_CPU",
              "TensorRT plans refused (501 CannotServeOnCpu)")


@dataclass
class LocalEndpoint:
    """A running endpoint: its URL, the server behind it and its model cache."""

    url: str
    server: TritonServer
    cache: ModelCache
    release: Release
    #: Each restart of a server that died: ``(its exit status, seconds from seen dead to ready again)``.
    restarts: list[tuple[int | None, float]] = field(default_factory=list)
    #: Why a dead server could not be started again (the endpoint then answers 503 until stopped).
    failure: str | None = None

    def ready_line(self) -> str:
        return (
            f"endpoint {ENDPOINT_NAME} ready at {self.url} (tritonserver {self.server.version}, "
            f"release {self.release.release_id}: {len(self.release.entries)} targets from {self.release.url}); "
            f"deviations from the GPU endpoint: {'; '.join(DEVIATIONS)}"
        )


def _error_response(error: EndpointError) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json", "x-amzn-ErrorType": error.code + _ERROR_NAMESPACE}
    document: dict[str, Any] = {"message": error.message}
    if error.original_status is not None:
        kind = "SERVER" if error.original_status >= 500 else "CLIENT"
        document = {
            "ErrorCode": f"{kind}_ERROR_FROM_MODEL",
            "Message": error.message,
            "OriginalMessage": error.original_message,
            "OriginalStatusCode": error.original_status,
            "LogStreamArn": "local: see the endpoint's tritonserver.log",
        }
    return error.status, headers, json.dumps(document).encode()


def _control(endpoint: LocalEndpoint, operation: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The three describe calls, for the one endpoint this process serves."""
    name, config, model = ENDPOINT_NAME, f"{ENDPOINT_NAME}-config", f"{ENDPOINT_NAME}-model"
    asked = {"DescribeEndpoint": ("EndpointName", name), "DescribeEndpointConfig": ("EndpointConfigName", config),
             "DescribeModel": ("ModelName", model)}
    if operation not in asked:
        return 400, {"__type": "UnknownOperationException", "message": f"operation {operation} is not served locally"}
    field, expected = asked[operation]
    if request.get(field) != expected:
        return 400, {"__type": "ValidationException", "message": f"Could not find {field} \"{request.get(field)}\"."}
    if operation == "DescribeEndpoint":
        return 200, {"EndpointName": name, "EndpointArn": f"{_ARN}:endpoint/{name}", "EndpointConfigName": config,
                     "EndpointStatus": "InService", "CreationTime": 0, "LastModifiedTime": 0,
                     "ProductionVariants": [{"VariantName": "AllTraffic", "CurrentInstanceCount": 1}]}
    if operation == "DescribeEndpointConfig":
        return 200, {"EndpointConfigName": config, "EndpointConfigArn": f"{_ARN}:endpoint-config/{config}",
                     "CreationTime": 0,
                     "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": model,
                                             "InitialInstanceCount": 1, "InstanceType": "local"}]}
    return 200, {"ModelName": model, "ModelArn": f"{_ARN}:model/{model}", "CreationTime": 0,
                 "ExecutionRoleArn": "arn:aws:iam::000000000000:role/local",
                 "PrimaryContainer": {"Image": f"tritonserver:{endpoint.server.version}", "Mode": "MultiModel",
                                      "ModelDataUrl": endpoint.release.url}}


def invoke(endpoint: LocalEndpoint, endpoint_name: str, target: str, content_type: str,
           body: bytes) -> tuple[int, dict[str, str], bytes]:
    """One ``InvokeEndpoint``: status, headers, body as SageMaker's runtime answers."""
    try:
        if endpoint_name != ENDPOINT_NAME:
            raise validation_error(f"Endpoint {endpoint_name} of account 000000000000 not found.")
        if not target:
            raise validation_error("TargetModel is required for a multi-model endpoint.")
        status, answer_type, answer = endpoint.cache.invoke(target, body, content_type)
    except EndpointError as error:
        return _error_response(error)
    return status, {"Content-Type": answer_type, "x-Amzn-Invoked-Production-Variant": "AllTraffic"}, answer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    # Headers and body go out in two writes: with Nagle's algorithm on, the body waits for the
    # client's delayed ACK of the headers (40 ms on Linux) on every response of a kept-alive
    # connection. Measured: a 48 ms floor under every invocation, gone with TCP_NODELAY.
    disable_nagle_algorithm = True
    endpoint: LocalEndpoint

    def log_message(self, format: str, *args: Any) -> None:
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
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self) -> None:
        if self.path == "/ping":
            self._send(200, {"Content-Type": "text/plain"}, b"")
        else:
            self._send(404, {"Content-Type": "application/json"}, b'{"message": "unknown route"}')

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            error = validation_error(
                f"Request body of {length} bytes is over the InvokeEndpoint limit of {MAX_BODY_BYTES} bytes "
                "(6 MB, SageMaker real-time inference); send a smaller batch or use asynchronous inference")
            self._send(*_error_response(EndpointError(413, error.code, error.message)))
            return
        body = self.rfile.read(length)
        operation = self.headers.get("X-Amz-Target", "")
        if self.path == "/" and operation:
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                request = {}
            status, document = _control(self.endpoint, operation.partition(".")[2], request)
            self._send(status, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(document).encode())
            return
        match = _INVOKE_PATH.match(self.path)
        if match is None:
            self._send(404, {"Content-Type": "application/json"}, b'{"message": "unknown route"}')
            return
        try:
            answer = invoke(self.endpoint, unquote(match.group(1)), self.headers.get("X-Amzn-SageMaker-Target-Model", ""),
                            self.headers.get("Content-Type", ""), body)
        except Exception as error:  # a bug must answer, not hang the client
            answer = _error_response(EndpointError(500, "InternalFailure", f"local endpoint error: {error!r}"))
        self._send(*answer)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that drops its keep-alive connection is not an error worth a traceback."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class _Servers:
    """The endpoint's ``tritonserver`` and each one started in the place of one that died: the
    first in the work folder, the next ones in ``restart-<n>/`` beside it (each its own log)."""

    #: How often the supervisor looks whether the server still runs.
    POLL_SECONDS = 0.2

    def __init__(self, work: Path, **options: Any) -> None:
        self.work, self.options = work, options
        self.lock = threading.Lock()
        self._context: AbstractContextManager[TritonServer] | None = None
        self._started = 0

    def start(self) -> TritonServer:
        folder = self.work if self._started == 0 else self.work / f"restart-{self._started}"
        folder.mkdir(exist_ok=True)
        context = triton_server(work_dir=folder, **self.options)
        server = context.__enter__()
        self._context, self._started = context, self._started + 1
        return server

    def stop(self) -> None:
        """Stop the current server and what is left of its process group (a dead one's stubs)."""
        context, self._context = self._context, None
        if context is not None:
            context.__exit__(None, None, None)

    def supervise(self, endpoint: LocalEndpoint, stop: threading.Event) -> None:
        """Until ``stop``: a server seen dead is stopped and another started (from this thread,
        which lives as long as the endpoint: the kernel's parent-death signal follows the thread
        that started the server), then the cache forgets what the dead one had loaded."""
        while not stop.wait(self.POLL_SECONDS):
            dead = endpoint.server
            if dead.alive():
                continue
            seen = time.monotonic()
            with self.lock:
                if stop.is_set():
                    return
                self.stop()
                try:
                    server = self.start()
                except Exception as error:  # the endpoint answers 503 from now on; the command stops
                    endpoint.failure = f"tritonserver exited ({dead.process.returncode}) and did not start again: {error}"
                    return
            endpoint.server = server
            endpoint.cache.server_restarted(server)
            endpoint.restarts.append((dead.process.returncode, time.monotonic() - seen))


@contextmanager
def local_endpoint(
    *,
    s3_client: Any,
    bucket: str,
    release_id: str | None = None,
    model_prefix: str = "models",
    port: int = 0,
    memory_budget_bytes: int | None = None,
    shm_default_byte_size: int | None = None,
    shm_growth_byte_size: int | None = None,
) -> Iterator[LocalEndpoint]:
    """Serve the stack's fixed served prefix (``<model_prefix>/served/``, with its routes) for the
    block, or, with ``release_id`` of the earlier per-release layout, that release's prefix; on
    exit nothing is left running or on disk.

    Shared-memory sizes left out are the stack's (:func:`~model_build.tools.local_endpoint.triton_server.stack_shm_settings`).
    """
    if port:
        check_port_free(port)
    release = read_release(s3_client, bucket, model_prefix, release_id)
    with temporary_dir("mme-endpoint-") as work:
        servers = _Servers(work, shm_default_byte_size=shm_default_byte_size, shm_growth_byte_size=shm_growth_byte_size)
        server = servers.start()
        stop = threading.Event()
        try:
            cache = ModelCache(server=server, s3_client=s3_client, release=release, root=work / "models",
                               memory_budget_bytes=memory_budget_bytes)
            handler: type[_Handler] = type("Handler", (_Handler,), {})
            httpd = _Server(("127.0.0.1", port), handler)
            endpoint = LocalEndpoint(url=f"http://127.0.0.1:{httpd.server_address[1]}", server=server, cache=cache,
                                     release=release)
            handler.endpoint = endpoint
            thread = threading.Thread(target=httpd.serve_forever, name="local-endpoint", daemon=True)
            thread.start()
            supervisor = threading.Thread(target=servers.supervise, args=(endpoint, stop), name="tritonserver-supervisor",
                                          daemon=True)
            supervisor.start()
            try:
                yield endpoint
            finally:
                httpd.shutdown()
                httpd.server_close()
                thread.join(timeout=10)
                with servers.lock:  # no restart once stopping
                    stop.set()
                supervisor.join(timeout=10)
        finally:
            stop.set()
            with servers.lock:
                servers.stop()


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


def add_endpoint_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "endpoint",
        help="serve the published models as a SageMaker multi-model endpoint on the real tritonserver",
        description="Serve s3://BUCKET/PREFIX/served/ the way a SageMaker GPU multi-model endpoint does, on "
                    "127.0.0.1: the SageMaker runtime API (endpoint name 'local'), models loaded on first use "
                    "into the real tritonserver. Stops on SIGINT/SIGTERM.",
    )
    parser.add_argument("--bucket", required=True, help="bucket the release was published to")
    parser.add_argument("--release", default=None,
                        help="serve this release prefix of the earlier per-release layout (r-...) instead of "
                             "the fixed served prefix <prefix>/served/")
    parser.add_argument("--prefix", default="models", help="model prefix in the bucket (default: models)")
    parser.add_argument("--endpoint-url", default=None, help="S3 endpoint URL (default: AWS)")
    parser.add_argument("--region", default=None, help="AWS region of the bucket (default: from the environment)")
    parser.add_argument("--port", type=int, default=8080, help="port on 127.0.0.1 (default: 8080)")
    parser.add_argument("--memory-budget-mb", type=int, default=None, metavar="N",
                        help="unload least-recently-used models before the unpacked size of the loaded ones "
                             "would exceed N MiB (default: no budget)")
    parser.set_defaults(func=cmd_endpoint)
    return parser


def cmd_endpoint(args: argparse.Namespace) -> int:
    from triton_mme_cdk.model_build.aws_clients import make_s3_client

    if not 1 <= args.port <= 65535:
        raise ModelBuildError(f"--port: got {args.port}; expected 1..65535")
    if args.memory_budget_mb is not None and args.memory_budget_mb < 1:
        raise ModelBuildError(f"--memory-budget-mb: got {args.memory_budget_mb}; expected at least 1")
    shm_default, shm_growth = stack_shm_settings()  # the app's cdk.json: a refused value is one line
    check_port_free(args.port)
    s3 = make_s3_client(endpoint_url=args.endpoint_url, region=args.region)
    read_release(s3, args.bucket, args.prefix, args.release)  # no index: one error line, before anything starts
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    budget = args.memory_budget_mb * 1024 * 1024 if args.memory_budget_mb else None
    with local_endpoint(s3_client=s3, bucket=args.bucket, release_id=args.release, model_prefix=args.prefix,
                        port=args.port, memory_budget_bytes=budget, shm_default_byte_size=shm_default,
                        shm_growth_byte_size=shm_growth) as endpoint:
        print(endpoint.ready_line(), flush=True)
        started, told = time.monotonic(), 0
        while not stop.wait(0.5):
            for status, seconds in endpoint.restarts[told:]:
                told += 1
                print(f"tritonserver exited ({status}); started again in {seconds:.1f} s (restart {told}); "
                      "each model loads again on its next use", flush=True)
            if endpoint.failure is not None:
                raise ModelBuildError(f"{endpoint.failure}\n{endpoint.server.log_tail()}")
        print(f"endpoint {ENDPOINT_NAME} stopped after {time.monotonic() - started:.0f} s "
              f"({endpoint.cache.invocations.total()} invocations, {endpoint.cache.loads} loads, "
              f"{endpoint.cache.unloads} unloads)", flush=True)
    return 0
