"""What ``make gpu-check`` loads and runs (:mod:`benchmarks.gpu_check` measures it): the batches,
the eager module in PyTorch, and the build's ONNX graphs in ONNX Runtime's GPU providers.

Each case is a loader; a case that cannot run on this machine is a "not measured" row that says
why (no onnxruntime-gpu, no TensorRT library, an export that failed), never a number from
something else.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BATCH_SIZES = (1, 8)
#: Sequence length of the text batches (every row padded to it: the fleet's worst case per request).
SEQUENCE = 128


def log(message: str) -> None:
    print(f"gpu-check: {message}", file=sys.stderr, flush=True)


@dataclass
class Case:
    """One model in one runtime and precision: how to load it and how to call it on a batch."""

    model: str
    variant: str
    runtime: str
    #: Loads onto the GPU; returns the callable (batch -> numpy outputs).
    load: Callable[[], Callable[[dict[str, Any]], Any]]
    #: Where the build's CPU validation refused this graph (it is measured all the same): why.
    build_validation: str | None = None


def not_measured(model: str, variant: str, runtime: str, reason: str) -> dict[str, Any]:
    return {
        "model": model,
        "variant": variant,
        "runtime": runtime,
        "status": "not measured",
        "reason": reason,
    }


def imported_ort_version() -> str | None:
    """The version of the ``onnxruntime`` module this process imports (onnxruntime-gpu installs
    the same module name, so the distributions' versions alone do not say which one runs)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    return str(ort.__version__)


def ort_providers() -> list[str]:
    try:
        import onnxruntime as ort
    except ImportError:
        return []
    return list(ort.get_available_providers())


# ---------------------------------------------------------------------------------------------
# The models: the default manifest's sources, and the variants the fleet would serve
# ---------------------------------------------------------------------------------------------


def model_batches(spec: Any, source_dir: Path | None) -> dict[int, dict[str, Any]]:
    """Batches of 1 and 8 as numpy arrays: real sentences padded to :data:`SEQUENCE`, or pixels."""
    import numpy as np

    from triton_mme_cdk.model_build.export.eager import DEFAULT_SENTENCES, text_batch

    out: dict[int, dict[str, Any]] = {}
    for size in BATCH_SIZES:
        if spec.task == "image-classification":
            image = spec.image_inputs
            rng = np.random.default_rng(size)
            out[size] = {
                "pixel_values": rng.standard_normal(
                    (size, image.channels, image.image_size, image.image_size), dtype=np.float32
                )
            }
            continue
        texts = [DEFAULT_SENTENCES[i % len(DEFAULT_SENTENCES)] for i in range(size)]
        batch = text_batch(spec, source_dir, texts)
        padded = {}
        for name, array in batch.items():
            full = np.zeros((size, SEQUENCE), dtype=array.dtype)
            full[:, : min(SEQUENCE, array.shape[1])] = array[:, :SEQUENCE]
            padded[name] = full
        out[size] = padded
    return out


def torch_case(spec: Any, source_dir: Path | None, torch: Any, *, half: bool, device: str = "cuda") -> Case:
    """The manifest entry's eager module (model_build.export.eager, the one the export traces) on the GPU."""
    from triton_mme_cdk.model_build.export.eager import input_names, load_module

    def load() -> Callable[[dict[str, Any]], Any]:
        # .float(): a source saved in FP16 (a copy carried to the GPU machine) still computes in FP32 here.
        module = load_module(spec, source_dir).float().to(device)
        if half:
            module = module.half()
        names = input_names(spec)

        def call(batch: dict[str, Any]) -> Any:
            tensors = []
            for name in names:
                tensor = torch.from_numpy(batch[name]).to(device, non_blocking=True)
                tensors.append(tensor.half() if half and tensor.is_floating_point() else tensor)
            with torch.inference_mode():
                result = module(*tensors)
            first = result[0] if isinstance(result, tuple) else result
            return first.float().cpu().numpy()

        return call

    return Case(spec.name, "fp16" if half else "fp32", f"pytorch-{device}", load)


def ort_runtime(provider: str) -> str:
    """A row's runtime name for an ONNX Runtime provider: ``CUDAExecutionProvider`` -> ``onnxruntime-cuda``."""
    return f"onnxruntime-{provider.removesuffix('ExecutionProvider').lower()}"


def ort_case(spec: Any, onnx_path: Path, provider: str, variant: str, note: str | None = None) -> Case:
    """An ONNX graph of the build in ONNX Runtime with one execution provider (no CPU fallback is
    counted as GPU: a session whose first provider is not ``provider`` is an error)."""
    import onnxruntime as ort

    def load() -> Callable[[dict[str, Any]], Any]:
        options: dict[str, Any] = {}
        if provider == "TensorrtExecutionProvider":
            options = {"trt_fp16_enable": variant == "tensorrt-fp16"}
        elif provider == "CUDAExecutionProvider" and variant == FP32_NO_TF32:
            options = {"use_tf32": "0"}
        fallback = [] if provider == "CPUExecutionProvider" else ["CPUExecutionProvider"]
        session = ort.InferenceSession(str(onnx_path), providers=[(provider, options), *fallback])
        if session.get_providers()[0] != provider:
            raise RuntimeError(f"{provider} was not used: the session runs on {session.get_providers()}")
        names = [item.name for item in session.get_inputs()]

        def call(batch: dict[str, Any]) -> Any:
            return session.run(None, {name: batch[name] for name in names})[0]

        return call

    return Case(
        spec.name,
        variant,
        ort_runtime(provider),
        load,
        build_validation=note,
    )


def _export(spec: Any, manifest_dir: Path, work: Path) -> Path:
    """The manifest entry's ONNX graph as the build writes it (export, fusions, FP16 where the
    entry asks, validation on CPU)."""
    from triton_mme_cdk.model_build.export.validate import export_and_validate

    exported, _report, _reference = export_and_validate(spec, base_dir=manifest_dir, work_dir=work)
    return Path(exported.path)


def exported_despite(error: Exception, spec: Any, work: Path) -> Path | None:
    """The graph the export wrote before its CPU validation refused it (a build here would stop;
    the GPU rows still measure it, against PyTorch FP32 on the GPU, and say so)."""
    from triton_mme_cdk.model_build.errors import ValidationMismatchError

    graph = work / spec.name / "model.onnx"
    return graph if isinstance(error, ValidationMismatchError) and graph.is_file() else None


#: ONNX Runtime's CUDA provider with ``use_tf32=0``: FP32 MatMul and Conv inputs not rounded to TF32.
FP32_NO_TF32 = "fp32-no-tf32"
#: The ONNX Runtime rows per model: (provider, variant, the build's precision of the graph it runs).
ORT_VARIANTS = (
    ("CUDAExecutionProvider", "fp32", "fp32"),  # the provider's defaults, as served: TF32 on Ampere and newer
    ("CUDAExecutionProvider", FP32_NO_TF32, "fp32"),  # use_tf32=0, as the build's validation runs it
    ("CUDAExecutionProvider", "fp16", "fp16"),  # the graph ``precision: fp16`` builds
    ("TensorrtExecutionProvider", "tensorrt-fp16", "fp32"),  # the provider's own FP16 (trt_fp16_enable)
)
#: ``--cpu``: the same ONNX Runtime path on the CPU provider, to test the check itself.
CPU_ORT_VARIANTS = (("CPUExecutionProvider", "fp32", "fp32"),)
#: The TensorRT runtime that onnxruntime-gpu's TensorRT provider loads (TensorRT 10).
TENSORRT_LIBRARY = "libnvinfer.so.10"


def preload_cuda_libraries() -> str:
    """Load CUDA, cuDNN and cuBLAS from the pip-installed NVIDIA packages (PyTorch's) before a
    CUDA session, as ``onnxruntime.preload_dlls`` does; "" or why not."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return f"onnxruntime {ort.__version__} has no preload_dlls"
    try:
        preload()
    except Exception as error:  # the session's own error then says which library is missing
        return f"{type(error).__name__}: {error}"
    return ""


def tensorrt_missing() -> str:
    """Why the TensorRT provider cannot run here ("" where its TensorRT library loads)."""
    import ctypes

    try:
        ctypes.CDLL(TENSORRT_LIBRARY)
    except OSError as error:
        return (
            f"TensorRT is not on this machine ({TENSORRT_LIBRARY}: {error}); the provider needs the "
            "TensorRT 10 that onnxruntime-gpu was built against (NVIDIA's tensorrt-cu13 wheels)"
        )
    return ""


def variant_entry(spec: Any, source_dir: Path | None, **update: Any) -> Any:
    """The manifest entry with ``update`` applied (one copy, FP16 only through ``precision``),
    validated as the manifest validates it; its source the folder the check was given (a copy
    carried to the GPU machine) instead of a fetch.

    Only the fields the manifest set are passed on: a field passed counts as set, and what a
    field being set means can differ from its default (an FP16 graph is judged by ``tolerance``
    only where the manifest set it; see ``elementwise_tolerance_applies``)."""
    from triton_mme_cdk.model_build.manifest.fields import LocalSource

    fields = {"copies": 1, "fp16": False, **update}
    if source_dir is not None and spec.source.kind in ("package", "huggingface", "s3"):
        fields["source"] = LocalSource(kind="local", path=str(source_dir))
    given = {name: value for name, value in dict(spec).items() if name in spec.model_fields_set}
    return type(spec).model_validate({**given, **fields})


def ort_cases(
    spec: Any,
    source_dir: Path | None,
    manifest_dir: Path,
    work: Path,
    variants: Sequence[tuple[str, str, str]],
    providers: Sequence[str],
) -> tuple[list[Case], list[dict[str, Any]]]:
    """The ONNX Runtime cases of one model, and a not-measured row for each that cannot run here."""
    cases: list[Case] = []
    rows: list[dict[str, Any]] = []
    graphs: dict[str, Path | str] = {}
    refused: dict[str, str] = {}  # precision -> the CPU validation's refusal of a graph measured anyway
    for provider, variant, precision in variants:
        runtime = ort_runtime(provider)
        why = "" if provider in providers else f"onnxruntime has no {provider} (providers: {list(providers)})"
        if not why and provider == "TensorrtExecutionProvider":
            why = tensorrt_missing()
        if not why and precision not in graphs:
            entry = variant_entry(spec, source_dir, precision=precision)
            log(f"{spec.name}: exporting the {precision} graph from its {entry.source.kind} source")
            try:
                graphs[precision] = _export(entry, manifest_dir, work / f"export-{precision}")
            except Exception as error:
                graphs[precision] = exported_despite(error, entry, work / f"export-{precision}") or (
                    f"the {precision} export failed: {type(error).__name__}: {error}"
                )
                if isinstance(graphs[precision], Path):
                    refused[precision] = f"{type(error).__name__}: {error}"
        graph = graphs.get(precision)
        if not why and isinstance(graph, str):
            why = graph
        if why:
            rows.append(not_measured(spec.name, variant, runtime, why))
        else:
            assert isinstance(graph, Path)
            cases.append(ort_case(spec, graph, provider, variant, refused.get(precision)))
    return cases, rows


# ---------------------------------------------------------------------------------------------
# The GPU and the runtimes
# ---------------------------------------------------------------------------------------------


class Gpu:
    """The one CUDA device of the run (through torch, which every path has).

    ``device="cpu"`` runs the same code on the CPU, to test the check itself without a GPU: its
    memory column is then 0 and the result says ``cpu``; it is never written to the docs."""

    def __init__(self, torch: Any, device: str = "cuda") -> None:
        self.torch = torch
        self.device = device
        self.properties = torch.cuda.get_device_properties(0) if device == "cuda" else None

    def synchronize(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def used_bytes(self) -> int:
        """Memory in use on the device by every allocator (PyTorch's and ONNX Runtime's alike)."""
        if self.device != "cuda":
            return 0
        free, total = self.torch.cuda.mem_get_info()
        return int(total - free)

    def empty_cache(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.empty_cache()

    def describe(self) -> dict[str, Any]:
        props = self.properties
        if props is None:
            return {
                "name": "cpu",
                "compute_capability": "",
                "memory_gib": 0,
                "torch_cuda": None,
                "driver": None,
            }
        return {
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "torch_cuda": self.torch.version.cuda,
            "driver": _driver_version(),
        }


def _driver_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def probe_cuda() -> tuple[Any, str]:
    """(torch, "") where torch sees a CUDA GPU, else (None, why not)."""
    import shutil

    if shutil.which("nvidia-smi") is None:
        return None, "no NVIDIA driver: nvidia-smi is not on PATH"
    try:
        import torch
    except ImportError as error:
        return None, f"torch is not importable ({error})"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} reports torch.cuda.is_available() = False"
    return torch, ""
