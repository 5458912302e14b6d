"""ONNX weights kept out of whole-model buffers, so a build's peak memory stays near the model's size.

Two places held the weights three times over (issue 36), both whole-model protobuf serializations:

- **The export.** The TorchScript-based ``torch.onnx.export`` builds the whole ``ModelProto`` in
  C++, serializes it into one string and copies that into Python ``bytes``: three copies of the
  weights beside the module's own, the peak of a BERT-base build (5.2x its weights).
  :func:`export_weights_aside` exports the graph with ``export_params=False`` (the same nodes,
  the weights declared as graph inputs) and writes the weights itself, tensor by tensor, from the
  exporter's own parameter map (taken after constant folding, so folded weights are there): each
  graph input that is a parameter becomes an initializer again, in the order the exporter's
  encoder emits them, values in ``<file>.data``. The graph is the one the exporter writes with
  its parameters, node for node and value for value (checked by the tests).
- **The save.** :func:`save_onnx` writes the weights of a graph of :data:`EXTERNAL_DATA_MIN_BYTES`
  or more to ``<file>.data`` tensor by tensor; only the graph is serialized.

Triton's onnxruntime backend (and ONNX Runtime, and the packaging) read ``model.onnx.data`` from
beside ``model.onnx``; the layout is the one graphs over the 2 GiB protobuf limit always had.
Written deterministically: same tensors, same order, same offsets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
import torch

EXTERNAL_DATA_SUFFIX = ".data"
#: From this many bytes of weights a saved graph keeps them in ``<file>.data`` (see :func:`save_onnx`);
#: Triton's onnxruntime backend loads the side file from beside ``model.onnx``.
EXTERNAL_DATA_MIN_BYTES = 256 * 2**20
#: A protobuf message cannot exceed 2 GiB: a graph whose weights reach this is saved with them in
#: ``<file>.data``, and the steps that serialize a model whole (the offline fusions, INT8) refuse it.
PROTO_LIMIT = 2**31 - 2**26
#: Tensors below this many bytes stay in the exported graph: shape constants among them, whose
#: values ONNX shape inference reads (the skeleton it runs on keeps tensors up to 64 KiB).
INLINE_MAX_BYTES = 1 << 16
#: Each tensor in the side file starts at a multiple of this (ONNX Runtime can map aligned data).
_ALIGN = 4096


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """About the bytes a tensor holds in memory: its element count times the element size
    (external data counts nothing: it is not held). ``ByteSize()`` is exact, but upb computes it by
    serializing the tensor, which held 3.5 times the tensor's bytes for a moment (a BERT-base
    embedding: 330 MB); it is used only where the element size is unknown (strings)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return 0
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return int(tensor.ByteSize())
    elements = int(np.prod(tensor.dims, dtype=np.int64)) if len(tensor.dims) else 1
    return elements * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the initializers as held in ``model`` (external ones count nothing)."""
    return sum(tensor_bytes(tensor) for tensor in model.graph.initializer)


#: Initializers at most this big keep their values in the skeleton shape inference runs on: shape
#: constants (a Reshape's target, a Gather's indices) are small, and inference reads their values.
#: The export keeps exactly these inline (:data:`INLINE_MAX_BYTES`), so the two cannot drift apart.
SKELETON_KEEP_BYTES = INLINE_MAX_BYTES


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph without its big weights: each initializer above :data:`SKELETON_KEEP_BYTES` keeps
    its name, type and dims but no values. Shape inference needs only those, and the skeleton of a
    model over the 2 GiB protobuf limit is a few megabytes (no copy of the weights is made)."""
    graph = onnx.GraphProto(name=model.graph.name)
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(graph, field).extend(getattr(model.graph, field))
    for tensor in model.graph.initializer:
        # Exact size where it can be near the threshold (an int64 shape constant's varints take
        # fewer bytes than its elements); a tensor 16 times over it is over it in any encoding.
        if tensor_bytes(tensor) <= 16 * SKELETON_KEEP_BYTES and tensor.ByteSize() <= SKELETON_KEEP_BYTES:
            graph.initializer.append(tensor)
        else:
            graph.initializer.append(onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims))
    skeleton = onnx.ModelProto(ir_version=model.ir_version, graph=graph)
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    return skeleton


def save_onnx(model: onnx.ModelProto, path: Path, *, external_from: int = EXTERNAL_DATA_MIN_BYTES) -> None:
    """Save deterministically; from ``external_from`` bytes of weights on (:data:`EXTERNAL_DATA_MIN_BYTES`,
    so always above the 2 GiB protobuf limit) the weights go to ``<file>.data``, tensor by tensor.

    A single-file save serializes the whole model into one buffer (protobuf's ``SerializeToString``),
    which briefly held about three times the weights at the end of a BERT-base build (issue 36);
    with external data only the graph is serialized. Each tensor's ``raw_data`` is moved to the
    side file, so ``model`` holds no weights afterwards: callers save it last."""
    side = path.with_name(path.name + EXTERNAL_DATA_SUFFIX)
    side.unlink(missing_ok=True)  # a stale side file would end up in the package (or be appended to)
    if weight_bytes(model) < external_from:
        if any(tensor.data_location == onnx.TensorProto.EXTERNAL for tensor in model.graph.initializer):
            onnx.save_model(model, str(path))  # onnx writes the loaded ones out; none is serialized whole
            return
        with open(path, "wb") as out:
            write_model(model, out)
        return
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=side.name, size_threshold=1024)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_header(message: Any, name: str, size: int) -> bytes:
    """A length-delimited field's tag and length: what precedes its payload on the wire."""
    number = message.DESCRIPTOR.fields_by_name[name].number
    return _varint(number << 3 | 2) + _varint(size)


