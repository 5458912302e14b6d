"""The build state machine with both kinds of Map item, executed: items the plan placed on the
Lambda run the real handler behind moto's Invoke API; items placed on SageMaker Processing run
the job's real entry point as a subprocess, on the inputs the job would get, its outputs put
where the job would put them (``tests/processing_local.py`` says what is emulated), then the
Lambda stores the job's unit. S3 is moto's; the definition is the synthesized one.

A failed job, a job past its MaxRuntime and jobs without capacity each end in the failure path:
the execution fails naming the model and the reason, nothing is routed, the previous routes
keep serving.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from deploy_harness import (
    BUILD_STEP,
    PLACE_STEP,
    LocalAws,
    Templates,
    local_aws,
    start_build,
    tiny_manifest,
)
from processing_local import CAPACITY_REASON, LocalProcessing, job_request, processing_jobs

from triton_mme_cdk.model_build import handler
from triton_mme_cdk.model_build.pipeline import BuildOptions, build_unit
from triton_mme_cdk.model_build.release.index import read_index, read_routes
from triton_mme_cdk.model_build.release.store import stored_keys

#: Slow: real builds, one of them in a subprocess as the job runs it.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Templates:
    return Templates(tmp_path_factory.mktemp("processing"))


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    with local_aws(monkeypatch, tmp_path) as local:
        yield local


#: A job's MaxRuntimeInSeconds is emulated scaled by this: the default 3000 s (the total timeout) is
#: 150 s, room for a job that imports torch and builds on a loaded machine (at 0.01, 30 s, two jobs
#: overran on 2 cores with a load average of 7 to 12). The test of a job past its MaxRuntime sets
#: its own, smaller scale.
JOB_TIME_SCALE = 0.05


@pytest.fixture
def jobs(aws: LocalAws, tmp_path: Path) -> Any:
    import boto3

    with processing_jobs(boto3.client("s3", region_name="us-east-1"), tmp_path / "jobs",
                         time_scale=JOB_TIME_SCALE) as local:
        yield local


def on_processing(manifest: dict[str, Any], *names: str, **build: Any) -> dict[str, Any]:
    """``manifest`` with ``names`` pinned to SageMaker Processing."""
    manifest = copy.deepcopy(manifest)
    for entry in manifest["models"]:
        if entry["name"] in names:
            entry["build"] = {"runs_on": "processing", **build}
    return manifest


def _build(deployment: Any, kind: str = "Create", *, old: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    return start_build(deployment, kind, old=old, timeout=300)


def _complete(request: dict[str, Any], started: dict[str, Any]) -> dict[str, Any]:
    return handler.is_complete(dict(request, PhysicalResourceId=started["PhysicalResourceId"], Data=started["Data"]))


def _steps(aws: LocalAws, step: str) -> list[Any]:
    return [call for call in aws.runtime.invocations(BUILD_STEP) if call.event.get("Step") == step]


def test_a_model_built_on_processing_is_stored_as_the_lambda_would_store_it(
    templates: Templates, aws: LocalAws, jobs: LocalProcessing, tmp_path: Path
) -> None:
    manifest = on_processing(tiny_manifest(2), "unit-01", instance_type="ml.r5.2xlarge", volume_gb=30)
    template = templates.get(manifest)
    deployment = aws.deploy(template)
    request, started, described = _build(deployment)
    assert described["status"] == "SUCCEEDED", (described.get("error"), described.get("cause"))

    # The plan placed unit-00 on the Lambda and unit-01 on Processing; one job ran.
    (plan,) = _steps(aws, "plan")
    assert [call.event["Model"] for call in _steps(aws, "build")] == ["unit-00"]
    (job,) = jobs.jobs
    sent = job_request(job)
    assert job["ProcessingJobStatus"] == "Completed", job.get("Log")
    props = request["ResourceProperties"]
    folder = f"models/_jobs/{props['ReleaseId']}/unit-01"
    assert sent["ProcessingResources"]["ClusterConfig"]["InstanceType"] == "ml.r5.2xlarge"
    assert sent["ProcessingResources"]["ClusterConfig"]["VolumeSizeInGB"] == 30
    assert sent["ProcessingResources"]["ClusterConfig"]["VolumeKmsKeyId"].startswith("arn:aws:kms:")
    assert sent["ProcessingOutputConfig"]["KmsKeyId"] == sent["ProcessingResources"]["ClusterConfig"]["VolumeKmsKeyId"]
    assert sent["NetworkConfig"]["EnableNetworkIsolation"] is True
    assert sent["StoppingCondition"]["MaxRuntimeInSeconds"] == 3000  # the total timeout
    assert [i["S3Input"]["S3Uri"] for i in sent["ProcessingInputs"]] == [
        f"s3://{props['ModelBucket']}/{folder}/input/"]
    assert sent["ProcessingOutputConfig"]["Outputs"][0]["S3Output"]["S3Uri"] == f"s3://{props['ModelBucket']}/{folder}/output/"
    assert sent["ProcessingJobName"].startswith("mb-")
    # The job runs the build Lambda's own image (one asset), with its entry point overridden.
    functions = [r["Properties"] for r in template.data["Resources"].values()
                 if r["Type"] == "AWS::Lambda::Function" and r["Properties"].get("PackageType") == "Image"]
    lambda_image = json.dumps(functions[0]["Code"]["ImageUri"]).split(":")[-1].strip('"}')
    assert sent["AppSpecification"]["ImageUri"].endswith(lambda_image)
    assert sent["AppSpecification"]["ContainerEntrypoint"] == ["python3", "-m", "triton_mme_cdk.model_build.handler.processing_job"]

    # The Lambda stored the job's unit: the key the plan gave, and the bytes a local build makes.
    (stored,) = _steps(aws, "store_job")
    assert stored.outcome == "ok", stored.result
    keys = {item["Model"]: item["Key"] for item in plan.result and json.loads(deployment.s3.get_object(
        Bucket=props["ModelBucket"], Key=plan.result["Key"])["Body"].read())}
    assert stored_keys(deployment.s3, props["ModelBucket"], "models") == set(keys.values())
    store_index = read_index(deployment.s3, props["ModelBucket"], f"models/_builds/{keys['unit-01']}/_index.json")
    assert store_index is not None
    local, _ = build_unit(next(s for s in _manifest(deployment).models if s.name == "unit-01"), keys["unit-01"],
                          BuildOptions(base_dir=tmp_path), store_dir=tmp_path / "store")
    (entry,) = store_index["models"]
    assert (entry["sha256"], entry["size"]) == (local.sha256, local.size)

    # The release is routed as any other.
    done = _complete(request, started)
    assert done["IsComplete"] is True and done["Data"]["ModelCount"] == "3"


def _manifest(deployment: Any) -> Any:
    from triton_mme_cdk.model_build.handler.request import Request, load_manifest

    props = deployment.custom_resource_properties()
    return load_manifest(deployment.s3, Request({"RequestType": "Create", "ResourceProperties": props}))


def _first_release(templates: Templates, aws: LocalAws, **settings: Any) -> tuple[Any, dict[str, Any], str]:
    """A first release (Lambda only) built and routed: what keeps serving when the next fails.
    (An update changes the custom resource's properties and assets, not the state machine: the
    settings that shape it are given here.)"""
    first = aws.deploy(templates.get(tiny_manifest(1), **settings))
    request, started, described = _build(first)
    assert described["status"] == "SUCCEEDED"
    _complete(request, started)
    props = request["ResourceProperties"]
    routes = read_routes(first.s3, props["ModelBucket"], "models")
    assert routes is not None
    return first, request, routes.release_id


def _fails_and_keeps_serving(aws: LocalAws, first: Any, request: dict[str, Any], served: str, manifest: dict[str, Any],
                             templates: Templates, **settings: Any) -> str:
    second = first.update(templates.get(manifest, **settings))
    update, started, described = _build(second, "Update", old=request["ResourceProperties"])
    assert described["status"] == "FAILED", described
    with pytest.raises(handler.HandlerError) as caught:
        _complete(update, started)
    props = update["ResourceProperties"]
    routes = read_routes(second.s3, props["ModelBucket"], "models")
    assert routes is not None and routes.release_id == served, "the previous routes keep serving"
    assert not _steps(aws, "finish") and not aws.runtime.invocations(PLACE_STEP), "no release is assembled"
    return str(caught.value)


def test_a_failing_job_fails_the_build_with_its_reason_and_the_previous_routes_keep_serving(
    templates: Templates, aws: LocalAws, jobs: LocalProcessing
) -> None:
    first, request, served = _first_release(templates, aws)
    aws.runtime.reset()
    # An S3 source whose prefix holds nothing: the job's build refuses it (SourceError).
    first.s3.create_bucket(Bucket="model-sources")
    manifest = tiny_manifest(1)
    manifest["models"].append({"name": "empty-source", "source": {"kind": "s3", "uri": "s3://model-sources/empty/"},
                               "task": "feature-extraction", "max_batch_size": 2, "build": {"runs_on": "processing"}})
    reason = _fails_and_keeps_serving(aws, first, request, served, manifest, templates)
    assert "empty-source" in reason and "no objects under 's3://model-sources/empty/'" in reason, reason
    (job,) = jobs.jobs
    assert job["ProcessingJobStatus"] == "Failed" and "no objects under" in job["ExitMessage"]
    # The source was one of the job's inputs, mounted where the build reads it.
    assert [i["InputName"] for i in job_request(job)["ProcessingInputs"]] == ["request", "source"]


def test_a_job_past_its_max_runtime_fails_the_build_naming_the_model(
    templates: Templates, aws: LocalAws, jobs: LocalProcessing
) -> None:
    first, request, served = _first_release(templates, aws, build_processing_max_runtime_minutes="1")
    aws.runtime.reset()
    # One minute, scaled by this test's time scale (0.06 s): less than the job's start.
    jobs.time_scale = 0.001
    manifest = on_processing(tiny_manifest(2), "unit-01")
    reason = _fails_and_keeps_serving(aws, first, request, served, manifest, templates,
                                      build_processing_max_runtime_minutes="1")
    assert "unit-01" in reason and "MaxRuntimeExceeded" in reason, reason
    assert [job["ProcessingJobStatus"] for job in jobs.jobs] == ["Stopped"]


def test_jobs_without_capacity_are_retried_with_backoff_then_fail_with_the_reason(
    templates: Templates, aws: LocalAws, jobs: LocalProcessing
) -> None:
    first, request, served = _first_release(templates, aws)
    aws.runtime.reset()
    jobs.no_capacity = 100
    manifest = on_processing(tiny_manifest(2), "unit-01")
    reason = _fails_and_keeps_serving(aws, first, request, served, manifest, templates)
    assert "unit-01" in reason and "CapacityError" in reason, reason
    # The first try and 3 retries, each a new job name; the waits 60, 120, 240 s (full jitter).
    assert len(jobs.jobs) == 4 and all(job["FailureReason"] == CAPACITY_REASON for job in jobs.jobs)
    assert len({job["ProcessingJobName"] for job in jobs.jobs}) == 4
    assert [call.outcome for call in _steps(aws, "job_failed")] == ["error"] * 4
    capacity_waits = [wait for wait in aws.waits.requested if wait > 2]
    assert len(capacity_waits) <= 3 and all(wait <= 240 for wait in capacity_waits), aws.waits.requested


def test_a_job_that_gets_capacity_on_a_retry_builds_the_model(
    templates: Templates, aws: LocalAws, jobs: LocalProcessing
) -> None:
    jobs.no_capacity = 1
    deployment = aws.deploy(templates.get(on_processing(tiny_manifest(2), "unit-01")))
    request, started, described = _build(deployment)
    assert described["status"] == "SUCCEEDED", (described.get("error"), described.get("cause"))
    assert [job["ProcessingJobStatus"] for job in jobs.jobs] == ["Failed", "Completed"]
    assert _complete(request, started)["IsComplete"] is True


def test_every_s3_call_of_a_job_with_an_s3_source_is_granted_to_its_roles(
    templates: Templates, aws: LocalAws, jobs: LocalProcessing, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ResNet saved with ``save_pretrained`` on S3, built by a job: SageMaker's side (inputs
    down, the unit up) must be what the template grants the job's role, and the Lambda's side
    (the plan's job document, ``store_job``; the Finish task; on_event and is_complete) what it
    grants the role of the function that made each call."""
    import transformers
    from deploy_harness import IS_COMPLETE, ON_EVENT, S3CallsByFunction, function_roles
    from iam_grants import granted, role_s3_grants, s3_actions

    recorder = S3CallsByFunction(monkeypatch, aws.runtime)
    saved = tmp_path / "resnet"
    shape: dict[str, Any] = {"embedding_size": 8, "hidden_sizes": [8, 8], "depths": [1, 1], "num_labels": 3}
    config = transformers.ResNetConfig(**shape)
    transformers.ResNetForImageClassification(config).save_pretrained(saved)
    manifest = {"version": 1, "models": [{
        "name": "resnet-s3", "source": {"kind": "s3", "uri": "s3://model-sources/resnet/"},
        "task": "image-classification", "max_batch_size": 2, "image": {"image_size": 32, "channels": 3},
        "build": {"runs_on": "processing"}}]}
    template = templates.get(manifest)
    deployment = aws.deploy(template)
    deployment.s3.create_bucket(Bucket="model-sources")
    for path in saved.iterdir():
        deployment.s3.upload_file(str(path), "model-sources", f"resnet/{path.name}")
    with recorder.running(ON_EVENT):
        request, started, described = _build(deployment)
    assert described["status"] == "SUCCEEDED", (described.get("error"), described.get("cause"), jobs.jobs[-1].get("Log"))
    (job,) = jobs.jobs
    assert [i["InputName"] for i in job_request(job)["ProcessingInputs"]] == ["request", "source"]
    with recorder.running(IS_COMPLETE):
        assert _complete(request, started)["IsComplete"] is True

    model_bucket = request["ResourceProperties"]["ModelBucket"]

    def arn(bucket: str) -> str:
        return f"arn:aws:s3:::{'MODEL' if bucket == model_bucket else bucket}"

    roles = function_roles(deployment)
    by_role: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for owner, operation, params in recorder.calls:
        assert owner is not None, (operation, params)  # every call is some function's
        by_role.setdefault(roles[owner], []).append((operation, params))
    assert {role.rstrip("0123456789ABCDEF") for role in by_role} == {"ModelBuildRole", "ModelBuildBuildRole"}
    for role, calls in (("ModelBuildProcessingRole", jobs.s3_calls), *by_role.items()):
        grants = role_s3_grants(template.data, role)
        assert calls, role
        denied = [f"{operation} needs {action} on {resource}" for operation, params in calls
                  if params.get("Bucket") in (model_bucket, "model-sources")
                  for action, resource, prefix in s3_actions(operation, params, arn)
                  if not granted(grants, action, resource, prefix)]
        assert denied == [], f"{role}:\n" + "\n".join(sorted(set(denied)))
    # The job's role reads the source and <prefix>/_jobs only, and writes <prefix>/_jobs only.
    touched = {(name, params["Bucket"], params.get("Key", params.get("Prefix", "")).split("/")[:2][-1])
               for name, params in jobs.s3_calls}
    assert {key for _, bucket, key in touched if bucket == model_bucket} == {"_jobs"}, touched
