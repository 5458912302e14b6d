"""Issue 49's smaller findings, on the synthesized templates: the stack key used by the stack's
roles only through S3, the waiter's log writes on its own log group, and the created VPC's S3
gateway endpoint reaching only the stack's buckets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cdk_helpers import VARIANTS, Synth, as_list, flatten_join, policy_of_role, statements, synth

from triton_mme_cdk.constructs.endpoint_network import NO_TRAFFIC_RULE
from triton_mme_cdk.constructs.model_bucket import DENY_OUTSIDE_S3_SID, KEY_DATA_ACTIONS
from triton_mme_cdk.constructs.multi_model_endpoint import MODEL_BUCKET_ENDPOINT_ACTIONS
from triton_mme_cdk.constructs.provider_framework import LOG_ACTIONS_WITH_ARN

S3_VIA = {"Fn::Join": ["", ["s3.", {"Ref": "AWS::Region"}, ".", {"Ref": "AWS::URLSuffix"}]]}


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth(tmp_path_factory.mktemp("default"), nag=True)


def _key(s: Synth) -> tuple[str, dict[str, Any]]:
    keys = {k: v for k, v in s.resources("AWS::KMS::Key").items() if k.startswith("ModelBucketKey")}
    assert len(keys) == 1, keys
    return next(iter(keys.items()))


def _role(s: Synth, prefix: str) -> str:
    (found,) = [k for k in s.resources("AWS::IAM::Role") if k.startswith(prefix)]
    return found


def _key_statements(s: Synth, role: str) -> list[dict[str, Any]]:
    key_id, _ = _key(s)
    return [st for st in policy_of_role(s.data, role)
            if {"Fn::GetAtt": [key_id, "Arn"]} in as_list(st["Resource"])]


def test_bucket_grants_use_the_key_only_through_s3(default: Synth) -> None:
    """Every data action the bucket's grants give on the stack key holds only through S3; the
    execution role's and the Processing role's volume grant is apart, for AWS resources only."""
    for prefix in ("ExecutionRole", "ModelBuildRole", "ModelBuildProcessingRole"):
        role = _role(default, prefix)
        statements = _key_statements(default, role)
        data = [st for st in statements if set(as_list(st["Action"])) & {"kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"}]
        assert data, f"{role}: no data action on the key"
        for st in data:
            assert st["Condition"] == {"StringEquals": {"kms:ViaService": S3_VIA}}, (role, st)
        for st in statements:
            if st not in data:
                assert as_list(st["Action"]) == ["kms:CreateGrant"], (role, st)
                assert st["Condition"] == {"Bool": {"kms:GrantIsForAWSResource": "true"}}


def test_key_policy_denies_the_build_role_the_key_outside_s3(default: Synth) -> None:
    _, key = _key(default)
    (deny,) = [st for st in key["Properties"]["KeyPolicy"]["Statement"] if st.get("Sid") == DENY_OUTSIDE_S3_SID]
    assert deny["Effect"] == "Deny" and deny["Principal"] == {"AWS": "*"} and deny["Resource"] == "*"
    assert sorted(deny["Action"]) == sorted(KEY_DATA_ACTIONS)
    assert deny["Condition"]["StringNotEquals"] == {"kms:ViaService": S3_VIA}
    named = deny["Condition"]["ArnEquals"]["aws:PrincipalArn"]
    # The build's role(s); not the roles whose instance volumes SageMaker encrypts through a grant.
    assert {"Fn::GetAtt": [_role(default, "ModelBuildRole"), "Arn"]} in named
    for apart in ("ExecutionRole", "ModelBuildProcessingRole"):
        assert {"Fn::GetAtt": [_role(default, apart), "Arn"]} not in named
    # The account statement that delegates to IAM and CloudWatch Logs' statement are unchanged.
    sids = [st.get("Sid") for st in key["Properties"]["KeyPolicy"]["Statement"]]
    assert len(sids) == 3, sids


def test_waiter_writes_logs_only_to_its_log_group(default: Synth) -> None:
    role = _role(default, "ModelBuildProviderwaiterstatemachineRole")
    statements = policy_of_role(default.data, role)
    on_star = [a for st in statements if st["Resource"] == "*" for a in as_list(st["Action"])]
    assert on_star and not set(on_star) & set(LOG_ACTIONS_WITH_ARN), on_star
    # What stays on '*' is the vended-log delivery API, which has no resource-level permissions.
    assert all(a.startswith("logs:") and a not in LOG_ACTIONS_WITH_ARN for a in on_star), on_star
    (writes,) = [st for st in statements if set(as_list(st["Action"])) & set(LOG_ACTIONS_WITH_ARN)]
    assert sorted(as_list(writes["Action"])) == sorted(LOG_ACTIONS_WITH_ARN)
    machine = next(v for k, v in default.resources("AWS::StepFunctions::StateMachine").items()
                   if k.startswith("ModelBuildProviderwaiterstatemachine"))
    destination = machine["Properties"]["LoggingConfiguration"]["Destinations"][0]
    # The log group's ARN attribute ends in ':*': the group and its streams.
    assert writes["Resource"] == destination["CloudWatchLogsLogGroup"]["LogGroupArn"]
    # Still able to invoke the framework's functions.
    assert any(as_list(st["Action"]) == ["lambda:InvokeFunction"] for st in statements)


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth(tmp_path_factory.mktemp("isolated"), nag=True, **VARIANTS["isolated"])


def _gateway_policy(s: Synth) -> list[dict[str, Any]]:
    (gateway,) = [v for v in s.resources("AWS::EC2::VPCEndpoint").values()
                  if v["Properties"].get("VpcEndpointType") == "Gateway"]
    return gateway["Properties"]["PolicyDocument"]["Statement"]


def test_s3_gateway_reaches_only_the_stacks_buckets(isolated: Synth) -> None:
    statements = _gateway_policy(isolated)
    bucket_id = _model_bucket(isolated)
    reached = set()
    for st in statements:
        assert st["Effect"] == "Allow" and st["Principal"] == {"AWS": "*"}, st
        assert "Condition" not in st, st
        for resource in as_list(st["Resource"]):
            reached.add(flatten_join(resource) if "Fn::Join" in resource else json.dumps(resource))
    assert reached == {
        "arn:<ref>:s3:::prod-<ref>-starport-layer-bucket/*",  # ECR's image layers
        json.dumps({"Fn::GetAtt": [bucket_id, "Arn"]}), "<ref>/*",  # the model bucket and its objects
        "arn:<ref>:s3:::<ref>/*",  # the CDK asset bucket (the build's manifest)
    }, reached
    # No "*" resource, no s3:* action: a bucket not named is not reachable through the endpoint.
    assert all(a != "s3:*" and a.startswith("s3:") for st in statements for a in as_list(st["Action"]))


def _model_bucket(s: Synth) -> str:
    (found,) = [k for k in s.resources("AWS::S3::Bucket") if k.startswith("ModelBucket") and "AccessLogs" not in k]
    return found


def test_s3_gateway_allows_every_action_the_roles_have_on_the_model_bucket(isolated: Synth) -> None:
    """Drift between the bucket's grants and the endpoint policy would fail a build or a model
    download in a created VPC."""
    bucket_id = _model_bucket(isolated)
    arn = {"Fn::GetAtt": [bucket_id, "Arn"]}
    granted = {a for _, st in statements(isolated.data) if st["Effect"] == "Allow"
               for a in as_list(st["Action"]) if a.startswith("s3:")
               and any(r == arn or (isinstance(r, dict) and arn in r.get("Fn::Join", [None, []])[1])
                       for r in as_list(st["Resource"]))}
    assert granted, "no grant on the model bucket found"
    assert granted <= set(MODEL_BUCKET_ENDPOINT_ACTIONS), granted - set(MODEL_BUCKET_ENDPOINT_ACTIONS)
    (model,) = [st for st in _gateway_policy(isolated) if arn in as_list(st["Resource"])]
    assert sorted(as_list(model["Action"])) == sorted(MODEL_BUCKET_ENDPOINT_ACTIONS)


def test_s3_sources_are_reachable_through_the_gateway(tmp_path: Path) -> None:
    manifest = tmp_path / "models.yaml"
    manifest.write_text(yaml.safe_dump({"version": 1, "models": [{
        "name": "from-s3", "source": {"kind": "s3", "uri": "s3://team-models/minilm/"},
        "task": "feature-extraction"}]}), encoding="utf-8")
    s = synth(tmp_path / "out", nag=False, manifest_path=manifest, create_vpc="true", build_in_vpc="true")
    resources = {flatten_join(r) for st in _gateway_policy(s) for r in as_list(st["Resource"]) if "Fn::Join" in r}
    assert {"arn:<ref>:s3:::team-models", "arn:<ref>:s3:::team-models/*"} <= resources, resources


def test_created_vpc_groups_reach_only_s3_and_the_interface_endpoints(isolated: Synth) -> None:
    groups = isolated.resources("AWS::EC2::SecurityGroup")
    lookup = next(k for k, v in isolated.data["Resources"].items()
                  if v["Type"] == "Custom::AWS" and k.startswith("NetworkS3PrefixList"))
    call = json.loads(flatten_join(isolated.data["Resources"][lookup]["Properties"]["Update"]))
    assert call["action"] == "describePrefixLists" and call["service"] == "EC2"
    assert call["parameters"]["Filters"][0]["Name"] == "prefix-list-name"
    endpoint_group = next(k for k in groups if k.startswith("NetworkEndpointSecurityGroup"))
    egress = isolated.resources("AWS::EC2::SecurityGroupEgress")
    for prefix in ("NetworkModelSecurityGroup", "NetworkBuildSecurityGroup"):
        group = next(k for k in groups if k.startswith(prefix))
        # Egress given inline (a rule that matches nothing), so EC2's default allow-all is not created.
        assert groups[group]["Properties"]["SecurityGroupEgress"] == [NO_TRAFFIC_RULE]
        rules = [r["Properties"] for r in egress.values() if r["Properties"]["GroupId"] == {"Fn::GetAtt": [group, "GroupId"]}]
        destinations = sorted(json.dumps({k: v for k, v in r.items() if k.startswith("Destination")}) for r in rules)
        assert destinations == sorted([
            json.dumps({"DestinationPrefixListId": {"Fn::GetAtt": [lookup, "PrefixLists.0.PrefixListId"]}}),
            json.dumps({"DestinationSecurityGroupId": {"Fn::GetAtt": [endpoint_group, "GroupId"]}}),
        ]), (group, rules)
        assert all((r["IpProtocol"], r["FromPort"], r["ToPort"]) == ("tcp", 443, 443) for r in rules)
        assert not any("CidrIp" in r and r.get("CidrIp") != "255.255.255.255/32" for r in rules)


def test_an_existing_vpc_keeps_https_out(tmp_path: Path) -> None:
    """A VPC brought in routes S3 itself (its own endpoint or a NAT): the groups keep HTTPS to anywhere."""
    s = synth(tmp_path, nag=False, **VARIANTS["existing"])
    assert not [k for k, v in s.data["Resources"].items() if v["Type"] == "Custom::AWS"]
    for key, group in s.resources("AWS::EC2::SecurityGroup").items():
        rules = group["Properties"].get("SecurityGroupEgress", [])
        assert [(r.get("CidrIp"), r["FromPort"]) for r in rules] == [("0.0.0.0/0", 443)], (key, rules)


@pytest.mark.parametrize(("prefix", "service", "source_arn"), [
    # SageMaker's guide, "Cross-service confused deputy prevention": inference and Processing jobs.
    ("ExecutionRole", "sagemaker.amazonaws.com", "arn:<ref>:sagemaker:<ref>:<ref>:*"),
    ("ModelBuildProcessingRole", "sagemaker.amazonaws.com", "arn:<ref>:sagemaker:<ref>:<ref>:processing-job/*"),
    # Step Functions' guide, "Create an IAM role for your state machine".
    ("ModelBuildProviderwaiterstatemachineRole", "states.amazonaws.com", "arn:<ref>:states:<ref>:<ref>:stateMachine:*"),
])
def test_service_roles_trust_only_this_accounts_resources(default: Synth, prefix: str, service: str,
                                                          source_arn: str) -> None:
    role = default.resources("AWS::IAM::Role")[_role(default, prefix)]
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": service} and statement["Action"] == "sts:AssumeRole"
    assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    assert set(statement["Condition"]) == {"StringEquals", "ArnLike"}
    assert flatten_join(statement["Condition"]["ArnLike"]["aws:SourceArn"]) == source_arn
