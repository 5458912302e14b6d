"""Operations of the default stack: alarms, dashboard, safe rollouts, network isolation, tags."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cdk_helpers import Synth, flatten_join, synth, taggable_types, untagged

from triton_mme_cdk.constructs.endpoint_alarms import ALARM_KEYS, DEFAULT_ROLLBACK_ALARMS

ALARM = "AWS::CloudWatch::Alarm"
DIMENSIONS = [{"Name": "EndpointName", "Value": "triton-mme"}, {"Name": "VariantName", "Value": "AllTraffic"}]
COST_TAGS = {"Project": "triton-mme", "Environment": "dev", "Owner": "unassigned"}


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth(tmp_path_factory.mktemp("ops-default"), nag=True)


def alarms_by_name(s: Synth) -> dict[str, dict[str, Any]]:
    return {r["Properties"]["AlarmName"]: r["Properties"] for r in s.resources(ALARM).values()}


def logical_of_alarm(s: Synth, name: str) -> str:
    return next(k for k, r in s.resources(ALARM).items() if r["Properties"]["AlarmName"] == name)


# ---------------------------------------------------------------------------------------------
# Alarms
# ---------------------------------------------------------------------------------------------

#: name -> (namespace, metric, statistic or extended statistic, period, threshold, operator,
#: evaluation periods, datapoints to alarm, treat missing data)
EXPECTED_ALARMS = {
    "triton-mme-invocation-5xx-errors": (
        "AWS/SageMaker", "Invocation5XXErrors", "Sum", 60, 0, "GreaterThanThreshold", 5, 3, "notBreaching"),
    "triton-mme-invocation-4xx-rate": (
        "AWS/SageMaker", "Invocation4XXErrors", "Average", 60, 0.05, "GreaterThanThreshold", 5, 5, "notBreaching"),
    "triton-mme-model-latency-p99": (
        "AWS/SageMaker", "ModelLatency", "p99", 60, 1_000_000, "GreaterThanThreshold", 5, 5, "notBreaching"),
    "triton-mme-model-loading-wait-p90": (
        "AWS/SageMaker", "ModelLoadingWaitTime", "p90", 300, 10_000_000, "GreaterThanThreshold", 3, 3,
        "notBreaching"),
    "triton-mme-gpu-memory": (
        "/aws/sagemaker/Endpoints", "GPUMemoryUtilization", "Maximum", 300, 90, "GreaterThanThreshold", 3, 3,
        "missing"),
    "triton-mme-disk": (
        "/aws/sagemaker/Endpoints", "DiskUtilization", "Maximum", 300, 85, "GreaterThanThreshold", 3, 3, "missing"),
}


def test_one_alarm_per_key(default: Synth) -> None:
    names = set(alarms_by_name(default))
    assert names == {f"triton-mme-{key.replace('_', '-')}" for key in ALARM_KEYS}
    assert len(default.resources("AWS::CloudWatch::CompositeAlarm")) == 0


@pytest.mark.parametrize("name", sorted(EXPECTED_ALARMS))
def test_metric_alarm(default: Synth, name: str) -> None:
    namespace, metric, stat, period, threshold, operator, periods, datapoints, missing = EXPECTED_ALARMS[name]
    props = alarms_by_name(default)[name]
    assert props["Namespace"] == namespace
    assert props["MetricName"] == metric
    assert props["Dimensions"] == DIMENSIONS
    if stat.startswith("p"):
        assert props["ExtendedStatistic"] == stat and "Statistic" not in props
    else:
        assert props["Statistic"] == stat and "ExtendedStatistic" not in props
    assert props["Period"] == period
    assert props["Threshold"] == threshold
    assert props["ComparisonOperator"] == operator
    assert (props["EvaluationPeriods"], props["DatapointsToAlarm"]) == (periods, datapoints)
    assert props["TreatMissingData"] == missing
    assert len(props["AlarmDescription"]) > 40
    # The created alarm topic by default, on ALARM and OK (issue 59: alarms with an action).
    (topic,) = default.resources("AWS::SNS::Topic")
    assert props["AlarmActions"] == props["OKActions"] == [{"Ref": topic}]


def test_gpu_saturation_is_one_math_alarm_on_gpu_and_instance_count(default: Synth) -> None:
    props = alarms_by_name(default)["triton-mme-gpu-saturation"]
    assert (props["Threshold"], props["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")
    assert (props["EvaluationPeriods"], props["DatapointsToAlarm"]) == (15, 15)
    assert props["TreatMissingData"] == "notBreaching"
    metrics = {m["Id"]: m for m in props["Metrics"]}
    (expression,) = [m for m in props["Metrics"] if "Expression" in m]
    assert expression["ReturnData"] is True
    # GPU pinned AND the active instance count (Invocations / InvocationsPerInstance) at the
    # autoscaling maximum (4 by default).
    assert expression["Expression"] == "IF(gpu >= 90 AND (invocations / perinstance) >= 3.5, 1, 0)"
    expected = {
        "gpu": ("/aws/sagemaker/Endpoints", "GPUUtilization", "Average"),
        "invocations": ("AWS/SageMaker", "Invocations", "Sum"),
        "perinstance": ("AWS/SageMaker", "InvocationsPerInstance", "Sum"),
    }
    for metric_id, (namespace, name, stat) in expected.items():
        stat_props = metrics[metric_id]["MetricStat"]
        assert stat_props["Metric"] == {"Dimensions": DIMENSIONS, "MetricName": name, "Namespace": namespace}
        assert (stat_props["Stat"], stat_props["Period"]) == (stat, 60)
        assert metrics[metric_id]["ReturnData"] is False


def test_alarms_do_not_depend_on_the_endpoint(default: Synth) -> None:
    """The endpoint's DeploymentConfig references the alarms; the alarms must not reference it."""
    endpoint = default.only("AWS::SageMaker::Endpoint")[0]
    for logical_id, alarm in default.resources(ALARM).items():
        assert endpoint not in json.dumps(alarm), logical_id


