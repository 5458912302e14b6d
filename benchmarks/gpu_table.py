"""The GPU check's result file and its table in ``docs/benchmarks.md`` (section "GPU check").

Read by the check that writes the result (:mod:`benchmarks.gpu_check`) and by the page's writer
(:mod:`benchmarks.report`), which renders the committed result; it imports neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import gpu_context

ROOT = Path(__file__).resolve().parents[1]
RESULT_PATH = ROOT / "benchmarks" / "results" / "gpu_check.json"
DOCS_PATH = ROOT / "docs" / "benchmarks.md"
SCHEMA = "triton-mme/gpu-check/1"


def _gate_cell(gate: dict[str, Any] | None) -> str:
    if not gate:
        return "(the reference)"
    rule = f"{gate['precision']}: atol/rtol {gate['atol']:g}, cosine >= {gate['min_cosine']:g}"
    return f"yes ({rule})" if gate["passed"] else f"**no** ({rule})"


def _cold_cell(row: dict[str, Any]) -> str:
    cached = row.get("tensorrt_cached_load_s")
    return f"{row['cold_start_s']} (engine cached: {cached})" if cached is not None else str(row["cold_start_s"])


def context_sentence(stub_context: Any) -> str:
    """What a process holds on this GPU for being a CUDA process (``benchmarks.gpu_context``), or ""."""
    if not isinstance(stub_context, dict) or not isinstance(stub_context.get("figures"), dict):
        return ""
    parts = []
    for key, what in gpu_context.FIGURES.items():
        figure = stub_context["figures"].get(key) or {}
        value = figure.get("mib")
        parts.append(f"{what} {value:g} MiB" if isinstance(value, (int, float)) else f"{what}: unknown ({figure.get('reason')})")
    note = f" {stub_context['note']}" if stub_context.get("note") else ""
    return ("What a process holds on this GPU for being a CUDA process, each in a process of its own "
            f"(`python -m benchmarks.gpu_context`): {'; '.join(parts)}. The capacity plan subtracts the bare "
            "context from each served row: the image's C++ backends share the server's context." + note)


def markdown(result: dict[str, Any]) -> str:
    """The docs table of one result (``docs/benchmarks.md``, section "GPU check")."""
    gpu = result["gpu"]
    lines = [
        f"Run {result['started_at']} on one {gpu['name']} (compute capability {gpu['compute_capability']}, "
        f"{gpu['memory_gib']} GiB, driver {gpu['driver']}, CUDA {gpu['torch_cuda']} of torch "
        f"{result['versions'].get('torch')}); ONNX Runtime {result.get('onnxruntime_imported') or '(none)'} with providers "
        f"{', '.join(result['onnxruntime_providers']) or 'none'}. "
        + (f"The check took {result['elapsed_s']:.0f} s, exports and builds included. " if "elapsed_s" in result else "")
        + f"Text batches padded to {result['sequence_length']} tokens; {result['iterations']} warm calls per batch size. "
        "Cold start: the weights already in host memory, to the GPU and the first answer (for the TensorRT "
        "provider: the session, its engine build and the first answer). Memory: the device's used memory "
        "after the load minus before. Parity: against PyTorch FP32 on the same GPU with TF32 off (strict "
        "FP32), batch of 8.",
        "",
        "Variants: `fp32` and `fp16` under pytorch-cuda are the eager module in FP32 and in half precision; "
        "under onnxruntime-cuda, `fp32` is the build's FP32 graph with the CUDA provider's defaults (TF32 "
        "on Ampere and newer GPUs: A10G, H100, H200; T4 and V100 have none), `fp32-no-tf32` the same graph "
        "with `use_tf32=0` (as the build's validation runs it), `fp16` the graph `precision: fp16` builds; "
        "`tensorrt-fp16` is the FP32 graph in the TensorRT provider with its FP16 mode. Within its gates: "
        "the smoke test's tolerance for an answer served at the variant's precision and the build's lowest "
        "cosine for it; a row outside them makes `make gpu-check` exit 1.",
    ]
    served = result.get("served_by")
    if served is not None:
        lines += ["", (f"Served by tritonserver {served['tritonserver']} ({served['environment']}, Python "
                       f"{served['python']}, python-backend SHM {served['shm_byte_sizes']} from {served['shm_from']}). "
                       if served else "No tritonserver ran (see the rows). ") + (
        "`tritonserver-*` rows: the entry built by the project's build and served by the local endpoint's "
        "tritonserver with its config as published (KIND_GPU), called over the SageMaker API (`POST /models`, "
        "`/models/<name>/invoke`, tritonclient's binary+JSON body). Cold start: the load and the first "
        "answer (the download and unpack excluded); for `tensorrt-fp16` (`tensorrt: {precision_mode: FP16, "
        "engine_cache: true}`) that includes the TensorRT provider's engine compile, and the load after an "
        "unload with the engine cache warm follows in brackets. Latency is over HTTP "
        "on loopback. GPU memory includes the python backend stub's CUDA context.")]
    context = context_sentence(result.get("stub_context"))
    if context:
        lines += ["", context]
    lines += [
        "",
        "| model | variant | runtime | cold start s | p50 / p99 ms, batch 1 | p50 / p99 ms, batch 8 | GPU MiB "
        "| min cosine | max abs diff | within its gates |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        if row["status"] != "measured":
            lines.append(
                f"| {row['model']} | {row['variant']} | {row['runtime']} | not measured: {row['reason']} | | | | | | |"
            )
            continue
        par = row.get("parity_vs_pytorch_fp32") or {}
        b1, b8 = row["batch1"], row["batch8"]
        lines.append(
            f"| {row['model']} | {row['variant']} | {row['runtime']} | {_cold_cell(row)} | "
            f"{b1['p50_ms']} / {b1['p99_ms']} | {b8['p50_ms']} / {b8['p99_ms']} | {row['gpu_memory_mib']} | "
            f"{par.get('min_cosine', '')} | {par.get('max_abs_diff', '')} | {_gate_cell(row.get('gate'))} |"
        )
    lines += ["", "What differs from the SageMaker image:", ""] + [
        f"- {item}" for item in result["differs_from_sagemaker"]
    ]
    return "\n".join(lines) + "\n"
