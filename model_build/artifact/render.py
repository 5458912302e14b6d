"""Render a model's ``config.pbtxt`` from its manifest entry and the signature of the exported file
(or, for a prebuilt TensorRT plan, the signature the manifest declares: :func:`render_plan_config`).

The config is built as a ``tritonclient.grpc.model_config_pb2.ModelConfig`` protobuf and printed
with ``google.protobuf.text_format``: the schema is Triton's own, so a field name or enum value that
Triton would not parse cannot be written, and the text is stable (map keys are printed sorted).
Every rendered config passes :func:`model_build.artifact.triton_config.check_config` before it is
returned.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from triton_mme_cdk.model_build.artifact.triton_config import FORMAT_BACKEND, check_config
from triton_mme_cdk.model_build.errors import TritonConfigError
from triton_mme_cdk.model_build.manifest import ModelSpec
from triton_mme_cdk.model_build.types import ExportedModel, TensorSpec

#: ``optimization { graph { level } }`` values the ONNX Runtime backend maps to an ORT level.
#: ``all`` is the backend's default when the block is absent, so it is rendered as no block.
GRAPH_LEVELS: dict[str, int | None] = {"basic": -1, "extended": 1, "disable_all": 2, "all": None}

_EXECUTION_MODE = {"sequential": "0", "parallel": "1"}
_CUDNN_CONV_ALGO_SEARCH = {"exhaustive": "0", "heuristic": "1", "default": "2"}
_ARENA_EXTEND_STRATEGY = {"next_power_of_two": "0", "same_as_requested": "1"}


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def _dims_for(tensor: TensorSpec, max_batch_size: int, model: str, kind: str) -> tuple[list[int], bool]:
    """Config dims for one exported tensor, and whether it needs an empty ``reshape``.

    With batching the graph's first dimension is the batch and is left out; Triton adds it. A
    graph whose first dimension is fixed cannot take Triton's batches, and a tensor that is only
    ``[batch]`` becomes ``dims: [1]`` with ``reshape { shape: [] }`` (what Triton's own
    auto-complete writes), because ``dims`` may never be empty.
    """
    shape = list(tensor.shape)
    bad = [d for d in shape if d != -1 and d < 1]
    if bad:
        raise TritonConfigError(
            f"model {model!r}: {kind} {tensor.name!r}: shape {shape} has dimension {bad[0]}; "
            "each dimension must be -1 (variable) or >= 1",
            model=model,
        )
    if max_batch_size >= 1:
        if not shape:
            raise TritonConfigError(
                f"model {model!r}: {kind} {tensor.name!r}: is a scalar (shape []); with "
                f"max_batch_size {max_batch_size} its first dimension must be the batch (-1)",
                model=model,
            )
        if shape[0] != -1:
            raise TritonConfigError(
                f"model {model!r}: {kind} {tensor.name!r}: first dimension is fixed at {shape[0]} "
                f"(shape {shape}); max_batch_size {max_batch_size} needs a variable batch "
                "dimension (-1): export with a dynamic batch axis or set max_batch_size 0",
                model=model,
            )
        dims = shape[1:]
        return (dims, False) if dims else ([1], True)
    if not shape:
        raise TritonConfigError(
            f"model {model!r}: {kind} {tensor.name!r}: is a scalar (shape []); Triton needs at "
            "least one dimension when max_batch_size is 0",
            model=model,
        )
    return shape, False


def _data_type(tensor: TensorSpec, model: str, kind: str) -> int:
    try:
        return mc.DataType.Value("TYPE_" + tensor.triton_dtype)
    except (KeyError, ValueError):
        raise TritonConfigError(
            f"model {model!r}: {kind} {tensor.name!r}: dtype {tensor.dtype!r} has no triton data "
            "type; allowed: bool, uint8, int8, int16, int32, int64, float16, float32, float64",
            model=model,
        ) from None


def _batching_and_instances(config: mc.ModelConfig, spec: ModelSpec) -> None:
    """``dynamic_batching`` (where given) and the one instance group, as the manifest says."""
    if spec.dynamic_batching is not None:
        db = config.dynamic_batching
        db.SetInParent()
        db.preferred_batch_size.extend(spec.dynamic_batching.preferred_batch_size)
        db.max_queue_delay_microseconds = spec.dynamic_batching.max_queue_delay_microseconds
        db.preserve_ordering = spec.dynamic_batching.preserve_ordering
    config.instance_group.add(
        kind=mc.ModelInstanceGroup.Kind.Value(spec.instance_group.kind),
        count=spec.instance_group.count,
    )


def render_plan_config(spec: ModelSpec) -> str:
    """``config.pbtxt`` of a prebuilt TensorRT plan (``format: tensorrt_plan``).

    Unlike :func:`render_config`, the signature comes from the manifest (``tensorrt_plan.input`` /
    ``output``): an engine cannot be read without a GPU and the TensorRT that built it. Triton
    picks the file of the GPU it runs on from ``cc_model_filenames`` (keyed ``"8.6"``); on a GPU
    with no entry it would look for ``1/model.plan``, which the tarball does not hold, so such a
    fleet is refused at synth (:func:`model_build.artifact.tensorrt_engines.tensorrt_plan_problem`).
    """
    plan = spec.tensorrt_plan
    if spec.format != "tensorrt_plan" or plan is None:
        raise TritonConfigError(f"model {spec.name!r}: format: got {spec.format!r}; a plan config is for "
                                "format 'tensorrt_plan' with its tensorrt_plan block", model=spec.name)
    backend, platform = FORMAT_BACKEND[spec.format]
    config = mc.ModelConfig(name=spec.name, backend=backend, platform=platform, max_batch_size=spec.max_batch_size)
    for tensors, field in ((plan.input, config.input), (plan.output, config.output)):
        for tensor in tensors:
            field.add(name=tensor.name, data_type=mc.DataType.Value(tensor.data_type), dims=list(tensor.dims))
    _batching_and_instances(config, spec)
    for cc, filename in sorted(plan.cc_model_filenames.items()):
        config.cc_model_filenames[cc] = filename
    text = text_format.MessageToString(config)
    check_config(text, model=spec.name)
    return text


def _graph_digest(model_file: Path) -> str:
    """sha256 of the graph file and its external data (``<file>.data``), read in chunks: the engine
    cache folder changes whenever the graph does, so a stale engine is never loaded."""
    digest = hashlib.sha256()
    for path in (model_file, model_file.with_name(model_file.name + ".data")):
        if path.is_file():
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def render_config(
    spec: ModelSpec, exported: ExportedModel, *, default_model_filename: str | None = None
) -> str:
    """Build ``config.pbtxt`` for ``spec`` from the signature of the exported graph.

    Inputs and outputs come from the exported file (not from the manifest), so the config
    describes what the backend will actually find. The text is checked with
    :func:`check_config` before it is returned, so a rendered config is always one Triton loads.
    """
    model = spec.name
    if exported.format != spec.format:
        raise TritonConfigError(
            f"model {model!r}: format: manifest says {spec.format!r} but the exported model is "
            f"{exported.format!r}; they must be the same",
            model=model,
        )
    if spec.format not in FORMAT_BACKEND:
        raise TritonConfigError(
            f"model {model!r}: format: got {spec.format!r}; allowed: "
            + ", ".join(sorted(FORMAT_BACKEND)),
            model=model,
        )
    backend, platform = FORMAT_BACKEND[spec.format]
    config = mc.ModelConfig(
        name=model, backend=backend, platform=platform, max_batch_size=spec.max_batch_size
    )
    if default_model_filename:
        config.default_model_filename = default_model_filename

    for kind, tensors, field in (
        ("input", exported.inputs, config.input),
        ("output", exported.outputs, config.output),
    ):
        for tensor in tensors:
            dims, reshape = _dims_for(tensor, spec.max_batch_size, model, kind)
            io = field.add(name=tensor.name, data_type=_data_type(tensor, model, kind), dims=dims)
            if reshape:
                io.reshape.SetInParent()

    _batching_and_instances(config, spec)

    ort = spec.onnxruntime
    if ort is not None:
        params: dict[str, str] = {}
        if ort.execution_mode is not None:
            params["execution_mode"] = _EXECUTION_MODE[ort.execution_mode]
        if ort.cudnn_conv_algo_search is not None:
            params["cudnn_conv_algo_search"] = _CUDNN_CONV_ALGO_SEARCH[ort.cudnn_conv_algo_search]
        if ort.arena_extend_strategy is not None:
            params["arena_extend_strategy"] = _ARENA_EXTEND_STRATEGY[ort.arena_extend_strategy]
        if ort.gpu_mem_limit is not None:
            params["gpu_mem_limit"] = str(ort.gpu_mem_limit)
        # "1"/"0": accepted both by the backend's ParseBoolValue and by ONNX Runtime's own
        # option parser (do_copy_in_default_stream is passed through to the CUDA provider).
        for key in ("enable_mem_arena", "enable_mem_pattern", "do_copy_in_default_stream"):
            value = getattr(ort, key)
            if value is not None:
                params[key] = "1" if value else "0"
        for key in ("intra_op_thread_count", "inter_op_thread_count"):
            value = getattr(ort, key)
            if value is not None:
                params[key] = str(value)
        for key, value in params.items():
            config.parameters[key].string_value = value
        level = GRAPH_LEVELS[ort.graph_optimization_level or "all"]
        if level is not None:
            config.optimization.graph.level = level

    if spec.tensorrt is not None:
        accelerator = config.optimization.execution_accelerators.gpu_execution_accelerator.add(
            name="tensorrt"
        )
        folder = f"{spec.name}-{_graph_digest(exported.path)[:12]}" if spec.tensorrt.engine_cache else ""
        for key, value in spec.tensorrt.parameters(cache_folder=folder).items():
            accelerator.parameters[key] = value

    text = text_format.MessageToString(config)
    check_config(text, model=model)
    return text
