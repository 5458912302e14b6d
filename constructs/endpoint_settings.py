"""The settings of one endpoint: each is a construct's props field, a keyword of
:class:`~triton_mme_cdk.constructs.multi_model_endpoint.TritonMultiModelEndpoint` and an ``mme:<key>``
of the app's context (docs/settings.md lists them once, for both).

- :data:`SETTINGS` maps each context key onto its props field (``max_instance_count`` ->
  ``FleetSize.maximum``), with the conversion of a context value into the prop's value (seconds ->
  ``Duration``, ``retain`` -> ``RemovalPolicy.RETAIN``) and the construct's keyword where it is not
  the key: a time is a ``Duration`` and an amount of memory or storage a ``Size``, named without a
  unit (``mme:build_query_interval_seconds`` is ``build_query_interval``). The context's type,
  bounds, default and description are the field's, converted; none is written twice.
- :class:`EndpointSettingsBase` holds what both readers of the settings share: the rules between
  fields (the props' own rules, named by setting) and the fleet's image and AMI.
- :class:`EndpointSettings` is the construct's, written out field by field (mypy checks each use);
  ``stacks.settings.MmeSettings`` is the app's: the context keys, plus the app's own settings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from aws_cdk import Duration, Size
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from triton_mme_cdk.constructs.bucket_guard import publisher_arn
from triton_mme_cdk.constructs.endpoint_alarms import AlarmKey
from triton_mme_cdk.constructs.endpoint_dashboard import DashboardName
from triton_mme_cdk.constructs.endpoint_network import InterfaceEndpoint
from triton_mme_cdk.constructs.model_bucket import PUBLISHERS_MAX, PUBLISHERS_SCOPE
from triton_mme_cdk.constructs.props import (
    Between,
    Namer,
    Props,
    Quantity,
    Resource,
    format_errors,
    is_unresolved,
)
from triton_mme_cdk.constructs.sagemaker_limits import (
    CapacitySizeType,
    InferenceAmiVersion,
    ModelCacheSetting,
    PropsError,
    TrafficRoutingType,
)
from triton_mme_cdk.constructs.setting_table import (
    KEYWORDS,
    PROPS,
    SETTINGS,
    Choice,
    Setting,
    from_keyword,
    members,
    nested_props,
    principal_arns,
    setting_name,
    unit_of,
)
from triton_mme_cdk.constructs.triton_image import FleetHost, TritonVersion, load_image_table, resolve_host

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
    """What both readers of the endpoint's settings share: the rules between fields, named by
    setting (after :attr:`prefix`: ``mme:`` for the app's context), and the fleet's image and AMI.

    The rules that need to know whether the endpoint has a VPC read the validation context's
    ``has_vpc`` (the construct gives it: a VPC passed in); without it, :meth:`has_vpc`."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False,
                              arbitrary_types_allowed=True)
    #: What a message puts before a setting's name.
    prefix: ClassVar[str] = ""
    #: Whether the fields are the construct's keywords (else the context's keys).
    keywords: ClassVar[bool] = False

    if TYPE_CHECKING:
        # The settings the rules read, with the same name and type in both readers (fields there).
        @property
        def create_vpc(self) -> bool: ...
        @property
        def build_in_vpc(self) -> bool: ...
        @property
        def instance_type(self) -> str: ...
        @property
        def triton_image_version(self) -> str | None: ...
        @property
        def inference_ami_version(self) -> InferenceAmiVersion | None: ...

    def name(self, setting: str) -> str:
        """How a message names ``setting`` (a context key)."""
        return self.prefix + (KEYWORDS.get(setting, setting) if self.keywords else setting)

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

    def _prop_value(self, key: str, setting: Setting) -> Any:
        if self.keywords:
            return from_keyword(key, getattr(self, KEYWORDS[key]))
        return setting.prop_value(getattr(self, key))

    def _unchecked(self, props: type[Props]) -> Props:
        """A props value of the settings' fields (nested props values included) for checking the
        rules between them, before its own field checks."""
        given = {field: self._prop_value(key, setting) for key, setting in SETTINGS.items()
                 for target, field in setting.targets if target is props}
        for field, info in props.model_fields.items():
            held = nested_props(info.annotation)
            if field not in given and held in PROPS:
                given[field] = self._unchecked(held)
        return props.model_construct(**given)

    def _namer(self, props: type[Props]) -> Namer:
        return lambda path: setting_name(props, path, self.prefix, keyword=self.keywords)


