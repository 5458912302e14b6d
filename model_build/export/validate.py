"""Prove an exported file computes what the eager model computes, and record a reference.

An export that loads is not an export that is right: a traced branch can freeze a shape, a
padding mask can be dropped, FP16 can overflow. Every output is compared with PyTorch eager on
inputs of several batch sizes and lengths, and sentence embeddings also against
sentence-transformers, an implementation independent of our pooling code.

The reference ``.npz`` written here is what the later ``verify`` step replays against the
packaged tarball, loaded the way the Triton container loads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from triton_mme_cdk.model_build.compare import compare_arrays
from triton_mme_cdk.model_build.errors import AccuracyGateError, ExportError, ValidationMismatchError
from triton_mme_cdk.model_build.export.convert import (
    export_onnx,
    export_torchscript,
    import_onnx,
    load_torchscript,
)
from triton_mme_cdk.model_build.export.eager import (
    Batch,
    calibration_inputs,
    input_names,
    load_module,
    reference_inputs,
    reference_sentences,
    sample_inputs,
    text_batch,
)
from triton_mme_cdk.model_build.export.length_groups import group_lengths
from triton_mme_cdk.model_build.export.memory import RecordedRunner, module_bytes, release_memory
from triton_mme_cdk.model_build.export.optimize import (
    Runner,
    fmt_below,
    optimize_export,
    refuse_int8_over_limit,
    row_cosines,
)
from triton_mme_cdk.model_build.export.sources import resolve_source
from triton_mme_cdk.model_build.manifest import ModelSpec, OnnxFileSource, SyntheticSource, Tolerance
from triton_mme_cdk.model_build.manifest.build_engine import path_weight_bytes
from triton_mme_cdk.model_build.reference import write_reference
from triton_mme_cdk.model_build.types import ExportedModel, ValidationReport

REFERENCE_NAME = "reference.npz"
#: Neighbours compared by the retrieval gate (fewer when there are fewer sample sentences).
TOP_K = 3


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def check_onnx(path: Path, *, model: str | None = None) -> None:
    """``onnx.checker`` on the file path: the path form also checks models above 2 GiB."""
    try:
        onnx.checker.check_model(str(path))
    except Exception as error:  # ValidationError, a protobuf DecodeError, a missing file...
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ExportError(f"onnx checker rejected {str(path)!r}: {first[:300]}", model=model) from None


def compare_outputs(
    model: str, output_name: str, actual: np.ndarray, expected: np.ndarray, tolerance: Tolerance
) -> float:
    """Max ``|actual - expected|``; raises unless ``|a - b| <= atol + rtol * |b|`` everywhere
    and every value is finite (see :func:`model_build.compare.compare_arrays`)."""
    result = compare_arrays(
        output_name, np.asarray(actual), np.asarray(expected), atol=tolerance.atol, rtol=tolerance.rtol
    )
    if not result.ok:
        raise ValidationMismatchError(
            f"model {model!r}: {result.problem}",
            model=model, output=output_name, max_abs_diff=result.max_abs_diff, tolerance=result.allowed,
        )
    return result.max_abs_diff


# --------------------------------------------------------------------------------------------
# Runners: exported file, eager module, source ONNX
# --------------------------------------------------------------------------------------------


def _logical(name: str, fmt: str) -> str:
    # TorchScript names are "<name>__<index>" (Triton's convention); samples use the plain names.
    return name.rsplit("__", 1)[0] if fmt == "torchscript" else name


def exported_feeds(exported: ExportedModel, sample: Batch) -> Batch:
    """The sample keyed and typed as the exported file's inputs."""
    feeds: Batch = {}
    for spec in exported.inputs:
        name = _logical(spec.name, exported.format)
        if name in sample:
            feeds[spec.name] = np.ascontiguousarray(sample[name], dtype=spec.dtype)
        elif name == "token_type_ids" and "input_ids" in sample:
            # BERT-style graphs may take segment ids; a single segment is all zeros.
            feeds[spec.name] = np.zeros_like(sample["input_ids"], dtype=spec.dtype)
        else:
            raise ExportError(
                f"model input {spec.name!r} has no sample value; samples give "
                + ", ".join(sorted(sample)),
                model=exported.name,
            )
    return feeds


