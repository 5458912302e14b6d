"""The constructs' props: each refuses a bad value with one message naming the field, the value and
what is allowed; each takes unresolved tokens; and every bound and default is defined once, on the
props, with the settings deriving theirs from it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import Duration, Size, Token
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk.assertions import Template
from cdk_helpers import ROOT, write_manifest

from triton_mme_cdk.constructs.alarm_topic import AlarmTopicProps
from triton_mme_cdk.constructs.endpoint_alarms import AlarmThresholds, EndpointAlarms, EndpointAlarmsProps
from triton_mme_cdk.constructs.endpoint_autoscaling import EndpointAutoscalingProps
from triton_mme_cdk.constructs.endpoint_dashboard import EndpointDashboardProps
from triton_mme_cdk.constructs.endpoint_import import EndpointAttributes
from triton_mme_cdk.constructs.endpoint_network import EndpointNetworkProps
from triton_mme_cdk.constructs.endpoint_settings import (
    PROPS,
    SETTINGS,
    EndpointSettings,
    Setting,
    endpoint_settings,
)
from triton_mme_cdk.constructs.model_bucket import ModelBucket, ModelBucketProps
from triton_mme_cdk.constructs.model_build_resource import ModelBuildResourceProps
from triton_mme_cdk.constructs.model_build_state_machine import ModelBuildStateMachineProps
from triton_mme_cdk.constructs.processing_build import ProcessingBuildProps
from triton_mme_cdk.constructs.props import Between, Props
from triton_mme_cdk.constructs.rollout_policy import RolloutPolicyProps
from triton_mme_cdk.constructs.sagemaker_execution_role import SageMakerExecutionRoleProps
from triton_mme_cdk.constructs.sagemaker_hosting import FleetSize, SageMakerHosting, SageMakerHostingProps
from triton_mme_cdk.constructs.sagemaker_limits import PropsError
from triton_mme_cdk.constructs.triton_image import TritonImage, TritonImageProps
from triton_mme_cdk.model_build.manifest import load_manifest
from triton_mme_cdk.stacks.context_table import ENDPOINT_KEYS, construct_keywords, context_name
from triton_mme_cdk.stacks.settings import MmeSettings


def number() -> float:
    return Token.as_number({"Ref": "Number"})


def text() -> str:
    return Token.as_string({"Ref": "Text"})


class Resources:
    """A stack with one of each resource the props take."""

    def __init__(self, tmp_path: Path | None = None) -> None:
        self.stack = cdk.Stack(cdk.App(), "Props")
        self.image = TritonImage(self.stack, "Image")
        self.role = iam.Role(self.stack, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
        self.endpoint = SageMakerHosting(self.stack, "Endpoint", props=self.endpoint_props())
        self.bucket = ModelBucket(self.stack, "Bucket").bucket
        self.build_image = ecr_assets.DockerImageAsset(self.stack, "BuildImage", directory=str(ROOT / "model_build"))
        self.function = lambda_.Function.from_function_arn(
            self.stack, "Function", "arn:aws:lambda:eu-west-1:123456789012:function:build"
        )
        if tmp_path is not None:
            self.manifest_path = write_manifest(tmp_path / "models.yaml", 1)
            self.manifest = load_manifest(self.manifest_path)

    def endpoint_props(self, **values: Any) -> SageMakerHostingProps:
        return SageMakerHostingProps(
            image=self.image, execution_role=self.role, model_data_url="s3://bucket/models/r-0123456789abcdef/", **values
        )

    def build_props(self, **values: Any) -> ModelBuildResourceProps:
        given = {"manifest": self.manifest, "manifest_path": self.manifest_path, "model_bucket": self.bucket, **values}
        return ModelBuildResourceProps(**given)


@pytest.fixture(scope="module")
def resources(tmp_path_factory: pytest.TempPathFactory) -> Resources:
    return Resources(tmp_path_factory.mktemp("props"))


#: props class -> (how to build it from values, bad values, the message they give)
REFUSED: list[tuple[str, Callable[[Resources], Callable[..., Props]], dict[str, Any], str]] = [
    ("fleet", lambda r: FleetSize, {"maximum": 0}, "maximum: got 0; input should be greater than or equal to 1"),
    ("endpoint", lambda r: r.endpoint_props, {"shm_growth_byte_size": 0},
     "shm_growth_byte_size: got 0; input should be greater than or equal to 1"),
    ("endpoint-variant", lambda r: r.endpoint_props, {"variant_name": "all traffic"},
     "variant_name: got 'all traffic'; expected 1 to 63 letters, digits and single hyphens"),
    ("image", lambda r: TritonImageProps, {"version": "1.0"}, "version: got '1.0'; the sagemaker SDK's"),
    ("role", lambda r: SageMakerExecutionRoleProps, {"endpoint_name": "a_b"}, "endpoint_name: got 'a_b'; expected 1 to 63"),
    ("bucket", lambda r: ModelBucketProps, {"access_log_expiration": Duration.days(36501)},
     "access_log_expiration: got 36501 days; expected 1 to 36500 days"),
    ("processing", lambda r: lambda **v: ProcessingBuildProps(image=r.build_image, **v),
     {"max_runtime": Duration.days(10)}, "max_runtime: got 864000 s; expected 1 to 777600 s"),
    ("autoscaling", lambda r: lambda **v: EndpointAutoscalingProps(endpoint=r.endpoint, **v),
     {"invocations_scale_out_cooldown": Duration.days(2)},
     "invocations_scale_out_cooldown: got 172800 s; expected 0 to 86400 s"),
    ("thresholds", lambda r: AlarmThresholds, {"disk_percent": 0}, "disk_percent: got 0; input should be greater than 0"),
    ("alarms", lambda r: lambda **v: EndpointAlarmsProps(endpoint=r.endpoint, **v), {"rollback_alarms": ["disk", "disk"]},
     "rollback_alarms: got ['disk', 'disk']; disk given twice"),
    ("dashboard", lambda r: lambda **v: EndpointDashboardProps(endpoint=r.endpoint, **v), {"dashboard_name": "a/b"},
     "dashboard_name: got 'a/b'; expected 1 to 255 letters, digits, '-' and '_'"),
    ("network", lambda r: EndpointNetworkProps, {"cidr": "10.0.0.0/25"},
     "cidr: got '10.0.0.0/25'; expected a private IPv4 range from /16 to /24"),
    ("topic", lambda r: AlarmTopicProps, {"emails": ["ops@"]}, "emails: got 'ops@'; expected e-mail addresses"),
    ("topic-extra", lambda r: AlarmTopicProps, {"email": ["ops@example.com"]}, "email: unknown key; remove it or check its spelling"),
    ("build", lambda r: r.build_props, {"ephemeral_storage_size": Size.mebibytes(256)},
     "ephemeral_storage_size: got 256 MiB; expected 512 to 10240 MiB"),
    ("build-interval", lambda r: r.build_props, {"query_interval": Duration.seconds(4)},
     "query_interval: got 4 s; expected 5 to 3600 s"),
    ("build-resource", lambda r: r.build_props, {"model_bucket": "my-bucket"}, "model_bucket: got str; expected IBucket"),
    ("state-machine", lambda r: lambda **v: ModelBuildStateMachineProps(
        build_function=r.function, model_bucket=r.bucket, timeout=Duration.hours(1), **v),
     {"max_concurrency": 10_001}, "max_concurrency: got 10001; input should be less than or equal to 10000"),
    ("rollout", lambda r: lambda **v: RolloutPolicyProps(endpoint=r.endpoint, **v), {"termination_wait": Duration.hours(2)},
     "termination_wait: got 7200 s; expected 0 to 3600 s"),
    ("endpoint-attributes", lambda r: lambda **v: EndpointAttributes(bucket=r.bucket, model_prefix="models", **v),
     {"endpoint_name": "my_endpoint"}, "endpoint_name: got 'my_endpoint'; expected 1 to 63"),
]


@pytest.mark.parametrize(("make", "values", "expected"), [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_props_refuse_a_bad_value_with_one_message(
    resources: Resources, make: Callable[[Resources], Callable[..., Props]], values: dict[str, Any], expected: str
) -> None:
    with pytest.raises(PropsError) as caught:
        make(resources)(**values)
    message = str(caught.value)
    assert message.startswith(expected), message
    assert len(message.splitlines()) == 1, message


def test_every_props_class_has_a_refusal_case(resources: Resources) -> None:
    refused = set()
    for _, make, values, _expected in REFUSED:
        with pytest.raises(PropsError) as caught:
            make(resources)(**values)
        refused.add(type(caught.traceback[-1].frame.f_locals["self"]).__name__)
    assert {props.__name__ for props in Props.__subclasses__()} == refused


def test_props_take_tokens(resources: Resources) -> None:
    """Values known only at deploy time skip the value checks (and the rules between fields)."""
    r = resources
    assert Token.is_unresolved(FleetSize(minimum=number(), initial=number(), maximum=number()).maximum)  # type: ignore[arg-type]  # number tokens are floats
    r.endpoint_props(endpoint_name=text(), instance_type=text(), shm_default_byte_size=number(), volume_size_gb=number(),
                     model_data_download_timeout=Duration.seconds(number()), environment={"SAGEMAKER_TRITON_PING_MODE": text()})
    SageMakerExecutionRoleProps(endpoint_name=text())
    ModelBucketProps(noncurrent_version_expiration=Duration.days(number()))
    EndpointAutoscalingProps(endpoint=r.endpoint, gpu_utilization_target=number(),
                             gpu_scale_in_cooldown=Duration.seconds(number()))
    AlarmThresholds(invocation_5xx_errors=number(), disk_percent=number())
    EndpointAlarmsProps(endpoint=r.endpoint, name_prefix=text())
    EndpointDashboardProps(endpoint=r.endpoint, dashboard_name=text())
    EndpointNetworkProps(cidr=text())
    AlarmTopicProps(emails=[text()])
    r.build_props(model_prefix=text(), memory_size=number(), timeout=Duration.seconds(number()),
                  total_timeout=Duration.seconds(number()), query_interval=Duration.seconds(number()))
    RolloutPolicyProps(endpoint=r.endpoint, traffic=text(), size=number(),  # type: ignore[arg-type]  # on purpose: tokens
                       maximum_execution_timeout=Duration.seconds(number()))
    with pytest.raises(PropsError, match="version: got a token; the version picks a row of the image table"):
        TritonImageProps(version=text())


def test_props_are_frozen(resources: Resources) -> None:
    fleet = FleetSize(maximum=8)
    with pytest.raises(Exception, match="frozen"):
        fleet.maximum = 9
    assert resources.endpoint.fleet == FleetSize()


def test_metric_methods_take_metric_options(resources: Resources) -> None:
    metric = resources.endpoint.metric_model_latency(
        statistic="p99", period=Duration.minutes(5), unit=cloudwatch.Unit.MICROSECONDS, label="p99", color="#ff0000"
    )
    assert (metric.metric_name, metric.statistic, metric.period.to_seconds(), metric.label, metric.color) == (
        "ModelLatency", "p99", 300, "p99", "#ff0000")
    assert resources.endpoint.metric_invocations().statistic == "Sum"
    assert "ModelLatency" in (SageMakerHosting.metric_model_latency.__doc__ or "")


def test_grants_return_grants(resources: Resources) -> None:
    stack = resources.stack
    user = iam.Role(stack, "User", assumed_by=iam.AccountRootPrincipal())
    for grant in (resources.endpoint.grant_invoke(user), resources.image.grant_pull(user)):
        assert isinstance(grant, iam.Grant) and grant.success


def test_endpoint_alarms_are_built_from_the_endpoint_metrics(resources: Resources) -> None:
    stack = cdk.Stack(cdk.App(), "Alarms")
    image = TritonImage(stack, "Image")
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    endpoint = SageMakerHosting(stack, "Endpoint", props=SageMakerHostingProps(
        image=image, execution_role=role, model_data_url="s3://b/m/", endpoint_name="ep", fleet=FleetSize(maximum=6)))
    EndpointAlarms(stack, "Alarms", props=EndpointAlarmsProps(endpoint=endpoint, name_prefix="team.ep",
                                                              thresholds=AlarmThresholds(gpu_saturation_percent=80)))
    alarms = Template.from_stack(stack).find_resources("AWS::CloudWatch::Alarm")
    names = sorted(a["Properties"]["AlarmName"] for a in alarms.values())
    assert names[0] == "team.ep-disk" and len(names) == 7
    saturation = next(a for a in alarms.values() if a["Properties"]["AlarmName"] == "team.ep-gpu-saturation")
    expression = saturation["Properties"]["Metrics"][0]["Expression"]
    assert expression == "IF(gpu >= 80 AND (invocations / perinstance) >= 5.5, 1, 0)"


# ---------------------------------------------------------------------------------------------
# One definition per bound and default
# ---------------------------------------------------------------------------------------------


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in metadata:
        for name in ("ge", "gt", "le", "lt", "pattern"):
            if getattr(item, name, None) is not None:
                found[name] = getattr(item, name)
    return found


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_each_setting_takes_its_default_bounds_and_description_from_its_props_field(key: str) -> None:
    setting: Setting = SETTINGS[key]
    model_field = MmeSettings.model_fields[key]
    prop = setting.props.model_fields[setting.field]
    assert model_field.description == prop.description and prop.description
    default = setting.prop_value(model_field.get_default(call_default_factory=True))
    assert _amount(default) == _amount(prop.get_default(call_default_factory=True))
    if setting.convert is None:
        assert _bounds(model_field.metadata) == _bounds(prop.metadata)
    elif any(isinstance(item, Between) for item in prop.metadata):
        (between,) = [item for item in prop.metadata if isinstance(item, Between)]
        bounds = _bounds(model_field.metadata)
        # The setting's bounds, made into the prop's unit, are within the prop's; one step
        # further is not (a Duration cannot be negative: below 0 is no step).
        for amount, beyond in ((bounds["ge"], bounds["ge"] - 1), (bounds["le"], bounds["le"] + 1)):
            between.check(setting.prop_value(amount))
            if beyond >= 0:
                with pytest.raises(ValueError):
                    between.check(setting.prop_value(beyond))
    for target, field in setting.targets[1:]:
        assert target.model_fields[field].get_default(call_default_factory=True) == prop.get_default(call_default_factory=True)


def _amount(value: Any) -> Any:
    """A Duration or Size as a number (they compare by identity), anything else as is."""
    if isinstance(value, Duration):
        return value.to_seconds()
    return value.to_mebibytes() if isinstance(value, Size) else value


def test_settings_write_no_bound_or_default_of_a_prop() -> None:
    """The settings module states no number bound (``ge=60``...) and no setting of SETTINGS is
    redeclared as a plain field."""
    source = (ROOT / "stacks" / "settings.py").read_text(encoding="utf-8")
    assert not re.findall(r"\b(?:ge|gt|le|lt)=\d", source)
    plain = set(MmeSettings.model_fields) - set(SETTINGS)
    assert plain == {"stack_name", "account", "region", "manifest_path", "release_id", "plan_routes_file",
                     "alarm_topic_enabled", "alarm_topic_arn", "vpc_id", "create_vpc", "tag_project",
                     "tag_environment", "tag_owner"}


def test_every_props_rule_names_settings_by_their_context_key() -> None:
    assert context_name(FleetSize, "minimum") == "mme:min_instance_count"
    assert context_name(RolloutPolicyProps, "fleet.maximum") == "mme:max_instance_count"
    assert context_name(RolloutPolicyProps, "size") == "mme:rollout_size"
    assert context_name(ModelBuildResourceProps, "total_timeout") == "mme:build_total_timeout_minutes"
    assert context_name(AlarmTopicProps, "removal_policy") == "mme:bucket_removal_policy"
    assert context_name(SageMakerHostingProps, "subnets") == "subnets"
    assert RolloutPolicyProps in PROPS and FleetSize in PROPS


def test_settings_give_the_props_their_values() -> None:
    """The app's adapter turns the context's numbers into the construct's keywords (a Duration for
    mme:build_timeout_minutes), and the construct's settings hold them typed."""
    settings = MmeSettings.from_context({
        "mme:bucket_removal_policy": "destroy", "mme:build_timeout_minutes": "10", "mme:max_instance_count": "6",
        "mme:alarm_disk_percent": "70", "mme:alarm_latency_p99_ms": "250", "mme:build_memory_mb": "4096",
    })
    keywords = construct_keywords(cdk.Stack(), ((key, getattr(settings, key)) for key in ENDPOINT_KEYS
                                                if key in settings.model_fields_set))
    assert sorted(keywords) == ["alarm_disk_percent", "alarm_latency_p99", "bucket_removal_policy", "build_memory",
                                "build_timeout", "max_instance_count"]
    assert keywords["build_timeout"].to_seconds() == 600 and keywords["alarm_latency_p99"].to_milliseconds() == 250
    assert keywords["build_memory"].to_mebibytes() == 4096
    options = endpoint_settings(keywords, has_vpc=False)
    assert (options.bucket_removal_policy, options.max_instance_count, options.alarm_disk_percent) == ("destroy", 6, 70)
    assert options.build_timeout.to_minutes() == 10


def test_the_apps_defaults_are_the_constructs_defaults() -> None:
    """Every context key at its default, through the app's adapter, gives the construct its own
    default keyword value: the mme: numbers and the Duration and Size keywords say the same."""
    # With a created VPC, which the VPC settings given explicitly need.
    settings = MmeSettings.from_context({"mme:create_vpc": "true"})
    keywords = construct_keywords(cdk.Stack(), ((key, getattr(settings, key)) for key in ENDPOINT_KEYS))
    assert len(keywords) == len(EndpointSettings.model_fields)
    given = endpoint_settings(keywords, has_vpc=True)
    defaults = endpoint_settings({"create_vpc": True}, has_vpc=True)

    def plain(value: Any) -> Any:
        if isinstance(value, Duration):
            return ("duration", value.to_milliseconds())
        return ("size", value.to_bytes()) if isinstance(value, Size) else value

    for name in EndpointSettings.model_fields:
        assert plain(getattr(given, name)) == plain(getattr(defaults, name)), name
