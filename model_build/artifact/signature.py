"""A config against its graph: the graph's tensors, and the check that a config names each of them
with its data type and dims.

``onnx_signature`` reads an ONNX file's inputs and outputs with ``onnx.load`` (graph only, no
weights, no session); ``check_signature`` refuses a config whose tensors are not the graph's, as
the onnxruntime backend does when it loads the model. Used by the gate (ONNX files) and by
:mod:`model_build.artifact.backend` (a session's or a TorchScript module's tensors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.artifact.triton_config import ModelConfig, wire_datatype
from triton_mme_cdk.model_build.artifact.triton_config import mc as _mc
from triton_mme_cdk.model_build.errors import VerifyError

#: One graph tensor: name, wire data type (``FP32``...), shape (``-1`` or a name where variable).
GraphTensor = tuple[str, str, list[Any]]


def check_signature(config: ModelConfig, model: str, what: str, inputs: list[GraphTensor],
                    outputs: list[GraphTensor]) -> None:
    """Refuse a config whose tensors are not the graph's: name, data type, dims (batch axis aside).

    The onnxruntime backend makes the same checks when it loads the model (``ValidateInputs`` /
    ``ValidateOutputs`` of ``onnxruntime_backend``); each refusal names the model, the config field,
    its value and what the graph has.
    """
    for kind, graph_side, config_side in (("input", inputs, config.input), ("output", outputs, config.output)):
        graph = {name: wire for name, wire, _ in graph_side}
        shapes = {name: list(shape)[1 if config.max_batch_size > 0 else 0:] for name, _, shape in graph_side}
        for io in config_side:
            if io.name not in graph:
                raise VerifyError(
                    f"model {model!r}: config {kind} {io.name!r}: name not in the {what}; allowed: the "
                    f"graph's {kind}s " + ", ".join(repr(n) for n in sorted(graph)),
                    model=model,
                )
            if graph[io.name] != wire_datatype(io.data_type):
                raise VerifyError(
                    f"model {model!r}: config {kind} {io.name!r}: data_type "
                    f"{_mc.DataType.Name(io.data_type)}; the {what} has {graph[io.name]} "
                    f"(allowed: TYPE_{graph[io.name].replace('BYTES', 'STRING')})",
                    model=model,
                )
            dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
            shape = shapes[io.name]
            if len(dims) != len(shape) or any(isinstance(g, int) and g >= 0 and d != -1 and g != d
                                              for g, d in zip(shape, dims, strict=True)):
                raise VerifyError(
                    f"model {model!r}: config {kind} {io.name!r}: dims {dims}; the {what} has "
                    f"{['-1' if not isinstance(g, int) or g < 0 else g for g in shape]} "
                    f"(batch axis {'removed' if config.max_batch_size > 0 else 'kept'}); allowed: those "
                    "dims, -1 where the graph's dimension is variable",
                    model=model,
                )
        if kind == "input" and len(graph) != len(config_side):
            missing = sorted(set(graph) - {io.name for io in config_side})
            raise VerifyError(
                f"model {model!r}: input: the {what} also needs {missing}; the config must list every "
                "graph input",
                model=model,
            )


def onnx_signature(path: Path, *, model: str) -> tuple[list[GraphTensor], list[GraphTensor]]:
    """Inputs and outputs of an ONNX file read with ``onnx.load`` (graph only, no weights, no session)."""
    import onnx  # lazy: a TorchScript model needs no onnx

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # onnx raises DecodeError and others
        raise VerifyError(f"model {model!r}: model file {path.name!r}: not a readable onnx model: {error}",
                          model=model) from None
    initializers = {tensor.name for tensor in proto.graph.initializer}

    def tensors(values: Any) -> list[GraphTensor]:
        found: list[GraphTensor] = []
        for value in values:
            if value.name in initializers:  # IR < 4 lists initializers as inputs
                continue
            tensor_type = value.type.tensor_type
            wire = _ONNX_TO_WIRE.get(onnx.TensorProto.DataType.Name(tensor_type.elem_type), "?")
            shape = [dim.dim_value if dim.HasField("dim_value") else -1 for dim in tensor_type.shape.dim]
            found.append((value.name, wire, shape))
        return found

    return tensors(proto.graph.input), tensors(proto.graph.output)


_ONNX_TO_WIRE = {
    "FLOAT": "FP32", "FLOAT16": "FP16", "BFLOAT16": "BF16", "DOUBLE": "FP64", "INT8": "INT8", "INT16": "INT16",
    "INT32": "INT32", "INT64": "INT64", "UINT8": "UINT8", "UINT16": "UINT16", "UINT32": "UINT32",
    "UINT64": "UINT64", "BOOL": "BOOL", "STRING": "BYTES",
}


def config_signature(config: ModelConfig) -> dict[str, Any]:
    """What a caller must send and gets back, as the config declares it: ``max_batch_size`` and
    each input and output with its wire datatype and dims (batch axis excluded; a ``reshape`` is
    the model's view, not the request's). Published in the release index and the routes document
    (``triton_mme_client.signatures.parse_signature`` reads it)."""

    def tensors(side: Any) -> list[dict[str, Any]]:
        return [{"name": io.name, "datatype": wire_datatype(io.data_type), "dims": [int(d) for d in io.dims]}
                for io in side]

    return {"max_batch_size": int(config.max_batch_size), "inputs": tensors(config.input),
            "outputs": tensors(config.output)}
