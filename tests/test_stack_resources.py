"""The default stack (``models.yaml``, default settings), built once, checked resource by resource."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
from aws_cdk import Validations
from aws_cdk.assertions import Match
from cdk_helpers import ROOT, VENV_BIN, Synth, as_list, policy_of_role, statements, synth

from triton_mme_cdk.constructs.model_bucket import RETIRED_TAG_KEY
from triton_mme_cdk.constructs.model_build_resource import ModelBuildResource
from triton_mme_cdk.constructs.triton_image import load_image_table
from triton_mme_cdk.model_build.manifest import load_manifest
from triton_mme_cdk.model_build.release import compute_release

BUCKET = "AWS::S3::Bucket"


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    # With the AwsSolutions checks as a validation plugin: the synth fails on any finding.
    return synth(tmp_path_factory.mktemp("default"), nag=True)


def logical_id(s: Synth, construct_path_suffix: str) -> str:
    """Logical id of the CloudFormation resource at ``<stack>/<suffix>``."""
    node = s.stack.endpoint_construct.node.find_child(construct_path_suffix.split("/")[0])
    for part in construct_path_suffix.split("/")[1:]:
        node = node.node.find_child(part)
    return s.stack.resolve(s.stack.get_logical_id(node))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Quality gates
# ---------------------------------------------------------------------------------------------


def test_cdk_nag_passes_with_specific_acknowledgments(default: Synth) -> None:
    report = default.outdir / "validation-report.json"
    if report.exists():
        assert json.loads(report.read_text())["pluginReports"] == []
    acknowledged: dict[str, str] = {}
    for construct in default.app.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                for rule_id, reason in dict(entry.data).items():
                    acknowledged[re.sub(r"^annotation::", "", rule_id, flags=re.I)] = reason
    # Every acknowledgment is one rule or one finding (never a blanket IAM5), with a reason.
    assert acknowledged
    assert "AwsSolutions-IAM5" not in acknowledged and "AwsSolutions-IAM4" not in acknowledged
    for rule_id, reason in acknowledged.items():
        assert len(reason) > 60, (rule_id, reason)
    rules = {rule_id.split("[")[0] for rule_id in acknowledged}
    # AwsSolutions-S1 is gone (issue 59): cdk-nag 3 passes a bucket that is another's log destination,
    # so its acknowledgment matched no finding. The compliance packs' rules: tests/test_compliance_packs.py.
    assert {rule for rule in rules if rule.startswith("AwsSolutions-")} == {"AwsSolutions-IAM5", "AwsSolutions-SF2"}
    assert {rule.split("-", 1)[1] for rule in rules if not rule.startswith("AwsSolutions-")} == {
        "IAMNoInlinePolicy", "LambdaConcurrency", "LambdaDLQ", "LambdaInsideVPC", "S3BucketReplicationEnabled",
        "S3DefaultEncryptionKMS", "SageMakerEndpointConfigurationKMSKeyConfigured"}


def test_cfn_lint_reports_nothing(default: Synth) -> None:
    template = default.outdir / "TritonMme.template.json"
    result = subprocess.run(
        [str(VENV_BIN / "cfn-lint"), str(template)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_no_wildcard_action_and_no_managed_policy(default: Synth) -> None:
    for policy, statement in statements(default.data):
        for action in as_list(statement["Action"]):
            assert "*" not in action, (policy, statement)
    for role_id, role in default.resources("AWS::IAM::Role").items():
        assert "ManagedPolicyArns" not in role["Properties"], role_id


def test_outputs(default: Synth) -> None:
    outputs = default.data["Outputs"]
    assert set(outputs) == {
        "EndpointName", "EndpointArn", "ModelBucketName", "ModelDataUrl", "RoutesUrl", "ReleaseId",
        "ExecutionRoleArn", "DashboardName", "DashboardUrl",
        "AlarmTopicArn",  # the alarms notify a created topic by default (issue 59)
    }
    for name, output in outputs.items():
        assert len(output.get("Description", "")) > 10, name
    endpoint = logical_id(default, "Endpoint/Resource")
    build = logical_id(default, "ModelBuild/Resource/Default")
    assert outputs["EndpointName"]["Value"] == {"Fn::GetAtt": [endpoint, "EndpointName"]}
    assert outputs["EndpointArn"]["Value"] == {"Fn::GetAtt": [endpoint, "EndpointArn"]}
    # The fixed served prefix, from the settings: the same whatever the model set.
    assert build not in json.dumps(outputs["ModelDataUrl"]["Value"])
    assert outputs["ModelDataUrl"]["Value"] == {"Fn::Join": ["", ["s3://", {"Ref": logical_id(default, "ModelBucket/Resource/Resource")}, "/models/served/"]]}
    assert outputs["RoutesUrl"]["Value"] == {"Fn::Join": ["", ["s3://", {"Ref": logical_id(default, "ModelBucket/Resource/Resource")}, "/models/_routes/routes.json"]]}
    assert outputs["ModelBucketName"]["Value"] == {"Ref": logical_id(default, "ModelBucket/Resource/Resource")}
    release_id = default.only("Custom::TritonModelRelease")[1]["Properties"]["ReleaseId"]
    assert outputs["ReleaseId"]["Value"] == release_id
    assert re.fullmatch(r"r-[0-9a-f]{16}", release_id)


def test_no_fixed_names_but_the_endpoint(default: Synth) -> None:
    model = default.only("AWS::SageMaker::Model")[1]["Properties"]
    config = default.only("AWS::SageMaker::EndpointConfig")[1]["Properties"]
    assert "ModelName" not in model and "EndpointConfigName" not in config
    for type_ in (BUCKET, "AWS::IAM::Role", "AWS::Lambda::Function", "AWS::Logs::LogGroup"):
        for logical, resource in default.resources(type_).items():
            props = resource["Properties"]
            assert not {"BucketName", "RoleName", "FunctionName", "LogGroupName"} & set(props), logical


# ---------------------------------------------------------------------------------------------
# Model bucket
# ---------------------------------------------------------------------------------------------


def test_model_bucket(default: Synth) -> None:
    key = logical_id(default, "ModelBucket/Key/Resource")
    logs_bucket = logical_id(default, "ModelBucket/AccessLogs/Resource")
    default.template.resource_count_is(BUCKET, 2)
    default.template.has_resource(
        BUCKET,
        {
            "Properties": {
                "BucketEncryption": {
                    "ServerSideEncryptionConfiguration": [
                        {
                            "BucketKeyEnabled": True,
                            "ServerSideEncryptionByDefault": {
                                "SSEAlgorithm": "aws:kms",
                                "KMSMasterKeyID": {"Fn::GetAtt": [key, "Arn"]},
                            },
                        }
                    ]
                },
                "PublicAccessBlockConfiguration": {
                    "BlockPublicAcls": True,
                    "BlockPublicPolicy": True,
                    "IgnorePublicAcls": True,
                    "RestrictPublicBuckets": True,
                },
                "VersioningConfiguration": {"Status": "Enabled"},
                "LoggingConfiguration": {
                    "DestinationBucketName": {"Ref": logs_bucket},
                    "LogFilePrefix": "model-bucket/",
                },
                "LifecycleConfiguration": {
                    "Rules": Match.array_with(
                        [
                            Match.object_like(
                                {"NoncurrentVersionExpiration": {"NoncurrentDays": 30}, "Status": "Enabled"}
                            ),
                            Match.object_like(
                                {
                                    "ExpirationInDays": 30,
                                    "TagFilters": [{"Key": RETIRED_TAG_KEY, "Value": "retired"}],
                                    "Status": "Enabled",
                                }
                            ),
                        ]
                    )
                },
            },
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
        },
    )
    default.template.has_resource_properties(
        "AWS::KMS::Key", {"EnableKeyRotation": True}
    )


def test_access_log_bucket(default: Synth) -> None:
    default.template.has_resource(
        BUCKET,
        {
            "Properties": {
                "BucketEncryption": {
                    "ServerSideEncryptionConfiguration": [
                        {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
                    ]
                },
                "PublicAccessBlockConfiguration": Match.object_like({"BlockPublicAcls": True}),
                "LifecycleConfiguration": {
                    "Rules": [Match.object_like({"ExpirationInDays": 365, "Status": "Enabled"})]
                },
                "LoggingConfiguration": Match.absent(),
            },
            "DeletionPolicy": "Retain",
        },
    )


def test_both_buckets_enforce_tls(default: Synth) -> None:
    policies = default.resources("AWS::S3::BucketPolicy")
    assert len(policies) == 2
    for policy in policies.values():
        denies = [
            s for s in policy["Properties"]["PolicyDocument"]["Statement"]
            if s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
        ]
        assert denies, policy
    # Server access logs are delivered through the log bucket's policy (no ACL).
    default.template.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Principal": {"Service": "logging.s3.amazonaws.com"},
                                        "Action": "s3:PutObject"})]
                )
            }
        },
    )


# ---------------------------------------------------------------------------------------------
# Execution role
# ---------------------------------------------------------------------------------------------


def test_execution_role(default: Synth) -> None:
    role_id = logical_id(default, "ExecutionRole/Resource/Resource")
    bucket = logical_id(default, "ModelBucket/Resource/Resource")
    key = logical_id(default, "ModelBucket/Key/Resource")
    image = logical_id(default, "TritonImage/Resource")
    role = default.data["Resources"][role_id]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    # Its conditions (aws:SourceAccount, aws:SourceArn): tests/test_stack_least_privilege.py.
    assert {k: v for k, v in trust.items() if k != "Condition"} == {
        "Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}}
    assert "ManagedPolicyArns" not in role
    found = policy_of_role(default.data, role_id)
    by_action = {a: s for s in found for a in as_list(s["Action"])}
    assert set(by_action) == {
        "s3:GetObject", "s3:ListBucket", "kms:Decrypt",
        "ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
        "ecr:BatchCheckLayerAvailability",
        "logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents",
        "cloudwatch:PutMetricData", "cloudwatch:DescribeAlarms",
    }
    # SageMaker reads the rollback alarms' states with the execution role: those alarms only.
    rollback = [a["AlarmName"]["Ref"] for a in default.only("AWS::SageMaker::Endpoint")[1]["Properties"][
        "DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]]
    described = sorted(r["Fn::GetAtt"][0] for r in by_action["cloudwatch:DescribeAlarms"]["Resource"])
    assert described == sorted(rollback) and len(rollback) == 3
    assert all(r["Fn::GetAtt"][1] == "Arn" for r in by_action["cloudwatch:DescribeAlarms"]["Resource"])
    # SageMaker reads the served prefix only: no routes, index, store or plan document.
    assert by_action["s3:GetObject"]["Resource"] == {
        "Fn::Join": ["", [{"Fn::GetAtt": [bucket, "Arn"]}, "/models/served/*"]]
    }
    assert by_action["s3:ListBucket"]["Resource"] == {"Fn::GetAtt": [bucket, "Arn"]}
    assert by_action["s3:ListBucket"]["Condition"] == {"StringLike": {"s3:prefix": ["models/served", "models/served/*"]}}
    assert by_action["kms:Decrypt"]["Resource"] == {"Fn::GetAtt": [key, "Arn"]}
    assert by_action["ecr:GetAuthorizationToken"]["Resource"] == "*"
    layers = json.dumps(by_action["ecr:BatchGetImage"]["Resource"])
    assert f'"Fn::FindInMap": ["{image}", {{"Ref": "AWS::Region"}}, "Account"]' in layers
    assert layers.endswith(':repository/sagemaker-tritonserver"]]}')
    assert by_action["ecr:GetDownloadUrlForLayer"] is by_action["ecr:BatchGetImage"]
    assert by_action["cloudwatch:PutMetricData"]["Condition"] == {
        "StringEquals": {"cloudwatch:namespace": "/aws/sagemaker/Endpoints"}
    }
    logs = json.dumps(by_action["logs:PutLogEvents"]["Resource"])
    assert ":log-group:/aws/sagemaker/Endpoints/triton-mme:log-stream:*" in logs
    group = json.dumps(by_action["logs:CreateLogGroup"]["Resource"])
    assert ":log-group:/aws/sagemaker/Endpoints/triton-mme" in group
    # The only resource wildcards: the two APIs without resource-level permissions.
    star = [s for s in found if s["Resource"] == "*"]
    assert sorted(a for s in star for a in as_list(s["Action"])) == [
        "cloudwatch:PutMetricData", "ecr:GetAuthorizationToken"
    ]


def test_sagemaker_resources_wait_for_the_role_policy(default: Synth) -> None:
    policy = logical_id(default, "ExecutionRole/Resource/DefaultPolicy/Resource")
    for type_ in ("AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig", "AWS::SageMaker::Endpoint"):
        assert policy in default.only(type_)[1]["DependsOn"], type_


# ---------------------------------------------------------------------------------------------
# Image, model, endpoint config, endpoint
# ---------------------------------------------------------------------------------------------


def test_image_mapping_covers_every_region_of_the_sdk_table(default: Synth) -> None:
    table = load_image_table()
    chosen = default.stack.triton_image.version  # the newest that runs on the default fleet's GPU
    assert chosen == default.stack.settings.fleet_host().image_version == "25.04"
    row = table.row(chosen)
    mapping = default.data["Mappings"][logical_id(default, "TritonImage/Resource")]
    assert set(mapping) == set(row.registries)
    assert len(mapping) == len(row.registries) >= 30
    for region, entry in mapping.items():
        assert entry == {"Account": row.registries[region], "ImageUri": row.image_uri(region)}
        assert entry["ImageUri"].endswith(f"/sagemaker-tritonserver:{chosen}-py3")


def test_model(default: Synth) -> None:
    default.template.resource_count_is("AWS::SageMaker::Model", 1)
    default.template.has_resource_properties(
        "AWS::SageMaker::Model",
        {
            "ExecutionRoleArn": {"Fn::GetAtt": [logical_id(default, "ExecutionRole/Resource/Resource"), "Arn"]},
            "PrimaryContainer": {
                "Mode": "MultiModel",
                "Image": {"Fn::FindInMap": [logical_id(default, "TritonImage/Resource"), {"Ref": "AWS::Region"}, "ImageUri"]},
                "ModelDataUrl": {"Fn::Join": ["", ["s3://", {"Ref": logical_id(default, "ModelBucket/Resource/Resource")}, "/models/served/"]]},
                "MultiModelConfig": {"ModelCacheSetting": "Enabled"},
                "Environment": {
                    "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "16777216",
                    "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "1048576",
                    "SAGEMAKER_TRITON_LOG_VERBOSE": "false",
                },
            },
        },
    )


def test_endpoint_config(default: Synth) -> None:
    default.template.resource_count_is("AWS::SageMaker::EndpointConfig", 1)
    config = default.only("AWS::SageMaker::EndpointConfig")[1]["Properties"]
    assert "KmsKeyId" not in config  # instance store: CreateEndpointConfig refuses one
    assert config["ProductionVariants"] == [
        {
            "VariantName": "AllTraffic",
            "ModelName": {"Fn::GetAtt": [logical_id(default, "Endpoint/Model"), "ModelName"]},
            "InstanceType": "ml.g5.xlarge",
            # The newest AMI documented for g5 whose driver runs the image's CUDA (model_build/gpu_hosts.py).
            "InferenceAmiVersion": "al2-ami-sagemaker-inference-gpu-2",
            "InitialInstanceCount": 1,
            "InitialVariantWeight": 1,
            "ModelDataDownloadTimeoutInSeconds": 600,
            "ContainerStartupHealthCheckTimeoutInSeconds": 600,
        }
    ]


def test_endpoint(default: Synth) -> None:
    default.template.resource_count_is("AWS::SageMaker::Endpoint", 1)
    default.template.has_resource_properties(
        "AWS::SageMaker::Endpoint",
        {
            "EndpointName": "triton-mme",
            "EndpointConfigName": {
                "Fn::GetAtt": [logical_id(default, "Endpoint/EndpointConfig"), "EndpointConfigName"]
            },
            "RetainAllVariantProperties": True,
        },
    )


# ---------------------------------------------------------------------------------------------
# Autoscaling
# ---------------------------------------------------------------------------------------------


def test_scalable_target(default: Synth) -> None:
    endpoint = logical_id(default, "Endpoint/Resource")
    default.template.resource_count_is("AWS::ApplicationAutoScaling::ScalableTarget", 1)
    default.template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget",
        {
            "ServiceNamespace": "sagemaker",
            "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
            # GetAtt of the endpoint: registered after the endpoint exists.
            "ResourceId": {"Fn::Join": ["", ["endpoint/", {"Fn::GetAtt": [endpoint, "EndpointName"]}, "/variant/AllTraffic"]]},
            "MinCapacity": 1,
            "MaxCapacity": 4,
            "RoleARN": {"Fn::Join": ["", Match.array_with([
                ":role/aws-service-role/sagemaker.application-autoscaling.amazonaws.com/"
                "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"
            ])]},
        },
    )


def test_scaling_policies(default: Synth) -> None:
    target = logical_id(default, "Autoscaling/Resource/Resource")
    default.template.resource_count_is("AWS::ApplicationAutoScaling::ScalingPolicy", 2)
    default.template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {
            "PolicyType": "TargetTrackingScaling",
            "ScalingTargetId": {"Ref": target},
            "TargetTrackingScalingPolicyConfiguration": {
                "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
                "TargetValue": 70,
                "ScaleInCooldown": 600,
                "ScaleOutCooldown": 300,
            },
        },
    )
    default.template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {
            "PolicyType": "TargetTrackingScaling",
            "ScalingTargetId": {"Ref": target},
            "TargetTrackingScalingPolicyConfiguration": {
                "CustomizedMetricSpecification": {
                    "MetricName": "GPUUtilization",
                    "Namespace": "/aws/sagemaker/Endpoints",
                    # The endpoint's name as given: metrics do not reference the endpoint resource
                    # (its DeploymentConfig references the alarms on them).
                    "Dimensions": [
                        {"Name": "EndpointName", "Value": "triton-mme"},
                        {"Name": "VariantName", "Value": "AllTraffic"},
                    ],
                    "Statistic": "Average",
                    "Unit": "Percent",
                },
                "TargetValue": 60,
                "ScaleInCooldown": 600,
                "ScaleOutCooldown": 200,
            },
        },
    )


# ---------------------------------------------------------------------------------------------
# Model build custom resource
# ---------------------------------------------------------------------------------------------


def test_build_custom_resource(default: Synth) -> None:
    manifest = load_manifest(ROOT / "models.yaml")
    # The release the construct computed at synth (the build code may change while tests run).
    release = cast(ModelBuildResource, default.stack.endpoint_construct.node.find_child("ModelBuild")).release
    assert release.manifest_sha256 == manifest.content_sha256()
    again = compute_release(manifest, base_dir=ROOT, code_sha256=release.code_sha256,
                            model_code=release.model_code_sha256)
    assert again == release and again.release_id == release.release_id
    assert dict(again.model_keys) == dict(release.model_keys)
    assert list(release.model_keys) == [spec.name for spec in manifest.models]
    _, resource = default.only("Custom::TritonModelRelease")
    props = resource["Properties"]
    assert set(props) == {
        "ServiceToken", "ServiceTimeout", "ManifestBucket", "ManifestKey", "ManifestSha256",
        "ModelBucket", "ModelPrefix", "ReleaseId", "CodeSha256", "OnDelete", "RetiredTagKey",
        "BuildStateMachineArn", "RetentionDays", "Deployed", "BuildEngine",
    }
    assert props["RetentionDays"] == "7"
    # Where models build: the settings' defaults, which the plan step places each model with.
    assert props["BuildEngine"] == {"RunsOn": "auto", "LambdaMemoryMb": "6144", "LambdaTimeoutSeconds": "900",
                                    "InstanceType": "ml.m5.4xlarge", "VolumeGb": "100", "MaxRuntimeSeconds": "3000"}
    # The deployed record (what plan compares with): a string, so CloudFormation resolves nothing in it.
    record = json.loads(props["Deployed"])
    _, config = default.only("AWS::SageMaker::EndpointConfig")
    assert record["resources"][logical_id(default, "Endpoint/EndpointConfig")] == {
        "Type": "AWS::SageMaker::EndpointConfig", "Properties": config["Properties"]}
    assert props["BuildStateMachineArn"] == {"Ref": logical_id(default, "ModelBuild/BuildStateMachine/Resource/Resource")}
    assert props["ServiceTimeout"] == "3600"
    assert re.fullmatch(r"[0-9a-f]{64}\.yaml", props["ManifestKey"])
    assert props["ManifestBucket"] == {"Fn::Sub": "cdk-hnb659fds-assets-${AWS::AccountId}-${AWS::Region}"}
    assert props["ManifestSha256"] == manifest.content_sha256() == release.manifest_sha256
    assert props["ReleaseId"] == release.release_id
    assert props["CodeSha256"] == release.code_sha256
    assert props["ModelBucket"] == {"Ref": logical_id(default, "ModelBucket/Resource/Resource")}
    assert props["ModelPrefix"] == "models"
    assert props["OnDelete"] == "retain"
    assert props["RetiredTagKey"] == "triton-mme:release-state"
    assert resource["DeletionPolicy"] == "Delete"
    # The manifest is not inlined.
    assert "resnet-synthetic" not in json.dumps(props)


def test_build_functions_share_one_image(default: Synth) -> None:
    functions = {
        k: v["Properties"] for k, v in default.resources("AWS::Lambda::Function").items()
        if v["Properties"].get("PackageType") == "Image"
    }
    assert len(functions) == 4
    commands = sorted(p["ImageConfig"]["Command"][0] for p in functions.values())
    assert commands == [
        "triton_mme_cdk.model_build.handler.build_step", "triton_mme_cdk.model_build.handler.is_complete",
        "triton_mme_cdk.model_build.handler.on_event", "triton_mme_cdk.model_build.handler.place_step",
    ]
    # Two roles: the build step's (it parses the model sources) and the placing one of the others.
    roles = {p["ImageConfig"]["Command"][0].rsplit(".", 1)[1]: p["Role"]["Fn::GetAtt"][0] for p in functions.values()}
    assert roles["build_step"] == logical_id(default, "ModelBuild/BuildRole/Resource")
    assert roles["on_event"] == roles["is_complete"] == roles["place_step"] == logical_id(default, "ModelBuild/Role/Resource")
    images = {json.dumps(p["Code"]["ImageUri"]) for p in functions.values()}
    assert len(images) == 1
    for props in functions.values():
        assert props["MemorySize"] == 6144
        assert props["EphemeralStorage"] == {"Size": 10240}
        assert props["Timeout"] == 900
        assert props["Architectures"] == ["x86_64"]
        assert "LogGroup" in props["LoggingConfig"]
    assets = json.loads((default.outdir / "TritonMme.assets.json").read_text())
    assert len(assets["dockerImages"]) == 1
    (image,) = assets["dockerImages"].values()
    assert image["source"]["platform"] == "linux/amd64"
    staged = default.outdir / image["source"]["directory"]
    assert (staged / "Dockerfile").is_file() and (staged / "handler" / "__init__.py").is_file()
    assert not list(staged.rglob("__pycache__"))


def test_provider_is_asynchronous_with_the_configured_timeouts(default: Synth) -> None:
    waiter_id = logical_id(default, "ModelBuild/Provider/waiter-state-machine/Resource")
    machine = default.resources("AWS::StepFunctions::StateMachine")[waiter_id]["Properties"]
    definition = "".join(p if isinstance(p, str) else "<ref>" for p in machine["DefinitionString"]["Fn::Join"][1])
    # 50 polls a minute apart: the last answer reaches CloudFormation within its one-hour wait
    # (tests/test_custom_resource_protocol.py).
    assert '"IntervalSeconds":60,"MaxAttempts":50,"BackoffRate":1' in definition
    assert machine["LoggingConfiguration"]["Level"] == "ALL"
    # The provider's onEvent calls the user's on_event; the waiter polls is_complete.
    framework = {
        p["Handler"]: p for p in (v["Properties"] for v in default.resources("AWS::Lambda::Function").values())
        if p.get("Handler", "").startswith("framework.")
    }
    assert set(framework) == {"framework.onEvent", "framework.isComplete", "framework.onTimeout"}


def _definition(default: Synth, path: str) -> dict[str, Any]:
    """A state machine's definition, with each token replaced by a placeholder naming it."""
    machine = default.resources("AWS::StepFunctions::StateMachine")[logical_id(default, path)]["Properties"]
    parts = machine["DefinitionString"]["Fn::Join"][1]
    text = "".join(
        p if isinstance(p, str) else "<" + (p.get("Ref") or ".".join(p.get("Fn::GetAtt", ["?"]))) + ">" for p in parts
    )
    return dict(json.loads(text), _properties=machine)


