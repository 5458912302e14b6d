"""What the simulator is fed, and where each number comes from: each target's footprint (GPU
bytes, disk bytes, load and download time) and its service time per request.

- Footprints: a user's file (``--footprints``, measured on their fleet, say), over what a release's
  index recorded at build (``--release-index``), over what synth estimates from the manifest's
  sources (:func:`~model_build.capacity.sizing.synth_footprints`; :func:`from_footprint` says
  which parts are estimates and fills what synth cannot know). A file::

      models:                 # target or entry name (an entry: each of its copies)
        minilm-l6-embedding: {gpu_mib: 420, disk_mib: 180, load_s: 1.2, fetch_s: 0.8}

- Service time (GPU time per request, what a spill is decided on): the profile's ``service_ms``,
  else the GPU check's measurement of that entry (``benchmarks/results/gpu_check.json``: batch 1,
  median, in-process on the check's GPU, not the fleet's), else ``--service-ms`` (default
  :data:`DEFAULT_SERVICE_MS`, an assumption, labelled as one).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.capacity.footprint import Coefficients, Footprint
from triton_mme_cdk.model_build.capacity.simulate import InstanceShape, ModelLoad
from triton_mme_cdk.model_build.capacity.traffic import read_yaml
from triton_mme_cdk.model_build.errors import CapacityInputError

MIB = 1024**2
#: Milliseconds per request where nothing better is known (an assumption, shown as one).
DEFAULT_SERVICE_MS = 10.0
FOOTPRINT_KEYS = ("gpu_mib", "disk_mib", "load_s", "fetch_s")


@dataclass(frozen=True)
class TargetFootprint:
    """One target's footprint as the simulator needs it, with where it comes from."""

    gpu_bytes: int
    disk_bytes: int
    load_seconds: float
    fetch_seconds: float
    #: ``given`` (the user's file), ``recorded`` (a release index), ``estimated`` (synth-like sizing).
    source: str
    #: What the numbers rest on, for the report ("estimate: weights x 1.2 + ...").
    note: str = ""