def _is_repeated(field: Any) -> bool:
    """``FieldDescriptor.is_repeated`` (protobuf 6.31 on; ``label`` before, now deprecated)."""
    repeated = getattr(field, "is_repeated", None)
    return bool(repeated) if repeated is not None else field.label == field.LABEL_REPEATED


def _fields(message: Any, keep: Callable[[int], bool]) -> bytes:
    """The wire bytes of ``message``'s set fields whose numbers ``keep`` accepts, in field order."""
    part = type(message)()
    for field, value in message.ListFields():
        if not keep(field.number):
            continue
        target = getattr(part, field.name)
        if _is_repeated(field):
            target.extend(value)
        elif field.message_type is not None:
            target.CopyFrom(value)
        else:
            setattr(part, field.name, value)
    return part.SerializeToString()


def write_model(model: onnx.ModelProto, out: BinaryIO) -> None:
    """Write ``model`` as ``model.SerializeToString()`` would, one initializer at a time.

    Protobuf writes a message's fields in field-number order, and a message's bytes are its
    fields' bytes one after another, so the model is written as: its fields before ``graph``, the
    graph's header (its size from ``ByteSize``, which copies nothing), the graph's fields before
    ``initializer``, each initializer, the graph's later fields, then the model's (each tensor is
    serialized twice, once for the graph's size: CPU, not memory). Serializing the
    whole model held the weights three more times at once (the C++ buffer, the Python bytes, the
    write), which set an FP16 BERT-base build's peak (issue 36); this holds one tensor's bytes.
    The result is byte-identical (tested)."""
    graph_number = model.DESCRIPTOR.fields_by_name["graph"].number
    out.write(_fields(model, lambda number: number < graph_number))
    if model.HasField("graph"):
        graph = model.graph
        initializer_number = graph.DESCRIPTOR.fields_by_name["initializer"].number
        before = _fields(graph, lambda number: number < initializer_number)
        after = _fields(graph, lambda number: number > initializer_number)
        # The graph's size, without graph.ByteSize(): upb computes that by serializing the graph.
        sizes = [len(tensor.SerializeToString()) for tensor in graph.initializer]
        size = len(before) + len(after) + sum(len(_field_header(graph, "initializer", n)) + n for n in sizes)
        out.write(_field_header(model, "graph", size))
        out.write(before)
        for tensor, length in zip(graph.initializer, sizes, strict=True):
            data = tensor.SerializeToString()
            out.write(_field_header(graph, "initializer", length))
            out.write(data)
            del data
        out.write(after)
    out.write(_fields(model, lambda number: number > graph_number))


@contextlib.contextmanager
def _captured_parameters() -> Iterator[dict[str, Any]]:
    """The TorchScript exporter's parameter map (after constant folding) of the next export.

    ``torch.onnx``'s TorchScript exporter calls its module-level ``_model_to_graph``, which returns
    ``(graph, params_dict, outputs)``; it is wrapped for the duration (callers hold the export lock)."""
    from torch.onnx._internal.torchscript_exporter import utils as exporter

    captured: dict[str, Any] = {}
    original = exporter._model_to_graph

    def model_to_graph(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        captured["params"] = result[1]
        return result

    exporter._model_to_graph = model_to_graph
    try:
        yield captured
    finally:
        exporter._model_to_graph = original


def _tensor_proto(name: str, value: torch.Tensor) -> tuple[onnx.TensorProto, np.ndarray]:
    """An initializer's type and dims, and its values as the bytes the exporter would write."""
    value = value.detach().cpu().contiguous()
    if value.dtype == torch.bfloat16:  # numpy has no bfloat16: the same 16 bits, typed in the proto
        array = value.view(torch.int16).numpy()
        return onnx.TensorProto(name=name, data_type=onnx.TensorProto.BFLOAT16, dims=array.shape), array
    array = value.numpy()
    data_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    return onnx.TensorProto(name=name, data_type=data_type, dims=array.shape), array


def _attach_weights(graph_path: Path, params: Mapping[str, torch.Tensor]) -> None:
    """Turn the parameter inputs of the graph at ``graph_path`` back into initializers, their
    values in ``<graph>.data`` (small ones inline), and rewrite the graph file."""
    model = onnx.load(str(graph_path), load_external_data=False)
    side = graph_path.with_name(graph_path.name + EXTERNAL_DATA_SUFFIX)
    inputs = [value for value in model.graph.input if value.name not in params]
    weights = [value.name for value in model.graph.input if value.name in params]
    with side.open("wb") as data:
        for name in weights:
            tensor, array = _tensor_proto(name, params[name])
            if array.nbytes < INLINE_MAX_BYTES:
                tensor.raw_data = array.tobytes()
            else:
                offset = -data.tell() % _ALIGN
                data.write(b"\0" * offset)
                start = data.tell()
                data.write(np.ascontiguousarray(array).data)
                tensor.data_location = onnx.TensorProto.EXTERNAL  # as onnx's set_external_data writes it
                for key, value in (("location", side.name), ("offset", start), ("length", array.nbytes)):
                    tensor.external_data.add(key=key, value=str(value))
            model.graph.initializer.append(tensor)
            del array
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    onnx.save_model(model, str(graph_path))


def export_weights_aside(module: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path,
                         **options: Any) -> None:
    """``torch.onnx.export(module, args, path, dynamo=False, **options)``, the weights written to
    ``<path>.data`` tensor by tensor instead of serialized with the graph (see the module docstring).
    Callers hold the export lock (the exporter's function is wrapped while it runs)."""
    with _captured_parameters() as captured:
        torch.onnx.export(module, args, str(path), dynamo=False, export_params=False, **options)
    params = captured.pop("params")
    _attach_weights(path, params)
