"""``make gpu-check``'s served rows: the build's tarballs in the local endpoint's real tritonserver.

The in-process rows (:mod:`benchmarks.gpu_check`) measure the graphs in ONNX Runtime and PyTorch
inside the check's own process. These rows measure what the fleet serves: each manifest entry is
built by the project's build (export, validation, config, ``model.tar.gz``), unpacked as SageMaker
unpacks it, its ``config.pbtxt`` kept as published (``KIND_GPU``; ``--cpu``: localized to
``KIND_CPU`` as the local endpoint does), loaded through the SageMaker API of ``tritonserver``
(``POST /models``) and invoked on ``/models/<name>/invoke`` with tritonclient's binary+JSON body,
as SageMaker's front does. Per row: the load and the first answer (the cold start; the download
and unpack are the platform's and excluded), warm p50/p99 at batch 1 and 8 over HTTP, the GPU
memory the loaded model holds (device-wide, so it includes the python backend stub's own CUDA
context), the build's own figures of the model (``weight_bytes``, ``working_bytes_cpu``: its graph and
its working memory measured on CPU, from which ``model_build.capacity`` reads the runtime's fixed
overhead), and parity of the served answer against PyTorch FP32 on the same GPU.

Beside each default entry as built, MiniLM (the first tokens-input text model) is served as an FP16
graph and with ONNX Runtime's TensorRT provider (``tensorrt: {precision_mode: FP16,
engine_cache: true}``): that row's cold start is the provider's first load with its engine compile,
and a second load after an unload (``tensorrt_cached_load_s``) shows what the engine cache saves.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpu_cases import log, not_measured, tensorrt_missing, variant_entry

#: What the TensorRT row sets: the provider's FP16 with the engine cache the manifest offers.
TENSORRT_VARIANT = {"precision_mode": "FP16", "engine_cache": True}


@dataclass
class Served:
    """One entry to build and serve: the manifest entry (changed for a variant) and its row's names."""

    spec: Any
    variant: str
    #: The key of the model's PyTorch FP32 reference (its source), shared by its variants.
    reference_key: str


def served_entries(models: list[Any], sources: dict[str, Path | None], *, gpu: bool) -> tuple[
        list[Served], list[dict[str, Any]]]:
    """The entries to serve: every model as built (a raw-text target runs its tokens model's graph
    and is left out), and MiniLM's FP16 and TensorRT variants where there is a GPU."""
    entries: list[Served] = []
    rows: list[dict[str, Any]] = []
    text_model = next((s for s in models if s.task != "image-classification" and s.inputs != "text"
                       and s.format == "onnx"), None)
    for spec in models:
        if spec.inputs == "text":
            continue
        key = spec.source.model_dump_json()
        entries.append(Served(variant_entry(spec, sources.get(spec.name)), spec.precision, key))
        if text_model is None or spec.name != text_model.name:
            continue
        for variant, update in (("fp16", {"precision": "fp16"}),
                                ("tensorrt-fp16", {"precision": "fp32", "tensorrt": TENSORRT_VARIANT})):
            if gpu:
                entries.append(Served(variant_entry(spec, sources.get(spec.name), **update), variant, key))
            else:
                rows.append(not_measured(spec.name, variant, "tritonserver",
                                         "served on a GPU only (--cpu serves each entry as built)"))
    return entries, rows


def triton_environment() -> tuple[Any, str]:
    """The triton environment whose server and stub run the rows: ``MME_TRITON_ENV``, else this
    Python's own environment where it has nvidia-pytriton (``make gpu-check``'s .venv-gpu, with
    onnxruntime-gpu and CUDA torch), else ``.venv-triton``; (env, "") or (None, why not)."""
    import os

    from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import (
        ENV_VARIABLE,
        TritonEnvironment,
        TritonEnvironmentError,
    )

    own = Path(sys.prefix)
    root = None if os.environ.get(ENV_VARIABLE) or not any(own.glob("lib/python3.*/site-packages/pytriton")) else own
    try:
        env = TritonEnvironment.find(root)
    except TritonEnvironmentError as error:
        return None, str(error)
    missing = env.missing_libpython()
    return (None, missing) if missing else (env, "")


def shm_settings() -> tuple[tuple[int, int], str]:
    """The stack's python-backend SHM sizes: the app's cdk.json, else the endpoint's defaults (no CDK needed)."""
    from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import stack_shm_settings

    return stack_shm_settings(), "the stack's (cdk.json, else the endpoint's defaults)"


