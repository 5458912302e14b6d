"""The team's Lambda function: call a model of the endpoint by its logical name.

The event names the model and gives its inputs as JSON (nested lists; strings for a text input)::

    {"model": "minilm-l6-text", "inputs": {"TEXT": [["first text"], ["second"]]}}

and the answer is every output as nested lists. The client (``triton_mme_client``) and numpy come
from the layer (``TritonMmeClientLayer``); the endpoint's name and routes document from the
environment that ``connect_client`` sets. The client resolves the name through the routes (read
again at most every 30 s), checks the inputs against the model's signature before any call, and
retries what is transient.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from triton_mme_client import TritonMmeClient, TritonMmeError

#: JSON numbers arrive as float64; a model input of these types takes them at its own precision.
FLOAT_INPUTS = {"FP32": np.float32, "FP16": np.float16}

client = TritonMmeClient.from_env()


def _arrays(model: str, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    info = client.models().get(model)
    datatypes = {spec.name: spec.datatype for spec in info.signature.inputs} if info and info.signature else {}
    arrays = {}
    for name, value in inputs.items():
        array = np.asarray(value)
        cast = FLOAT_INPUTS.get(datatypes.get(name, ""))
        arrays[name] = array.astype(cast) if cast is not None and array.dtype.kind == "f" else array
    return arrays


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def handler(event: dict[str, Any], context: object) -> dict[str, Any]:
    model = event.get("model")
    inputs = event.get("inputs")
    if not isinstance(model, str) or not isinstance(inputs, dict):
        return {"error": 'expected {"model": "<logical name>", "inputs": {"<input>": [...]}}'}
    try:
        outputs = client.infer(model, _arrays(model, inputs))
    except TritonMmeError as error:  # ModelNotFound, InvalidInput, ModelError, EndpointError
        return {"error": str(error), "kind": type(error).__name__}
    return {"model": model, "outputs": {name: _plain(array.tolist()) for name, array in outputs.items()}}
