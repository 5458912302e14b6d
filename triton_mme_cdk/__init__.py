"""triton-mme-cdk: NVIDIA Triton models on an Amazon SageMaker multi-model GPU endpoint, as CDK
constructs, with the build that turns model sources into Triton artifacts in S3.

The public names, re-exported here and nowhere defined here::

    from triton_mme_cdk import TritonMultiModelEndpoint, ModelSource, TritonMmeClientLayer

They load on first use: importing the package starts no jsii runtime, so the model build (the
build Lambda's image, ``triton-mme``) can import ``triton_mme_cdk.model_build`` without the CDK.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from triton_mme_cdk.constructs.client_layer import TritonMmeClientLayer
    from triton_mme_cdk.constructs.endpoint_import import ITritonMultiModelEndpoint
    from triton_mme_cdk.constructs.endpoint_settings import SETTING_NAMES, EndpointSettings
    from triton_mme_cdk.constructs.multi_model_endpoint import ModelSource, TritonMultiModelEndpoint
    from triton_mme_cdk.constructs.sagemaker_limits import PropsError
    from triton_mme_cdk.model_build.errors import ManifestError, ModelBuildError
    from triton_mme_cdk.stacks.triton_mme_stack import TritonMmeStack

#: Public name -> the module that defines it.
_EXPORTS = {
    "TritonMultiModelEndpoint": "triton_mme_cdk.constructs.multi_model_endpoint",
    "ModelSource": "triton_mme_cdk.constructs.multi_model_endpoint",
    "ITritonMultiModelEndpoint": "triton_mme_cdk.constructs.endpoint_import",
    "TritonMmeClientLayer": "triton_mme_cdk.constructs.client_layer",
    "EndpointSettings": "triton_mme_cdk.constructs.endpoint_settings",
    "SETTING_NAMES": "triton_mme_cdk.constructs.endpoint_settings",
    "PropsError": "triton_mme_cdk.constructs.sagemaker_limits",
    "ManifestError": "triton_mme_cdk.model_build.errors",
    "ModelBuildError": "triton_mme_cdk.model_build.errors",
    "TritonMmeStack": "triton_mme_cdk.stacks.triton_mme_stack",
}

__all__ = [
    "SETTING_NAMES",
    "EndpointSettings",
    "ITritonMultiModelEndpoint",
    "ManifestError",
    "ModelBuildError",
    "ModelSource",
    "PropsError",
    "TritonMmeClientLayer",
    "TritonMmeStack",
    "TritonMultiModelEndpoint",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
