"""Each target model's footprint on the fleet, and the coefficients its estimates come from.

A :class:`Footprint` holds, for one target (``<name>`` or ``<name>-<i>`` of a manifest entry):

- the weight bytes at the served precision (the graph files the tarball holds, measured at build;
  at synth, the source's weights scaled to the precision: an estimate);
- the runtime's working memory at the largest batch and sequence, per instance (at build: measured
  on an ONNX Runtime CPU session, taken as an estimate of the GPU's; at synth: unknown);
- the runtime's fixed overhead per instance, and the CUDA context of each python-backend stub;
- host memory of the python-backend steps (the tokenizer of a raw-text model);
- the tarball's and the unpacked bytes on disk;
- the load time measured at build (an ONNX Runtime session on CPU), and the GPU's load, the
  download and the unpack, from ``make gpu-check``'s served rows or documented figures.

Every number is a :class:`Figure`: its value (``None`` where it is unknown), where it comes from,
and whether it is an estimate. :meth:`Footprint.gpu_memory` adds them up:

    GPU = instances x (weights + working memory + runtime overhead) + python stubs x CUDA context

with the graph's part on the host instead for a ``KIND_CPU`` instance group; while the working
memory is unknown (at synth) the sum is a lower bound and says so.

**The python backend stub's CUDA context.** Each python-backend model instance is a process of its
own (``triton_python_backend_stub``) that holds a CUDA context of its own, apart from the server's
(triton-inference-server/server#6860: 368 MiB for an idle stub, next to 164 MiB for the server).
It is counted once per python step instance (:attr:`Coefficients.python_stub_gpu_bytes`), for every
kind: a ``KIND_CPU`` stub was seen holding memory on GPU 0 too (server#7748), and whether the
image's stub creates a context for a CPU instance is not confirmed.

**Where the coefficients come from.** :meth:`Coefficients.read` reads
``benchmarks/results/gpu_check.json``, so that a GPU run updates them with no change of code. Only
its *served* rows count (``runtime`` ``tritonserver-...`` on a GPU, ``status`` ``measured``): the
model loaded by the real tritonserver. The in-process rows (ONNX Runtime and PyTorch in the check's
own process) are not used. The served rows' onnxruntime and pytorch backends are the local
endpoint's python stand-ins: each model runs in a stub process with a CUDA context of its own, where
the image's C++ backends share the server's. So a served row counts for the fleet only less that
context, measured on the same GPU in the same run (``stub_context``: ``benchmarks.gpu_context``);
without it the served rows are not used. Their load time is not used: it includes starting the stub
process, which the C++ backends do not do. Elsewhere each coefficient is a documented figure, named
with its source, or an allowance that says it is one.

Standard library only: the CDK app imports it at synth.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

MIB = 1024**2
GIB = 1024**3
#: The schema of :meth:`Footprint.to_json` (a reader refuses another major).
FOOTPRINT_SCHEMA = "triton-mme/footprint/1"
#: Where ``make gpu-check`` writes its results, from the repository root.
GPU_CHECK = Path("benchmarks") / "results" / "gpu_check.json"
#: Bytes per weight at each served precision, against FP32's 4.
PRECISION_BYTES = {"fp32": 4.0, "fp16": 2.0, "int8": 1.0}
#: ``SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE``'s default (the serve script's): one python model's region.
DEFAULT_SHM_BYTES = 16 * MIB


@dataclass(frozen=True)
class Figure:
    """One number: its value (``None``: unknown), where it comes from, whether it is an estimate."""

    value: float | None
    source: str
    estimate: bool = True

    @property
    def known(self) -> bool:
        return self.value is not None

    def describe(self, unit: str = "bytes") -> str:
        """``1.20 GiB (estimate: <source>)``; ``unknown (<source>)``."""
        if self.value is None:
            return f"unknown ({self.source})"
        shown = _show(self.value, unit)
        return f"{shown} ({'estimate' if self.estimate else 'measured'}: {self.source})"

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source, "estimate": self.estimate}

    @classmethod
    def from_json(cls, value: object, what: str) -> Figure:
        """A figure from :meth:`to_json`; anything else reads as unknown, saying so."""
        if not isinstance(value, Mapping):
            return unknown(f"{what} not recorded")
        number = value.get("value")
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            number = None
        return cls(number, str(value.get("source", "no source recorded")), bool(value.get("estimate", True)))


def unknown(why: str) -> Figure:
    return Figure(None, why, True)


def _show(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / MIB:.1f} MiB"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:g} {unit}"


def add(figures: list[tuple[float, Figure]], source: str) -> Figure:
    """``sum(factor x figure)``: unknown if any is, an estimate if any is."""
    if any(figure.value is None for _, figure in figures):
        missing = "; ".join(dict.fromkeys(figure.source for _, figure in figures if figure.value is None))
        return unknown(f"{source}: {missing}")
    total = sum(factor * (figure.value or 0.0) for factor, figure in figures)
    return Figure(total, source, any(figure.estimate for _, figure in figures))


# ---------------------------------------------------------------------------------------------
# Coefficients
# ---------------------------------------------------------------------------------------------

#: Documented figures (each names its source) and allowances (each says it is one), used where
#: ``gpu_check.json`` has no served row.
DOCUMENTED: dict[str, Figure] = {
    "python_stub_gpu_bytes": Figure(
        368 * MIB, "documented figure: an idle triton_python_backend_stub's own CUDA context, 368 MiB in "
        "nvidia-smi (triton-inference-server/server#6860)"),
    "server_gpu_bytes": Figure(
        164 * MIB, "documented figure: tritonserver's own process with its 64 MiB CUDA memory pool "
        "(--cuda-memory-pool-byte-size default), 164 MiB in nvidia-smi (server#6860, server#7601)"),
    "runtime_overhead_bytes": Figure(
        256 * MIB, "allowance, not a measurement: no source documents a fixed cost per ONNX Runtime CUDA "
        "session or libtorch instance (cuBLAS/cuDNN handles, workspaces, the arena's first chunks); "
        "replaced by make gpu-check's served rows"),
    "python_stub_host_bytes": Figure(
        256 * MIB, "allowance, not a measurement: a python stub process with tokenizers imported"),
    "gpu_load_seconds_per_gib": Figure(
        1.61 / (97.8 / 1024), "documented figure: ResNet-50 ONNX (97.8 MiB) loads and answers in 1.61 s on "
        "a SageMaker GPU MME with graph optimization (AWS ML blog, shared/reference sagemaker-triton-mme.md)"),
    "gpu_load_min_seconds": Figure(1.61, "documented figure: the same ResNet-50 load, as the least a load takes"),
    "download_bytes_per_second": Figure(
        90 * 1000**2, "allowance, not a measurement: one S3 GET stream at about 90 MB/s; SageMaker's "
        "ModelDownloadingTime metric gives the fleet's"),
    "unpack_bytes_per_second": Figure(
        150 * 1000**2, "allowance, not a measurement: gzip inflation at about 150 MB/s on one core; the "
        "build measures its own (Footprint.unpack_seconds)"),
}


@dataclass(frozen=True)
class ServedRow:
    """One served row of ``gpu_check.json``: a model as tritonserver loaded it on a GPU."""

    model: str
    variant: str
    #: The device's used memory after the load less before (the stand-in's stub process included),
    #: and the stub's part of it (a bare CUDA context, same GPU and run).
    served_bytes: float
    stub_context_bytes: float
    gpu: str
    started_at: str

    @property
    def gpu_bytes(self) -> float:
        """The model's GPU memory under the image's C++ backend: the served figure less the stub's context."""
        return max(0.0, self.served_bytes - self.stub_context_bytes)

    @property
    def source(self) -> str:
        return (f"measured by make gpu-check, served row {self.model}/{self.variant} on an {self.gpu} "
                f"({self.started_at}): {self.served_bytes / MIB:.1f} MiB device-wide through the python stand-in, "
                f"less its stub's CUDA context ({self.stub_context_bytes / MIB:.0f} MiB, measured in the same run), "
                "which the image's C++ backend does not have")


