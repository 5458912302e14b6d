"""Operations variants: a created isolated VPC with notifications and canary rollouts, an existing
VPC with an existing topic and linear rollouts; and the constructs' own validation."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any, cast

import aws_cdk as cdk
import pytest
from aws_cdk import Duration, Validations
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template
from cdk_helpers import (
    ACCOUNT,
    REGION,
    TOPIC_ARN,
    VARIANTS,
    VENV_BIN,
    VPC_ID,
    Synth,
    as_list,
    policy_of_role,
    run_app,
    synth,
    untagged,
    vpc_lookup_context,
    write_manifest,
)

from triton_mme_cdk.constructs.alarm_topic import AlarmTopicProps
from triton_mme_cdk.constructs.endpoint_alarms import AlarmThresholds, EndpointAlarms, EndpointAlarmsProps
from triton_mme_cdk.constructs.endpoint_dashboard import EndpointDashboardProps
from triton_mme_cdk.constructs.endpoint_network import (
    NO_TRAFFIC_RULE,
    PLACEHOLDER_ID_RULES,
    EndpointNetwork,
    EndpointNetworkProps,
)
from triton_mme_cdk.constructs.model_bucket import ModelBucket
from triton_mme_cdk.constructs.model_build_resource import (
    LAMBDA_VPC_ACTIONS,
    ModelBuildResource,
    ModelBuildResourceProps,
)
from triton_mme_cdk.constructs.rollout_policy import RolloutPolicy, RolloutPolicyProps
from triton_mme_cdk.constructs.sagemaker_hosting import (
    SAGEMAKER_VPC_ACTIONS,
    FleetSize,
    SageMakerHosting,
    SageMakerHostingProps,
)
from triton_mme_cdk.constructs.sagemaker_limits import PropsError
from triton_mme_cdk.constructs.triton_image import TritonImage
from triton_mme_cdk.model_build.manifest import load_manifest
from triton_mme_cdk.model_build.release import PACKAGE_DIR

SG = "AWS::EC2::SecurityGroup"


def lint(s: Synth) -> None:
    result = subprocess.run(
        [str(VENV_BIN / "cfn-lint"), str(s.outdir / "TritonMme.template.json")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def nag_clean(s: Synth) -> dict[str, str]:
    """Assert the AwsSolutions checks passed; return the acknowledgments (rule id -> reason)."""
    report = s.outdir / "validation-report.json"
    if report.exists():
        assert json.loads(report.read_text())["pluginReports"] == []
    acknowledged: dict[str, str] = {}
    for construct in s.app.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                for rule_id, reason in dict(entry.data).items():
                    acknowledged[re.sub(r"^annotation::", "", rule_id, flags=re.I)] = reason
    # One rule or one finding each (never a blanket IAM5/IAM4), each with a reason.
    assert "AwsSolutions-IAM5" not in acknowledged and "AwsSolutions-IAM4" not in acknowledged
    assert all(len(reason) > 60 for reason in acknowledged.values()), acknowledged
    return acknowledged


def ref_id(s: Synth, construct: Any) -> str:
    return s.stack.resolve(s.stack.get_logical_id(construct.node.default_child))


def network_of(s: Synth) -> EndpointNetwork:
    """The stack's network; the variants given here have one."""
    assert s.stack.network is not None
    return s.stack.network


def alarm_actions(s: Synth) -> list[tuple[Any, Any]]:
    return [(r["Properties"].get("AlarmActions"), r["Properties"].get("OKActions"))
            for r in s.resources("AWS::CloudWatch::Alarm").values()]


def no_ingress(s: Synth, group_id: str) -> None:
    group = s.data["Resources"][group_id]["Properties"]
    assert "SecurityGroupIngress" not in group
    for logical_id, rule in s.resources("AWS::EC2::SecurityGroupIngress").items():
        assert rule["Properties"]["GroupId"] != {"Fn::GetAtt": [group_id, "GroupId"]}, logical_id


