"""MiniLM variants against PyTorch eager and against this machine's GEMM limit (issue 13).

Variants, each built by the project's own build (``build_model``: export, optimize, gates,
package) from the ``minilm-l6-embedding`` entry of models.yaml, unpacked and opened as the
Triton container would (:func:`model_build.artifact.backend.open_model`, the session options of its own
``config.pbtxt``, KIND_CPU and ``n`` intra-op threads for the CPU runs):

- ``exported``: ``optimize: false``, FP32: the graph as exported before this work;
- ``fused``: ``optimize: true``, FP32 (the default manifest's setting);
- ``int8``: fused, then dynamic INT8 (per channel, MatMul only, sensitive MatMuls in FP32),
  ``instance_group: KIND_CPU``;
- ``fp16`` (GPU only, where CUDA is usable): fused, FP16 weights, FP32 inputs and outputs.

PyTorch eager (same weights, ``torch.set_num_threads(n)``) is the baseline. Inputs: seeded
token ids, every position attended, sequence 128 (16 in tiny mode), batch 1 and 8; the runtimes'
runs are interleaved. Accuracy: the gates each variant met at build time (min cosine and top-3
retrieval agreement against PyTorch FP32 on the sample sentences), plus the min cosine on the
benchmark's own batch.

The limit: the FLOPs of one batch are counted from the fused graph (every MatMul with a weight,
the Attention projections and the two attention products), and this CPU's peak is measured
with a large FP32 matmul (``torch.matmul``, ``n`` threads) and, where the CPU has VNNI, a
large INT8 ``MatMulInteger`` in ONNX Runtime (the kernel the INT8 graph uses). Each variant's
time is reported as a multiple of the time the FLOPs would take at that peak (the roofline).
"""

from __future__ import annotations

import copy
import tempfile
import time
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
    run_for,
    spec_from,
    stats,
    text_model_entry,
    usable_cores,
)
from benchmarks._runtimes import (
    measure_latency,
    ort_call,
    token_inputs,
    torch_call,
    unpack_model,
    warm_up,
    with_threads,
)

NAME = "variants"
TITLE = "MiniLM fused, INT8 (and FP16 on GPU) against PyTorch eager and the GEMM roofline"
GOAL_INT8_RATIO = 2.0
GOAL_INT8_COSINE = 0.99
GOAL_ROOFLINE = 1.3
GOAL_FP16_RATIO = 2.0
BATCHES = (1, 8)
#: Table and chart order: the baseline, then the variants from least to most optimized.
ORDER = ("pytorch", "exported", "fused", "int8")
#: Seconds of calls per run of each measurement, and the side of the square GEMM that measures the
#: peak. Variants, sequence and batches are the same in quick and full; a quick run measures each
#: for half as long.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"budget_s_per_run": 0.05, "peak_gemm_size": 256},
    "quick": {"budget_s_per_run": 2.0, "peak_gemm_size": 2048},
    "full": {"budget_s_per_run": 4.0, "peak_gemm_size": 2048},
}


def _entries(tiny: bool) -> dict[str, dict[str, Any]]:
    base = text_model_entry(tiny)
    base.pop("tolerance", None)
    out: dict[str, dict[str, Any]] = {}
    for key, extra in (
        ("exported", {"optimize": False}),
        ("fused", {"optimize": True}),
        ("int8", {"optimize": True, "precision": "int8", "instance_group": {"kind": "KIND_CPU"}}),
    ):
        entry = copy.deepcopy(base)
        entry.update(extra, name=f"{base['name']}-{key}")
        if key == "int8":
            # Every position is attended here, so length grouping (KIND_CPU's default) could only add
            # its plan; off, the variants differ in precision alone.
            entry["text"] = {**entry.get("text", {}), "group_by_length": False}
        out[key] = entry
    return out


# ---------------------------------------------------------------------------------------------
# FLOPs and peaks
# ---------------------------------------------------------------------------------------------