def stub_context_bytes(document: Mapping[str, Any]) -> float | None:
    """The bare CUDA context ``gpu_check.json`` records (``stub_context``), or None where it has none."""
    context = document.get("stub_context")
    figures = context.get("figures") if isinstance(context, Mapping) else None
    figure = figures.get("cuda_context") if isinstance(figures, Mapping) else None
    value = figure.get("mib") if isinstance(figure, Mapping) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value) * MIB
    return None


@dataclass(frozen=True)
class Coefficients:
    """The coefficients footprints are estimated with: :data:`DOCUMENTED`, and ``gpu_check.json``'s
    served rows where it has them (:meth:`read`)."""

    figures: Mapping[str, Figure] = field(default_factory=lambda: dict(DOCUMENTED))
    served: tuple[ServedRow, ...] = ()
    #: What was read, or why nothing was.
    origin: str = "documented figures only"

    def __getitem__(self, name: str) -> Figure:
        return self.figures[name]

    @property
    def python_stub_gpu_bytes(self) -> Figure:
        return self.figures["python_stub_gpu_bytes"]

    def served_row(self, model: str, precision: str) -> ServedRow | None:
        """The served row of ``model`` at ``precision`` (its variant), if the check measured one."""
        return next((row for row in self.served if row.model == model and row.variant == precision), None)

    @classmethod
    def read(cls, path: Path | None = None) -> Coefficients:
        """The coefficients of ``path`` (default: this checkout's ``benchmarks/results/gpu_check.json``);
        documented figures where it is absent, unreadable or has no served row (:attr:`origin` says which)."""
        path = path or Path(__file__).resolve().parents[2] / GPU_CHECK
        try:
            document = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(origin=f"documented figures: {path} does not exist")
        except (OSError, ValueError) as error:
            return cls(origin=f"documented figures: {path} could not be read ({error})")
        return cls.from_gpu_check(document, str(path))

    @classmethod
    def from_gpu_check(cls, document: object, where: str = "gpu_check.json") -> Coefficients:
        if not isinstance(document, Mapping) or not isinstance(document.get("rows"), list):
            return cls(origin=f"documented figures: {where} has no rows")
        gpu = document.get("gpu") if isinstance(document.get("gpu"), Mapping) else {}
        gpu_name = str(gpu.get("name", "unknown GPU")) if gpu else "unknown GPU"
        started = str(document.get("started_at", "undated"))
        context = stub_context_bytes(document)
        rows = [row for row in document["rows"] if _served_gpu_row(row)]
        in_process = sum(1 for row in document["rows"] if isinstance(row, Mapping)
                         and not str(row.get("runtime", "")).startswith("tritonserver-"))
        if not rows:
            return cls(origin=f"documented figures: {where} has no served GPU row ({in_process} in-process rows "
                              "are not used: another runtime than the fleet's)")
        if context is None:
            return cls(origin=f"documented figures: {where} has {len(rows)} served GPU rows but no measured stub "
                              "context (stub_context, python -m benchmarks.gpu_context), so their python stand-in's "
                              "share cannot be taken out: they are not used")
        served = tuple(ServedRow(str(row.get("model")), str(row.get("variant")), float(row["gpu_memory_mib"]) * MIB,
                                 context, gpu_name, started) for row in rows)
        figures = dict(DOCUMENTED)
        overheads = _overheads(rows, context)
        if overheads:
            figures["runtime_overhead_bytes"] = Figure(max(overheads) * 1.0, (
                f"measured by make gpu-check on an {gpu_name} ({started}): the largest of {len(overheads)} served "
                f"rows' GPU memory less the stub's CUDA context ({context / MIB:.0f} MiB), the model's weights and "
                "its working memory measured on CPU"), True)
        return cls(figures=figures, served=served,
                   origin=f"{len(served)} served rows of {where} ({gpu_name}, {started}), each less the stub's CUDA "
                          f"context measured in the same run ({context / MIB:.0f} MiB); documented figures for the rest")


