"""Issue 49's smaller findings, on the synthesized templates: the stack key used by the stack's
roles only through S3, and the waiter's log writes on its own log group."""

from __future__ import annotations

from typing import Any

import pytest
from cdk_helpers import Synth, as_list, policy_of_role, synth

from triton_mme_cdk.constructs.model_bucket import DENY_OUTSIDE_S3_SID, KEY_DATA_ACTIONS
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