def graph_flops(model_path: Path, batch: int, seq: int) -> dict[str, float]:
    """Multiply-add FLOPs (2 per MAC) of one batch, from the fused graph's weights: MatMuls with
    a 2-D weight, and per Attention node its QKV projection plus QK^T and attention x V."""
    import onnx

    from triton_mme_cdk.model_build.export.fusion import iter_nodes

    graph = onnx.load(str(model_path)).graph
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    tokens = batch * seq
    gemm = attention = 0.0
    for node in iter_nodes(graph):
        if node.op_type in ("MatMul", "MatMulInteger") and len(shapes.get(node.input[1], ())) == 2:
            k, n = shapes[node.input[1]]
            gemm += 2.0 * tokens * k * n
        elif node.op_type == "Attention" and node.domain == "com.microsoft":
            hidden, three_hidden = shapes[node.input[1]]
            gemm += 2.0 * tokens * hidden * three_hidden
            attention += 2 * 2.0 * batch * seq * seq * (three_hidden // 3)
    return {"gemm": gemm, "attention": attention, "total": gemm + attention}


def fp32_peak(threads: int, size: int, budget_s: float) -> dict[str, Any]:
    """GFLOP/s of a large square FP32 matmul in torch with ``threads`` threads (best and median)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    rates = _square_gemm_rates(lambda: torch.matmul(a, b), size, budget_s)
    return {"gflops": stats(rates, digits=2), "size": size, "threads": threads}


def _square_gemm_rates(call: Any, size: int, budget_s: float) -> list[float]:
    """Giga-operations per second of ``call`` (one ``size``-square GEMM) per call, after one
    warm-up, for ``budget_s`` (at least 3 calls): the best is the peak, the spread the noise."""
    call()
    return [2.0 * size**3 / seconds / 1e9 for seconds in run_for(call, budget_s, min_calls=3)]


def has_vnni() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def int8_peak(threads: int, size: int, budget_s: float) -> dict[str, Any]:
    """GOP/s of a large uint8 x int8 ``MatMulInteger`` in ONNX Runtime (the INT8 graph's kernel)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph(
        [node], "mmi",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [size, size]),
         helper.make_tensor_value_info("b", TensorProto.INT8, [size, size])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [size, size])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {"a": rng.integers(0, 255, (size, size), dtype=np.uint8),
             "b": rng.integers(-127, 127, (size, size), dtype=np.int8)}
    rates = _square_gemm_rates(lambda: session.run(None, feeds), size, budget_s)
    return {"gops": stats(rates, digits=2), "size": size, "threads": threads}


def _int8_share(model_path: Path, batch: int, seq: int) -> float:
    """Share of the INT8 graph's GEMM FLOPs that run in INT8 (the rest stays FP32)."""
    import onnx

    from triton_mme_cdk.model_build.export.fusion import iter_nodes

    graph = onnx.load(str(model_path)).graph
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    int8 = sum(2.0 * batch * seq * shapes[n.input[1]][0] * shapes[n.input[1]][1]
               for n in iter_nodes(graph)
               if n.op_type == "MatMulInteger" and len(shapes.get(n.input[1], ())) == 2)
    total = graph_flops(model_path, batch, seq)["total"]
    return int8 / total if total else 0.0


# ---------------------------------------------------------------------------------------------
# Run
# ---------------------------------------------------------------------------------------------


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    from triton_mme_cdk.model_build.export.optimize import row_cosines

    return float(row_cosines(a, b).min())


