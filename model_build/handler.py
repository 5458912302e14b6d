"""Lambda handlers of the stack's model-build custom resource (the CDK ``Provider`` contract) and
of its build state machine.

Builds are incremental and content-addressed (see :mod:`model_build.release`): each model has a
key; a built model is stored once under ``<prefix>/_builds/<key>/``; a release is assembled from
the store by server-side copies, its index written last. A release prefix stays immutable.

- ``on_event`` checks the request and the manifest in seconds and names the physical resource
  after the fixed served prefix (``s3://<bucket>/<prefix>/served/``, the endpoint's
  ``ModelDataUrl``): a new release is an Update of the same resource, never a replacement, so
  CloudFormation sends no clean-up Delete that could remove what the live fleet serves. With a
  ``BuildStateMachineArn`` property it starts the build state machine (unless the release index
  already exists: a rollback, or an unchanged release, builds nothing).
- ``build_step`` is the state machine's one function: ``plan`` writes the Map's item source
  (the models whose key is not stored), ``build`` builds and stores one model (one Lambda run
  each, in parallel), ``finish`` assembles the release and writes its index. A failing model
  records its name and reason under ``<prefix>/_plans/`` and fails its Map item; ``plan``
  resets that record to a "no failure" marker (a put, not a delete: the build role may not
  delete unless ``OnDelete`` is ``destroy``).
- ``is_complete`` polls: the release index exists -> route it (:func:`model_build.serving.
  activate_release`: check the newly routed objects, delete the expired unrouted ones, write the
  routes document last) -> done; the execution runs -> not yet; the execution failed -> the
  failing model's reason, which CloudFormation shows (the previous routes keep serving). Without a state
  machine it builds as many models per run as fit, across several calls (the same per-model
  unit and final step). Nothing is kept in ``/tmp`` between calls.

Failures reach CloudFormation as a short reason naming the model and the step.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from model_build.errors import ManifestError, ModelBuildError
from model_build.manifest import MAX_MANIFEST_BYTES, Manifest, ModelSpec, load_manifest_bytes
from model_build.release import Release, compute_release, routes_key, served_prefix

LOG = logging.getLogger("model_build.handler")
LOG.setLevel(logging.INFO)

#: Seconds kept free at the end of a Lambda run (upload of the last artifact, the response).
SAFETY_MARGIN_SECONDS = 60.0
#: Until one model has been timed, assume a build takes this long.
FIRST_MODEL_ESTIMATE_SECONDS = 240.0
RELEASE_ID = re.compile(r"^r-[0-9a-f]{16}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()/-]{1,512}$")
ON_DELETE = ("retain", "destroy")
#: Folder (under the model prefix) of the Map's item sources, one JSON array per release.
PLANS_DIR = "_plans"
#: Stack states in which a Delete means "the stack is going away" rather than "superseded".
STACK_DELETING = {"DELETE_IN_PROGRESS"}


class HandlerError(Exception):
    """What the Lambda raises: its message becomes CloudFormation's status reason."""


#: The request types CloudFormation sends to a custom resource.
REQUEST_TYPES = ("Create", "Update", "Delete")
#: Longest property value echoed in a reason (a hostile event must not fill CloudFormation's 4 KB).
_SHOWN = 80


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def request_type(event: Any) -> str:
    """The event's ``RequestType``, or a :class:`HandlerError` naming what was wrong.

    Checked first in every entry point, so a malformed event fails the resource at once with a
    reason CloudFormation shows, instead of a ``KeyError`` or a build that never starts."""
    if not isinstance(event, Mapping):
        raise HandlerError(f"event: got {type(event).__name__}; expected a CloudFormation request object")
    value = event.get("RequestType")
    if value not in REQUEST_TYPES:
        raise HandlerError(f"event RequestType: got {_shown(value)}; expected one of {', '.join(REQUEST_TYPES)}")
    return str(value)


