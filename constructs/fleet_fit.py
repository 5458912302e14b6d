"""The fit check at synth (issue 50): will an endpoint's models fit its own fleet.

A manifest's models are sized from their sources (``model_build.capacity.sizing``: local files, a
synthetic config's parameter count, the hub cache); a release served with
``ModelSource.from_release`` is checked against its release index where a copy was given
(``from_release(..., index=path)``), else synth says its fit is unknown. A model larger than the
fleet's usable GPU memory stops the synth with one line; a served set larger than the instance's
disk, and a model that cannot be sized, are synth warnings (``Annotations``).

This module lives in the ``constructs`` namespace package (no ``__init__.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import Annotations

from constructs import Construct
from triton_mme_cdk.constructs.endpoint_settings import EndpointSettings
from triton_mme_cdk.constructs.props import BYTES, GIBIBYTES
from triton_mme_cdk.constructs.sagemaker_limits import PropsError
from triton_mme_cdk.constructs.setting_table import whole
from triton_mme_cdk.model_build.capacity.fit import FitReport, Fleet, check_fit
from triton_mme_cdk.model_build.capacity.footprint import Coefficients, Footprint, index_footprints
from triton_mme_cdk.model_build.capacity.sizing import synth_footprints
from triton_mme_cdk.model_build.manifest import Manifest


def synth_fit(*, manifest: Manifest | None, manifest_path: Path | None, release_id: str | None,
              release_index: Path | None, settings: EndpointSettings) -> tuple[FitReport | None, str | None]:
    """The fit report of an endpoint's models on its fleet, or ``(None, why it cannot be checked)``;
    a refusal raises :class:`PropsError` naming the model, its estimate, the instance type and its
    GPU memory."""
    coefficients = Coefficients.read()
    volume = None if settings.volume_size is None else whole(GIBIBYTES.read(settings.volume_size))
    fleet = Fleet(settings.instance_type, dict(settings.triton_environment), volume, settings.name("instance_type"))
    footprints: list[Footprint]
    if manifest is not None and manifest_path is not None:
        footprints = synth_footprints(manifest.models, manifest_path.parent, coefficients,
                                      shm_default_byte_size=whole(BYTES.read(settings.shm_default_size)))
    elif release_index is None:
        return None, (f"models: release {release_id} is served as published; its release index is in S3, which "
                      "synth does not read, so its fit on " f"{fleet.instance_type} is not checked (pass a copy: "
                      "ModelSource.from_release(id, index=path))")
    else:
        footprints = index_footprints(read_index_copy(release_index, release_id))
    try:
        report = check_fit(footprints, fleet, coefficients)
    except ValueError as error:
        raise PropsError(str(error)) from None
    refusal = report.refusal()
    if refusal:
        raise PropsError(refusal)
    return report, None


def read_index_copy(path: Path, release_id: str | None) -> Mapping[str, Any]:
    """A local copy of a release index, checked to be one (and of ``release_id``, where it says)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise PropsError(f"models: ModelSource.from_release index {str(path)!r} could not be read ({error})") from None
    if not isinstance(document, dict) or not isinstance(document.get("models"), list):
        raise PropsError(f"models: ModelSource.from_release index {str(path)!r} is not a release index "
                         "(_index.json: no models list)")
    said = document.get("release_id")
    if release_id and isinstance(said, str) and said != release_id:
        raise PropsError(f"models: ModelSource.from_release index {str(path)!r} is release {said}, not {release_id}")
    return document


def annotate_fit(scope: Construct, report: FitReport | None, unknown: str | None) -> None:
    """The report's warnings and unknowns as synth warnings on ``scope``."""
    if unknown:
        Annotations.of(scope).add_warning_v2("triton-mme:fit-unknown", unknown)
    if report is None:
        return
    for finding in report.findings:
        key = "triton-mme:fit-disk" if finding.level == "warning" else "triton-mme:fit-unknown"
        Annotations.of(scope).add_warning_v2(key, finding.message)
