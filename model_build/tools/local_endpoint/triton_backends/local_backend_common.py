"""What the python-based ``onnxruntime`` and ``pytorch`` backends share: config parsing and batching.

Copied next to each backend's ``model.py`` when the local endpoint assembles its backends folder;
it runs in the python backend's stub, so it imports nothing from the project.
"""

from __future__ import annotations

import json
import os

#: Triton's ``ParseBoolValue`` (backend common): case-insensitive.
_TRUE = {"true", "on", "1"}
_FALSE = {"false", "off", "0"}


class ConfigError(ValueError):
    """A config value the real backend refuses at load; its message names the key and value."""


def parameters(config: dict) -> dict[str, str]:
    return {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}


def parse_bool(key: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"failed to convert '{value}' to boolean value for parameter '{key}'")


def parse_int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"failed to convert '{value}' to integral value for parameter '{key}'") from None


def model_path(args: dict, config: dict, default_name: str) -> str:
    """``<model>/<version>/<default_model_filename>``, as the C++ backends open it."""
    name = config.get("default_model_filename") or default_name
    return os.path.join(args["model_repository"], str(args["model_version"]), name)


def load_args(args: dict) -> dict:
    return json.loads(args["model_config"])


def execute(pb_utils, requests: list, inputs: list[str], outputs: list[str], run, *, batched: bool) -> list:
    """Answer ``requests`` with ``run(feeds) -> [arrays in outputs order]``, as the C++ backends do.

    Triton's dynamic batcher hands several requests to one ``execute``; one model run over their
    inputs concatenated along the batch axis is what makes dynamic batching pay off. Models with
    ``max_batch_size: 0`` run request by request (their first axis is not a batch). A failed run
    fails each request it served, with the error's text; the model stays loaded.
    """
    import numpy as np

    def answer(arrays):
        tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in zip(outputs, arrays, strict=True)]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def failed(error):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error)))

    def feeds(request):
        return {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in inputs}

    if batched and len(requests) > 1:
        try:
            per_request = [feeds(request) for request in requests]
            merged = {name: np.concatenate([f[name] for f in per_request], axis=0) for name in inputs}
            results = run(merged)
        except Exception as error:
            return [failed(error) for _ in requests]
        bounds = np.cumsum([f[inputs[0]].shape[0] for f in per_request])[:-1]
        pieces = [np.split(result, bounds, axis=0) for result in results]
        return [answer([piece[i] for piece in pieces]) for i in range(len(requests))]
    responses = []
    for request in requests:
        try:
            responses.append(answer(run(feeds(request))))
        except Exception as error:
            responses.append(failed(error))
    return responses


def kind_is_gpu(args: dict) -> bool:
    """Whether Triton placed this instance on a GPU (``KIND_GPU``, or ``KIND_AUTO`` with one present).

    The local endpoint keeps ``KIND_GPU`` only when it serves on a GPU (``localize_configs``); on
    CPU it has rewritten every group to ``KIND_CPU`` before the load.
    """
    return args.get("model_instance_kind") == "GPU"


def device_id(args: dict) -> int:
    """The GPU Triton gave this instance (``model_instance_device_id``; 0 when absent)."""
    return parse_int("model_instance_device_id", str(args.get("model_instance_device_id", "0") or "0"))
