"""Make the exported graph faster without changing what it computes beyond a measured gate.

Three independent steps, applied to the FP32 export in this order:

1. **Fusion** (``optimize``): ONNX Runtime's transformer optimizer
   (``onnxruntime.transformers.optimizer.optimize_model``, model type ``bert``) rewrites the
   attention blocks into ``com.microsoft`` ``Attention``, the embeddings into
   ``EmbedLayerNormalization`` and the FFN activation into ``BiasGelu``. It only recognises the
   *eager* attention pattern (transformers' default SDPA export fuses nothing), so the export is
   traced with eager attention when fusing (:func:`model_build.export.convert.export_onnx`). It runs with
   ``opt_level=1``: ONNX Runtime's *basic* optimizations (constant folding, redundant node
   elimination), which are the same for every execution provider, are baked in because the
   attention pattern is only visible after constant folding. The provider-specific *extended*
   and layout optimizations (SkipLayerNormalization, MatMul+Add fusions, NCHWc...) are left to
   the serving session, whose ``graph_optimization_level`` (default ``all``) applies them for
   the provider the model actually runs on; re-running the basic level there finds nothing left
   to do. The contrib ops used (Attention, EmbedLayerNormalization, BiasGelu) have CPU and CUDA
   kernels in ONNX Runtime 1.19, the version of Triton 24.10's onnxruntime backend, and the
   ONNX opset stays the export's (18); the IR version is reset to the export's so an older
   runtime loads the file.
2. **FP16** (``precision: fp16``): weights and compute in FP16, inputs and outputs FP32, with
   onnxruntime's converter (it knows which ops must stay FP32).
3. **INT8** (``precision: int8``): dynamic quantization, weights int8 symmetric *per channel*,
   activations uint8 per tensor at run time, **MatMul only** (the fused Attention keeps its
   FP32 projection: quantizing it cost accuracy and, measured, speed). A naive quantization of
   every MatMul lost accuracy (MiniLM min cosine 0.986 against FP32); so the MatMuls are ranked
   by the error their quantization causes on real activations (:func:`matmul_sensitivity`) and
   the most sensitive ones are kept in FP32, one more at a time, until the quantized graph
   meets the model's cosine gate on the calibration inputs (:func:`quantize_int8`).

Every step is a pure function of the graph and the seeded inputs: two builds give the same bytes.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from triton_mme_cdk.model_build.errors import AccuracyGateError, ExportError
from triton_mme_cdk.model_build.export import onnx_weights
from triton_mme_cdk.model_build.export.convert import onnx_signature
from triton_mme_cdk.model_build.export.eager import Batch
from triton_mme_cdk.model_build.export.fusion import (
    check_runtime_compatible,
    contrib_op_counts,
    prune_opsets,
    quiet_ort_logging,
)
from triton_mme_cdk.model_build.export.onnx_weights import EXTERNAL_DATA_SUFFIX, save_onnx
from triton_mme_cdk.model_build.manifest import ModelSpec
from triton_mme_cdk.model_build.types import ExportedModel

Runner = Callable[[Batch], list[np.ndarray]]


@dataclass
class OptimizeReport:
    """What the optimize step did, for the build table and ``build.json``."""

    fused: bool = False
    precision: str = "fp32"
    fused_ops: dict[str, int] = field(default_factory=dict)
    quantized_matmuls: int = 0
    fp32_matmuls: list[str] = field(default_factory=list)
    calibration_min_cosine: float | None = None


# --------------------------------------------------------------------------------------------
# INT8
# --------------------------------------------------------------------------------------------


def _session(path: Path) -> object:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feeds(session: object, batch: Batch) -> Batch:
    names = [i.name for i in session.get_inputs()]  # type: ignore[attr-defined]
    return {n: np.ascontiguousarray(batch[n]) for n in names if n in batch}


def row_cosines(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Cosine similarity of each batch row (all other axes flattened) of two outputs."""
    a = np.asarray(actual, dtype=np.float64).reshape(actual.shape[0], -1)
    b = np.asarray(expected, dtype=np.float64).reshape(expected.shape[0], -1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    # Two zero rows are the same row; one zero row against a non-zero one is as far as it gets.
    same_zero = (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(b, axis=1) == 0)
    cos = np.where(norms > 0, (a * b).sum(axis=1) / np.where(norms > 0, norms, 1.0), 0.0)
    return np.where(same_zero, 1.0, cos)


def _weight_matmuls(model: onnx.ModelProto) -> list[tuple[str, str, onnx.TensorProto]]:
    """(node name, activation input, 2-D weight initializer) of every MatMul with a constant weight."""
    weights = {t.name: t for t in model.graph.initializer}
    return [(node.name, node.input[0], weights[node.input[1]]) for node in model.graph.node
            if node.op_type == "MatMul" and node.input[1] in weights and len(weights[node.input[1]].dims) == 2]


def matmul_sensitivity(model_path: Path, batches: Sequence[Batch]) -> list[tuple[str, float]]:
    """Relative error each MatMul's own INT8 quantization causes, largest first.

    The FP32 graph is run with every MatMul's activation exposed; each MatMul is then computed
    in numpy both exactly and as the dynamic quantizer does it (activation uint8 asymmetric per
    tensor, weight int8 symmetric per output channel). Layers fed by outlier activations (the
    FFN output after GELU in BERT) show the largest error: those are the ones to keep in FP32.

    Memory (issue 36): the graph is read without its weights where they are external data (the
    saved model keeps them in ``<file>.data`` from 256 MiB on), the probe with the exposed
    outputs is written beside the model so that it refers to the same weights file, and each
    weight is read as an array only for its own MatMul: no copy of the weights is held beside
    ONNX Runtime's, and none is serialized whole.
    """
    model = onnx.load(str(model_path), load_external_data=False)
    matmuls = _weight_matmuls(model)
    exposed = {activation for _, activation, _ in matmuls}
    known = {o.name for o in model.graph.output}
    for name in sorted(exposed - known):
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    folder = model_path.parent
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-", suffix=".onnx") as probe:
        onnx.save_model(model, probe.name)
        session = _session(Path(probe.name))
        names = [o.name for o in session.get_outputs()]  # type: ignore[attr-defined]
        runs = [dict(zip(names, session.run(None, _feeds(session, b)), strict=True))  # type: ignore[attr-defined]
                for b in batches]
        del session
    errors: list[tuple[str, float]] = []
    for node, activation, tensor in matmuls:
        weight = onnx.numpy_helper.to_array(tensor, base_dir=str(folder))
        scale_w = np.abs(weight).max(axis=0) / 127.0
        scale_w[scale_w == 0] = 1.0
        wq = np.round(weight / scale_w) * scale_w
        num = den = 0.0
        for run in runs:
            a = run[activation].astype(np.float64)
            lo, hi = min(a.min(), 0.0), max(a.max(), 0.0)
            scale_a = (hi - lo) / 255.0 or 1.0
            zero = np.round(-lo / scale_a)
            aq = (np.clip(np.round(a / scale_a) + zero, 0, 255) - zero) * scale_a
            exact = a @ weight
            num += float(((aq @ wq - exact) ** 2).sum())
            den += float((exact**2).sum())
        errors.append((node, (num / den) ** 0.5 if den else 0.0))
    return sorted(errors, key=lambda item: (-item[1], item[0]))


def _quantize(src: Path, dst: Path, exclude: Sequence[str]) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with warnings.catch_warnings(), quiet_ort_logging():
        warnings.simplefilter("ignore")
        quantize_dynamic(
            str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
            op_types_to_quantize=["MatMul"], nodes_to_exclude=list(exclude),
        )


def _min_cosine(path: Path, batches: Sequence[Batch], expected: Sequence[list[np.ndarray]]) -> float:
    session = _session(path)
    worst = 1.0
    for batch, outputs in zip(batches, expected, strict=True):
        actual = session.run(None, _feeds(session, batch))  # type: ignore[attr-defined]
        for a, b in zip(actual, outputs, strict=True):
            worst = min(worst, float(row_cosines(a, b).min()))
    return worst


def fmt_below(value: float, gate: float) -> str:
    """``value`` with just enough decimals to be visibly below ``gate`` (0.99999987, not 1.000000)."""
    for digits in range(4, 13):
        if f"{value:.{digits}f}" != f"{gate:.{digits}f}":
            return f"{value:.{digits}f}"
    return repr(value)


def quantize_int8(
    spec: ModelSpec, fp32_path: Path, out_path: Path, batches: Sequence[Batch], reference: Runner,
    report: OptimizeReport,
) -> onnx.ModelProto:
    """Quantize, keeping the most sensitive MatMuls in FP32 until the cosine gate holds.

    The gate is the model's own (``accuracy.min_cosine`` or the int8 default) against the
    FP32 reference on the calibration batches; if even keeping every MatMul but one in FP32
    misses it, INT8 brings nothing for this model and the build fails naming the gate.
    """
    gate, _ = spec.gates()
    # Headroom: the layer choice must hold on inputs it was not chosen on, so the search aims
    # half-way between the gate and 1 (0.995 for the default 0.99); validation checks the gate.
    target = 1.0 - (1.0 - gate) / 2
    expected = [reference(b) for b in batches]
    ranked = [name for name, _ in matmul_sensitivity(fp32_path, batches)]
    best = -1.0
    for kept in range(len(ranked)):
        exclude = ranked[:kept]
        _quantize(fp32_path, out_path, exclude)
        cosine = _min_cosine(out_path, batches, expected)
        best = max(best, cosine)
        if cosine >= target:
            report.quantized_matmuls = len(ranked) - kept
            report.fp32_matmuls = sorted(exclude)
            report.calibration_min_cosine = cosine
            return onnx.load(str(out_path))
    raise AccuracyGateError(
        f"model {spec.name!r} (int8): min_cosine {fmt_below(best, target)} against PyTorch FP32 "
        f"is below {target:g} (the gate {gate} with headroom) even with all but one of {len(ranked)} "
        "MatMuls kept in FP32; use precision fp32",
        model=spec.name, metric="min_cosine", value=best, gate=target, precision="int8",
    )


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def refuse_int8_over_limit(spec: ModelSpec, weight_bytes: int) -> None:
    """Raise :class:`ExportError` for INT8 of weights over the 2 GiB protobuf limit.

    The sensitivity search runs the FP32 graph with every MatMul's activation exposed and ONNX
    Runtime's dynamic quantizer loads it: both take the model as one protobuf, which cannot hold
    more than 2 GiB. Refused with the size, before the export where the source's files tell it
    (:mod:`model_build.export.validate`), else when the export has written its weights aside."""
    if weight_bytes < onnx_weights.PROTO_LIMIT:
        return
    raise ExportError(
        f"precision: got 'int8', but the model's weights are {weight_bytes / 2**30:.1f} GiB and the INT8 build "
        "(the MatMul sensitivity search and ONNX Runtime's dynamic quantizer) needs the graph in one protobuf, "
        "which holds at most 2 GiB; use precision fp32 (or fp16 on KIND_GPU)",
        model=spec.name,
    )


def optimize_export(
    spec: ModelSpec,
    exported: ExportedModel,
    calibration: Sequence[Batch],
    reference: Runner,
) -> tuple[ExportedModel, OptimizeReport]:
    """The build step between export and validation: INT8 where asked, and the step's record.

    Fusion and FP16 are already done by the export (:func:`model_build.export.convert.export_onnx`: the
    exported file is the served one, so a re-export gives the same bytes); INT8 needs
    calibration inputs and the FP32 reference, which only the build has.
    """
    precision = spec.effective_precision
    report = OptimizeReport(precision=precision)
    if exported.format != "onnx":
        return exported, report
    if precision == "int8":
        side = exported.path.with_name(exported.path.name + EXTERNAL_DATA_SUFFIX)
        if side.is_file():  # save_onnx wrote the weights beside the graph: over the protobuf limit
            refuse_int8_over_limit(spec, side.stat().st_size)
        # The FP32 files are copied, not loaded: a loaded graph held the weights once more through
        # the whole quantization, its peak (issue 36).
        ir_version = onnx.load(str(exported.path), load_external_data=False).ir_version
        with tempfile.TemporaryDirectory(dir=exported.path.parent, prefix=".int8-") as scratch:
            fp32_path = Path(scratch) / exported.path.name
            shutil.copyfile(exported.path, fp32_path)
            if side.is_file():
                shutil.copyfile(side, Path(scratch) / side.name)
            quantized = quantize_int8(spec, fp32_path, Path(scratch) / "int8.onnx", calibration,
                                      reference, report)
            quantized = prune_opsets(quantized, ir_version)
        check_runtime_compatible(quantized, name=spec.name)
        save_onnx(quantized, exported.path)
        inputs, outputs = onnx_signature(exported.path, model_name=spec.name)
        exported = ExportedModel(name=spec.name, format="onnx", path=exported.path, inputs=inputs,
                                 outputs=outputs)
    report.fused_ops = contrib_op_counts(exported.path)
    report.fused = bool(report.fused_ops.get("Attention"))  # what the file holds (not fused above 2 GiB)
    return exported, report
