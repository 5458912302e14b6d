"""The build function's side of a model built on SageMaker Processing: where it builds (the plan
step places each model with :mod:`model_build.manifest.build_engine`), the job's input document, and the
two steps after the job: ``store_job`` (the job's unit into the store, as a Lambda-built model
is stored, after its ``artifact.json`` is confined to the job's output folder and its tarball has
passed the pre-publish gate again in the Lambda) and ``job_failed`` (the job's reason recorded for ``is_complete``; no capacity is
raised as :class:`ProcessingCapacityError`, which the state machine retries with backoff).

The job reads and writes only through its ProcessingInputs and ProcessingOutputs, under
``<prefix>/_jobs/<release>/<model>/`` (``input/`` and ``output/``) and the model's S3 source:
SageMaker moves the bytes, so the job runs with network isolation like the endpoint.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.manifest import Manifest, ModelSpec, OnnxFileSource, S3Source
from triton_mme_cdk.model_build.manifest.build_engine import (
    EngineSettings,
    Placement,
    estimate,
    place,
    weight_bytes_of,
)
from triton_mme_cdk.model_build.release.identity import JOBS_DIR

#: Where the job finds its inputs and leaves its unit (the container's view).
CONTAINER_INPUT = "/opt/ml/processing/input"
CONTAINER_OUTPUT = "/opt/ml/processing/output/unit"
#: The unit's description next to its files: the :class:`~model_build.types.Artifact` fields.
ARTIFACT_FILE = "artifact.json"
#: Words SageMaker's FailureReason starts with when it could not get an instance.
CAPACITY_REASONS = ("CapacityError", "InsufficientCapacity", "ResourceLimitExceeded")


class ProcessingCapacityError(Exception):
    """No instance for the job (its FailureReason says capacity): the state machine retries."""


def job_prefix(model_prefix: str, release_id: str, model: str) -> str:
    base = f"{model_prefix}/" if model_prefix else ""
    return f"{base}{JOBS_DIR}/{release_id}/{model}"


def source_mount(spec: ModelSpec) -> tuple[str, str] | None:
    """``(s3 folder URI, bucket/prefix)`` SageMaker downloads for an S3 source, or None."""
    source = spec.source
    if isinstance(source, S3Source):
        uri = source.uri
    elif isinstance(source, OnnxFileSource) and source.path.startswith("s3://"):
        uri = source.path.rsplit("/", 1)[0]  # the file's folder: its external data sits beside it
    else:
        return None
    return (uri if uri.endswith("/") else uri + "/"), uri


def s3_weight_bytes(s3: Any, spec: ModelSpec) -> tuple[int | None, str | None]:
    """The weight bytes of an S3 source from one listing, or ``(None, why)``."""
    mount = source_mount(spec)
    if mount is None:
        return None, f"a {spec.source.kind} source is sized once it is built"
    bucket, _, prefix = mount[0][len("s3://"):].partition("/")
    source = spec.source
    owner = source.owner_args() if isinstance(source, (S3Source, OnnxFileSource)) else {}
    try:
        sizes = [(item["Key"], int(item["Size"]))
                 for page in s3.get_paginator("list_objects_v2").paginate(
                     Bucket=bucket, Prefix=prefix, **owner)
                 for item in page.get("Contents", [])]
    except Exception as error:  # the build reports a missing source itself, with its own message
        return None, f"listing {mount[0]} failed: {' '.join(str(error).split())[:120]}"
    if isinstance(spec.source, OnnxFileSource):
        file_key = spec.source.path[len(f"s3://{bucket}/"):]
        sizes = [(key, size) for key, size in sizes if key in (file_key, file_key + ".data")]
    weights = weight_bytes_of(sizes)
    return (weights, None) if weights else (None, f"no weight files under {mount[0]}")


def placement_at_deploy(s3: Any, spec: ModelSpec, settings: EngineSettings) -> Placement:
    """Where ``spec`` builds, its S3 source sized now (at synth it could not be)."""
    weights, why = s3_weight_bytes(s3, spec)
    return place(spec, estimate(spec, weights, why), settings)


def processing_item(s3: Any, *, bucket: str, request_props: Mapping[str, Any], manifest: Manifest,
                    spec: ModelSpec, key: str, model_prefix: str, release_id: str,
                    placement: Placement) -> dict[str, Any]:
    """Write the job's input document and return the Map item's ``Job``: the job's name prefix,
    instance, volume, inputs and output, all under the model's job folder."""
    folder = job_prefix(model_prefix, release_id, spec.name)
    mount = source_mount(spec)
    document = {"Request": dict(request_props), "Model": spec.name, "Key": key,
                "Manifest": manifest.canonical_json(),
                "Mounts": {mount[0]: f"{CONTAINER_INPUT}/source"} if mount else {}}
    s3.put_object(Bucket=bucket, Key=f"{folder}/input/request.json", Body=json.dumps(document).encode(),
                  ContentType="application/json")
    inputs = [_s3_input("request", f"s3://{bucket}/{folder}/input/", f"{CONTAINER_INPUT}/request")]
    if mount is not None:
        inputs.append(_s3_input("source", mount[0], f"{CONTAINER_INPUT}/source"))
    return {"NamePrefix": f"mb-{key[2:14]}", "InstanceType": placement.instance_type,
            "VolumeGb": placement.volume_gb, "Inputs": inputs, "Output": f"s3://{bucket}/{folder}/output/"}


