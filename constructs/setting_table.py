"""The table of an endpoint's settings: each context key (``mme:<key>``) onto the props field it
sets, with the conversion of a context value into the prop's value and the construct's keyword
where it is not the key (a time is a ``Duration``, an amount of memory or storage a ``Size``, named
without a unit). :mod:`~triton_mme_cdk.constructs.endpoint_settings` reads it for the construct,
``stacks/settings.py`` for the app. (A module of the ``constructs`` namespace package: its name is
no module of the ``constructs`` library.)
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from aws_cdk import RemovalPolicy
from aws_cdk import aws_iam as iam
from pydantic import Field

from triton_mme_cdk.constructs.alarm_topic import AlarmTopicProps
from triton_mme_cdk.constructs.endpoint_alarms import AlarmThresholds, EndpointAlarmsProps
from triton_mme_cdk.constructs.endpoint_autoscaling import EndpointAutoscalingProps
from triton_mme_cdk.constructs.endpoint_dashboard import EndpointDashboardProps
from triton_mme_cdk.constructs.endpoint_network import EndpointNetworkProps
from triton_mme_cdk.constructs.model_bucket import ModelBucketProps
from triton_mme_cdk.constructs.model_build_resource import ModelBuildResourceProps
from triton_mme_cdk.constructs.props import (
    BYTES,
    DAYS,
    GIBIBYTES,
    MEBIBYTES,
    MILLISECONDS,
    MINUTES,
    SECONDS,
    Between,
    Props,
    Unit,
    is_unresolved,
)
from triton_mme_cdk.constructs.rollout_policy import RolloutPolicyProps
from triton_mme_cdk.constructs.sagemaker_hosting import FleetSize, SageMakerHostingProps
from triton_mme_cdk.constructs.triton_image import TritonImageProps

# ---------------------------------------------------------------------------------------------
# The table: context key -> props field (and the construct's keyword)
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
    :class:`Choice`, a name of the prop's value. A key whose name ends in a unit (``_seconds``,
    ``_mb``...: :data:`UNIT_SUFFIXES`) is a ``Duration`` or ``Size`` keyword of the construct,
    named without it (:func:`keyword`), also where the prop is a number of that unit.
    """

    props: type[Props]
    field: str
    convert: Unit | Choice | None = None
    also: tuple[tuple[type[Props], str], ...] = ()

    @property
    def targets(self) -> tuple[tuple[type[Props], str], ...]:
        return ((self.props, self.field), *self.also)

    def prop_value(self, value: Any) -> Any:
        """A context value as the prop takes it."""
        if value is None or self.convert is None:
            return value
        if isinstance(self.convert, Choice):
            return self.convert.values[value]
        return self.convert.make(value)

    def model_field(self) -> tuple[Any, Any]:
        """The context's type and ``Field``, from the props field's (converted)."""
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


def whole(amount: Any) -> Any:
    """A number read from a ``Duration`` or ``Size``: an ``int`` when it is whole."""
    return int(amount) if not is_unresolved(amount) and float(amount).is_integer() else amount


def principal_arns(publishers: Sequence[iam.IGrantable]) -> list[str]:
    """The ARN of each publisher's principal (a role or user)."""
    return [arn for each in publishers for arn in each.grant_principal.policy_fragment.principal_json.get("AWS", [])]


