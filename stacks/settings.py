"""Typed, validated settings of the Triton multi-model endpoint app.

``app.py`` builds one :class:`MmeSettings` from the CDK context (``cdk.json`` and ``-c`` flags):
every key is ``mme:<name>``, e.g. ``cdk synth -c mme:instance_type=ml.g5.2xlarge``.

Most settings are a construct's props field: :data:`SETTINGS` maps each such context key onto its
field (``mme:max_instance_count`` -> ``FleetSize.maximum``) with the conversion of a context value
into the prop's value (seconds -> ``Duration``, ``retain`` -> ``RemovalPolicy.RETAIN``). The
setting's type, bounds, default and description are the field's, converted; none is written
here. The other settings (stack name, environment, which manifest or release, which VPC and topic,
tags) are plain fields of :class:`AppSettings`.

Values given with ``-c`` are strings and are coerced by the setting's type (``"2"`` -> 2,
``"true"`` -> True, ``""`` -> unset for optional settings and empty for lists and objects, a JSON
array or a comma-separated list for a list, a JSON object for ``triton_environment``). An unknown
``mme:`` key, a value of the wrong type or out of range, or an inconsistent combination raises
:class:`SettingsError` with one message that names the setting as ``mme:<name>``, the value given
and what is allowed: the props' own rules between fields run on the settings' values, and their
field names are mapped back to context keys through :data:`SETTINGS`.

No AWS call is made: the app synthesizes without credentials.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, TypeVar, Union, get_args, get_origin

from aws_cdk import RemovalPolicy
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from constructs.alarm_topic import AlarmTopicProps
from constructs.endpoint_alarms import AlarmThresholds, EndpointAlarmsProps
from constructs.endpoint_autoscaling import EndpointAutoscalingProps
from constructs.endpoint_dashboard import EndpointDashboardProps
from constructs.endpoint_network import EndpointNetworkProps
from constructs.model_bucket import ModelBucketProps
from constructs.model_build_resource import ModelBuildResourceProps
from constructs.props import (
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
from constructs.rollout_policy import RolloutPolicyProps
from constructs.triton_image import TritonImageProps, load_image_table
from constructs.triton_mme_endpoint import FleetSize, TritonMmeEndpointProps
from model_build.validation_messages import clip

CONTEXT_PREFIX = "mme:"
#: Longest context value read (characters, or JSON characters for a non-string from cdk.json).
MAX_CONTEXT_VALUE_CHARS = 8192
#: The release id format ``model_build.release.compute_release`` produces.
RELEASE_ID_PATTERN = r"^r-[0-9a-f]{16}$"
#: Tag values SageMaker, S3 and the other tagged services accept: letters, digits, spaces and
#: ``_ . : / = + - @`` (the AWS tag value pattern), 1 to 256 characters here, not ``aws:...``.
TAG_VALUE_PATTERN = r"^(?!(?i:aws:))[\w .:/=+\-@]{1,256}$"
P = TypeVar("P", bound=Props)


class SettingsError(ValueError):
    """Settings that cannot give a working deployment; the message says which and why."""


# ---------------------------------------------------------------------------------------------
# The table: context key -> props field
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


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types a field's annotation admits (the members of a union, or the type)."""
    return get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)


def _allows_none(annotation: Any) -> bool:
    return type(None) in _members(annotation)


def nested_props(annotation: Any) -> type[Props] | None:
    """The props class a field holds a value of (``FleetSize``...), if any."""
    found = [each for each in _members(annotation) if isinstance(each, type) and issubclass(each, Props)]
    return found[0] if found else None


def context_name(props: type[Props], path: str) -> str:
    """The name a message shows for a field of ``props`` (``fleet.minimum`` for a nested one):
    ``mme:<key>`` when a setting gives it, the path otherwise."""
    *heads, last = path.split(".")
    for head in heads:
        props = nested_props(props.model_fields[head].annotation) or props
    key = _KEYS.get((props, last))
    return CONTEXT_PREFIX + key if key else path


# ---------------------------------------------------------------------------------------------
# Context values given as strings
# ---------------------------------------------------------------------------------------------