#: The CUDA provider's options for validation: FP32 computed as FP32. ONNX Runtime's default,
#: ``use_tf32=1``, rounds FP32 MatMul and Conv inputs to TF32 (10-bit mantissa) on Ampere and newer
#: GPUs; on an H200 that moved MiniLM's embedding by 1.3e-4 and failed the FP32 tolerance of a
#: graph that is exact on the CPU (gpu-check, 2026-11-26). Validation judges the graph; TF32 is
#: the serving runtime's choice, reported by ``make gpu-check``.
VALIDATION_CUDA_OPTIONS = {"use_tf32": "0"}


def onnx_providers() -> list[str | tuple[str, dict[str, str]]]:
    """CUDA first where onnxruntime has it (the endpoint's provider; TF32 off), CPU always."""
    available = ort.get_available_providers()
    cuda: list[str | tuple[str, dict[str, str]]] = (
        [("CUDAExecutionProvider", dict(VALIDATION_CUDA_OPTIONS))] if "CUDAExecutionProvider" in available else [])
    return [*cuda, "CPUExecutionProvider"]


#: The manifest's ``onnxruntime.graph_optimization_level`` as an ONNX Runtime level.
_ORT_LEVELS = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def _onnx_session(path: Path, model: str, level: str | None = None) -> ort.InferenceSession:
    """A session at the graph optimization level the Triton config asks for (unset: all), so
    the graph validated is the graph served: the offline-fused graph is finished by it."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # warnings about unused initializers are noise here
    options.graph_optimization_level = _ORT_LEVELS[level or "all"]
    try:
        return ort.InferenceSession(str(path), options, providers=onnx_providers())
    except Exception as error:
        raise ExportError(f"onnx runtime cannot load {str(path)!r}: {error}"[:400], model=model) from None


def exported_runner(exported: ExportedModel, level: str | None = None) -> Runner:
    """Run the written file as the serving backend would: ONNX Runtime (at the config's graph
    optimization ``level``) or ``torch.jit.load``."""
    names = [o.name for o in exported.outputs]
    if exported.format == "onnx":
        session = _onnx_session(exported.path, exported.name, level)

        def run_onnx(sample: Batch) -> list[np.ndarray]:
            try:
                return list(session.run(names, exported_feeds(exported, sample)))
            except ExportError:
                raise
            except Exception as error:
                raise _run_error(exported.name, "onnx runtime", sample, error) from None

        return run_onnx
    loaded = load_torchscript(exported.path)

    def run_torchscript(sample: Batch) -> list[np.ndarray]:
        feeds = exported_feeds(exported, sample)
        try:
            with torch.no_grad():
                result = loaded(*(torch.from_numpy(feeds[i.name]) for i in exported.inputs))
        except Exception as error:
            raise _run_error(exported.name, "torchscript", sample, error) from None
        return _as_arrays(result)

    return run_torchscript


def _run_error(model: str, what: str, sample: Batch, error: Exception) -> ExportError:
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in sample.items())
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return ExportError(f"{what} failed on inputs {shapes}: {first[:300]}", model=model)


def _as_arrays(result: object) -> list[np.ndarray]:
    items = result if isinstance(result, (tuple, list)) else [result]
    return [item.detach().cpu().numpy() for item in items]  # type: ignore[union-attr]


def eager_runner(spec: ModelSpec, module: torch.nn.Module) -> Runner:
    """PyTorch eager, the ground truth for exports."""

    def run(sample: Batch) -> list[np.ndarray]:
        with torch.inference_mode():
            result = module(**{n: torch.from_numpy(np.ascontiguousarray(sample[n]))
                               for n in input_names(spec, sample)})
        return _as_arrays(result)

    return run


def _source_onnx_runner(spec: ModelSpec, path: Path, exported: ExportedModel) -> Runner:
    # For an onnx source the source file itself is the ground truth (the export may be FP16).
    session = _onnx_session(path, spec.name)
    names = [o.name for o in session.get_outputs()]
    source = ExportedModel(name=spec.name, format="onnx", path=path, inputs=exported.inputs,
                           outputs=exported.outputs)

    def run(sample: Batch) -> list[np.ndarray]:
        return list(session.run(names, exported_feeds(source, sample)))

    return run


def reference_runner(spec: ModelSpec, module: torch.nn.Module | Path | Runner, exported: ExportedModel) -> Runner:
    """Eager PyTorch for a module; ONNX Runtime on the source file for an ``onnx`` source; a
    runner as it is (the eager outputs recorded before the module was freed)."""
    if isinstance(module, Path):
        return _source_onnx_runner(spec, module, exported)
    if isinstance(module, torch.nn.Module):
        return eager_runner(spec, module)
    return module


# --------------------------------------------------------------------------------------------
# validate_export
# --------------------------------------------------------------------------------------------


def validate_export(
    spec: ModelSpec,
    module: torch.nn.Module | Path | Runner,
    exported: ExportedModel,
    samples: Sequence[Batch],
    *,
    source_dir: Path | None = None,
) -> ValidationReport:
    """Compare every output of the exported file with the reference on every sample.

    ``module`` is the eager module, or for an ``onnx`` source the path of the source file.
    With ``source_dir`` given, a sentence-embedding model from a real checkpoint is also compared
    with ``SentenceTransformer(source_dir).encode`` on real sentences.
    """
    level = spec.onnxruntime.graph_optimization_level if spec.onnxruntime else None
    run_exported = exported_runner(exported, level)
    run_reference = reference_runner(spec, module, exported)
    report = ValidationReport(name=spec.name, precision=spec.effective_precision)
    elementwise = elementwise_tolerance_applies(spec)
    cosines: list[float] = []
    for sample in samples:
        actual = run_exported(sample)
        expected = run_reference(sample)
        if len(actual) != len(expected) or len(actual) != len(exported.outputs):
            raise ExportError(
                f"exported model returns {len(actual)} outputs, the reference {len(expected)}; "
                f"the export declares {len(exported.outputs)}",
                model=spec.name,
            )
        for out, a, b in zip(exported.outputs, actual, expected, strict=True):
            if elementwise:
                diff = compare_outputs(spec.name, out.name, a, b, spec.tolerance)
            else:  # still refuses NaN/inf and wrong shapes; the gates below judge the values
                diff = compare_outputs(spec.name, out.name, a, b, Tolerance(atol=np.inf, rtol=0))
            report.max_abs_diff[out.name] = max(report.max_abs_diff.get(out.name, 0.0), diff)
            cosines.append(float(row_cosines(a, b).min()))
        report.samples += 1
    if spec.task == "sentence-embedding" and exported.outputs:
        _retrieval_check(spec, run_exported, run_reference, source_dir, report, cosines)
    report.min_cosine = min(cosines, default=1.0)
    check_gates(spec, report)
    if has_sentence_transformers_reference(spec, source_dir):
        assert source_dir is not None
        _check_sentence_transformers(spec, exported, run_exported, source_dir, report)
    return report


def elementwise_tolerance_applies(spec: ModelSpec) -> bool:
    """``tolerance`` judges FP32 graphs, and FP16/INT8 ones only where the manifest sets it.

    Lower precision moves single values by more than FP32's default ``atol``; for those the
    accuracy gates (cosine, retrieval agreement) are the check unless a user asks for both.
    """
    return spec.effective_precision == "fp32" or "tolerance" in spec.model_fields_set


def top_k_agreement(expected: np.ndarray, actual: np.ndarray, k: int) -> float:
    """Share of each sentence's k nearest neighbours (by cosine, itself excluded) that the
    variant's embeddings keep: 1.0 means every search over the samples ranks the same top k."""
    def neighbours(emb: np.ndarray) -> list[set[int]]:
        unit = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        sims = unit @ unit.T
        np.fill_diagonal(sims, -np.inf)
        # A stable sort on the negated similarity: ties resolved by index, the same both sides.
        return [set(np.argsort(-row, kind="stable")[:k].tolist()) for row in sims]

    ref, got = neighbours(np.asarray(expected, np.float64)), neighbours(np.asarray(actual, np.float64))
    return float(np.mean([len(r & g) / k for r, g in zip(ref, got, strict=True)]))