class Request:
    """The custom resource's properties, checked once with messages naming the property."""

    def __init__(self, event: dict[str, Any]) -> None:
        self.event = event
        self.request_type: str = request_type(event)
        props = event.get("ResourceProperties", {})
        if not isinstance(props, dict):
            raise HandlerError(f"event ResourceProperties: got {type(props).__name__}; expected an object")
        self.props: dict[str, Any] = props

        def required(name: str) -> str:
            value = props.get(name)
            if not isinstance(value, str) or not value:
                raise HandlerError(f"property {name}: got {_shown(value)}; expected a non-empty string")
            return value

        def optional(name: str, default: str) -> str:
            value = props.get(name, default)
            if not isinstance(value, str):
                raise HandlerError(f"property {name}: got {_shown(value)}; expected a string")
            return value

        self.model_bucket = required("ModelBucket")
        self.model_prefix = optional("ModelPrefix", "models").strip("/")
        if self.model_prefix and not PREFIX.match(self.model_prefix):
            raise HandlerError(f"property ModelPrefix: got {_shown(self.model_prefix)}; expected S3-safe characters")
        self.release_id = required("ReleaseId")
        if not RELEASE_ID.match(self.release_id):
            raise HandlerError(f"property ReleaseId: got {_shown(self.release_id)}; expected r- and 16 hex digits")
        self.manifest_bucket = required("ManifestBucket")
        self.manifest_key = required("ManifestKey")
        self.manifest_sha256 = required("ManifestSha256")
        if not SHA256.match(self.manifest_sha256):
            raise HandlerError(f"property ManifestSha256: got {_shown(self.manifest_sha256)}; expected 64 hex digits")
        self.code_sha256 = optional("CodeSha256", "")
        self.on_delete = optional("OnDelete", "retain")
        if self.on_delete not in ON_DELETE:
            raise HandlerError(f"property OnDelete: got {_shown(self.on_delete)}; expected one of {', '.join(ON_DELETE)}")
        self.retired_tag_key = optional("RetiredTagKey", "triton-mme:release-state")
        retention = optional("RetentionDays", "7")
        try:
            self.retention_days = float(retention)
            if not 0 <= self.retention_days <= 36500:
                raise ValueError
        except ValueError:
            raise HandlerError(f"property RetentionDays: got {_shown(retention)}; expected a number of days, 0 to 36500") from None
        fleet = optional("Fleet", "{}")
        try:
            self.fleet: dict[str, Any] = json.loads(fleet)
            if not isinstance(self.fleet, dict):
                raise ValueError
        except ValueError:
            raise HandlerError(f"property Fleet: got {_shown(fleet)}; expected a JSON object of settings") from None
        self.stack_id = str(event.get("StackId") or "")

    @property
    def release(self) -> Release:
        return Release(self.release_id, self.manifest_sha256, self.code_sha256)

    @property
    def release_prefix(self) -> str:
        return self.release.prefix(self.model_prefix)

    @property
    def physical_id(self) -> str:
        """The fixed served prefix: the same for every release of this bucket and prefix."""
        return f"s3://{self.model_bucket}/{served_prefix(self.model_prefix)}/"

    def data(self, model_count: int) -> dict[str, str]:
        """The response attributes: a handful of short strings, whatever the number of models.
        No SageMaker resource reads them (the endpoint's ModelDataUrl comes from the settings)."""
        return {
            "ModelDataUrl": self.physical_id,
            "RoutesKey": routes_key(self.model_prefix),
            "IndexKey": self.release.index_key(self.model_prefix),
            "ModelCount": str(model_count),
            "ReleaseId": self.release_id,
        }

    def activate(self, s3: Any) -> Any:
        """Route this request's release (its index exists)."""
        from model_build.release.serving import activate_release

        report = activate_release(
            s3, self.model_bucket, self.model_prefix, self.release_id, stack=self.stack_id, fleet=self.fleet,
            retention_days=self.retention_days,
        )
        LOG.info("routed %s (was %s): %d routes, %d verified, %d copied back, %d unrouted now, %d deleted "
                 "after the retention window, routes written: %s", report.release_id, report.previous_release,
                 report.routed, report.verified, report.copied, len(report.unrouted_now), len(report.deleted),
                 report.wrote)
        return report


