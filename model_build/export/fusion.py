"""Transformer fusions applied while exporting, and what the served ONNX Runtime accepts.

ONNX Runtime's transformer optimizer (``onnxruntime.transformers.optimizer.optimize_model``, model
type ``bert``) rewrites the attention blocks into ``com.microsoft`` ``Attention``, the embeddings
into ``EmbedLayerNormalization`` and the FFN activation into ``BiasGelu``: :func:`should_fuse`
says when (see :mod:`model_build.export.optimize` for the whole step), :func:`eager_attention`
traces the pattern it recognises, :func:`fuse` does it and fails when no attention was fused.
:func:`check_runtime_compatible` refuses a graph the ONNX Runtime of Triton 24.10 would not load
(opset, contrib ops), for every export; :func:`prune_opsets` leaves what it accepts.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import torch

from triton_mme_cdk.model_build.errors import ExportError
from triton_mme_cdk.model_build.export.onnx_weights import skeleton
from triton_mme_cdk.model_build.manifest import TEXT_TASKS, ModelSpec, SyntheticSource

#: Model types whose fusion is verified (exported, fused, validated in the test suite: BERT in
#: tests/test_optimize.py, RoBERTa and XLM-R in tests/test_tokenizer_kinds.py). ONNX Runtime's
#: ``bert`` optimizer is the one for the RoBERTa family too (optimum maps them to it): the encoder
#: layers are the same; only the position ids differ, which leaves the embedding unfused.
FUSABLE_MODEL_TYPES: frozenset[str] = frozenset({"bert", "roberta", "xlm-roberta"})
#: Contrib ops the fused graph may contain: each has CPU and CUDA kernels in ONNX Runtime 1.19.
ALLOWED_CONTRIB_OPS: frozenset[str] = frozenset(
    {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu", "FastGelu",
     "Gelu", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
)
#: Newest ONNX opset and IR version ONNX Runtime 1.19 (Triton 24.10) runs.
MAX_OPSET = 21
MAX_IR_VERSION = 10


def iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of its subgraphs (a grouped graph's encoder is in a Loop body)."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from iter_nodes(attribute.g)
            for subgraph in attribute.graphs:
                yield from iter_nodes(subgraph)


def _hf_model(module: torch.nn.Module | Path | None) -> Any:
    """The transformers model inside our wrapper (it holds the config and the attention switch)."""
    if not isinstance(module, torch.nn.Module):
        return None
    for sub in module.modules():
        if hasattr(sub, "config") and hasattr(sub, "set_attn_implementation"):
            return sub
    return None


def model_type(spec: ModelSpec, module: torch.nn.Module | Path | None) -> str | None:
    if isinstance(spec.source, SyntheticSource):
        return spec.source.architecture
    inner = _hf_model(module)
    return getattr(getattr(inner, "config", None), "model_type", None) if inner is not None else None


def should_fuse(spec: ModelSpec, module: torch.nn.Module | Path | None) -> bool:
    """``optimize`` as given; unset: on for ONNX text models of a verified type (BERT, RoBERTa, XLM-R)."""
    if spec.format != "onnx":
        return False
    if spec.optimize is not None:
        if spec.optimize and model_type(spec, module) not in FUSABLE_MODEL_TYPES and not isinstance(
            module, Path
        ):
            raise ExportError(
                f"optimize: true for model type {model_type(spec, module)!r}; fusions are verified "
                f"for {', '.join(sorted(FUSABLE_MODEL_TYPES))} only: set optimize: false",
                model=spec.name,
            )
        return spec.optimize
    level = spec.onnxruntime.graph_optimization_level if spec.onnxruntime else None
    return (
        spec.task in TEXT_TASKS
        and model_type(spec, module) in FUSABLE_MODEL_TYPES
        and level not in ("basic", "disable_all")  # the serving session finishes the fusions
    )


@contextlib.contextmanager
def eager_attention(module: torch.nn.Module) -> Iterator[None]:
    """Trace with transformers' eager attention, the pattern ONNX Runtime's optimizer fuses.

    The SDPA export (transformers' default) computes the same thing but the optimizer fuses
    nothing in it. The module's own setting is restored afterwards: it is also the reference.
    """
    inner = _hf_model(module)
    if inner is None:
        yield
        return
    before = getattr(inner.config, "_attn_implementation", None) or "sdpa"
    inner.set_attn_implementation("eager")
    try:
        yield
    finally:
        inner.set_attn_implementation(before)


def attention_shape(module: torch.nn.Module | Path | None) -> tuple[int, int]:
    """(heads, hidden) from the model config; (0, 0) lets the optimizer read them off the graph."""
    config = getattr(_hf_model(module), "config", None)
    return int(getattr(config, "num_attention_heads", 0) or 0), int(getattr(config, "hidden_size", 0) or 0)


def prune_opsets(model: onnx.ModelProto, ir_version: int) -> onnx.ModelProto:
    """Keep only the domains the nodes use and the export's IR version, for ONNX Runtime 1.19.

    ONNX Runtime writes every domain it knows into the saved model (``com.microsoft.nchwc``,
    ``org.pytorch.aten``...), and newer onnx helpers stamp a newer IR version than an older
    runtime accepts; neither is needed by the graph.
    """
    used = {node.domain for node in iter_nodes(model.graph)} | {""}
    kept = [op for op in model.opset_import if op.domain in used or op.domain == "ai.onnx"]
    del model.opset_import[:]
    model.opset_import.extend(sorted(kept, key=lambda op: op.domain))
    model.ir_version = min(ir_version, MAX_IR_VERSION)
    return model


def fuse(spec: ModelSpec, model: onnx.ModelProto | Path, module: torch.nn.Module | Path | None, *,
         ir_version: int | None = None, attention: tuple[int, int] | None = None,
         ) -> tuple[onnx.ModelProto, dict[str, int]]:
    """Transformer fusions (see the module docstring); fails if no attention was fused.

    ``model`` may be a saved file (then ``ir_version`` is the export's): the optimizer loads it
    itself, so the caller need not hold the graph while ONNX Runtime holds its own copy;
    ``attention`` (heads, hidden) in place of ``module``'s config."""
    from onnxruntime.transformers.optimizer import optimize_model

    heads, hidden = attention or attention_shape(module)
    if isinstance(model, onnx.ModelProto):
        ir_version = model.ir_version
    assert ir_version is not None, "fuse: a file needs the export's ir_version"
    try:
        # It prints (not logs) a failed symbolic shape inference on the graph's dynamic Expand
        # nodes; that only skips SkipLayerNormalization, which the serving session fuses itself.
        with warnings.catch_warnings(), quiet_ort_logging(), contextlib.redirect_stdout(io.StringIO()), \
                _shape_inference_on_skeletons():
            warnings.simplefilter("ignore")
            optimized = optimize_model(str(model) if isinstance(model, Path) else model, model_type="bert", num_heads=heads, hidden_size=hidden,
                                       opt_level=1, use_gpu=False)
    except Exception as error:
        raise ExportError(f"graph fusion failed: {type(error).__name__}: {error}"[:400],
                          model=spec.name) from None
    counts = {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}
    if not counts.get("Attention"):
        raise ExportError(
            "optimize: the transformer optimizer fused no Attention in this graph (found "
            f"{counts or 'nothing'}); set optimize: false for this model",
            model=spec.name,
        )
    return prune_opsets(optimized.model, ir_version), counts


@contextlib.contextmanager
def _shape_inference_on_skeletons() -> Iterator[None]:
    """The optimizer's symbolic shape inference runs on the graph's skeleton, not on the model.

    Several fusions (the casts' removal, SkipLayerNormalization, EmbedLayerNormalization,
    Attention) each ask ``OnnxModel.infer_runtime_shape(update=True)``, which hands the whole model
    to ``SymbolicShapeInferenceHelper``: it copies the model, runs ONNX shape inference on the copy
    (serializing it whole) and keeps the copy, and each fusion keeps its helper. On BERT-base that
    was the build's peak, up to 2.5 GB above the model's own 440 MB (issue 36). The helper only
    answers shapes (``get_edge_shape``), and shapes need the weights' dims, not their values: given
    :func:`onnx_weights.skeleton` (big initializers without data, small ones whole) it answers
    the same, at a few megabytes a copy. Patched on the class for the optimizer's call only: the
    class of the optimizer's own top-level ``onnx_model`` module (ONNX Runtime's transformer tools
    import their modules by bare name, so that class is not the package module's)."""
    import sys

    import onnxruntime.transformers.optimizer  # noqa: F401  (puts the tools' modules in sys.modules)

    OnnxModel = sys.modules["onnx_model"].OnnxModel
    original = OnnxModel.infer_runtime_shape

    def on_skeleton(self: Any, dynamic_axis_mapping: dict[str, int] | None = None, update: bool = False) -> Any:
        if not self.enable_shape_infer or (self.shape_infer_helper is not None and not update):
            return original(self, dynamic_axis_mapping or {}, update)
        model = self.model
        self.model = skeleton(model)
        try:
            return original(self, dynamic_axis_mapping or {}, update)
        finally:
            self.model = model

    OnnxModel.infer_runtime_shape = on_skeleton
    try:
        yield
    finally:
        OnnxModel.infer_runtime_shape = original


@contextlib.contextmanager
def quiet_ort_logging() -> Iterator[None]:
    """ONNX Runtime's transformer tools at ERROR for the block: the optimizer logs expected noise
    (symbolic shape inference on dynamic Expand nodes), the quantizer warns on the root logger."""
    import logging

    logger = logging.getLogger("onnxruntime.transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    root = logging.getLogger()
    root_level = root.level
    root.setLevel(logging.ERROR)  # the quantizer warns on the root logger
    try:
        yield
    finally:
        logger.setLevel(level)
        root.setLevel(root_level)


# --------------------------------------------------------------------------------------------
# What the served ONNX Runtime runs
# --------------------------------------------------------------------------------------------


def check_runtime_compatible(model: onnx.ModelProto, *, name: str) -> None:
    """Refuse a graph ONNX Runtime 1.19 (Triton 24.10) would not load."""
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx") and op.version > MAX_OPSET:
            raise ExportError(f"graph uses ONNX opset {op.version}; Triton 24.10's ONNX Runtime "
                              f"1.19 runs up to {MAX_OPSET}", model=name)
    contrib = {n.op_type for n in iter_nodes(model.graph) if n.domain == "com.microsoft"}
    unknown = sorted(contrib - ALLOWED_CONTRIB_OPS)
    if unknown:
        raise ExportError(f"graph uses contrib ops {unknown} not verified on ONNX Runtime 1.19 "
                          f"CPU and CUDA; allowed: {sorted(ALLOWED_CONTRIB_OPS)}", model=name)


def contrib_op_counts(path: Path) -> dict[str, int]:
    """How many of each fused (``com.microsoft``) op the saved graph holds: the proof of fusion."""
    graph = onnx.load(str(path), load_external_data=False).graph
    counts: dict[str, int] = {}
    for node in iter_nodes(graph):
        if node.domain == "com.microsoft":
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))