def run(ctx: RunContext) -> dict[str, Any]:
    import torch

    from triton_mme_cdk.model_build.artifact.backend import open_model
    from triton_mme_cdk.model_build.export.eager import load_module
    from triton_mme_cdk.model_build.export.sources import resolve_source
    from triton_mme_cdk.model_build.export.validate import onnx_providers

    started = time.perf_counter()
    threads = ctx.threads or usable_cores()
    seq = 16 if ctx.tiny else 128
    chosen = ctx.sizes(SIZES)
    budget = float(chosen["budget_s_per_run"])
    entries = _entries(ctx.tiny)
    result = new_result(NAME, TITLE, ctx, {
        "model": entries["fused"]["name"].rsplit("-", 1)[0], "threads": threads,
        "sequence_length": seq, "batches": list(BATCHES), "budget_s_per_run": budget,
        "repeats": ctx.repeats})
    torch.set_num_threads(threads)

    built: dict[str, Any] = {}
    sessions: dict[str, Any] = {}
    paths: dict[str, Path] = {}
    scratch = ctx.scratch("variants")
    for key, entry in entries.items():
        spec = spec_from(entry)
        build, release_dir = ctx.build(spec)
        built[key] = build
        model_path, config = unpack_model(release_dir / build.tarball, Path(tempfile.mkdtemp(dir=scratch)))
        paths[key] = model_path
        sessions[key] = open_model(model_path, with_threads(config, threads, cpu=True), model=spec.name).session  # type: ignore[union-attr]
        log(f"variants: {key} built ({build.size / 1e6:.1f} MB, gates {build.accuracy})")

    spec = spec_from(entries["fused"])
    source = resolve_source(spec, base_dir=ROOT, work_dir=ctx.scratch("variants-src"))
    module = load_module(spec, source)
    vocab = int(getattr(getattr(module.encoder, "config", None), "vocab_size", 30522))

    measurements: dict[str, Any] = {"cpu": {}, "accuracy": {}, "artifact": {}}
    for batch in BATCHES:
        feeds = token_inputs(batch, seq, vocab)
        calls = {"pytorch": torch_call(module, feeds, "cpu")}
        calls.update({k: ort_call(s, feeds) for k, s in sessions.items()})
        warm_up(calls)
        measurements["cpu"][f"batch{batch}"] = measure_latency(calls, ctx.repeats, budget)
        if batch == max(BATCHES):
            reference = calls["pytorch"]().numpy()
            for key, session in sessions.items():
                measurements["accuracy"][key] = {
                    "min_cosine_bench_batch": round(_cosine(session.run(None, feeds)[0], reference), 6),
                    **built[key].accuracy,
                }
    for key, build in built.items():
        measurements["artifact"][key] = {"tarball_bytes": build.size,
                                         "model_bytes": paths[key].stat().st_size,
                                         "fused_ops": build.fused_ops}

    # The limit
    big = int(chosen["peak_gemm_size"])
    peak = fp32_peak(threads, big, budget)
    measurements["fp32_peak"] = peak
    vnni = has_vnni()
    measurements["int8_peak"] = int8_peak(threads, big, budget) if vnni else {"skipped": "no VNNI"}
    b = max(BATCHES)
    flops = graph_flops(paths["fused"], b, seq)
    measurements["flops_batch8"] = flops
    peak_fp32 = peak["gflops"]["max"] * 1e9
    int8_share = _int8_share(paths["int8"], b, seq)
    lat = measurements["cpu"][f"batch{b}"]
    roofline: dict[str, Any] = {}
    for key in ("pytorch", *sessions):
        t = lat[key]["p50_s"]["median"]
        limit_s = flops["total"] / peak_fp32
        if key == "int8" and vnni:
            peak_int8 = measurements["int8_peak"]["gops"]["max"] * 1e9
            limit_s = flops["total"] * (int8_share / peak_int8 + (1 - int8_share) / peak_fp32)
        roofline[key] = {"seconds": t, "roofline_s": round(limit_s, 6), "x_roofline": round(t / limit_s, 3),
                         "achieved_gflops": round(flops["total"] / t / 1e9, 2)}
    measurements["roofline_batch8"] = roofline
    measurements["int8_gemm_share"] = round(int8_share, 4)
    result["measurements"] = measurements

    for key in sessions:
        result["comparisons"].append(comparison(
            f"{key}_vs_pytorch_batch{b}", what=f"latency at batch {b}, sequence {seq}", unit="s",
            baseline_label="PyTorch eager FP32", baseline=lat["pytorch"]["p50_s"],
            candidate_label=f"ONNX Runtime {key}", candidate=lat[key]["p50_s"], lower_is_better=True))
    ratios = {c["name"]: c["ratio"] for c in result["comparisons"]}
    int8_ratio = ratios[f"int8_vs_pytorch_batch{b}"]
    int8_cos = built["int8"].accuracy.get("min_cosine")
    result["goals"].append(goal(
        "int8_2x_eager", f"INT8 >= {GOAL_INT8_RATIO}x PyTorch eager at batch {b} with min cosine >= "
        f"{GOAL_INT8_COSINE} on real sentences", target=f">= {GOAL_INT8_RATIO}x and >= {GOAL_INT8_COSINE}",
        measured=f"{int8_ratio}x, cosine {int8_cos:.4f}" if int8_cos is not None else int8_ratio,
        met=None if ctx.tiny else bool(int8_ratio and int8_ratio >= GOAL_INT8_RATIO
                                       and (int8_cos or 0) >= GOAL_INT8_COSINE),
        detail=f"{built['int8'].accuracy.get('min_cosine', float('nan')):.5f} min cosine and "
               f"{built['int8'].accuracy.get('top_k_agreement', float('nan')):.2f} top-3 agreement on "
               f"the sample sentences (build gates); {int8_share:.0%} of the FLOPs run in INT8",
        limit=_int8_limit(roofline, int8_share, vnni)))
    fused_x = roofline["fused"]["x_roofline"]
    result["goals"].append(goal(
        "fused_roofline", f"fused FP32 within {GOAL_ROOFLINE}x of the FP32 roofline at batch {b}",
        target=f"<= {GOAL_ROOFLINE}x", measured=fused_x,
        met=None if ctx.tiny else fused_x <= GOAL_ROOFLINE,
        detail=f"{flops['total'] / 1e9:.2f} GFLOP per batch counted from the graph; FP32 peak "
               f"{peak['gflops']['max']:.1f} GFLOP/s (torch matmul {big}x{big}, {threads} threads)",
        limit=_fused_limit(roofline, flops, peak)))
    gpu: dict[str, Any] = _gpu(ctx, entries, module, vocab, seq, budget) if "CUDAExecutionProvider" in onnx_providers() \
        and torch.cuda.is_available() else {"skipped": "no CUDA (onnxruntime providers "
                                             f"{onnx_providers()}, torch {torch.__version__})"}
    measurements["gpu"] = gpu
    measurements["triton"] = _through_triton(ctx, built, {key: spec_from(entry) for key, entry in entries.items()},
                                             token_inputs(b, seq, vocab), budget)
    for key in sessions:
        result["comparisons"].append(comparison(
            f"{key}_on_triton_vs_pytorch_batch{b}",
            what=f"latency at batch {b}, sequence {seq}: through the local endpoint (tritonserver) against in-process PyTorch",
            unit="s", baseline_label="PyTorch eager FP32 (in process)", baseline=lat["pytorch"]["p50_s"],
            candidate_label=f"{key} on tritonserver (boto3, local endpoint)", candidate=measurements["triton"][key],
            lower_is_better=True))
    fp16_text = f"GPU FP16 (fused) >= {GOAL_FP16_RATIO}x PyTorch FP32 eager on CUDA at batch {b}"
    if "skipped" in gpu:
        result["goals"].append(goal("fp16_gpu_2x", fp16_text, target=f">= {GOAL_FP16_RATIO}x",
                                    measured=None, met=None, detail=f"not measured: {gpu['skipped']}"))
    else:
        gl = gpu[f"batch{b}"]
        result["comparisons"].append(comparison(
            f"fp16_cuda_vs_pytorch_cuda_batch{b}", what=f"GPU latency at batch {b}, sequence {seq}",
            unit="s", baseline_label="PyTorch eager FP32 (CUDA)", baseline=gl["pytorch-cuda"]["p50_s"],
            candidate_label="ONNX Runtime fused FP16 (CUDA)", candidate=gl["fp16"]["p50_s"],
            lower_is_better=True))
        fp16_ratio = result["comparisons"][-1]["ratio"]
        result["goals"].append(goal(
            "fp16_gpu_2x", fp16_text, target=f">= {GOAL_FP16_RATIO}x", measured=fp16_ratio,
            met=None if ctx.tiny else bool(fp16_ratio and fp16_ratio >= GOAL_FP16_RATIO),
            detail=f"FP16 gates at build: {gpu['accuracy']}",
            limit="" if (fp16_ratio or 0) >= GOAL_FP16_RATIO else
            f"fused FP32 on CUDA at batch {b}: {gl['fused']['p50_s']['median'] * 1000:.1f} ms, FP16 "
            f"{gl['fp16']['p50_s']['median'] * 1000:.1f} ms, PyTorch "
            f"{gl['pytorch-cuda']['p50_s']['median'] * 1000:.1f} ms"))
    result["notes"].append(
        "Measured on a machine shared with other processes (2 cores): the spread columns show "
        "the noise; ratios come from interleaved runs of the same process.")
    return finish_result(result, started)