def _engine_cache_folders(config: Any) -> list[Path]:
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    return [Path(acc.parameters["trt_engine_cache_path"]) for acc in accelerators
            if acc.name == "tensorrt" and "trt_engine_cache_path" in acc.parameters]


def runtime_name(config: Any, gpu: bool) -> str:
    """``tritonserver-onnxruntime-tensorrt``, ``tritonserver-pytorch-cuda``, ``...-cpu``."""
    backend = config.backend or config.platform.split("_")[0]
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    device = ("tensorrt" if any(acc.name == "tensorrt" for acc in accelerators) else "cuda") if gpu else "cpu"
    return f"tritonserver-{backend}-{device}"


class ServedModel:
    """One built tarball unpacked into the server's model folder; load, invoke, unload."""

    def __init__(self, server: Any, target: str, tarball: Path, config_text: str, root: Path, *, gpu: bool) -> None:
        from triton_mme_cdk.model_build.artifact.tarball import safe_extract
        from triton_mme_cdk.model_build.artifact.triton_config import parse_config
        from triton_mme_cdk.model_build.tools.local_endpoint.model_cache import (
            localize_configs,
            model_name_for,
        )

        self.server = server
        self.config = parse_config(config_text)
        self.name = model_name_for(target)
        self.loaded = False
        self.directory = root / self.name / "model"
        self.directory.mkdir(parents=True)
        safe_extract(tarball, self.directory, model=tarball.name)
        localize_configs(self.directory, gpu=gpu)

    def load(self) -> float:
        """Seconds ``POST /models`` took; the server's error text as an exception when it refused."""
        document = json.dumps({"model_name": self.name, "url": str(self.directory)}).encode()
        started = time.perf_counter()
        answer = self.server.request("POST", "/models", document, headers={"Content-Type": "application/json"},
                                     timeout=900)
        if answer.status not in (200, 409):
            raise RuntimeError(f"load answered {answer.status}: {answer.body.decode(errors='replace')[:500]}")
        self.loaded = True
        return time.perf_counter() - started

    def unload(self) -> None:
        if self.loaded:
            self.server.request("DELETE", f"/models/{self.name}", timeout=300)
            self.loaded = False

    def caller(self, batch: dict[str, Any]) -> Callable[[], Any]:
        """A call of ``batch`` (body encoded once): returns the first output as numpy."""
        import re

        from triton_mme_cdk.model_build.tools.smoke.codec import (
            SAGEMAKER_BINARY_CONTENT_TYPE,
            build_request,
            header_length,
            parse_response,
        )

        first = self.config.output[0].name
        # A TorchScript config names its tensors ``<name>__<index>`` (the pytorch backend's rule).
        named = {io.name: re.sub(r"__\d+$", "", io.name) for io in self.config.input}
        feeds = {name: batch[name if name in batch else plain] for name, plain in named.items()
                 if name in batch or plain in batch}
        body, length = build_request(self.config, feeds, outputs=[first])
        headers = {"Content-Type": SAGEMAKER_BINARY_CONTENT_TYPE.format(length)}
        path = f"/models/{self.name}/invoke"

        def call() -> Any:
            answer = self.server.request("POST", path, body, headers=headers, timeout=600)
            if answer.status != 200:
                raise RuntimeError(f"invoke answered {answer.status}: {answer.body.decode(errors='replace')[:500]}")
            return parse_response(answer.body, header_length(answer.headers.get("Content-Type", ""))).as_numpy(first)

        return call


