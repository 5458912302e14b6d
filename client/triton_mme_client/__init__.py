"""triton-mme-client: call the models of a Triton multi-model SageMaker endpoint by their names.

::

    from triton_mme_client import TritonMmeClient
    client = TritonMmeClient.from_env()
    vectors = client.infer("minilm-l6-text", {"TEXT": texts})["sentence_embedding"]

Its dependencies are boto3 and numpy. It owns the routes document's format
(:mod:`triton_mme_client.routes`), which triton-mme-cdk's build imports from here.
"""

from triton_mme_client.client import (
    ENV_ENDPOINT_NAME,
    ENV_REFRESH_SECONDS,
    ENV_ROUTES_URL,
    ModelInfo,
    TritonMmeClient,
)
from triton_mme_client.errors import (
    ConfigurationError,
    EndpointError,
    InvalidInput,
    ModelError,
    ModelNotFound,
    RoutesError,
    TritonMmeError,
)
from triton_mme_client.routes import Route, RouteResolver, Routes
from triton_mme_client.signatures import Signature, TensorSpec

__version__ = "0.1.0"

__all__ = [
    "ENV_ENDPOINT_NAME",
    "ENV_REFRESH_SECONDS",
    "ENV_ROUTES_URL",
    "ConfigurationError",
    "EndpointError",
    "InvalidInput",
    "ModelError",
    "ModelInfo",
    "ModelNotFound",
    "Route",
    "RouteResolver",
    "Routes",
    "RoutesError",
    "Signature",
    "TensorSpec",
    "TritonMmeClient",
    "TritonMmeError",
]