def _retrieval_check(
    spec: ModelSpec, run: Runner, reference: Runner, source_dir: Path | None,
    report: ValidationReport, cosines: list[float],
) -> None:
    """Embeddings of the sample sentences, variant against reference: cosine and top-k agreement."""
    sentences = reference_sentences(spec)
    if len(sentences) < 3:
        return
    got, want = [], []
    for batch in retrieval_batches(spec, source_dir):
        got.append(run(batch)[0])
        want.append(reference(batch)[0])
    actual, expected = np.concatenate(got), np.concatenate(want)
    cosines.append(float(row_cosines(actual, expected).min()))
    report.top_k = min(TOP_K, len(sentences) - 1)
    report.top_k_agreement = top_k_agreement(expected, actual, report.top_k)


def retrieval_batches(spec: ModelSpec, source_dir: Path | None) -> list[Batch]:
    """The sample sentences as the retrieval check batches them."""
    sentences = reference_sentences(spec)
    chunk = 1 if spec.max_batch_size == 0 else min(8, spec.max_batch_size)
    return [text_batch(spec, source_dir, sentences[i:i + chunk]) for i in range(0, len(sentences), chunk)]


def check_gates(spec: ModelSpec, report: ValidationReport) -> None:
    """Raise :class:`AccuracyGateError` for the first gate the variant misses."""
    cosine_gate, agreement_gate = spec.gates()
    report.min_cosine_gate = cosine_gate
    report.top_k_gate = agreement_gate if report.top_k_agreement is not None else None
    checks = [("min_cosine", report.min_cosine, cosine_gate)]
    if report.top_k_agreement is not None:
        checks.append((f"top_{report.top_k}_agreement", report.top_k_agreement, agreement_gate))
    for metric, value, gate in checks:
        if value is not None and value < gate:
            raise AccuracyGateError(
                f"model {spec.name!r} ({report.precision}): {metric} {fmt_below(value, gate)} against PyTorch "
                f"FP32 is below the gate {gate}; use a higher precision, or keep more layers in "
                "FP32",
                model=spec.name, metric=metric, value=value, gate=gate, precision=report.precision,
            )


