"""Orchestration of one model's build: export -> validate -> Triton config -> package.

The steps live in their own modules with typed inputs and outputs; this module only sequences
them, times them and records what a build produced (``build.json``), so ``publish`` and
``verify`` can run later, in another process, on exactly the same bytes.

Builds are incremental: :func:`build_unit` is the per-model unit (the same one the Lambda runs
for one Map item) and stores its output once per model key under ``<out>/_builds/<key>/``;
:func:`build_release` builds only the keys that are missing (in ``jobs`` processes) and
assembles the release folder from the store.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.artifact.signature import config_signature
from triton_mme_cdk.model_build.artifact.triton_config import parse_config
from triton_mme_cdk.model_build.capacity.footprint import Coefficients
from triton_mme_cdk.model_build.capacity.measure import measure_footprint
from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.manifest import Manifest, ModelSpec
from triton_mme_cdk.model_build.pipeline.steps import BuildOptions
from triton_mme_cdk.model_build.release.identity import BUILDS_DIR, DEFAULT_COMPRESSLEVEL, Release
from triton_mme_cdk.model_build.types import Artifact

__all__ = [
    "DEFAULT_COMPRESSLEVEL", "BuildOptions", "BuildRecord", "ModelBuildResult", "build_missing", "build_model", "build_release",
    "build_unit",
]

BUILD_RECORD = "build.json"
#: The record of one stored unit, written last: a unit folder without it is not a build.
UNIT_RECORD = "result.json"


@dataclass
class ModelBuildResult:
    """What building one manifest entry produced and measured (one row of the summary table)."""

    name: str
    format: str
    tarball: str
    sha256: str
    size: int
    targets: list[str]
    reference: str
    config: str
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    reference_check: str | None = None
    reference_max_abs_diff: float | None = None
    seconds: float = 0.0
    #: Seconds per pipeline step (``model_build.pipeline``), in the order they ran.
    step_seconds: dict[str, float] = field(default_factory=dict)
    #: The precision served and the accuracy gates it met against PyTorch FP32 (min_cosine,
    #: min_cosine_gate, top_k_agreement, top_k_gate), and the ops fused offline (optimize).
    precision: str = "fp32"
    accuracy: dict[str, float] = field(default_factory=dict)
    fused_ops: dict[str, int] = field(default_factory=dict)
    #: INT8: MatMuls quantized, and those kept in FP32 because they cost the most accuracy.
    quantized_matmuls: int = 0
    fp32_matmuls: list[str] = field(default_factory=list)
    #: ``text.group_by_length`` (model_build.export.length_groups): "on: ..." or "off: <why>"; ""
    #: where it was not asked for.
    length_grouping: str = ""
    #: The model key it was built for (``model_build.release.model_key``); "" for a plain build.
    key: str = ""
    #: False where the build never ran the model (a prebuilt TensorRT plan: no GPU); then
    #: ``max_abs_diff`` is empty because nothing was measured, and ``reference_check`` says why.
    verified: bool = True
    #: Its footprint (``model_build.capacity.footprint.Footprint.to_json``, of its first target),
    #: measured once when the unit is built; empty for a unit built before footprints were recorded.
    footprint: dict[str, Any] = field(default_factory=dict)
    #: What a caller sends and gets back (``model_build.artifact.signature.config_signature`` of
    #: its config), published with each route; empty for a unit built before signatures were recorded.
    signature: dict[str, Any] = field(default_factory=dict)

    def artifact(self, base: Path) -> Artifact:
        return Artifact(
            name=self.name,
            format=self.format,
            path=base / self.tarball,
            sha256=self.sha256,
            size=self.size,
            targets=tuple(self.targets),
            reference_path=base / self.reference,
            config_path=base / self.config,
            footprint=self.footprint or None,
            signature=self.signature or None,
        )

    def difference_text(self) -> str:
        """The build table's cell: the worst difference measured, or that the model was not run."""
        if not self.verified:
            return f"not run ({self.reference_check})" if self.reference_check else "not run"
        text = f"{self.worst_diff:.2e}"
        return f"{text} (incl. {self.reference_check})" if self.reference_check else text

    @property
    def worst_diff(self) -> float:
        values = [*self.max_abs_diff.values()]
        if self.reference_max_abs_diff is not None:
            values.append(self.reference_max_abs_diff)
        return max(values, default=0.0)