def _s3() -> Any:
    from model_build.aws_clients import make_s3_client

    return make_s3_client(endpoint_url=os.environ.get("MODEL_BUILD_S3_ENDPOINT_URL"))


def _load_manifest(s3: Any, request: Request) -> Manifest:
    """The manifest asset, read under the same limits as on a laptop; a missing or unreadable
    object fails at once with the S3 error code (a deleted asset must not wait out the timeout)."""
    from botocore.exceptions import BotoCoreError, ClientError

    where = f"s3://{request.manifest_bucket}/{request.manifest_key}"
    try:
        response = s3.get_object(Bucket=request.manifest_bucket, Key=request.manifest_key)
        size = int(response.get("ContentLength") or 0)
        if size > MAX_MANIFEST_BYTES:
            response["Body"].close()
            raise ManifestError(
                f"manifest {where!r}: is {size} bytes; at most {MAX_MANIFEST_BYTES} (MAX_MANIFEST_BYTES) are read"
            )
        body = response["Body"].read(MAX_MANIFEST_BYTES + 1)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "?")
        hint = "; the asset was deleted or is not readable: deploy again to upload it" if code in (
            "NoSuchKey", "NoSuchBucket", "AccessDenied", "404", "403") else ""
        raise ManifestError(f"manifest object {where}: cannot be read ({code}){hint}") from None
    except BotoCoreError as error:
        raise ManifestError(f"manifest object {where}: cannot be read ({error})") from None
    manifest = load_manifest_bytes(body, origin=where)
    if manifest.content_sha256() != request.manifest_sha256:
        raise ManifestError(
            f"manifest: content sha256 {manifest.content_sha256()[:16]}... does not match property "
            f"ManifestSha256 {request.manifest_sha256[:16]}...; the asset and the template disagree"
        )
    return manifest


def _short(error: BaseException) -> HandlerError:
    if isinstance(error, ModelBuildError):
        return HandlerError(error.short_reason())
    if isinstance(error, HandlerError):
        return HandlerError(" ".join(str(error).split())[:400])
    # Anything else is a bug or an AWS failure: CloudFormation gets one short line at once
    # (the traceback goes to the log), never a resource left waiting for the timeout.
    LOG.error("unexpected failure", exc_info=error)
    return HandlerError(f"{type(error).__name__}: {' '.join(str(error).split())}"[:400])


# ----------------------------------------------------------------------------------------------
# on_event
# ----------------------------------------------------------------------------------------------


