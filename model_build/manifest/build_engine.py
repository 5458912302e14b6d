"""Where a model builds: the build Lambda, or a SageMaker Processing job when it would not fit.

One Lambda run has at most 10,240 MB of memory and 15 minutes. A model whose build needs more
(a 2.4 GB BERT-large-sized model peaked at 10 GB) builds in a Processing job instead, inside the
same state machine, with the same code and the same result in the store. This module decides
which, from an **estimate** of the build's peak memory and time:

    peak = BASELINE + ratio(format, precision) x weight bytes
    time = FIXED_SECONDS + seconds_per_gb(format, precision) x weight GB

The ratios are measured (:data:`RATIOS`, each with where), not guessed; the weight bytes are the
source's weight files. Where those cannot be read (an S3 or hub source at synth, a synthetic
model before it is built) the estimate says *unknown* and why, and nothing is refused on it:
the build state machine's plan step sizes S3 sources again at deploy, before any build starts.

``auto`` picks processing when the estimate exceeds the Lambda with a margin (peak within
:data:`MEMORY_MARGIN` of its memory, time within :data:`TIME_MARGIN` of its timeout); a model
pinned to ``lambda`` whose estimate does not fit is refused, naming the model, the estimate and
the setting to change. Imports no torch, ONNX or AWS SDK: ``cdk synth`` calls it.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from triton_mme_cdk.model_build.errors import ManifestError
from triton_mme_cdk.model_build.manifest.fields import LocalSource, OnnxFileSource, PackageSource
from triton_mme_cdk.model_build.manifest.schema import ModelSpec

Engine = Literal["lambda", "processing"]
RunsOn = Literal["auto", "lambda", "processing"]

#: A Lambda-built model's estimated peak must stay within this share of the function's memory...
MEMORY_MARGIN = 0.8
#: ... and its estimated build time within this share of the function's timeout (time is the
#: rougher estimate: it varies with the CPU Lambda gives and with S3).
TIME_MARGIN = 0.5
#: The files a ``save_pretrained`` folder keeps its weights in, by preference: a folder may hold
#: the same weights twice (safetensors and a PyTorch pickle); the first kind found is counted.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
MB = 1024 * 1024
GB = 1024**3


@dataclass(frozen=True)
class Ratio:
    """Peak RSS above the baseline per byte of weights, and build seconds per GiB of weights."""

    rss_per_weight_byte: float
    seconds_per_gb: float
    #: Where and how it was measured.
    measured: str


#: Peak RSS of a build process before it loads a model (Python, torch, ONNX Runtime imported):
#: 440 MB measured (benchmarks/build_memory.py).
BASELINE_MB = 420
#: Seconds of every build whatever its size (imports, tokenizer, packaging a small model): the
#: intercept of the two FP32 sizes measured (BERT-base 44 s; the 2.4 GB model of issue 36, 3 min).
FIXED_SECONDS = 15
_MEASURED = ("benchmarks/build_memory.py full mode (make bench FULL=1), the BERT-base 438 MB / ResNet-50 "
             "102 MB rows of FP32 weights, 2 cores, 2026-11-26; docs/benchmarks.md")
#: Measured per (task, format, precision); ``*`` stands for any task. Memory: peak RSS above the
#: baseline per weight byte, at BERT-base size (ResNet-50 for images). Time: the slope of the two
#: FP32 sizes (75 s per GiB), scaled per row by its build time at BERT-base size. The same run's
#: larger models need less per byte (over the baseline: FP32 ONNX 1.42 at 1.3 GB and 1.24 at
#: 2.9 GB, FP16 1.90 and 1.63, TorchScript 1.11 and 1.07), so for a big model the estimate is
#: high, on the safe side. Re-measured 2026-11-26 after the TorchScript export let go of the eager
#: module before its read-back (2.21 -> 1.24) and a single-file ONNX save streamed the model
#: instead of serializing it whole (FP16 3.59 -> 2.14, ResNet 5.29 -> 4.42); the other rows moved
#: within the run-to-run spread of about 80 MB.
RATIOS: Mapping[tuple[str, str, str], Ratio] = {
    ("*", "onnx", "fp32"): Ratio(1.85, 75.0, _MEASURED),
    ("text-classification", "onnx", "fp32"): Ratio(1.99, 78.0, _MEASURED),
    ("image-classification", "onnx", "fp32"): Ratio(4.42, 45.0, _MEASURED),
    ("*", "onnx", "fp16"): Ratio(2.14, 63.0, _MEASURED),
    ("*", "onnx", "int8"): Ratio(4.17, 90.0, _MEASURED),
    ("*", "torchscript", "fp32"): Ratio(1.24, 72.0, _MEASURED),
    #: A prebuilt plan is packaged, not exported: the tarball is written from the files.
    ("*", "tensorrt_plan", "fp32"): Ratio(1.0, 10.0, "not measured: no export runs, the plan files are packaged"),
}


def ratio_for(spec: ModelSpec) -> Ratio:
    """The measured ratio of ``spec``'s task, format and precision (the task's own where measured)."""
    precision = spec.effective_precision
    for key in ((spec.task, spec.format, precision), ("*", spec.format, precision), ("*", spec.format, "fp32")):
        if key in RATIOS:
            return RATIOS[key]
    return RATIOS[("*", "onnx", "fp32")]


@dataclass(frozen=True)
class BuildEstimate:
    """A model's estimated build: its weight bytes, peak memory and time, or why it is unknown."""

    weight_bytes: int | None
    peak_mb: int | None
    seconds: int | None
    #: ``None`` when known; otherwise why the weights could not be sized here.
    unknown: str | None = None

    def describe(self) -> str:
        if self.unknown is not None or self.peak_mb is None or self.weight_bytes is None:
            return f"estimate unknown ({self.unknown})"
        return (f"estimated peak {self.peak_mb / 1024:.1f} GiB, {_minutes(self.seconds)} "
                f"for {self.weight_bytes / GB:.2f} GiB of weights")