def _through_triton(ctx: RunContext, built: dict[str, Any], specs: dict[str, Any], feeds: dict[str, np.ndarray],
                    budget: float) -> dict[str, Any]:
    """Each variant's tarball published to a local S3 and served by the local endpoint (the real
    tritonserver, python-based ONNX Runtime 1.19 backend on CPU): batch latency through boto3."""
    from triton_mme_cdk.model_build.artifact.triton_config import parse_config
    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.release.publish import publish_release
    from triton_mme_cdk.model_build.tools.local_endpoint.server import local_endpoint
    from triton_mme_cdk.model_build.tools.local_s3 import local_s3
    from triton_mme_cdk.model_build.tools.smoke.codec import SAGEMAKER_BINARY_CONTENT_TYPE, build_request
    from triton_mme_cdk.model_build.tools.smoke.prepare import make_runtime_client

    release_id = "r-variants00000000"
    artifacts = [built[key].artifact(ctx.build(specs[key])[1]) for key in built]
    out: dict[str, Any] = {}
    with local_s3() as url:
        s3 = make_s3_client(endpoint_url=url)
        s3.create_bucket(Bucket="bench-variants")
        publish_release(artifacts, s3_client=s3, bucket="bench-variants", release_prefix=f"models/{release_id}",
                        index_extra={"release_id": release_id})
        with local_endpoint(s3_client=s3, bucket="bench-variants", release_id=release_id) as endpoint:
            runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=300)
            for key, build in built.items():
                config = parse_config(Path(artifacts[list(built).index(key)].config_path).read_text())
                body, header = build_request(config, feeds)
                target = f"{build.targets[0]}.tar.gz"

                def call(target: str = target, body: bytes = body, header: int = header) -> None:
                    runtime.invoke_endpoint(EndpointName="local", TargetModel=target, Body=body,
                                            ContentType=SAGEMAKER_BINARY_CONTENT_TYPE.format(header))["Body"].read()

                call()  # cold: download, unpack, load
                out[key] = stats(run_for(call, budget, min_calls=3))
                log(f"variants: {key} through tritonserver: {out[key]['median'] * 1000:.1f} ms")
    return out