def _context_list(text: str) -> list[Any]:
    if not text:
        return []
    if text.startswith("["):
        try:
            return list(json.loads(text))
        except json.JSONDecodeError as error:
            raise ValueError(f"got {text!r}; expected a JSON array ({error.msg})") from None
    return [item.strip() for item in text.split(",") if item.strip()]


def _context_object(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text else {}
        except json.JSONDecodeError as error:
            raise ValueError(f"got {text!r}; expected a JSON object ({error.msg})") from None
    if not isinstance(value, dict):
        return value
    texts = {True: "true", False: "false"}
    return {
        key: texts[item] if isinstance(item, bool) else str(item) if isinstance(item, (int, float)) else item
        for key, item in value.items()
    }


def from_context_value(value: Any, annotation: Any) -> Any:
    """A context value as the setting's type reads it: ``-c`` gives strings (and ``cdk.json``
    JSON values): ``""``/``none``/``null`` unset an optional setting; a list is a JSON array or
    comma-separated; an object is JSON, its scalar values as strings."""
    kinds = {get_origin(member) or member for member in _members(annotation)}
    if dict in kinds:
        return _context_object(value)
    if not isinstance(value, str):
        return value
    if type(None) in kinds and value.strip().lower() in {"", "none", "null"}:
        return None
    return _context_list(value.strip()) if list in kinds else value


# ---------------------------------------------------------------------------------------------
# The settings
# ---------------------------------------------------------------------------------------------


def _matching(pattern: str, expected: str) -> Any:
    """``Annotated`` metadata of a string setting that must match ``pattern`` (said in words)."""

    def check(value: str) -> str:
        if not re.fullmatch(pattern, value):
            raise ValueError(f"got {value!r}; expected {expected}")
        return value

    return AfterValidator(check)


ReleaseId = Annotated[str, _matching(RELEASE_ID_PATTERN, "a release id as `python -m model_build publish` prints "
                                                       "it: 'r-' and 16 lowercase hex digits")]
TopicArn = Annotated[str, _matching(r"arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}",
                                    "an SNS topic ARN such as arn:aws:sns:eu-west-1:123456789012:alarms")]
VpcId = Annotated[str, _matching(r"vpc-[0-9a-f]{8}([0-9a-f]{9})?", "a VPC id such as vpc-0123456789abcdef0")]
TagValue = Annotated[str, _matching(TAG_VALUE_PATTERN, "1 to 256 letters, digits, spaces and _ . : / = + - @, "
                                                       "not starting with 'aws:'")]


#: The settings whose change replaces the SageMaker Model or EndpointConfig, hence the fleet (a
#: blue/green rollout of every instance): recorded in the routes at each deploy, compared by
#: ``python -m model_build plan``. Nothing that changes with the model set is among them.
FLEET_SETTINGS: tuple[str, ...] = (
    "endpoint_name", "instance_type", "initial_instance_count", "triton_image_version", "shm_default_byte_size",
    "shm_growth_byte_size", "triton_log_verbose", "triton_environment", "model_cache",
    "model_data_download_timeout_seconds", "container_startup_health_check_timeout_seconds", "volume_size_gb",
    "network_isolation", "vpc_id", "create_vpc", "vpc_cidr", "model_prefix", "region",
)


class AppSettings(BaseModel):
    """The settings that are not a construct's props field, with the behaviour of each default.

    :class:`MmeSettings` adds one field per row of :data:`SETTINGS`. Immutable; unknown fields
    are refused. Construct it with :meth:`from_context` to read the ``mme:`` keys of a CDK context.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False)

    stack_name: str = Field(
        default="TritonMme", pattern=r"^[A-Za-z][A-Za-z0-9-]*$", max_length=128, description="Name of the CloudFormation stack."
    )
    account: str | None = Field(
        default=None, pattern=r"^\d{12}$", description="AWS account of the stack; unset: environment-agnostic. Never looked up."
    )
    region: str | None = Field(
        default=None,
        pattern=r"^[a-z]{2}(-[a-z]+)+-\d+$",
        description="AWS region of the stack (must be in the image table); unset: environment-agnostic "
        "(the image mapping covers every listed region).",
    )
    manifest_path: str = Field(
        default="models.yaml",
        description="Models manifest, relative to the project root; its models are built and published by "
        "the stack. Empty: no build resource, the endpoint serves release_id.",
    )
    release_id: ReleaseId | None = Field(
        default=None,
        description="Release to serve when manifest_path is empty (r- and 16 hex digits), published out "
        "of band with `python -m model_build publish`. Refused with a manifest.",
    )
    plan_routes_file: str = Field(
        default="",
        description="A copy of the live routes document (the RoutesUrl output): synth then prints the plan "
        "of this change against it (models added, updated, removed; fleet verdict). Empty: synth prints "
        "the model count and how to run the plan.",
    )
    alarm_topic_enabled: bool = Field(
        default=False,
        description="Create an SNS topic (its own KMS key, TLS-only policy) that every alarm notifies on "
        "ALARM and OK. Implied by alarm_emails.",
    )
    alarm_topic_arn: TopicArn | None = Field(
        default=None,
        description="An existing SNS topic the alarms notify instead of a created one. Its policy (and "
        "key, if encrypted) must let cloudwatch.amazonaws.com publish. Unset: none.",
    )
    vpc_id: VpcId | None = Field(
        default=None,
        description="Place the model in this existing VPC (looked up: needs account and region): its "
        "isolated subnets, else its private ones; it must route S3 itself. Unset: no VPC (the stack "
        "stays environment-agnostic).",
    )
    create_vpc: bool = Field(
        default=False,
        description="Place the model in a new VPC: 2 AZs, isolated subnets only, flow logs, the S3 gateway "
        "endpoint and vpc_interface_endpoints. Exclusive with vpc_id.",
    )
    tag_project: TagValue = Field(default="triton-mme", description="Value of the Project tag on every taggable resource.")
    tag_environment: TagValue = Field(default="dev", description="Value of the Environment tag on every taggable resource.")
    tag_owner: TagValue = Field(
        default="unassigned", description="Value of the Owner tag on every taggable resource (a team or an address)."
    )

    if TYPE_CHECKING:
        # The fields MmeSettings derives from SETTINGS; typed by their props.
        def __getattr__(self, name: str) -> Any: ...

    @field_validator("*", mode="before")
    @classmethod
    def _context_string(cls, value: Any, info: ValidationInfo) -> Any:
        return from_context_value(value, cls.model_fields[info.field_name or ""].annotation)

    # -----------------------------------------------------------------------------------------
    # Combinations
    # -----------------------------------------------------------------------------------------

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        for props in PROPS:
            self._unchecked(props).check(self._namer(props))
        if self.region is not None:
            load_image_table().row(self.triton_image_version).check_region(self.region, f"{CONTEXT_PREFIX}region")
        self._check_release()
        self._check_notifications()
        self._check_network()
        return self

    def _check_release(self) -> None:
        if not self.manifest_path and self.release_id is None:
            raise ValueError(
                "mme:release_id: missing with an empty mme:manifest_path; give the release to serve "
                "(published out of band with `python -m model_build publish`), or a manifest to build"
            )
        if self.manifest_path and self.release_id is not None:
            raise ValueError(
                f"mme:release_id: got {self.release_id!r} with mme:manifest_path {self.manifest_path!r}; "
                "the release of a manifest is computed from it: set mme:manifest_path to '' to serve an "
                "existing release"
            )

    def _check_notifications(self) -> None:
        if self.alarm_topic_arn is not None and (self.alarm_topic_enabled or self.alarm_emails):
            given = "mme:alarm_emails" if self.alarm_emails else "mme:alarm_topic_enabled true"
            raise ValueError(
                f"mme:alarm_topic_arn: got {self.alarm_topic_arn!r} with {given}; the alarms notify "
                "either an existing topic or a created one: drop one of them"
            )

    def _check_network(self) -> None:
        if self.vpc_id is not None and self.create_vpc:
            raise ValueError(
                f"mme:vpc_id: got {self.vpc_id!r} with mme:create_vpc true; place the model in an "
                "existing VPC or in a created one, not both"
            )
        if self.vpc_id is not None and (self.account is None or self.region is None):
            missing = " and ".join(f"mme:{name}" for name in ("account", "region") if getattr(self, name) is None)
            raise ValueError(
                f"mme:vpc_id: got {self.vpc_id!r} without {missing}; an existing VPC is looked up "
                "(ec2.Vpc.from_lookup) in one account and region: set mme:account and mme:region"
            )
        for key, what in (("vpc_cidr", "the range is for a created VPC"),
                          ("vpc_interface_endpoints", "endpoints are only added to a created VPC (an "
                                                      "existing one keeps its own)")):
            if key in self.model_fields_set and not self.create_vpc:
                raise ValueError(f"mme:{key}: got {getattr(self, key)!r} without mme:create_vpc true; {what}")
        if self.build_in_vpc and self.vpc_id is None and not self.create_vpc:
            raise ValueError("mme:build_in_vpc: got true without a VPC; set mme:vpc_id or mme:create_vpc true")
        if self.build_in_vpc and not self.manifest_path:
            raise ValueError(
                "mme:build_in_vpc: got true with an empty mme:manifest_path; there is no build to place in "
                "the VPC (the release is published out of band)"
            )

    # -----------------------------------------------------------------------------------------
    # The props values
    # -----------------------------------------------------------------------------------------

    def fleet(self) -> dict[str, Any]:
        """The values of :data:`FLEET_SETTINGS`, as JSON values (what ``plan`` compares); the image
        version as deployed (unset means the newest of the table this synth reads)."""
        values = {key: json.loads(json.dumps(getattr(self, key), default=str)) for key in FLEET_SETTINGS}
        values["triton_image_version"] = load_image_table().row(self.triton_image_version).version
        return values

    def values(self, props: type[Props]) -> dict[str, Any]:
        """The fields of ``props`` the settings give, as the props take them: each field a setting
        maps onto (converted), and each field holding a props value that settings give whole
        (``FleetSize``, ``AlarmThresholds``). The stack adds the resources."""
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

    @staticmethod
    def _namer(props: type[Props]) -> Namer:
        return lambda path: context_name(props, path)

    # -----------------------------------------------------------------------------------------
    # Construction from the CDK context
    # -----------------------------------------------------------------------------------------

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> Self:
        """Read every ``mme:<name>`` key of a CDK context; other keys are ignored.

        A key that looks meant for this app but is not a known setting (``mme:instace_type``,
        ``MME:...``, ``mme.x``) is refused, never ignored: a typo would otherwise deploy the
        default silently. A value longer than :data:`MAX_CONTEXT_VALUE_CHARS` (as given or as
        JSON) is refused before it is parsed.
        """
        values: dict[str, Any] = {}
        known = list(cls.model_fields)
        listing = ", ".join(CONTEXT_PREFIX + field for field in known)
        for key, value in context.items():
            key = str(key)
            if not key.startswith(CONTEXT_PREFIX):
                if re.match(r"^mme\W", key, re.IGNORECASE) or key.lower().startswith(CONTEXT_PREFIX):
                    raise SettingsError(
                        f"{clip(key)}: looks like a setting of this app but does not start with "
                        f"{CONTEXT_PREFIX!r}; known settings: {listing}"
                    )
                continue
            name = key[len(CONTEXT_PREFIX):]
            size = len(value) if isinstance(value, str) else len(json.dumps(value, default=str))
            if size > MAX_CONTEXT_VALUE_CHARS:
                raise SettingsError(f"{clip(key)}: got a value of {size} characters; at most {MAX_CONTEXT_VALUE_CHARS}")
            if name not in cls.model_fields:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean {CONTEXT_PREFIX}{close[0]}? " if close else ""
                raise SettingsError(f"{clip(key)}: unknown setting; {hint}known settings: {listing}")
            values[name] = value
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            raise SettingsError(format_errors(error, CONTEXT_PREFIX)) from None


if TYPE_CHECKING:
    MmeSettings = AppSettings
else:
    #: The settings model: :class:`AppSettings` and one field per row of :data:`SETTINGS`.
    MmeSettings = create_model(
        "MmeSettings",
        __base__=AppSettings,
        __module__=__name__,
        **{key: setting.model_field() for key, setting in SETTINGS.items()},
    )