@dataclass
class BuildRecord:
    """``build/<release>/build.json``: the release and every artifact it holds."""

    release_id: str
    manifest_sha256: str
    code_sha256: str
    models: list[ModelBuildResult]
    #: Models built by the run that wrote this record; the others were reused from the store.
    built: list[str] = field(default_factory=list)

    def artifacts(self, release_dir: Path) -> list[Artifact]:
        return [model.artifact(release_dir) for model in self.models]

    def write(self, release_dir: Path) -> Path:
        path = release_dir / BUILD_RECORD
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def read(cls, release_dir: Path) -> BuildRecord | None:
        path = release_dir / BUILD_RECORD
        if not path.is_file():
            return None
        data: dict[str, Any] = json.loads(path.read_text())
        models = [ModelBuildResult(**item) for item in data.pop("models")]
        return cls(models=models, **data)


def build_model(
    spec: ModelSpec,
    options: BuildOptions,
    *,
    release_dir: Path,
    work_dir: Path,
    step: Callable[[str], None] | None = None,
) -> ModelBuildResult:
    """Run the pipeline (``model_build.pipeline``) for one manifest entry into
    ``release_dir/<name>.tar.gz``, and record its reference ``.npz``, its config and what it measured."""
    from triton_mme_cdk.model_build.pipeline.steps import BuildInputs, run_pipeline

    started = time.perf_counter()
    model_work = work_dir / spec.name
    if model_work.exists():
        shutil.rmtree(model_work)
    model_work.mkdir(parents=True)
    done = run_pipeline(
        BuildInputs(spec=spec, options=options, work_dir=model_work, out_dir=release_dir),
        on_step=step,
    )
    tarball, report = done.need("tarball", "record"), done.need("report", "record")
    reference_out = release_dir / f"{spec.name}.reference.npz"
    shutil.copyfile(done.need("reference", "record"), reference_out)
    config_out = release_dir / f"{spec.name}.config.pbtxt"
    config_text = done.need("config_text", "record")
    config_out.write_text(config_text)
    signature = config_signature(parse_config(config_text, model=spec.name))
    shutil.rmtree(model_work, ignore_errors=True)
    footprint = measure_footprint(spec, tarball, Coefficients.read()).to_json()
    return ModelBuildResult(
        name=spec.name,
        format=spec.format,
        tarball=tarball.name,
        sha256=done.sha256,
        size=done.size,
        targets=spec.target_names(),
        reference=reference_out.name,
        config=config_out.name,
        max_abs_diff=dict(report.max_abs_diff),
        reference_check=report.reference_check,
        reference_max_abs_diff=report.reference_max_abs_diff,
        seconds=round(time.perf_counter() - started, 3),
        step_seconds=dict(done.seconds),
        precision=report.precision,
        accuracy={k: v for k, v in (("min_cosine", report.min_cosine),
                                    ("min_cosine_gate", report.min_cosine_gate),
                                    ("top_k_agreement", report.top_k_agreement),
                                    ("top_k_gate", report.top_k_gate),
                                    ("calibration_min_cosine", report.calibration_min_cosine))
                  if v is not None},
        fused_ops=dict(report.fused_ops),
        quantized_matmuls=report.quantized_matmuls,
        fp32_matmuls=list(report.fp32_matmuls),
        length_grouping=report.length_grouping or "",
        verified=spec.format != "tensorrt_plan",
        footprint=footprint,
        signature=signature,
    )


