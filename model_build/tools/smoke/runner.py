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
   with the config's data type and shape, and values close to the reference. A prebuilt TensorRT
   plan has no reference outputs (the build has no GPU to run it): it is sent zeros of its
   declared shapes and its values are not compared, which its row says. An endpoint that cannot
   load a target at all (the local CPU endpoint and a plan: ``CannotServeOnCpu``) makes the row
   skipped, neither passed nor failed, and counted on its own.

The tolerance is the one rule of :mod:`model_build.compare` for the precision the target serves
(:data:`~model_build.compare.SERVED_TOLERANCE`): tight for FP32 (a raw-text target's ensemble config
records its precision), looser for FP16/INT8, and the loosest where the precision is not recorded
(token targets: see :data:`DEFAULT_ATOL`). ``--atol``/``--rtol`` override it for every target.
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from triton_mme_cdk.model_build.compare import UNKNOWN_PRECISION_TOLERANCE, compare_arrays
from triton_mme_cdk.model_build.tools.local_endpoint.model_cache import CANNOT_SERVE_ON_CPU
from triton_mme_cdk.model_build.tools.smoke.prepare import (
    DEFAULT_TIMEOUT_SECONDS,
    CallFailed,
    Reference,
    find_model_data_url,
    index_location,
    one_line,
    prepare_reference,
    smoke_error,
)

#: Where the served precision is not recorded: loose, as TF32 convolutions and matmuls on Ampere
#: GPUs (g5), FP16 weights and TensorRT FP16 engines move outputs by 1e-3 to 1e-2 relative. A wrong
#: model, garbled bytes or a swapped output differ by orders of magnitude more.
DEFAULT_ATOL, DEFAULT_RTOL = UNKNOWN_PRECISION_TOLERANCE

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
    #: answer cannot be read), ``output`` (wrong outputs), ``reference`` (the release's
    #: reference data is unusable) or ``route`` (the index names a target that is not the content
    #: name of its digest: never invoked); ``None`` when ok.
    kind: str | None = None
    #: The container's HTTP status when SageMaker relays it (``ModelError``: e.g. 507 for out of
    #: GPU memory), else SageMaker's own status (400 for ``ValidationError``).
    status: int | None = None
    #: The SageMaker error code (``ModelError``, ``ValidationError``...).
    code: str | None = None
    #: Why the target was not checked at all (neither passed nor failed): the local endpoint's
    #: refusal of a model no CPU can run (a TensorRT plan: ``CannotServeOnCpu``).
    skipped: str | None = None
    #: What a passed row did not check (a TensorRT plan's values: it has no reference outputs).
    note: str | None = None


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
        """No target failed and at least one passed: a run that skipped everything checked nothing."""
        return not self.failures and any(row.ok for row in self.rows)

    @property
    def failures(self) -> list[TargetResult]:
        return [row for row in self.rows if not row.ok and row.skipped is None]

    @property
    def skipped(self) -> list[TargetResult]:
        return [row for row in self.rows if row.skipped is not None]

    def summary(self) -> str:
        """``2 of 3 targets passed; 1 skipped, 0 failed``: skipped targets are counted on their own."""
        passed = sum(row.ok for row in self.rows)
        line = (f"{passed} of {len(self.rows)} targets passed; {len(self.skipped)} skipped, "
                f"{len(self.failures)} failed")
        return line + ("; nothing was checked" if self.rows and not passed and not self.failures else "")


# --------------------------------------------------------------------------------------------
# Invoking and checking one target
# --------------------------------------------------------------------------------------------