def on_event(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    try:
        kind = request_type(event)  # first: a malformed event is refused before anything reads it
        LOG.info("on_event %s %s", kind, _shown(event.get("PhysicalResourceId")))
        if kind == "Delete":
            # A Delete must succeed even for a resource whose Create failed before it had an id.
            return {"PhysicalResourceId": event.get("PhysicalResourceId", "none")}
        request = Request(event)
        # Fail in seconds on a manifest that cannot build, before any model is loaded.
        s3 = _s3()
        _load_manifest(s3, request)
        response: dict[str, Any] = {"PhysicalResourceId": request.physical_id}
        machine = request.props.get("BuildStateMachineArn")
        if machine:
            from model_build.release.index import read_index

            if read_index(s3, request.model_bucket, request.release.index_key(request.model_prefix)) is None:
                response["Data"] = {"BuildExecutionArn": _start_build(request, str(machine), event)}
        return response
    except Exception as error:
        raise _short(error) from None


def _states() -> Any:
    import boto3

    return boto3.client("stepfunctions", endpoint_url=os.environ.get("MODEL_BUILD_STATES_ENDPOINT_URL"))


def _start_build(request: Request, machine: str, event: Mapping[str, Any]) -> str:
    """Start the build state machine for this request; returns the execution ARN.

    The execution is named after the release and CloudFormation's request id: unique per
    request, and the same request retried by the Provider cannot start a second build."""
    name = f"{request.release_id}-{str(event.get('RequestId', 'request'))[:36]}"
    properties = {k: v for k, v in request.props.items() if k != "ServiceToken"}
    states = _states()
    try:
        return str(states.start_execution(stateMachineArn=machine, name=name,
                                          input=json.dumps({"Request": properties}))["executionArn"])
    except states.exceptions.ExecutionAlreadyExists:
        return f"{machine.replace(':stateMachine:', ':execution:')}:{name}"


def _failure_key(request: Request) -> str:
    base = f"{request.model_prefix}/" if request.model_prefix else ""
    return f"{base}{PLANS_DIR}/{request.release_id}.failure.json"


#: The failure record's body while no model of the current attempt has failed (the plan writes it).
NO_FAILURE = b'{"model": null, "reason": null}'


def _clear_failure(s3: Any, request: Request) -> None:
    s3.put_object(Bucket=request.model_bucket, Key=_failure_key(request), Body=NO_FAILURE,
                  ContentType="application/json")


def _execution_outcome(s3: Any, request: Request, execution_arn: str) -> dict[str, Any]:
    """``IsComplete: False`` while the build runs; a failed build raises with the failing
    model's name and reason (recorded by the build function), or the execution's error."""
    described = _states().describe_execution(executionArn=execution_arn)
    status = described["status"]
    if status == "RUNNING":
        return {"IsComplete": False}
    if status == "SUCCEEDED":
        raise HandlerError(f"build execution {execution_arn} succeeded but the release has no index")
    try:
        body = s3.get_object(Bucket=request.model_bucket, Key=_failure_key(request))["Body"].read()
        recorded = json.loads(body)["reason"]
        if not recorded:  # the plan's "no failure" marker: no model recorded a failure
            raise LookupError("no failure recorded")
        reason = str(recorded)
    except Exception:  # no record (a Lambda timeout or out of memory): the execution's own error
        error = described.get("error") or status
        cause = " ".join(str(described.get("cause") or "").split())[:300]
        reason = f"build execution {status.lower()}: {error}" + (f": {cause}" if cause else "") + (
            "; the state machine's Map Run lists the failed model"
        )
    raise HandlerError(reason)


# ----------------------------------------------------------------------------------------------
# is_complete
# ----------------------------------------------------------------------------------------------


def _computed(manifest: Manifest) -> Release:
    """This runtime's release of the manifest: each model's key (its own code and library
    versions; the Lambda has no local sources), the model code's hash and each entry's hash.
    The CDK app computed the same keys at synth from the same files."""
    return compute_release(manifest, base_dir=Path(tempfile.gettempdir()))


def _model_keys(manifest: Manifest) -> dict[str, str]:
    return dict(_computed(manifest).model_keys)


def _build_and_store(s3: Any, request: Request, spec: ModelSpec, key: str) -> None:
    """The per-model unit: build one entry and store it under ``<prefix>/_builds/<key>/``."""
    from model_build.pipeline import BuildOptions, build_unit
    from model_build.release.store import publish_unit

    work = Path(tempfile.mkdtemp(prefix=f"build-{spec.name}-", dir=os.environ.get("TMPDIR")))
    try:
        result, _ = build_unit(spec, key, BuildOptions(base_dir=work, s3_client=s3), store_dir=work / "store")
        publish_unit(
            result.artifact(work / "store" / key),
            key,
            s3_client=s3,
            bucket=request.model_bucket,
            model_prefix=request.model_prefix,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write_index(s3: Any, request: Request, manifest: Manifest, computed: Release) -> None:
    """The final step: assemble the release from the store (server-side copies, index last)."""
    from model_build.release.store import ReleaseTarget, assemble_release, stored_models

    release = replace(request.release, model_keys=dict(computed.model_keys),
                      model_code_sha256=computed.model_code_sha256, entry_hashes=computed.entry_hashes)
    assemble_release(stored_models(manifest, computed.model_keys),
                     ReleaseTarget.of(release, s3, request.model_bucket, request.model_prefix))


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
    """A Delete never removes what a route of the live stack uses.

    - the stack is being deleted and ``OnDelete`` is ``destroy``: the served objects, the release
      indexes and the routes document go (the store of builds stays);
    - any other Delete (the stack keeps running: the resource was replaced because its bucket or
      prefix changed, an update's rollback, or the per-release resource of an earlier version of
      this stack, superseded by the fixed prefix): nothing is deleted. Old per-release prefixes
      are listed and deleted on request with ``python -m model_build releases``."""
    from model_build.release.serving import destroy_served

    physical = event.get("PhysicalResourceId", "")
    try:
        request = Request(event)
    except HandlerError as error:
        LOG.warning("delete of %s with unusable properties (%s): nothing to do", physical, error)
        return {"IsComplete": True}
    if physical != request.physical_id:
        LOG.info("delete of %s: not this resource's served prefix (an earlier layout, or a Create that "
                 "never named it); nothing is deleted", physical)
        return {"IsComplete": True}
    status = _stack_status(event.get("StackId", ""))
    if status in STACK_DELETING and request.on_delete == "destroy":
        count = destroy_served(_s3(), request.model_bucket, request.model_prefix)
        LOG.info("stack deleted: removed %d objects of %s", count, physical)
    else:
        LOG.info("delete of %s while the stack is %s (OnDelete=%s): nothing is deleted", physical, status,
                 request.on_delete)
    return {"IsComplete": True}


def is_complete(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    try:
        kind = request_type(event)  # first: a malformed event is refused before anything reads it
        LOG.info("is_complete %s %s", kind, _shown(event.get("PhysicalResourceId")))
        if kind == "Delete":
            return _delete(event)
        return _build_step(event, context)
    except Exception as error:
        raise _short(error) from None


def _build_step(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from model_build.release.index import read_index
    from model_build.release.store import stored_keys

    request = Request(event)
    s3 = _s3()
    index_key = request.release.index_key(request.model_prefix)
    manifest = _load_manifest(s3, request)
    if read_index(s3, request.model_bucket, index_key) is not None:
        request.activate(s3)
        return {"IsComplete": True, "Data": request.data(manifest.target_count)}
    execution = (event.get("Data") or {}).get("BuildExecutionArn")
    if execution:
        # The state machine builds (one Lambda run per model) and writes the index.
        return _execution_outcome(s3, request, str(execution))

    # No state machine: build here, as many models per run as fit, across several calls.
    computed = _computed(manifest)
    keys = computed.model_keys
    stored = stored_keys(s3, request.model_bucket, request.model_prefix)
    slowest = FIRST_MODEL_ESTIMATE_SECONDS
    built_here = 0
    for spec in manifest.models:
        if keys[spec.name] in stored:
            continue
        remaining = _remaining_seconds(context) - SAFETY_MARGIN_SECONDS
        if built_here and remaining < slowest * 1.5:
            LOG.info("%.0f s left in this run; continuing in the next call", remaining)
            return {"IsComplete": False}
        started = time.perf_counter()
        _build_and_store(s3, request, spec, keys[spec.name])
        elapsed = time.perf_counter() - started
        slowest = max(slowest if built_here else 0.0, elapsed)
        built_here += 1
        LOG.info("built and stored %s (%s) in %.1f s", spec.name, keys[spec.name], elapsed)
    _write_index(s3, request, manifest, computed)
    request.activate(s3)
    return {"IsComplete": True, "Data": request.data(manifest.target_count)}


# ----------------------------------------------------------------------------------------------
# The per-model unit and the final step, as separate Lambda entry points (one Map item each)
# ----------------------------------------------------------------------------------------------


def _item_request(event: Mapping[str, Any]) -> Request:
    props = event.get("Request")
    if not isinstance(props, dict):
        raise HandlerError(f"field Request: got {type(props).__name__}; expected the resource properties")
    return Request({"RequestType": "Create", "ResourceProperties": props})


def build_item(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """Build and store one model: ``{"Request": <resource properties>, "Model": name, "Key": key}``.

    Skips a key that is already stored (a retried or re-run item costs a listing). The key the
    caller planned must be the one this runtime computes: otherwise the plan came from other
    code and storing under it would mislabel the bytes."""
    LOG.info("build_item %s %s", event.get("Model"), event.get("Key"))
    try:
        from model_build.release.store import stored_keys

        request = _item_request(event)
        s3 = _s3()
        manifest = _load_manifest(s3, request)
        name = event.get("Model")
        spec = next((spec for spec in manifest.models if spec.name == name), None)
        if spec is None:
            raise HandlerError(f"field Model: got {name!r}; the manifest has no such model")
        key = _model_keys(manifest)[spec.name]
        if event.get("Key") != key:
            raise HandlerError(
                f"model {spec.name!r}: planned key {event.get('Key')!r} but this build image computes "
                f"{key!r}; the plan and the image come from different code"
            )
        built = key not in stored_keys(s3, request.model_bucket, request.model_prefix)
        if built:
            try:
                _build_and_store(s3, request, spec, key)
            except Exception as error:
                _record_failure(s3, request, spec.name, error)
                raise
        return {"Model": spec.name, "Key": key, "Built": built}
    except (HandlerError, ModelBuildError) as error:
        raise _short(error) from None


def _record_failure(s3: Any, request: Request, model: str, error: BaseException) -> None:
    """Leave the failing model's reason where ``is_complete`` finds it: a Distributed Map's own
    failure says only that an item failed, and CloudFormation should name the model."""
    if isinstance(error, ModelBuildError) and error.model is None:
        error.model = model
    reason = str(_short(error)) if isinstance(error, ModelBuildError) else (
        f"build of model {model!r} failed: {' '.join(str(error).split())[:300]}"
    )
    try:
        s3.put_object(Bucket=request.model_bucket, Key=_failure_key(request),
                      Body=json.dumps({"model": model, "reason": reason}).encode(),
                      ContentType="application/json")
    except Exception as put_error:  # the build's own error matters more than its record
        LOG.warning("could not record the failure of %s: %s", model, put_error)


def build_step(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """The build function's one entry point, for the state machine: ``Step`` is ``plan``,
    ``build`` (one Map item) or ``finish``."""
    steps = {"plan": plan_items, "build": build_item, "finish": finish_release}
    step = event.get("Step")
    if step not in steps:
        raise HandlerError(f"field Step: got {step!r}; expected one of {', '.join(steps)}")
    return steps[str(step)](event, context)


def finish_release(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """The final step: ``{"Request": <resource properties>}``; assembles the release from the
    store and writes its index. A model not stored fails it, naming the model."""
    LOG.info("finish_release")
    try:
        request = _item_request(event)
        s3 = _s3()
        manifest = _load_manifest(s3, request)
        _write_index(s3, request, manifest, _computed(manifest))
        return request.data(manifest.target_count)
    except (HandlerError, ModelBuildError) as error:
        raise _short(error) from None


def plan_items(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """Write the Map's item source: the models whose key is not stored yet, as a JSON array at
    ``<prefix>/_plans/<release_id>.json`` (under the model prefix, the only place the build
    writes). Returns where it is and how many items it holds."""
    from model_build.release.store import stored_keys

    try:
        request = _item_request(event)
        s3 = _s3()
        manifest = _load_manifest(s3, request)
        keys = _model_keys(manifest)
        stored = stored_keys(s3, request.model_bucket, request.model_prefix)
        items = [{"Model": spec.name, "Key": keys[spec.name]} for spec in manifest.models
                 if keys[spec.name] not in stored]
        base = f"{request.model_prefix}/" if request.model_prefix else ""
        plan_key = f"{base}{PLANS_DIR}/{request.release_id}.json"
        s3.put_object(Bucket=request.model_bucket, Key=plan_key, Body=json.dumps(items).encode(),
                      ContentType="application/json")
        # A new attempt: overwrite an earlier attempt's failure record with the "no failure"
        # marker. Not a delete: the build role has s3:DeleteObject only with OnDelete=destroy,
        # and S3 answers AccessDenied to a delete without it (even of a missing key).
        _clear_failure(s3, request)
        return {"Bucket": request.model_bucket, "Key": plan_key, "Count": len(items)}
    except (HandlerError, ModelBuildError) as error:
        raise _short(error) from None