def https_egress_only(s: Synth, group_id: str) -> None:
    group = s.data["Resources"][group_id]["Properties"]
    separate = [rule["Properties"] for rule in s.resources("AWS::EC2::SecurityGroupEgress").values()
                if rule["Properties"]["GroupId"] == {"Fn::GetAtt": [group_id, "GroupId"]}]
    if group["SecurityGroupEgress"] == [NO_TRAFFIC_RULE]:
        # A created VPC: HTTPS to S3's prefix list and the interface endpoints, as rules of their own
        # (tests/test_stack_least_privilege.py names the destinations).
        assert separate
    else:
        assert group["SecurityGroupEgress"] == [
            {"CidrIp": "0.0.0.0/0", "Description": "HTTPS to AWS endpoints (VPC endpoints in an isolated VPC)",
             "FromPort": 443, "IpProtocol": "tcp", "ToPort": 443}
        ]
    for rule in separate:
        assert (rule["FromPort"], rule["ToPort"]) == (443, 443)


# ---------------------------------------------------------------------------------------------
# A created, isolated VPC; the build inside it; a created topic with e-mails; canary rollouts
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth(tmp_path_factory.mktemp("ops-isolated"), nag=True, **VARIANTS["isolated"])


def test_isolated_variant_is_clean(isolated: Synth) -> None:
    acknowledged = nag_clean(isolated)
    # cdk-nag rules (CDK itself acknowledges a few of its built-in CloudFormation-Validate rules
    # on the VPC's flow log and AZs; those are not ours).
    nag_rules = {rule.split("[")[0] for rule in acknowledged if rule.startswith("AwsSolutions-")}
    # IAM4: the managed logging policy CDK gives its AwsCustomResource function (the S3 prefix list lookup).
    # (No AwsSolutions-S1: cdk-nag 3 passes a bucket that is another's log destination; issue 59.)
    assert nag_rules == {"AwsSolutions-IAM4", "AwsSolutions-IAM5", "AwsSolutions-SF2"}
    # The VPC adds one finding per network-interface policy (EC2 actions without resource-level
    # permissions: the build Lambda's, the model's and the Processing build job's), acknowledged on
    # that policy only.
    vpc_policies = [c for c in isolated.app.node.find_all() if c.node.id == "VpcAccess"]
    assert sorted(p.node.path for p in vpc_policies) == [
        "TritonMme/Default/Endpoint/VpcAccess", "TritonMme/Default/ModelBuild/Processing/VpcAccess",
        "TritonMme/Default/ModelBuild/VpcAccess"]
    for policy in vpc_policies:
        rules = [dict(e.data) for e in policy.node.metadata if e.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY]
        ids = [re.sub(r"^annotation::", "", rule_id, flags=re.I) for r in rules for rule_id in r]
        assert ids == ["AwsSolutions-IAM5[Resource::*]"]
    lint(isolated)
    assert untagged(isolated.data, {"Project": "search", "Environment": "prod",
                                    "Owner": "ml-platform@example.com"}) == []


def test_created_vpc_has_isolated_subnets_only(isolated: Synth) -> None:
    _, vpc = isolated.only("AWS::EC2::VPC")
    assert vpc["Properties"]["CidrBlock"] == "10.42.0.0/16"
    subnets = isolated.resources("AWS::EC2::Subnet")
    assert len(subnets) == 2
    assert {s["Properties"]["MapPublicIpOnLaunch"] for s in subnets.values()} == {False}
    for type_ in ("AWS::EC2::InternetGateway", "AWS::EC2::NatGateway", "AWS::EC2::EIP", "AWS::EC2::Route"):
        assert isolated.resources(type_) == {}, type_
    flow_log = isolated.only("AWS::EC2::FlowLog")[1]["Properties"]
    assert (flow_log["ResourceType"], flow_log["TrafficType"]) == ("VPC", "ALL")
    assert len(isolated.resources("Custom::VpcRestrictDefaultSG")) == 1


