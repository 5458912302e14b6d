"""The deploy path's Lambda faults, through the synthesized build state machine run by moto's
interpreter, the real handlers behind moto's Invoke API (``tests/local_lambda.py``) and S3 in moto:

- the harness ends a function at its template ``Timeout`` (scaled) as Lambda does
  (``Sandbox.Timedout``), and a killed runtime as Lambda does (no ``errorType``: Step Functions'
  ``Lambda.Unknown``); a late end is kept aside, never answered (checked on the builds below);
- a build killed once (after it stored its model) is retried and finds it stored; a build past
  its timeout moves to SageMaker Processing (``OutgrewLambda``) and builds there; a build pinned
  to the Lambda that is killed twice, or past the budget left, fails naming the model and the
  limit it hit;
- a build that ends after its deploy failed and rolled back changes nothing that is served.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from deploy_harness import BUILD_STEP, LocalAws, Templates, local_aws, start_build, tiny_manifest
from local_lambda import TIMED_OUT
from processing_local import LocalProcessing, processing_jobs

from triton_mme_cdk.model_build import handler
from triton_mme_cdk.model_build.release.index import read_routes
from triton_mme_cdk.model_build.release.invariants import check_bucket

#: Slow: real builds, one on Processing (a subprocess that imports torch).
pytestmark = pytest.mark.slow

#: Functions' 900 s timeouts end at 2.7 s here: a held build passes it, a plan or a tiny build
#: (about 0.1 s each once torch is imported) stays far within it.
TIME_SCALE = 0.003


def manifest(changed: int | None = None) -> dict[str, Any]:
    """Three tiny models; the third pinned to the Lambda (``build.runs_on: lambda``)."""
    data = copy.deepcopy(tiny_manifest(3, changed=changed))
    data["models"][2]["build"] = {"runs_on": "lambda"}
    return data


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Templates:
    return Templates(tmp_path_factory.mktemp("lambda-faults"))


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One real build before the timed ones: the first build in a process imports torch, ONNX and
    ONNX Runtime (seconds), which the Lambda's image would have done at its cold start, not in a
    build's time."""
    from triton_mme_cdk.model_build.handler.units import model_key
    from triton_mme_cdk.model_build.manifest.loading import parse_manifest
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_unit

    folder = tmp_path_factory.mktemp("warm")
    for spec in parse_manifest(tiny_manifest(2)).models:  # an ONNX and a TorchScript export
        build_unit(spec, model_key(spec), BuildOptions(base_dir=folder), store_dir=folder / "store")


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, warm: None) -> Any:
    with local_aws(monkeypatch, tmp_path, lambda_time_scale=TIME_SCALE) as local:
        yield local


@pytest.fixture
def jobs(aws: LocalAws, tmp_path: Path) -> Any:
    with processing_jobs(boto3.client("s3", region_name="us-east-1"), tmp_path / "jobs", time_scale=0.05) as local:
        yield local


def _build(deployment: Any, kind: str = "Create", *, old: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    return start_build(deployment, kind, old=old, timeout=120)


def _complete(request: dict[str, Any], started: dict[str, Any]) -> dict[str, Any]:
    return handler.is_complete(dict(request, PhysicalResourceId=started["PhysicalResourceId"],
                                    Data=started.get("Data", {})))


def _outcomes(aws: LocalAws) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for call in aws.runtime.invocations(BUILD_STEP):
        if call.event.get("Step") == "build":
            found.setdefault(call.event["Model"], []).append(call.outcome)
    return found


def _served(deployment: Any, bucket: str) -> dict[str, Any]:
    """What is served: the routes document's bytes and every object under served/ (key -> ETag)."""
    s3 = deployment.s3
    routes = s3.get_object(Bucket=bucket, Key="models/_routes/routes.json")["Body"].read()
    objects = {item["Key"]: item["ETag"] for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix="models/served/") for item in page.get("Contents", [])}
    return {"routes": routes, "served": objects}