# ---------------------------------------------------------------------------------------------
# The construct's settings, written out
# ---------------------------------------------------------------------------------------------


def _same(key: str) -> Any:
    """A keyword that is its props field (``Annotated`` metadata): the field's checks, default
    and description."""
    setting = SETTINGS[key]
    field = setting.props.model_fields[setting.field]
    return FieldInfo.merge_field_infos(field)


def _quantity(key: str) -> Any:
    """A ``Duration`` or ``Size`` keyword: its props field's checks in the field's unit (for a
    number prop: its bounds, whole amounts of an ``int``), its default and description."""
    setting = SETTINGS[key]
    field = setting.props.model_fields[setting.field]
    unit = unit_of(key)
    assert unit is not None, key
    between = next((item for item in field.metadata if isinstance(item, Between)), None)
    if between is None:  # a number of the unit: its bounds become a Between
        low = next((getattr(item, name) for item in field.metadata for name in ("ge", "gt") if hasattr(item, name)), 0)
        high = next((item.le for item in field.metadata if hasattr(item, "le")), math.inf)
        number = next(each for each in members(field.annotation) if each is not type(None))
        between = Between(low, high, unit, above=any(hasattr(item, "gt") for item in field.metadata),
                          whole=number is int)
    default = field.get_default(call_default_factory=True)
    if setting.convert is None and default is not None:  # a number of the unit
        default = unit.make(default)
    info: FieldInfo = Field(default_factory=lambda: default, description=field.description)
    info.metadata += [Quantity(unit), between]
    return info


def _choice(key: str) -> Any:
    """A keyword that names the prop's value (``retain``)."""
    setting = SETTINGS[key]
    assert isinstance(setting.convert, Choice), key
    field = setting.props.model_fields[setting.field]
    return Field(default=setting.convert.name_of(field.get_default()), description=field.description)


def _not_an_arn(values: Any) -> Any:
    """Publishers as ``IGrantable``s: an ARN string is refused with how to pass it."""
    for value in values if isinstance(values, (list, tuple)) else [values]:
        if isinstance(value, str):
            raise ValueError(f"got {value!r}; expected an iam.IGrantable (a role or user): pass "
                             f"iam.Role.from_role_arn(self, 'Publisher', {value!r})")
    return values


def _publisher_arns(values: list[iam.IGrantable]) -> list[iam.IGrantable]:
    for value in values:
        arns = principal_arns([value])
        if len(arns) != 1:
            raise ValueError(f"got {type(value).__name__} with the principal {arns or 'without an ARN'}; expected "
                             "a role or user: pass iam.Role.from_role_arn(self, 'Publisher', arn)")
        publisher_arn(arns[0])
    return values