def test_build_state_machine_plans_maps_and_finishes(default: Synth) -> None:
    definition = _definition(default, "ModelBuild/BuildStateMachine/Resource/Resource")
    machine = definition.pop("_properties")
    build_fn = logical_id(default, "ModelBuild/Build/Resource")
    bucket = logical_id(default, "ModelBucket/Resource/Resource")
    assert definition["StartAt"] == "Plan"
    states = definition["States"]
    assert [states["Plan"]["Next"], states["BuildModels"]["Next"]] == ["BuildModels", "Finish"]
    assert states["Finish"]["End"] is True
    build_map = states["BuildModels"]
    assert build_map["Type"] == "Map"
    assert build_map["ItemProcessor"]["ProcessorConfig"]["Mode"] == "DISTRIBUTED"
    assert build_map["MaxConcurrency"] == 50
    # No tolerated failures (Step Functions' default, 0): one failed model fails the Map.
    assert build_map.get("ToleratedFailureCount", 0) == 0 and "ToleratedFailurePercentage" not in build_map
    # The item source is the plan the build writes in the model bucket (data, not template).
    reader = build_map["ItemReader"]
    assert reader["Resource"].endswith(":states:::s3:getObject")
    assert reader["ReaderConfig"]["InputType"] == "JSON"
    assert reader["Parameters"] == {"Bucket": f"<{bucket}>", "Key.$": "$.Plan.Key"}
    assert build_map["ItemSelector"] == {
        "Step": "build", "Request.$": "$.Request",
        "Model.$": "$$.Map.Item.Value.Model", "Key.$": "$$.Map.Item.Value.Key",
        "Engine.$": "$$.Map.Item.Value.Engine", "Job.$": "$$.Map.Item.Value.Job",
        "Started.$": "$$.Execution.StartTime",  # the parent's start: OutgrewLambda's budget left
    }
    # Each item builds on the Lambda, or in a Processing job whose unit the Lambda stores
    # (tests/test_deploy_path_processing.py executes that branch).
    item_states = build_map["ItemProcessor"]["States"]
    assert set(item_states) == {"WhereItBuilds", "BuildModel", "PlaceModel", "BuildOnProcessing", "OutgrewLambda"}
    (branch,) = item_states["BuildOnProcessing"]["Branches"]
    place_fn = logical_id(default, "ModelBuild/Place/Resource")
    placing = [states["Finish"], item_states["PlaceModel"], branch["States"]["PlaceJobModel"]]
    tasks = [states["Plan"], item_states["BuildModel"], item_states["OutgrewLambda"], branch["States"]["StoreBuild"],
             branch["States"]["JobFailed"], *placing]
    for task in tasks:
        # Each item is placed, and the release finished, under the placing role; the build steps
        # under the build role.
        assert task["Resource"] == f"<{place_fn if any(task is p for p in placing) else build_fn}.Arn>"
        retry, once = task["Retry"]
        # Once more after a killed runtime, and (but for a build) after a timeout.
        killed = ["Lambda.Unknown"] if task is item_states["BuildModel"] else ["Sandbox.Timedout", "Lambda.Unknown"]
        assert once == {"ErrorEquals": killed, "IntervalSeconds": 1, "MaxAttempts": 1}
        assert set(retry["ErrorEquals"]) == {
            "Lambda.TooManyRequestsException", "Lambda.ServiceException", "Lambda.AWSLambdaException",
            "Lambda.SdkClientException", "Lambda.ClientExecutionTimeoutException",
        }
        assert (retry["IntervalSeconds"], retry["MaxAttempts"], retry["BackoffRate"]) == (2, 6, 2)
        assert retry["JitterStrategy"] == "FULL"
    assert states["Plan"]["Parameters"] == {"Step": "plan", "Request.$": "$.Request"}
    assert states["Plan"]["ResultPath"] == "$.Plan"
    assert states["Finish"]["Parameters"] == {"Step": "finish", "Request.$": "$.Request"}
    # After its build, each item is placed; the child's output is discarded: the Map's collected
    # outputs stay far under 256 KiB.
    assert item_states["BuildModel"]["ResultPath"] is None and item_states["BuildModel"]["Next"] == "PlaceModel"
    # A build past its timeout or killed twice goes to OutgrewLambda, then to Processing (or fails there).
    assert item_states["BuildModel"]["Catch"] == [{"ErrorEquals": ["Sandbox.Timedout", "Lambda.Unknown"],
                                                   "ResultPath": "$.LambdaError", "Next": "OutgrewLambda"}]
    assert item_states["OutgrewLambda"]["Next"] == "BuildOnProcessing"
    assert item_states["OutgrewLambda"]["ResultPath"] == "$.Job"
    assert item_states["OutgrewLambda"]["Parameters"] == {
        "Step": "outgrew_lambda", "Request.$": "$.Request", "Model.$": "$.Model", "Key.$": "$.Key",
        "Error.$": "$.LambdaError.Error", "Cause.$": "$.LambdaError.Cause", "Started.$": "$.Started",
        "BudgetSeconds": 3000, "Processing": True}
    assert item_states["PlaceModel"]["Parameters"] == {"Step": "place", "Request.$": "$.Request",
                                                       "Model.$": "$.Model", "Key.$": "$.Key"}
    assert item_states["PlaceModel"]["OutputPath"] is None
    assert definition["TimeoutSeconds"] == 3000
    assert machine["TracingConfiguration"] == {"Enabled": True}
    assert machine["LoggingConfiguration"]["Level"] == "ALL"
    # Its role may invoke the build and placing functions only (and their versions).
    role_id = logical_id(default, "ModelBuild/BuildStateMachine/Resource/Role/Resource")
    invokes = [s for s in policy_of_role(default.data, role_id) if "lambda:InvokeFunction" in as_list(s["Action"])]
    resources = [json.dumps(r) for s in invokes for r in as_list(s["Resource"])]
    assert resources and all(build_fn in r or place_fn in r for r in resources)
    assert any(build_fn in r for r in resources) and any(place_fn in r for r in resources)


