"""Serving the built artifact: MiniLM as the project builds it, ONNX Runtime against PyTorch eager.

The ONNX side is the tarball ``model_build`` produces for ``minilm-l6-embedding`` (models.yaml),
unpacked and opened exactly as the project's container-like check opens it
(:func:`model_build.artifact.backend.open_model`: the session options its generated ``config.pbtxt`` asks
for). The PyTorch side is the same weights as an eager module (:func:`model_build.export.eager.load_module`,
the module the export traced). Fairness:

- same thread count ``n`` (the cores this process may use): ``torch.set_num_threads(n)`` and the
  config's ``intra_op_thread_count`` parameter set to ``n`` (a Triton parameter, so the session
  is still built from the config alone);
- same inputs (seeded token ids, every position attended), same process, warm-up calls excluded,
  runs of the two runtimes interleaved so that load from other processes hits both;
- iterations sized by a time budget per run, at least 3 runs per measurement.

Cold start is measured from the tarball on disk to the first answer (unpack, read the config,
create the session, first request), with the config's options against a session with ONNX
Runtime's defaults (same thread count). Where CUDA is usable (checked at run time) the same
measurements run on the GPU, with the FP16 artifact and the TensorRT execution provider too.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import (
    ROOT,
    RunContext,
    comparison,
    finish_result,
    goal,
    log,
    new_result,
    spec_from,
    stats,
    text_model_entry,
    timed,
    usable_cores,
)
from benchmarks._runtimes import (
    Call,
    measure_latency,
    measure_throughput,
    open_default,
    open_tuned,
    ort_call,
    token_inputs,
    torch_call,
    unpack_model,
    warm_up,
    with_threads,
)

NAME = "inference"
TITLE = "Serving the built MiniLM artifact: ONNX Runtime against PyTorch eager"
GOAL_RATIO = 1.5
GOAL_BATCH = 8
#: Runs per measurement and seconds of calls per run (the model and its shapes are the same in
#: quick and full). Five runs in a full run: on a shared machine one disturbed run must not move
#: the median; a quick run takes three, the least any real run takes.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"repeats": 1, "cold_start_repeats": 1, "latency_budget_s_per_run": 0.05,
             "throughput_budget_s_per_run": 0.05},
    "quick": {"repeats": 3, "cold_start_repeats": 3, "latency_budget_s_per_run": 2.0,
              "throughput_budget_s_per_run": 2.0},
    "full": {"repeats": 5, "cold_start_repeats": 5, "latency_budget_s_per_run": 2.0,
             "throughput_budget_s_per_run": 2.0},
}
THROUGHPUT_BATCHES = (8, 32)

def _cold_start(
    tarball: Path, variants: dict[str, Callable[[Path, Any], Any]], feeds: dict[str, np.ndarray],
    repeats: int, scratch: Path,
) -> dict[str, Any]:
    """From the tarball on disk to the first answer, per variant: unpack (and read the config),
    create the session, first request. The variants alternate; the tarball is in the page cache
    for all of them after the warm-up (disk speed is not what is compared)."""
    parts: dict[str, dict[str, list[float]]] = {
        k: {"unpack_s": [], "session_s": [], "first_request_s": [], "total_s": []} for k in variants
    }
    for repeat in range(-1, repeats):  # -1: warm-up round, not recorded
        order = list(variants) if repeat % 2 == 0 else list(reversed(variants))
        for key in order:
            dest = Path(tempfile.mkdtemp(prefix="cold-", dir=scratch))
            try:
                t_unpack, (model_path, config) = timed(partial(unpack_model, tarball, dest))
                t_session, session = timed(partial(variants[key], model_path, config))
                t_first, _ = timed(ort_call(session, feeds))
                del session
            finally:
                shutil.rmtree(dest, ignore_errors=True)
            if repeat >= 0:
                for name, value in (("unpack_s", t_unpack), ("session_s", t_session),
                                    ("first_request_s", t_first),
                                    ("total_s", t_unpack + t_session + t_first)):
                    parts[key][name].append(value)
    return {key: {name: stats(values) for name, values in p.items()} for key, p in parts.items()}


def _ort_profile(model_path: Path, threads: int, feeds: dict[str, np.ndarray], scratch: Path) -> dict[str, Any]:
    """Share of kernel time by ONNX operator type (ONNX Runtime's own profiler, a few batches).

    The session is built like the tuned one on the CPU (all graph optimizations, sequential,
    ``threads`` intra-op threads), with profiling on.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = str(scratch / "ort-profile")
    session = ort.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])
    call = ort_call(session, feeds)
    runs = 4
    for _ in range(runs):
        call()
    events = json.loads(Path(session.end_profiling()).read_text())
    by_op: dict[str, float] = {}
    for event in events:
        if event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
            op = event.get("args", {}).get("op_name", "?")
            by_op[op] = by_op.get(op, 0.0) + float(event.get("dur", 0))
    return _shares(by_op, runs)