def measure_served(model: ServedModel, row: dict[str, Any], batches: dict[int, dict[str, Any]], reference: Any,
                   gpu: Any) -> dict[str, Any]:
    """Cold start, memory, warm latency and parity of one served model (see the module docstring)."""
    from benchmarks.gpu_measure import ITERATIONS, judge, parity, percentiles

    for folder in _engine_cache_folders(model.config):
        if folder.exists():  # a cache from an earlier run would hide the compile this row measures
            log(f"{row['model']}: removing the engine cache {folder} of an earlier run")
            shutil.rmtree(folder)
    gpu.synchronize()
    used_before = gpu.used_bytes()
    row["load_s"] = round(model.load(), 4)
    calls = {size: model.caller(batch) for size, batch in batches.items()}
    started = time.perf_counter()
    calls[1]()
    row["first_answer_s"] = round(time.perf_counter() - started, 4)
    row["cold_start_s"] = round(row["load_s"] + row["first_answer_s"], 4)
    row["gpu_memory_mib"] = round((gpu.used_bytes() - used_before) / 2**20, 1)  # as the in-process rows
    for size, call in calls.items():
        for _ in range(5):
            call()
        samples = []
        for _ in range(ITERATIONS):
            begin = time.perf_counter()
            call()
            samples.append(time.perf_counter() - begin)
        row[f"batch{size}"] = percentiles(samples)
    outputs = calls[8]()
    row["parity_vs_pytorch_fp32"] = parity(outputs, reference)
    row["gate"] = judge(outputs, reference, row["variant"])
    if _engine_cache_folders(model.config):
        row["tensorrt_first_load_s"] = row["cold_start_s"]
        model.unload()
        reload_s = model.load()
        started = time.perf_counter()
        calls[1]()
        row["tensorrt_cached_load_s"] = round(reload_s + time.perf_counter() - started, 4)
        row["engine_cache_files"] = sum(1 for folder in _engine_cache_folders(model.config)
                                        for item in folder.rglob("*") if item.is_file())
    row["status"] = "measured"
    return row


def footprint_parts(footprint: dict[str, Any]) -> dict[str, Any]:
    """What the build measured of the served model (its graph's bytes, its working memory on CPU):
    with them, ``model_build.capacity`` reads the runtime's fixed overhead off the row's GPU memory."""
    parts = {}
    for key, name in (("weight_bytes", "weight_bytes"), ("working_bytes", "working_bytes_cpu")):
        value = (footprint.get(key) or {}).get("value")
        if isinstance(value, (int, float)):
            parts[name] = value
    return parts


def served_rows(manifest_path: Path, models: list[Any], sources: dict[str, Path | None],
                references: dict[str, tuple[Any, dict[int, dict[str, Any]]]], gpu: Any, work: Path
                ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every served row, and what the server was (its version, environment, SHM sizes)."""
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_model
    from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import triton_server

    on_gpu = gpu.device == "cuda"
    entries, rows = served_entries(models, sources, gpu=on_gpu)
    env, why = triton_environment()
    if env is None:
        return rows + [not_measured(e.spec.name, e.variant, "tritonserver", why) for e in entries], {}
    shm, shm_source = shm_settings()
    root = Path(__file__).resolve().parents[1]
    shown = env.root.relative_to(root) if env.root.is_relative_to(root) else env.root
    server_info: dict[str, Any] = {"environment": str(shown), "python": env.python_version,
                                   "shm_byte_sizes": list(shm), "shm_from": shm_source}
    with triton_server(work_dir=work / "server", env=env, shm_default_byte_size=shm[0],
                       shm_growth_byte_size=shm[1]) as server:
        server_info["tritonserver"] = server.version
        for entry in entries:
            name, runtime = entry.spec.name, "tritonserver"
            reference = references.get(entry.reference_key)
            why = tensorrt_missing() if entry.spec.tensorrt is not None else ""
            if reference is None or why:
                rows.append(not_measured(name, entry.variant, runtime, why or "no PyTorch FP32 reference was measured"))
                continue
            outputs, batches = reference
            try:
                log(f"{name} {entry.variant}: building and serving it on tritonserver {server.version}")
                release = work / "release" / entry.variant
                built = build_model(entry.spec, BuildOptions(base_dir=manifest_path.parent),
                                    release_dir=release, work_dir=work / "build")
                model = ServedModel(server, f"{name}/{entry.variant}", release / built.tarball,
                                    (release / built.config).read_text(), work / "models", gpu=on_gpu)
                runtime = runtime_name(model.config, on_gpu)
                row = {"model": name, "variant": entry.variant, "runtime": runtime,
                       **footprint_parts(built.footprint)}
                try:
                    rows.append(measure_served(model, row, batches, outputs, gpu))
                finally:
                    model.unload()
            except Exception as error:
                tail = server.log_tail(5) if not server.alive() else ""
                rows.append(not_measured(name, entry.variant, runtime,
                                         f"{type(error).__name__}: {error}" + (f"\n{tail}" if tail else "")))
            gpu.empty_cache()
    return rows, server_info
