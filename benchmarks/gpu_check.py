"""``make gpu-check``: the prepared check for the day a GPU machine is available (issue 37).

Every other check of this project runs on CPU. This one measures, on one CUDA GPU, what decides
whether the default manifest's models serve well on a GPU fleet: per model and variant, the cold
start (weights already in host memory: the download is the platform's, not the model's), warm
p50/p99 at batch 1 and 8, the GPU memory the loaded model holds, and fp16 / TensorRT parity
against PyTorch FP32 on the same GPU (lowest cosine of any output row, largest absolute
difference). With ONNX Runtime's CUDA and TensorRT execution providers present
(``onnxruntime-gpu``), the exported ONNX graphs run through them too, and the TensorRT provider's
first load (its engine compile) is timed on its own.

One run writes ``benchmarks/results/gpu_check.json`` and the "GPU check" table of
``docs/benchmarks.md``. A row that cannot be measured here says why (``status: not measured``),
never a number from something else. On a machine without a CUDA GPU it prints one line and exits
0, before any model is loaded.

Then every entry is built by the project's build and served by the local endpoint's real
``tritonserver`` with GPU runtimes (:mod:`benchmarks.gpu_served`): the ``tritonserver-*`` rows.

What differs from the SageMaker image is written into the result (:data:`DIFFERS_FROM_SAGEMAKER`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import gpu_context
from benchmarks.gpu_cases import (
    CPU_ORT_VARIANTS,
    ORT_VARIANTS,
    SEQUENCE,
    Case,
    Gpu,
    imported_ort_version,
    log,
    model_batches,
    not_measured,
    ort_cases,
    ort_providers,
    ort_runtime,
    preload_cuda_libraries,
    probe_cuda,
    torch_case,
)
from benchmarks.gpu_measure import ITERATIONS, judge, outside_gates, parity, percentiles
from benchmarks.gpu_served import served_rows
from benchmarks.gpu_table import DOCS_PATH, RESULT_PATH, SCHEMA, markdown

ROOT = Path(__file__).resolve().parents[1]
DIFFERS_FROM_SAGEMAKER = (
    "pytorch-* and onnxruntime-* rows: PyTorch eager and ONNX Runtime in the check's own process; no "
    "HTTP, no dynamic batcher, no SageMaker model download or unpack.",
    "tritonserver-* rows: the build's tarball in tritonserver 2.51 of nvidia-pytriton over its SageMaker "
    "API (load, invoke), as the local endpoint serves it. Its onnxruntime and pytorch backends are the "
    "local endpoint's python-based stand-ins (model_build/tools/local_endpoint/triton_backends): each model instance "
    "runs in a python backend stub process with its own CUDA context (counted in its GPU memory) and "
    "tensors pass through shared memory; the image's C++ backends run inside the server's process. "
    "The SageMaker front, its download and unpack are not measured.",
    "Versions: the CUDA, cuDNN and TensorRT of the installed wheels (see machine), not the image's "
    "(model_build/gpu_hosts.py lists each image's CUDA and TensorRT).",
    "GPU: whatever this machine has; the fleet runs T4 (g4dn), A10G (g5) or V100 (p3), whose "
    "latencies and memory differ.",
)


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


def measure(
    case: Case, batches: dict[int, dict[str, Any]], reference: Any, gpu: Any
) -> tuple[dict[str, Any], Any]:
    """Cold start, memory, warm latency and parity of one case (the reference: PyTorch FP32's
    outputs on the batch of 8; None for PyTorch FP32 itself), and its outputs on that batch."""
    row: dict[str, Any] = {"model": case.model, "variant": case.variant, "runtime": case.runtime}
    gpu.synchronize()
    used_before = gpu.used_bytes()
    started = time.perf_counter()
    call = case.load()
    outputs = call(batches[1])
    gpu.synchronize()
    row["cold_start_s"] = round(time.perf_counter() - started, 4)
    row["gpu_memory_mib"] = round((gpu.used_bytes() - used_before) / 2**20, 1)
    for size, batch in batches.items():
        for _ in range(5):
            call(batch)
        samples = []
        for _ in range(ITERATIONS):
            begin = time.perf_counter()
            outputs = call(batch)
            samples.append(time.perf_counter() - begin)
        row[f"batch{size}"] = percentiles(samples)
    outputs = call(batches[8])
    row["parity_vs_pytorch_fp32"] = None if reference is None else parity(outputs, reference)
    if reference is not None:
        row["gate"] = judge(outputs, reference, case.variant)
    del call
    if case.build_validation:
        row["build_validation_refused"] = case.build_validation
    row["status"] = "measured"
    return row, outputs


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def run(manifest_path: Path, sources: dict[str, Path], torch: Any, device: str = "cuda") -> dict[str, Any]:
    """Every row of the check on this machine's GPU (``device="cpu"``: the same code on the CPU)."""
    from triton_mme_cdk.model_build.export.sources import resolve_source
    from triton_mme_cdk.model_build.manifest import load_manifest

    started_at, started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.monotonic()
    gpu = Gpu(torch, device)
    if device == "cuda":  # the process's CUDA context and cuBLAS handle are the server's start, not a model's
        # The reference is FP32 as computed on a CPU: PyTorch's cuDNN convolutions default to TF32.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        square = torch.ones(64, 64, device="cuda")
        (square @ square).sum().item()
        (square.half() @ square.half()).sum().item()
        gpu.synchronize()
    manifest = load_manifest(manifest_path)
    providers = ort_providers()
    preload = preload_cuda_libraries() if device == "cuda" and "CUDAExecutionProvider" in providers else ""
    if preload:
        log(f"CUDA libraries not preloaded: {preload}")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    #: Per source: PyTorch FP32's outputs on the batch of 8 and the batches, for the served rows.
    references: dict[str, tuple[Any, dict[int, dict[str, Any]]]] = {}
    resolved: dict[str, Path | None] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        for spec in manifest.models:
            key = spec.source.model_dump_json()
            if key in seen or spec.inputs == "text":  # the raw-text target runs the same graph
                continue
            seen.add(key)
            work = Path(scratch) / spec.name
            source_dir = sources.get(spec.name) or resolve_source(
                spec, base_dir=manifest_path.parent, work_dir=work
            )
            log(f"{spec.name}: source {source_dir or 'synthetic'}")
            resolved[spec.name] = source_dir
            batches = model_batches(spec, source_dir)
            fp32 = torch_case(spec, source_dir, torch, half=False, device=device)
            reference = None
            try:
                row, reference = measure(fp32, batches, None, gpu)
                rows.append(row)
                references[key] = (reference, batches)
            except Exception as error:
                rows.append(
                    not_measured(spec.name, "fp32", f"pytorch-{device}", f"{type(error).__name__}: {error}")
                )
            gpu.empty_cache()
            cases = (
                [torch_case(spec, source_dir, torch, half=True, device=device)] if device == "cuda" else []
            )
            gpu_providers = {"CUDAExecutionProvider", "TensorrtExecutionProvider"} & set(providers)
            if device == "cpu":
                more, skipped = ort_cases(
                    spec, source_dir, manifest_path.parent, work, CPU_ORT_VARIANTS, providers
                )
            elif gpu_providers:
                more, skipped = ort_cases(
                    spec, source_dir, manifest_path.parent, work, ORT_VARIANTS, providers
                )
            else:
                why = (
                    f"onnxruntime {_version('onnxruntime') or '(not installed)'} has providers {providers}; the "
                    "CUDA and TensorRT providers come with onnxruntime-gpu (make gpu-check installs it)"
                )
                more, skipped = (
                    [],
                    [
                        not_measured(
                            spec.name,
                            variant,
                            ort_runtime(p),
                            why,
                        )
                        for p, variant, _ in ORT_VARIANTS
                    ],
                )
            cases += more
            rows += skipped
            for case in cases:
                try:
                    row, _ = measure(case, batches, reference, gpu)
                    if case.runtime == "onnxruntime-tensorrt":
                        row["tensorrt_first_load_s"] = row[
                            "cold_start_s"
                        ]  # session + engine build + first run
                    rows.append(row)
                except Exception as error:
                    rows.append(
                        not_measured(
                            case.model, case.variant, case.runtime, f"{type(error).__name__}: {error}"
                        )
                    )
                gpu.empty_cache()
        served, served_by = served_rows(manifest_path, list(manifest.models), resolved, references, gpu,
                                        Path(scratch) / "served")
        rows += served
    # What each served row's stub holds for being a CUDA process, measured after every model is
    # unloaded: the capacity plan subtracts it (the image's C++ backends share the server's context).
    stub_context = gpu_context.run(sys.executable) if device == "cuda" else None
    return {
        "schema": SCHEMA,
        "started_at": started_at,
        #: The whole check, exports and builds included (the goal: under 10 minutes on one GPU).
        "elapsed_s": round(time.monotonic() - started, 1),
        "manifest": str(
            manifest_path.relative_to(ROOT) if manifest_path.is_relative_to(ROOT) else manifest_path
        ),
        "gpu": gpu.describe(),
        "versions": {
            name: _version(name)
            for name in ("torch", "onnxruntime", "onnxruntime-gpu", "tensorrt", "transformers")
        },
        "onnxruntime_imported": imported_ort_version(),
        "onnxruntime_providers": providers,
        "iterations": ITERATIONS,
        "sequence_length": SEQUENCE,
        "served_by": served_by,
        "stub_context": stub_context,
        "differs_from_sagemaker": list(DIFFERS_FROM_SAGEMAKER),
        "rows": rows,
    }


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--manifest", type=Path, default=ROOT / "models.yaml")
    parser.add_argument(
        "--out", type=Path, default=RESULT_PATH, help=f"the JSON result (default {RESULT_PATH})"
    )
    parser.add_argument(
        "--docs", type=Path, default=DOCS_PATH, help="the page whose GPU check section is rewritten"
    )
    parser.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a model's source folder instead of the manifest's (a copy carried to the GPU machine)",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="run the PyTorch FP32 rows on the CPU, to test the check itself (needs --out; never the docs)",
    )
    args = parser.parse_args(argv)
    sources = {}
    for item in args.source:
        name, sep, folder = item.partition("=")
        if not sep or not Path(folder).is_dir():
            print(
                f"error: --source: got {item!r}; expected NAME=DIR with an existing folder", file=sys.stderr
            )
            return 2
        sources[name] = Path(folder).resolve()
    if args.cpu:
        import torch as cpu_torch

        if args.out == RESULT_PATH:
            print("error: --cpu: give --out; a CPU run never replaces the GPU result", file=sys.stderr)
            return 2
        result = run(args.manifest.resolve(), sources, cpu_torch, device="cpu")
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(markdown(result))
        return _verdict(result)
    torch, why = probe_cuda()
    if torch is None:
        print(f"gpu-check: no CUDA GPU on this machine ({why}); nothing measured")
        return 0
    result = run(args.manifest.resolve(), sources, torch)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    log(f"wrote {args.out}")
    print(markdown(result))
    if args.docs.is_file() and args.out.parent == RESULT_PATH.parent:
        from benchmarks.report import write_docs

        write_docs(args.out.parent, args.docs)
        log(f"rewrote {args.docs}")
    return _verdict(result)


def _verdict(result: dict[str, Any]) -> int:
    """0, or 1 with one line per row outside its precision's gates (after the result is written)."""
    outside = outside_gates(result)
    for line in outside:
        print(f"gpu-check: outside the gates: {line}", file=sys.stderr)
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