def has_source_folder(spec: ModelSpec, source_dir: Path | None) -> bool:
    """A folder of the source's own files (what sentence-transformers and ``CrossEncoder`` load)."""
    return (
        not isinstance(spec.source, (SyntheticSource, OnnxFileSource))
        and source_dir is not None
        and source_dir.is_dir()
    )


def has_sentence_transformers_reference(spec: ModelSpec, source_dir: Path | None) -> bool:
    """Whether sentence-transformers is a second reference: a sentence-embedding entry with a
    folder of the source's own files (:func:`has_source_folder`) for it to load."""
    return spec.task == "sentence-embedding" and has_source_folder(spec, source_dir)


def reference_normalizes(spec: ModelSpec, source_dir: Path) -> bool:
    """``normalize_embeddings`` for ``SentenceTransformer.encode`` to mean what the graph computes:
    a folder with ``modules.json`` normalises (or not) in its own pipeline; without one,
    sentence-transformers mean-pools unnormalised and the graph's default pooling normalises."""
    from triton_mme_cdk.model_build.export.pooling import pooling_config

    pooling = pooling_config(source_dir, spec.name)
    return pooling.normalize and not pooling.from_modules


def _check_sentence_transformers(
    spec: ModelSpec, exported: ExportedModel, run: Runner, source_dir: Path, report: ValidationReport
) -> None:
    """Our in-graph pooling against sentence-transformers' own pipeline on real sentences."""
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    sentences = reference_sentences(spec)
    reference = SentenceTransformer(str(source_dir), device="cpu", local_files_only=True)
    # Both sides must truncate alike, or a long sentence differs for a reason that is no bug.
    limit = spec.text_inputs.max_sequence_length
    reference.max_seq_length = min(reference.max_seq_length or limit, limit)
    expected = reference.encode(sentences, convert_to_numpy=True, show_progress_bar=False,
                                normalize_embeddings=reference_normalizes(spec, source_dir))
    chunk = 1 if spec.max_batch_size == 0 else min(8, spec.max_batch_size)
    parts = [run(text_batch(spec, source_dir, sentences[i:i + chunk]))[0]
             for i in range(0, len(sentences), chunk)]
    actual = np.concatenate(parts, axis=0)
    name = f"{exported.outputs[0].name} (vs sentence-transformers)"
    tolerance = spec.tolerance if elementwise_tolerance_applies(spec) else Tolerance(atol=np.inf, rtol=0)
    report.reference_max_abs_diff = compare_outputs(spec.name, name, actual, expected, tolerance)
    report.reference_check = (
        f"sentence-transformers {sentence_transformers.__version__} encode, "
        f"{len(sentences)} sentences"
    )


