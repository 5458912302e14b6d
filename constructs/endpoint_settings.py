"""The settings of one endpoint: each is a construct's props field, and each is both a keyword of
:class:`~triton_mme_cdk.constructs.multi_model_endpoint.TritonMultiModelEndpoint` and an ``mme:<name>``
key of the app's context (docs/settings.md lists them once, for both).

- :data:`SETTINGS` maps each setting onto its props field (``max_instance_count`` ->
  ``FleetSize.maximum``) with the conversion of the setting's value into the prop's value
  (seconds -> ``Duration``, ``retain`` -> ``RemovalPolicy.RETAIN``). The setting's type, bounds,
  default and description are the field's, converted; none is written twice.
- :class:`EndpointSettingsBase` holds what every reader of the settings shares: the props values
  (:meth:`~EndpointSettingsBase.values`), the rules between fields (the props' own rules, named by
  setting), the fleet's image and AMI, and the two settings that are no props field
  (``create_vpc``, ``alarm_topic_enabled``).
- :class:`EndpointSettings` is the construct's: the base and one field per row of the table.
  ``stacks.settings.MmeSettings`` is the app's: the same fields read from the CDK context, plus the
  app's own (stack name, account, region, manifest, tags).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    ClassVar,
    Literal,
    Self,
    TypeVar,
    Union,
    get_args,
    get_origin,
)

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_sns as sns
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    model_validator,
)

from triton_mme_cdk.constructs.alarm_topic import AlarmTopicProps
from triton_mme_cdk.constructs.endpoint_alarms import AlarmThresholds, EndpointAlarmsProps
from triton_mme_cdk.constructs.endpoint_autoscaling import EndpointAutoscalingProps
from triton_mme_cdk.constructs.endpoint_dashboard import EndpointDashboardProps
from triton_mme_cdk.constructs.endpoint_network import EndpointNetworkProps
from triton_mme_cdk.constructs.model_bucket import ModelBucketProps
from triton_mme_cdk.constructs.model_build_resource import ModelBuildResourceProps
from triton_mme_cdk.constructs.props import (
    DAYS,
    MEBIBYTES,
    MINUTES,
    SECONDS,
    Between,
    Namer,
    Props,
    Unit,
    format_errors,
)
from triton_mme_cdk.constructs.rollout_policy import RolloutPolicyProps
from triton_mme_cdk.constructs.sagemaker_limits import PropsError
from triton_mme_cdk.constructs.triton_image import FleetHost, TritonImageProps, load_image_table, resolve_host
from triton_mme_cdk.constructs.triton_mme_endpoint import FleetSize, TritonMmeEndpointProps

P = TypeVar("P", bound=Props)


# ---------------------------------------------------------------------------------------------
# The table: setting -> props field
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """Context values that name prop values (``retain`` -> ``RemovalPolicy.RETAIN``)."""

    values: Mapping[str, Any]

    def name_of(self, value: Any) -> str:
        return next(name for name, each in self.values.items() if each == value)


REMOVAL_POLICY = Choice({"retain": RemovalPolicy.RETAIN, "destroy": RemovalPolicy.DESTROY})


@dataclass(frozen=True)
class Setting:
    """A context key's props field: ``props.field`` (and each of ``also``) gets its value.

    ``convert`` turns the context value into the prop's value: ``None``, the value as is; a
    :class:`~constructs.props.Unit`, a number of that unit (a ``Duration`` or ``Size`` prop); a
    :class:`Choice`, a name of the prop's value.
    """

    props: type[Props]
    field: str
    convert: Unit | Choice | None = None
    also: tuple[tuple[type[Props], str], ...] = ()

    @property
    def targets(self) -> tuple[tuple[type[Props], str], ...]:
        return ((self.props, self.field), *self.also)

    def prop_value(self, value: Any) -> Any:
        if value is None or self.convert is None:
            return value
        if isinstance(self.convert, Choice):
            return self.convert.values[value]
        return self.convert.make(value)

    def model_field(self) -> tuple[Any, Any]:
        """The setting's type and ``Field``, from the props field's (converted)."""
        field = self.props.model_fields[self.field]
        description = field.description
        if self.convert is None:
            annotation = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
            if field.default_factory is not None:
                return annotation, Field(default_factory=field.default_factory, description=description)
            return annotation, Field(default=field.default, description=description)
        default = field.get_default(call_default_factory=True)
        if isinstance(self.convert, Choice):
            return Literal[tuple(self.convert.values)], Field(default=self.convert.name_of(default), description=description)
        (between,) = [item for item in field.metadata if isinstance(item, Between)]
        low = math.ceil(round(between.unit.convert(between.low, self.convert), 9))
        high = math.floor(round(between.unit.convert(between.high, self.convert), 9))
        number = int | None if _allows_none(field.annotation) else int
        default = None if default is None else round(self.convert.read(default))
        return Annotated[number, Field(ge=low, le=high)], Field(default=default, description=description)


#: Every setting that is a props field, in the order docs/settings.md lists them.
SETTINGS: dict[str, Setting] = {
    # Endpoint and autoscaling
    "endpoint_name": Setting(TritonMmeEndpointProps, "endpoint_name"),
    "instance_type": Setting(TritonMmeEndpointProps, "instance_type"),
    "initial_instance_count": Setting(FleetSize, "initial"),
    "min_instance_count": Setting(FleetSize, "minimum"),
    "max_instance_count": Setting(FleetSize, "maximum"),
    "invocations_per_instance_target": Setting(EndpointAutoscalingProps, "invocations_per_instance_target"),
    "invocations_scale_in_cooldown_seconds": Setting(EndpointAutoscalingProps, "invocations_scale_in_cooldown", SECONDS),
    "invocations_scale_out_cooldown_seconds": Setting(EndpointAutoscalingProps, "invocations_scale_out_cooldown", SECONDS),
    "gpu_utilization_target": Setting(EndpointAutoscalingProps, "gpu_utilization_target"),
    "gpu_scale_in_cooldown_seconds": Setting(EndpointAutoscalingProps, "gpu_scale_in_cooldown", SECONDS),
    "gpu_scale_out_cooldown_seconds": Setting(EndpointAutoscalingProps, "gpu_scale_out_cooldown", SECONDS),
    # Triton container
    "triton_image_version": Setting(TritonImageProps, "version"),
    "inference_ami_version": Setting(TritonMmeEndpointProps, "inference_ami_version"),
    "shm_default_byte_size": Setting(TritonMmeEndpointProps, "shm_default_byte_size"),
    "shm_growth_byte_size": Setting(TritonMmeEndpointProps, "shm_growth_byte_size"),
    "triton_log_verbose": Setting(TritonMmeEndpointProps, "log_verbose"),
    "triton_environment": Setting(TritonMmeEndpointProps, "environment"),
    "model_cache": Setting(TritonMmeEndpointProps, "model_cache_setting"),
    "model_data_download_timeout_seconds": Setting(TritonMmeEndpointProps, "model_data_download_timeout", SECONDS),
    "container_startup_health_check_timeout_seconds": Setting(
        TritonMmeEndpointProps, "container_startup_health_check_timeout", SECONDS
    ),
    "volume_size_gb": Setting(TritonMmeEndpointProps, "volume_size_gb"),
    # Model bucket
    "model_prefix": Setting(ModelBuildResourceProps, "model_prefix"),
    "noncurrent_version_expiration_days": Setting(ModelBucketProps, "noncurrent_version_expiration", DAYS),
    "retired_release_expiration_days": Setting(ModelBucketProps, "retired_release_expiration", DAYS),
    "access_log_expiration_days": Setting(ModelBucketProps, "access_log_expiration", DAYS),
    "model_publishers": Setting(ModelBucketProps, "publishers"),
    "bucket_removal_policy": Setting(
        ModelBucketProps,
        "removal_policy",
        REMOVAL_POLICY,
        also=((AlarmTopicProps, "removal_policy"), (EndpointNetworkProps, "removal_policy")),
    ),
    # Model build
    "build_memory_mb": Setting(ModelBuildResourceProps, "memory_size"),
    "build_ephemeral_storage_mb": Setting(ModelBuildResourceProps, "ephemeral_storage_size", MEBIBYTES),
    "build_timeout_minutes": Setting(ModelBuildResourceProps, "timeout", MINUTES),
    "build_total_timeout_minutes": Setting(ModelBuildResourceProps, "total_timeout", MINUTES),
    "build_query_interval_seconds": Setting(ModelBuildResourceProps, "query_interval", SECONDS),
    "build_max_concurrency": Setting(ModelBuildResourceProps, "max_concurrency"),
    "build_runs_on": Setting(ModelBuildResourceProps, "runs_on"),
    "build_processing_instance_type": Setting(ModelBuildResourceProps, "processing_instance_type"),
    "build_processing_volume_gb": Setting(ModelBuildResourceProps, "processing_volume_gb"),
    "build_processing_max_runtime_minutes": Setting(ModelBuildResourceProps, "processing_max_runtime", MINUTES),
    "artifacts_on_delete": Setting(ModelBuildResourceProps, "on_delete"),
    "unrouted_retention_days": Setting(ModelBuildResourceProps, "unrouted_retention_days"),
    # Alarms and notifications
    "alarm_5xx_errors_threshold": Setting(AlarmThresholds, "invocation_5xx_errors"),
    "alarm_4xx_rate_percent": Setting(AlarmThresholds, "invocation_4xx_rate_percent"),
    "alarm_latency_p99_ms": Setting(AlarmThresholds, "model_latency_p99_ms"),
    "alarm_model_loading_wait_p90_ms": Setting(AlarmThresholds, "model_loading_wait_p90_ms"),
    "alarm_gpu_memory_percent": Setting(AlarmThresholds, "gpu_memory_percent"),
    "alarm_disk_percent": Setting(AlarmThresholds, "disk_percent"),
    "alarm_gpu_saturation_percent": Setting(AlarmThresholds, "gpu_saturation_percent"),
    "alarm_emails": Setting(AlarmTopicProps, "emails"),
    "dashboard_name": Setting(EndpointDashboardProps, "dashboard_name"),
    # Safe rollouts
    "rollout_traffic": Setting(RolloutPolicyProps, "traffic"),
    "rollout_size_type": Setting(RolloutPolicyProps, "size_type"),
    "rollout_size": Setting(RolloutPolicyProps, "size"),
    "rollout_wait_seconds": Setting(RolloutPolicyProps, "wait_interval", SECONDS),
    "rollout_termination_wait_seconds": Setting(RolloutPolicyProps, "termination_wait", SECONDS),
    "rollout_max_execution_timeout_seconds": Setting(RolloutPolicyProps, "maximum_execution_timeout", SECONDS),
    "rollback_alarms": Setting(EndpointAlarmsProps, "rollback_alarms"),
    # Network
    "network_isolation": Setting(TritonMmeEndpointProps, "enable_network_isolation"),
    "vpc_cidr": Setting(EndpointNetworkProps, "cidr"),
    "vpc_interface_endpoints": Setting(EndpointNetworkProps, "interface_endpoints"),
    "build_in_vpc": Setting(EndpointNetworkProps, "build_access"),
}
#: The props classes the table sets, in table order.
PROPS: tuple[type[Props], ...] = tuple(
    dict.fromkeys(props for setting in SETTINGS.values() for props, _ in setting.targets)
)
_KEYS: dict[tuple[type[Props], str], str] = {
    target: key for key, setting in SETTINGS.items() for target in setting.targets
}


def members(annotation: Any) -> tuple[Any, ...]:
    """The types a field's annotation admits (the members of a union, or the type)."""
    return get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)


