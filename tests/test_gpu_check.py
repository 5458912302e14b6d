"""`make gpu-check` (benchmarks/gpu_check.py) on a machine without a GPU, and its measuring code run
on the CPU (`--cpu`): the same loaders, batches, timers and table as on a GPU, with real PyTorch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks import gpu_cases, gpu_check, gpu_measure, gpu_table

ROOT = Path(__file__).resolve().parents[1]

_TINY_RESNET = """\
    source:
      kind: synthetic
      architecture: resnet
      config: {embedding_size: 8, hidden_sizes: [8, 8, 8, 8], depths: [1, 1, 1, 1], layer_type: basic, num_labels: 4}
    task: image-classification
    image: {image_size: 32, channels: 3}
"""
#: A tiny ResNet twice: as ONNX with two copies (one row), and as TorchScript (the pytorch backend).
TINY_MANIFEST = (f"version: 1\nmodels:\n  - name: resnet-tiny\n{_TINY_RESNET}    copies: 2\n"
                 f"  - name: resnet-tiny-ts\n{_TINY_RESNET}    format: torchscript\n")


def test_make_gpu_check_without_a_gpu_says_so_in_one_line_and_exits_0(tmp_path: Path) -> None:
    result_file = ROOT / "benchmarks" / "results" / "gpu_check.json"
    before = result_file.read_bytes() if result_file.exists() else None
    env = {**os.environ, "MAKEFLAGS": ""}
    done = subprocess.run(["make", "--no-print-directory", "gpu-check"], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("gpu-check: no CUDA GPU on this machine (") and lines[0].endswith("nothing measured")
    assert (result_file.read_bytes() if result_file.exists() else None) == before  # nothing written


def test_the_check_measures_and_reports_on_the_cpu(tmp_path: Path) -> None:
    manifest = tmp_path / "models.yaml"
    manifest.write_text(TINY_MANIFEST, encoding="utf-8")
    out = tmp_path / "result.json"
    env = {**os.environ, "GPU_CHECK_ITERATIONS": "5"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu", "--manifest", str(manifest),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["schema"] == gpu_table.SCHEMA and result["gpu"]["name"] == "cpu"
    assert result["elapsed_s"] > 0 and f"The check took {result['elapsed_s']:.0f} s" in done.stdout
    rows = {(row["variant"], row["runtime"]): row for row in result["rows"]}
    measured = rows[("fp32", "pytorch-cpu")]
    assert measured["status"] == "measured" and measured["model"] == "resnet-tiny"  # two copies, one row
    for size in (1, 8):
        assert 0 < measured[f"batch{size}"]["p50_ms"] <= measured[f"batch{size}"]["p99_ms"]
    assert measured["cold_start_s"] > 0
    # The ONNX Runtime path (the build's export, a session, the same timers) on the CPU provider:
    # the exported graph agrees with the eager module.
    exported = rows[("fp32", "onnxruntime-cpu")]
    assert exported["status"] == "measured" and exported["parity_vs_pytorch_fp32"]["min_cosine"] > 0.9999
    assert exported["parity_vs_pytorch_fp32"]["max_abs_diff"] < 1e-4
    assert exported["gate"]["passed"] and exported["gate"]["precision"] == "fp32"
    assert "gate" not in measured  # the reference itself
    assert not any(runtime in ("onnxruntime-cuda", "onnxruntime-tensorrt") for _, runtime in rows)
    assert "| resnet-tiny | fp32 | pytorch-cpu |" in done.stdout
    # The served rows: each tarball the build wrote, in the local endpoint's real tritonserver
    # (KIND_CPU here), called over its SageMaker API; the TorchScript entry through the pytorch backend.
    assert result["served_by"]["tritonserver"] == "2.51.0" and result["served_by"]["shm_byte_sizes"][0] > 0
    for model, runtime in (("resnet-tiny", "tritonserver-onnxruntime-cpu"),
                           ("resnet-tiny-ts", "tritonserver-pytorch-cpu")):
        served = next(row for row in result["rows"] if row["model"] == model and row["runtime"] == runtime)
        assert served["status"] == "measured", served
        assert 0 < served["load_s"] < served["cold_start_s"]
        assert 0 < served["batch1"]["p50_ms"] <= served["batch1"]["p99_ms"]
        assert served["gate"]["passed"] and served["parity_vs_pytorch_fp32"]["max_abs_diff"] < 1e-4
        assert "tensorrt_first_load_s" not in served
    assert f"| resnet-tiny-ts | fp32 | tritonserver-pytorch-cpu | {served['cold_start_s']} |" in done.stdout


def test_the_served_entries_are_the_manifest_as_built_and_minilms_variants(tmp_path: Path) -> None:
    from benchmarks.gpu_served import TENSORRT_VARIANT, served_entries
    from triton_mme_cdk.model_build.manifest import load_manifest

    models = list(load_manifest(ROOT / "models.yaml").models)
    entries, rows = served_entries(models, {}, gpu=True)
    assert [(e.spec.name, e.variant) for e in entries] == [
        ("minilm-l6-embedding", "fp32"), ("minilm-l6-embedding", "fp16"), ("minilm-l6-embedding", "tensorrt-fp16"),
        ("resnet-synthetic", "fp32"), ("resnet-synthetic-ts", "fp32")]  # the raw-text target: the same graph
    assert rows == []
    fp16, trt = entries[1].spec, entries[2].spec
    assert fp16.precision == "fp16" and fp16.copies == 1
    assert trt.precision == "fp32" and trt.tensorrt.engine_cache and trt.tensorrt.precision_mode == "FP16"
    assert TENSORRT_VARIANT["engine_cache"] is True
    assert len({e.reference_key for e in entries}) == 2  # one PyTorch reference per source
    entries, rows = served_entries(models, {"minilm-l6-embedding": tmp_path}, gpu=False)
    assert [(e.spec.name, e.variant) for e in entries] == [
        ("minilm-l6-embedding", "fp32"), ("resnet-synthetic", "fp32"), ("resnet-synthetic-ts", "fp32")]
    assert entries[0].spec.source.kind == "local" and entries[0].spec.source.path == str(tmp_path)
    assert [(r["variant"], r["status"]) for r in rows] == [("fp16", "not measured"), ("tensorrt-fp16", "not measured")]


def test_a_variant_entry_leaves_unset_what_the_manifest_left_unset() -> None:
    """The FP16 variant of MiniLM is judged as the manifest's FP16 entries are: by the accuracy
    gates, not by FP32's element-wise tolerance, which the manifest never set (on the first GPU run
    every field was passed, so counted as set, and the served FP16 build was refused)."""
    from triton_mme_cdk.model_build.export.validate import elementwise_tolerance_applies
    from triton_mme_cdk.model_build.manifest import load_manifest

    minilm = load_manifest(ROOT / "models.yaml").models[0]
    assert "tolerance" not in minilm.model_fields_set
    fp16 = gpu_cases.variant_entry(minilm, None, precision="fp16")
    assert fp16.precision == "fp16" and fp16.copies == 1
    assert "tolerance" not in fp16.model_fields_set and not elementwise_tolerance_applies(fp16)
    assert elementwise_tolerance_applies(gpu_cases.variant_entry(minilm, None))  # FP32: always
    unchanged = set(type(minilm).model_fields) - {"precision", "copies", "fp16"}
    assert {name: getattr(fp16, name) for name in unchanged} == {name: getattr(minilm, name) for name in unchanged}
    # A tolerance the manifest sets still judges the variant element-wise.
    given = {name: getattr(minilm, name) for name in minilm.model_fields_set}
    strict = type(minilm).model_validate({**given, "tolerance": {"atol": 1e-3, "rtol": 1e-3}})
    assert elementwise_tolerance_applies(gpu_cases.variant_entry(strict, None, precision="fp16"))


def test_gpu_provider_rows_say_why_they_cannot_run_here(tmp_path: Path) -> None:
    """Without onnxruntime-gpu's providers (this machine) each GPU row is 'not measured' with the
    reason, and nothing is exported for it."""
    from triton_mme_cdk.model_build.manifest import load_manifest

    manifest = tmp_path / "models.yaml"
    manifest.write_text(TINY_MANIFEST, encoding="utf-8")
    spec = load_manifest(manifest).models[0]
    cases, rows = gpu_cases.ort_cases(spec, None, tmp_path, tmp_path / "work", gpu_cases.ORT_VARIANTS,
                                      ["CPUExecutionProvider"])
    assert cases == [] and not (tmp_path / "work").exists()
    assert [(row["variant"], row["runtime"], row["status"]) for row in rows] == [
        ("fp32", "onnxruntime-cuda", "not measured"), ("fp32-no-tf32", "onnxruntime-cuda", "not measured"),
        ("fp16", "onnxruntime-cuda", "not measured"), ("tensorrt-fp16", "onnxruntime-tensorrt", "not measured")]
    assert "onnxruntime has no CUDAExecutionProvider" in rows[0]["reason"]
    # With the provider but not the TensorRT library, the row names the library.
    _, rows = gpu_cases.ort_cases(spec, None, tmp_path, tmp_path / "work", gpu_cases.ORT_VARIANTS[3:],
                                  ["TensorrtExecutionProvider", "CPUExecutionProvider"])
    assert gpu_cases.TENSORRT_LIBRARY in rows[0]["reason"] and "TensorRT is not on this machine" in rows[0]["reason"]


def test_a_graph_refused_by_the_cpu_gate_is_still_measured_and_says_so(tmp_path: Path) -> None:
    from triton_mme_cdk.model_build.errors import ValidationMismatchError

    spec = type("Spec", (), {"name": "m"})()
    refused = ValidationMismatchError("largest |difference| 0.00013", model="m", output="y", max_abs_diff=1.3e-4)
    assert gpu_cases.exported_despite(refused, spec, tmp_path) is None  # nothing written
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.onnx").write_bytes(b"graph")
    assert gpu_cases.exported_despite(refused, spec, tmp_path) == tmp_path / "m" / "model.onnx"
    assert gpu_cases.exported_despite(RuntimeError("export failed"), spec, tmp_path) is None


def test_a_cpu_run_never_replaces_the_gpu_result() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: --cpu: give --out; a CPU run never replaces the GPU result")


def test_percentiles_and_parity() -> None:
    samples = [i / 1000 for i in range(1, 101)]  # 1 ms .. 100 ms
    assert gpu_measure.percentiles(samples) == {"p50_ms": 50.5, "p99_ms": 99.0}
    reference = np.array([[1.0, 0.0], [0.0, 2.0]])
    same = gpu_measure.parity(reference, reference)
    assert same == {"min_cosine": 1.0, "max_abs_diff": 0.0}
    off = gpu_measure.parity(np.array([[1.0, 0.0], [0.0, 2.5]]), reference)
    assert off["max_abs_diff"] == 0.5 and off["min_cosine"] == 1.0
    turned = gpu_measure.parity(np.array([[0.0, 1.0], [0.0, 2.0]]), reference)
    assert turned["min_cosine"] == 0.0


def test_the_docs_show_the_committed_gpu_result() -> None:
    result = json.loads((ROOT / "benchmarks" / "results" / "gpu_check.json").read_text(encoding="utf-8"))
    assert result["schema"] == gpu_table.SCHEMA and result["gpu"]["name"] != "cpu"
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert "## GPU check (`make gpu-check`)" in page
    assert gpu_table.markdown(result).rstrip() in page


def test_each_variant_is_judged_by_its_precisions_gates() -> None:
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((8, 16))
    assert gpu_measure.judge(reference, reference, "fp32")["passed"]
    drifted = reference + 5e-3  # TF32-sized drift is 1e-4; this is 5x the FP32 tolerance
    fp32 = gpu_measure.judge(drifted, reference, "fp32")
    assert not fp32["passed"] and "exceeds the tolerance" in fp32["problem"]
    assert gpu_measure.judge(drifted, reference, "fp16")["passed"]  # FP16 allows 2e-2
    swapped = gpu_measure.judge(reference[::-1], reference, "tensorrt-fp16")
    assert not swapped["passed"] and "below the fp16 gate 0.999" in swapped["problem"]
    result = {"rows": [
        {"model": "m", "variant": "fp16", "runtime": "onnxruntime-cuda", "status": "measured", "gate": swapped},
        {"model": "m", "variant": "fp32", "runtime": "onnxruntime-cuda", "status": "measured",
         "gate": gpu_measure.judge(reference, reference, "fp32")},
        {"model": "m", "variant": "tensorrt-fp16", "runtime": "onnxruntime-tensorrt", "status": "not measured"},
    ]}
    (line,) = gpu_measure.outside_gates(result)
    assert line.startswith("m fp16 (onnxruntime-cuda): ")
    assert gpu_check._verdict(result) == 1 and gpu_check._verdict({"rows": result["rows"][1:]}) == 0


def test_the_tensorrt_variant_is_served_as_published_with_its_engine_cache(tmp_path: Path) -> None:
    """What the served TensorRT row loads on a GPU, prepared here: the build's config keeps
    ``KIND_GPU`` and the provider's keys in the unpacked folder, the row is named for the provider,
    and the engine cache it clears before the first load (and counts after the second) is the
    model's own folder under the cache root."""
    from benchmarks.gpu_served import TENSORRT_VARIANT, ServedModel, _engine_cache_folders, runtime_name
    from triton_mme_cdk.model_build.manifest import load_manifest
    from triton_mme_cdk.model_build.manifest.fields import ENGINE_CACHE_ROOT
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_model

    manifest = tmp_path / "models.yaml"
    manifest.write_text(TINY_MANIFEST, encoding="utf-8")
    spec = gpu_cases.variant_entry(load_manifest(manifest).models[0], None, precision="fp32", tensorrt=TENSORRT_VARIANT)
    release = tmp_path / "release"
    built = build_model(spec, BuildOptions(base_dir=tmp_path), release_dir=release, work_dir=tmp_path / "work")
    served = ServedModel(None, "resnet-tiny/tensorrt-fp16", release / built.tarball,
                         (release / built.config).read_text(), tmp_path / "models", gpu=True)
    assert runtime_name(served.config, True) == "tritonserver-onnxruntime-tensorrt"
    assert runtime_name(served.config, False) == "tritonserver-onnxruntime-cpu"
    [cache] = _engine_cache_folders(served.config)
    assert cache.parent == Path(ENGINE_CACHE_ROOT) and cache.name.startswith("resnet-tiny-")
    [unpacked] = served.directory.rglob("config.pbtxt")
    text = unpacked.read_text()
    assert "KIND_GPU" in text and 'name: "tensorrt"' in text and f'value: "{cache}"' in text
    assert not served.loaded