def test_build_state_machine_concurrency_is_a_setting(tmp_path: Path) -> None:
    concurrent = synth(tmp_path, nag=False, build_max_concurrency="7")
    definition = _definition(concurrent, "ModelBuild/BuildStateMachine/Resource/Resource")
    assert definition["States"]["BuildModels"]["MaxConcurrency"] == 7


def test_log_groups_have_retention(default: Synth) -> None:
    groups = default.resources("AWS::Logs::LogGroup")
    # on_event, is_complete, build, place, provider framework, waiter state machine, build state machine
    assert len(groups) == 7
    for logical, group in groups.items():
        assert group["Properties"]["RetentionInDays"] == 30, logical


def test_build_role_is_scoped(default: Synth) -> None:
    """The placing role (on_event, is_complete, the Finish task) and the build role (build_step)."""
    role_id = logical_id(default, "ModelBuild/Role/Resource")
    bucket = logical_id(default, "ModelBucket/Resource/Resource")
    found = policy_of_role(default.data, role_id)
    by_action = {a: s for s in found for a in as_list(s["Action"])}
    assert set(by_action) == {
        "s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:GetObjectTagging",
        "s3:PutObjectTagging", "s3:ListBucket", "kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey",
        "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:ListBucketVersions", "s3:GetBucketVersioning",
        "cloudformation:DescribeStacks", "logs:CreateLogStream", "logs:PutLogEvents",
        "states:StartExecution", "states:DescribeExecution",
        # Each event checked against the stack's template, and the handlers' own stack tag.
        "cloudformation:GetTemplate", "cloudformation:DescribeStackResource", "lambda:ListTags",
    }
    machine = logical_id(default, "ModelBuild/BuildStateMachine/Resource/Resource")
    assert by_action["states:StartExecution"]["Resource"] == {"Ref": machine}, "its own state machine only"
    assert machine in json.dumps(by_action["states:DescribeExecution"]["Resource"])

    def objects(*folders: str) -> set[str]:
        return {json.dumps({"Fn::Join": ["", [{"Fn::GetAtt": [bucket, "Arn"]}, f"/models/{f}/*"]]}) for f in folders}

    def resources(statements: list[dict[str, Any]], action: str) -> set[str]:
        return {json.dumps(r) for s in statements if action in as_list(s["Action"]) for r in as_list(s["Resource"])}

    for action in ("s3:PutObject", "s3:AbortMultipartUpload"):
        # What is served, and the failure record of a model it refuses to place.
        assert resources(found, action) == objects("served", "_routes", "_releases", "_plans"), action
    assert resources(found, "s3:PutObjectTagging") == {json.dumps(
        {"Fn::Join": ["", [{"Fn::GetAtt": [bucket, "Arn"]}, "/models/*"]]})}
    # It deletes only served objects that no route has used for the retention window.
    assert by_action["s3:DeleteObject"]["Resource"] == {
        "Fn::Join": ["", [{"Fn::GetAtt": [bucket, "Arn"]}, "/models/served/*"]]}
    assert by_action["cloudformation:DescribeStacks"]["Resource"] == {"Ref": "AWS::StackId"}
    for action in ("cloudformation:GetTemplate", "cloudformation:DescribeStackResource"):
        assert by_action[action]["Resource"] == {"Ref": "AWS::StackId"}, action
    handlers = [{"Fn::GetAtt": [logical_id(default, f"ModelBuild/{name}/Resource"), "Arn"]}
                for name in ("OnEvent", "IsComplete")]
    assert resources(found, "lambda:ListTags") == {json.dumps(h) for h in handlers}, "the two handlers' own tags only"
    manifest_reads = [s for s in found if s.get("Sid") == "ReadManifest"]
    assert len(manifest_reads) == 1
    assert json.dumps(manifest_reads[0]["Resource"]).endswith('.yaml"]]}')

    # The build role parses the model sources: it reads, and writes the store, the plans, the jobs.
    built = policy_of_role(default.data, logical_id(default, "ModelBuild/BuildRole/Resource"))
    assert {a for s in built for a in as_list(s["Action"])} == {
        "s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListBucket",
        "kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "logs:CreateLogStream", "logs:PutLogEvents",
    }
    for action in ("s3:PutObject", "s3:AbortMultipartUpload"):
        assert resources(built, action) == objects("_builds", "_plans", "_jobs"), action
    assert len([s for s in built if s.get("Sid") == "ReadManifest"]) == 1