def _torch_profile(module: Any, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    """Share of self CPU time by ATen operator (torch.profiler, a few batches)."""
    import torch

    call = torch_call(module, feeds, "cpu")
    call()
    runs = 3
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(runs):
            call()
    by_op = {item.key: float(item.self_cpu_time_total) for item in prof.key_averages()}
    return _shares(by_op, runs)


def _shares(by_op_us: dict[str, float], runs: int, top: int = 6) -> dict[str, Any]:
    """Top operators by time: share of the total and milliseconds per batch."""
    total = sum(by_op_us.values()) or 1.0
    ranked = sorted(by_op_us.items(), key=lambda kv: kv[1], reverse=True)
    return {
        "top": [{"op": op, "share": round(value / total, 4), "ms_per_batch": round(value / runs / 1000, 3)}
                for op, value in ranked[:top]],
        "total_ms_per_batch": round(total / runs / 1000, 3),
        "ms_per_batch_by_op": {op: round(value / runs / 1000, 3) for op, value in ranked},
    }


#: Operators that are matrix multiplications, in each runtime's profile.
ORT_GEMM_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "QLinearMatMul", "Attention",
                          "MultiHeadAttention"})
TORCH_GEMM_OPS = frozenset({"aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::linear",
                            "aten::baddbmm", "mkldnn::_linear_pointwise"})


def _gemm_ms(profile: dict[str, Any], ops: frozenset[str]) -> float:
    return sum(ms for op, ms in profile["ms_per_batch_by_op"].items() if op in ops)


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------