def _number(value: Any, field: str, expected: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CapacityInputError(f"{field}: got {value!r}; expected {expected}")
    return float(value)


def parse_footprints(data: Any, groups: Mapping[str, Sequence[str]], *, where: str = "footprints") \
        -> dict[str, TargetFootprint]:
    """Target name -> footprint of a ``--footprints`` file's mapping."""
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        raise CapacityInputError(f"{where}.models: missing; expected model name -> "
                                 "{gpu_mib, disk_mib, load_s, fetch_s}")
    found: dict[str, TargetFootprint] = {}
    for name, row in data["models"].items():
        field = f"{where}.models.{name}"
        targets = groups.get(str(name)) or next(([str(name)] for names in groups.values() if name in names), None)
        if targets is None:
            raise CapacityInputError(f"{field}: got {name!r}; no such model in the manifest")
        if not isinstance(row, dict):
            raise CapacityInputError(f"{field}: got {row!r}; expected a mapping of {', '.join(FOOTPRINT_KEYS)}")
        unknown = sorted(set(row) - set(FOOTPRINT_KEYS))
        if unknown:
            raise CapacityInputError(f"{field}.{unknown[0]}: unknown field; expected {', '.join(FOOTPRINT_KEYS)}")
        missing = [key for key in ("gpu_mib", "disk_mib", "load_s") if key not in row]
        if missing:
            raise CapacityInputError(f"{field}.{missing[0]}: missing; expected a number >= 0")
        footprint = TargetFootprint(
            int(_number(row["gpu_mib"], f"{field}.gpu_mib", "MiB, a number >= 0") * MIB),
            int(_number(row["disk_mib"], f"{field}.disk_mib", "MiB, a number >= 0") * MIB),
            _number(row["load_s"], f"{field}.load_s", "seconds, a number >= 0"),
            _number(row.get("fetch_s", 0.0), f"{field}.fetch_s", "seconds, a number >= 0"),
            "given", f"from {where}")
        for target in targets:
            found[target] = footprint
    return found


def read_footprints(path: Path, groups: Mapping[str, Sequence[str]]) -> dict[str, TargetFootprint]:
    return parse_footprints(read_yaml(path, "--footprints"), groups, where=path.name)


def measured_service_ms(path: Path | None, entries: Sequence[tuple[str, str, str]]) -> dict[str, tuple[float, str]]:
    """Entry name -> (milliseconds, where from) of the GPU check at ``path`` for each
    ``(entry, format, precision)``: its measured batch-1 median on the runtime the format serves
    with; entries it did not measure are left out. A missing file gives nothing."""
    if path is None or not path.is_file():
        return {}
    try:
        check = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CapacityInputError(f"--measurements {path}: not JSON ({error})") from None
    gpu = (check.get("gpu") or {}).get("name", "an unnamed GPU")
    found: dict[str, tuple[float, str]] = {}
    for entry, format_, precision in entries:
        runtime = "onnxruntime-cuda" if format_ == "onnx" else "pytorch-cuda"
        for row in check.get("rows", []):
            if (row.get("model"), row.get("runtime"), row.get("variant"), row.get("status")) == (
                    entry, runtime, precision, "measured") and isinstance((row.get("batch1") or {}).get("p50_ms"),
                                                                        (int, float)):
                found[entry] = (float(row["batch1"]["p50_ms"]),
                                f"measured: {path.name}, {runtime} {precision} batch 1 median on {gpu}, in-process "
                                "(not the fleet's GPU, not Triton)")
                break
    return found


def model_loads(targets: Sequence[tuple[str, str]], footprints: Mapping[str, TargetFootprint],
                service: Mapping[str, tuple[float, str]]) -> list[ModelLoad]:
    """The simulator's models, in the order of ``targets`` (``(target, entry)`` pairs);
    ``service`` is keyed by target. A target without a footprint is refused."""
    loads = []
    for target, _entry in targets:
        footprint = footprints.get(target)
        if footprint is None:
            raise CapacityInputError(f"footprints: {target!r} has none; give it in --footprints FILE")
        ms = service[target][0]
        loads.append(ModelLoad(target, footprint.gpu_bytes, footprint.disk_bytes, footprint.load_seconds,
                               footprint.fetch_seconds, ms / 1000.0))
    return loads


def from_footprint(footprint: Footprint, coefficients: Coefficients) -> TargetFootprint | None:
    """The simulator's view of a recorded or synth :class:`Footprint`; None when its GPU memory is
    unknown (the source could not be sized). What synth cannot know is filled and said: the disk
    (tarball and unpacked files, each taken as the weights' size) and the download (the weights at
    the coefficients' download rate); a synth GPU figure is a lower bound (no working memory)."""
    gpu = footprint.gpu_memory()
    if gpu.value is None:
        return None
    notes = [f"GPU {gpu.describe()}"]
    disk = footprint.disk_bytes()
    weights = footprint.weight_bytes.value or 0.0
    if disk.value is None:
        disk_bytes = 2.0 * weights
        notes.append("disk ESTIMATED as 2 x weights (tarball and unpacked files, unknown before the build)")
    else:
        disk_bytes = disk.value
        notes.append(f"disk {disk.describe()}")
    load = footprint.gpu_load_seconds.value
    if load is None:
        load = coefficients["gpu_load_min_seconds"].value or 0.0
        notes.append(f"GPU load unknown: {coefficients['gpu_load_min_seconds'].source}")
    fetch = add_known(footprint.download_seconds.value, footprint.unpack_seconds.value)
    if fetch is None:
        rate = coefficients["download_bytes_per_second"].value or 1.0
        unpack = coefficients["unpack_bytes_per_second"].value or 1.0
        fetch = weights / rate + weights / unpack
        notes.append("download and unpack ESTIMATED from the weights at the coefficients' rates")
    estimated = footprint.stage == "synth" or gpu.estimate or footprint.lower_bound
    source = "recorded" if footprint.stage == "build" else "estimated"
    if footprint.lower_bound:
        notes.append("GPU is a LOWER BOUND: working memory is measured at build")
    return TargetFootprint(int(gpu.value), int(disk_bytes), float(load), float(fetch),
                           source + (" (estimate)" if estimated and source == "recorded" else ""), "; ".join(notes))


def add_known(*values: float | None) -> float | None:
    """The sum, or None if any is unknown."""
    return None if any(v is None for v in values) else float(sum(v or 0.0 for v in values))


def recorded_footprints(document: Any, where: str) -> list[Footprint]:
    """The footprints a release index records (:func:`~model_build.capacity.footprint.index_footprints`);
    an index that records none is refused (an older build: build the release again)."""
    from triton_mme_cdk.model_build.capacity.footprint import index_footprints

    if not isinstance(document, dict) or not isinstance(document.get("models"), list):
        raise CapacityInputError(f"--release-index {where}: not a release index (no 'models' list)")
    found = index_footprints(document)
    if not any(footprint.gpu_memory().known for footprint in found):
        raise CapacityInputError(f"--release-index {where}: records no footprints (built before they were "
                                 "recorded?); build the release again, or give --footprints FILE")
    return found


def instance_shapes(names: Sequence[str] | None, coefficients: Coefficients, *,
                    load_gpu_limit: float | None = None, volume_size_gb: int | None = None) -> list[InstanceShape]:
    """The candidates: ``names`` (every type the stack accepts when None) from the instance table of
    :mod:`~model_build.gpu_hosts`; an unknown name is refused naming the known ones."""
    from triton_mme_cdk.model_build import gpu_hosts
    from triton_mme_cdk.model_build.capacity.fit import LOAD_GPU_LIMIT, Fleet, usable_gpu

    table = gpu_hosts.INSTANCE_TYPES
    chosen = list(names) if names else list(table)
    for name in chosen:
        if name not in table:
            raise CapacityInputError(f"--instance-type: got {name!r}; expected one of {', '.join(table)}")
    environment = {} if load_gpu_limit is None else {LOAD_GPU_LIMIT: f"{load_gpu_limit:g}"}
    return [InstanceShape(name, max(0, usable_gpu(Fleet(name, environment, volume_size_gb), coefficients)[1]),
                          gpu_hosts.instance_disk_bytes(name, volume_size_gb)) for name in chosen]