def test_the_endpoint_waits_for_the_first_build_by_a_dependency_not_a_value(default: Synth) -> None:
    model = default.only("AWS::SageMaker::Model")[1]
    endpoint = default.only("AWS::SageMaker::Endpoint")[1]
    build = logical_id(default, "ModelBuild/Resource/Default")
    for resource in (model, endpoint, default.only("AWS::SageMaker::EndpointConfig")[1]):
        assert build not in json.dumps(resource.get("Properties")), "no value of the build reaches the fleet"
    assert build in endpoint.get("DependsOn", [])


def test_template_has_no_local_paths(default: Synth) -> None:
    assert str(ROOT) not in default.text
    assert str(Path.home()) not in default.text or str(Path.home()) == "/"


def test_project_constructs_are_a_subpackage_beside_the_constructs_library() -> None:
    """``constructs/`` has no ``__init__.py`` (in a checkout it must not shadow the library when the
    repository root is on ``sys.path``): its modules are ``triton_mme_cdk.constructs.<name>``, and
    the library's ``constructs`` package is the library's alone."""
    import importlib

    import aws_cdk  # noqa: F401

    import constructs

    assert not (ROOT / "constructs" / "__init__.py").exists()
    modules = sorted(p.stem for p in (ROOT / "constructs").glob("*.py"))
    assert {"model_bucket", "sagemaker_execution_role", "triton_image", "sagemaker_hosting",
            "endpoint_autoscaling", "model_build_resource"} <= set(modules)
    for name in modules:
        module = importlib.import_module(f"triton_mme_cdk.constructs.{name}")
        assert Path(module.__file__).resolve().parent == ROOT / "constructs"  # type: ignore[arg-type]
    assert constructs.Construct.__module__ == "constructs"
    assert "_jsii" not in modules