class EndpointSettings(EndpointSettingsBase):
    """The construct's settings: one field per keyword (one per row of :data:`SETTINGS`, named by
    :data:`KEYWORDS`), each with its props field's checks, default and description."""

    keywords: ClassVar[bool] = True

    create_vpc: bool = CREATE_VPC
    alarm_topic_enabled: bool | None = ALARM_TOPIC_ENABLED
    # Endpoint and autoscaling
    endpoint_name: Annotated[str, _same("endpoint_name")]
    instance_type: Annotated[str, _same("instance_type")]
    initial_instance_count: Annotated[int, _same("initial_instance_count")]
    min_instance_count: Annotated[int, _same("min_instance_count")]
    max_instance_count: Annotated[int, _same("max_instance_count")]
    invocations_per_instance_target: Annotated[float, _same("invocations_per_instance_target")]
    invocations_scale_in_cooldown: Duration = _quantity("invocations_scale_in_cooldown_seconds")
    invocations_scale_out_cooldown: Duration = _quantity("invocations_scale_out_cooldown_seconds")
    gpu_utilization_target: Annotated[float, _same("gpu_utilization_target")]
    gpu_scale_in_cooldown: Duration = _quantity("gpu_scale_in_cooldown_seconds")
    gpu_scale_out_cooldown: Duration = _quantity("gpu_scale_out_cooldown_seconds")
    # Triton container
    triton_image_version: Annotated[TritonVersion | None, _same("triton_image_version")]
    inference_ami_version: Annotated[InferenceAmiVersion | None, _same("inference_ami_version")]
    shm_default_size: Size = _quantity("shm_default_byte_size")
    shm_growth_size: Size = _quantity("shm_growth_byte_size")
    triton_log_verbose: Annotated[bool, _same("triton_log_verbose")]
    triton_environment: Annotated[dict[str, str], _same("triton_environment")]
    model_cache: Annotated[ModelCacheSetting, _same("model_cache")]
    model_data_download_timeout: Duration = _quantity("model_data_download_timeout_seconds")
    container_startup_health_check_timeout: Duration = _quantity("container_startup_health_check_timeout_seconds")
    volume_size: Size | None = _quantity("volume_size_gb")
    # Model bucket
    model_prefix: Annotated[str, _same("model_prefix")]
    noncurrent_version_expiration: Duration = _quantity("noncurrent_version_expiration_days")
    retired_release_expiration: Duration = _quantity("retired_release_expiration_days")
    access_log_expiration: Duration = _quantity("access_log_expiration_days")
    model_publishers: Annotated[list[Resource[iam.IGrantable]], BeforeValidator(_not_an_arn)] = Field(
        default_factory=list, max_length=PUBLISHERS_MAX,
        description="Roles or users that may write what the fleet serves besides the stack's build (each an "
        "iam.IGrantable whose principal is one IAM role or user; one from outside the app through "
        "iam.Role.from_role_arn): " + PUBLISHERS_SCOPE)
    bucket_removal_policy: Literal["retain", "destroy"] = _choice("bucket_removal_policy")
    # Model build
    build_memory: Size = _quantity("build_memory_mb")
    build_ephemeral_storage: Size = _quantity("build_ephemeral_storage_mb")
    build_timeout: Duration = _quantity("build_timeout_minutes")
    build_total_timeout: Duration = _quantity("build_total_timeout_minutes")
    build_query_interval: Duration = _quantity("build_query_interval_seconds")
    build_max_concurrency: Annotated[int, _same("build_max_concurrency")]
    build_runs_on: Annotated[Literal["auto", "lambda", "processing"], _same("build_runs_on")]
    build_processing_instance_type: Annotated[str, _same("build_processing_instance_type")]
    build_processing_volume: Size = _quantity("build_processing_volume_gb")
    build_processing_max_runtime: Duration | None = _quantity("build_processing_max_runtime_minutes")
    artifacts_on_delete: Annotated[Literal["retain", "destroy"], _same("artifacts_on_delete")]
    unrouted_retention: Duration = _quantity("unrouted_retention_days")
    # Alarms and notifications
    alarm_5xx_errors_threshold: Annotated[float, _same("alarm_5xx_errors_threshold")]
    alarm_4xx_rate_percent: Annotated[float, _same("alarm_4xx_rate_percent")]
    alarm_latency_p99: Duration = _quantity("alarm_latency_p99_ms")
    alarm_model_loading_wait_p90: Duration = _quantity("alarm_model_loading_wait_p90_ms")
    alarm_gpu_memory_percent: Annotated[float, _same("alarm_gpu_memory_percent")]
    alarm_disk_percent: Annotated[float, _same("alarm_disk_percent")]
    alarm_gpu_saturation_percent: Annotated[float, _same("alarm_gpu_saturation_percent")]
    alarm_emails: Annotated[list[str], _same("alarm_emails")]
    dashboard_name: Annotated[DashboardName | None, _same("dashboard_name")]
    # Safe rollouts
    rollout_traffic: Annotated[TrafficRoutingType, _same("rollout_traffic")]
    rollout_size_type: Annotated[CapacitySizeType, _same("rollout_size_type")]
    rollout_size: Annotated[int | None, _same("rollout_size")]
    rollout_wait: Duration = _quantity("rollout_wait_seconds")
    rollout_termination_wait: Duration = _quantity("rollout_termination_wait_seconds")
    rollout_max_execution_timeout: Duration | None = _quantity("rollout_max_execution_timeout_seconds")
    rollback_alarms: Annotated[list[AlarmKey], _same("rollback_alarms")]
    # Network
    network_isolation: Annotated[bool, _same("network_isolation")]
    vpc_cidr: Annotated[str, _same("vpc_cidr")]
    vpc_interface_endpoints: Annotated[list[InterfaceEndpoint], _same("vpc_interface_endpoints")]
    build_in_vpc: Annotated[bool, _same("build_in_vpc")]

    @field_validator("*", mode="wrap")
    @classmethod
    def _tokens_pass(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        """A token (known at deploy time) skips a value's checks; a ``Duration`` or ``Size``
        keyword still refuses a bare number token (``Duration.seconds(token)`` passes)."""
        metadata = cls.model_fields[info.field_name or ""].metadata
        if is_unresolved(value) and not any(isinstance(item, Quantity) for item in metadata):
            return value
        return handler(value)

    @field_validator("model_publishers")
    @classmethod
    def _publishers(cls, value: list[iam.IGrantable]) -> list[iam.IGrantable]:
        return _publisher_arns(value)


def _check_table() -> None:
    """Each keyword of :class:`EndpointSettings` is a row of :data:`SETTINGS`, and a keyword that
    is its props field has the field's type."""
    fields = EndpointSettings.model_fields
    extra = {"create_vpc", "alarm_topic_enabled"}
    if set(fields) - extra != set(KEYWORDS.values()):
        raise AssertionError(f"EndpointSettings and SETTINGS differ: {sorted(set(fields) ^ set(KEYWORDS.values()) - extra)}")
    for key, setting in SETTINGS.items():
        prop = setting.props.model_fields[setting.field]
        if unit_of(key) is None and setting.convert is None and key != "model_publishers" \
                and fields[key].annotation != prop.annotation:
            raise AssertionError(f"{key}: typed {fields[key].annotation}, its props field {prop.annotation}")


_check_table()

#: Every keyword of one endpoint.
SETTING_NAMES: tuple[str, ...] = tuple(EndpointSettings.model_fields)


def endpoint_settings(values: Mapping[str, Any], *, has_vpc: bool) -> EndpointSettings:
    """The construct's settings from its keyword arguments: one ``PropsError`` line per refused
    value, naming the keyword (an unknown one with the closest known name)."""
    import difflib

    unknown = [name for name in values if name not in EndpointSettings.model_fields]
    renamed = KEYWORDS.get(unknown[0], unknown[0]) if unknown else None
    if unknown and renamed != unknown[0]:  # an mme: key with its unit, once the construct's keyword
        unit = unit_of(unknown[0])
        assert unit is not None
        kind, value = unit.source.partition(".")[0], values[unknown[0]]
        shown = value if isinstance(value, (int, float)) and not isinstance(value, bool) else "..."
        raise PropsError(f"{unknown[0]}: renamed {renamed}, a {kind}: pass {renamed}={unit.source}({shown})")
    if unknown:
        close = difflib.get_close_matches(unknown[0], SETTING_NAMES, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise PropsError(f"{unknown[0]}: unknown keyword; {hint}the settings are listed in docs/settings.md")
    try:
        return EndpointSettings.model_validate(dict(values), context={"has_vpc": has_vpc})
    except ValidationError as error:
        raise PropsError(format_errors(error)) from None


def check_resources(options: EndpointSettings, *, vpc: ec2.IVpc | None, vpc_subnets: ec2.SubnetSelection | None,
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