def test_the_stub_context_figures_are_unknown_without_a_driver_never_zero() -> None:
    """``benchmarks.gpu_context`` measures what a CUDA process holds for being one; on a machine
    without an NVIDIA driver (this one) each figure is null with the reason, never 0."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_context"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["schema"] == "triton-mme/gpu-context/1"
    assert set(result["figures"]) == {"cuda_context", "onnxruntime_cuda_session", "torch_cuda"}
    for figure in result["figures"].values():
        assert figure["mib"] is None and "no NVIDIA driver" in figure["reason"]


def test_a_stub_context_figure_a_child_cannot_make_is_unknown_with_the_childs_reason(monkeypatch) -> None:
    """The child's own failure (here: this machine's CPU torch) or its silence past the start limit
    leaves the figure unknown with the reason; only the device reading is replaced (no driver here)."""
    from benchmarks import gpu_context

    monkeypatch.setattr(gpu_context, "used_mib", lambda: 1000.0)
    figure = gpu_context.measure("torch_cuda", sys.executable)
    assert figure["mib"] is None and "has no CUDA GPU" in figure["reason"]
    figure = gpu_context.measure("cuda_context", sys.executable)
    assert figure["mib"] is None and "libcuda.so.1" in figure["reason"]
    monkeypatch.setattr(gpu_context, "START_TIMEOUT_S", 0.01)
    figure = gpu_context.measure("onnxruntime_cuda_session", sys.executable)
    assert figure == {"mib": None, "reason": "the child was not ready within 0.01 s"}
