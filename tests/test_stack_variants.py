"""Other settings: EBS instance types, destroy policies, serving a published release, many models;
and the constructs' own validation of their props."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, cast

import aws_cdk as cdk
import pytest
from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Match
from cdk_helpers import (
    RELEASE,
    ROOT,
    VARIANTS,
    VENV_BIN,
    Synth,
    as_list,
    mask,
    policy_of_role,
    synth,
    untagged,
    write_manifest,
)

from triton_mme_cdk.constructs.endpoint_autoscaling import EndpointAutoscalingProps
from triton_mme_cdk.constructs.model_bucket import ModelBucket, ModelBucketProps
from triton_mme_cdk.constructs.model_build_inputs import refuse_local_sources, s3_source_keys
from triton_mme_cdk.constructs.model_build_resource import ModelBuildResource, ModelBuildResourceProps
from triton_mme_cdk.constructs.sagemaker_hosting import FleetSize, SageMakerHosting, SageMakerHostingProps
from triton_mme_cdk.constructs.sagemaker_limits import PropsError
from triton_mme_cdk.constructs.triton_image import TritonImage, TritonImageProps
from triton_mme_cdk.model_build.errors import ManifestError
from triton_mme_cdk.model_build.manifest import parse_manifest
from triton_mme_cdk.model_build.release import PACKAGE_DIR


def lint(s: Synth) -> None:
    result = subprocess.run(
        [str(VENV_BIN / "cfn-lint"), str(s.outdir / "TritonMme.template.json")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------
# EBS-backed instance type, destroy policies, extra environment, explicit environment
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ebs(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth(tmp_path_factory.mktemp("ebs"), nag=True, **VARIANTS["ebs"])


def test_ebs_variant_has_volume_and_kms_key(ebs: Synth) -> None:
    key = ebs.stack.resolve(ebs.stack.get_logical_id(cast(cdk.CfnElement, ebs.stack.model_bucket.key.node.default_child)))
    ebs.template.has_resource_properties(
        "AWS::SageMaker::EndpointConfig",
        {
            "KmsKeyId": {"Fn::GetAtt": [key, "Arn"]},
            "ProductionVariants": [
                Match.object_like(
                    {
                        "InstanceType": "ml.p3.2xlarge",
                        "VolumeSizeInGB": 100,
                        "InitialInstanceCount": 2,
                        "ModelDataDownloadTimeoutInSeconds": 900,
                        "ContainerStartupHealthCheckTimeoutInSeconds": 1200,
                    }
                )
            ],
        },
    )
    role = ebs.stack.resolve(ebs.stack.get_logical_id(cast(cdk.CfnElement, ebs.stack.execution_role.role.node.default_child)))
    grants = [s for s in policy_of_role(ebs.data, role) if "kms:CreateGrant" in as_list(s["Action"])]
    assert grants == [
        {
            "Action": "kms:CreateGrant",
            "Condition": {"Bool": {"kms:GrantIsForAWSResource": "true"}},
            "Effect": "Allow",
            "Resource": {"Fn::GetAtt": [key, "Arn"]},
        }
    ]


def test_container_settings(ebs: Synth) -> None:
    ebs.template.has_resource_properties(
        "AWS::SageMaker::Model",
        {
            "PrimaryContainer": Match.object_like(
                {
                    "MultiModelConfig": {"ModelCacheSetting": "Disabled"},
                    "Environment": {
                        "SAGEMAKER_TRITON_LOG_VERBOSE": "true",
                        "SAGEMAKER_TRITON_PING_MODE": "ready",
                        "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "16777216",
                        "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "1048576",
                        "SAGEMAKER_TRITON_THREAD_COUNT": "16",
                    },
                }
            )
        },
    )
    mapping = next(iter(ebs.data["Mappings"].values()))
    assert mapping["cn-north-1"]["ImageUri"].endswith(".amazonaws.com.cn/sagemaker-tritonserver:24.09-py3")
    ebs.template.has_resource_properties("AWS::SageMaker::EndpointConfig", {"ProductionVariants": [
        Match.object_like({"InstanceType": "ml.p3.2xlarge",
                           "InferenceAmiVersion": "al2-ami-sagemaker-inference-gpu-2"})]})


def test_autoscaling_settings(ebs: Synth) -> None:
    ebs.template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget", {"MinCapacity": 2, "MaxCapacity": 6}
    )
    ebs.template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {"TargetTrackingScalingPolicyConfiguration": Match.object_like({"TargetValue": 80})},
    )
    ebs.template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {"TargetTrackingScalingPolicyConfiguration": Match.object_like({"TargetValue": 150})},
    )


def test_destroy_policies(ebs: Synth) -> None:
    buckets = ebs.resources("AWS::S3::Bucket")
    assert {b["DeletionPolicy"] for b in buckets.values()} == {"Delete"}
    assert len(ebs.resources("Custom::S3AutoDeleteObjects")) == 2
    ebs.template.has_resource("AWS::KMS::Key", {"DeletionPolicy": "Delete", "Properties": Match.object_like({"PendingWindowInDays": 7})})
    props = ebs.only("Custom::TritonModelRelease")[1]["Properties"]
    assert props["OnDelete"] == "destroy"
    build = cast(ModelBuildResource, ebs.stack.endpoint_construct.node.find_child("ModelBuild"))
    role = ebs.stack.resolve(ebs.stack.get_logical_id(cast(cdk.CfnElement, build.role.node.default_child)))
    actions = {a for s in policy_of_role(ebs.data, role) for a in as_list(s["Action"])}
    assert {"s3:DeleteObject", "s3:DeleteObjectVersion", "s3:ListBucketVersions", "s3:GetBucketVersioning"} <= actions


def test_build_settings(ebs: Synth) -> None:
    for logical, function in ebs.resources("AWS::Lambda::Function").items():
        props = function["Properties"]
        if props.get("PackageType") == "Image":
            assert (props["MemorySize"], props["Timeout"]) == (4096, 600), logical
    machines = {k: json.dumps(v["Properties"]["DefinitionString"]).replace("\\", "")
                for k, v in ebs.resources("AWS::StepFunctions::StateMachine").items()}
    (waiter,) = [text for logical, text in machines.items() if "waiter" in logical]
    assert '"IntervalSeconds":30,"MaxAttempts":60' in waiter


def test_ebs_template_is_clean(ebs: Synth) -> None:
    lint(ebs)
    # Tags reach CDK's own auto-delete provider too (a plain CfnResource function and role).
    assert ebs.resources("Custom::S3AutoDeleteObjects")
    assert untagged(ebs.data, {"Project": "triton-mme", "Environment": "dev", "Owner": "unassigned"}) == []
    assert json.loads((ebs.outdir / "manifest.json").read_text())["artifacts"]["TritonMme"]["environment"] == (
        "aws://123456789012/eu-west-1"
    )


# ---------------------------------------------------------------------------------------------
# Serving a release published out of band
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth(tmp_path_factory.mktemp("published"), nag=True, **VARIANTS["published"])


def test_release_mode_has_no_build(published: Synth) -> None:
    assert published.resources("Custom::TritonModelRelease") == {}
    assert published.resources("AWS::Lambda::Function") == {}
    assert published.resources("AWS::StepFunctions::StateMachine") == {}
    bucket = published.stack.resolve(published.stack.get_logical_id(cast(cdk.CfnElement, published.stack.model_bucket.bucket.node.default_child)))
    expected = {"Fn::Join": ["", ["s3://", {"Ref": bucket}, "/models/served/"]]}
    published.template.has_resource_properties(
        "AWS::SageMaker::Model", {"PrimaryContainer": Match.object_like({"ModelDataUrl": expected})}
    )
    assert published.data["Outputs"]["ReleaseId"]["Value"] == RELEASE
    assert published.data["Outputs"]["ModelDataUrl"]["Value"] == expected
    lint(published)
    assert untagged(published.data, {"Project": "triton-mme", "Environment": "dev", "Owner": "unassigned"}) == []


# ---------------------------------------------------------------------------------------------
# The template does not grow with the number of models
# ---------------------------------------------------------------------------------------------


def test_template_size_and_resource_count_do_not_grow_from_1_to_1000_models(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("manifests")
    one = synth(folder / "one", nag=False, manifest_path=write_manifest(folder / "one.yaml", 1))
    many = synth(folder / "many", nag=False, manifest_path=write_manifest(folder / "many.yaml", 1000))
    assert len(many.data["Resources"]) == len(one.data["Resources"])
    assert len(mask(many.text)) == len(mask(one.text))
    assert mask(many.text) == mask(one.text)
    assert "model-0999" not in many.text


# ---------------------------------------------------------------------------------------------
# Construct props are validated early
# ---------------------------------------------------------------------------------------------


def _scope() -> cdk.Stack:
    return cdk.Stack(cdk.App(), "Props")


def _endpoint(stack: cdk.Stack, **overrides: object) -> SageMakerHosting:
    props: dict[str, Any] = dict(  # Any: the refusal cases give wrong types on purpose
        image=TritonImage(stack, "Image"),
        execution_role=iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com")),
        model_data_url="s3://bucket/models/r-0123456789abcdef/",
        endpoint_name="triton",
        instance_type="ml.g5.xlarge",
    )
    props.update(overrides)
    return SageMakerHosting(stack, "Endpoint", props=SageMakerHostingProps(**props))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"instance_type": "ml.c5.xlarge"}, "instance_type: got 'ml.c5.xlarge'; a GPU multi-model endpoint runs on one of"),
        ({"volume_size_gb": 50}, "volume_size_gb: got 50 with instance_type ml.g5.xlarge"),
        ({"volume_size_gb": 0, "instance_type": "ml.p3.2xlarge"}, "volume_size_gb: got 0; input should be greater than or equal to 1"),
        ({"model_data_url": "s3://bucket/models/file.tar.gz"}, "model_data_url: got 's3://bucket/models/file.tar.gz'; a multi-model endpoint needs an S3 prefix"),
        ({"endpoint_name": "-bad"}, "endpoint_name: got '-bad'"),
        ({"model_cache_setting": "enabled"}, "model_cache_setting: got \"enabled\"; input should be 'Enabled' or 'Disabled'"),
        ({"model_data_download_timeout": Duration.seconds(30)}, "model_data_download_timeout: got 30 s; expected 60 to 3600 s"),
        ({"container_startup_health_check_timeout": Duration.hours(2)}, "container_startup_health_check_timeout: got 7200 s"),
        ({"environment": {"SAGEMAKER_TRITON_BATCH_SIZE": "8"}}, "environment: unknown key 'SAGEMAKER_TRITON_BATCH_SIZE'"),
        ({"environment": {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "a"}}, "is for single-model endpoints"),
        ({"fleet": {"initial": 0}}, "fleet.initial: got 0; input should be greater than or equal to 1"),
        ({"fleet": {"initial": 1001, "maximum": 2000}}, "fleet.initial: got 1001; input should be less than or equal to 1000"),
        ({"fleet": {"minimum": 2}}, "minimum, initial, maximum: got 2, 1, 4; expected min <= initial <= max"),
        ({"image": "25.09"}, "image: got \"25.09\"; input should be an instance of TritonImage"),
        ({"execution_role": "arn:aws:iam::123456789012:role/x"}, "execution_role: got str; expected IRole"),
    ],
)
def test_endpoint_props(overrides: dict[str, object], expected: str) -> None:
    with pytest.raises(PropsError) as caught:
        _endpoint(_scope(), **overrides)
    assert expected in str(caught.value)


def test_endpoint_refuses_a_volume_key_on_instance_store() -> None:
    stack = _scope()
    key = kms.Key(stack, "Key")
    with pytest.raises(PropsError, match=r"volume_kms_key: given with instance_type ml\.g4dn\.xlarge"):
        _endpoint(stack, instance_type="ml.g4dn.xlarge", volume_kms_key=key)


def test_endpoint_grant_and_metrics() -> None:
    stack = _scope()
    endpoint = _endpoint(stack)
    user = iam.Role(stack, "Caller", assumed_by=iam.AccountRootPrincipal())
    grant = endpoint.grant_invoke(user)
    assert grant.success
    logical = stack.resolve(stack.get_logical_id(endpoint.endpoint))
    assert grant.principal_statement is not None
    statement = stack.resolve(grant.principal_statement.to_statement_json())
    assert statement["Action"] == "sagemaker:InvokeEndpoint"
    assert statement["Resource"] == {"Fn::GetAtt": [logical, "EndpointArn"]}
    expected = {
        "metric_invocations": ("AWS/SageMaker", "Invocations", "Sum"),
        "metric_invocations_per_instance": ("AWS/SageMaker", "InvocationsPerInstance", "Sum"),
        "metric_invocation_4xx_errors": ("AWS/SageMaker", "Invocation4XXErrors", "Sum"),
        "metric_invocation_5xx_errors": ("AWS/SageMaker", "Invocation5XXErrors", "Sum"),
        "metric_model_latency": ("AWS/SageMaker", "ModelLatency", "Average"),
        "metric_overhead_latency": ("AWS/SageMaker", "OverheadLatency", "Average"),
        "metric_model_loading_wait_time": ("AWS/SageMaker", "ModelLoadingWaitTime", "Average"),
        "metric_model_unloading_time": ("AWS/SageMaker", "ModelUnloadingTime", "Average"),
        "metric_model_downloading_time": ("AWS/SageMaker", "ModelDownloadingTime", "Average"),
        "metric_model_loading_time": ("AWS/SageMaker", "ModelLoadingTime", "Average"),
        "metric_model_cache_hit": ("AWS/SageMaker", "ModelCacheHit", "Average"),
        "metric_loaded_model_count": ("/aws/sagemaker/Endpoints", "LoadedModelCount", "Average"),
        "metric_cpu_utilization": ("/aws/sagemaker/Endpoints", "CPUUtilization", "Average"),
        "metric_memory_utilization": ("/aws/sagemaker/Endpoints", "MemoryUtilization", "Average"),
        "metric_disk_utilization": ("/aws/sagemaker/Endpoints", "DiskUtilization", "Average"),
        "metric_gpu_utilization": ("/aws/sagemaker/Endpoints", "GPUUtilization", "Average"),
        "metric_gpu_memory_utilization": ("/aws/sagemaker/Endpoints", "GPUMemoryUtilization", "Average"),
    }
    for method, (namespace, name, statistic) in expected.items():
        metric = getattr(endpoint, method)()
        assert (metric.namespace, metric.metric_name, metric.statistic) == (namespace, name, statistic), method
        assert metric.period.to_seconds() == 60
        # The name as given, not a reference: alarms on these metrics exist before the endpoint.
        assert stack.resolve(metric.dimensions) == {"EndpointName": "triton", "VariantName": "AllTraffic"}
    custom = endpoint.metric("ModelSetupTime", namespace="AWS/SageMaker", statistic="Maximum")
    assert (custom.metric_name, custom.statistic) == ("ModelSetupTime", "Maximum")
    assert (endpoint.variant_name, endpoint.instance_type) == ("AllTraffic", "ml.g5.xlarge")


def test_autoscaling_props() -> None:
    stack = _scope()
    endpoint = _endpoint(stack)
    with pytest.raises(PropsError, match="minimum, initial, maximum: got 5, 1, 2; expected min <= initial <= max"):
        FleetSize(minimum=5, maximum=2)
    with pytest.raises(PropsError, match="gpu_utilization_target: got 0; input should be greater than 0"):
        EndpointAutoscalingProps(endpoint=endpoint, gpu_utilization_target=0)
    with pytest.raises(PropsError, match="invocations_per_instance_target: got -3; input should be greater than 0"):
        EndpointAutoscalingProps(endpoint=endpoint, invocations_per_instance_target=-3)
    with pytest.raises(PropsError, match="gpu_scale_in_cooldown: got 86401 s; expected 0 to 86400 s"):
        EndpointAutoscalingProps(endpoint=endpoint, gpu_scale_in_cooldown=Duration.seconds(86401))


def test_image_props() -> None:
    with pytest.raises(PropsError, match=r"version: got '19\.01'; the sagemaker SDK's sagemaker-tritonserver table has"):
        TritonImageProps(version="19.01")
    stack = cdk.Stack(cdk.App(), "Gov", env=cdk.Environment(region="us-gov-west-1"))
    with pytest.raises(PropsError, match="region: got 'us-gov-west-1'"):
        TritonImage(stack, "Image")


def test_model_bucket_grants_are_prefix_scoped() -> None:
    stack = _scope()
    bucket = ModelBucket(stack, "Bucket")
    role = iam.Role(stack, "Reader", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    for grant in (bucket.grant_read(role, "team/models"), bucket.grant_write(role, "team/models"),
                  bucket.grant_tag(role, "team/models"), bucket.grant_delete(role, "team/models")):
        assert isinstance(grant, iam.Grant) and grant.success
    with pytest.raises(PropsError, match="prefix: got '/abs/'"):
        bucket.grant_read(role, "/abs/")
    with pytest.raises(PropsError, match="noncurrent_version_expiration: got 0 days; expected 1 to 36500 days"):
        ModelBucketProps(noncurrent_version_expiration=Duration.days(0))
    assert bucket.bucket_name and bucket.key


# ---------------------------------------------------------------------------------------------
# The model build resource
# ---------------------------------------------------------------------------------------------


MINIMAL = {
    "name": "m",
    "task": "image-classification",
    "format": "onnx",
    "image": {"image_size": 32},
}


def test_local_sources_are_refused_with_a_clear_message() -> None:
    manifest = parse_manifest(
        {"models": [{**MINIMAL, "name": "ok", "source": {"kind": "s3", "uri": "s3://src-bucket/a/"}},
                    {**MINIMAL, "name": "mine", "source": {"kind": "local", "path": "exports/mine"}}]}
    )
    with pytest.raises(ManifestError) as caught:
        refuse_local_sources(manifest)
    message = str(caught.value)
    assert message.startswith("models[1](mine).source: kind 'local' with path 'exports/mine'")
    assert "kind 's3', 'package' or 'huggingface'" in message
    assert "python -m model_build publish" in message and "release_id" in message
    onnx = parse_manifest({"models": [{**MINIMAL, "source": {"kind": "onnx", "path": "model.onnx"}}]})
    with pytest.raises(ManifestError, match=r"models\[0\]\(m\)\.source: kind 'onnx'"):
        refuse_local_sources(onnx)
    refuse_local_sources(parse_manifest({"models": [{**MINIMAL, "source": {"kind": "onnx", "path": "s3://b/m.onnx"}}]}))


def test_s3_sources_are_readable_and_grouped_per_bucket() -> None:
    manifest = parse_manifest({"models": [
        {**MINIMAL, "name": f"m{i}", "source": {"kind": "s3", "uri": f"s3://src-bucket/models/m{i}"}}
        for i in range(3)
    ] + [{**MINIMAL, "name": "n", "source": {"kind": "onnx", "path": "s3://other/n.onnx"}},
         {**MINIMAL, "name": "nested", "source": {"kind": "s3", "uri": "s3://src-bucket/models/m1/sub/"}},
         {**MINIMAL, "name": "m10", "source": {"kind": "s3", "uri": "s3://src-bucket/models/m10/"}}]})
    assert s3_source_keys(manifest) == {
        "other": ["n.onnx"],
        "src-bucket": ["models/m0/*", "models/m1/*", "models/m10/*", "models/m2/*"],
    }
    many = parse_manifest({"models": [
        {**MINIMAL, "name": f"m{i}", "source": {"kind": "s3", "uri": f"s3://src/p{i}/"}} for i in range(20)
    ]})
    assert s3_source_keys(many) == {"src": ["*"]}


def test_s3_source_policy(tmp_path: Path) -> None:
    manifest_path = tmp_path / "m.yaml"
    manifest_path.write_text(json.dumps({"models": [
        {**MINIMAL, "name": "a", "source": {"kind": "s3", "uri": "s3://src-bucket/models/a/"}},
        {**MINIMAL, "name": "b", "source": {"kind": "onnx", "path": "s3://other/b.onnx", "owner": "210987654321"}},
    ]}))
    from triton_mme_cdk.model_build.manifest import load_manifest

    stack = _scope()
    build = ModelBuildResource(stack, "Build", props=ModelBuildResourceProps(
        manifest=load_manifest(manifest_path), manifest_path=manifest_path,
        model_bucket=ModelBucket(stack, "Bucket").bucket, model_prefix="models", build_context=PACKAGE_DIR,
    ))
    document = stack.resolve(cast(iam.Policy, build.role.node.find_child("DefaultPolicy")).document.to_json())
    text = json.dumps(document)
    assert ':s3:::src-bucket/models/a/*"' in text and ':s3:::other/b.onnx"' in text
    assert '"s3:prefix": ["models/a/*"]' in text
    # Each source bucket is read only if it belongs to the account the source names, else to the
    # stack's own: a bucket of the same name in another account is not read.
    reads = {json.dumps(statement["Resource"]): statement for statement in document["Statement"]
             if statement["Action"] in ("s3:GetObject", "s3:ListBucket")
             and any(name in json.dumps(statement["Resource"]) for name in ("src-bucket", "other/b.onnx"))}
    owners = {resource: statement["Condition"]["StringEquals"]["s3:ResourceAccount"]
              for resource, statement in reads.items()}
    assert len(owners) == 3, owners  # the folder's objects and listing, the file
    for resource, owner in owners.items():
        assert owner == ("210987654321" if "other" in resource else {"Ref": "AWS::AccountId"}), (resource, owner)


def test_build_resource_props(tmp_path: Path) -> None:
    manifest_path = write_manifest(tmp_path / "m.yaml", 1)
    from triton_mme_cdk.model_build.manifest import load_manifest

    manifest = load_manifest(manifest_path)

    def build(**overrides: object) -> None:
        stack = _scope()
        props: dict[str, Any] = dict(  # Any: the refusal cases give wrong types on purpose
            manifest=manifest, manifest_path=manifest_path,
            model_bucket=ModelBucket(stack, "Bucket").bucket, model_prefix="models",
            build_context=PACKAGE_DIR,
        )
        props.update(overrides)
        ModelBuildResource(stack, "Build", props=ModelBuildResourceProps(**props))

    with pytest.raises(PropsError, match=r"build_context: got .*; it has no Dockerfile"):
        build(build_context=tmp_path)
    with pytest.raises(PropsError, match="total_timeout: got 7200 s; expected 1 to 3600 s"):
        build(total_timeout=Duration.hours(2))
    with pytest.raises(PropsError, match="total_timeout: got 10 minutes with query_interval 45 seconds; the total"):
        build(total_timeout=Duration.minutes(10), query_interval=Duration.seconds(45))
    with pytest.raises(PropsError, match="timeout: got 960 s; expected 1 to 900 s"):
        build(timeout=Duration.minutes(16))
    with pytest.raises(PropsError, match="memory_size: got 64; input should be greater than or equal to 128"):
        build(memory_size=64)
    with pytest.raises(PropsError, match="on_delete: got \"keep\"; input should be 'retain' or 'destroy'"):
        build(on_delete="keep")
    with pytest.raises(PropsError, match="model_prefix: got 'models/'"):
        build(model_prefix="models/")


def test_project_root_is_the_build_context() -> None:
    assert (PACKAGE_DIR / "Dockerfile").is_file(), "model_build/Dockerfile is the build image's recipe"
    assert PACKAGE_DIR == ROOT / "model_build"


def test_the_deployed_record_is_the_templates_own(ebs: Synth, published: Synth) -> None:
    """Every setting the ebs variant changes reaches the record as the template renders it; a stack
    that serves a release published out of band has no build, hence no record (plan: unknown
    offline, known with --stack-name)."""
    from triton_mme_cdk.model_build.release.deployed import check_embedded

    check_embedded(ebs.data)
    assert not [r for r in published.data["Resources"].values() if r["Type"] == "Custom::TritonModelRelease"]
