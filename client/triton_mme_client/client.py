"""``TritonMmeClient``: call a model of a triton-mme-cdk endpoint by its logical name.

One call: the name is resolved through the routes document (:class:`~triton_mme_client.routes.RouteResolver`),
the inputs are checked against the route's published signature before anything is sent, the
request goes out with Triton's binary tensor extension (or JSON), and the answer comes back as a
dict of numpy arrays. What is retried, and how often, is in docs/client.md and below.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from triton_mme_client.codec import DecodeError, decode, encode_binary, encode_json
from triton_mme_client.errors import ConfigurationError, EndpointError, InvalidInput, ModelError
from triton_mme_client.routes import Route, RouteResolver, split_s3_url
from triton_mme_client.signatures import Signature, TensorSpec, check_inputs

#: The environment ``from_env`` reads (what the construct's ``connect_client`` sets on a function).
ENV_ENDPOINT_NAME = "TRITON_MME_ENDPOINT_NAME"
ENV_ROUTES_URL = "TRITON_MME_ROUTES_URL"
ENV_REFRESH_SECONDS = "TRITON_MME_REFRESH_SECONDS"

#: Error codes that mean "try again": SageMaker's throttling, a model still downloading or loading.
RETRIED_CODES = frozenset({"ThrottlingException", "Throttling", "TooManyRequestsException",
                           "ModelNotReadyException", "ServiceUnavailable", "InternalFailure",
                           "InternalServerError", "InternalDependencyException"})
Wire = Literal["binary", "json"]


@dataclass(frozen=True)
class ModelInfo:
    """One routed logical name: its ``TargetModel`` today, its format, and its tensors (None: the
    release that routed it published no signature, so they are unknown)."""

    name: str
    target_model: str
    format: str
    signature: Signature | None

    @property
    def inputs(self) -> tuple[TensorSpec, ...] | None:
        return self.signature.inputs if self.signature else None

    @property
    def outputs(self) -> tuple[TensorSpec, ...] | None:
        return self.signature.outputs if self.signature else None


@dataclass
class _Failure:
    """One failed call, classified."""

    error: EndpointError
    retry: bool
    target_gone: bool = False


class TritonMmeClient:
    """A client of one endpoint, shared across threads.

    ``runtime`` and ``s3``: boto3 clients (default: ``boto3.client("sagemaker-runtime")`` with
    botocore's own retries off, so that the bound below is the whole bound, and
    ``boto3.client("s3")``). ``refresh_seconds``: how old the routes may get before they are read
    again (a conditional GET). ``wire``: ``"binary"`` (Triton's binary tensor extension) or
    ``"json"``. A transient failure (throttling, a model still loading, 507: not enough memory
    to load it, a 5xx) is retried up to ``max_attempts`` calls in all, sleeping a random time up to
    ``backoff_seconds * 2**n`` (at most ``max_backoff_seconds``) in between."""

    def __init__(self, endpoint_name: str, *, routes_url: str, runtime: Any = None, s3: Any = None,
                 refresh_seconds: float = 30.0, wire: Wire = "binary", max_attempts: int = 5,
                 backoff_seconds: float = 0.25, max_backoff_seconds: float = 8.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if not isinstance(endpoint_name, str) or not endpoint_name:
            raise ConfigurationError(f"endpoint_name {endpoint_name!r}: expected the endpoint's name")
        if wire not in ("binary", "json"):
            raise ConfigurationError(f"wire {wire!r}: allowed: 'binary', 'json'")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigurationError(f"max_attempts {max_attempts!r}: expected an integer >= 1")
        for name, value in (("backoff_seconds", backoff_seconds), ("max_backoff_seconds", max_backoff_seconds)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigurationError(f"{name} {value!r}: expected a number of seconds >= 0")
        bucket, key = split_s3_url(routes_url)
        if runtime is None or s3 is None:
            import boto3
            from botocore.config import Config

            runtime = runtime or boto3.client("sagemaker-runtime",
                                              config=Config(retries={"mode": "standard", "total_max_attempts": 1}))
            s3 = s3 or boto3.client("s3")
        self.endpoint_name = endpoint_name
        self.routes_url = routes_url
        self.wire: Wire = wire
        self.resolver = RouteResolver(s3, bucket, key, refresh_seconds=refresh_seconds, clock=clock)
        self._runtime = runtime
        self._max_attempts = max_attempts
        self._backoff = float(backoff_seconds)
        self._max_backoff = float(max_backoff_seconds)
        self._sleep = sleep
        #: Calls retried after a transient failure, and after a route change (for tests and benchmarks).
        self.retries = 0
        self.reroutes = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kwargs: Any) -> TritonMmeClient:
        """A client of the endpoint that ``TRITON_MME_ENDPOINT_NAME`` and ``TRITON_MME_ROUTES_URL``
        name (``TRITON_MME_REFRESH_SECONDS`` optional); ``kwargs`` as the constructor's."""
        env = os.environ if environ is None else environ
        for name in (ENV_ENDPOINT_NAME, ENV_ROUTES_URL):
            if not env.get(name):
                raise ConfigurationError(
                    f"environment variable {name} is not set; TritonMmeClient.from_env() needs "
                    f"{ENV_ENDPOINT_NAME} and {ENV_ROUTES_URL} (the construct's connect_client sets both)")
        if env.get(ENV_REFRESH_SECONDS) and "refresh_seconds" not in kwargs:
            text = env[ENV_REFRESH_SECONDS]
            try:
                kwargs["refresh_seconds"] = float(text)
            except ValueError:
                raise ConfigurationError(f"environment variable {ENV_REFRESH_SECONDS} {text[:40]!r}: expected a "
                                         "number of seconds >= 0") from None
        return cls(env[ENV_ENDPOINT_NAME], routes_url=env[ENV_ROUTES_URL], **kwargs)

    # ------------------------------------------------------------------ names

    def target_model(self, model: str) -> str:
        """Today's ``TargetModel`` of the logical name ``model``."""
        return self.resolver.target_model(model)

    def models(self) -> dict[str, ModelInfo]:
        """Every routed logical name, with its target, format and tensors (None: unknown)."""
        return {name: ModelInfo(name, route.target_model, route.format, route.signature)
                for name, route in sorted(self.resolver.routes.routes.items())}

    # ------------------------------------------------------------------ inference

    def infer(self, model: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
              wire: Wire | None = None) -> dict[str, np.ndarray]:
        """Run ``model`` (a logical name) on ``inputs`` (name -> array); every output (or those named
        in ``outputs``) as numpy arrays. Raises :class:`~triton_mme_client.ModelNotFound`,
        :class:`~triton_mme_client.InvalidInput` (before any call),
        :class:`~triton_mme_client.ModelError`, :class:`~triton_mme_client.EndpointError`."""
        use = self.wire if wire is None else wire
        if use not in ("binary", "json"):
            raise ConfigurationError(f"wire {use!r}: allowed: 'binary', 'json'")
        if not isinstance(inputs, Mapping) or not all(isinstance(name, str) for name in inputs):
            raise InvalidInput(f"model {model!r}: inputs must map input names to arrays, got {type(inputs).__name__}",
                               model=model)
        arrays = {name: value if isinstance(value, np.ndarray) else np.asarray(value) for name, value in inputs.items()}
        wanted = list(outputs or ())
        route = self.resolver.route(model)
        rerouted = False
        while True:
            body, content_type = self._request(model, route, arrays, wanted, use)
            seen = self.resolver.generation
            try:
                return self._call(model, route.target_model, body, content_type)
            except _TargetGone as gone:
                # The object may be gone because a release moved the name: read the routes again
                # and call the new target once.
                fresh = None if rerouted else self.resolver.refresh(seen=seen).routes.get(model)
                if fresh is None or fresh.target_model == route.target_model:
                    raise gone.error from None
                route = self.resolver.route(model)
                rerouted = True
                self.reroutes += 1

    def _request(self, model: str, route: Route, arrays: Mapping[str, np.ndarray], outputs: list[str],
                 wire: Wire) -> tuple[bytes, str]:
        signature = route.signature
        if signature is not None:
            arrays = check_inputs(model, route.target_model, signature, arrays)
            known = {spec.name for spec in signature.outputs}
            unknown = [name for name in outputs if name not in known]
            if unknown:
                raise InvalidInput(f"model {model!r}: output {unknown[0]!r} is not one of its outputs "
                                   f"({', '.join(sorted(known))})", model=model, target_model=route.target_model)
        try:
            return (encode_binary if wire == "binary" else encode_json)(arrays, outputs)
        except InvalidInput as error:
            raise InvalidInput(f"model {model!r}: {error}", model=model, target_model=route.target_model) from None

    def _call(self, model: str, target: str, body: bytes, content_type: str) -> dict[str, np.ndarray]:
        attempt = 0
        while True:
            attempt += 1
            failure = None
            try:
                response = self._runtime.invoke_endpoint(EndpointName=self.endpoint_name, TargetModel=target,
                                                         ContentType=content_type, Body=body)
            except Exception as error:  # botocore's ClientError and connection errors, classified
                failure = self._classify(error, model, target, attempt)
            else:
                answer = response["Body"].read()
                try:
                    return decode(answer, str(response.get("ContentType") or ""))
                except DecodeError as error:
                    request_id = (response.get("ResponseMetadata") or {}).get("RequestId")
                    raise EndpointError(f"model {model!r} (TargetModel {target!r}): the answer cannot be read: "
                                        f"{error}; request id {request_id}", model=model, target_model=target,
                                        request_id=request_id, status=200, attempts=attempt) from None
            if failure.target_gone:
                raise _TargetGone(failure.error)
            if not failure.retry or attempt >= self._max_attempts:
                raise failure.error from None
            self.retries += 1
            self._sleep(random.uniform(0, min(self._max_backoff, self._backoff * 2 ** (attempt - 1))))

    def _classify(self, error: Exception, model: str, target: str, attempt: int) -> _Failure:
        from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

        where = f"model {model!r} (TargetModel {target!r}) on endpoint {self.endpoint_name!r}"
        if isinstance(error, ConnectionError | HTTPClientError):
            return _Failure(EndpointError(f"{where}: no answer ({error}) after {attempt} attempt(s)", model=model,
                                          target_model=target, attempts=attempt), retry=True)
        if not isinstance(error, ClientError):
            raise error
        response: dict[str, Any] = error.response
        meta = response.get("ResponseMetadata") or {}
        status, request_id = meta.get("HTTPStatusCode"), meta.get("RequestId")
        details = response.get("Error") or {}
        code, message = str(details.get("Code") or ""), str(details.get("Message") or "")
        original = response.get("OriginalStatusCode", details.get("OriginalStatusCode"))
        original = int(original) if isinstance(original, int | str) and str(original).isdigit() else None
        text = (f"{where}: {code or 'error'} ({status}"
                + (f", the model answered {original}" if original is not None else "")
                + f") after {attempt} attempt(s): {message[:500]}; request id {request_id}")
        fields: dict[str, Any] = {"model": model, "target_model": target, "request_id": request_id, "status": status,
                                  "code": code,
                  "original_status": original, "attempts": attempt}
        if code == "ModelError" and original is not None and 400 <= original < 500 and original != 429:
            return _Failure(ModelError(text, **fields), retry=False)
        transient = (code in RETRIED_CODES or status == 429 or status == 507 or original == 507 or original == 429
                     or (isinstance(status, int) and status >= 500) or (original is not None and original >= 500))
        if transient:
            return _Failure(EndpointError(text, **fields), retry=True)
        if code == "ValidationError" and status == 400:
            return _Failure(EndpointError(text, **fields), retry=False, target_gone=True)
        return _Failure(EndpointError(text, **fields), retry=False)


class _TargetGone(Exception):
    """A call the endpoint refused for its target (possibly no longer served): read the routes again."""

    def __init__(self, error: EndpointError) -> None:
        super().__init__(str(error))
        self.error = error
