"""SageMaker API limits and Triton container facts shared by the constructs and the settings.

Each number names where it comes from (the botocore service model ``sagemaker/2017-07-24``, the
SageMaker developer guide for multi-model endpoints, the Triton server's ``docker/sagemaker/serve``
script) so that it can be re-checked. The constructs' props (``constructs/props.py``) are typed with
these values and refuse anything else with :class:`PropsError`, when they are built.

This module lives in the ``constructs`` namespace package (no ``__init__.py``: see docs/architecture.md, "Layout");
its name must never collide with a module of the ``constructs`` library.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator


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


def _sagemaker_name(value: str) -> str:
    if len(value) > NAME_MAX_LENGTH or not re.fullmatch(NAME_PATTERN, value):
        raise ValueError(
            f"got {value!r}; expected 1 to {NAME_MAX_LENGTH} letters, digits and single hyphens, "
            "starting and ending with a letter or digit"
        )
    return value


#: A SageMaker resource name (a props field type).
SageMakerName = Annotated[str, AfterValidator(_sagemaker_name)]

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


def _instance_type(value: Any) -> Any:
    if value not in MME_GPU_INSTANCE_TYPES:
        raise ValueError(
            f"got {value!r}; a GPU multi-model endpoint runs on one of " + ", ".join(MME_GPU_INSTANCE_TYPES)
        )
    return value


#: One of :data:`MME_GPU_INSTANCE_TYPES` (a props field type).
InstanceType = Annotated[str, BeforeValidator(_instance_type)]
#: ``ProductionVariant.InferenceAmiVersion`` (botocore's ``ProductionVariantInferenceAmiVersion``):
#: the host image, and with it the NVIDIA driver and CUDA (model_build/gpu_hosts.py).
InferenceAmiVersion = Literal[
    "al2-ami-sagemaker-inference-gpu-2",
    "al2-ami-sagemaker-inference-gpu-2-1",
    "al2-ami-sagemaker-inference-gpu-3-1",
    "al2023-ami-sagemaker-inference-gpu-4-1",
    "al2-ami-sagemaker-inference-neuron-2",
]


# ---------------------------------------------------------------------------------------------
# ProductionVariant and container limits (botocore)
# ---------------------------------------------------------------------------------------------

TIMEOUT_MIN_SECONDS = 60
TIMEOUT_MAX_SECONDS = 3600
VOLUME_SIZE_MIN_GB = 1
VOLUME_SIZE_MAX_GB = 512
ModelCacheSetting = Literal["Enabled", "Disabled"]
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

TrafficRoutingType = Literal["ALL_AT_ONCE", "CANARY", "LINEAR"]
CapacitySizeType = Literal["INSTANCE_COUNT", "CAPACITY_PERCENT"]
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
