"""Export an eager module to the file Triton loads: ``model.onnx`` or ``model.pt``.

Signatures are read back from the written file, never copied from the request: the Triton
config is generated from them, and a config that disagrees with the graph does not load.

Determinism
-----------
A packaged tarball must be byte-identical across builds (the release id says "same inputs, same
bytes"), so the same spec must always give the same model file, in one process or in two:

* Weights: synthetic models are built under a forked RNG seeded with ``source.seed``; pretrained
  ones are read from disk. Sample inputs are seeded.
* ONNX: the TorchScript-based exporter (``dynamo=False``) names nodes after module paths, stores
  no stack traces or file paths, and protobuf serialises a message deterministically; the saved
  file is byte-identical across runs and processes (checked by the tests). The later steps are
  pure functions of the proto: ONNX shape inference, ``onnxruntime``'s FP16 converter and its
  topological sort. The file is always re-saved with ``onnx.save_model`` from the final proto,
  so what is hashed is the proto, not the exporter's own writer.
* TorchScript needs two fixes, both applied here:

  1. TorchScript names every compiled class in a process-wide compilation unit and *mangles*
     a name seen before (``___torch_mangle_211``), so a second export in the same process
     produced other class names. Each trace runs in a fresh compilation unit
     (:func:`_fresh_torchscript_namespace`), so names depend on the model alone.
  2. ``torch.jit.save`` writes ``*.debug_pkl`` records holding the Python stack of the trace,
     with absolute file paths of the virtualenv and line numbers. They are dropped when the
     archive is rewritten (:func:`_strip_debug_records`); TorchScript loads without them (only
     error messages lose their source lines). The traced example inputs are not stored either
     (``_store_inputs=False``). The archive's top folder is named after the file's stem, so
     the archive is always written as ``model.pt`` and then moved to the requested path.

Bytes still depend on the torch/onnx/onnxruntime versions, which the pinned toolchain fixes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import onnx
import torch

from triton_mme_cdk.model_build.errors import ExportError
from triton_mme_cdk.model_build.export import onnx_weights
from triton_mme_cdk.model_build.export.eager import input_names, output_names
from triton_mme_cdk.model_build.export.fusion import (
    attention_shape,
    check_runtime_compatible,
    eager_attention,
    fuse,
    should_fuse,
)
from triton_mme_cdk.model_build.export.memory import module_bytes, release_memory
from triton_mme_cdk.model_build.export.onnx_weights import (
    EXTERNAL_DATA_SUFFIX,
    export_weights_aside,
    save_onnx,
)
from triton_mme_cdk.model_build.manifest import TEXT_TASKS, ModelSpec
from triton_mme_cdk.model_build.types import NUMPY_TO_TRITON, ExportedModel, TensorSpec

#: ONNX opset of every exported graph. 18 is run by ONNX Runtime >= 1.14 (every Triton image
#: SageMaker offers, 23.12 onwards, ships a newer one); the exporter writes IR version 8.
OPSET = 18
#: Both exporters keep process-wide state (torch.onnx's export globals, the TorchScript
#: compilation unit swapped below), so exports from parallel build threads take turns.
_EXPORT_LOCK = threading.Lock()
T = TypeVar("T")


def _fail(spec: ModelSpec, what: str, error: BaseException) -> ExportError:
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    detail = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return ExportError(f"{what} failed: {detail[:300]}", model=spec.name)


def _dynamic_axes(spec: ModelSpec, sample: dict[str, np.ndarray]) -> dict[str, dict[int, str]]:
    """Axis 0 is the batch (unless batching is off), axis 1 the sequence for text tensors."""
    batch = {0: "batch"} if spec.max_batch_size > 0 else {}
    axes: dict[str, dict[int, str]] = {}
    text = spec.task in TEXT_TASKS
    for name in input_names(spec, sample):
        axes[name] = {**batch, **({1: "sequence"} if text else {})}
    for name in output_names(spec):
        per_token = spec.task == "feature-extraction"
        axes[name] = {**batch, **({1: "sequence"} if per_token else {})}
    return {name: value for name, value in axes.items() if value}


def _tensors(spec: ModelSpec, sample: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    """``sample`` as the module's positional inputs, in the manifest's input order."""
    return tuple(torch.from_numpy(np.ascontiguousarray(sample[name])) for name in input_names(spec, sample))


@contextlib.contextmanager
def _scratch_beside(out_path: Path) -> Iterator[Path]:
    """A scratch folder next to ``out_path``: same file system, so the result is renamed into place."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_path.parent, prefix=".export-") as scratch:
        yield Path(scratch)