def _allows_none(annotation: Any) -> bool:
    return type(None) in members(annotation)


def nested_props(annotation: Any) -> type[Props] | None:
    """The props class a field holds a value of (``FleetSize``...), if any."""
    found = [each for each in members(annotation) if isinstance(each, type) and issubclass(each, Props)]
    return found[0] if found else None


def setting_name(props: type[Props], path: str, prefix: str = "") -> str:
    """The name a message shows for a field of ``props`` (``fleet.minimum`` for a nested one): the
    setting that gives it (``min_instance_count``, after ``prefix``: ``mme:`` in the app's context),
    the path otherwise."""
    *heads, last = path.split(".")
    for head in heads:
        props = nested_props(props.model_fields[head].annotation) or props
    key = _KEYS.get((props, last))
    return prefix + key if key else path


# ---------------------------------------------------------------------------------------------
# The settings of one endpoint, checked together
# ---------------------------------------------------------------------------------------------


#: The two settings that are no props field (every reader has them, where it lists them).
CREATE_VPC = Field(
    default=False,
    description="Place the model in a new VPC: 2 AZs, isolated subnets only, flow logs, the S3 gateway "
    "endpoint and vpc_interface_endpoints. Exclusive with an existing VPC.",
)
ALARM_TOPIC_ENABLED = Field(
    default=None,
    description="Create an SNS topic (its own KMS key, TLS-only policy) that every alarm notifies on "
    "ALARM and OK. Unset: created unless you give a topic; false: the alarms notify nothing (a synth "
    "warning: the HIPAA.Security and NIST.800.53.R5 packs' CloudWatchAlarmAction reports them).",
)


