"""SageMaker API limits and Triton container facts shared by the constructs and the settings.

Each number names where it comes from (the botocore service model ``sagemaker/2017-07-24``, the
SageMaker developer guide for multi-model endpoints, the Triton server's ``docker/sagemaker/serve``
script) so that it can be re-checked. Constructs validate their props against these values early
(at construction, before anything is synthesized) and raise :class:`PropsError`.

This module lives in the ``constructs`` namespace package (no ``__init__.py``: see the README);
its name must never collide with a module of the ``constructs`` library.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from aws_cdk import Token


class PropsError(ValueError):
    """A construct was given a value it cannot deploy.

    The message names the prop, the value given and what is allowed, so that the CDK app can print
    it alone (no traceback).
    """


# ---------------------------------------------------------------------------------------------
# Names (botocore: EndpointName, ModelName, EndpointConfigName)
# ---------------------------------------------------------------------------------------------

NAME_MAX_LENGTH = 63
NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"

# ---------------------------------------------------------------------------------------------
# Instance types (developer guide: "Supported algorithms, frameworks, and instances for
# multi-model endpoints": GPU instances, Triton containers only; one GPU each)
# ---------------------------------------------------------------------------------------------

_SIZES = ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")
MME_GPU_INSTANCE_TYPES: tuple[str, ...] = (
    *(f"ml.g4dn.{size}" for size in _SIZES),
    *(f"ml.g5.{size}" for size in _SIZES),
    "ml.p2.xlarge",
    "ml.p3.2xlarge",
)
#: Families whose ML storage is a local NVMe instance store: CreateEndpointConfig refuses both
#: ``VolumeSizeInGB`` and ``KmsKeyId`` for them (the local volume is encrypted by the hardware).
INSTANCE_STORAGE_FAMILIES: frozenset[str] = frozenset({"ml.g4dn", "ml.g5"})


def instance_family(instance_type: str) -> str:
    """``ml.g5.2xlarge`` -> ``ml.g5``."""
    return instance_type.rsplit(".", 1)[0]


def has_instance_storage(instance_type: str) -> bool:
    """True for instance-store families (g4dn, g5): no ``VolumeSizeInGB``, no ``KmsKeyId``."""
    return instance_family(instance_type) in INSTANCE_STORAGE_FAMILIES


# ---------------------------------------------------------------------------------------------
# ProductionVariant and container limits (botocore)
# ---------------------------------------------------------------------------------------------

TIMEOUT_MIN_SECONDS = 60
TIMEOUT_MAX_SECONDS = 3600
VOLUME_SIZE_MIN_GB = 1
VOLUME_SIZE_MAX_GB = 512
MODEL_CACHE_SETTINGS: tuple[str, ...] = ("Enabled", "Disabled")
ENVIRONMENT_MAX_ENTRIES = 100
ENVIRONMENT_KEY_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
ENVIRONMENT_KEY_MAX_LENGTH = 1024
ENVIRONMENT_VALUE_MAX_LENGTH = 1024
MODEL_DATA_URL_MAX_LENGTH = 1024
MODEL_DATA_URL_PATTERN = r"^(https|s3)://([^/]+)/?(.*)$"

# ---------------------------------------------------------------------------------------------
# Triton container environment (triton-inference-server/server docker/sagemaker/serve)
# ---------------------------------------------------------------------------------------------

SHM_DEFAULT_BYTE_SIZE_KEY = "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE"
SHM_GROWTH_BYTE_SIZE_KEY = "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE"
LOG_VERBOSE_KEY = "SAGEMAKER_TRITON_LOG_VERBOSE"
#: Keys the construct sets from its own typed props; they cannot be given as extra environment.
TRITON_TYPED_KEYS: frozenset[str] = frozenset(
    {SHM_DEFAULT_BYTE_SIZE_KEY, SHM_GROWTH_BYTE_SIZE_KEY, LOG_VERBOSE_KEY}
)
#: Documented keys that may be given as extra environment (the serve script and the server
#: binary read them; every one is optional).
TRITON_EXTRA_KEYS: frozenset[str] = frozenset(
    {
        "SAGEMAKER_TRITON_LOG_INFO",
        "SAGEMAKER_TRITON_LOG_WARNING",
        "SAGEMAKER_TRITON_LOG_ERROR",
        "SAGEMAKER_TRITON_THREAD_COUNT",
        "SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT",
        "SAGEMAKER_TRITON_PING_MODE",
        "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT",
        "SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING",
        "SAGEMAKER_TRITON_ALLOW_GRPC",
        "SAGEMAKER_TRITON_GRPC_PORT",
        "SAGEMAKER_TRITON_ALLOW_METRICS",
        "SAGEMAKER_TRITON_METRICS_PORT",
        "SAGEMAKER_TRITON_TENSORFLOW_VERSION",
        "SAGEMAKER_TRITON_INFERENCE_TYPE",
        "SAGEMAKER_TRITON_ADDITIONAL_ARGS",
    }
)
#: Keys that only make sense on a single-model endpoint.
TRITON_SINGLE_MODEL_KEYS: frozenset[str] = frozenset({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"})
#: Keys whose value is one of a fixed set.
TRITON_ENUM_VALUES: Mapping[str, tuple[str, ...]] = {
    "SAGEMAKER_TRITON_PING_MODE": ("ready", "live"),
    "SAGEMAKER_TRITON_INFERENCE_TYPE": ("infer", "generate", "generate_stream"),
}

# ---------------------------------------------------------------------------------------------
# CloudWatch (developer guide: "Monitor multi-model endpoints using CloudWatch metrics")
# ---------------------------------------------------------------------------------------------

INVOCATION_NAMESPACE = "AWS/SageMaker"
INSTANCE_NAMESPACE = "/aws/sagemaker/Endpoints"

# ---------------------------------------------------------------------------------------------
# Endpoint deployment (botocore: DeploymentConfig, BlueGreenUpdatePolicy, TrafficRoutingConfig,
# CapacitySize, AutoRollbackConfig; the CloudFormation schema of AWS::SageMaker::Endpoint)
# ---------------------------------------------------------------------------------------------

TRAFFIC_ROUTING_TYPES: tuple[str, ...] = ("ALL_AT_ONCE", "CANARY", "LINEAR")
CAPACITY_SIZE_TYPES: tuple[str, ...] = ("INSTANCE_COUNT", "CAPACITY_PERCENT")
#: TrafficRoutingConfig.WaitIntervalInSeconds (required by the API) and
#: BlueGreenUpdatePolicy.TerminationWaitInSeconds.
WAIT_INTERVAL_MIN_SECONDS = 0
WAIT_INTERVAL_MAX_SECONDS = 3600
TERMINATION_WAIT_MIN_SECONDS = 0
TERMINATION_WAIT_MAX_SECONDS = 3600
#: BlueGreenUpdatePolicy.MaximumExecutionTimeoutInSeconds; it "should be larger than the total
#: waiting time specified in TerminationWaitInSeconds and WaitIntervalInSeconds".
MAX_EXECUTION_TIMEOUT_MIN_SECONDS = 600
MAX_EXECUTION_TIMEOUT_MAX_SECONDS = 28800
#: CapacitySize.Value >= 1. CanarySize: "less than or equal to 50% of the variant's total
#: instance count"; LinearStepSize: "10-50% of the variant's total instance count".
CANARY_MAX_PERCENT = 50
LINEAR_MIN_PERCENT = 10
LINEAR_MAX_PERCENT = 50
#: AutoRollbackConfig.Alarms: 1 to 10 alarm names (AlarmName: 1 to 255 characters).
ROLLBACK_ALARMS_MIN = 1
ROLLBACK_ALARMS_MAX = 10
ALARM_NAME_MAX_LENGTH = 255


def check_traffic_routing(
    *,
    traffic: str,
    size_type: str | None,
    size: int | None,
    min_instances: int,
    max_instances: int,
    prefix: str = "",
) -> None:
    """A blue/green traffic shift SageMaker accepts for a variant of ``min_instances`` to
    ``max_instances`` instances (autoscaling decides the count at deployment time, so an
    instance-count step must fit every count in that range).

    ``prefix`` is put before each prop name (``mme:`` for settings)."""
    name = f"{prefix}rollout_size"
    if traffic not in TRAFFIC_ROUTING_TYPES:
        raise PropsError(
            f"{prefix}rollout_traffic: got {traffic!r}; expected one of " + ", ".join(TRAFFIC_ROUTING_TYPES)
        )
    if traffic == "ALL_AT_ONCE":
        if size is not None:
            raise PropsError(
                f"{name}: got {size} with {prefix}rollout_traffic ALL_AT_ONCE; a size is for CANARY "
                "or LINEAR only: leave it unset"
            )
        return
    if size is None:
        raise PropsError(
            f"{name}: missing with {prefix}rollout_traffic {traffic}; give the "
            + ("canary" if traffic == "CANARY" else "linear step")
            + " size (with rollout_size_type INSTANCE_COUNT or CAPACITY_PERCENT)"
        )
    if size_type not in CAPACITY_SIZE_TYPES:
        raise PropsError(
            f"{prefix}rollout_size_type: got {size_type!r}; expected one of " + ", ".join(CAPACITY_SIZE_TYPES)
        )
    if size < 1:
        raise PropsError(f"{name}: got {size}; expected at least 1")
    if size_type == "CAPACITY_PERCENT":
        low = 1 if traffic == "CANARY" else LINEAR_MIN_PERCENT
        high = CANARY_MAX_PERCENT if traffic == "CANARY" else LINEAR_MAX_PERCENT
        if not low <= size <= high:
            raise PropsError(
                f"{name}: got {size} percent with {prefix}rollout_traffic {traffic}; expected {low} to "
                f"{high} percent of the variant's instances"
            )
        return
    # INSTANCE_COUNT: at most half of the smallest fleet; a linear step at least a tenth of the
    # largest one.
    most = min_instances // 2
    if size > most:
        raise PropsError(
            f"{name}: got {size} instances with {prefix}rollout_traffic {traffic} and "
            f"{prefix}min_instance_count {min_instances}; a {traffic.lower()} step may be at most 50% "
            f"of the variant's instances, so at most {most} here"
            + (" (none: use CAPACITY_PERCENT, ALL_AT_ONCE, or min_instance_count >= 2)" if most == 0 else "")
        )
    if traffic == "LINEAR" and size * 100 < LINEAR_MIN_PERCENT * max_instances:
        least = -(-LINEAR_MIN_PERCENT * max_instances // 100)
        raise PropsError(
            f"{name}: got {size} instances with {prefix}rollout_traffic LINEAR and "
            f"{prefix}max_instance_count {max_instances}; a linear step must be at least 10% of the "
            f"variant's instances, so at least {least} here"
        )


# ---------------------------------------------------------------------------------------------
# Checks shared by the constructs. Values that are unresolved tokens are not checked.
# ---------------------------------------------------------------------------------------------


def _given(value: object) -> bool:
    """A value to check: neither ``None`` nor an unresolved token."""
    return value is not None and not Token.is_unresolved(value)


def check_range(prop: str, value: float | None, low: float, high: float, unit: str = "") -> None:
    """Raise :class:`PropsError` unless ``low <= value <= high`` (tokens and ``None`` pass)."""
    if value is None or not _given(value):
        return
    suffix = f" {unit}" if unit else ""
    if not low <= value <= high:
        raise PropsError(f"{prop}: got {value:g}{suffix}; expected {low:g} to {high:g}{suffix}")


def check_name(prop: str, value: str | None) -> None:
    """A SageMaker resource name: at most 63 characters, ``[a-zA-Z0-9](-*[a-zA-Z0-9])*``."""
    if value is None or not _given(value):
        return
    if len(value) > NAME_MAX_LENGTH or not re.fullmatch(NAME_PATTERN, value):
        raise PropsError(
            f"{prop}: got {value!r}; expected 1 to {NAME_MAX_LENGTH} letters, digits and single "
            "hyphens, starting and ending with a letter or digit"
        )


def check_instance_type(prop: str, value: str) -> None:
    """One of the documented GPU multi-model instance types."""
    if not _given(value):
        return
    if value not in MME_GPU_INSTANCE_TYPES:
        raise PropsError(
            f"{prop}: got {value!r}; a GPU multi-model endpoint runs on one of "
            + ", ".join(MME_GPU_INSTANCE_TYPES)
        )