@contextlib.contextmanager
def _tracing(inner: contextlib.AbstractContextManager[T]) -> Iterator[T]:
    """One trace: the export lock, no gradients, known warnings silenced, ``inner`` around it."""
    with _EXPORT_LOCK, _quiet_tracing(), torch.no_grad(), inner as value:
        yield value


@contextlib.contextmanager
def _quiet_tracing() -> Iterator[None]:
    # The tracer warns on every Python bool taken from a tensor inside transformers (shape-safe
    # here: validation on several shapes proves it); the exporter's deprecation notice is known.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", FutureWarning)  # transformers attribute renames
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx.*")
        yield


# --------------------------------------------------------------------------------------------
# ONNX
# --------------------------------------------------------------------------------------------


def export_onnx(
    spec: ModelSpec, module: torch.nn.Module, sample: dict[str, np.ndarray], out_path: Path, *,
    on_traced: Callable[[], None] | None = None,
) -> ExportedModel:
    """Trace ``module`` on ``sample`` into ``out_path`` (opset :data:`OPSET`), FP16 if asked;
    ``on_traced`` is called once this has let go of ``module`` (a caller frees it there)."""
    fusing = should_fuse(spec, module)
    attention = attention_shape(module)
    with _scratch_beside(out_path) as scratch:
        raw = scratch / "model.onnx"
        try:
            with _tracing(eager_attention(module) if fusing else contextlib.nullcontext()):
                export_weights_aside(  # torch.onnx.export, the weights written tensor by tensor
                    module,
                    _tensors(spec, sample),
                    raw,
                    opset_version=OPSET,
                    input_names=list(input_names(spec, sample)),
                    output_names=list(output_names(spec)),
                    dynamic_axes=_dynamic_axes(spec, sample),
                    do_constant_folding=True,
                )
        except Exception as error:  # any exporter failure is an export error of this model
            raise _fail(spec, "onnx export", error) from error
        weights = module_bytes(module)
        del module
        if on_traced is not None:
            on_traced()
        release_memory(weights)  # the exporter's copies; the file is passed, so no frame here holds a proto
        return _finish_onnx(spec, raw, out_path, fusing=fusing, attention=attention, weights_aside=True)


def import_onnx(spec: ModelSpec, source_path: Path, out_path: Path) -> ExportedModel:
    """Take a ready ``.onnx`` (an ``onnx`` source) as the model, converted to FP16 if asked."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    return _finish_onnx(spec, source_path, out_path, fusing=should_fuse(spec, source_path))


def _load(spec: ModelSpec, path: Path, *, graph_only: bool = False) -> onnx.ModelProto:
    try:  # with its external data, unless ``graph_only``
        return onnx.load(str(path), load_external_data=not graph_only)
    except Exception as error:  # a truncated or non-ONNX file
        raise _fail(spec, f"reading {str(path)!r}", error) from error


def _external_from() -> int:
    """Weights of at least this many bytes are saved to ``<file>.data`` (always above the protobuf limit)."""
    return min(onnx_weights.EXTERNAL_DATA_MIN_BYTES, onnx_weights.PROTO_LIMIT)


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference, so static output dims are declared as numbers.

    The exporter declares every dimension it could not fold as a symbol (MiniLM's embedding came
    out as ``[batch, Divsentence_embedding_dim_1]``, not ``[batch, 384]``), and the Triton config
    is generated from the declared shapes. Inference is best effort: where it fails, the
    exporter's own declaration stands. It runs on the graph's skeleton (:func:`onnx_weights.skeleton`), its
    results (every value's type, the outputs) copied back onto the model, whose weights never move:
    a whole model cannot be serialized above 2 GiB, and below it the copies set the peak memory.
    """
    try:
        return _with_inferred_shapes(model, data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError):
        return model