def _s3_input(name: str, uri: str, local: str) -> dict[str, Any]:
    return {"InputName": name, "S3Input": {"S3Uri": uri, "LocalPath": local, "S3DataType": "S3Prefix",
                                           "S3InputMode": "File", "S3DataDistributionType": "FullyReplicated"}}


# ---------------------------------------------------------------------------------------------
# After the job
# ---------------------------------------------------------------------------------------------


def store_unit(s3: Any, *, bucket: str, model_prefix: str, output_uri: str, model: str, key: str) -> None:
    """Store the job's unit under ``<prefix>/_builds/<key>/`` as :func:`publish_unit` stores a
    Lambda-built one (same bytes, checksums, reference and index written last)."""
    from triton_mme_cdk.model_build.release.store import publish_unit
    from triton_mme_cdk.model_build.types import Artifact

    out_bucket, _, out_prefix = output_uri[len("s3://"):].partition("/")
    work = Path(tempfile.mkdtemp(prefix=f"job-{model}-"))
    try:
        listing = [item["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=out_bucket, Prefix=out_prefix) for item in page.get("Contents", [])]
        names = {k[len(out_prefix):] for k in listing}
        if ARTIFACT_FILE not in names:
            raise ModelBuildError(f"the Processing job left no {ARTIFACT_FILE} under {output_uri}", model=model,
                                  step="store")
        for name in names:
            if "/" in name or name.startswith("."):
                continue
            s3.download_file(out_bucket, out_prefix + name, str(work / name))
        described = _described(work, names, output_uri, model=model, key=key)
        artifact = Artifact(name=model, format=described["format"], path=work / described["tarball"],
                            sha256=described["sha256"], size=int(described["size"]),
                            targets=tuple(described["targets"]),
                            reference_path=work / described["reference"] if described.get("reference") else None,
                            config_path=work / described["config"] if described.get("config") else None,
                            signature=described.get("signature") or None)
        # The job's output is untrusted until checked here: the gate again, on the tarball the
        # Lambda will publish (publish_unit then checks its bytes against the digest).
        from triton_mme_cdk.model_build.artifact.gate import check_repository

        check_repository(artifact.path, model=model)
        publish_unit(artifact, key, s3_client=s3, bucket=bucket, model_prefix=model_prefix)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _described(work: Path, names: set[str], output_uri: str, *, model: str, key: str) -> dict[str, Any]:
    """The job's ``artifact.json``, each path in it one of the files the job left in its output
    folder (a name, never a path: nothing outside the folder is read), of this model and key."""
    def refuse(what: str) -> ModelBuildError:
        return ModelBuildError(f"the Processing job's {ARTIFACT_FILE} under {output_uri}: {what}; nothing was "
                               "stored", model=model, step="store")

    try:
        described = json.loads((work / ARTIFACT_FILE).read_text())
    except (OSError, ValueError) as error:
        raise refuse(f"not readable JSON ({type(error).__name__})") from None
    if not isinstance(described, dict):
        raise refuse(f"a {type(described).__name__}, expected an object")
    if described.get("key") != key:
        raise refuse(f"key {described.get('key')!r}, not {key!r}")
    if described.get("name") != model:
        raise refuse(f"name {described.get('name')!r}, not {model!r}")
    for field in ("tarball", "reference", "config"):
        value = described.get(field)
        if value is None or (field != "tarball" and not value):
            if field == "tarball":
                raise refuse("tarball missing")
            continue
        if not isinstance(value, str) or value not in names or "/" in value or "\\" in value \
                or value.startswith(".") or value == ARTIFACT_FILE:
            raise refuse(f"{field} {str(value)[:200]!r} is not a file the job left in its output folder (a "
                         "plain file name is allowed, never a path)")
    return described


def failure_reason(model: str, error: Any, cause: Any) -> tuple[str, bool]:
    """The short reason of a failed job from the task's error and cause (the job's description
    as JSON, where Step Functions gives it), and whether it is a capacity failure."""
    described: dict[str, Any] = {}
    if isinstance(cause, str):
        try:
            parsed = json.loads(cause)
            described = parsed if isinstance(parsed, dict) else {}
        except ValueError:
            described = {}
    failure = str(described.get("FailureReason") or "").strip()
    message = str(described.get("ExitMessage") or "").strip()
    status = described.get("ProcessingJobStatus")
    name = described.get("ProcessingJobName") or "?"
    capacity = any(failure.startswith(word) or word in str(error) for word in CAPACITY_REASONS)
    if message:
        reason = message  # the build's own one line, written by the job
    elif failure:
        reason = f"Processing job {name} {str(status or 'failed').lower()}: {failure}"
    else:
        text = " ".join(str(cause or "").split())[:300]
        reason = f"Processing job failed ({error}): {text}" if text else f"Processing job failed ({error})"
    if not reason.startswith(("build", "export", "validate", "package")) and repr(model) not in reason:
        reason = f"build of model {model!r} on SageMaker Processing: {reason}"
    return " ".join(reason.split())[:400], capacity
