"""``--instance-type`` of ``validate``, ``build`` and ``publish``: will the models fit that fleet.

``validate`` sizes each model from its source (``model_build.capacity.sizing``) and prints its GPU
estimate, labelled as one, against the instance type's usable GPU memory; ``build`` and ``publish``
check again with the footprint each build measured, before anything is published. A model that
does not fit is refused (exit 1, one line naming the model, its estimate, the instance type and its
GPU memory); a served set larger than the instance's disk is a warning; what cannot be sized is
reported as unknown.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from triton_mme_cdk.model_build.capacity.fit import LOAD_GPU_LIMIT, FitReport, Fleet, check_fit
from triton_mme_cdk.model_build.capacity.footprint import Coefficients, Footprint, index_footprints
from triton_mme_cdk.model_build.capacity.sizing import synth_footprints
from triton_mme_cdk.model_build.errors import FitError
from triton_mme_cdk.model_build.gpu_hosts import INSTANCE_TYPES
from triton_mme_cdk.model_build.manifest import Manifest


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instance-type", default=None, metavar="TYPE",
                        help="check that every model fits this fleet's GPU and disk (ml.g4dn.*, ml.g5.*, "
                             "ml.p3.2xlarge...; default: no check)")
    parser.add_argument("--model-load-gpu-limit", default=None, metavar="FRACTION",
                        help=f"the endpoint's {LOAD_GPU_LIMIT}, if it sets one (a fraction of the GPU's memory)")
    parser.add_argument("--volume-size-gb", type=int, default=None, metavar="GB",
                        help="the endpoint's volume_size_gb (EBS-backed ml.p2/ml.p3 only)")


def fleet_of(args: argparse.Namespace) -> Fleet | None:
    """The fleet the flags name, or None without ``--instance-type``; a bad value is a
    :class:`FitError` naming the flag, before any slow work."""
    instance_type = getattr(args, "instance_type", None)
    limit = getattr(args, "model_load_gpu_limit", None)
    if instance_type is None:
        if limit is not None:
            raise FitError("--model-load-gpu-limit: given without --instance-type; the limit is a fraction of "
                           "that instance type's GPU memory")
        return None
    if instance_type not in INSTANCE_TYPES:
        raise FitError(f"--instance-type: got {instance_type!r}; a GPU multi-model endpoint runs on one of "
                       + ", ".join(INSTANCE_TYPES))
    environment = {} if limit is None else {LOAD_GPU_LIMIT: str(limit)}
    fleet = Fleet(instance_type, environment, getattr(args, "volume_size_gb", None), "--instance-type")
    try:
        check_fit([], fleet)
    except ValueError as error:
        raise FitError(str(error).replace(f"triton_environment {LOAD_GPU_LIMIT}", "--model-load-gpu-limit")) from None
    return fleet


def fit_table(footprints: Sequence[Footprint], report: FitReport) -> Table:
    fleet = report.fleet
    table = Table(title=f"fit on {fleet.instance_type}: {report.gpu_memory_bytes / 2**30:.2f} GiB GPU, "
                        f"{report.usable_gpu_bytes / 2**30:.2f} GiB usable ({report.usable_source})")
    for column in ("model", "GPU memory when loaded", "disk per target", "verdict"):
        table.add_column(column)
    verdicts = {finding.model: finding.level for finding in report.findings if finding.model}
    seen: set[str] = set()
    for footprint in footprints:
        if footprint.model in seen:
            continue
        seen.add(footprint.model)
        gpu = footprint.gpu_memory()
        shown = _size(gpu.value) + (" (estimate" + (", lower bound" if footprint.lower_bound else "") + ")"
                                    if gpu.estimate and gpu.value is not None else "")
        disk = footprint.disk_bytes()
        table.add_row(footprint.model, shown, _size(disk.value) + (" (estimate)" if disk.estimate and disk.known else ""),
                      verdicts.get(footprint.model, "fits"))
    return table


def _size(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"


def report_fit(footprints: Sequence[Footprint], fleet: Fleet, out: Console, console: Console) -> None:
    """Print the fit table and every warning or unknown; raise :class:`FitError` on a refusal."""
    report = check_fit(footprints, fleet, Coefficients.read())
    out.print(fit_table(footprints, report))
    for finding in report.findings:
        if finding.level != "refused":
            console.print(f"[yellow]{finding.level}:[/yellow] {finding.message}", highlight=False, soft_wrap=True)
    refusal = report.refusal()
    if refusal:
        raise FitError(refusal, model=report.refused[0].model)


def validate_fit(args: argparse.Namespace, manifest: Manifest, base_dir: Path, out: Console, console: Console) -> None:
    """``validate --instance-type``: the sources' footprints on the fleet."""
    fleet = fleet_of(args)
    if fleet is not None:
        report_fit(synth_footprints(manifest.models, base_dir, Coefficients.read()), fleet, out, console)


def built_footprints(artifacts: Sequence[Any]) -> list[Footprint]:
    """The measured footprints of built artifacts (``Artifact.footprint``), one per target."""
    entries = [{"target_model": f"{target}.tar.gz", "source_model": artifact.name, "size": artifact.size,
                "footprint": artifact.footprint} for artifact in artifacts for target in artifact.targets]
    return index_footprints({"models": entries})