def _minutes(seconds: int | None) -> str:
    return "?" if seconds is None else f"{max(1, round(seconds / 60))} min"


def weight_bytes_of(sizes: Iterable[tuple[str, int]]) -> int:
    """Bytes of the weights among ``(name, size)`` files: the first kind of
    :data:`WEIGHT_PATTERNS` present, or every ``.onnx`` file and its external data."""
    files = list(sizes)
    for pattern in WEIGHT_PATTERNS:
        suffix = pattern[1:]
        chosen = [size for name, size in files if name.endswith(suffix)]
        if chosen:
            return sum(chosen)
    return sum(size for name, size in files if name.endswith((".onnx", ".onnx.data", ".plan")))


def path_weight_bytes(path: Path) -> int:
    """Bytes of the weights of a source on disk: a ``.onnx`` file and its external data, or the
    first kind of :data:`WEIGHT_PATTERNS` among a folder's files (0 when there are none)."""
    if path.is_file():
        side = path.with_name(path.name + ".data")
        return path.stat().st_size + (side.stat().st_size if side.is_file() else 0)
    return weight_bytes_of((item.name, item.stat().st_size) for item in path.iterdir() if item.is_file())


def source_weight_bytes(spec: ModelSpec, base_dir: Path) -> tuple[int | None, str | None]:
    """The weight bytes of a source readable here (a local folder or file, an installed
    package), or ``(None, why)``: S3 and hub sources are sized where they are read, a synthetic
    model only once it is built."""
    source = spec.source
    path: Path | None = None
    if isinstance(source, (LocalSource, OnnxFileSource)) and not source.path.startswith("s3://"):
        path = (base_dir / source.path).resolve()
    elif isinstance(source, PackageSource):
        try:
            found = importlib.util.find_spec(source.package)
        except (ImportError, ValueError):
            found = None
        if found is not None:
            root = importlib.resources.files(source.package)
            path = Path(str(root)) / source.path if isinstance(root, Path) else None
    if path is None:
        return None, {"s3": "an s3 source is sized at deploy, by the build's plan step",
                      "synthetic": "a synthetic model is sized only once built",
                      "onnx": "an onnx file on S3 is sized at deploy, by the build's plan step",
                      }.get(source.kind, f"a {source.kind} source is not sized before its build downloads it")
    if not path.exists():
        return None, f"source {str(path)!r} does not exist"
    weights = path_weight_bytes(path)
    return (weights, None) if weights else (None, f"no weight files found in {str(path)!r}")