def run(ctx: RunContext) -> dict[str, Any]:
    import torch

    from triton_mme_cdk.model_build.export.eager import load_module
    from triton_mme_cdk.model_build.export.sources import resolve_source

    started = time.perf_counter()
    threads = ctx.threads or usable_cores()
    chosen = ctx.sizes(SIZES)
    seq = 16 if ctx.tiny else 128
    latency_budget = float(chosen["latency_budget_s_per_run"])
    throughput_budget = float(chosen["throughput_budget_s_per_run"])
    repeats = int(chosen["repeats"])
    cold_repeats = int(chosen["cold_start_repeats"])
    spec = spec_from(text_model_entry(ctx.tiny))
    result = new_result(NAME, TITLE, ctx, {
        "model": spec.name,
        "source": spec.source.model_dump(mode="json"),
        "threads": threads,
        "sequence_length": seq,
        "latency_batch": 1,
        "throughput_batches": list(THROUGHPUT_BATCHES),
        "repeats": repeats,
        "cold_start_repeats": cold_repeats,
        "latency_budget_s_per_run": latency_budget,
        "throughput_budget_s_per_run": throughput_budget,
        "onnx": "the built tarball, opened by model_build.artifact.backend.open_model from its config.pbtxt "
                "(intra_op_thread_count set to the thread count; instance_group KIND_CPU for the CPU runs)",
        "pytorch": "triton_mme_cdk.model_build.export.eager.load_module (the eager module the export traced), torch.inference_mode",
    })
    built, release_dir = ctx.build(spec)
    tarball = release_dir / built.tarball
    result["parameters"]["tarball_bytes"] = built.size
    scratch = ctx.scratch("inference")

    model_path, config = unpack_model(tarball, scratch / "artifact")
    cpu_config = with_threads(config, threads, cpu=True)
    runner = open_tuned(model_path, cpu_config, spec.name)
    torch.set_num_threads(threads)
    module = load_module(spec, resolve_source(spec, base_dir=ROOT, work_dir=scratch / "source"))
    encoder: Any = getattr(module, "encoder", module)  # the export wrapper holds the transformers model
    vocab = int(encoder.config.vocab_size)
    result["parameters"]["onnxruntime_providers"] = list(runner.providers)
    result["parameters"]["config_parameters"] = {k: cpu_config.parameters[k].string_value for k in cpu_config.parameters}

    # Same answer from both (the comparison is of the same computation).
    check = token_inputs(GOAL_BATCH, seq, vocab, seed=7)
    ort_out = ort_call(runner.session, check, runner.run_options)()[0]
    torch_out = torch_call(module, check, "cpu")().numpy()
    result["measurements"]["max_abs_diff_onnx_vs_torch"] = float(np.max(np.abs(ort_out - torch_out)))

    log(f"inference: latency at batch 1, sequence {seq}, {threads} threads")
    feeds1 = token_inputs(1, seq, vocab)
    calls = {"onnxruntime": ort_call(runner.session, feeds1, runner.run_options),
             "pytorch": torch_call(module, feeds1, "cpu")}
    warm_up(calls)
    cpu: dict[str, Any] = {"latency_batch1": measure_latency(calls, repeats, latency_budget), "throughput": {}}
    for batch in THROUGHPUT_BATCHES:
        log(f"inference: throughput at batch {batch}")
        feeds = token_inputs(batch, seq, vocab)
        calls = {"onnxruntime": ort_call(runner.session, feeds, runner.run_options),
                 "pytorch": torch_call(module, feeds, "cpu")}
        warm_up(calls, times=1)
        cpu["throughput"][f"batch{batch}"] = measure_throughput(calls, batch, repeats, throughput_budget)

    log("inference: cold start, tuned options against defaults")
    cold_variants: dict[str, Callable[[Path, Any], Any]] = {
        "tuned": lambda m, c: open_tuned(m, with_threads(c, threads, cpu=True), spec.name).session,
        "default": lambda m, c: open_default(m, threads, ["CPUExecutionProvider"]),
    }
    cpu["cold_start"] = _cold_start(tarball, cold_variants, feeds1, cold_repeats, scratch)
    log("inference: operator profiles")
    feeds8 = token_inputs(GOAL_BATCH, seq, vocab)
    cpu["profile_batch8"] = {"onnxruntime": _ort_profile(model_path, threads, feeds8, scratch),
                             "pytorch": _torch_profile(module, feeds8)}
    cpu["threads"] = threads
    result["measurements"]["cpu"] = cpu
    del runner

    lat = cpu["latency_batch1"]
    result["comparisons"].append(comparison(
        "latency_p50_batch1", what=f"p50 latency, batch 1, sequence {seq}", unit="s",
        baseline_label="PyTorch eager", baseline=lat["pytorch"]["p50_s"],
        candidate_label="ONNX Runtime (config options)", candidate=lat["onnxruntime"]["p50_s"],
        lower_is_better=True,
    ))
    result["comparisons"].append(comparison(
        "latency_p99_batch1", what=f"p99 latency, batch 1, sequence {seq}", unit="s",
        baseline_label="PyTorch eager", baseline=lat["pytorch"]["p99_s"],
        candidate_label="ONNX Runtime (config options)", candidate=lat["onnxruntime"]["p99_s"],
        lower_is_better=True,
    ))
    for batch in THROUGHPUT_BATCHES:
        tp = cpu["throughput"][f"batch{batch}"]
        result["comparisons"].append(comparison(
            f"throughput_batch{batch}", what=f"throughput, batch {batch}, sequence {seq}", unit="sequences/s",
            baseline_label="PyTorch eager", baseline=tp["pytorch"]["sequences_per_s"],
            candidate_label="ONNX Runtime (config options)", candidate=tp["onnxruntime"]["sequences_per_s"],
            lower_is_better=False,
        ))
    cold = cpu["cold_start"]
    result["comparisons"].append(comparison(
        "cold_start", what="tarball on disk to first answer", unit="s",
        baseline_label="ONNX Runtime defaults", baseline=cold["default"]["total_s"],
        candidate_label="config.pbtxt options", candidate=cold["tuned"]["total_s"], lower_is_better=True,
    ))

    gain = next(c["ratio"] for c in result["comparisons"] if c["name"] == f"throughput_batch{GOAL_BATCH}")
    met = gain is not None and gain >= GOAL_RATIO
    result["goals"].append(goal(
        "onnx_throughput_cpu",
        f"on CPU, ONNX Runtime at least {GOAL_RATIO:g}x PyTorch eager throughput at batch {GOAL_BATCH}",
        target=f">= {GOAL_RATIO:g}x",
        measured=gain,
        met=met,
        detail=(f"{threads} threads each, sequence {seq}; medians of {repeats} runs of "
                f"{throughput_budget:g} s."),
        limit="" if met else _limit(cpu),
    ))
    result["notes"].append(_cold_note(cold, cpu_config))

    result["measurements"]["gpu"] = _gpu(ctx, spec, tarball, module, vocab, seq, latency_budget, throughput_budget)
    return finish_result(result, started)