def _unit_files(spec: ModelSpec) -> tuple[str, str, str]:
    return f"{spec.name}.tar.gz", f"{spec.name}.reference.npz", f"{spec.name}.config.pbtxt"


def read_unit(store_dir: Path, key: str) -> ModelBuildResult | None:
    """The stored build of ``key``, or None when it is absent or incomplete."""
    record = store_dir / key / UNIT_RECORD
    if not record.is_file():
        return None
    result = ModelBuildResult(**json.loads(record.read_text()))
    files = (result.tarball, result.reference, result.config)
    return result if all((store_dir / key / name).is_file() for name in files) else None


def build_unit(
    spec: ModelSpec,
    key: str,
    options: BuildOptions,
    *,
    store_dir: Path,
    step: Callable[[str], None] | None = None,
) -> tuple[ModelBuildResult, bool]:
    """Build one manifest entry into ``store_dir/<key>/`` unless that key is already built.

    Returns the result and whether it was built now. The unit is built in a scratch folder and
    renamed into place once complete, so an interrupted build leaves nothing that looks built
    and a re-run builds exactly what is missing.
    """
    existing = read_unit(store_dir, key)
    if existing is not None:
        return existing, False
    scratch = store_dir / f".{key}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    # The store (and the build folder above it) is created here, lazily; a build that fails
    # removes the folders it created, so a refused input (a source that does not resolve)
    # leaves no trace in the build folder.
    created = [folder for folder in (store_dir, *store_dir.parents) if not folder.exists()]
    scratch.mkdir(parents=True)
    stored = False
    try:
        result = build_model(spec, options, release_dir=scratch, work_dir=scratch / ".work", step=step)
        result.key = key
        (scratch / UNIT_RECORD).write_text(json.dumps(asdict(result), indent=2, sort_keys=True) + "\n")
        shutil.rmtree(store_dir / key, ignore_errors=True)
        os.replace(scratch, store_dir / key)
        stored = True
    except ModelBuildError as error:
        if error.model is None:
            error.model = spec.name
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not stored:
            for folder in created:  # deepest first; a folder another build filled stays
                try:
                    folder.rmdir()
                except OSError:
                    break
    return result, True


def _unit_in_process(
    spec_json: str, key: str, options: BuildOptions, store_dir: Path
) -> tuple[dict[str, Any] | None, tuple[str, str | None, str] | None]:
    """:func:`build_unit` in a worker process; an expected error comes back as plain data
    (message, model, step) because exception classes with keyword-only fields do not pickle."""
    spec = ModelSpec.model_validate_json(spec_json)
    try:
        result, _ = build_unit(spec, key, options.for_worker(), store_dir=store_dir)
    except ModelBuildError as error:
        return None, (str(error), error.model or spec.name, error.step)
    return asdict(result), None


def _build_missing_in_processes(
    missing: list[tuple[ModelSpec, str]],
    options: BuildOptions,
    *,
    store_dir: Path,
    on_built: Callable[[ModelSpec], None],
) -> None:
    """Build ``missing`` in ``options.jobs`` fresh processes (spawned: torch does not survive a fork).

    On the first failure nothing new starts; builds already running finish and stay in the
    store, so a re-run builds only what is still missing. The failure names its model."""
    context = multiprocessing.get_context("spawn")
    shipped = replace(options, s3_client=None)  # each worker makes its own from s3_factory
    with ProcessPoolExecutor(max_workers=options.jobs, mp_context=context) as pool:
        futures: dict[Future[Any], ModelSpec] = {
            pool.submit(_unit_in_process, spec.model_dump_json(), key, shipped, store_dir): spec
            for spec, key in missing
        }
        pending = set(futures)
        failure: ModelBuildError | None = None
        while pending and failure is None:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                _, error = future.result()
                if error is not None and failure is None:
                    message, model, step = error
                    failure = ModelBuildError(message, model=model, step=step)
                elif error is None:
                    on_built(futures[future])
        if failure is not None:
            for future in pending:
                future.cancel()
            raise failure


