"""Smoke-test a deployed multi-model endpoint against the release it serves.

A deploy that succeeded says the endpoint exists, not that it answers: a model can fail to load
on the GPU (507), a tarball can hold the wrong model, an output can change its shape. This module
asks the endpoint itself, through the public SageMaker APIs, the way a client application does:

1. ``DescribeEndpoint`` -> ``DescribeEndpointConfig`` -> ``DescribeModel`` give the model data
   URL (``s3://<bucket>/<prefix>/<release>/``); its ``_index.json`` lists every ``TargetModel``,
   and ``_reference/<model>.npz`` / ``.config.pbtxt`` hold the inputs, outputs and Triton config
   recorded at build time.
2. Each target (or a deterministic sample) is invoked twice with the reference inputs, encoded
   as tritonclient encodes them (binary tensors, content type
   ``application/vnd.sagemaker-triton.binary+json;json-header-size=N``): the first call is the
   cold one (the instance downloads and loads the model), the second the warm one. Both are timed.
3. Each answer is read with tritonclient's own parser and checked: every config output present,
   with the config's data type and shape, and values close to the reference.

The tolerance is the one rule of :mod:`model_build.compare` for the precision the target serves
(:data:`~model_build.compare.SERVED_TOLERANCE`): tight for FP32 (a raw-text target's ensemble config
records its precision), looser for FP16/INT8, and the loosest where the precision is not recorded
(token targets: see :data:`DEFAULT_ATOL`). ``--atol``/``--rtol`` override it for every target.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from model_build.compare import (
    UNKNOWN_PRECISION_TOLERANCE,
    compare_arrays,
    config_served_precision,
    served_tolerance,
)
from model_build.errors import ModelBuildError, TritonConfigError, VerifyError
from model_build.reference import read_reference
from model_build.release import INDEX_NAME, REFERENCE_DIR

#: Where the served precision is not recorded: loose, as TF32 convolutions and matmuls on Ampere
#: GPUs (g5), FP16 weights and TensorRT FP16 engines move outputs by 1e-3 to 1e-2 relative. A wrong
#: model, garbled bytes or a swapped output differ by orders of magnitude more.
DEFAULT_ATOL, DEFAULT_RTOL = UNKNOWN_PRECISION_TOLERANCE
#: Per-invocation limit; SageMaker itself gives a model 60 s to answer an invocation.
DEFAULT_TIMEOUT_SECONDS = 60.0
_HEADER_SIZE = re.compile(r"json-header-size\s*=\s*(\d+)", re.IGNORECASE)
#: Endpoint states in which an invocation cannot be served at all.
_DEAD_STATES = frozenset({"Creating", "Failed", "Deleting", "OutOfService"})
#: A config.pbtxt larger than this inside a tarball is not a config.
_CONFIG_MAX_BYTES = 1 << 20
_MESSAGE_MAX = 200

Progress = Callable[["TargetResult"], None]


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class TargetResult:
    """One row of the report: what the two invocations of one ``TargetModel`` gave."""

    target: str
    source_model: str
    ok: bool = False
    cold_ms: float | None = None
    warm_ms: float | None = None
    #: Largest absolute difference from the reference over every output of both answers.
    max_diff: float | None = None
    error: str | None = None
    #: ``http`` (the runtime answered 4xx/5xx), ``timeout``, ``connection``, ``response`` (the
    #: answer cannot be read), ``output`` (wrong outputs) or ``reference`` (the release's
    #: reference data is unusable); ``None`` when ok.
    kind: str | None = None
    #: The container's HTTP status when SageMaker relays it (``ModelError``: e.g. 507 for out of
    #: GPU memory), else SageMaker's own status (400 for ``ValidationError``).
    status: int | None = None
    #: The SageMaker error code (``ModelError``, ``ValidationError``...).
    code: str | None = None


@dataclass
class SmokeReport:
    """The smoke test of one endpoint: which release was checked and one row per target."""

    endpoint_name: str
    #: The model data URL the endpoint's model points at (what it serves).
    model_data_url: str
    #: The S3 prefix whose index and references were used (differs with ``release=``).
    release_url: str
    release_id: str | None
    endpoint_status: str
    targets_in_release: int
    rows: list[TargetResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(row.ok for row in self.rows)

    @property
    def failures(self) -> list[TargetResult]:
        return [row for row in self.rows if not row.ok]


class _CallFailed(Exception):
    """One invocation (or the check of its answer) failed; carries the row's classification."""

    def __init__(
        self, kind: str, message: str, *, status: int | None = None, code: str | None = None,
        max_diff: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.code = code
        #: The largest difference measured before the check failed (values out of tolerance).
        self.max_diff = max_diff


@dataclass
class _Reference:
    """What one source model's targets are sent and compared with (read once per source model)."""

    config: Any = None
    body: bytes = b""
    content_type: str = ""
    batch: int | None = None
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    #: Set when the reference could not be prepared: every target of the model fails with it.
    error: str | None = None

    def tolerance(self, atol: float | None, rtol: float | None) -> tuple[float, float]:
        """The comparison's ``(atol, rtol)``: given ones, else the rule of the precision served."""
        rule_atol, rule_rtol = served_tolerance(config_served_precision(self.config) if self.config else None)
        return (rule_atol if atol is None else atol, rule_rtol if rtol is None else rtol)


# --------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------


def make_client(
    service: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    read_timeout: float = DEFAULT_TIMEOUT_SECONDS,
    connect_timeout: float = 5.0,
    max_attempts: int = 3,
) -> Any:
    """A boto3 client for ``sagemaker``, ``sagemaker-runtime`` or ``s3`` with explicit timeouts.

    For a loopback ``endpoint_url`` (tests, local fakes) and no configured credentials, this client
    alone gets dummy credentials, by :func:`model_build.aws_clients.client_session`'s rule.
    """
    from botocore.config import Config
    from botocore.exceptions import NoRegionError

    from model_build.aws_clients import client_session, make_s3_client

    if service == "s3":
        return make_s3_client(endpoint_url=endpoint_url, region=region)
    session, credentials, region_name = client_session(endpoint_url, region)
    config = Config(
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )
    try:
        return session.client(
            service,
            endpoint_url=endpoint_url,
            region_name=region_name,
            config=config,
            **credentials,
        )
    except NoRegionError:
        raise ModelBuildError(
            f"{service} client: no aws region configured; pass --region or set AWS_REGION", step="smoke"
        ) from None


def make_runtime_client(
    *, endpoint_url: str | None = None, region: str | None = None,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> Any:
    """A ``sagemaker-runtime`` client for smoke tests: read timeout = the limit, no retries.

    No retries because a retried invocation would hide what the smoke test measures: a cold load
    that times out would be retried against a now-warm model and look like a slow success.
    """
    return make_client(
        "sagemaker-runtime", endpoint_url=endpoint_url, region=region,
        read_timeout=timeout_seconds, max_attempts=1,
    )


# --------------------------------------------------------------------------------------------
# Finding the release
# --------------------------------------------------------------------------------------------


def _fail(message: str) -> ModelBuildError:
    return ModelBuildError(message, step="smoke")


def _control_plane(call: Callable[..., dict[str, Any]], what: str, endpoint: str, **kwargs: Any) -> dict[str, Any]:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call(**kwargs)
    except ClientError as error:
        info = error.response.get("Error", {})
        message = _one_line(str(info.get("Message", "")))
        raise _fail(f"endpoint {endpoint!r}: {what} failed: {info.get('Code', '?')}: {message}") from None
    except BotoCoreError as error:
        raise _fail(f"endpoint {endpoint!r}: {what} failed: {_one_line(str(error))}") from None


def find_model_data_url(sagemaker_client: Any, endpoint_name: str) -> tuple[str, str]:
    """The model data URL of the endpoint's first production variant, and the endpoint status."""
    endpoint = _control_plane(
        sagemaker_client.describe_endpoint, "describe_endpoint", endpoint_name, EndpointName=endpoint_name
    )
    status = str(endpoint.get("EndpointStatus", "?"))
    if status in _DEAD_STATES:
        raise _fail(f"endpoint {endpoint_name!r}: status {status}; invocations need InService (or Updating)")
    config_name = endpoint.get("EndpointConfigName")
    if not config_name:
        raise _fail(f"endpoint {endpoint_name!r}: describe_endpoint gives no EndpointConfigName")
    config = _control_plane(
        sagemaker_client.describe_endpoint_config, f"describe_endpoint_config {config_name!r}",
        endpoint_name, EndpointConfigName=config_name,
    )
    variants = config.get("ProductionVariants") or []
    model_name = variants[0].get("ModelName") if variants else None
    if not model_name:
        raise _fail(
            f"endpoint {endpoint_name!r}: endpoint config {config_name!r} has no production variant "
            "with a ModelName"
        )
    model = _control_plane(
        sagemaker_client.describe_model, f"describe_model {model_name!r}", endpoint_name, ModelName=model_name
    )
    container: dict[str, Any] = model.get("PrimaryContainer") or next(iter(model.get("Containers") or []), {})
    url = container.get("ModelDataUrl") or (
        (container.get("ModelDataSource") or {}).get("S3DataSource") or {}
    ).get("S3Uri")
    if not url:
        raise _fail(
            f"endpoint {endpoint_name!r}: model {model_name!r} has no ModelDataUrl; a multi-model "
            "endpoint needs the s3 prefix of a release"
        )
    return str(url), status


def _index_location(s3_client: Any, model_data_url: str, release: str | None) -> tuple[str, str, str]:
    """``(bucket, served prefix, index key)`` of what the endpoint serves.

    The fixed served prefix of a stack (``<prefix>/served/``): the routes document
    (``<prefix>/_routes/routes.json``) names the release routed now, whose index is in
    ``<prefix>/_releases/<id>/``; ``release`` picks another release's index there. A release
    prefix of the earlier layout holds its own index."""
    from model_build.release import SERVED_DIR, Release, routes_key
    from model_build.release.index import read_routes

    bucket, prefix = split_model_data_url(model_data_url)
    parent, _, last = prefix.rpartition("/")
    if last != SERVED_DIR:
        bucket, prefix = split_model_data_url(model_data_url, release=release)
        return bucket, prefix, f"{prefix}/{INDEX_NAME}" if prefix else INDEX_NAME
    if release is not None:
        split_model_data_url(model_data_url, release=release)  # the same check of the id
        return bucket, prefix, Release(release, "", "").index_key(parent)
    try:
        routes = read_routes(s3_client, bucket, parent)
    except ModelBuildError as error:
        raise _fail(str(error)) from None
    if routes is None:
        raise _fail(f"model data url {model_data_url}: no routes at s3://{bucket}/{routes_key(parent)}; "
                    "nothing has been published and routed there yet")
    return bucket, prefix, routes.index_key


def split_model_data_url(url: str, *, release: str | None = None) -> tuple[str, str]:
    """``(bucket, release prefix)`` of ``s3://bucket/prefix/release/``; ``release`` replaces the last part."""
    match = re.fullmatch(r"s3://([^/]+)/?(.*)", url)
    if not match:
        raise _fail(f"model data url {url!r}: not an s3:// url; a release lives at s3://<bucket>/<prefix>/<release>/")
    bucket, prefix = match.group(1), match.group(2).strip("/")
    if release is not None:
        if not release or "/" in release or release in {".", ".."}:
            raise _fail(f"release: got {release!r}; expected a release id such as r-0123456789abcdef")
        parent = prefix.rpartition("/")[0]
        prefix = f"{parent}/{release}" if parent else release
    return bucket, prefix


# --------------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------------


def _one_line(text: str, limit: int = _MESSAGE_MAX) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _get_bytes(s3_client: Any, bucket: str, key: str, *, limit: int | None = None) -> bytes | None:
    """The object's bytes, or None when it does not exist; other S3 errors raise ``_CallFailed``."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = s3_client.get_object(Bucket=bucket, Key=key)
        body = response["Body"]
        data: bytes = body.read(limit + 1) if limit is not None else body.read()
    except ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", "?"))
        if code in {"NoSuchKey", "404", "NotFound"}:
            return None
        raise _CallFailed("reference", f"s3://{bucket}/{key}: cannot be read: {code}") from None
    except BotoCoreError as error:
        raise _CallFailed("reference", f"s3://{bucket}/{key}: cannot be read: {_one_line(str(error))}") from None
    if limit is not None and len(data) > limit:
        raise _CallFailed("reference", f"s3://{bucket}/{key}: larger than {limit} bytes")
    return data


def _config_from_tarball(s3_client: Any, bucket: str, key: str) -> str | None:
    """``config.pbtxt`` read from a published tarball without unpacking it to disk.

    The fallback for releases published before ``_reference/<model>.config.pbtxt`` existed; it
    streams the tarball, so it costs one download of the model.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    from model_build.errors import ModelBuildError
    from model_build.package.tarball import read_member

    try:
        body = s3_client.get_object(Bucket=bucket, Key=key)["Body"]
        with tempfile.NamedTemporaryFile(suffix=".tar.gz") as local:
            for chunk in iter(lambda: body.read(1 << 20), b""):
                local.write(chunk)
            local.flush()
            # model_build.tarball reads it under the bomb/size limits (a tarball from a bucket
            # other teams write is not trusted).
            data = read_member(Path(local.name), lambda p: p.name == "config.pbtxt" and len(p.parts) <= 2,
                               max_bytes=_CONFIG_MAX_BYTES)
        return data.decode("utf-8") if data is not None else None
    except (ClientError, BotoCoreError, ModelBuildError, OSError, UnicodeDecodeError):
        return None


def _prepare_reference(
    s3_client: Any,
    bucket: str,
    prefix: str,
    source_model: str,
    first_entry: dict[str, Any],
    digests: dict[str, str],
    work_dir: Path,
    reference_keys: Mapping[str, str],
) -> _Reference:
    """Read one source model's reference and config and build the request body its targets get.

    ``digests`` maps object keys to the sha256 the index records for them (its ``references``):
    a reference that changed after the release was published would make every verdict meaningless.
    """
    from model_build.package.triton_config import check_config, parse_config
    from model_build.verify import SAGEMAKER_BINARY_CONTENT_TYPE, build_request

    # The index names where each reference is (the store); an index of the earlier layout had them
    # in the release's own _reference/ folder.
    npz_key = reference_keys.get(f"{source_model}.npz", f"{prefix}/{REFERENCE_DIR}/{source_model}.npz")
    config_key = reference_keys.get(f"{source_model}.config.pbtxt",
                                    f"{prefix}/{REFERENCE_DIR}/{source_model}.config.pbtxt")
    try:
        raw = _get_bytes(s3_client, bucket, npz_key)
        if raw is None:
            return _Reference(error=f"reference s3://{bucket}/{npz_key}: missing")
        config_raw = _get_bytes(s3_client, bucket, config_key, limit=_CONFIG_MAX_BYTES)
    except _CallFailed as failed:
        return _Reference(error=str(failed))
    for key, data in ((npz_key, raw), (config_key, config_raw)):
        expected = digests.get(key)
        if data is not None and expected and hashlib.sha256(data).hexdigest() != expected:
            return _Reference(error=f"reference s3://{bucket}/{key}: sha256 differs from the index")
    if config_raw is not None:
        config_text = config_raw.decode("utf-8", errors="replace")
    else:
        tar_key = str(first_entry.get("key") or f"{prefix}/{first_entry['target_model']}")
        found = _config_from_tarball(s3_client, bucket, tar_key)
        if found is None:
            return _Reference(
                error=f"config s3://{bucket}/{config_key}: missing, and no config.pbtxt could be read "
                f"from s3://{bucket}/{tar_key}"
            )
        config_text = found
    try:
        # A raw-text target's reference config is its ensemble's (TEXT in, the model's outputs
        # out): only parsed, as its members were checked at build time.
        ensemble = parse_config(config_text, model=source_model).platform == "ensemble"
        config = (parse_config if ensemble else check_config)(config_text, model=source_model)
    except TritonConfigError as error:
        return _Reference(error=str(error))

    npz_path = work_dir / f"{source_model}.npz"
    npz_path.write_bytes(raw)
    try:
        inputs, outputs = read_reference(npz_path)
    except VerifyError as error:
        return _Reference(error=str(error))

    for kind, ios, arrays in (("input", config.input, inputs), ("output", config.output, outputs)):
        absent = [io_.name for io_ in ios if io_.name not in arrays]
        if absent:
            return _Reference(error=f"reference of {source_model!r}: no '{kind}:{absent[0]}' array; "
                              f"it holds {', '.join(sorted(arrays))}")
    mbs = config.max_batch_size
    batch = None
    sent: dict[str, np.ndarray] = {}
    for io_ in config.input:
        array = inputs[io_.name]
        if mbs >= 1:
            array = array[:mbs]  # the reference may hold more rows than one request may carry
            batch = int(array.shape[0])
            if io_.HasField("reshape"):
                array = array.reshape([batch, *io_.dims])
        elif io_.HasField("reshape"):
            array = array.reshape(list(io_.dims))
        sent[io_.name] = array
    expected_out = {io_.name: outputs[io_.name][:batch] for io_ in config.output}  # batch None: all rows
    try:
        body, header_length = build_request(config, sent)
    except VerifyError as error:
        return _Reference(error=str(error))
    return _Reference(
        config=config,
        body=body,
        content_type=SAGEMAKER_BINARY_CONTENT_TYPE.format(header_length),
        batch=batch,
        outputs=expected_out,
    )


# --------------------------------------------------------------------------------------------
# Invoking and checking one target
# --------------------------------------------------------------------------------------------


def _describe_client_error(error: Any) -> _CallFailed:
    """A runtime ``ClientError`` as a row: code, the container's status and a short message."""
    response = error.response
    info = response.get("Error", {})
    code = str(info.get("Code") or "?")
    http_status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    original = response.get("OriginalStatusCode")
    status = int(original) if original is not None else (int(http_status) if http_status else None)
    message = _one_line(str(response.get("OriginalMessage") or info.get("Message") or ""))
    hint = ""
    if status == 507:
        hint = " (out of gpu memory: the model does not fit next to the others; SageMaker evicts models)"
    elif code == "ModelNotReadyException":
        hint = " (the model is still loading)"
    shown = f"{code} {status}" if status is not None else code
    return _CallFailed("http", f"{shown}{hint}: {message}" if message else f"{shown}{hint}",
                       status=status, code=code)


def _invoke(
    runtime_client: Any, endpoint_name: str, target: str, reference: _Reference, timeout_seconds: float
) -> tuple[float, bytes, str]:
    """One timed invocation (request, answer and its body): milliseconds, body, content type."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectTimeoutError,
        ReadTimeoutError,
    )

    started = time.perf_counter()
    try:
        response = runtime_client.invoke_endpoint(
            EndpointName=endpoint_name,
            TargetModel=target,
            ContentType=reference.content_type,
            Body=reference.body,
        )
        body = response["Body"].read()
    except ClientError as error:
        raise _describe_client_error(error) from None
    except (ReadTimeoutError, ConnectTimeoutError) as error:
        waited = time.perf_counter() - started
        kind = "read" if isinstance(error, ReadTimeoutError) else "connect"
        raise _CallFailed("timeout", f"timeout: no answer after {waited:.1f} s (the client's {kind} timeout)") from None
    except BotoCoreError as error:
        raise _CallFailed("connection", f"connection: {_one_line(str(error))}") from None
    elapsed = time.perf_counter() - started
    if elapsed > timeout_seconds:
        # The client was built with a longer read timeout; a caller bound by ours would have failed.
        raise _CallFailed("timeout", f"timeout: answered after {elapsed:.1f} s, over the {timeout_seconds:g} s limit")
    return elapsed * 1000.0, bytes(body), str(response.get("ContentType") or "")


def _parse_answer(body: bytes, content_type: str) -> Any:
    """A tritonclient ``InferResult`` from a binary+json answer or a plain JSON one."""
    from model_build.verify import parse_response

    match = _HEADER_SIZE.search(content_type)
    header_length = int(match.group(1)) if match else None
    try:
        return parse_response(body, header_length)
    except Exception as error:  # tritonclient raises JSON, index and its own errors
        raise _CallFailed(
            "response",
            f"answer ({len(body)} bytes, content type {content_type!r}) is not a triton response: "
            f"{_one_line(str(error), 120)}",
        ) from None


def _check_answer(result: Any, reference: _Reference, atol: float, rtol: float) -> float:
    """Every config output present with the config's datatype and shape, values near the reference."""
    from model_build.package.triton_config import wire_datatype

    config = reference.config
    worst = 0.0
    for io_ in config.output:
        meta = result.get_output(io_.name)
        if meta is None:
            raise _CallFailed("output", f"output {io_.name!r}: missing in the answer")
        want_type = wire_datatype(io_.data_type)
        if meta.get("datatype") != want_type:
            raise _CallFailed(
                "output", f"output {io_.name!r}: datatype {meta.get('datatype')}; the config declares {want_type}"
            )
        try:
            got = result.as_numpy(io_.name)
        except Exception as error:  # a size that does not match shape and datatype
            raise _CallFailed("response", f"output {io_.name!r}: cannot be read: {_one_line(str(error), 120)}") from None
        dims = list(io_.dims)
        declared = [reference.batch, *dims] if reference.batch is not None else dims
        shape = list(got.shape)
        if len(shape) != len(declared) or any(d not in (-1, s) for s, d in zip(shape, declared, strict=True)):
            raise _CallFailed(
                "output",
                f"output {io_.name!r}: shape {shape}; expected {declared} (batch of {reference.batch} "
                f"+ config dims {dims})" if reference.batch is not None
                else f"output {io_.name!r}: shape {shape}; the config declares {dims}",
            )
        ref = reference.outputs[io_.name]
        if got.shape != ref.shape and got.size == ref.size and io_.HasField("reshape"):
            got = got.reshape(ref.shape)  # the reference holds the model's view of a reshaped output
        if got.shape != ref.shape:
            raise _CallFailed(
                "output", f"output {io_.name!r}: shape {shape}; the reference has {list(ref.shape)}"
            )
        worst = max(worst, _compare(io_.name, got, ref, atol, rtol))
    return worst


def _compare(name: str, got: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> float:
    result = compare_arrays(name, got, ref, atol=atol, rtol=rtol)
    if not result.ok:
        shown = result.max_abs_diff if math.isfinite(result.max_abs_diff) else None
        raise _CallFailed("output", result.problem or "", max_diff=shown)
    return result.max_abs_diff


def _smoke_target(
    runtime_client: Any,
    endpoint_name: str,
    target: str,
    source_model: str,
    reference: _Reference,
    *,
    timeout_seconds: float,
    atol: float | None,
    rtol: float | None,
) -> TargetResult:
    """Invoke one target cold then warm; the row fails with the first problem of either call.

    Both calls are always made: a cold call that timed out while the model loaded is often
    followed by a warm call that works, and the row then shows both facts.
    """
    row = TargetResult(target=target, source_model=source_model)
    if reference.error is not None:
        row.error, row.kind = reference.error, "reference"
        return row
    problems: list[tuple[str, _CallFailed]] = []
    diffs: list[float] = []
    atol, rtol = reference.tolerance(atol, rtol)
    for label in ("cold", "warm"):
        try:
            ms, body, content_type = _invoke(runtime_client, endpoint_name, target, reference, timeout_seconds)
            setattr(row, f"{label}_ms", round(ms, 3))
            diffs.append(_check_answer(_parse_answer(body, content_type), reference, atol, rtol))
        except _CallFailed as failed:
            problems.append((label, failed))
            if failed.max_diff is not None:
                diffs.append(failed.max_diff)
    row.max_diff = max(diffs) if diffs else None
    if not problems:
        row.ok = True
        return row
    label, first = problems[0]
    row.kind, row.status, row.code = first.kind, first.status, first.code
    if len(problems) == 2 and str(problems[1][1]) == str(first):
        row.error = f"cold and warm: {first}"
    else:
        row.error = "; ".join(f"{name}: {failed}" for name, failed in problems)
    return row


# --------------------------------------------------------------------------------------------
# The whole run
# --------------------------------------------------------------------------------------------


def select_targets(targets: Sequence[str], sample: int | None, seed: int = 0) -> list[str]:
    """Every target (sorted), or a sample of ``sample`` of them that depends only on ``seed``."""
    ordered = sorted(targets)
    if sample is None or sample >= len(ordered):
        return ordered
    if sample < 1:
        raise _fail(f"sample: got {sample}; expected at least 1 target")
    return sorted(random.Random(seed).sample(ordered, sample))


def run_smoke(
    *,
    endpoint_name: str,
    sagemaker_client: Any,
    runtime_client: Any,
    s3_client: Any,
    release: str | None = None,
    sample: int | None = None,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    tolerance_atol: float | None = None,
    tolerance_rtol: float | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> SmokeReport:
    """Invoke every target of the endpoint's release (or ``sample`` of them) and check the answers.

    ``runtime_client`` should come from :func:`make_runtime_client` with the same
    ``timeout_seconds``: its read timeout is what stops a stalled call, and it does not retry. An
    answer that arrives after ``timeout_seconds`` from a client with a longer timeout is still
    reported as a timeout.

    ``release`` checks the endpoint against another release's index and references under the same
    bucket and prefix. The endpoint still loads models from its own model data URL, so this asks
    "does what is deployed answer like release X" (e.g. an unchanged model rebuilt under a new id).

    Raises :class:`ModelBuildError` (step ``smoke``) when there is nothing to test: the endpoint,
    its model or the release index cannot be found. Problems with single targets are rows of the
    report, never exceptions.
    """
    from model_build.release.index import read_index

    if timeout_seconds <= 0:
        raise _fail(f"timeout: got {timeout_seconds:g} s; expected more than 0")
    started = time.perf_counter()
    model_data_url, status = find_model_data_url(sagemaker_client, endpoint_name)
    bucket, prefix, index_key = _index_location(s3_client, model_data_url, release)
    release_url = f"s3://{bucket}/{prefix}/" if prefix else f"s3://{bucket}/"
    index = read_index(s3_client, bucket, index_key)
    if index is None:
        chosen = f"release {release!r}" if release else f"its model data url {model_data_url}"
        raise _fail(
            f"endpoint {endpoint_name!r}: no release index at s3://{bucket}/{index_key} for {chosen}; "
            "the release was never published there or its publish did not finish"
        )
    entries: dict[str, dict[str, Any]] = {}
    for entry in index.get("models") or []:
        if isinstance(entry, dict) and isinstance(entry.get("target_model"), str):
            entries[entry["target_model"]] = entry
    if not entries:
        raise _fail(f"endpoint {endpoint_name!r}: index s3://{bucket}/{index_key} lists no models")
    digests = {
        str(ref["key"]): str(ref["sha256"])
        for ref in index.get("references") or []
        if isinstance(ref, dict) and ref.get("key") and ref.get("sha256")
    }
    #: Reference file name -> its key, from the index (read once, not per model).
    reference_keys = {key.rpartition("/")[2]: key for key in digests}
    chosen_targets = select_targets(list(entries), sample, seed)
    report = SmokeReport(
        endpoint_name=endpoint_name,
        model_data_url=model_data_url,
        release_url=release_url,
        release_id=index.get("release_id") or (prefix.rpartition("/")[2] or None),
        endpoint_status=status,
        targets_in_release=len(entries),
    )
    references: dict[str, _Reference] = {}
    with tempfile.TemporaryDirectory(prefix="smoke-") as tmp:
        for target in chosen_targets:
            entry = entries[target]
            source_model = str(entry.get("source_model") or target.removesuffix(".tar.gz"))
            if source_model not in references:
                references[source_model] = _prepare_reference(
                    s3_client, bucket, prefix, source_model, entry,
                    digests, Path(tmp), reference_keys,
                )
            row = _smoke_target(
                runtime_client, endpoint_name, target, source_model, references[source_model],
                timeout_seconds=timeout_seconds, atol=tolerance_atol, rtol=tolerance_rtol,
            )
            report.rows.append(row)
            if progress is not None:
                progress(row)
    report.seconds = time.perf_counter() - started
    return report


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def add_smoke_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``smoke``: the sub-command that tests a deployed endpoint (add to ``python -m model_build``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "smoke",
        help="invoke every model of a deployed endpoint and check the answers against the release",
        description=(
            "Find the release an endpoint serves (DescribeEndpoint -> EndpointConfig -> Model -> "
            "ModelDataUrl), invoke each TargetModel twice (cold, warm) with the reference inputs "
            "and check outputs against the reference recorded at build time."
        ),
    )
    parser.add_argument("--endpoint", required=True, help="SageMaker endpoint name")
    parser.add_argument("--release", default=None,
                        help="check against this release id (r-...) under the same bucket/prefix "
                             "instead of the one the endpoint's model points at")
    parser.add_argument("--sample", type=int, default=None, metavar="N",
                        help="invoke N targets chosen at random (deterministic with --seed) instead of all")
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample (default: 0)")
    parser.add_argument("--region", default=None, help="AWS region (default: from the environment)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS, metavar="S",
                        help=f"seconds one invocation may take (default: {DEFAULT_TIMEOUT_SECONDS:g})")
    parser.add_argument("--atol", type=float, default=None,
                        help="absolute tolerance against the reference for every target (default: the rule of "
                             "the precision the target serves, model_build.compare.SERVED_TOLERANCE; "
                             f"{DEFAULT_ATOL:g} where it is not recorded)")
    parser.add_argument("--rtol", type=float, default=None,
                        help="relative tolerance against the reference for every target (default: as --atol; "
                             f"{DEFAULT_RTOL:g} where the precision is not recorded)")
    for service in ("sagemaker", "runtime", "s3"):
        parser.add_argument(f"--{service}-endpoint-url", default=None, metavar="URL",
                            help=f"{service} API endpoint, for testing against local endpoints (default: AWS)")
    parser.set_defaults(func=cmd_smoke)
    return parser


def _consoles() -> tuple[Any, Any]:
    from rich.console import Console

    # Wide when not a terminal, so logs keep each table row on one line (as in __main__).
    return (
        Console(width=None if sys.stdout.isatty() else 200),
        Console(stderr=True, width=None if sys.stderr.isatty() else 200),
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def smoke_table(report: SmokeReport) -> Any:
    """The report as a rich table: target, result, cold ms, warm ms, max difference, error."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        title=f"smoke test of endpoint {report.endpoint_name}: release {report.release_id} "
        f"({len(report.rows)} of {report.targets_in_release} targets)"
    )
    for column in ("target", "result", "cold ms", "warm ms", "max difference", "error"):
        table.add_column(column, justify="right" if column.endswith("ms") else "left")
    for row in report.rows:
        table.add_row(
            escape(row.target),
            "ok" if row.ok else "[red]FAILED[/red]",
            _ms(row.cold_ms),
            _ms(row.warm_ms),
            "-" if row.max_diff is None else f"{row.max_diff:.2e}",
            escape(row.error or ""),
        )
    return table


def cmd_smoke(args: argparse.Namespace) -> int:
    """Run the smoke test for the CLI; 0 when every target passed, 1 otherwise."""
    from rich.markup import escape

    out, err = _consoles()
    sagemaker_client = make_client("sagemaker", endpoint_url=args.sagemaker_endpoint_url, region=args.region)
    runtime_client = make_runtime_client(
        endpoint_url=args.runtime_endpoint_url, region=args.region, timeout_seconds=args.timeout
    )
    s3_client = make_client("s3", endpoint_url=args.s3_endpoint_url, region=args.region)

    def progress(row: TargetResult) -> None:
        if err.is_terminal:
            err.print(f"{escape(row.target)}: {'ok' if row.ok else 'FAILED'}", highlight=False)

    report = run_smoke(
        endpoint_name=args.endpoint,
        sagemaker_client=sagemaker_client,
        runtime_client=runtime_client,
        s3_client=s3_client,
        release=args.release,
        sample=args.sample,
        timeout_seconds=args.timeout,
        tolerance_atol=args.atol,
        tolerance_rtol=args.rtol,
        seed=args.seed,
        progress=progress,
    )
    if args.release and not report.model_data_url.rstrip("/").endswith("/" + args.release):
        out.print(
            f"note: the endpoint serves {escape(report.model_data_url)}; answers were checked against "
            f"the index and references of {escape(report.release_url)}",
            highlight=False,
        )
    out.print(smoke_table(report))
    passed = len(report.rows) - len(report.failures)
    out.print(f"{passed} of {len(report.rows)} targets passed in {report.seconds:.1f} s", highlight=False)
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m model_build.smoke``: the sub-command on its own, with the CLI's error handling."""
    from rich.markup import escape

    parser = argparse.ArgumentParser(prog="python -m model_build", description=__doc__.split("\n")[0])
    add_smoke_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["smoke", *(sys.argv[1:] if argv is None else argv)])
    try:
        return cmd_smoke(args)
    except ModelBuildError as error:
        _, err = _consoles()
        err.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