def _limit(cpu: dict[str, Any]) -> str:
    """What keeps ONNX Runtime from a larger lead, from this run's profiles and CPU shares."""
    profile = cpu["profile_batch8"]

    def top(side: str) -> str:
        return ", ".join(f"{item['op']} {item['ms_per_batch']:.0f} ms ({item['share']:.0%})"
                         for item in profile[side]["top"][:4])

    ort_ops = set(profile["onnxruntime"]["ms_per_batch_by_op"])
    fused = sorted(ort_ops & {"Attention", "MultiHeadAttention", "GroupQueryAttention"})
    tp = cpu["throughput"][f"batch{GOAL_BATCH}"]
    ort_total, torch_total = (profile[k]["total_ms_per_batch"] for k in ("onnxruntime", "pytorch"))
    ort_gemm, torch_gemm = _gemm_ms(profile["onnxruntime"], ORT_GEMM_OPS), _gemm_ms(profile["pytorch"], TORCH_GEMM_OPS)
    text = (
        f"measured with each runtime's profiler at batch {GOAL_BATCH} (ms per batch): ONNX Runtime "
        f"{ort_total:.0f} ms of kernels: {top('onnxruntime')}; PyTorch {torch_total:.0f} ms of operators: "
        f"{top('pytorch')}. Matrix multiplications take {ort_gemm:.0f} ms in ONNX Runtime "
        f"({ort_gemm / max(ort_total, 1e-9):.0%}) and {torch_gemm:.0f} ms in PyTorch "
        f"({torch_gemm / max(torch_total, 1e-9):.0%}); everything else {ort_total - ort_gemm:.0f} ms against "
        f"{torch_total - torch_gemm:.0f} ms. "
    )
    if ort_gemm >= 0.8 * torch_gemm:
        text += ("ONNX Runtime's GEMM kernels are no faster than PyTorch's on this CPU, so its lead can only "
                 "come from the rest of the graph. ")
    text += (
        f"The ONNX graph runs attention fused ({', '.join(fused)})."
        if fused else
        "The ONNX graph's attention is not fused (no Attention operator: MatMul, Softmax and Where run "
        "one by one), while PyTorch runs a fused scaled-dot-product attention kernel."
    )
    obtained = [tp[k]["cpu_cores_obtained"]["median"] for k in ("onnxruntime", "pytorch")]
    text += (
        f" CPU this process obtained during the batch-{GOAL_BATCH} runs: ONNX Runtime {obtained[0]:.2f} "
        f"cores, PyTorch {obtained[1]:.2f} cores, for {cpu['threads']} threads each"
    )
    if min(obtained) < 0.9 * cpu["threads"]:
        text += (" (less than the thread count: other processes shared the cores, and threads that wait "
                 "for a descheduled peer slow both runtimes down)")
    return text + "."


