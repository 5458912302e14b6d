"""`make gpu-check` (benchmarks/gpu_check.py) on a machine without a GPU, and its measuring code run
on the CPU (`--cpu`): the same loaders, batches, timers and table as on a GPU, with real PyTorch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[1]

TINY_MANIFEST = """\
version: 1
models:
  - name: resnet-tiny
    source:
      kind: synthetic
      architecture: resnet
      config: {embedding_size: 8, hidden_sizes: [8, 8, 8, 8], depths: [1, 1, 1, 1], layer_type: basic, num_labels: 4}
    task: image-classification
    image: {image_size: 32, channels: 3}
    copies: 2
"""


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
    assert result["schema"] == gpu_check.SCHEMA and result["gpu"]["name"] == "cpu"
    rows = {(row["variant"], row["runtime"]): row for row in result["rows"]}
    measured = rows[("fp32", "pytorch-cpu")]
    assert measured["status"] == "measured" and measured["model"] == "resnet-tiny"  # two copies, one row
    for size in (1, 8):
        assert 0 < measured[f"batch{size}"]["p50_ms"] <= measured[f"batch{size}"]["p99_ms"]
    assert measured["cold_start_s"] > 0
    # Without onnxruntime-gpu the ONNX Runtime rows say why, with no number.
    for key in (("fp32", "onnxruntime-cuda"), ("tensorrt-fp16", "onnxruntime-tensorrt")):
        assert rows[key]["status"] == "not measured" and "onnxruntime-gpu" in rows[key]["reason"]
        assert "cold_start_s" not in rows[key]
    assert "| resnet-tiny | fp32 | pytorch-cpu |" in done.stdout


def test_a_cpu_run_never_replaces_the_gpu_result() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: --cpu: give --out; a CPU run never replaces the GPU result")


def test_percentiles_and_parity() -> None:
    samples = [i / 1000 for i in range(1, 101)]  # 1 ms .. 100 ms
    assert gpu_check.percentiles(samples) == {"p50_ms": 50.5, "p99_ms": 99.0}
    reference = np.array([[1.0, 0.0], [0.0, 2.0]])
    same = gpu_check.parity(reference, reference)
    assert same == {"min_cosine": 1.0, "max_abs_diff": 0.0}
    off = gpu_check.parity(np.array([[1.0, 0.0], [0.0, 2.5]]), reference)
    assert off["max_abs_diff"] == 0.5 and off["min_cosine"] == 1.0
    turned = gpu_check.parity(np.array([[0.0, 1.0], [0.0, 2.0]]), reference)
    assert turned["min_cosine"] == 0.0


def test_the_docs_show_the_committed_gpu_result() -> None:
    result = json.loads((ROOT / "benchmarks" / "results" / "gpu_check.json").read_text(encoding="utf-8"))
    assert result["schema"] == gpu_check.SCHEMA and result["gpu"]["name"] != "cpu"
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert "## GPU check (`make gpu-check`)" in page
    assert gpu_check.markdown(result).rstrip() in page
