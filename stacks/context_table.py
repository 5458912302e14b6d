"""The table behind the app's settings: each ``mme:<key>`` context key that is a construct's props
field (:data:`SETTINGS`: key -> props class, field, conversion), the name a message shows for a
props field (``mme:<key>``, :func:`context_name`), and how a context value given with ``-c``
(a string) or in ``cdk.json`` reads as a field's type (:func:`from_context_value`).

:class:`stacks.settings.MmeSettings` is derived from this table.
"""

from __future__ import annotations

import json
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from aws_cdk import RemovalPolicy
from pydantic import Field

from triton_mme_cdk.constructs.alarm_topic import AlarmTopicProps
from triton_mme_cdk.constructs.endpoint_alarms import AlarmThresholds, EndpointAlarmsProps
from triton_mme_cdk.constructs.endpoint_autoscaling import EndpointAutoscalingProps
from triton_mme_cdk.constructs.endpoint_dashboard import EndpointDashboardProps
from triton_mme_cdk.constructs.endpoint_network import EndpointNetworkProps
from triton_mme_cdk.constructs.model_bucket import ModelBucketProps
from triton_mme_cdk.constructs.model_build_resource import ModelBuildResourceProps
from triton_mme_cdk.constructs.props import DAYS, MEBIBYTES, MINUTES, SECONDS, Between, Props, Unit
from triton_mme_cdk.constructs.rollout_policy import RolloutPolicyProps
from triton_mme_cdk.constructs.triton_image import TritonImageProps
from triton_mme_cdk.constructs.triton_mme_endpoint import FleetSize, TritonMmeEndpointProps

CONTEXT_PREFIX = "mme:"


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
