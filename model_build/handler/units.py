"""The work both build paths do, one unit at a time: ``is_complete`` building in place (no state
machine) and the build state machine's steps (:mod:`model_build.handler.build_steps`).

This runtime's keys of a manifest (:func:`computed_release`, :func:`model_key`), one model built
and stored under its key (:func:`build_and_store`), and the final step, the release assembled
from the store, its index written last (:func:`write_index`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.handler.request import Request
from triton_mme_cdk.model_build.manifest import Manifest, ModelSpec
from triton_mme_cdk.model_build.release import Release, compute_release, entry_model_key


def computed_release(manifest: Manifest) -> Release:
    """This runtime's release of the manifest: each model's key (its own code and library
    versions; the Lambda has no local sources), the model code's hash and each entry's hash.
    The CDK app computed the same keys at synth from the same files."""
    return compute_release(manifest, base_dir=Path(tempfile.gettempdir()))


def model_keys(manifest: Manifest) -> dict[str, str]:
    """``model name -> key`` of every entry, as :func:`computed_release` gives them."""
    return dict(computed_release(manifest).model_keys)


def model_key(spec: ModelSpec) -> str:
    """This runtime's key of one entry, as :func:`computed_release` gives it (a Map item's own alone)."""
    return entry_model_key(spec, base_dir=Path(tempfile.gettempdir()))


def build_and_store(s3: Any, request: Request, spec: ModelSpec, key: str) -> None:
    """The per-model unit: build one entry and store it under ``<prefix>/_builds/<key>/``."""
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_unit
    from triton_mme_cdk.model_build.release.store import publish_unit

    work = Path(tempfile.mkdtemp(prefix=f"build-{spec.name}-", dir=os.environ.get("TMPDIR")))
    try:
        result, _ = build_unit(spec, key, BuildOptions(base_dir=work, s3_client=s3), store_dir=work / "store")
        publish_unit(
            result.artifact(work / "store" / key),
            key,
            s3_client=s3,
            bucket=request.model_bucket,
            model_prefix=request.model_prefix,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def write_index(s3: Any, request: Request, manifest: Manifest, computed: Release, *,
                admit: Callable[[Sequence[Any]], None] | None = None) -> None:
    """The final step: assemble the release from the store (server-side copies, index last);
    ``admit`` checks the stored objects to be copied first (:attr:`ReleaseTarget.admit`)."""
    from triton_mme_cdk.model_build.capacity.fit import fleet_from_record, release_check
    from triton_mme_cdk.model_build.release.store import ReleaseTarget, assemble_release, stored_models

    release = replace(request.release, model_keys=dict(computed.model_keys),
                      model_code_sha256=computed.model_code_sha256, entry_hashes=computed.entry_hashes)
    # The models must fit the fleet the stack deploys (its record), checked with the footprints the
    # builds recorded before anything is copied or the index written.
    check = release_check(fleet_from_record(request.deployed))
    assemble_release(stored_models(manifest, computed.model_keys),
                     ReleaseTarget.of(release, s3, request.model_bucket, request.model_prefix, check=check,
                                      admit=admit))
