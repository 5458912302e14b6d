"""The build state machine's build function, ``build_step``, under the build role (it writes
only ``_builds/``, ``_plans/`` and ``_jobs/``): ``plan`` (the Map's item source: the models whose
key is not stored) and ``build`` (one model per Map item, built and stored; a failure records the
model's name and reason for ``is_complete``), and a Processing job's ``store_job`` and
``job_failed``. The release is placed by another function under another role
(:mod:`model_build.handler.place`).

The failure record is this module's: the steps write it under ``<prefix>/_plans/`` and
``is_complete`` reads it back (:func:`recorded_failure`) to name the failing model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.handler.request import (
    LOG,
    HandlerError,
    Request,
    load_manifest,
    s3_client,
    short_error,
)
from triton_mme_cdk.model_build.handler.units import build_and_store, model_key, model_keys
from triton_mme_cdk.model_build.release.identity import PLANS_DIR

#: The failure record's body while no model of the current attempt has failed (the plan writes it).
NO_FAILURE = b'{"model": null, "reason": null}'

# ----------------------------------------------------------------------------------------------
# The per-model unit and the final step, as separate Lambda entry points (one Map item each)
# ----------------------------------------------------------------------------------------------


def item_request(event: Mapping[str, Any]) -> Request:
    """The resource properties a state machine task carries (``Request``), as a request."""
    props = event.get("Request")
    if not isinstance(props, dict):
        raise HandlerError(f"field Request: got {type(props).__name__}; expected the resource properties")
    return Request({"RequestType": "Create", "ResourceProperties": props})


def build_item(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """Build and store one model: ``{"Request": <resource properties>, "Model": name, "Key": key}``.

    Skips a key that is already stored (a retried or re-run item costs one LIST of that key's
    index, whatever the store holds; the item computes its own key alone). The key the caller
    planned must be the one this runtime computes: otherwise the plan came from other code and
    storing under it would mislabel the bytes."""
    LOG.info("build_item %s %s", event.get("Model"), event.get("Key"))
    try:
        from triton_mme_cdk.model_build.release.store import is_stored

        request = item_request(event)
        s3 = s3_client()
        spec, key = item_model(event, load_manifest(s3, request))
        built = not is_stored(s3, request.model_bucket, request.model_prefix, key)
        if built:
            try:
                build_and_store(s3, request, spec, key)
            except Exception as error:
                record_failure(s3, request, spec.name, error)
                raise
        return {"Model": spec.name, "Key": key, "Built": built}
    except (HandlerError, ModelBuildError) as error:
        raise short_error(error) from None


def item_model(event: Mapping[str, Any], manifest: Any) -> tuple[Any, str]:
    """The manifest entry a Map item names (``Model``) and its key, which must be the one the
    item planned (``Key``): otherwise the plan came from other code and storing or placing under
    it would mislabel the bytes."""
    name = event.get("Model")
    spec = next((spec for spec in manifest.models if spec.name == name), None)
    if spec is None:
        raise HandlerError(f"field Model: got {name!r}; the manifest has no such model")
    key = model_key(spec)
    if event.get("Key") != key:
        raise HandlerError(
            f"model {spec.name!r}: planned key {event.get('Key')!r} but this build image computes "
            f"{key!r}; the plan and the image come from different code"
        )
    return spec, key


def build_step(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """The build function's one entry point, for the state machine: ``Step`` is ``plan``,
    ``build`` (one Map item on the Lambda), ``outgrew_lambda`` (after a build's timeout or kill:
    :mod:`model_build.handler.outgrown`) or ``store_job`` / ``job_failed`` (after a Map item's
    Processing job). ``finish`` is the placing function's (:func:`model_build.handler.place.place_step`),
    under the role that writes ``served/``: this one writes only ``_builds/``, ``_plans/`` and ``_jobs/``."""
    steps = {"plan": plan_items, "build": build_item, "store_job": store_job, "job_failed": job_failed,
             "outgrew_lambda": outgrew_lambda}
    step = event.get("Step")
    if step not in steps:
        raise HandlerError(f"field Step: got {step!r}; expected one of {', '.join(steps)}")
    return steps[str(step)](event, context)


def plan_items(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """Write the Map's item source: the models whose key is not stored yet, as a JSON array at
    ``<prefix>/_plans/<release_id>.json`` (under the model prefix, the only place the build
    writes). Returns where it is and how many items it holds."""
    from triton_mme_cdk.model_build.release.store import stored_keys

    try:
        request = item_request(event)
        s3 = s3_client()
        manifest = load_manifest(s3, request)
        keys = model_keys(manifest)
        stored = stored_keys(s3, request.model_bucket, request.model_prefix)
        items = _placed_items(s3, request, manifest, keys,
                              [spec for spec in manifest.models if keys[spec.name] not in stored])
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
        raise short_error(error) from None


# ----------------------------------------------------------------------------------------------
# Where each model builds, and the steps after a Processing job
# ----------------------------------------------------------------------------------------------


def _placed_items(s3: Any, request: Request, manifest: Any, keys: Mapping[str, str],
                  specs: list[Any]) -> list[dict[str, Any]]:
    """The Map's items: each model with its engine (``lambda`` or ``processing``, placed by
    :mod:`model_build.manifest.build_engine` with S3 sources sized now) and, for a job, its ``Job``.
    A model pinned to ``lambda`` that does not fit fails the plan, before any build starts."""
    from concurrent.futures import ThreadPoolExecutor

    from triton_mme_cdk.model_build.handler.processing import placement_at_deploy, processing_item
    from triton_mme_cdk.model_build.manifest.build_engine import EngineSettings

    raw = request.props.get("BuildEngine")
    try:
        settings = EngineSettings.from_properties(raw) if raw is not None else EngineSettings(runs_on="lambda")
    except ValueError as error:
        raise HandlerError(str(error)) from None
    with ThreadPoolExecutor(max_workers=16) as pool:
        placements = list(pool.map(lambda spec: placement_at_deploy(s3, spec, settings), specs))
    items = []
    for spec, placement in zip(specs, placements, strict=True):
        LOG.info("model %s %s", spec.name, placement.describe(settings))
        job: dict[str, Any] = {}
        if placement.engine == "processing":
            job = processing_item(s3, bucket=request.model_bucket, request_props=request.props, manifest=manifest,
                                  spec=spec, key=keys[spec.name], model_prefix=request.model_prefix,
                                  release_id=request.release_id, placement=placement)
        items.append({"Model": spec.name, "Key": keys[spec.name], "Engine": placement.engine, "Job": job})
    return items


def store_job(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """After a Map item's Processing job: its unit into the store (``{"Request", "Model",
    "Key", "Job"}``), as ``build_item`` stores a Lambda-built model."""
    LOG.info("store_job %s %s", event.get("Model"), event.get("Key"))
    try:
        from triton_mme_cdk.model_build.handler.processing import job_prefix, store_unit

        request = item_request(event)
        s3 = s3_client()
        job = event.get("Job")
        if not isinstance(job, dict) or not isinstance(job.get("Output"), str):
            raise HandlerError(f"field Job: got {job!r}; expected the Map item's job with its Output")
        # The unit is read from this model's own job folder only, whatever the plan document says.
        expected = f"s3://{request.model_bucket}/{job_prefix(request.model_prefix, request.release_id, str(event.get('Model')))}/output/"
        if job["Output"] != expected:
            raise HandlerError(f"field Job.Output: got {str(job['Output'])[:300]!r}; expected {expected!r}, the "
                               "model's own job folder")
        try:
            store_unit(s3, bucket=request.model_bucket, model_prefix=request.model_prefix, output_uri=job["Output"],
                       model=str(event.get("Model")), key=str(event.get("Key")))
        except Exception as error:
            record_failure(s3, request, str(event.get("Model")), error)
            raise
        return {"Model": event.get("Model"), "Key": event.get("Key"), "Built": True}
    except (HandlerError, ModelBuildError) as error:
        raise short_error(error) from None


def job_failed(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """A Map item's Processing job failed (``{"Request", "Model", "Error", "Cause"}``): record its
    reason for ``is_complete`` and fail the item; no capacity raises
    :class:`~model_build.handler.processing.ProcessingCapacityError`, which the state machine
    retries with backoff (the reason stays recorded if every retry fails too)."""
    from triton_mme_cdk.model_build.handler.processing import ProcessingCapacityError, failure_reason

    request = item_request(event)
    model = str(event.get("Model"))
    reason, capacity = failure_reason(model, event.get("Error"), event.get("Cause"))
    LOG.info("job_failed %s: %s", model, reason)
    record_failure(s3_client(), request, model, reason)
    if capacity:
        raise ProcessingCapacityError(reason)
    raise HandlerError(reason)


def outgrew_lambda(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """A Map item's build ran past the Lambda's timeout or was killed twice (``{"Request", "Model",
    "Key", "Error", "Cause", "Started", "BudgetSeconds", "Processing"}``): the item's ``Job`` on
    SageMaker Processing, or its reason recorded and raised (:mod:`model_build.handler.outgrown`)."""
    from triton_mme_cdk.model_build.handler.outgrown import where_it_goes
    from triton_mme_cdk.model_build.handler.processing import processing_item
    from triton_mme_cdk.model_build.manifest.build_engine import EngineSettings

    request = item_request(event)
    s3 = s3_client()
    manifest = load_manifest(s3, request)
    spec, key = item_model(event, manifest)
    raw = request.props.get("BuildEngine")
    try:
        settings = EngineSettings.from_properties(raw) if raw is not None else EngineSettings(runs_on="lambda")
    except ValueError as refused:
        raise HandlerError(str(refused)) from None
    placement, what = where_it_goes(event, spec, settings, s3)
    LOG.info("outgrew_lambda %s", what)
    if placement is None:
        record_failure(s3, request, spec.name, what)
        raise HandlerError(what)
    return processing_item(s3, bucket=request.model_bucket, request_props=request.props, manifest=manifest, spec=spec,
                           key=key, model_prefix=request.model_prefix, release_id=request.release_id,
                           placement=placement)


# ----------------------------------------------------------------------------------------------
# The failure record: which model failed, and why
# ----------------------------------------------------------------------------------------------


def _failure_key(request: Request) -> str:
    base = f"{request.model_prefix}/" if request.model_prefix else ""
    return f"{base}{PLANS_DIR}/{request.release_id}.failure.json"


def _clear_failure(s3: Any, request: Request) -> None:
    s3.put_object(Bucket=request.model_bucket, Key=_failure_key(request), Body=NO_FAILURE,
                  ContentType="application/json")


def recorded_failure(s3: Any, request: Request) -> str | None:
    """The reason a failed model recorded for this request's release, or None: no record (a
    Lambda that timed out or ran out of memory writes none), the plan's "no failure" marker, or a
    record that cannot be read."""
    try:
        body = s3.get_object(Bucket=request.model_bucket, Key=_failure_key(request))["Body"].read()
        reason = json.loads(body)["reason"]
    except Exception:
        return None
    return str(reason) if reason else None


def record_failure(s3: Any, request: Request, model: str, error: BaseException | str) -> None:
    """Leave the failing model's reason (an error, or a reason already written) where
    ``is_complete`` finds it: a Distributed Map's own failure says only that an item failed,
    and CloudFormation should name the model."""
    if isinstance(error, ModelBuildError) and error.model is None:
        error.model = model
    reason = error if isinstance(error, str) else str(short_error(error)) if isinstance(error, ModelBuildError) else (
        f"build of model {model!r} failed: {' '.join(str(error).split())[:300]}"
    )
    try:
        s3.put_object(Bucket=request.model_bucket, Key=_failure_key(request),
                      Body=json.dumps({"model": model, "reason": reason}).encode(),
                      ContentType="application/json")
    except Exception as put_error:  # the build's own error matters more than its record
        LOG.warning("could not record the failure of %s: %s", model, put_error)