def estimate(spec: ModelSpec, weight_bytes: int | None, unknown: str | None = None) -> BuildEstimate:
    """The estimate of ``spec``'s build from its weight bytes (``None``: unknown, ``unknown`` says why)."""
    if weight_bytes is None:
        return BuildEstimate(None, None, None, unknown or "weights not sized")
    ratio = ratio_for(spec)
    peak_mb = BASELINE_MB + round(ratio.rss_per_weight_byte * weight_bytes / MB)
    seconds = FIXED_SECONDS + round(ratio.seconds_per_gb * weight_bytes / GB)
    return BuildEstimate(weight_bytes, peak_mb, seconds)


# ---------------------------------------------------------------------------------------------
# Processing instances and the placement
# ---------------------------------------------------------------------------------------------

#: GiB of memory per vCPU of the instance families whose sizes follow the rule (AWS instance
#: type pages: ml.m5.4xlarge 16 vCPU 64 GiB, ml.r5.4xlarge 128 GiB, ml.c5.4xlarge 32 GiB).
_GIB_PER_VCPU = {"m4": 4, "m5": 4, "m5d": 4, "r5": 8, "r5d": 8, "c5": 2, "c5d": 2}
_SIZE = re.compile(r"^(?:(\d*)xlarge|large)$")


def instance_memory_mb(instance_type: str) -> int | None:
    """Memory of a Processing instance type, where its family follows the per-vCPU rule."""
    parts = instance_type.split(".")
    if len(parts) != 3 or parts[1] not in _GIB_PER_VCPU:
        return None
    match = _SIZE.match(parts[2])
    if match is None:
        return None
    vcpus = 2 if parts[2] == "large" else 4 * int(match.group(1) or 1)
    return vcpus * _GIB_PER_VCPU[parts[1]] * 1024


@dataclass(frozen=True)
class EngineSettings:
    """The stack's defaults for where models build (``mme:build_*`` settings)."""

    runs_on: RunsOn = "auto"
    lambda_memory_mb: int = 6144
    lambda_timeout_s: int = 900
    instance_type: str = "ml.m5.4xlarge"
    volume_gb: int = 100
    max_runtime_s: int = 50 * 60

    def properties(self) -> dict[str, str]:
        """The custom resource's ``BuildEngine`` property: the plan step places models with it."""
        return {"RunsOn": self.runs_on, "LambdaMemoryMb": str(self.lambda_memory_mb),
                "LambdaTimeoutSeconds": str(self.lambda_timeout_s), "InstanceType": self.instance_type,
                "VolumeGb": str(self.volume_gb), "MaxRuntimeSeconds": str(self.max_runtime_s)}

    @classmethod
    def from_properties(cls, value: object) -> EngineSettings:
        """The settings back from :meth:`properties` (``ValueError`` naming a bad field)."""
        if not isinstance(value, Mapping):
            raise ValueError(f"property BuildEngine: got {type(value).__name__}; expected an object")
        try:
            runs_on = str(value["RunsOn"])
            if runs_on not in ("auto", "lambda", "processing"):
                raise ValueError(f"property BuildEngine.RunsOn: got {runs_on!r}; expected auto, lambda or processing")
            return cls(runs_on=runs_on,  # type: ignore[arg-type]
                       lambda_memory_mb=int(value["LambdaMemoryMb"]),
                       lambda_timeout_s=int(value["LambdaTimeoutSeconds"]),
                       instance_type=str(value["InstanceType"]), volume_gb=int(value["VolumeGb"]),
                       max_runtime_s=int(value["MaxRuntimeSeconds"]))
        except KeyError as missing:
            raise ValueError(f"property BuildEngine: {missing.args[0]} missing") from None
        except (TypeError, ValueError) as error:
            raise ValueError(f"property BuildEngine: {error}") from None


