"""What the simulator is fed, and where each number comes from: each target's footprint (GPU
bytes, disk bytes, load and download time) and its service time per request.

- Footprints: a user's file (``--footprints``, measured on their fleet, say) over what the
  build recorded or synth estimated (:mod:`~model_build.capacity.footprint`). A file::

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

from triton_mme_cdk.model_build.capacity.simulate import ModelLoad
from triton_mme_cdk.model_build.capacity.traffic import CapacityInputError

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
    import yaml

    if not path.is_file():
        raise CapacityInputError(f"--footprints: got {str(path)!r}; no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise CapacityInputError(f"--footprints {path}: not YAML or JSON ({' '.join(str(error).split())})") from None
    return parse_footprints(data, groups, where=path.name)


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
