"""Fused graphs and precision variants on a small BERT: real export, real ONNX Runtime, real gates.

A synthetic BERT (seeded random weights, 2 layers, hidden 64) goes through the same
``export_and_validate`` the build runs, once per precision; nothing is mocked. The gate tests
tighten a gate past what a variant reaches and check the typed failure.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from triton_mme_cdk.model_build.errors import AccuracyGateError, ManifestError
from triton_mme_cdk.model_build.export.eager import (
    CALIBRATION_SENTENCES,
    calibration_inputs,
    load_module,
    reference_sentences,
    sample_inputs,
)
from triton_mme_cdk.model_build.export.fusion import (
    ALLOWED_CONTRIB_OPS,
    MAX_IR_VERSION,
    MAX_OPSET,
    iter_nodes,
)
from triton_mme_cdk.model_build.export.optimize import fmt_below, matmul_sensitivity, row_cosines
from triton_mme_cdk.model_build.export.validate import (
    check_gates,
    export_and_validate,
    top_k_agreement,
    validate_export,
)
from triton_mme_cdk.model_build.manifest import DEFAULT_GATES, ModelSpec, parse_manifest
from triton_mme_cdk.model_build.types import ValidationReport

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
LAYERS = 2


def tiny_bert(**extra: Any) -> ModelSpec:
    """A small sentence-embedding BERT; ``extra`` sets optimize/precision/accuracy/... ."""
    entry: dict[str, Any] = {
        "name": "tiny-bert",
        "source": {"kind": "synthetic", "architecture": "bert", "seed": 0,
                   "config": {"hidden_size": 64, "num_hidden_layers": LAYERS,
                              "num_attention_heads": 4, "intermediate_size": 256,
                              "vocab_size": 1000, "max_position_embeddings": 64}},
        "task": "sentence-embedding",
        "max_batch_size": 8,
        "text": {"max_sequence_length": 32},
    }
    entry.update(extra)
    return ModelSpec(**entry)


def _build(spec: ModelSpec, tmp: Path) -> tuple[Any, Any]:
    exported, report, _ = export_and_validate(spec, base_dir=ROOT, work_dir=tmp)
    return exported, report


def _ops(path: Path) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for node in iter_nodes(onnx.load(str(path)).graph):
        counts[(node.domain, node.op_type)] = counts.get((node.domain, node.op_type), 0) + 1
    return counts


def _runs_on_ort_119(path: Path) -> None:
    """What Triton 24.10's ONNX Runtime 1.19 needs: opset, IR version, known contrib ops."""
    model = onnx.load(str(path))
    assert model.ir_version <= MAX_IR_VERSION
    assert all(op.version <= MAX_OPSET for op in model.opset_import if op.domain in ("", "ai.onnx"))
    contrib = {n.op_type for n in iter_nodes(model.graph) if n.domain == "com.microsoft"}
    assert contrib <= ALLOWED_CONTRIB_OPS
    onnx.checker.check_model(str(path))


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def fp32_fused(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    return _build(tiny_bert(), tmp_path_factory.mktemp("fp32"))


@pytest.fixture(scope="module")
def int8(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    spec = tiny_bert(name="tiny-int8", precision="int8", instance_group={"kind": "KIND_CPU"})
    return _build(spec, tmp_path_factory.mktemp("int8"))


# --------------------------------------------------------------------------------------------
# Each precision


def test_fp32_is_fused_by_default_and_passes_its_gates(fp32_fused):
    exported, report = fp32_fused
    ops = _ops(exported.path)
    assert ops[("com.microsoft", "Attention")] == LAYERS
    assert ops[("com.microsoft", "EmbedLayerNormalization")] == 1
    assert ("", "Softmax") not in ops  # attention is inside the fused op, not spelled out
    assert report.fused_ops["Attention"] == LAYERS
    assert report.precision == "fp32" and report.min_cosine >= DEFAULT_GATES["fp32"][0]
    assert report.top_k_agreement == 1.0 and report.top_k == 3
    assert report.min_cosine_gate == DEFAULT_GATES["fp32"][0]
    _runs_on_ort_119(exported.path)


def test_optimize_false_leaves_the_plain_export(fp32_fused, tmp_path):
    exported, report = _build(tiny_bert(name="tiny-plain", optimize=False), tmp_path)
    assert not any(domain == "com.microsoft" for domain, _ in _ops(exported.path))
    assert report.fused_ops == {}
    # Same model, same inputs: the fused and the plain graph agree to FP32 rounding.
    sample = sample_inputs(tiny_bert(), None)[2]
    (fused,) = _session(fp32_fused[0].path).run(None, sample)
    (plain,) = _session(exported.path).run(None, sample)
    np.testing.assert_allclose(fused, plain, atol=1e-5)


def test_fused_build_is_byte_identical(fp32_fused, tmp_path):
    exported, _ = _build(tiny_bert(), tmp_path)
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (exported.path, fp32_fused[0].path)]
    assert digest[0] == digest[1]


def test_fp16_keeps_fp32_io_halves_weights_and_passes_its_gates(fp32_fused, tmp_path):
    exported, report = _build(tiny_bert(name="tiny-fp16", precision="fp16"), tmp_path)
    model = onnx.load(str(exported.path))
    assert {i.dtype for i in exported.inputs} == {"int64"}
    assert {o.dtype for o in exported.outputs} == {"float32"}
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
    assert report.fused_ops["Attention"] == LAYERS  # fused first, then converted
    assert exported.path.stat().st_size < 0.6 * fp32_fused[0].path.stat().st_size
    assert DEFAULT_GATES["fp16"][0] <= report.min_cosine < 1.0
    assert report.top_k_agreement >= DEFAULT_GATES["fp16"][1]
    _runs_on_ort_119(exported.path)


def test_int8_quantizes_matmuls_per_channel_and_passes_its_gates(int8, fp32_fused):
    exported, report = int8
    ops = _ops(exported.path)
    assert ops.get(("", "MatMulInteger"), 0) == report.quantized_matmuls > 0
    assert ops[("com.microsoft", "Attention")] == LAYERS  # MatMul only: attention stays fused
    # KIND_CPU: served grouped by length (the encoder in one Loop); parity with the plain INT8 graph
    # is judged by the cosine gate, as INT8 activation scales depend on the rows beside them.
    assert ops[("", "Loop")] == 1
    assert report.length_grouping is not None and report.length_grouping.startswith("on"), report.length_grouping
    model = onnx.load(str(exported.path))
    # Per channel: one weight scale per output column of every quantized weight.
    scales = [t for t in model.graph.initializer if t.name.endswith("_scale") and len(t.dims) == 1]
    assert scales and all(t.dims[0] > 1 for t in scales)
    assert exported.path.stat().st_size < fp32_fused[0].path.stat().st_size
    assert DEFAULT_GATES["int8"][0] <= report.min_cosine < 1.0
    assert report.top_k_agreement >= DEFAULT_GATES["int8"][1]
    _runs_on_ort_119(exported.path)


def test_int8_sensitivity_ranks_every_weight_matmul(fp32_fused):
    exported, _ = fp32_fused
    ranked = matmul_sensitivity(exported.path, sample_inputs(tiny_bert(), None))
    # Per layer: attention output, FFN in and FFN out (the QKV projection is inside Attention).
    assert len(ranked) == 3 * LAYERS
    errors = [error for _, error in ranked]
    assert errors == sorted(errors, reverse=True) and all(0 < e < 0.5 for e in errors)


# --------------------------------------------------------------------------------------------
# Gates that fail when they should


def test_int8_past_its_gate_fails_the_build_naming_model_metric_value_gate(tmp_path):
    spec = tiny_bert(name="tiny-int8-strict", precision="int8", instance_group={"kind": "KIND_CPU"},
                     accuracy={"min_cosine": 1.0})
    with pytest.raises(AccuracyGateError) as caught:
        _build(spec, tmp_path)
    error = caught.value
    assert error.model == "tiny-int8-strict" and error.metric == "min_cosine"
    assert error.precision == "int8" and error.value < error.gate
    assert "tiny-int8-strict" in str(error) and "min_cosine" in str(error)
    assert fmt_below(error.value, error.gate) in str(error)
    assert float(fmt_below(error.value, error.gate)) < error.gate


def test_validation_gate_fails_a_graph_that_misses_a_tightened_gate(int8):
    exported, report = int8
    strict = tiny_bert(name="tiny-int8", precision="int8", instance_group={"kind": "KIND_CPU"},
                       accuracy={"min_cosine": min(1.0, report.min_cosine + 1e-7)})
    module = load_module(strict, None)
    with pytest.raises(AccuracyGateError) as caught:
        validate_export(strict, module, exported, sample_inputs(strict, None))
    error = caught.value
    assert (error.model, error.metric, error.precision) == ("tiny-int8", "min_cosine", "int8")
    assert error.value == pytest.approx(report.min_cosine) and error.gate > error.value
    assert "below the gate" in str(error)


def test_fp16_past_its_gate_fails_the_build_naming_model_metric_value_gate(tmp_path):
    spec = tiny_bert(name="tiny-fp16-strict", precision="fp16", accuracy={"min_cosine": 1.0})
    with pytest.raises(AccuracyGateError) as caught:
        _build(spec, tmp_path)
    error = caught.value
    assert (error.model, error.metric, error.precision) == ("tiny-fp16-strict", "min_cosine", "fp16")
    assert error.value < error.gate == 1.0 and "below the gate" in str(error)


def test_top_k_gate_fails_naming_the_agreement_when_the_cosine_gate_holds():
    spec = tiny_bert(name="tiny-int8", precision="int8", instance_group={"kind": "KIND_CPU"})
    cosine_gate, agreement_gate = spec.gates()
    report = ValidationReport(name="tiny-int8", precision="int8", min_cosine=cosine_gate,
                              top_k=5, top_k_agreement=agreement_gate - 0.05)
    with pytest.raises(AccuracyGateError) as caught:
        check_gates(spec, report)
    error = caught.value
    assert (error.metric, error.gate) == ("top_5_agreement", agreement_gate)
    assert error.value == pytest.approx(agreement_gate - 0.05) and "top_5_agreement" in str(error)
    report.top_k_agreement = agreement_gate
    check_gates(spec, report)  # at the gate exactly: passes


def test_int8_is_calibrated_on_inputs_the_gates_never_see():
    """The layer choice and the gate must not share inputs, or the gate would only confirm the
    fit: calibration sentences differ from the validation sentences, random ids from another
    seed, and no calibration row equals a validation row."""
    spec = tiny_bert(precision="int8", instance_group={"kind": "KIND_CPU"})
    assert not set(CALIBRATION_SENTENCES) & set(reference_sentences(spec))
    calibration = calibration_inputs(spec, None)
    validation = sample_inputs(spec, None)
    assert calibration and sum(b["input_ids"].shape[0] for b in calibration) >= 8
    seen = {row.tobytes() for b in validation for row in b["input_ids"]}
    assert not any(row.tobytes() in seen for b in calibration for row in b["input_ids"])
    # A manifest's own sample texts are validation sentences: never calibrated on.
    overlapping = tiny_bert(precision="int8", instance_group={"kind": "KIND_CPU"},
                            text={"max_sequence_length": 32, "sample_texts": list(CALIBRATION_SENTENCES[:3])})
    assert sum(b["input_ids"].shape[0] for b in calibration_inputs(overlapping, None)) == \
        len(CALIBRATION_SENTENCES) - 3


def test_int8_records_its_held_out_and_calibration_figures(int8):
    _, report = int8
    assert report.calibration_min_cosine is not None and report.calibration_min_cosine >= 0.995
    assert report.quantized_matmuls + len(report.fp32_matmuls) == 3 * LAYERS
    assert DEFAULT_GATES["int8"][0] <= report.min_cosine


def test_top_k_agreement_counts_kept_neighbours():
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((6, 8))
    assert top_k_agreement(emb, emb, 3) == 1.0
    assert top_k_agreement(emb, emb + 1e-9, 3) == 1.0
    shuffled = top_k_agreement(emb, rng.standard_normal((6, 8)), 3)
    assert 0.0 <= shuffled < 1.0


def test_row_cosines():
    a = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    b = np.array([[2.0, 0.0], [0.0, 0.0], [-1.0, -1.0]])
    np.testing.assert_allclose(row_cosines(a, b), [1.0, 1.0, -1.0])


# --------------------------------------------------------------------------------------------
# Manifest: invalid combinations refused before any export


def _entry(**extra: Any) -> dict[str, Any]:
    return tiny_bert(**extra).model_dump(mode="json", exclude_unset=True)


BAD: list[tuple[dict[str, Any], list[str]]] = [
    ({"precision": "int8", "tensorrt": {"precision_mode": "FP16"}, "instance_group": {"kind": "KIND_GPU"}},
     ["precision", "'int8'", "tensorrt"]),
    ({"precision": "int8"}, ["precision", "'int8'", "KIND_GPU", "KIND_CPU"]),
    ({"precision": "fp16", "instance_group": {"kind": "KIND_CPU"}}, ["precision", "'fp16'", "KIND_CPU"]),
    ({"fp16": True, "instance_group": {"kind": "KIND_CPU"}}, ["'fp16'", "KIND_CPU"]),
    ({"fp16": True, "precision": "int8", "instance_group": {"kind": "KIND_CPU"}}, ["fp16", "int8"]),
    ({"format": "torchscript", "precision": "fp16"}, ["precision", "torchscript"]),
    ({"format": "torchscript", "optimize": True}, ["optimize", "torchscript"]),
    ({"precision": "int8", "instance_group": {"kind": "KIND_CPU"}, "accuracy": {"min_cosine": 0.9}},
     ["accuracy.min_cosine", "0.9", "0.99", "tightened"]),
    ({"accuracy": {"min_top_k_agreement": 0.5}}, ["accuracy.min_top_k_agreement", "0.5", "1.0"]),
    ({"precision": "bf16"}, ["precision", "bf16"]),
    ({"optimize": True, "onnxruntime": {"graph_optimization_level": "disable_all"}},
     ["onnxruntime.graph_optimization_level", "'disable_all'", "optimize: true", "'all'"]),
]


@pytest.mark.parametrize(("extra", "expected"), BAD, ids=[str(sorted(e)) for e, _ in BAD])
def test_invalid_combinations_are_refused_naming_the_field(extra, expected):
    entry = {**_entry(), **extra}
    with pytest.raises(ManifestError) as caught:
        parse_manifest({"models": [entry]}, origin="m.yaml")
    for part in expected:
        assert part in str(caught.value)


def test_image_models_refuse_optimize():
    entry = {"name": "r", "source": {"kind": "synthetic", "architecture": "resnet"},
             "task": "image-classification", "optimize": True}
    with pytest.raises(ManifestError, match="optimize: true for task 'image-classification'"):
        parse_manifest({"models": [entry]})


def test_tightened_gates_are_taken():
    spec = tiny_bert(precision="int8", instance_group={"kind": "KIND_CPU"},
                     accuracy={"min_cosine": 0.995})
    assert spec.gates() == (0.995, DEFAULT_GATES["int8"][1])
    assert tiny_bert(fp16=True).effective_precision == "fp16"


def test_auto_fusion_is_off_where_the_serving_level_would_not_finish_it():
    from triton_mme_cdk.model_build.export.fusion import should_fuse

    assert should_fuse(tiny_bert(), None)
    assert should_fuse(tiny_bert(onnxruntime={"graph_optimization_level": "extended"}), None)
    assert not should_fuse(tiny_bert(onnxruntime={"graph_optimization_level": "basic"}), None)
    assert not should_fuse(tiny_bert(format="torchscript"), None)


def test_cli_build_past_a_gate_is_one_error_line_without_traceback(tmp_path):
    import subprocess
    import sys

    import yaml

    entry = _entry(name="tiny-int8-strict", precision="int8", instance_group={"kind": "KIND_CPU"},
                   accuracy={"min_cosine": 1.0})
    manifest = tmp_path / "strict.yaml"
    manifest.write_text(yaml.safe_dump({"version": 1, "models": [entry]}))
    done = subprocess.run(
        [sys.executable, "-m", "model_build", "build", "--manifest", str(manifest),
         "--out", str(tmp_path / "build")],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    text = done.stdout + done.stderr
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert "tiny-int8-strict" in lines[0] and "min_cosine" in lines[0] and "gate 1.0" in lines[0]


def test_the_serving_level_finishes_what_the_offline_step_left(fp32_fused, int8, tmp_path):
    """At the config's level (all) ONNX Runtime adds SkipLayerNormalization, and for INT8
    DynamicQuantizeMatMul; the offline file holds neither (they are provider-specific)."""
    def online_ops(path: Path, name: str) -> dict[str, int]:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(tmp_path / name)
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return {op: n for (domain, op), n in _ops(tmp_path / name).items() if domain == "com.microsoft"}

    offline = {op for (domain, op) in _ops(fp32_fused[0].path) if domain == "com.microsoft"}
    assert "SkipLayerNormalization" not in offline
    served = online_ops(fp32_fused[0].path, "fp32.onnx")
    assert served["SkipLayerNormalization"] >= 2 * LAYERS - 1 and served["Attention"] == LAYERS
    served_int8 = online_ops(int8[0].path, "int8.onnx")
    assert served_int8["DynamicQuantizeMatMul"] == int8[1].quantized_matmuls


@pytest.mark.parametrize("task", ["sentence-embedding", "text-classification"])
def test_fusion_is_the_same_with_shape_inference_on_the_skeleton(
    task: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The optimizer's symbolic shape inference runs on the graph's skeleton (issue 36: its
    copies of the whole model were a BERT build's peak memory). The fused graph is byte for byte
    the one the optimizer makes with shape inference on the whole model."""
    from triton_mme_cdk.model_build.export import fusion
    from triton_mme_cdk.model_build.export.convert import export_onnx
    from triton_mme_cdk.model_build.export.eager import load_module, sample_inputs
    from triton_mme_cdk.model_build.export.validate import trace_sample

    spec = tiny_bert(task=task)
    saved: dict[str, bytes] = {}
    for mode in ("skeleton", "whole"):
        if mode == "whole":
            monkeypatch.setattr(fusion, "_shape_inference_on_skeletons", contextlib.nullcontext)
        (tmp_path / mode).mkdir()
        sample = trace_sample(sample_inputs(spec, None))
        exported = export_onnx(spec, load_module(spec, None), sample, tmp_path / mode / "model.onnx")
        saved[mode] = exported.path.read_bytes()
        assert ("com.microsoft", "Attention") in _ops(exported.path), mode
    assert saved["skeleton"] == saved["whole"]


def test_the_skeleton_patch_reaches_the_optimizers_bert_model() -> None:
    """The patched class is the base of the class the optimizer builds for BERT (its tools import
    each other by bare module name), and the patch is undone after."""
    import sys

    from triton_mme_cdk.model_build.export import fusion

    with fusion._shape_inference_on_skeletons():
        base = sys.modules["onnx_model"].OnnxModel
        assert base.infer_runtime_shape.__name__ == "on_skeleton"
        assert base in sys.modules["onnx_model_bert"].BertOnnxModel.__mro__
    assert base.infer_runtime_shape.__name__ == "infer_runtime_shape"