#: Every setting that is a props field, by context key, in the order docs/settings.md lists them.
SETTINGS: dict[str, Setting] = {
    # Endpoint and autoscaling
    "endpoint_name": Setting(SageMakerHostingProps, "endpoint_name"),
    "instance_type": Setting(SageMakerHostingProps, "instance_type"),
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
    "inference_ami_version": Setting(SageMakerHostingProps, "inference_ami_version"),
    "shm_default_byte_size": Setting(SageMakerHostingProps, "shm_default_byte_size"),
    "shm_growth_byte_size": Setting(SageMakerHostingProps, "shm_growth_byte_size"),
    "triton_log_verbose": Setting(SageMakerHostingProps, "log_verbose"),
    "triton_environment": Setting(SageMakerHostingProps, "environment"),
    "model_cache": Setting(SageMakerHostingProps, "model_cache_setting"),
    "model_data_download_timeout_seconds": Setting(SageMakerHostingProps, "model_data_download_timeout", SECONDS),
    "container_startup_health_check_timeout_seconds": Setting(
        SageMakerHostingProps, "container_startup_health_check_timeout", SECONDS
    ),
    "volume_size_gb": Setting(SageMakerHostingProps, "volume_size_gb"),
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
    "network_isolation": Setting(SageMakerHostingProps, "enable_network_isolation"),
    "vpc_cidr": Setting(EndpointNetworkProps, "cidr"),
    "vpc_interface_endpoints": Setting(EndpointNetworkProps, "interface_endpoints"),
    "build_in_vpc": Setting(EndpointNetworkProps, "build_access"),
}
#: The unit a context key's name ends in: the key is a ``Duration`` or ``Size`` keyword of the
#: construct, named without it.
UNIT_SUFFIXES: dict[str, Unit] = {"_seconds": SECONDS, "_minutes": MINUTES, "_days": DAYS, "_ms": MILLISECONDS,
                                  "_mb": MEBIBYTES, "_gb": GIBIBYTES, "_byte_size": BYTES}


def unit_of(key: str) -> Unit | None:
    """The unit of a context key whose number the construct takes as a ``Duration`` or ``Size``."""
    return next((unit for suffix, unit in UNIT_SUFFIXES.items() if key.endswith(suffix)), None)


def keyword(key: str) -> str:
    """The construct's name of the context key ``key``: ``build_query_interval`` for
    ``build_query_interval_seconds``, ``shm_default_size`` for ``shm_default_byte_size``."""
    suffix = next((suffix for suffix in UNIT_SUFFIXES if key.endswith(suffix)), None)
    if suffix is None:
        return key
    return key.removesuffix(suffix) + ("_size" if suffix.endswith("_size") else "")


def keyword_value(key: str, value: Any) -> Any:
    """A context value as the construct's keyword takes it (the app's adapter: a number of the
    key's unit as a ``Duration`` or ``Size``; publishers aside, which need a scope)."""
    unit = unit_of(key)
    return value if value is None or unit is None else unit.make(value)


def from_keyword(key: str, value: Any) -> Any:
    """A keyword's value as the prop takes it."""
    setting, unit = SETTINGS[key], unit_of(key)
    if value is None:
        return value
    if unit is not None and setting.convert is None:  # the prop is a number of the unit
        return whole(unit.read(value))
    if isinstance(setting.convert, Choice):
        return setting.convert.values[value]
    return principal_arns(value) if key == "model_publishers" else value


#: The construct's keyword of each context key (the key itself unless it has a unit in its name).
KEYWORDS: dict[str, str] = {key: keyword(key) for key in SETTINGS}
for _key, _setting in SETTINGS.items():  # a converted number is in the unit its name says
    if isinstance(_setting.convert, Unit) and _setting.convert is not unit_of(_key):
        raise AssertionError(f"{_key}: converted from {_setting.convert.symbol}, named for another unit")
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


def setting_name(props: type[Props], path: str, prefix: str = "", *, keyword: bool = False) -> str:
    """The name a message shows for a field of ``props`` (``fleet.minimum`` for a nested one): the
    setting that gives it (``min_instance_count``, after ``prefix``: ``mme:`` in the app's context;
    the construct's name with ``keyword``), the path otherwise."""
    *heads, last = path.split(".")
    for head in heads:
        props = nested_props(props.model_fields[head].annotation) or props
    key = _KEYS.get((props, last))
    return prefix + (KEYWORDS[key] if keyword else key) if key else path
