"""Lambda handlers of the stack's model-build custom resource (the CDK ``Provider`` contract).

The Provider's asynchronous pattern is used because a build can outlast one Lambda run:

- ``on_event`` checks the request and the manifest in seconds and names the physical resource
  after the release (``s3://<bucket>/<prefix>/<release>/``). A changed manifest gives a new
  release, hence a new physical id, hence CloudFormation replaces the resource and later sends a
  Delete for the superseded release during update clean-up.
- ``is_complete`` does the work. Each call builds and publishes as many models as fit in its own
  Lambda run, then returns ``IsComplete: False``; the Provider calls it again until the release
  index exists (the build is finished) or the Provider's total timeout fails the resource. Work
  already in S3 is skipped, which is sound because a release is immutable and its bytes are
  reproducible. Nothing is kept in ``/tmp`` between calls.

Failures reach CloudFormation as a short reason naming the model and the step.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from model_build.errors import ManifestError, ModelBuildError
from model_build.manifest import Manifest, ModelSpec, parse_manifest
from model_build.release import INDEX_NAME, Release

LOG = logging.getLogger("model_build.handler")
LOG.setLevel(logging.INFO)

#: Seconds kept free at the end of a Lambda run (upload of the last artifact, the response).
SAFETY_MARGIN_SECONDS = 60.0
#: Until one model has been timed, assume a build takes this long.
FIRST_MODEL_ESTIMATE_SECONDS = 240.0
RELEASE_ID = re.compile(r"^r-[0-9a-f]{16}$")
PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()/-]{1,512}$")
ON_DELETE = ("retain", "destroy")
#: Stack states in which a Delete means "the stack is going away" rather than "superseded".
STACK_DELETING = {"DELETE_IN_PROGRESS"}


class HandlerError(Exception):
    """What the Lambda raises: its message becomes CloudFormation's status reason."""


class Request:
    """The custom resource's properties, checked once with messages naming the property."""

    def __init__(self, event: dict[str, Any]) -> None:
        self.event = event
        self.request_type: str = event["RequestType"]
        props: dict[str, Any] = event.get("ResourceProperties", {})
        self.props = props

        def required(name: str) -> str:
            value = props.get(name)
            if not isinstance(value, str) or not value:
                raise HandlerError(f"property {name}: got {value!r}; expected a non-empty string")
            return value

        self.model_bucket = required("ModelBucket")
        self.model_prefix = props.get("ModelPrefix", "models").strip("/")
        if self.model_prefix and not PREFIX.match(self.model_prefix):
            raise HandlerError(f"property ModelPrefix: got {self.model_prefix!r}; expected S3-safe characters")
        self.release_id = required("ReleaseId")
        if not RELEASE_ID.match(self.release_id):
            raise HandlerError(f"property ReleaseId: got {self.release_id!r}; expected r- and 16 hex digits")
        self.manifest_bucket = required("ManifestBucket")
        self.manifest_key = required("ManifestKey")
        self.manifest_sha256 = required("ManifestSha256")
        self.code_sha256 = props.get("CodeSha256", "")
        self.on_delete = props.get("OnDelete", "retain")
        if self.on_delete not in ON_DELETE:
            raise HandlerError(f"property OnDelete: got {self.on_delete!r}; expected one of {', '.join(ON_DELETE)}")
        self.retired_tag_key = props.get("RetiredTagKey", "triton-mme:release-state")

    @property
    def release(self) -> Release:
        return Release(self.release_id, self.manifest_sha256, self.code_sha256)

    @property
    def release_prefix(self) -> str:
        return self.release.prefix(self.model_prefix)

    @property
    def physical_id(self) -> str:
        return f"s3://{self.model_bucket}/{self.release_prefix}/"

    def data(self, model_count: int) -> dict[str, str]:
        """The response attributes: a handful of short strings, whatever the number of models."""
        return {
            "ModelDataUrl": self.physical_id,
            "ReleasePrefix": self.release_prefix + "/",
            "IndexKey": f"{self.release_prefix}/{INDEX_NAME}",
            "ModelCount": str(model_count),
            "ReleaseId": self.release_id,
        }


def _s3() -> Any:
    from model_build.local_s3 import make_s3_client

    return make_s3_client(endpoint_url=os.environ.get("MODEL_BUILD_S3_ENDPOINT_URL"))


def _load_manifest(s3: Any, request: Request) -> Manifest:
    body = s3.get_object(Bucket=request.manifest_bucket, Key=request.manifest_key)["Body"].read()
    import yaml

    try:
        data = yaml.safe_load(body)
    except yaml.YAMLError as error:
        raise ManifestError(f"manifest: not valid YAML: {error}") from None
    manifest = parse_manifest(data, origin="manifest")
    if manifest.content_sha256() != request.manifest_sha256:
        raise ManifestError(
            f"manifest: content sha256 {manifest.content_sha256()[:16]}... does not match property "
            f"ManifestSha256 {request.manifest_sha256[:16]}...; the asset and the template disagree"
        )
    return manifest


def _short(error: BaseException) -> HandlerError:
    if isinstance(error, ModelBuildError):
        return HandlerError(error.short_reason())
    return HandlerError(" ".join(str(error).split())[:400])


# ----------------------------------------------------------------------------------------------
# on_event
# ----------------------------------------------------------------------------------------------