def test_a_killed_build_is_retried_and_one_past_its_timeout_builds_on_processing(
    templates: Templates, aws: LocalAws, jobs: LocalProcessing
) -> None:
    deployment = aws.deploy(templates.get(manifest()))
    # unit-00's runtime dies after its build stored the model, before it answered: the retry finds it stored.
    aws.runtime.kill(BUILD_STEP, lambda event: event.get("Model") == "unit-00", times=1, after=True)
    release = aws.runtime.hold(BUILD_STEP, lambda event: event.get("Step") == "build" and event["Model"] == "unit-01")
    try:
        request, started, described = _build(deployment)
    finally:
        release.set()
    assert described["status"] == "SUCCEEDED", (described.get("error"), described.get("cause"))
    assert _outcomes(aws) == {"unit-00": ["killed", "ok"], "unit-01": ["timed_out"], "unit-02": ["ok"]}
    builds = [c for c in aws.runtime.invocations(BUILD_STEP) if c.event.get("Step") == "build"]
    # The harness answered as Lambda does: the timeout at the template's 900 s (scaled), with its
    # message; the dead runtime with no errorType (Step Functions' Lambda.Unknown, then retried).
    (timed_out,) = [c for c in builds if c.outcome == "timed_out"]
    assert aws.runtime.function(BUILD_STEP).timeout_s == 900
    assert timed_out.result["errorType"] == TIMED_OUT, timed_out.result
    assert timed_out.result["errorMessage"].endswith("Task timed out after 900.00 seconds"), timed_out.result
    assert 900 * TIME_SCALE <= timed_out.ended - timed_out.started < 900 * TIME_SCALE + 2.0
    assert timed_out.late is None, "still held: nothing answered for it, nothing kept yet"
    killed, retried = [c for c in builds if c.event["Model"] == "unit-00"]
    assert "errorType" not in killed.result and "signal: killed" in killed.result["errorMessage"], killed.result
    assert retried.result == {"Model": "unit-00", "Key": killed.event["Key"], "Built": False}, "stored by the killed run"
    (moved,) = [c for c in aws.runtime.invocations(BUILD_STEP) if c.event.get("Step") == "outgrew_lambda"]
    assert moved.outcome == "ok" and moved.event["Error"] == TIMED_OUT and moved.event["Model"] == "unit-01"
    assert moved.result["Output"].endswith("/models/_jobs/" + request["ResourceProperties"]["ReleaseId"] + "/unit-01/output/")
    (job,) = jobs.jobs
    assert job["ProcessingJobStatus"] == "Completed", job.get("Log")
    done = _complete(request, started)
    assert done["IsComplete"] is True and done["Data"]["ModelCount"] == "4"  # unit-00 has two copies
    bucket = request["ResourceProperties"]["ModelBucket"]
    assert check_bucket(deployment.s3, bucket, "models", read_bytes=True).violations == []
    aws.runtime.settle(60)  # released above: the timed-out build ran to its end, late, and was never answered
    assert timed_out.late is not None and timed_out.late[0] is True, timed_out.late
    assert timed_out.result["errorType"] == TIMED_OUT, "the answer stays the timeout's"


def test_a_build_neither_a_retry_nor_processing_can_help_fails_naming_the_model_and_the_limit(
    templates: Templates, aws: LocalAws
) -> None:
    deployment = aws.deploy(templates.get(manifest()))
    # unit-02 is pinned to the Lambda: killed on the retry too, it cannot move.
    aws.runtime.kill(BUILD_STEP, lambda event: event.get("Step") == "build" and event["Model"] == "unit-02", times=2)
    request, started, described = _build(deployment)
    assert described["status"] == "FAILED", described
    assert _outcomes(aws)["unit-02"] == ["killed", "killed"]
    with pytest.raises(handler.HandlerError) as caught:
        _complete(request, started)
    reason = str(caught.value)
    assert "model 'unit-02'" in reason and "6144 MB" in reason and "build.runs_on: 'lambda'" in reason, reason
    assert len(reason) <= 400

    # unit-01 (not pinned) past its timeout with too little of the execution's budget left: the
    # step itself, as the catch invokes it, 2,900 s into a 3,000 s budget.
    props = {k: v for k, v in request["ResourceProperties"].items() if k not in ("ServiceToken", "Deployed")}
    plan = json.loads(deployment.s3.get_object(Bucket=props["ModelBucket"],
                                               Key=f"models/_plans/{props['ReleaseId']}.json")["Body"].read())
    key = next(item["Key"] for item in plan if item["Model"] == "unit-01")
    long_ago = (datetime.now(UTC) - timedelta(seconds=2900)).isoformat().replace("+00:00", "Z")
    with pytest.raises(handler.HandlerError) as late:
        handler.build_step({"Step": "outgrew_lambda", "Request": props, "Model": "unit-01", "Key": key,
                            "Error": TIMED_OUT, "Cause": "Task timed out after 900.00 seconds",
                            "Started": long_ago, "BudgetSeconds": 3000, "Processing": True})
    reason = str(late.value)
    assert "model 'unit-01'" in reason and "900 s timeout" in reason and "of its 3000 s" in reason, reason


def test_a_build_that_ends_after_its_deploy_failed_and_rolled_back_changes_nothing_served(
    templates: Templates, aws: LocalAws
) -> None:
    first = aws.deploy(templates.get(manifest()))
    request, started, described = _build(first)
    assert described["status"] == "SUCCEEDED"
    _complete(request, started)
    bucket = request["ResourceProperties"]["ModelBucket"]
    before = _served(first, bucket)
    routed = read_routes(first.s3, bucket, "models")
    assert routed is not None
    aws.runtime.reset()

    # The next release changes unit-02 (pinned to the Lambda); its build is held past its timeout.
    second = first.update(templates.get(manifest(changed=2)))
    release = aws.runtime.hold(BUILD_STEP, lambda event: event.get("Step") == "build" and event["Model"] == "unit-02")
    try:
        update, update_started, failed = _build(second, "Update", old=request["ResourceProperties"])
        assert failed["status"] == "FAILED", failed
        with pytest.raises(handler.HandlerError, match=r"unit-02.*900 s timeout"):
            _complete(update, update_started)
        # CloudFormation rolls back: an Update to the first release's properties, built already.
        rollback, rollback_started, nothing = _build(first, "Update", old=update["ResourceProperties"])
        assert nothing is None and _complete(rollback, rollback_started)["IsComplete"] is True
    finally:
        release.set()
    aws.runtime.settle(60)
    (late,) = [c for c in aws.runtime.invocations(BUILD_STEP) if c.outcome == "timed_out"]
    assert late.late is not None and late.late[0] is True, "the held build ran to its end, late"
    assert _served(first, bucket) == before, "the routes document and every served object are as they were"
    assert check_bucket(first.s3, bucket, "models", read_bytes=True).violations == []
    after = read_routes(first.s3, bucket, "models")
    assert after is not None and after.release_id == routed.release_id