# ---------------------------------------------------------------------------------------------
# Dashboard
# ---------------------------------------------------------------------------------------------


def dashboard_body(s: Synth) -> dict[str, Any]:
    props = s.only("AWS::CloudWatch::Dashboard")[1]["Properties"]
    return json.loads(flatten_join(props["DashboardBody"]))


def test_dashboard_has_a_stable_regional_name(default: Synth) -> None:
    props = default.only("AWS::CloudWatch::Dashboard")[1]["Properties"]
    assert props["DashboardName"] == {"Fn::Join": ["", ["triton-mme-", {"Ref": "AWS::Region"}]]}


def test_dashboard_shows_every_metric(default: Synth) -> None:
    body = dashboard_body(default)
    found: set[tuple[str, str]] = set()
    stats: dict[str, set[str]] = {}
    expressions = []
    for widget in body["widgets"]:
        for row in widget.get("properties", {}).get("metrics", []):
            if isinstance(row[0], dict):
                expressions.append(row[0].get("expression"))
                continue
            namespace, name = row[0], row[1]
            assert row[2:6] == ["EndpointName", "triton-mme", "VariantName", "AllTraffic"], row
            found.add((namespace, name))
            options = row[-1] if isinstance(row[-1], dict) else {}
            stats.setdefault(name, set()).add(options.get("stat", "Average"))
    invocation = {"Invocations", "Invocation4XXErrors", "Invocation5XXErrors", "ModelLatency", "OverheadLatency",
                  "InvocationsPerInstance", "ModelCacheHit", "ModelLoadingWaitTime", "ModelDownloadingTime",
                  "ModelUnloadingTime", "ModelLoadingTime"}
    instance = {"LoadedModelCount", "GPUUtilization", "GPUMemoryUtilization", "CPUUtilization",
                "MemoryUtilization", "DiskUtilization"}
    assert {("AWS/SageMaker", n) for n in invocation} <= found
    assert {("/aws/sagemaker/Endpoints", n) for n in instance} <= found
    assert {"p50", "p99"} <= stats["ModelLatency"]
    assert "invocations / perinstance" in expressions  # the instance count
    alarm_widgets = [w for w in body["widgets"] if "alarms" in w.get("properties", {})]
    assert len(alarm_widgets) == 1 and len(alarm_widgets[0]["properties"]["alarms"]) == len(ALARM_KEYS)


# ---------------------------------------------------------------------------------------------
# Safe rollouts
# ---------------------------------------------------------------------------------------------


def test_deployment_config_defaults_to_all_at_once_with_rollback(default: Synth) -> None:
    config = default.only("AWS::SageMaker::Endpoint")[1]["Properties"]["DeploymentConfig"]
    assert config["BlueGreenUpdatePolicy"] == {
        "TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 600},
        "TerminationWaitInSeconds": 300,
    }
    expected = [logical_of_alarm(default, f"triton-mme-{k.replace('_', '-')}") for k in DEFAULT_ROLLBACK_ALARMS]
    assert config["AutoRollbackConfiguration"] == {"Alarms": [{"AlarmName": {"Ref": a}} for a in expected]}
    assert "RollingUpdatePolicy" not in config


# ---------------------------------------------------------------------------------------------
# Network and tags
# ---------------------------------------------------------------------------------------------


def test_model_is_network_isolated_without_a_vpc(default: Synth) -> None:
    model = default.only("AWS::SageMaker::Model")[1]["Properties"]
    assert model["EnableNetworkIsolation"] is True
    assert "VpcConfig" not in model
    for type_ in ("AWS::EC2::VPC", "AWS::EC2::SecurityGroup", "AWS::EC2::VPCEndpoint"):
        assert default.resources(type_) == {}, type_


def test_every_taggable_resource_has_the_cost_tags(default: Synth) -> None:
    types = taggable_types(default.data)
    # Not vacuous: the stack's main resources are among the checked types.
    assert {"AWS::SageMaker::Endpoint", "AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig",
            "AWS::S3::Bucket", "AWS::KMS::Key", "AWS::IAM::Role", "AWS::Lambda::Function",
            "AWS::CloudWatch::Alarm", "AWS::CloudWatch::Dashboard", "AWS::Logs::LogGroup"} <= types
    assert untagged(default.data, COST_TAGS) == []


def test_outputs_describe_the_dashboard(default: Synth) -> None:
    outputs = default.data["Outputs"]
    assert outputs["DashboardName"]["Value"] == {"Fn::Join": ["", ["triton-mme-", {"Ref": "AWS::Region"}]]}
    url = flatten_join(outputs["DashboardUrl"]["Value"])
    assert url == "https://<ref>/cloudwatch/home?region=<ref>#dashboards:name=triton-mme-<ref>"
    assert default.data["Mappings"]["ConsoleDomains"] == {
        "aws": {"Domain": "console.aws.amazon.com"}, "aws-cn": {"Domain": "console.amazonaws.cn"}
    }
    # The created alarm topic's ARN, to subscribe to (issue 59); no VPC.
    assert outputs["AlarmTopicArn"]["Value"] == {"Ref": next(iter(default.resources("AWS::SNS::Topic")))}
    assert "VpcId" not in outputs