def _gpu(ctx: RunContext, entries: dict[str, dict[str, Any]], module: Any, vocab: int, seq: int,
         budget: float) -> dict[str, Any]:
    """Fused FP32 and fused FP16 (CUDA provider, the configs as built: KIND_GPU) against PyTorch
    FP32 eager on CUDA, batch 1 and 8."""
    from triton_mme_cdk.model_build.artifact.backend import open_model

    fp16_entry = copy.deepcopy(entries["fused"])
    fp16_entry.update(name=fp16_entry["name"].replace("-fused", "-fp16"), precision="fp16")
    scratch = ctx.scratch("variants-gpu")
    sessions: dict[str, Any] = {}
    accuracy: dict[str, Any] = {}
    for key, entry in (("fused", entries["fused"]), ("fp16", fp16_entry)):
        spec = spec_from(entry)
        build, release_dir = ctx.build(spec)
        model_path, config = unpack_model(release_dir / build.tarball, Path(tempfile.mkdtemp(dir=scratch)))
        sessions[key] = open_model(model_path, config, model=spec.name).session  # type: ignore[union-attr]
        accuracy[key] = build.accuracy
    gpu_module = module.to("cuda")
    out: dict[str, Any] = {"accuracy": accuracy["fp16"]}
    for batch in BATCHES:
        feeds = token_inputs(batch, seq, vocab)
        calls = {"pytorch-cuda": torch_call(gpu_module, feeds, "cuda")}
        calls.update({k: ort_call(s, feeds) for k, s in sessions.items()})
        warm_up(calls, times=3)
        out[f"batch{batch}"] = measure_latency(calls, ctx.repeats, budget)
    module.to("cpu")
    return out