class EndpointSettingsBase(BaseModel):
    """What every reader of the endpoint's settings shares (its fields come from :data:`SETTINGS`,
    :data:`CREATE_VPC` and :data:`ALARM_TOPIC_ENABLED`). Messages name a setting after :attr:`prefix` (``mme:`` for the app's context).

    The rules that need to know whether the endpoint has a VPC read the validation context's
    ``has_vpc`` (the construct gives it: a VPC passed in); without it, ``create_vpc``."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False)
    #: What a message puts before a setting's name.
    prefix: ClassVar[str] = ""

    if TYPE_CHECKING:
        # The fields EndpointSettings and MmeSettings derive from SETTINGS; typed by their props.
        def __getattr__(self, name: str) -> Any: ...

    def name(self, setting: str) -> str:
        """How a message names ``setting``."""
        return self.prefix + setting

    @model_validator(mode="after")
    def _endpoint_rules(self, info: ValidationInfo) -> Self:
        for props in PROPS:
            self._unchecked(props).check(self._namer(props))
        self.fleet_host()
        has_vpc = (info.context or {}).get("has_vpc", self.has_vpc())
        for key, what in (("vpc_cidr", "the range is for a created VPC"),
                          ("vpc_interface_endpoints", "endpoints are only added to a created VPC (an "
                                                      "existing one keeps its own)")):
            if key in self.model_fields_set and not self.create_vpc:
                raise ValueError(f"{self.name(key)}: got {getattr(self, key)!r} without {self.name('create_vpc')} "
                                 f"true; {what}")
        if self.build_in_vpc and not has_vpc:
            raise ValueError(f"{self.name('build_in_vpc')}: got true without a VPC; {self.vpc_hint()}")
        return self

    def has_vpc(self) -> bool:
        """Whether the settings alone place the endpoint in a VPC."""
        return self.create_vpc

    def vpc_hint(self) -> str:
        """How to give the endpoint a VPC, in these settings' words."""
        return f"pass vpc (ec2.IVpc) or set {self.name('create_vpc')} true"

    def fleet_host(self) -> FleetHost:
        """The Triton image and inference AMI the fleet runs (chosen where unset, checked together)."""
        return resolve_host(load_image_table().versions, version=self.triton_image_version,
                            instance_type=self.instance_type, ami=self.inference_ami_version, name=self.name)

    # -----------------------------------------------------------------------------------------
    # The props values
    # -----------------------------------------------------------------------------------------

    def values(self, props: type[Props]) -> dict[str, Any]:
        """The fields of ``props`` the settings give, as the props take them: each field a setting
        maps onto (converted), and each field holding a props value that settings give whole
        (``FleetSize``, ``AlarmThresholds``). The construct adds the resources."""
        return self._values(props, self.build)

    def build(self, props: type[P]) -> P:
        """A props value the settings give whole (``FleetSize``, ``AlarmThresholds``)."""
        return props(**self.values(props))

    def _values(self, props: type[Props], nested: Callable[[type[Props]], Props]) -> dict[str, Any]:
        given = {
            field: setting.prop_value(getattr(self, key))
            for key, setting in SETTINGS.items()
            for target, field in setting.targets
            if target is props
        }
        for field, info in props.model_fields.items():
            held = nested_props(info.annotation)
            if field not in given and held in PROPS:
                given[field] = nested(held)
        return given

    def _unchecked(self, props: type[Props]) -> Props:
        """A props value for checking the rules, before its own rules were checked."""
        return props.model_construct(**self._values(props, self._unchecked))

    def _namer(self, props: type[Props]) -> Namer:
        return lambda path: setting_name(props, path, self.prefix)