def test_created_vpc_endpoints(isolated: Synth) -> None:
    endpoints = isolated.resources("AWS::EC2::VPCEndpoint")
    services = {}
    for props in (e["Properties"] for e in endpoints.values()):
        name = props["ServiceName"]["Fn::Join"][1][-1].lstrip(".")
        services[name] = props
    # S3 is the endpoint SageMaker documents for a model in a VPC without internet; the build
    # needs CloudFormation; the rest are the requested (default) interface endpoints.
    assert set(services) == {"s3", "ecr.api", "ecr.dkr", "logs", "monitoring", "cloudformation"}
    assert services["s3"]["VpcEndpointType"] == "Gateway"
    assert len(services["s3"]["RouteTableIds"]) == 2
    subnet_ids = sorted({"Ref": k}["Ref"] for k in isolated.resources("AWS::EC2::Subnet"))
    endpoint_group = ref_id(isolated, network_of(isolated).endpoint_security_group)
    for name, props in services.items():
        if name == "s3":
            continue
        assert props["VpcEndpointType"] == "Interface" and props["PrivateDnsEnabled"] is True
        assert sorted(s["Ref"] for s in props["SubnetIds"]) == subnet_ids
        assert props["SecurityGroupIds"] == [{"Fn::GetAtt": [endpoint_group, "GroupId"]}]
    # The endpoints' group admits HTTPS from the model's and the build's groups only.
    model_group = ref_id(isolated, network_of(isolated).model_security_group)
    build_group = ref_id(isolated, network_of(isolated).build_security_group)
    ingress = [r["Properties"] for r in isolated.resources("AWS::EC2::SecurityGroupIngress").values()
               if r["Properties"]["GroupId"] == {"Fn::GetAtt": [endpoint_group, "GroupId"]}]
    assert sorted(r["SourceSecurityGroupId"]["Fn::GetAtt"][0] for r in ingress) == sorted([model_group, build_group])
    assert {(r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in ingress} == {("tcp", 443, 443)}
    assert "CidrIp" not in json.dumps(ingress)


def test_security_groups_have_no_inbound_rule(isolated: Synth) -> None:
    for group in (network_of(isolated).model_security_group, network_of(isolated).build_security_group):
        group_id = ref_id(isolated, group)
        no_ingress(isolated, group_id)
        https_egress_only(isolated, group_id)


def test_model_in_the_vpc(isolated: Synth) -> None:
    model = isolated.only("AWS::SageMaker::Model")[1]
    props = model["Properties"]
    assert props["EnableNetworkIsolation"] is True
    model_group = ref_id(isolated, network_of(isolated).model_security_group)
    assert props["VpcConfig"]["SecurityGroupIds"] == [{"Fn::GetAtt": [model_group, "GroupId"]}]
    assert sorted(s["Ref"] for s in props["VpcConfig"]["Subnets"]) == sorted(isolated.resources("AWS::EC2::Subnet"))
    # SageMaker's network-interface permissions, in a policy the model waits for.
    policy = ref_id(isolated, isolated.stack.endpoint.vpc_access_policy)
    assert policy in model["DependsOn"]
    statement = isolated.data["Resources"][policy]["Properties"]["PolicyDocument"]["Statement"]
    assert statement == [{"Action": sorted(SAGEMAKER_VPC_ACTIONS), "Effect": "Allow", "Resource": "*"}]
    role = ref_id(isolated, isolated.stack.execution_role.role)
    assert isolated.data["Resources"][policy]["Properties"]["Roles"] == [{"Ref": role}]


def test_build_in_the_vpc(isolated: Synth) -> None:
    build = cast(ModelBuildResource, isolated.stack.endpoint_construct.node.find_child("ModelBuild"))
    build_group = ref_id(isolated, network_of(isolated).build_security_group)
    policy = ref_id(isolated, build.vpc_access_policy)
    images = {k: v for k, v in isolated.resources("AWS::Lambda::Function").items()
              if v["Properties"].get("PackageType") == "Image"}
    assert len(images) == 4  # on_event, is_complete, and the build and placing steps of the state machine
    for function in images.values():
        config = function["Properties"]["VpcConfig"]
        assert config["SecurityGroupIds"] == [{"Fn::GetAtt": [build_group, "GroupId"]}]
        assert len(config["SubnetIds"]) == 2
        assert policy in function["DependsOn"]
    statement = isolated.data["Resources"][policy]["Properties"]["PolicyDocument"]["Statement"]
    assert statement == [{"Action": sorted(LAMBDA_VPC_ACTIONS), "Effect": "Allow", "Resource": "*"}]
    # The provider framework's own functions stay outside the VPC (they only call Lambda and S3).
    framework = [v for v in isolated.resources("AWS::Lambda::Function").values()
                 if v["Properties"].get("Handler", "").startswith("framework.")]
    assert framework and all("VpcConfig" not in f["Properties"] for f in framework)


def test_created_topic_is_encrypted_tls_only_and_cloudwatch_may_publish(isolated: Synth) -> None:
    topic_id, topic = isolated.only("AWS::SNS::Topic")
    alarm_topic = isolated.stack.alarm_topic
    assert alarm_topic is not None
    key_id = ref_id(isolated, alarm_topic.key)
    assert topic["Properties"]["KmsMasterKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    key = isolated.data["Resources"][key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    cloudwatch_key = [s for s in key["KeyPolicy"]["Statement"]
                      if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    assert cloudwatch_key == [{
        "Sid": "AllowCloudWatchAlarmsToPublish", "Effect": "Allow",
        "Principal": {"Service": "cloudwatch.amazonaws.com"},
        "Action": ["kms:Decrypt", "kms:GenerateDataKey*"], "Resource": "*",
        "Condition": {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}},
    }]
    policy = isolated.only("AWS::SNS::TopicPolicy")[1]["Properties"]
    assert policy["Topics"] == [{"Ref": topic_id}]
    statements = policy["PolicyDocument"]["Statement"]
    deny = [s for s in statements if s["Effect"] == "Deny"]
    assert deny == [{"Action": "sns:Publish", "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                     "Effect": "Deny", "Principal": "*", "Resource": {"Ref": topic_id},
                     "Sid": "AllowPublishThroughSSLOnly"}]
    (allow,) = [s for s in statements if s["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert allow["Action"] == "sns:Publish"
    assert allow["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    assert json.dumps(allow["Condition"]["ArnLike"]["aws:SourceArn"]).endswith(':alarm:*"]]}')
    emails = sorted(s["Properties"]["Endpoint"] for s in isolated.resources("AWS::SNS::Subscription").values())
    assert emails == ["ml-oncall@example.com", "ops@example.com"]
    assert {s["Properties"]["Protocol"] for s in isolated.resources("AWS::SNS::Subscription").values()} == {"email"}
    # Every alarm notifies the topic on ALARM and on OK.
    assert alarm_actions(isolated) == [([{"Ref": topic_id}], [{"Ref": topic_id}])] * 7
    assert isolated.data["Outputs"]["AlarmTopicArn"]["Value"] == {"Ref": topic_id}


def test_canary_deployment_config(isolated: Synth) -> None:
    config = isolated.only("AWS::SageMaker::Endpoint")[1]["Properties"]["DeploymentConfig"]
    assert config["BlueGreenUpdatePolicy"] == {
        "TrafficRoutingConfiguration": {
            "Type": "CANARY", "WaitIntervalInSeconds": 900,
            "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 20},
        },
        "TerminationWaitInSeconds": 0,
    }
    assert len(config["AutoRollbackConfiguration"]["Alarms"]) == 3


def test_isolated_outputs(isolated: Synth) -> None:
    outputs = isolated.data["Outputs"]
    assert outputs["VpcId"]["Value"] == {"Ref": isolated.only("AWS::EC2::VPC")[0]}
    model_group = ref_id(isolated, network_of(isolated).model_security_group)
    assert outputs["ModelSecurityGroupId"]["Value"] == {"Fn::GetAtt": [model_group, "GroupId"]}
    for name in ("AlarmTopicArn", "VpcId", "ModelSecurityGroupId", "DashboardName", "DashboardUrl"):
        assert len(outputs[name]["Description"]) > 10, name


# ---------------------------------------------------------------------------------------------
# An existing VPC (a cached lookup), an existing topic, linear rollouts, no network isolation
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def existing(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth(tmp_path_factory.mktemp("ops-existing"), nag=True, **VARIANTS["existing"])


def test_existing_variant_is_clean(existing: Synth) -> None:
    nag_clean(existing)
    lint(existing)
    assert untagged(existing.data, {"Project": "triton-mme", "Environment": "dev", "Owner": "unassigned"}) == []


def test_existing_vpc_is_used_not_changed(existing: Synth) -> None:
    for type_ in ("AWS::EC2::VPC", "AWS::EC2::Subnet", "AWS::EC2::VPCEndpoint", "AWS::EC2::FlowLog"):
        assert existing.resources(type_) == {}, type_
    groups = existing.resources(SG)
    assert len(groups) == 2 and {g["Properties"]["VpcId"] for g in groups.values()} == {VPC_ID}
    for group_id in groups:
        no_ingress(existing, group_id)
        https_egress_only(existing, group_id)
    model = existing.only("AWS::SageMaker::Model")[1]["Properties"]
    # The model goes to the isolated subnets; the build to the private ones (it may need a NAT).
    assert model["VpcConfig"]["Subnets"] == ["subnet-03000000000000000", "subnet-03000000000000001"]
    assert model["EnableNetworkIsolation"] is False
    for function in existing.resources("AWS::Lambda::Function").values():
        if function["Properties"].get("PackageType") == "Image":
            assert function["Properties"]["VpcConfig"]["SubnetIds"] == [
                "subnet-02000000000000000", "subnet-02000000000000001"]
    assert existing.data["Outputs"]["VpcId"]["Value"] == VPC_ID


def test_pending_lookup_synthesizes_then_the_real_pass_is_fully_validated(
    existing: Synth, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Before the CLI has looked the VPC up, CDK hands out a placeholder VPC (vpc-12345): that
    first pass must synthesize (the CLI then performs the lookup and synthesizes again), so the
    id-format checks of CDK's CloudFormation validation are acknowledged for that pass only."""
    first = synth(tmp_path_factory.mktemp("ops-pending"), nag=True, account=ACCOUNT, region=REGION,
                  vpc_id=VPC_ID, build_in_vpc="true")
    assert network_of(first).pending_lookup is True
    missing = json.loads((first.outdir / "manifest.json").read_text())["missing"]
    assert [m["provider"] for m in missing] == ["vpc-provider"]
    assert missing[0]["props"]["filter"] == {"vpc-id": VPC_ID}

    def placeholder_acks(s: Synth) -> list[str]:
        return [rule for entry in s.stack.node.metadata
                if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY
                for rule in dict(entry.data) if rule.endswith(PLACEHOLDER_ID_RULES)]

    assert sorted(placeholder_acks(first)) == sorted(PLACEHOLDER_ID_RULES)
    assert network_of(existing).pending_lookup is False
    assert placeholder_acks(existing) == []


def test_existing_topic_is_notified(existing: Synth) -> None:
    assert existing.resources("AWS::SNS::Topic") == {}
    assert alarm_actions(existing) == [([TOPIC_ARN], [TOPIC_ARN])] * 7
    assert "AlarmTopicArn" not in existing.data["Outputs"]


def test_linear_deployment_config_and_chosen_rollback_alarms(existing: Synth) -> None:
    config = existing.only("AWS::SageMaker::Endpoint")[1]["Properties"]["DeploymentConfig"]
    assert config["BlueGreenUpdatePolicy"] == {
        "TrafficRoutingConfiguration": {
            "Type": "LINEAR", "WaitIntervalInSeconds": 600,
            "LinearStepSize": {"Type": "INSTANCE_COUNT", "Value": 2},
        },
        "TerminationWaitInSeconds": 300,
        "MaximumExecutionTimeoutInSeconds": 7200,
    }
    names = {k: r["Properties"]["AlarmName"] for k, r in existing.resources("AWS::CloudWatch::Alarm").items()}
    chosen = [names[a["AlarmName"]["Ref"]] for a in config["AutoRollbackConfiguration"]["Alarms"]]
    assert chosen == ["triton-mme-invocation-5xx-errors", "triton-mme-model-loading-wait-p90"]
    latency = next(r for r in existing.resources("AWS::CloudWatch::Alarm").values()
                   if r["Properties"]["AlarmName"] == "triton-mme-model-latency-p99")
    assert latency["Properties"]["Threshold"] == 250_000
    saturation = next(r for r in existing.resources("AWS::CloudWatch::Alarm").values()
                      if r["Properties"]["AlarmName"] == "triton-mme-gpu-saturation")
    assert ">= 7.5, 1, 0)" in saturation["Properties"]["Metrics"][0]["Expression"]
    role = ref_id(existing, existing.stack.execution_role.role)
    describe = [s for s in policy_of_role(existing.data, role) if "cloudwatch:DescribeAlarms" in as_list(s["Action"])]
    assert len(describe) == 1 and len(describe[0]["Resource"]) == 2


# ---------------------------------------------------------------------------------------------
# Construct validation (no synth)
# ---------------------------------------------------------------------------------------------


def _stack(**env: str) -> cdk.Stack:
    return cdk.Stack(cdk.App(), "Ops", env=cdk.Environment(**env) if env else None)


def _endpoint(stack: cdk.Stack, **overrides: Any) -> SageMakerHosting:
    props: dict[str, Any] = dict(
        image=TritonImage(stack, "Image"),
        execution_role=iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com")),
        model_data_url="s3://bucket/models/r-0123456789abcdef/",
        endpoint_name="triton",
        instance_type="ml.g5.xlarge",
    )
    props.update(overrides)
    return SageMakerHosting(stack, "Endpoint", props=SageMakerHostingProps(**props))


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"traffic": "BLUE"}, "traffic: got \"BLUE\"; input should be 'ALL_AT_ONCE', 'CANARY' or 'LINEAR'"),
        ({"traffic": "CANARY"}, "size: missing with traffic CANARY; give the canary size (with size_type"),
        ({"traffic": "ALL_AT_ONCE", "size_type": "INSTANCE_COUNT", "size": 1},
         "size: got 1 with traffic ALL_AT_ONCE; a size is for CANARY or LINEAR only"),
        ({"traffic": "CANARY", "size_type": "INSTANCE_COUNT", "size": 1},
         "size: got 1 instances with traffic CANARY and fleet.minimum 1; a canary step may be at most 50%"),
        ({"traffic": "CANARY", "size_type": "CAPACITY_PERCENT", "size": 60},
         "size: got 60 percent with traffic CANARY; expected 1 to 50 percent"),
        ({"traffic": "LINEAR", "size_type": "CAPACITY_PERCENT", "size": 5},
         "size: got 5 percent with traffic LINEAR; expected 10 to 50 percent"),
        ({"traffic": "LINEAR", "size_type": "INSTANCE_COUNT", "size": 1,
          "fleet": {"minimum": 2, "initial": 2, "maximum": 20}},
         "size: got 1 instances with traffic LINEAR and fleet.maximum 20; a linear step must be at least 10% of "
         "the variant's instances, so at least 2 here"),
        ({"traffic": "CANARY", "size_type": "INSTANCES", "size": 1}, "size_type: got \"INSTANCES\""),
        ({"traffic": "CANARY", "size": 0}, "size: got 0; expected at least 1"),
        ({"maximum_execution_timeout": Duration.seconds(900)},
         "maximum_execution_timeout: got 900 with 1 wait(s) of wait_interval 600 and termination_wait 300; "
         "expected more than the 900 s of waiting"),
        ({"wait_interval": Duration.seconds(3601)}, "wait_interval: got 3601 s; expected 0 to 3600 s"),
        ({"termination_wait": Duration.hours(2)}, "termination_wait: got 7200 s; expected 0 to 3600 s"),
        ({"maximum_execution_timeout": Duration.seconds(300)},
         "maximum_execution_timeout: got 300 s; expected 600 to 28800 s"),
    ],
)
def test_deployment_props(kwargs: dict[str, Any], expected: str) -> None:
    endpoint = _endpoint(_stack())
    with pytest.raises(PropsError) as caught:
        RolloutPolicyProps(endpoint=endpoint, **kwargs)
    assert expected in str(caught.value)


