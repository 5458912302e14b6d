"""The custom resource's two handlers (the CDK ``Provider``'s asynchronous pattern): ``on_event``
checks the request and starts the build state machine; ``is_complete`` routes the release once
its index exists, reports a failed build with the failing model's reason, or builds in place
without a state machine (:mod:`model_build.handler.units`, the work it shares with the state
machine); a Delete never removes what a route of the live stack uses. Each acts only on an event
CloudFormation sent for the function's own stack, with its template's properties
(:func:`model_build.handler.stack_check.check_event`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from triton_mme_cdk.model_build.handler.build_steps import recorded_failure
from triton_mme_cdk.model_build.handler.request import (
    LOG,
    HandlerError,
    Request,
    load_manifest,
    request_type,
    s3_client,
    short_error,
    shown,
)
from triton_mme_cdk.model_build.handler.stack_check import check_event
from triton_mme_cdk.model_build.handler.units import build_and_store, computed_release, write_index

#: Seconds kept free at the end of a Lambda run (upload of the last artifact, the response).
SAFETY_MARGIN_SECONDS = 60.0
#: Until one model has been timed, assume a build takes this long.
FIRST_MODEL_ESTIMATE_SECONDS = 240.0
#: Stack states in which a Delete means "the stack is going away" rather than "superseded".
STACK_DELETING = {"DELETE_IN_PROGRESS"}


# ----------------------------------------------------------------------------------------------
# on_event
# ----------------------------------------------------------------------------------------------


def on_event(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    try:
        kind = request_type(event)  # first: a malformed event is refused before anything reads it
        LOG.info("on_event %s %s", kind, shown(event.get("PhysicalResourceId")))
        if kind == "Delete":
            # A Delete must succeed even for a resource whose Create failed before it had an id.
            return {"PhysicalResourceId": event.get("PhysicalResourceId", "none")}
        request = Request(event)
        check_event(event, context)  # CloudFormation's request for this stack, with its template's properties
        # Fail in seconds on a manifest that cannot build, before any model is loaded.
        s3 = s3_client()
        load_manifest(s3, request)
        response: dict[str, Any] = {"PhysicalResourceId": request.physical_id}
        machine = request.props.get("BuildStateMachineArn")
        if machine:
            from triton_mme_cdk.model_build.release.index import read_index

            if read_index(s3, request.model_bucket, request.release.index_key(request.model_prefix)) is None:
                response["Data"] = {"BuildExecutionArn": _start_build(request, str(machine), event)}
        return response
    except Exception as error:
        raise short_error(error) from None


def _states() -> Any:
    import boto3

    return boto3.client("stepfunctions", endpoint_url=os.environ.get("MODEL_BUILD_STATES_ENDPOINT_URL"))


def _start_build(request: Request, machine: str, event: Mapping[str, Any]) -> str:
    """Start the build state machine for this request; returns the execution ARN.

    The execution is named after the release and CloudFormation's request id: unique per
    request, and the same request retried by the Provider cannot start a second build."""
    name = f"{request.release_id}-{str(event.get('RequestId', 'request'))[:36]}"
    # The build steps need neither the token nor the deployed record (is_complete writes it with
    # the routes): every state's payload stays small, whatever the stack.
    properties = {k: v for k, v in request.props.items() if k not in ("ServiceToken", "Deployed")}
    states = _states()
    try:
        return str(states.start_execution(stateMachineArn=machine, name=name,
                                          input=json.dumps({"Request": properties}))["executionArn"])
    except states.exceptions.ExecutionAlreadyExists:
        return f"{machine.replace(':stateMachine:', ':execution:')}:{name}"


def _execution_status(execution_arn: str) -> dict[str, Any]:
    """The build execution as ``DescribeExecution`` tells it (its status, error and cause)."""
    return dict(_states().describe_execution(executionArn=execution_arn))


def _execution_outcome(s3: Any, request: Request, execution_arn: str, described: Mapping[str, Any]) -> dict[str, Any]:
    """``IsComplete: False`` while the build runs; a failed build raises with the failing
    model's name and reason (recorded by the build function), or the execution's error."""
    status = described["status"]
    if status == "RUNNING":
        return {"IsComplete": False}
    if status == "SUCCEEDED":
        raise HandlerError(f"build execution {execution_arn} succeeded but the release has no index")
    reason = recorded_failure(s3, request)
    if reason is None:  # no record (a Lambda timeout or out of memory): the execution's own error
        error = described.get("error") or status
        cause = " ".join(str(described.get("cause") or "").split())[:300]
        reason = f"build execution {status.lower()}: {error}" + (f": {cause}" if cause else "") + (
            "; the state machine's Map Run lists the failed model"
        )
    raise HandlerError(reason)


# ----------------------------------------------------------------------------------------------
# is_complete
# ----------------------------------------------------------------------------------------------


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


def _delete(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """A Delete never removes what a route of the live stack uses.

    - the stack is being deleted and ``OnDelete`` is ``destroy``: the served objects, the release
      indexes and the routes document go (the store of builds stays);
    - any other Delete (the stack keeps running: the resource was replaced because its bucket or
      prefix changed, an update's rollback, or the per-release resource of an earlier version of
      this stack, superseded by the fixed prefix): nothing is deleted. Old per-release prefixes
      are listed and deleted on request with ``python -m model_build releases``."""
    from triton_mme_cdk.model_build.release.serving import destroy_served

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
        check_event(event, context)  # OnDelete as the template gives it, the stack really being deleted
        count = destroy_served(s3_client(), request.model_bucket, request.model_prefix)
        LOG.info("stack deleted: removed %d objects of %s", count, physical)
    else:
        LOG.info("delete of %s while the stack is %s (OnDelete=%s): nothing is deleted", physical, status,
                 request.on_delete)
    return {"IsComplete": True}


def is_complete(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    try:
        kind = request_type(event)  # first: a malformed event is refused before anything reads it
        LOG.info("is_complete %s %s", kind, shown(event.get("PhysicalResourceId")))
        if kind == "Delete":
            return _delete(event, context)
        return _build_step(event, context)
    except Exception as error:
        raise short_error(error) from None


def _build_step(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from triton_mme_cdk.model_build.release.index import read_index
    from triton_mme_cdk.model_build.release.store import stored_keys

    request = Request(event)
    # Before anything is read, routed or deleted: the event is CloudFormation's, for this stack's
    # release (an old ReleaseId sent by another caller would re-route the fleet).
    check_event(event, context)
    s3 = s3_client()
    index_key = request.release.index_key(request.model_prefix)
    manifest = load_manifest(s3, request)
    execution = (event.get("Data") or {}).get("BuildExecutionArn")
    # With a build execution, its status is read before the index: the execution's last step
    # writes the index, so an execution seen as SUCCEEDED has one. (Read the other way round, a
    # build that ends between the two reads looks like a success without an index.)
    described = _execution_status(str(execution)) if execution else None
    if read_index(s3, request.model_bucket, index_key) is not None:
        request.activate(s3)
        return {"IsComplete": True, "Data": request.data(manifest.target_count)}
    if described is not None:
        # The state machine builds (one Lambda run per model) and writes the index.
        return _execution_outcome(s3, request, str(execution), described)

    # No state machine: build here, as many models per run as fit, across several calls.
    computed = computed_release(manifest)
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
        build_and_store(s3, request, spec, keys[spec.name])
        elapsed = time.perf_counter() - started
        slowest = max(slowest if built_here else 0.0, elapsed)
        built_here += 1
        LOG.info("built and stored %s (%s) in %.1f s", spec.name, keys[spec.name], elapsed)
    write_index(s3, request, manifest, computed)
    request.activate(s3)
    return {"IsComplete": True, "Data": request.data(manifest.target_count)}