# --------------------------------------------------------------------------------------------
# Entry point for the build
# --------------------------------------------------------------------------------------------


def trace_sample(samples: Sequence[Batch]) -> Batch:
    """Trace on a padded batch of more than one row where there is one.

    A trace on a single unpadded row is the likeliest to specialise (batch 1, no padding).
    """
    multi = [s for s in samples if next(iter(s.values())).shape[0] > 1]
    return multi[0] if multi else samples[-1]


def export_and_validate(
    spec: ModelSpec, *, base_dir: Path, work_dir: Path, s3_client: object = None
) -> tuple[ExportedModel, ValidationReport, Path]:
    """Resolve, export, check, validate and record a reference for one manifest entry.

    Writes ``work_dir/<name>/model.onnx`` (or ``model.pt``) and ``work_dir/<name>/reference.npz``;
    downloads go to ``work_dir/_sources/<name>`` (no model name starts with ``_``).
    """
    model_dir = work_dir / spec.name
    model_dir.mkdir(parents=True, exist_ok=True)
    source_dir = resolve_source(spec, base_dir=base_dir, work_dir=work_dir / "_sources" / spec.name,
                                s3_client=s3_client)
    if spec.effective_precision == "int8" and source_dir is not None:  # before the slow export
        refuse_int8_over_limit(spec, path_weight_bytes(source_dir))
    samples = sample_inputs(spec, source_dir)
    # INT8's layer choice is calibrated on inputs disjoint from ``samples`` and the sample
    # sentences, which the gates below judge it on.
    calibration = calibration_inputs(spec, source_dir) if spec.effective_precision == "int8" else []
    ref_inputs = reference_inputs(spec, source_dir)
    reference: Path | Runner
    if isinstance(spec.source, OnnxFileSource):
        assert source_dir is not None
        exported = import_onnx(spec, source_dir, model_dir / "model.onnx")
        reference = source_dir
    else:
        # Every eager output the checks compare with is recorded first; the module is freed once
        # exported, so ONNX Runtime's copy of the weights is never held beside PyTorch's (issue 36).
        held = [load_module(spec, source_dir)]
        weights = module_bytes(held[0])
        recorded = RecordedRunner(eager_runner(spec, held[0]))
        recorded.record([*samples, *calibration, ref_inputs, *(
            retrieval_batches(spec, source_dir) if spec.task == "sentence-embedding" else [])])
        if spec.format == "onnx":  # the export gets the last reference and lets go of it once traced
            exported = export_onnx(spec, held.pop(), trace_sample(samples), model_dir / "model.onnx",
                                   on_traced=recorded.drop)
        else:
            exported = export_torchscript(spec, held.pop(), trace_sample(samples), model_dir / "model.pt",
                                          on_traced=recorded.drop)
        recorded.drop()
        release_memory(weights)
        reference = recorded
    # The optimize step (INT8 where asked; fusion and FP16 were done by the export), then the
    # checks, on the file that is packaged.
    exported, optimized = optimize_export(
        spec, exported, calibration, reference_runner(spec, reference, exported),
    )
    # Length grouping (KIND_CPU text models): the served graph, proven equal to the plain one
    # on the samples here, then validated against PyTorch like any other.
    exported, grouping = group_lengths(spec, exported, samples, runner_for=exported_runner)
    if exported.format == "onnx":
        check_onnx(exported.path, model=spec.name)
    report = validate_export(spec, reference, exported, samples, source_dir=source_dir)
    report.length_grouping = grouping
    report.fused_ops = dict(optimized.fused_ops)
    report.quantized_matmuls = optimized.quantized_matmuls
    report.fp32_matmuls = list(optimized.fp32_matmuls)
    report.calibration_min_cosine = optimized.calibration_min_cosine

    ref_outputs = reference_runner(spec, reference, exported)(ref_inputs)
    reference_path = model_dir / REFERENCE_NAME
    write_reference(
        reference_path,
        exported_feeds(exported, ref_inputs),
        {out.name: value for out, value in zip(exported.outputs, ref_outputs, strict=True)},
    )
    return exported, report, reference_path