def test_rollout_policy_defaults_to_the_endpoints_fleet_and_accepts_tokens() -> None:
    stack = _stack()
    endpoint = _endpoint(stack)
    props = RolloutPolicyProps(endpoint=endpoint, traffic="CANARY", size=cdk.Token.as_number({"Ref": "Canary"}),  # type: ignore[arg-type]  # on purpose: a token
                               wait_interval=Duration.seconds(cdk.Token.as_number({"Ref": "Wait"})))
    assert props.fleet is None and props.variant_fleet == endpoint.fleet
    RolloutPolicy(props=props)
    config = Template.from_stack(stack).to_json()
    (endpoint_props,) = [r["Properties"] for r in config["Resources"].values() if r["Type"] == "AWS::SageMaker::Endpoint"]
    routing = endpoint_props["DeploymentConfig"]["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"]
    assert routing == {"Type": "CANARY", "WaitIntervalInSeconds": {"Ref": "Wait"},
                       "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": {"Ref": "Canary"}}}


def test_an_instance_count_step_is_checked_against_the_endpoints_fleet_unless_one_is_given() -> None:
    """``fleet`` is optional for type checkers too (mypy checks this file: no ignore above), and
    unset it is the endpoint's: a canary of 1 instance cannot fit its minimum of 1."""
    endpoint = _endpoint(_stack())
    assert endpoint.fleet.minimum == 1
    step: dict[str, Any] = {"traffic": "CANARY", "size_type": "INSTANCE_COUNT", "size": 1}
    with pytest.raises(PropsError, match=r"size: got 1 instances with traffic CANARY and fleet.minimum 1; .* at most 0"):
        RolloutPolicyProps(endpoint=endpoint, **step)
    props = RolloutPolicyProps(endpoint=endpoint, fleet=FleetSize(minimum=2, initial=2, maximum=4), **step)
    assert props.variant_fleet.minimum == 2