def _int8_limit(roofline: dict[str, Any], share: float, vnni: bool) -> str:
    r = roofline["int8"]
    return (f"the INT8 graph runs at {r['x_roofline']}x its mixed roofline ({share:.0%} of the "
            f"FLOPs in INT8{'' if vnni else ', no VNNI: FP32 peak used'}); the FP32 parts (Attention "
            "with its QKV projection, the MatMuls kept for accuracy) bound the rest")


def _fused_limit(roofline: dict[str, Any], flops: dict[str, float], peak: dict[str, Any]) -> str:
    r = roofline["fused"]
    gflops = peak["gflops"]
    at_median = r["seconds"] / (flops["total"] / (gflops["median"] * 1e9))
    return (f"fused FP32 reaches {r['achieved_gflops']} GFLOP/s against a best GEMM peak of "
            f"{gflops['max']:.1f} (median {gflops['median']:.1f}: the peak itself varied by "
            f"{gflops['max'] / max(gflops['min'], 1e-9):.1f}x on this shared machine; against the "
            f"median peak it is {at_median:.2f}x); of its FLOPs "
            f"{flops['attention'] / flops['total']:.0%} are the attention products, which run "
            "inside the fused Attention kernel below GEMM peak, and LayerNorm/GELU/pooling add "
            "memory-bound time the FLOP count does not see")


def chart(result: dict[str, Any], path: Path) -> None:
    from benchmarks._charts import BASELINE, CANDIDATE, OTHER, annotate_bars, error_bars, figure, save

    cpu = result["measurements"]["cpu"]
    roof = result["measurements"]["roofline_batch8"]
    keys = [k for k in ORDER if k in cpu[f"batch{BATCHES[-1]}"]]
    colors = [BASELINE, OTHER] + [CANDIDATE] * (len(keys) - 2)
    fig, (ax1, ax8, axr) = figure(3, f"{result['parameters']['model']} variants, CPU, "
                                     f"{result['parameters']['threads']} threads")
    for ax, batch in ((ax1, 1), (ax8, BATCHES[-1])):
        values = [cpu[f"batch{batch}"][k]["p50_s"] for k in keys]
        bars = ax.bar(range(len(keys)), [v["median"] * 1000 for v in values], color=colors,
                      yerr=error_bars(values, 1000), capsize=3)
        annotate_bars(ax, bars, [f"{v['median'] * 1000:.1f}" for v in values])
        ax.set_xticks(range(len(keys)), keys)
        ax.set_ylabel("ms per batch (p50)")
        ax.set_title(f"batch {batch}")
    xs = [roof[k]["x_roofline"] for k in keys]
    bars = axr.bar(range(len(keys)), xs, color=colors)
    annotate_bars(axr, bars, [f"{x:.2f}x" for x in xs])
    axr.axhline(GOAL_ROOFLINE, color="#d62728", linestyle="--", linewidth=1)
    axr.set_xticks(range(len(keys)), keys)
    axr.set_ylabel("time / roofline time (1 = GEMM peak)")
    axr.set_title(f"share of the roofline, batch {BATCHES[-1]}")
    save(fig, path, note=f"{result['machine']['cpu_model']}; medians, bars min to max")