if TYPE_CHECKING:
    EndpointSettings = EndpointSettingsBase
else:
    #: The construct's settings: :class:`EndpointSettingsBase` and one field per row of :data:`SETTINGS`.
    EndpointSettings = create_model(
        "EndpointSettings",
        __base__=EndpointSettingsBase,
        __module__=__name__,
        create_vpc=(bool, CREATE_VPC),
        alarm_topic_enabled=(bool | None, ALARM_TOPIC_ENABLED),
        **{key: setting.model_field() for key, setting in SETTINGS.items()},
    )

#: Every setting of one endpoint, by name.
SETTING_NAMES: tuple[str, ...] = tuple(EndpointSettings.model_fields)


def endpoint_settings(values: Mapping[str, Any], *, has_vpc: bool) -> EndpointSettingsBase:
    """The construct's settings from its keyword arguments: one ``PropsError`` line per refused
    value, naming the keyword (an unknown one with the closest known name)."""
    import difflib

    unknown = [name for name in values if name not in EndpointSettings.model_fields]
    if unknown:
        close = difflib.get_close_matches(unknown[0], SETTING_NAMES, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise PropsError(f"{unknown[0]}: unknown keyword; {hint}the settings are listed in docs/settings.md")
    try:
        return EndpointSettings.model_validate(dict(values), context={"has_vpc": has_vpc})
    except ValidationError as error:
        raise PropsError(format_errors(error)) from None


def check_resources(options: EndpointSettingsBase, *, vpc: ec2.IVpc | None, vpc_subnets: ec2.SubnetSelection | None,
                    security_groups: Sequence[ec2.ISecurityGroup] | None, alarm_topic: sns.ITopic | None,
                    from_release: bool) -> None:
    """The rules between the resources passed to ``TritonMultiModelEndpoint`` and its settings
    (one line each, before any construct; ``from_release``: ``ModelSource.from_release``)."""
    if vpc is not None and options.create_vpc:
        raise PropsError("create_vpc: got true with vpc; place the model in your VPC or in a created one, not both")
    for name, value in (("vpc_subnets", vpc_subnets), ("security_groups", security_groups)):
        if value is not None and vpc is None:
            raise PropsError(f"{name}: given without vpc; pass the VPC they belong to as vpc (ec2.IVpc)")
    if options.alarm_topic_enabled is False and options.alarm_emails:
        raise PropsError("alarm_emails: given with alarm_topic_enabled false; the addresses subscribe to the "
                         "created topic: leave alarm_topic_enabled unset, or drop the addresses")
    if alarm_topic is not None and (options.alarm_topic_enabled is True or options.alarm_emails):
        given = "alarm_emails" if options.alarm_emails else "alarm_topic_enabled true"
        raise PropsError(f"alarm_topic: given with {given}; the alarms notify either your topic or a created one: "
                         "drop one of them (subscribe the addresses to your topic)")
    if options.build_in_vpc and from_release:
        raise PropsError("build_in_vpc: got true with ModelSource.from_release; there is no build to place in "
                         "the VPC (the release is published out of band)")