@dataclass(frozen=True)
class Placement:
    """Where one model builds, with the estimate that decided it."""

    model: str
    engine: Engine
    estimate: BuildEstimate
    #: ``auto``, ``lambda`` or ``processing``: what the manifest or the settings asked for.
    asked: RunsOn
    instance_type: str | None = None
    volume_gb: int | None = None

    def label(self, settings: EngineSettings) -> str:
        """``lambda 6 GB`` or ``processing ml.m5.4xlarge``: what validate and plan print."""
        if self.engine == "processing":
            return f"processing {self.instance_type} ({self.volume_gb} GB volume)"
        return f"lambda {settings.lambda_memory_mb / 1024:g} GB"

    def describe(self, settings: EngineSettings) -> str:
        return f"builds on: {self.label(settings)}; {self.estimate.describe()}"


def fits_lambda(build: BuildEstimate, settings: EngineSettings) -> bool | None:
    """Whether the estimate fits the build Lambda with the margins; ``None`` when unknown."""
    if build.peak_mb is None or build.seconds is None:
        return None
    return (build.peak_mb <= MEMORY_MARGIN * settings.lambda_memory_mb
            and build.seconds <= TIME_MARGIN * settings.lambda_timeout_s)


def place(spec: ModelSpec, build: BuildEstimate, settings: EngineSettings) -> Placement:
    """Where ``spec`` builds. Raises :class:`ManifestError` for a model pinned to ``lambda`` whose
    estimate does not fit, and for a Processing instance with less memory than the estimate."""
    asked: RunsOn = (spec.build.runs_on if spec.build and spec.build.runs_on else settings.runs_on)
    fits = fits_lambda(build, settings)
    engine: Engine = "processing" if asked == "processing" or (asked == "auto" and fits is False) else "lambda"
    if asked == "lambda" and fits is False:
        where = "build.runs_on" if spec.build and spec.build.runs_on else "mme:build_runs_on"
        raise ManifestError(
            f"model {spec.name!r}: {where}: got 'lambda', but the build's {build.describe()} does not fit the build Lambda "
            f"({settings.lambda_memory_mb} MB, {settings.lambda_timeout_s // 60} min, with margins "
            f"{MEMORY_MARGIN:.0%} of memory and {TIME_MARGIN:.0%} of time); set build.runs_on to 'processing' "
            "or 'auto', or raise mme:build_memory_mb"
        )
    if engine == "lambda":
        return Placement(spec.name, "lambda", build, asked)
    instance = (spec.build.instance_type if spec.build and spec.build.instance_type else settings.instance_type)
    volume = (spec.build.volume_gb if spec.build and spec.build.volume_gb else settings.volume_gb)
    memory = instance_memory_mb(instance)
    if memory is not None and build.peak_mb is not None and build.peak_mb > MEMORY_MARGIN * memory:
        where = "build.instance_type" if spec.build and spec.build.instance_type else "mme:build_processing_instance_type"
        raise ManifestError(
            f"model {spec.name!r}: {where}: got {instance!r} ({memory // 1024} GiB), but the build's {build.describe()} needs more "
            f"than {MEMORY_MARGIN:.0%} of it; choose a larger instance type (ml.r5 has 8 GiB per vCPU)"
        )
    return Placement(spec.name, "processing", build, asked, instance, volume)


def place_all(specs: Iterable[ModelSpec], base_dir: Path, settings: EngineSettings) -> list[Placement]:
    """Every model's placement from what can be read here (local sources sized, others unknown)."""
    placements = []
    for spec in specs:
        weights, why = source_weight_bytes(spec, base_dir)
        placements.append(place(spec, estimate(spec, weights, why), settings))
    return placements