#: ONNX Runtime's own CPU session defaults for the config parameters the backend applies on CPU
#: (the others, cudnn_conv_algo_search, arena_extend_strategy, gpu_mem_limit and
#: do_copy_in_default_stream, only configure the CUDA provider).
ORT_CPU_DEFAULTS = {
    "execution_mode": "0",
    "enable_mem_arena": "1",
    "enable_mem_pattern": "1",
    "inter_op_thread_count": "0",
}
_TRUE = {"1", "true", "on"}


def cpu_differences(config: Any) -> list[str]:
    """The settings of a config that make its CPU session differ from ONNX Runtime's defaults
    (the thread count, set equal on both sides here, left out)."""
    params = {key: config.parameters[key].string_value for key in config.parameters}
    differences = []
    for key, default in ORT_CPU_DEFAULTS.items():
        if key not in params:
            continue
        value = params[key]
        same = (value.lower() in _TRUE) == (default in _TRUE) if key.startswith("enable_") else value == default
        if not same:
            differences.append(f"{key}={value}")
    for key in ("memory.enable_memory_arena_shrinkage", "session.use_device_allocator_for_initializers"):
        if key in params:
            differences.append(f"{key}={params[key]}")
    if config.optimization.HasField("graph") and config.optimization.graph.level != 0:
        differences.append(f"graph level {config.optimization.graph.level}")
    return differences


def _cold_note(cold: dict[str, Any], config: Any) -> str:
    tuned, default = cold["tuned"], cold["default"]
    differences = cpu_differences(config)
    text = (
        f"Cold start on CPU: unpack {tuned['unpack_s']['median']:.2f} s, session "
        f"{tuned['session_s']['median']:.2f} s (defaults: {default['session_s']['median']:.2f} s), first "
        f"request {tuned['first_request_s']['median']:.3f} s. "
    )
    if differences:
        text += f"On CPU the config differs from ONNX Runtime's defaults in: {', '.join(differences)}. "
    else:
        text += (
            "On CPU the config's options are ONNX Runtime's defaults (its other keys configure the CUDA "
            "provider only, and the thread count is the same on both sides), so no difference is expected "
            "here. "
        )
    return text + (
        "The seed's 4.4 s to 1.61 s was measured on GPU, where cudnn_conv_algo_search (exhaustive by "
        "default) runs during a convolutional model's first requests."
    )