def on_event(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    LOG.info("on_event %s %s", event.get("RequestType"), event.get("PhysicalResourceId"))
    try:
        if event["RequestType"] == "Delete":
            # A Delete must succeed even for a resource whose Create failed before it had an id.
            return {"PhysicalResourceId": event.get("PhysicalResourceId", "none")}
        request = Request(event)
        # Fail in seconds on a manifest that cannot build, before any model is loaded.
        _load_manifest(_s3(), request)
        return {"PhysicalResourceId": request.physical_id}
    except (HandlerError, ModelBuildError) as error:
        raise _short(error) from None


# ----------------------------------------------------------------------------------------------
# is_complete
# ----------------------------------------------------------------------------------------------


def _published(present: Mapping[str, int], request: Request, spec: ModelSpec) -> bool:
    """Every target of ``spec`` is in the release (``present``: one listing of its prefix)."""
    return all(request.release.key(request.model_prefix, t) in present for t in spec.target_names())


def _build_and_publish(s3: Any, request: Request, spec: ModelSpec, work: Path) -> None:
    from model_build.build import build_model
    from model_build.publish import publish_release

    release_dir = work / "release"
    release_dir.mkdir(parents=True, exist_ok=True)
    result = build_model(
        spec,
        base_dir=work,
        release_dir=release_dir,
        work_dir=work / "work",
        s3_client=s3,
    )
    publish_release(
        [result.artifact(release_dir)],
        s3_client=s3,
        bucket=request.model_bucket,
        release_prefix=request.release_prefix,
        index_extra={},
        write_index=False,
    )


def _write_index(s3: Any, request: Request, manifest: Manifest) -> None:
    from model_build.publish import write_index_from_bucket

    write_index_from_bucket(
        s3,
        bucket=request.model_bucket,
        release_prefix=request.release_prefix,
        models=[(spec.name, spec.format, spec.target_names()) for spec in manifest.models],
        index_extra={
            "release_id": request.release_id,
            "manifest_sha256": request.manifest_sha256,
            "code_sha256": request.code_sha256,
        },
    )


def _remaining_seconds(context: Any) -> float:
    if context is not None and hasattr(context, "get_remaining_time_in_millis"):
        return float(context.get_remaining_time_in_millis()) / 1000.0
    return float(os.environ.get("MODEL_BUILD_TIME_BUDGET_SECONDS", "840"))


def _stack_status(stack_id: str) -> str | None:
    import boto3

    endpoint_url = os.environ.get("MODEL_BUILD_CLOUDFORMATION_ENDPOINT_URL")  # for local tests
    try:
        client = boto3.client("cloudformation", endpoint_url=endpoint_url)
        stacks = client.describe_stacks(StackName=stack_id)["Stacks"]
    except Exception as error:  # the answer only chooses retire vs keep: never fail a Delete on it
        LOG.warning("could not read the stack status (%s); treating the delete as a supersede", error)
        return None
    return stacks[0]["StackStatus"] if stacks else None


def _delete(event: dict[str, Any]) -> dict[str, Any]:
    from model_build.publish import delete_release, retire_release

    physical = event.get("PhysicalResourceId", "")
    try:
        request = Request(event)
    except HandlerError as error:
        LOG.warning("delete of %s with unusable properties (%s): nothing to do", physical, error)
        return {"IsComplete": True}
    if physical != request.physical_id:
        # The Create never got as far as naming a release: nothing was published under this id.
        LOG.info("delete of %s: not a release of this resource, nothing to do", physical)
        return {"IsComplete": True}
    s3 = _s3()
    status = _stack_status(event.get("StackId", ""))
    if status in STACK_DELETING:
        if request.on_delete == "destroy":
            count = delete_release(s3, request.model_bucket, request.release_prefix)
            LOG.info("stack deleted: removed %d objects of %s", count, physical)
        else:
            LOG.info("stack deleted: keeping %s (OnDelete=retain)", physical)
    else:
        # Superseded by a newer release (update clean-up) or abandoned (rollback): tag it, and
        # the bucket's lifecycle rule expires it once running instances no longer need it.
        count = retire_release(s3, request.model_bucket, request.release_prefix,
                               tag_key=request.retired_tag_key)
        LOG.info("release %s superseded: tagged %d objects as retired", physical, count)
    return {"IsComplete": True}


def is_complete(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    LOG.info("is_complete %s %s", event.get("RequestType"), event.get("PhysicalResourceId"))
    try:
        if event["RequestType"] == "Delete":
            return _delete(event)
        return _build_step(event, context)
    except (HandlerError, ModelBuildError) as error:
        raise _short(error) from None


def _build_step(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from model_build.publish import list_release, read_index

    request = Request(event)
    s3 = _s3()
    index_key = request.release.index_key(request.model_prefix)
    manifest = _load_manifest(s3, request)
    if read_index(s3, request.model_bucket, index_key) is not None:
        return {"IsComplete": True, "Data": request.data(manifest.target_count)}

    present = list_release(s3, request.model_bucket, request.release_prefix)
    slowest = FIRST_MODEL_ESTIMATE_SECONDS
    built_here = 0
    for spec in manifest.models:
        if _published(present, request, spec):
            continue
        remaining = _remaining_seconds(context) - SAFETY_MARGIN_SECONDS
        if built_here and remaining < slowest * 1.5:
            LOG.info("%.0f s left in this run; continuing in the next call", remaining)
            return {"IsComplete": False}
        started = time.perf_counter()
        work = Path(tempfile.mkdtemp(prefix=f"build-{spec.name}-", dir=os.environ.get("TMPDIR")))
        try:
            _build_and_publish(s3, request, spec, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        elapsed = time.perf_counter() - started
        slowest = max(slowest if built_here else 0.0, elapsed)
        built_here += 1
        LOG.info("built and published %s in %.1f s", spec.name, elapsed)
    _write_index(s3, request, manifest)
    return {"IsComplete": True, "Data": request.data(manifest.target_count)}