def _served_gpu_row(row: object) -> bool:
    """A measured row of the real tritonserver on a GPU, with its memory and load."""
    if not isinstance(row, Mapping) or row.get("status") != "measured":
        return False
    runtime = str(row.get("runtime", ""))
    memory, load = row.get("gpu_memory_mib"), row.get("load_s")
    return (runtime.startswith("tritonserver-") and not runtime.endswith("-cpu")
            and isinstance(memory, (int, float)) and isinstance(load, (int, float)) and memory > 0)


def _overheads(rows: list[Mapping[str, Any]], context: float) -> list[float]:
    """Per served row with the build's ``weight_bytes`` and ``working_bytes_cpu`` (not TorchScript's) and
    no python step of its own: its GPU memory less the stub's context and both, the runtime's fixed cost."""
    out = []
    for row in rows:
        figures = [row.get("gpu_memory_mib"), row.get("weight_bytes"), row.get("working_bytes_cpu")]
        numbers = [float(v) for v in figures if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if not row.get("python_steps") and len(numbers) == len(figures):
            memory_mib, weights, working = numbers
            out.append(max(0.0, memory_mib * MIB - context - weights - working))
    return out


# ---------------------------------------------------------------------------------------------
# Footprints
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Footprint:
    """One target model's footprint (see the module docstring); every number a :class:`Figure`."""

    target: str
    #: The manifest entry it is a target of.
    model: str
    #: ``synth`` (from the source, before a build) or ``build`` (from the built artifact).
    stage: str
    precision: str
    #: ``KIND_GPU``, ``KIND_CPU`` or ``KIND_AUTO`` (served on the GPU) of the graph's instance group.
    instance_kind: str
    instance_count: int
    #: Python-backend model instances the target loads (the tokenizer step of a raw-text model).
    python_instances: int
    weight_bytes: Figure
    #: Per instance, at the largest batch and sequence.
    working_bytes: Figure
    #: Per instance.
    runtime_overhead_bytes: Figure
    #: Per python-backend instance.
    python_stub_gpu_bytes: Figure
    python_host_bytes: Figure
    tarball_bytes: Figure
    unpacked_bytes: Figure
    #: An ONNX Runtime session created on the build's CPU.
    build_load_seconds: Figure
    gpu_load_seconds: Figure
    download_seconds: Figure
    unpack_seconds: Figure
    #: A served row's figure for the model's graph under the C++ backend (the stand-in's stub context
    #: taken out), where ``make gpu-check`` measured it: it then replaces the graph's parts of the sum.
    measured_gpu_bytes: Figure = field(default_factory=lambda: unknown("no served row"))
    largest_batch: int = 0
    largest_sequence: int = 0

    @property
    def on_gpu(self) -> bool:
        return self.instance_kind != "KIND_CPU"

    def gpu_memory(self) -> Figure:
        """The GPU memory the target holds when loaded (see the module docstring)."""
        stubs = [(float(self.python_instances), self.python_stub_gpu_bytes)] if self.python_instances else []
        if self.measured_gpu_bytes.known and self.on_gpu:
            if not stubs:
                return self.measured_gpu_bytes
            return add([(1.0, self.measured_gpu_bytes), *stubs],
                       f"the served row ({self.measured_gpu_bytes.source}) + {self.python_instances} python stub(s) x "
                       "CUDA context")
        if not self.on_gpu:
            return add(stubs, "python stubs' CUDA contexts (the graph runs on KIND_CPU)") if stubs else Figure(
                0.0, "KIND_CPU: the graph holds no GPU memory", False)
        if not self.weight_bytes.known:
            return unknown(f"weights not sized: {self.weight_bytes.source}")
        working = self.working_bytes
        lower = not working.known
        if lower:
            working = Figure(0.0, "working memory not counted (unknown until build)")
        parts = [(float(self.instance_count), self.weight_bytes), (float(self.instance_count), working),
                 (float(self.instance_count), self.runtime_overhead_bytes), *stubs]
        what = (f"{self.instance_count} instance(s) x (weights + {'' if lower else 'working memory + '}runtime overhead)"
                + (f" + {self.python_instances} python stub(s) x CUDA context" if stubs else ""))
        return add(parts, ("lower bound (working memory unknown until the build): " if lower else "") + what)

    @property
    def lower_bound(self) -> bool:
        """True when :meth:`gpu_memory` leaves out the working memory (unknown before the build)."""
        return not self.measured_gpu_bytes.known and self.on_gpu and not self.working_bytes.known

    def host_memory(self) -> Figure:
        """Host memory: the python steps, and the graph itself where it runs on KIND_CPU."""
        parts: list[tuple[float, Figure]] = []
        if self.python_instances:
            parts.append((float(self.python_instances), self.python_host_bytes))
        if not self.on_gpu:
            parts += [(float(self.instance_count), self.weight_bytes), (float(self.instance_count), self.working_bytes)]
        if not parts:
            return Figure(0.0, "no python step, graph on the GPU", False)
        return add(parts, "python steps x (stub + shared memory)" + ("; KIND_CPU graph" if not self.on_gpu else ""))

    def disk_bytes(self) -> Figure:
        """What the target keeps on the instance's disk: its tarball and its unpacked files (whether
        SageMaker keeps the tarball after unpacking is not documented; counting both is the bound)."""
        return add([(1.0, self.tarball_bytes), (1.0, self.unpacked_bytes)], "tarball + unpacked files")

    def cold_load_seconds(self) -> Figure:
        """A load on an instance that has nothing of it: download, unpack, load on the GPU."""
        return add([(1.0, self.download_seconds), (1.0, self.unpack_seconds), (1.0, self.gpu_load_seconds)],
                   "download + unpack + GPU load")

    def describe(self) -> str:
        """One line: the target, its GPU estimate and its disk."""
        return f"{self.target}: GPU {self.gpu_memory().describe()}; disk {self.disk_bytes().describe()}"

    # -----------------------------------------------------------------------------------------
    # JSON
    # -----------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": FOOTPRINT_SCHEMA}
        for item in fields(self):
            value = getattr(self, item.name)
            out[item.name] = value.to_json() if isinstance(value, Figure) else value
        out["gpu_memory"] = self.gpu_memory().to_json()
        out["disk"] = self.disk_bytes().to_json()
        return out

    @classmethod
    def from_json(cls, document: object) -> Footprint | None:
        """A footprint from :meth:`to_json`; ``None`` for anything that is not one (an older index
        holds none: its footprints read as unknown). Unknown fields are ignored; missing figures read
        as unknown."""
        if not isinstance(document, Mapping) or not str(document.get("schema", "")).startswith("triton-mme/footprint/"):
            return None
        if document.get("schema") != FOOTPRINT_SCHEMA:
            return None
        values: dict[str, Any] = {}
        for item in fields(cls):
            raw = document.get(item.name)
            if item.type in ("Figure", Figure):
                values[item.name] = Figure.from_json(raw, item.name)
            elif item.name in ("instance_count", "python_instances", "largest_batch", "largest_sequence"):
                values[item.name] = raw if isinstance(raw, int) and not isinstance(raw, bool) else 0
            else:
                values[item.name] = str(raw) if raw is not None else ""
        return cls(**values)


def footprint_from_parts(
    *, target: str, model: str, stage: str, precision: str, instance_kind: str, instance_count: int,
    python_instances: int, weight_bytes: Figure, working_bytes: Figure, tarball_bytes: Figure,
    unpacked_bytes: Figure, build_load_seconds: Figure, unpack_seconds: Figure | None = None,
    coefficients: Coefficients | None = None, shm_default_byte_size: int | None = None,
    largest_batch: int = 0, largest_sequence: int = 0, backend: str = "onnxruntime",
) -> Footprint:
    """A footprint from what was measured or sized, the rest from ``coefficients``: the runtime
    overhead, the stub's context and host memory, the GPU load, the download and the unpack (a
    measured ``unpack_seconds`` wins); a served row of the same model and precision supplies the
    graph's GPU memory (its stub's context taken out; the load stays the documented one)."""
    coefficients = coefficients or Coefficients()
    row = coefficients.served_row(model, precision)
    overhead = coefficients["runtime_overhead_bytes"]
    if backend not in ("onnxruntime", "pytorch", "tensorrt"):
        overhead = replace(overhead, source=f"{overhead.source} (backend {backend})")
    host = coefficients["python_stub_host_bytes"]
    shm = DEFAULT_SHM_BYTES if shm_default_byte_size is None else shm_default_byte_size
    host = add([(1.0, host), (1.0, Figure(float(shm),
                                          "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE of the endpoint", False))],
               "stub process + its python-backend shared memory region")
    measured = unknown("no served row of make gpu-check for this model and precision") if row is None else Figure(
        row.gpu_bytes, row.source, True)
    gpu_load = _gpu_load(weight_bytes, coefficients)
    download = unknown("tarball size unknown") if not tarball_bytes.known else Figure(
        (tarball_bytes.value or 0.0) / (coefficients["download_bytes_per_second"].value or 1.0),
        f"tarball / {coefficients['download_bytes_per_second'].source}")
    if unpack_seconds is None:
        rate = coefficients["unpack_bytes_per_second"]
        unpack_seconds = unknown("unpacked size unknown") if not unpacked_bytes.known else Figure(
            (unpacked_bytes.value or 0.0) / (rate.value or 1.0), f"unpacked / {rate.source}")
    return Footprint(
        target=target, model=model, stage=stage, precision=precision, instance_kind=instance_kind,
        instance_count=instance_count, python_instances=python_instances, weight_bytes=weight_bytes,
        working_bytes=working_bytes, runtime_overhead_bytes=overhead,
        python_stub_gpu_bytes=coefficients.python_stub_gpu_bytes, python_host_bytes=host,
        tarball_bytes=tarball_bytes, unpacked_bytes=unpacked_bytes, build_load_seconds=build_load_seconds,
        gpu_load_seconds=gpu_load, download_seconds=download, unpack_seconds=unpack_seconds,
        measured_gpu_bytes=measured, largest_batch=largest_batch, largest_sequence=largest_sequence,
    )


def _gpu_load(weight_bytes: Figure, coefficients: Coefficients) -> Figure:
    per_gib, least = coefficients["gpu_load_seconds_per_gib"], coefficients["gpu_load_min_seconds"]
    if not weight_bytes.known:
        return unknown("weights unknown")
    seconds = max(least.value or 0.0, (weight_bytes.value or 0.0) / GIB * (per_gib.value or 0.0))
    return Figure(seconds, f"max({least.source}; weights x {per_gib.source})", True)


def served_weight_bytes(source_bytes: int, source_precision: str, precision: str) -> Figure:
    """The weights at ``precision`` from a source's (FP32 unless said): an estimate, since INT8
    keeps some layers in FP32 and an optimized graph may fold or add initializers."""
    ratio = PRECISION_BYTES.get(precision, 4.0) / PRECISION_BYTES.get(source_precision, 4.0)
    value = source_bytes * min(ratio, 1.0)
    what = "the source's weight files" if ratio >= 1.0 else (
        f"the source's weight files x {ratio:g} ({source_precision} -> {precision})")
    return Figure(value, what, True)


def unknown_footprint(target: str, model: str, why: str) -> Footprint:
    """A footprint of which nothing is known (an index written before footprints were recorded)."""
    nothing = unknown(why)
    return Footprint(target=target, model=model, stage="unknown", precision="", instance_kind="KIND_GPU",
                     instance_count=1, python_instances=0, weight_bytes=nothing, working_bytes=nothing,
                     runtime_overhead_bytes=nothing, python_stub_gpu_bytes=nothing, python_host_bytes=nothing,
                     tarball_bytes=nothing, unpacked_bytes=nothing, build_load_seconds=nothing,
                     gpu_load_seconds=nothing, download_seconds=nothing, unpack_seconds=nothing)


def index_footprints(index: Mapping[str, Any]) -> list[Footprint]:
    """One footprint per logical target of a release index (``_index.json``): the one its build
    recorded, or unknown for an index written before footprints were (its tarball size is still known)."""
    out = []
    for entry in index.get("models", []) if isinstance(index.get("models"), list) else []:
        if not isinstance(entry, Mapping):
            continue
        # The logical target (``<name>`` or ``<name>-<i>``); a served index names its objects
        # ``<target>-<sha12>.tar.gz`` beside it, a laptop one names them after the target.
        target = str(entry.get("logical_name") or str(entry.get("target_model", "")).removesuffix(".tar.gz"))
        model = str(entry.get("source_model", target))
        found = Footprint.from_json(entry.get("footprint"))
        if found is None:
            found = unknown_footprint(target, model, "the release index records no footprint (built before "
                                                     "footprints were recorded)")
            size = entry.get("size")
            if isinstance(size, int) and not isinstance(size, bool):
                found = replace(found, tarball_bytes=Figure(float(size), "the release index", False))
        out.append(replace(found, target=target, model=model))
    return out