def _gpu(
    ctx: RunContext, spec: Any, tarball: Path, module: Any, vocab: int, seq: int,
    latency_budget: float, throughput_budget: float,
) -> dict[str, Any]:
    """The same measurements on CUDA, where present: ONNX Runtime (CUDA provider, FP32 and the FP16
    artifact, and the TensorRT provider when ONNX Runtime has it) against PyTorch eager on CUDA."""
    import onnxruntime as ort
    import torch

    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return {"skipped": (
            f"no CUDA: onnxruntime {ort.__version__} has providers {providers} and torch "
            f"{torch.__version__} reports torch.cuda.is_available() = {torch.cuda.is_available()}"
        )}
    from triton_mme_cdk.model_build.artifact.triton_config import mc

    scratch = ctx.scratch("inference-gpu")
    out: dict[str, Any] = {"providers": providers}
    sessions: dict[str, Any] = {}
    errors: dict[str, str] = {}
    model_path, config = unpack_model(tarball, scratch / "fp32")
    try:
        sessions["onnxruntime-cuda-fp32"] = open_tuned(model_path, config, spec.name)
    except Exception as error:  # report and go on: one provider failing must not hide the others
        errors["onnxruntime-cuda-fp32"] = str(error)
    try:
        fp16_built, fp16_dir = ctx.build(spec_from(text_model_entry(ctx.tiny, fp16=True)))
        fp16_path, fp16_config = unpack_model(fp16_dir / fp16_built.tarball, scratch / "fp16")
        sessions["onnxruntime-cuda-fp16"] = open_tuned(fp16_path, fp16_config, spec.name)
    except Exception as error:
        errors["onnxruntime-cuda-fp16"] = str(error)
    if "TensorrtExecutionProvider" in providers:
        trt_config = mc.ModelConfig()
        trt_config.CopyFrom(config)
        accelerator = trt_config.optimization.execution_accelerators.gpu_execution_accelerator.add()
        accelerator.name = "tensorrt"
        accelerator.parameters["precision_mode"] = "FP16"
        try:
            sessions["onnxruntime-tensorrt-fp16"] = open_tuned(model_path, trt_config, spec.name)
        except Exception as error:
            errors["onnxruntime-tensorrt-fp16"] = str(error)
    else:
        errors["onnxruntime-tensorrt-fp16"] = "onnxruntime has no TensorrtExecutionProvider here"
    gpu_module = None
    if torch.cuda.is_available():
        gpu_module = module.to("cuda")
    else:
        errors["pytorch-cuda"] = f"torch {torch.__version__} has no CUDA"

    def calls_for(feeds: dict[str, np.ndarray]) -> dict[str, Call]:
        calls = {k: ort_call(r.session, feeds, r.run_options) for k, r in sessions.items()}
        if gpu_module is not None:
            calls["pytorch-cuda"] = torch_call(gpu_module, feeds, "cuda")
        return calls

    feeds1 = token_inputs(1, seq, vocab)
    calls = calls_for(feeds1)
    warm_up(calls, times=3)  # TensorRT builds its engine on the first calls
    out["latency_batch1"] = measure_latency(calls, ctx.repeats, latency_budget)
    out["throughput"] = {}
    for batch in THROUGHPUT_BATCHES:
        calls = calls_for(token_inputs(batch, seq, vocab))
        warm_up(calls, times=2)
        out["throughput"][f"batch{batch}"] = measure_throughput(calls, batch, ctx.repeats, throughput_budget)
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    out["cold_start"] = _cold_start(tarball, {
        "tuned": lambda m, c: open_tuned(m, c, spec.name).session,
        "default": lambda m, c: open_default(m, usable_cores(), cuda),
    }, feeds1, max(ctx.repeats, 3), scratch)
    out["errors"] = errors
    return out


# ---------------------------------------------------------------------------------------------
# Chart
# ---------------------------------------------------------------------------------------------


