"""Will the models fit the fleet: each target's GPU estimate against the usable GPU memory of the
fleet's instance type, and the served set against the instance's disk.

- A model whose GPU estimate (:meth:`~model_build.capacity.footprint.Footprint.gpu_memory`) exceeds
  the usable GPU memory is **refused**: the message names the model, its estimate, the instance
  type and its GPU memory. A lower bound (a footprint before the build, without its working memory)
  that already exceeds it is refused too: the real model can only be larger.
- The usable memory is the GPU's memory (``model_build.gpu_hosts.INSTANCE_TYPES``), times
  ``SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT`` where the endpoint's environment sets it (the serve
  script passes it to tritonserver as ``--model-load-gpu-limit``: a load is refused while the
  device's usage is above that fraction), less tritonserver's own CUDA context and memory pool.
- A served set (every target's tarball and unpacked files) larger than the instance's disk is a
  **warning** naming the sizes: SageMaker then deletes unused artifacts and downloads them again.
- What cannot be known (a model whose weights cannot be sized here, a disk not known before the
  build) is reported as **unknown**, never as fitting.

Each endpoint is checked against its own fleet (:class:`Fleet`). Standard library only: synth
calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from triton_mme_cdk.model_build.capacity.footprint import (
    DOCUMENTED,
    GIB,
    Coefficients,
    Footprint,
    index_footprints,
)
from triton_mme_cdk.model_build.errors import FitError
from triton_mme_cdk.model_build.gpu_hosts import INSTANCE_TYPES, instance_disk_bytes, instance_type

#: The container variable whose fraction caps the GPU memory a load may find in use.
LOAD_GPU_LIMIT = "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT"
Level = Literal["refused", "warning", "unknown"]


@dataclass(frozen=True)
class Fleet:
    """The fleet an endpoint runs: its instance type, container environment and volume."""

    instance_type: str
    environment: Mapping[str, str] = field(default_factory=dict)
    #: ``VolumeSizeInGB`` where set (EBS-backed p2/p3 only).
    volume_size_gb: int | None = None
    #: How messages name the instance type setting (``mme:instance_type``, ``--instance-type``).
    setting: str = "instance_type"


@dataclass(frozen=True)
class Finding:
    level: Level
    message: str
    model: str = ""


@dataclass(frozen=True)
class FitReport:
    """Every finding of one fleet, and the memory it judged against."""

    fleet: Fleet
    gpu_memory_bytes: int
    usable_gpu_bytes: int
    usable_source: str
    findings: tuple[Finding, ...]

    def of(self, level: Level) -> list[Finding]:
        return [finding for finding in self.findings if finding.level == level]

    @property
    def refused(self) -> list[Finding]:
        return self.of("refused")

    def refusal(self) -> str | None:
        """The refusals as one message (``None`` when nothing is refused)."""
        found = self.refused
        return "; ".join(finding.message for finding in found) if found else None


def load_gpu_limit(environment: Mapping[str, str]) -> tuple[float | None, str | None]:
    """The fraction ``SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT`` sets, or ``(None, why it is refused)``;
    ``(None, None)`` where it is not set (or not resolved at synth)."""
    raw = environment.get(LOAD_GPU_LIMIT)
    if raw is None or "${Token[" in str(raw):
        return None, None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        return None, (f"triton_environment {LOAD_GPU_LIMIT}: got {raw!r}; expected a fraction above 0 and at "
                      "most 1 (tritonserver's --model-load-gpu-limit)")
    return value, None


def usable_gpu(fleet: Fleet, coefficients: Coefficients | None = None) -> tuple[int, int, str]:
    """(the GPU's memory, the memory a model may use, how the second was found)."""
    row = instance_type(fleet.instance_type)
    total = row.gpu_memory_bytes
    limit, _ = load_gpu_limit(fleet.environment)
    server = (coefficients or Coefficients()).figures.get("server_gpu_bytes", DOCUMENTED["server_gpu_bytes"])
    usable = total if limit is None else int(total * limit)
    usable -= int(server.value or 0)
    how = (f"x {LOAD_GPU_LIMIT}={limit:g}, " if limit is not None else "") + (
        f"less tritonserver's own {_gib(server.value or 0)}")
    return total, usable, how


def check_fit(footprints: Iterable[Footprint], fleet: Fleet, coefficients: Coefficients | None = None) -> FitReport:
    """Judge ``footprints`` (one per target) against ``fleet`` (see the module docstring)."""
    if fleet.instance_type not in INSTANCE_TYPES:
        raise ValueError(f"{fleet.setting}: got {fleet.instance_type!r}; known: {', '.join(INSTANCE_TYPES)}")
    _, problem = load_gpu_limit(fleet.environment)
    if problem:
        raise ValueError(problem)
    row = instance_type(fleet.instance_type)
    total, usable, how = usable_gpu(fleet, coefficients)
    footprints = list(footprints)
    findings: list[Finding] = []
    seen: set[str] = set()
    for footprint in footprints:
        if footprint.model in seen:  # the copies of an entry share its footprint
            continue
        seen.add(footprint.model)
        gpu = footprint.gpu_memory()
        if gpu.value is None:
            findings.append(Finding("unknown", f"model {footprint.model!r}: GPU memory estimate unknown ({gpu.source}); "
                                               f"its fit on {fleet.instance_type} is not checked", footprint.model))
        elif gpu.value > usable:
            bound = "at least " if footprint.lower_bound else ""
            findings.append(Finding("refused", (
                f"model {footprint.model!r} needs {bound}{_gib(gpu.value)} of GPU memory when loaded "
                f"({'estimate' if gpu.estimate else 'measured'}: {gpu.source}), more than {fleet.setting} "
                f"{fleet.instance_type} gives: an {row.gpu.name} with {_gib(total)}, {_gib(usable)} usable ({how}); "
                "choose an instance type with a larger GPU, or lower its max_batch_size, instance_group.count or "
                "precision"), footprint.model))
    findings += _disk(footprints, fleet)
    return FitReport(fleet, total, usable, how, tuple(findings))


def _disk(footprints: list[Footprint], fleet: Fleet) -> list[Finding]:
    disk = instance_disk_bytes(fleet.instance_type, fleet.volume_size_gb)
    row = instance_type(fleet.instance_type)
    sizes = [footprint.disk_bytes() for footprint in footprints]
    known = [size for size in sizes if size.value is not None]
    total = sum(size.value or 0.0 for size in known)
    kind = "instance store" if row.disk_kind == "nvme" else "EBS volume"
    if total > disk:
        estimate = " (estimate)" if any(size.estimate for size in known) else ""
        return [Finding("warning", (
            f"the served set of {len(footprints)} target models takes {_gb(total)}{estimate} on disk (tarballs and "
            f"unpacked files), more than the {_gb(disk)} {kind} of {fleet.instance_type}: SageMaker deletes unused "
            "artifacts from the disk when it fills and downloads them again on their next request"))]
    unknown = [size for size in sizes if size.value is None]
    if unknown:
        return [Finding("unknown", f"disk: {len(unknown)} of {len(sizes)} target models have no known size yet "
                                   f"({unknown[0].source}); "
                                   f"the {_gb(total)} known fit the {_gb(disk)} {kind} of {fleet.instance_type}")]
    return []


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def _gb(value: float) -> str:
    return f"{value / 1000**3:.1f} GB"



def fleet_from_record(record: Mapping[str, Any] | None) -> Fleet | None:
    """The fleet a deployed record renders (``model_build.release.deployed``: the template's
    EndpointConfig and Model; a template's ``Resources`` read the same): its instance type, ``VolumeSizeInGB`` and the container's environment
    (values the template gives as strings); ``None`` where the record has no such instance type."""
    resources = (record or {}).get("resources") or (record or {}).get("Resources") or {}
    fleet: dict[str, Any] = {"environment": {}}
    for resource in resources.values() if isinstance(resources, Mapping) else ():
        if not isinstance(resource, Mapping):
            continue
        properties = resource.get("Properties") or {}
        if resource.get("Type") == "AWS::SageMaker::EndpointConfig":
            variants = properties.get("ProductionVariants") or [{}]
            fleet["instance_type"] = variants[0].get("InstanceType")
            volume = variants[0].get("VolumeSizeInGB")
            fleet["volume_size_gb"] = volume if isinstance(volume, int) else None
        elif resource.get("Type") == "AWS::SageMaker::Model":
            environment = (properties.get("PrimaryContainer") or {}).get("Environment") or {}
            fleet["environment"] = {key: value for key, value in environment.items() if isinstance(value, str)}
    if fleet.get("instance_type") not in INSTANCE_TYPES:
        return None
    return Fleet(fleet["instance_type"], fleet["environment"], fleet.get("volume_size_gb"), "instance type")


def release_check(fleet: Fleet | None, coefficients: Coefficients | None = None) -> Callable[[Sequence[Mapping[str, Any]]], None]:
    """A check of a release's index entries (with their recorded footprints) on ``fleet``, for the
    build's last step: a model that does not fit raises :class:`FitError` before anything is
    published. Without a fleet (a stack that records none) nothing is checked."""

    def check(entries: Sequence[Mapping[str, Any]]) -> None:
        if fleet is None:
            return
        report = check_fit(index_footprints({"models": list(entries)}), fleet, coefficients)
        refusal = report.refusal()
        if refusal:
            raise FitError(refusal, model=report.refused[0].model)

    return check