def _describe_client_error(error: Any) -> CallFailed:
    """A runtime ``ClientError`` as a row: code, the container's status and a short message."""
    response = error.response
    info = response.get("Error", {})
    code = str(info.get("Code") or "?")
    http_status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    original = response.get("OriginalStatusCode")
    status = int(original) if original is not None else (int(http_status) if http_status else None)
    message = one_line(str(response.get("OriginalMessage") or info.get("Message") or ""))
    hint = ""
    if status == 507:
        hint = " (out of gpu memory: the model does not fit next to the others; SageMaker evicts models)"
    elif code == "ModelNotReadyException":
        hint = " (the model is still loading)"
    shown = f"{code} {status}" if status is not None else code
    return CallFailed("http", f"{shown}{hint}: {message}" if message else f"{shown}{hint}",
                       status=status, code=code)


def _invoke(
    runtime_client: Any, endpoint_name: str, target: str, reference: Reference, timeout_seconds: float
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
        # The client's configured limit, not the seconds measured: the cold and the warm call then
        # say the same and are reported once ("cold and warm: ..."), however loaded the machine.
        kind = "read" if isinstance(error, ReadTimeoutError) else "connect"
        limit = getattr(getattr(runtime_client, "meta", None) and runtime_client.meta.config, f"{kind}_timeout", None)
        shown = f"{float(limit):g} s" if isinstance(limit, int | float) else "its limit"
        raise CallFailed("timeout", f"timeout: no answer within the client's {kind} timeout ({shown})") from None
    except BotoCoreError as error:
        raise CallFailed("connection", f"connection: {one_line(str(error))}") from None
    elapsed = time.perf_counter() - started
    if elapsed > timeout_seconds:
        # The client was built with a longer read timeout; a caller bound by ours would have failed.
        raise CallFailed("timeout", f"timeout: answered after {elapsed:.1f} s, over the {timeout_seconds:g} s limit")
    return elapsed * 1000.0, bytes(body), str(response.get("ContentType") or "")


def _parse_answer(body: bytes, content_type: str) -> Any:
    """A tritonclient ``InferResult`` from a binary+json answer or a plain JSON one."""
    from triton_mme_cdk.model_build.tools.smoke.codec import header_length, parse_response

    try:
        return parse_response(body, header_length(content_type))
    except Exception as error:  # tritonclient raises JSON, index and its own errors
        raise CallFailed(
            "response",
            f"answer ({len(body)} bytes, content type {content_type!r}) is not a triton response: "
            f"{one_line(str(error), 120)}",
        ) from None


def _check_answer(result: Any, reference: Reference, atol: float, rtol: float) -> float | None:
    """Every config output present with the config's datatype and shape, values near the reference
    (``None``: no values compared, where the reference has no outputs: a TensorRT plan's)."""
    from triton_mme_cdk.model_build.artifact.triton_config import wire_datatype

    config = reference.config
    worst = 0.0
    for io_ in config.output:
        meta = result.get_output(io_.name)
        if meta is None:
            raise CallFailed("output", f"output {io_.name!r}: missing in the answer")
        want_type = wire_datatype(io_.data_type)
        if meta.get("datatype") != want_type:
            raise CallFailed(
                "output", f"output {io_.name!r}: datatype {meta.get('datatype')}; the config declares {want_type}"
            )
        try:
            got = result.as_numpy(io_.name)
        except Exception as error:  # a size that does not match shape and datatype
            raise CallFailed("response", f"output {io_.name!r}: cannot be read: {one_line(str(error), 120)}") from None
        dims = list(io_.dims)
        declared = [reference.batch, *dims] if reference.batch is not None else dims
        shape = list(got.shape)
        if len(shape) != len(declared) or any(d not in (-1, s) for s, d in zip(shape, declared, strict=True)):
            raise CallFailed(
                "output",
                f"output {io_.name!r}: shape {shape}; expected {declared} (batch of {reference.batch} "
                f"+ config dims {dims})" if reference.batch is not None
                else f"output {io_.name!r}: shape {shape}; the config declares {dims}",
            )
        if not reference.values_checked:
            continue
        ref = reference.outputs[io_.name]
        if got.shape != ref.shape and got.size == ref.size and io_.HasField("reshape"):
            got = got.reshape(ref.shape)  # the reference holds the model's view of a reshaped output
        if got.shape != ref.shape:
            raise CallFailed(
                "output", f"output {io_.name!r}: shape {shape}; the reference has {list(ref.shape)}"
            )
        worst = max(worst, _compare(io_.name, got, ref, atol, rtol))
    return worst if reference.values_checked else None


def _compare(name: str, got: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> float:
    result = compare_arrays(name, got, ref, atol=atol, rtol=rtol)
    if not result.ok:
        shown = result.max_abs_diff if math.isfinite(result.max_abs_diff) else None
        raise CallFailed("output", result.problem or "", max_diff=shown)
    return result.max_abs_diff


def _smoke_target(
    runtime_client: Any,
    endpoint_name: str,
    target: str,
    source_model: str,
    reference: Reference,
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
    problems: list[tuple[str, CallFailed]] = []
    diffs: list[float] = []
    atol, rtol = reference.tolerance(atol, rtol)
    for label in ("cold", "warm"):
        try:
            ms, body, content_type = _invoke(runtime_client, endpoint_name, target, reference, timeout_seconds)
            setattr(row, f"{label}_ms", round(ms, 3))
            diff = _check_answer(_parse_answer(body, content_type), reference, atol, rtol)
            diffs.extend([] if diff is None else [diff])
        except CallFailed as failed:
            if failed.code == CANNOT_SERVE_ON_CPU:  # the endpoint cannot load it at all: not a verdict
                row.skipped = str(failed).partition(": ")[2] or str(failed)
                return row
            problems.append((label, failed))
            if failed.max_diff is not None:
                diffs.append(failed.max_diff)
    row.max_diff = max(diffs) if diffs else None
    if not problems:
        row.ok = True
        if not reference.values_checked:
            row.note = ("values not compared: a TensorRT plan has no reference outputs (never run at build "
                        "time); output names, data types and shapes checked")
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
        raise smoke_error(f"sample: got {sample}; expected at least 1 target")
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
    from triton_mme_cdk.model_build.release.index import read_index
    from triton_mme_cdk.model_build.release.routes import target_problem

    if timeout_seconds <= 0:
        raise smoke_error(f"timeout: got {timeout_seconds:g} s; expected more than 0")
    started = time.perf_counter()
    model_data_url, status = find_model_data_url(sagemaker_client, endpoint_name)
    bucket, prefix, index_key = index_location(s3_client, model_data_url, release)
    release_url = f"s3://{bucket}/{prefix}/" if prefix else f"s3://{bucket}/"
    index = read_index(s3_client, bucket, index_key)
    if index is None:
        chosen = f"release {release!r}" if release else f"its model data url {model_data_url}"
        raise smoke_error(
            f"endpoint {endpoint_name!r}: no release index at s3://{bucket}/{index_key} for {chosen}; "
            "the release was never published there or its publish did not finish"
        )
    entries: dict[str, dict[str, Any]] = {}
    for entry in index.get("models") or []:
        if isinstance(entry, dict) and isinstance(entry.get("target_model"), str):
            entries[entry["target_model"]] = entry
    if not entries:
        raise smoke_error(f"endpoint {endpoint_name!r}: index s3://{bucket}/{index_key} lists no models")
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
    references: dict[str, Reference] = {}
    with tempfile.TemporaryDirectory(prefix="smoke-") as tmp:
        for target in chosen_targets:
            entry = entries[target]
            source_model = str(entry.get("source_model") or target.removesuffix(".tar.gz"))
            # The served layout names each target after its digest: any other name is refused.
            problem = (target_problem(str(entry["logical_name"]), target, str(entry.get("sha256") or ""))
                       if "logical_name" in entry else None)
            if problem is not None:
                row = TargetResult(target, source_model, error=problem, kind="route")
                report.rows.append(row)
                if progress is not None:
                    progress(row)
                continue
            if source_model not in references:
                references[source_model] = prepare_reference(
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