def chart(result: dict[str, Any], path: Path) -> None:
    from benchmarks._charts import BASELINE, CANDIDATE, OTHER, annotate_bars, error_bars, figure, save

    cpu = result["measurements"]["cpu"]
    params = result["parameters"]
    fig, (ax_lat, ax_tp, ax_cold) = figure(
        3, f"{params['model']} on CPU, {params['threads']} threads, sequence {params['sequence_length']}")
    runtimes = (("pytorch", "PyTorch eager", BASELINE), ("onnxruntime", "ONNX Runtime", CANDIDATE))

    width = 0.38
    for i, (key, label, color) in enumerate(runtimes):
        values = [cpu["latency_batch1"][key]["p50_s"], cpu["latency_batch1"][key]["p99_s"]]
        xs = [j + (i - 0.5) * width for j in range(2)]
        bars = ax_lat.bar(xs, [v["median"] * 1000 for v in values], width, label=label, color=color,
                          yerr=error_bars(values, 1000), capsize=3)
        annotate_bars(ax_lat, bars, [f"{v['median'] * 1000:.1f}" for v in values])
    ax_lat.set_xticks(range(2), ["p50", "p99"])
    ax_lat.set_ylabel("milliseconds per request (batch 1)")
    ax_lat.set_title("latency, batch 1")
    ax_lat.legend(fontsize=8)

    batches = list(cpu["throughput"])
    for i, (key, label, color) in enumerate(runtimes):
        values = [cpu["throughput"][b][key]["sequences_per_s"] for b in batches]
        xs = [j + (i - 0.5) * width for j in range(len(batches))]
        bars = ax_tp.bar(xs, [v["median"] for v in values], width, label=label, color=color,
                         yerr=error_bars(values), capsize=3)
        annotate_bars(ax_tp, bars, [f"{v['median']:.1f}" for v in values])
    ax_tp.set_xticks(range(len(batches)), [b.replace("batch", "batch ") for b in batches])
    ax_tp.set_ylabel("sequences per second")
    ax_tp.set_title("throughput")
    ax_tp.legend(fontsize=8)

    cold = cpu["cold_start"]
    variants = [("default", "ORT defaults"), ("tuned", "config.pbtxt options")]
    bottoms = [0.0, 0.0]
    for part, color in (("unpack_s", BASELINE), ("session_s", CANDIDATE), ("first_request_s", OTHER)):
        heights = [cold[v][part]["median"] for v, _ in variants]
        ax_cold.bar(range(2), heights, 0.5, bottom=bottoms, color=color, label=part[:-2].replace("_", " "))
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax_cold.errorbar(range(2), bottoms, yerr=error_bars([cold[v]["total_s"] for v, _ in variants]),
                     fmt="none", ecolor="black", capsize=3)
    for x, total in enumerate(bottoms):
        ax_cold.annotate(f"{total:.2f} s", (x, total), ha="center", va="bottom", fontsize=8,
                         xytext=(0, 4), textcoords="offset points")
    ax_cold.set_xticks(range(2), [label for _, label in variants])
    ax_cold.set_ylabel("seconds, tarball on disk to first answer")
    ax_cold.set_title("cold start")
    ax_cold.legend(fontsize=8)
    gpu = result["measurements"].get("gpu", {})
    note = f"{result['machine']['cpu_model']}; medians, bars min to max"
    if "skipped" in gpu:
        note += "; GPU runs skipped (no CUDA)"
    save(fig, path, note=note)