def _with_inferred_shapes(model: onnx.ModelProto, *, data_prop: bool) -> onnx.ModelProto:
    """``model`` with the value types and outputs ``onnx.shape_inference.infer_shapes`` gives it,
    inferred on its skeleton (:func:`onnx_weights.skeleton`): the weights are neither serialized
    nor copied. Raises what shape inference raises."""
    inferred = onnx.shape_inference.infer_shapes(onnx_weights.skeleton(model), data_prop=data_prop)
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    for output, typed in zip(model.graph.output, inferred.graph.output, strict=True):
        output.CopyFrom(typed)
    return model


def _finish_onnx(
    spec: ModelSpec,
    source: Path,
    out_path: Path,
    *,
    fusing: bool = False,
    attention: tuple[int, int] = (0, 0),
    weights_aside: bool = False,
) -> ExportedModel:
    """Shapes, then the offline fusions (``attention``: heads and hidden size) and FP16.

    ``weights_aside``: ``source`` is the export's graph with its weights in ``<source>.data``
    (:func:`model_build.export.onnx_weights.export_weights_aside`); only the graph is read for
    shape inference, and the weights once, by the optimizer or to be saved.
    Fusion precedes FP16 so the converter sees the fused ops; INT8 comes later, in the build's
    optimize step (:mod:`model_build.export.optimize`), as it needs calibration inputs.
    """
    model = _infer_shapes(_load(spec, source, graph_only=weights_aside))
    side = source.with_name(source.name + EXTERNAL_DATA_SUFFIX)
    size = onnx_weights.weight_bytes(model) + (side.stat().st_size if weights_aside else 0)
    if fusing and size >= onnx_weights.PROTO_LIMIT:
        # ONNX Runtime's offline optimizer serializes the model whole, which protobuf refuses
        # above 2 GiB ("graph fusion failed: InvalidProtobuf"). Unset, such a graph is served as
        # exported (the serving session still applies its own graph optimizations at load).
        if spec.optimize:
            raise ExportError(
                f"optimize: got true, but the graph's weights are {size / 2**30:.1f} GiB and ONNX Runtime's "
                "offline optimizer serializes the model whole, which protobuf allows up to 2 GiB; "
                "set optimize false (or leave it unset: such a graph is then served unfused)",
                model=spec.name,
            )
        fusing = False
    if fusing:  # from a file: this proto is freed before ONNX Runtime loads its own copy
        ir_version = model.ir_version
        if weights_aside:  # the shaped graph beside the weights file it refers to
            shaped = source.with_name(f"shaped-{source.name}")
            written = [shaped]
            onnx.save_model(model, str(shaped))
        else:  # external data: written tensor by tensor, never serialized whole
            shaped = out_path.with_name(f".{out_path.name}.shaped")
            written = [shaped, shaped.with_name(shaped.name + EXTERNAL_DATA_SUFFIX)]
            onnx.save_model(model, str(shaped), save_as_external_data=True, location=written[1].name)
        try:
            del model
            release_memory(size)
            model, _ = fuse(spec, shaped, None, ir_version=ir_version, attention=attention)
        finally:
            for path in written:
                path.unlink(missing_ok=True)
        release_memory(size)
    elif weights_aside:
        onnx.load_external_data_for_model(model, str(source.parent))
    if spec.effective_precision == "fp16":
        model = _to_fp16(spec, model)
    check_runtime_compatible(model, name=spec.name)
    save_onnx(model, out_path, external_from=_external_from())
    del model
    release_memory(size)
    inputs, outputs = onnx_signature(out_path, model_name=spec.name)
    return ExportedModel(name=spec.name, format="onnx", path=out_path, inputs=inputs, outputs=outputs)


def _to_fp16(spec: ModelSpec, model: onnx.ModelProto) -> onnx.ModelProto:
    """Weights and compute in FP16, inputs and outputs still FP32 (clients need not change).

    onnxruntime's own converter knows which ops must stay FP32 and inserts the casts; a
    hand-written conversion gets those wrong. Its own first step, ONNX shape inference on the
    whole model, serialized the model and parsed a copy back (the FP16 build's peak: two more
    copies of the FP32 weights); the same inference runs here on the skeleton instead, and the
    converter then works on ``model`` itself.
    """
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "values clipped to the FP16 range" is expected
            converted = convert_float_to_float16(_with_inferred_shapes(model, data_prop=False),
                                                 keep_io_types=True, disable_shape_infer=True)
        # The converter appends the input casts at the end of the node list; ONNX Runtime sorts
        # on load, but the ONNX checker (and TensorRT's parser) want a topologically sorted graph.
        # onnxruntime's own sort is deterministic for a given node list.
        OnnxModel.graph_topological_sort(converted.graph)
        return converted
    except Exception as error:
        raise _fail(spec, "fp16 conversion", error) from error


