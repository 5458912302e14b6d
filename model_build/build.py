"""Orchestration of one model's build: export -> validate -> Triton config -> package.

The steps live in their own modules with typed inputs and outputs; this module only sequences
them, times them and records what a build produced (``build.json``), so ``publish`` and
``verify`` can run later, in another process, on exactly the same bytes.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from model_build.errors import ModelBuildError
from model_build.manifest import Manifest, ModelSpec
from model_build.release import Release
from model_build.types import Artifact

BUILD_RECORD = "build.json"
#: gzip level of the tarballs. ONNX weights barely compress: level 1 gave a MiniLM tarball 0.4%
#: larger than level 9 but packed faster, and unpacking (what an instance pays on a cold load)
#: takes the same time at every level (docs/benchmarks.md, "Artifact size and load").
DEFAULT_COMPRESSLEVEL = 1


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
        )

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
    *,
    base_dir: Path,
    release_dir: Path,
    work_dir: Path,
    s3_client: Any = None,
    compresslevel: int = DEFAULT_COMPRESSLEVEL,
    step: Callable[[str], None] | None = None,
) -> ModelBuildResult:
    """Build one manifest entry into ``release_dir/<name>.tar.gz`` (+ its reference ``.npz``)."""
    # Heavy imports (torch, onnx, onnxruntime) only when something is built.
    from model_build.package import package_model
    from model_build.triton_config import check_config, render_config
    from model_build.validate import export_and_validate

    started = time.perf_counter()
    model_work = work_dir / spec.name
    if model_work.exists():
        shutil.rmtree(model_work)
    model_work.mkdir(parents=True)
    if step:
        step("export + validate")
    exported, report, reference = export_and_validate(
        spec, base_dir=base_dir, work_dir=model_work, s3_client=s3_client
    )
    if step:
        step("config")
    config_text = render_config(spec, exported)
    check_config(config_text, model=spec.name)
    if step:
        step("package")
    tarball = release_dir / f"{spec.name}.tar.gz"
    sha256, size = package_model(
        model_name=spec.name,
        config_text=config_text,
        model_file=exported.path,
        format=spec.format,
        out_path=tarball,
        compresslevel=compresslevel,
    )
    reference_out = release_dir / f"{spec.name}.reference.npz"
    shutil.copyfile(reference, reference_out)
    config_out = release_dir / f"{spec.name}.config.pbtxt"
    config_out.write_text(config_text)
    shutil.rmtree(model_work, ignore_errors=True)
    return ModelBuildResult(
        name=spec.name,
        format=spec.format,
        tarball=tarball.name,
        sha256=sha256,
        size=size,
        targets=spec.target_names(),
        reference=reference_out.name,
        config=config_out.name,
        max_abs_diff=dict(report.max_abs_diff),
        reference_check=report.reference_check,
        reference_max_abs_diff=report.reference_max_abs_diff,
        seconds=round(time.perf_counter() - started, 3),
    )


def build_release(
    manifest: Manifest,
    release: Release,
    *,
    base_dir: Path,
    out_dir: Path,
    s3_client: Any = None,
    compresslevel: int = DEFAULT_COMPRESSLEVEL,
    on_model: Callable[[ModelSpec, str], None] | None = None,
) -> tuple[BuildRecord, Path]:
    """Build every manifest entry into ``out_dir/<release_id>/``; reuse nothing from earlier runs.

    Every build starts from the sources, so "two builds give byte-identical tarballs" is a
    property of the build, not of a cache.
    """
    release_dir = out_dir / release.release_id
    release_dir.mkdir(parents=True, exist_ok=True)
    work_dir = out_dir / ".work"
    results: list[ModelBuildResult] = []
    for spec in manifest.models:
        def step(name: str, spec: ModelSpec = spec) -> None:
            if on_model:
                on_model(spec, name)

        try:
            results.append(
                build_model(
                    spec,
                    base_dir=base_dir,
                    release_dir=release_dir,
                    work_dir=work_dir,
                    s3_client=s3_client,
                    compresslevel=compresslevel,
                    step=step,
                )
            )
        except ModelBuildError as error:
            if error.model is None:
                error.model = spec.name
            raise
    shutil.rmtree(work_dir, ignore_errors=True)
    record = BuildRecord(
        release_id=release.release_id,
        manifest_sha256=release.manifest_sha256,
        code_sha256=release.code_sha256,
        models=results,
    )
    record.write(release_dir)
    return record, release_dir