def markdown(result: dict[str, Any]) -> str:
    """Tables of the inference benchmark for docs/benchmarks.md."""
    from benchmarks._common import spread_text
    from benchmarks.report import table

    params = result["parameters"]
    cpu = result["measurements"]["cpu"]
    ratios = {c["name"]: c["ratio"] for c in result["comparisons"]}
    lat = cpu["latency_batch1"]
    rows = [
        [f"latency p{p}, batch 1 (ms)", spread_text(lat["pytorch"][f"p{p}_s"], scale=1000),
         spread_text(lat["onnxruntime"][f"p{p}_s"], scale=1000), f"{ratios[f'latency_p{p}_batch1']:.2f}x"]
        for p in (50, 99)
    ]
    for key, tp in cpu["throughput"].items():
        rows.append([f"throughput, {key.replace('batch', 'batch ')} (sequences/s)",
                     spread_text(tp["pytorch"]["sequences_per_s"]),
                     spread_text(tp["onnxruntime"]["sequences_per_s"]), f"**{ratios[f'throughput_{key}']:.2f}x**"])
    for key, tp in cpu["throughput"].items():
        rows.append([f"CPU cores obtained, {key.replace('batch', 'batch ')} (process CPU s / wall s)",
                     spread_text(tp["pytorch"]["cpu_cores_obtained"]),
                     spread_text(tp["onnxruntime"]["cpu_cores_obtained"]), ""])
    cold = cpu["cold_start"]
    cold_rows = [
        [part.replace("_s", "").replace("_", " "), spread_text(cold["default"][part], "s"),
         spread_text(cold["tuned"][part], "s")]
        for part in ("unpack_s", "session_s", "first_request_s", "total_s")
    ]
    profile = cpu["profile_batch8"]
    prof_rows = [
        [i + 1, *(f"{side['top'][i]['op']} ({side['top'][i]['share']:.0%})" if i < len(side["top"]) else ""
                  for side in (profile["pytorch"], profile["onnxruntime"]))]
        for i in range(max(len(profile["pytorch"]["top"]), len(profile["onnxruntime"]["top"])))
    ]
    gpu = result["measurements"].get("gpu", {})
    obtained = [tp[k]["cpu_cores_obtained"]["median"] for tp in cpu["throughput"].values()
                for k in ("onnxruntime", "pytorch")]
    contention = ""
    if obtained and min(obtained) < 0.9 * params["threads"]:
        lat = cpu["latency_batch1"]
        tp8 = cpu["throughput"].get(f"batch{GOAL_BATCH}", {})
        per_sequence = ", ".join(
            f"{label} {1000 / tp8[k]['sequences_per_s']['median']:.0f} ms per sequence at batch {GOAL_BATCH} "
            f"against {lat[k]['p50_s']['median'] * 1000:.0f} ms at batch 1"
            for k, label in (("pytorch", "PyTorch"), ("onnxruntime", "ONNX Runtime")) if k in tp8
        )
        contention = (
            f"**Shared machine**: during the throughput runs this process obtained {min(obtained):.2f} to "
            f"{max(obtained):.2f} cores for {params['threads']} threads (row \"CPU cores obtained\"): other "
            f"processes held the rest. Batching should make a sequence cheaper, yet here: {per_sequence}. "
            "These ratios are therefore not those of an idle machine; run `make bench` on an idle machine "
            "(or with `--threads` set to the cores that are free) to compare the runtimes themselves."
        )
    out = [
        f"`{params['model']}` as built ({params['tarball_bytes'] / 1e6:.1f} MB tarball); ONNX: "
        f"{params['onnx']}; PyTorch: {params['pytorch']}. {params['threads']} threads each, sequence "
        f"length {params['sequence_length']}, every position attended; {params['repeats']} runs per "
        f"measurement ({params['latency_budget_s_per_run']:g} s of requests per run), runtimes interleaved, "
        f"warm-up excluded. Largest difference between the two runtimes' embeddings: "
        f"{result['measurements']['max_abs_diff_onnx_vs_torch']:.2e}.",
        "",
        table(["CPU", "PyTorch eager", "ONNX Runtime (config options)", "ratio (ONNX better if > 1)"], rows),
        "",
        *([contention, ""] if contention else []),
        f"Cold start, tarball on disk to first answer ({params['cold_start_repeats']} "
        f"runs each, after one warm-up round; ratio defaults / config options: {ratios['cold_start']:.2f}x):",
        "",
        table(["step", "ONNX Runtime defaults", "config.pbtxt options"], cold_rows),
        "",
        "Where the time goes at batch 8 (share of operator time, each runtime's own profiler):",
        "",
        table(["#", "PyTorch (self CPU time)", "ONNX Runtime (kernel time)"], prof_rows),
        "",
    ]
    if "skipped" in gpu:
        out.append(f"GPU: skipped: {gpu['skipped']}.")
    else:
        gpu_rows = []
        for key, v in gpu.get("latency_batch1", {}).items():
            tps = [spread_text(gpu["throughput"][b][key]["sequences_per_s"]) for b in gpu["throughput"]]
            gpu_rows.append([key, spread_text(v["p50_s"], scale=1000), spread_text(v["p99_s"], scale=1000), *tps])
        out += [
            "GPU:",
            "",
            table(["runtime", "p50 ms (batch 1)", "p99 ms (batch 1)",
                   *(f"{b.replace('batch', 'batch ')} sequences/s" for b in gpu.get("throughput", {}))], gpu_rows),
        ]
        if gpu.get("cold_start"):
            c = gpu["cold_start"]
            out += ["", f"GPU cold start: defaults {spread_text(c['default']['total_s'], 's')}, config options "
                        f"{spread_text(c['tuned']['total_s'], 's')}."]
        for key, error in gpu.get("errors", {}).items():
            out.append(f"- {key}: not measured: {error}")
    return "\n".join(out)