def _link(source: Path, target: Path) -> None:
    """Put a stored file into the release folder without copying its bytes when possible."""
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def build_missing(
    units: Sequence[tuple[ModelSpec, str]],
    options: BuildOptions,
    *,
    store_dir: Path,
    on_model: Callable[[ModelSpec, str], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
) -> list[str]:
    """Build every ``(spec, key)`` whose key ``store_dir`` does not hold yet; the names built.

    The one runner of many units, for ``build_release`` and the CLI's build against a bucket:
    in this process when ``options.jobs`` is 1 or one unit is missing (``on_model`` hears each
    pipeline step), else in that many spawned processes, each with its own S3 client from
    ``options.s3_factory`` (``on_model`` hears ``"built"`` per unit). A key listed twice is
    built once. ``on_plan`` hears, before any build, how many ``on_model`` calls will follow.
    """
    missing = list({key: (spec, key) for spec, key in reversed(units)
                    if read_unit(store_dir, key) is None}.values())[::-1]
    in_process = options.jobs == 1 or len(missing) <= 1
    if on_plan is not None:
        from triton_mme_cdk.model_build.pipeline.steps import steps_for

        on_plan(sum(len(steps_for(spec)) for spec, _ in missing) if in_process else len(missing))
    if in_process:
        for spec, key in missing:
            build_unit(spec, key, options, store_dir=store_dir, step=partial(on_model, spec) if on_model else None)
    else:
        _build_missing_in_processes(
            missing, options, store_dir=store_dir,
            on_built=lambda spec: on_model(spec, "built") if on_model else None,
        )
    return [spec.name for spec, _ in missing]


def build_release(
    manifest: Manifest,
    release: Release,
    options: BuildOptions,
    *,
    out_dir: Path,
    on_model: Callable[[ModelSpec, str], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
) -> tuple[BuildRecord, Path]:
    """Build the manifest's missing model keys into ``out_dir/_builds/`` and assemble
    ``out_dir/<release_id>/`` (files linked from the store, and ``build.json``).

    A model whose key is already stored is not built again: its key covers everything that
    can change its bytes (``model_build.release``), and two builds of one key give
    byte-identical tarballs (a property of the build, tested), so reuse is sound. With
    ``options.jobs`` > 1 the missing keys build in that many processes.
    """
    keys = dict(release.model_keys)
    unkeyed = [spec.name for spec in manifest.models if spec.name not in keys]
    if unkeyed:
        raise ValueError(f"release {release.release_id} has no model key for {unkeyed}")
    # Created lazily (build_unit makes it when it stores a unit): an input refused before any
    # build, such as a source that does not resolve, leaves the build folder as it was.
    store_dir = out_dir / BUILDS_DIR
    built = build_missing([(spec, keys[spec.name]) for spec in manifest.models], options, store_dir=store_dir,
                          on_model=on_model, on_plan=on_plan)
    release_dir = out_dir / release.release_id
    release_dir.mkdir(parents=True, exist_ok=True)
    results: list[ModelBuildResult] = []
    for spec in manifest.models:
        result = read_unit(store_dir, keys[spec.name])
        assert result is not None, f"{spec.name}: built but not stored"
        unit = store_dir / result.key
        names = _unit_files(spec)
        for stored, name in zip((result.tarball, result.reference, result.config), names, strict=True):
            _link(unit / stored, release_dir / name)
        # The entry's copies are not part of its key: its targets come from the manifest.
        result.tarball, result.reference, result.config = names
        result.targets = spec.target_names()
        results.append(result)
    record = BuildRecord(
        release_id=release.release_id,
        manifest_sha256=release.manifest_sha256,
        code_sha256=release.code_sha256,
        models=results,
        built=built,
    )
    record.write(release_dir)
    return record, release_dir
