"""What the serving benchmarks share (:mod:`benchmarks.inference`, :mod:`benchmarks.variants`): a
built tarball unpacked and opened as the container opens it, the seeded token ids of a full
sequence, one request's call on ONNX Runtime or PyTorch eager (:data:`Call`), and the latency and
throughput of such calls over runs of the runtimes interleaved.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import percentile, run_for, stats

#: One request, ready to run (its inputs bound): what is timed.
Call = Callable[[], Any]


# ---------------------------------------------------------------------------------------------
# Opening the artifact
# ---------------------------------------------------------------------------------------------


def unpack_model(tarball: Path, dest: Path) -> tuple[Path, Any]:
    """Unpack as the container does; returns the model file and the parsed config."""
    from triton_mme_cdk.model_build.artifact.gate import locate_model
    from triton_mme_cdk.model_build.artifact.tarball import safe_extract
    from triton_mme_cdk.model_build.artifact.triton_config import check_config, default_filename

    safe_extract(tarball, dest)
    model_dir, name = locate_model(dest)
    config = check_config((model_dir / "config.pbtxt").read_text(encoding="utf-8"), model=name)
    return model_dir / "1" / default_filename(config), config


def with_threads(config: Any, threads: int, *, cpu: bool) -> Any:
    """A copy of the config with ``intra_op_thread_count`` set (and KIND_CPU for the CPU runs, so
    that on a GPU machine the same options run on the CPU provider)."""
    from triton_mme_cdk.model_build.artifact.triton_config import mc

    copy = mc.ModelConfig()
    copy.CopyFrom(config)
    copy.parameters["intra_op_thread_count"].string_value = str(threads)
    if cpu:
        for group in copy.instance_group:
            group.kind = mc.ModelInstanceGroup.KIND_CPU
    return copy


def open_tuned(model_path: Path, config: Any, name: str) -> Any:
    """The model opened as Triton's backend would with ``config`` (its session options)."""
    from triton_mme_cdk.model_build.artifact.backend import open_model

    return open_model(model_path, config, model=name)


def open_default(model_path: Path, threads: int, providers: list[str]) -> Any:
    """ONNX Runtime's defaults; only the thread count is set, so both sides use ``n`` threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_path), sess_options=options, providers=providers)


# ---------------------------------------------------------------------------------------------
# Runtimes: prepare(batch) -> a call that runs one request
# ---------------------------------------------------------------------------------------------


def token_inputs(batch: int, seq: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids of full length (every position attended: the work of a full sequence)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(low=min(1000, vocab // 2), high=vocab, size=(batch, seq), dtype=np.int64)
    ids[:, 0], ids[:, -1] = min(101, vocab - 1), min(102, vocab - 1)  # [CLS] ... [SEP]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def ort_call(session: Any, feeds: dict[str, np.ndarray], run_options: Any = None) -> Call:
    """One request on an ONNX Runtime session, every output asked for."""
    names = [o.name for o in session.get_outputs()]
    return lambda: session.run(names, feeds, run_options)


def torch_call(module: Any, feeds: dict[str, np.ndarray], device: str) -> Call:
    """One request on the eager module on ``device`` (inference mode; a CUDA call waits for the GPU)."""
    import torch

    ids = torch.from_numpy(feeds["input_ids"]).to(device)
    mask = torch.from_numpy(feeds["attention_mask"]).to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def call() -> Any:
        with torch.inference_mode():
            out = module(ids, mask)
        sync()
        return out

    return call


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


def _busy(func: Call, budget_s: float, min_calls: int) -> tuple[list[float], float]:
    """``run_for`` plus the CPU this process obtained meanwhile, in cores (CPU seconds / wall
    seconds): on a machine shared with other processes it shows how much of the thread count a
    run really had (threads that spin while waiting count as busy)."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    durations = run_for(func, budget_s, min_calls=min_calls)
    return durations, (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)


def measure_latency(calls: dict[str, Call], repeats: int, budget_s: float) -> dict[str, Any]:
    """p50 and p99 of single requests, per run; the runtimes' runs interleaved."""
    per_run: dict[str, dict[str, list[float]]] = {
        k: {"p50": [], "p99": [], "all": [], "cores": []} for k in calls}
    for repeat in range(repeats):
        order = list(calls) if repeat % 2 == 0 else list(reversed(calls))
        for key in order:
            durations, cores = _busy(calls[key], budget_s, min_calls=3)
            per_run[key]["p50"].append(percentile(durations, 50))
            per_run[key]["p99"].append(percentile(durations, 99))
            per_run[key]["all"].extend(durations)
            per_run[key]["cores"].append(cores)
    return {
        key: {
            "p50_s": stats(v["p50"]),
            "p99_s": stats(v["p99"]),
            "pooled_p50_s": round(percentile(v["all"], 50), 6),
            "pooled_p99_s": round(percentile(v["all"], 99), 6),
            "requests": len(v["all"]),
            "cpu_cores_obtained": stats(v["cores"], digits=3),
        }
        for key, v in per_run.items()
    }


def measure_throughput(calls: dict[str, Call], batch: int, repeats: int, budget_s: float) -> dict[str, Any]:
    """Sequences per second at one batch size, one value per run (budgeted, >= 1 call each)."""
    values: dict[str, list[float]] = {k: [] for k in calls}
    cores: dict[str, list[float]] = {k: [] for k in calls}
    batches: dict[str, int] = dict.fromkeys(calls, 0)
    for repeat in range(repeats):
        order = list(calls) if repeat % 2 == 0 else list(reversed(calls))
        for key in order:
            durations, obtained = _busy(calls[key], budget_s, min_calls=1)
            values[key].append(batch * len(durations) / sum(durations))
            cores[key].append(obtained)
            batches[key] += len(durations)
    return {
        key: {"sequences_per_s": stats(v), "batches": batches[key],
              "cpu_cores_obtained": stats(cores[key], digits=3)}
        for key, v in values.items()
    }


def warm_up(calls: dict[str, Call], times: int = 2) -> None:
    """Each call ``times`` times, untimed (first-call allocations, engine builds)."""
    for call in calls.values():
        for _ in range(times):
            call()