def test_rollback_alarms_are_1_to_10_metric_alarms() -> None:
    stack = _stack()
    endpoint = _endpoint(stack)
    metric = endpoint.metric_invocation_5xx_errors()
    many = [cloudwatch.Alarm(stack, f"A{i}", metric=metric, threshold=1, evaluation_periods=1) for i in range(11)]
    with pytest.raises(PropsError, match="rollback_alarms: got 11 alarms; expected 1 to 10 alarms"):
        RolloutPolicyProps(endpoint=endpoint, rollback_alarms=many)
    composite = cloudwatch.CompositeAlarm(stack, "Composite", alarm_rule=cloudwatch.AlarmRule.any_of(many[0]))
    with pytest.raises(PropsError, match="is a composite alarm"):
        RolloutPolicyProps(endpoint=endpoint, rollback_alarms=[many[0], composite])
    RolloutPolicy(props=RolloutPolicyProps(endpoint=endpoint, rollback_alarms=many[:10]))
    config = Template.from_stack(stack).find_resources("AWS::SageMaker::Endpoint")
    (props,) = [r["Properties"] for r in config.values()]
    assert len(props["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]) == 10


def test_no_rollback_alarms_no_rollback_config_and_no_describe_grant() -> None:
    stack = _stack()
    endpoint = _endpoint(stack)
    RolloutPolicy(props=RolloutPolicyProps(endpoint=endpoint, rollback_alarms=[]))
    template = Template.from_stack(stack).to_json()
    (props,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::SageMaker::Endpoint"]
    assert "AutoRollbackConfiguration" not in props["DeploymentConfig"]
    assert "cloudwatch:DescribeAlarms" not in json.dumps(template)


def test_endpoint_network_props() -> None:
    stack = _stack()
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=0)
    subnets = vpc.isolated_subnets or vpc.public_subnets
    group = ec2.SecurityGroup(stack, "Sg", vpc=vpc)
    with pytest.raises(PropsError, match="subnets, security_groups: give both"):
        _endpoint(stack, subnets=list(subnets))
    with pytest.raises(PropsError, match="subnets: got 1; expected 2 to 16"):
        _endpoint(_stack(), subnets=list(subnets)[:1], security_groups=[group])


def test_network_refuses_unknown_endpoints_and_public_only_vpcs() -> None:
    with pytest.raises(PropsError, match=r"interface_endpoints\.0: got \"ecr\"; input should be 'ecr\.api'"):
        EndpointNetworkProps(interface_endpoints=["ecr"])  # type: ignore[list-item]  # an unknown endpoint, on purpose
    with pytest.raises(PropsError, match=r"interface_endpoints: got \['logs', 'logs'\]; logs given twice"):
        EndpointNetworkProps(interface_endpoints=["logs", "logs"])
    with pytest.raises(PropsError, match=r"cidr: got '10\.0\.0\.0/8'; expected a private IPv4 range from /16 to /24"):
        EndpointNetworkProps(cidr="10.0.0.0/8")
    stack = _stack(account=ACCOUNT, region=REGION)
    stack.node.set_context(*next(iter(vpc_lookup_context(ACCOUNT, REGION, VPC_ID, isolated=False,
                                                         private=False).items())))
    public_only = ec2.Vpc.from_lookup(stack, "Public", vpc_id=VPC_ID)
    with pytest.raises(PropsError, match="has no isolated or private subnets in two Availability Zones"):
        EndpointNetwork(stack, "Net", props=EndpointNetworkProps(vpc=public_only))


def test_network_in_a_vpc_without_isolated_subnets_uses_the_private_ones() -> None:
    stack = _stack(account=ACCOUNT, region=REGION)
    stack.node.set_context(*next(iter(vpc_lookup_context(ACCOUNT, REGION, VPC_ID, isolated=False).items())))
    network = EndpointNetwork(stack, "Net", props=EndpointNetworkProps(
        vpc=ec2.Vpc.from_lookup(stack, "Vpc", vpc_id=VPC_ID), build_access=True))
    assert [s.subnet_id for s in network.model_subnets] == ["subnet-02000000000000000", "subnet-02000000000000001"]
    assert network.build_has_internet is True and network.interface_endpoints == {}


def test_alarm_topic_dashboard_and_threshold_props() -> None:
    with pytest.raises(PropsError, match=r"emails: got 'ops'; expected e-mail addresses such as ops@example\.com"):
        AlarmTopicProps(emails=["ops"])
    with pytest.raises(PropsError, match=r"emails: got \['a@example\.com', 'a@example\.com'\]; an address is given twice"):
        AlarmTopicProps(emails=["a@example.com", "a@example.com"])
    stack = _stack()
    endpoint = _endpoint(stack)
    with pytest.raises(PropsError, match="dashboard_name: got 'my dashboard'; expected 1 to 255 letters"):
        EndpointDashboardProps(endpoint=endpoint, dashboard_name="my dashboard")
    with pytest.raises(PropsError, match="gpu_memory_percent: got 120; input should be less than or equal to 100"):
        AlarmThresholds(gpu_memory_percent=120)
    with pytest.raises(PropsError, match="model_latency_p99_ms: got 0; input should be greater than 0"):
        AlarmThresholds(model_latency_p99_ms=0)
    with pytest.raises(PropsError, match=r"rollback_alarms\.0: got \"latency\"; input should be 'invocation_5xx_errors'"):
        EndpointAlarmsProps(endpoint=endpoint, rollback_alarms=["latency"])  # type: ignore[list-item]  # an unknown alarm, on purpose
    with pytest.raises(PropsError, match="name_prefix: got 'my alarms'; expected letters, digits"):
        EndpointAlarmsProps(endpoint=endpoint, name_prefix="my alarms")
    alarms = EndpointAlarms(stack, "A3", props=EndpointAlarmsProps(endpoint=endpoint, rollback_alarms=["disk"]))
    assert alarms.rollback_alarms == [alarms.alarms["disk"]]


def test_build_resource_vpc_props(tmp_path: Path) -> None:
    manifest_path = write_manifest(tmp_path / "m.yaml", 1)
    stack = _stack()
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=0)
    with pytest.raises(PropsError, match="vpc, vpc_subnets, security_groups: give all three"):
        ModelBuildResourceProps(
            manifest=load_manifest(manifest_path), manifest_path=manifest_path,
            model_bucket=ModelBucket(stack, "Bucket").bucket, model_prefix="models",
            build_context=PACKAGE_DIR, vpc=vpc,
        )


def test_internet_sources_are_refused_in_an_isolated_vpc(tmp_path: Path) -> None:
    manifest = tmp_path / "hf.yaml"
    manifest.write_text(json.dumps({"version": 1, "models": [{
        "name": "hf", "task": "feature-extraction", "format": "onnx",
        "source": {"kind": "huggingface", "model_id": "sentence-transformers/all-MiniLM-L6-v2",
                   "revision": "a" * 40}}]}))
    result = run_app(tmp_path / "out", {"manifest_path": str(manifest), "create_vpc": "true",
                                        "build_in_vpc": "true"})
    assert result.returncode == 1, result.stderr
    assert "error: mme:build_in_vpc: got true, but the build subnets have no route to the internet" in result.stderr
    assert "downloads hf from the Hugging Face hub" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_rollout_setting_fails_the_app(tmp_path: Path) -> None:
    result = run_app(tmp_path / "out", {"rollout_traffic": "CANARY", "rollout_size_type": "INSTANCE_COUNT",
                                        "rollout_size": "1"})
    assert result.returncode == 1
    assert result.stderr.startswith("error: mme:rollout_size: got 1 instances with mme:rollout_traffic CANARY")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("variant", ["isolated", "existing"])
def test_the_deployed_record_is_the_templates_own_in_a_vpc(variant: str, request: pytest.FixtureRequest) -> None:
    """With a created or an existing VPC the Model names subnets and security groups: the record
    holds them (their replacement replaces the Model) and equals the template's resources."""
    from triton_mme_cdk.model_build.release.deployed import check_embedded, parse_record

    s: Synth = request.getfixturevalue(variant)
    check_embedded(s.data)
    (build,) = [r for r in s.data["Resources"].values() if r["Type"] == "Custom::TritonModelRelease"]
    types = {r["Type"] for r in parse_record(build["Properties"]["Deployed"], where=variant)["resources"].values()}
    assert "AWS::EC2::SecurityGroup" in types, sorted(types)