def _tensor_spec(value: onnx.ValueInfoProto, model_name: str) -> TensorSpec:
    tensor = value.type.tensor_type
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
    except (KeyError, TypeError, ValueError):
        dtype = f"onnx type {tensor.elem_type}"
    if dtype not in NUMPY_TO_TRITON:
        raise ExportError(
            f"graph tensor {value.name!r} has dtype {dtype}; Triton supports "
            + ", ".join(NUMPY_TO_TRITON),
            model=model_name,
        )
    shape = tuple(dim.dim_value if dim.HasField("dim_value") else -1 for dim in tensor.shape.dim)
    return TensorSpec(name=value.name, dtype=dtype, shape=shape)


def onnx_signature(
    path: Path, *, model_name: str | None = None
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Inputs and outputs as the saved graph declares them (initializers are not inputs)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {tensor.name for tensor in graph.initializer}
    name = model_name or path.parent.name
    inputs = tuple(_tensor_spec(v, name) for v in graph.input if v.name not in initializers)
    outputs = tuple(_tensor_spec(v, name) for v in graph.output)
    return inputs, outputs


# --------------------------------------------------------------------------------------------
# TorchScript
# --------------------------------------------------------------------------------------------


def torchscript_name(name: str, index: int) -> str:
    """Triton's pytorch_libtorch backend binds tensors by position: ``<name>__<index>``."""
    return f"{name}__{index}"


@contextlib.contextmanager
def _fresh_torchscript_namespace() -> Iterator[torch._C.CompilationUnit]:
    """Trace into a new, empty compilation unit, so class names are not mangled by history.

    torch keeps one process-wide unit (``torch.jit._state._python_cu``; ``_recursive`` holds its
    own reference and a cache of module types). Swapping all three for the trace and restoring
    them afterwards leaves other TorchScript users untouched.
    """
    import torch.jit._recursive as recursive
    import torch.jit._state as state

    unit = torch._C.CompilationUnit()
    saved = (state._python_cu, recursive._python_cu, recursive.concrete_type_store)
    state._python_cu = unit
    recursive._python_cu = unit
    recursive.concrete_type_store = recursive.ConcreteTypeStore()
    try:
        yield unit
    finally:
        state._python_cu, recursive._python_cu, recursive.concrete_type_store = saved


def _strip_debug_records(src: Path, dst: Path) -> None:
    """Rewrite a TorchScript archive without ``*.debug_pkl`` (absolute paths, line numbers).

    torch's own archive reader and writer keep the record alignment and format version that
    ``torch.jit.load`` (and Triton's libtorch) expect.
    """
    reader = torch._C.PyTorchFileReader(str(src))
    # The format version is "version" in older archives, ".data/version" from format 6 on; the
    # writer adds it (and a content-derived ".data/serialization_id") itself.
    generated = {"version", ".data/version", ".data/serialization_id"}
    records = reader.get_all_records()
    version_record = ".data/version" if ".data/version" in records else "version"
    writer = torch._C.PyTorchFileWriter(str(dst))
    writer.set_min_version(int(reader.get_record(version_record).decode().strip()))
    for record in records:
        if record.endswith(".debug_pkl") or record in generated:
            continue
        data = reader.get_record(record)
        writer.write_record(record, data, len(data))
    writer.write_end_of_file()


def _other_shape(spec: ModelSpec, sample: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """A second shape for ``check_trace``: batch 1 (or 2 after a batch-1 trace), one token fewer.

    Batch 1 is the single request, the shape most unlike a traced batch; a graph specialised to
    the trace shape shows up as a graph that differs on re-tracing.
    """
    other = sample
    batch = next(iter(sample.values())).shape[0]
    rows = 1 if batch > 1 else min(2, spec.max_batch_size)
    if spec.max_batch_size > 0 and rows != batch:
        other = {k: np.resize(v, (rows, *v.shape[1:])) for k, v in other.items()}
    if spec.task in TEXT_TASKS and min(v.shape[1] for v in other.values()) > 2:
        other = {k: np.ascontiguousarray(v[:, :-1]) for k, v in other.items()}
    return None if other is sample else other


def export_torchscript(
    spec: ModelSpec, module: torch.nn.Module, sample: dict[str, np.ndarray], out_path: Path, *,
    on_traced: Callable[[], None] | None = None,
) -> ExportedModel:
    """``torch.jit.trace`` into ``out_path``; the trace is checked on a second shape.

    ``on_traced`` is called once the archive is saved and this has let go of ``module`` and of
    the trace (which shares its parameters): a caller frees the module there, so the signature's
    read-back (a ``torch.jit.load``, the weights once more) never holds both (issue 36: a 2.9 GB
    BERT peaked at 2.2x its weights before).
    """
    weights = module_bytes(module)
    other = _other_shape(spec, sample)
    check = [_tensors(spec, other)] if other else None
    with _scratch_beside(out_path) as scratch:
        raw = scratch / "traced.pt"
        try:
            with _tracing(_fresh_torchscript_namespace()) as unit:
                traced = torch.jit.trace(
                    module,
                    _tensors(spec, sample),
                    check_trace=True,
                    check_inputs=check,
                    _store_inputs=False,
                    _compilation_unit=unit,
                )
                traced.save(str(raw))
        except torch.jit.TracingCheckError as error:
            shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in (other or {}).items())
            raise ExportError(
                f"torchscript trace depends on the input shape: re-tracing with {shapes} gave a "
                "different graph (shape-dependent Python control flow); export as onnx or fix the "
                "model",
                model=spec.name,
            ) from error
        except Exception as error:  # any other tracer failure
            raise _fail(spec, "torchscript trace", error) from error
        del traced, module
        if on_traced is not None:
            on_traced()
        release_memory(weights)
        # The archive's top folder is the file's stem: always "model", whatever out_path is.
        stripped = scratch / "model.pt"
        _strip_debug_records(raw, stripped)
        os.replace(stripped, out_path)
    inputs, outputs = torchscript_signature(spec, out_path, sample)
    return ExportedModel(name=spec.name, format="torchscript", path=out_path, inputs=inputs,
                         outputs=outputs)


def load_torchscript(path: Path) -> torch.jit.ScriptModule:
    """``torch.jit.load`` on CPU. Its Python deprecation notice is silenced: the format is what
    Triton's libtorch backend loads, and there is no replacement for it there."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        return torch.jit.load(str(path), map_location="cpu")


def torchscript_signature(
    spec: ModelSpec, path: Path, sample: dict[str, np.ndarray]
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Read back by running the saved file: a traced archive declares no shapes or dtypes.

    The batch axis (when batching) and the sequence axis (text) are the variable ones, as in the
    ONNX export's dynamic axes.
    """
    axes = _dynamic_axes(spec, sample)
    loaded = load_torchscript(path)
    with torch.no_grad():
        result = loaded(*_tensors(spec, sample))
    tensors = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(tensors) != len(output_names(spec)):
        raise ExportError(
            f"traced model returns {len(tensors)} outputs; task {spec.task!r} has "
            f"{len(output_names(spec))} ({', '.join(output_names(spec))})",
            model=spec.name,
        )

    def shape(name: str, actual: tuple[int, ...]) -> tuple[int, ...]:
        variable = axes.get(name, {})
        return tuple(-1 if axis in variable else size for axis, size in enumerate(actual))

    inputs = tuple(
        TensorSpec(torchscript_name(n, i), sample[n].dtype.name, shape(n, sample[n].shape))
        for i, n in enumerate(input_names(spec, sample))
    )
    outputs = tuple(
        TensorSpec(torchscript_name(n, i), str(t.numpy().dtype), shape(n, tuple(t.shape)))
        for i, (n, t) in enumerate(zip(output_names(spec), tensors, strict=True))
    )
    return inputs, outputs