def markdown(result: dict[str, Any]) -> str:
    from benchmarks._common import spread_text
    from benchmarks.report import table

    m = result["measurements"]
    cpu = m["cpu"]
    keys = [k for k in ORDER if k in cpu[f"batch{BATCHES[-1]}"]]
    rows = []
    for key in keys:
        acc = m["accuracy"].get(key, {})
        art = m["artifact"].get(key, {})
        rows.append([
            key,
            spread_text(cpu["batch1"][key]["p50_s"], "ms", 1000),
            spread_text(cpu[f"batch{BATCHES[-1]}"][key]["p50_s"], "ms", 1000),
            f"{BATCHES[-1] / cpu[f'batch{BATCHES[-1]}'][key]['p50_s']['median']:.1f}",
            f"{m['roofline_batch8'][key]['x_roofline']:.2f}x",
            f"{acc['min_cosine']:.5f}" if "min_cosine" in acc else ("1 (reference)" if key == "pytorch" else "-"),
            f"{acc['top_k_agreement']:.2f}" if "top_k_agreement" in acc else "-",
            f"{acc['min_cosine_bench_batch']:.5f}" if "min_cosine_bench_batch" in acc else "-",
            f"{art['model_bytes'] / 1e6:.1f} MB" if art else "-",
        ])
    peak = m["fp32_peak"]["gflops"]
    int8 = m["int8_peak"]
    lines = [
        table(["variant", "latency batch 1 (p50)", f"latency batch {BATCHES[-1]} (p50)", "sequences/s",
               "x roofline", "min cosine (sentences)", "top-3 agreement", "min cosine (bench batch)",
               "model.onnx"], rows),
        "",
        f"FLOPs of one batch of {BATCHES[-1]} x {result['parameters']['sequence_length']} tokens, "
        f"counted from the fused graph: {m['flops_batch8']['total'] / 1e9:.2f} GFLOP "
        f"({m['flops_batch8']['attention'] / 1e9:.2f} in the attention products). FP32 GEMM peak "
        f"(torch matmul {m['fp32_peak']['size']}^2, {m['fp32_peak']['threads']} threads): "
        f"{peak['max']:.1f} GFLOP/s best, {peak['median']:.1f} median. INT8 GEMM peak "
        + (f"(ONNX Runtime MatMulInteger, VNNI): {int8['gops']['max']:.1f} GOP/s best"
           if "gops" in int8 else f"not measured ({int8.get('skipped')})")
        + f"; {m['int8_gemm_share']:.0%} of the INT8 graph's FLOPs run in INT8.",
    ]
    triton = m.get("triton", {})
    if triton:
        rows = [[key, spread_text(triton[key], "ms", 1000),
                 f"{cpu[f'batch{BATCHES[-1]}']['pytorch']['p50_s']['median'] / triton[key]['median']:.2f}x"]
                for key in keys if key in triton]
        lines += ["", f"The same tarballs through the local endpoint (real tritonserver 2.51, python-based ONNX "
                  f"Runtime 1.19 backend, boto3 binary+JSON), batch {BATCHES[-1]}:", "",
                  table(["variant", "latency through the endpoint", "PyTorch eager (in process) / endpoint"], rows)]
    gpu = m.get("gpu", {})
    if "skipped" in gpu:
        lines += ["", f"GPU rows: not measured here ({gpu['skipped']})."]
    elif gpu:
        rows = [[key] + [spread_text(gpu[f"batch{b}"][key]["p50_s"], "ms", 1000) for b in BATCHES]
                for key in ("pytorch-cuda", "fused", "fp16")]
        lines += ["", "GPU (CUDA):", "",
                  table(["variant"] + [f"latency batch {b} (p50)" for b in BATCHES], rows)]
    return "\n".join(lines)
