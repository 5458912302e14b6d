"""One model's build as a pipeline of typed steps, and the one runner that runs it.

Each step is a small adapter over the module that does the work (``sources``, ``engines``, ``validate``
(export, optimize, check), ``triton_config``, ``text_ensemble``, ``artifact``, ``gate``): it reads
what earlier steps produced from a frozen :class:`Artifacts` and returns a new one with what it
adds. :func:`run_pipeline` is the only place that sequences them, times them and reports
progress; ``model_build.pipeline.build`` drives it for a plain build (:func:`~model_build.pipeline.build.build_model`)
and for a stored unit (:func:`~model_build.pipeline.build.build_unit`), which the CLI, the demo, the Lambda
handler and the benchmarks all call. A step that reads an artifact no earlier step produced is a
bug in :data:`PIPELINE`, not an input error, and says which step and which artifact.

In the style of NVIDIA model navigator's pipelines: the steps are data (:data:`PIPELINE`), so
which steps a model runs is one line per step (``applies``) rather than branches in the runner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from triton_mme_cdk.model_build.manifest import ModelSpec, S3Source
from triton_mme_cdk.model_build.release.identity import DEFAULT_COMPRESSLEVEL

if TYPE_CHECKING:  # the heavy modules are imported by the steps that use them
    from triton_mme_cdk.model_build.text_ensemble.served_tokenizer import ServedTokenizer
    from triton_mme_cdk.model_build.types import ExportedModel, ValidationReport

T = TypeVar("T")


@dataclass(frozen=True)
class BuildOptions:
    """What every model of one build shares, passed whole to each runner of ``model_build.pipeline.build``.

    ``base_dir``: where relative sources resolve. ``s3_client``: reads ``s3`` sources in this
    process; ``s3_factory``: makes one per worker process (a client does not pickle). ``jobs``:
    how many models build at once (1: in this process). ``compresslevel``: gzip level of the
    tarballs, part of every model key (``model_build.release``)."""

    base_dir: Path
    s3_client: Any = None
    s3_factory: Callable[[], Any] | None = None
    compresslevel: int = DEFAULT_COMPRESSLEVEL
    jobs: int = 1

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError(f"jobs: got {self.jobs}; expected >= 1")

    def for_worker(self) -> BuildOptions:
        """These options as a spawned worker process gets them: a client of its own, one job."""
        return replace(self, s3_client=self.s3_factory() if self.s3_factory else None, jobs=1)


@dataclass(frozen=True)
class BuildInputs:
    """What every step may read: the entry, the build's options and where this model writes."""

    spec: ModelSpec
    options: BuildOptions
    #: Scratch folder of this model (removed by the caller once the build is recorded).
    work_dir: Path
    #: Folder the tarball is written to.
    out_dir: Path


@dataclass(frozen=True)
class Artifacts:
    """What the steps have produced so far; each step returns a copy with its own fields set."""

    #: Raw-text targets: the checked tokenizer the ensemble serves (and the folder it came from).
    tokenizer: ServedTokenizer | None = None
    exported: ExportedModel | None = None
    report: ValidationReport | None = None
    #: The ``.npz`` a client of the target sends and expects back (inputs, outputs).
    reference: Path | None = None
    #: The config of the model the endpoint loads (the ensemble's, for raw-text targets).
    config_text: str | None = None
    #: Raw-text targets: the model config of the ONNX member (the config step's output).
    member_config_text: str | None = None
    tarball: Path | None = None
    sha256: str = ""
    size: int = 0
    #: Seconds per step, in the order they ran.
    seconds: dict[str, float] = field(default_factory=dict)

    def need(self, name: str, step: str) -> Any:
        value = getattr(self, name)
        if value is None:
            raise RuntimeError(f"pipeline step {step!r} needs {name!r}, which no earlier step produced")
        return value


@dataclass(frozen=True)
class Step:
    """One step: its progress name, what it does, and which entries it applies to."""

    name: str
    run: Callable[[BuildInputs, Artifacts], Artifacts]
    applies: Callable[[ModelSpec], bool] = lambda spec: True


def _is_text(spec: ModelSpec) -> bool:
    return spec.inputs == "text"


def _is_plan(spec: ModelSpec) -> bool:
    return spec.format == "tensorrt_plan"


def _is_exported(spec: ModelSpec) -> bool:
    return not _is_plan(spec)


# --------------------------------------------------------------------------------------------
# The steps
# --------------------------------------------------------------------------------------------


def check_tokenizer(inputs: BuildInputs, done: Artifacts) -> Artifacts:
    """Raw-text targets: the tokenizer, loaded, checked and serialized before the slow export for
    every source kind (an S3 source: its tokenizer files alone, before the weights are downloaded)."""
    from triton_mme_cdk.model_build.export.sources import resolve_source, s3_tokenizer_files
    from triton_mme_cdk.model_build.text_ensemble.served_tokenizer import prepare_tokenizer

    spec, options = inputs.spec, inputs.options
    folder: Path | None
    if isinstance(spec.source, S3Source):
        folder = s3_tokenizer_files(spec, spec.source, inputs.work_dir / "_tokenizer", options.s3_client)
    else:
        # Resolved where the export looks, so a hub download is not repeated.
        folder = resolve_source(spec, base_dir=options.base_dir, work_dir=inputs.work_dir / "_sources" / spec.name,
                                s3_client=options.s3_client)
    return replace(done, tokenizer=prepare_tokenizer(spec, folder))


def export_optimize_validate(inputs: BuildInputs, done: Artifacts) -> Artifacts:
    """Resolve the source, export, optimize and validate against PyTorch; write the reference."""
    from triton_mme_cdk.model_build.export.validate import export_and_validate

    exported, report, reference = export_and_validate(
        inputs.spec, base_dir=inputs.options.base_dir, work_dir=inputs.work_dir, s3_client=inputs.options.s3_client
    )
    return replace(done, exported=exported, report=report, reference=reference)


def fetch_plan_files(inputs: BuildInputs, done: Artifacts) -> Artifacts:
    """A prebuilt TensorRT plan: the declared files fetched and checked (never run: no GPU here), a
    reference of declared-shape zero inputs and no outputs, and a report that says it was not verified."""
    from triton_mme_cdk.model_build.export.engines import (
        NOT_VERIFIED,
        fetch_plans,
        plan_model,
        plan_sample_inputs,
    )
    from triton_mme_cdk.model_build.reference import write_reference
    from triton_mme_cdk.model_build.types import ValidationReport

    spec, options = inputs.spec, inputs.options
    folder = fetch_plans(spec, base_dir=options.base_dir, work_dir=inputs.work_dir / "_plans",
                         s3_client=options.s3_client)
    reference = inputs.work_dir / "plan.reference.npz"
    write_reference(reference, plan_sample_inputs(spec), {})
    report = ValidationReport(name=spec.name, samples=0, reference_check=NOT_VERIFIED, precision="unknown")
    return replace(done, exported=plan_model(spec, folder), report=report, reference=reference)


def render_model_config(inputs: BuildInputs, done: Artifacts) -> Artifacts:
    """The exported model's ``config.pbtxt`` (``render_config`` checks it as Triton would); a
    plan's from its declared signature (``render_plan_config``)."""
    from triton_mme_cdk.model_build.artifact.render import render_config, render_plan_config

    exported = done.need("exported", "config")
    text = render_plan_config(inputs.spec) if _is_plan(inputs.spec) else render_config(inputs.spec, exported)
    return replace(done, config_text=text, member_config_text=text)


TEXT_CHECK = "strings -> ensemble vs sentence-transformers"


def check_text_ensemble(inputs: BuildInputs, done: Artifacts) -> Artifacts:
    """Raw-text targets: strings through the ensemble's tokenizer and model against
    sentence-transformers; the reference becomes strings in, the ensemble's outputs out."""
    from triton_mme_cdk.model_build.reference import write_reference
    from triton_mme_cdk.model_build.text_ensemble.check import check_text_ensemble as check
    from triton_mme_cdk.model_build.text_ensemble.ensemble import render_ensemble_configs
    from triton_mme_cdk.model_build.text_ensemble.served_tokenizer import prepare_tokenizer, tokenizer_errors

    spec, exported = inputs.spec, done.need("exported", TEXT_CHECK)
    tokenizer = done.need("tokenizer", TEXT_CHECK)
    if isinstance(spec.source, S3Source):  # the export downloaded the whole folder: its files are the reference
        tokenizer = prepare_tokenizer(spec, inputs.work_dir / "_sources" / spec.name)
    with tokenizer_errors(spec, tokenizer):  # the served step's own errors, as one line naming the source
        text = check(spec, exported, tokenizer)
    report = done.need("report", TEXT_CHECK)
    report = replace(report, reference_check=(f"{report.reference_check}; " if report.reference_check else "") + (
        f"raw-text ensemble: {text.texts} texts, token ids identical"
        + ("" if text.max_abs_diff is None else f", max |diff| {text.max_abs_diff:.2e}")))
    reference = inputs.work_dir / "text.reference.npz"
    write_reference(reference, text.reference_inputs, text.reference_outputs)
    ensemble = render_ensemble_configs(spec, exported, tokenizer, truncation=spec.text_inputs.truncation).ensemble
    return replace(done, tokenizer=tokenizer, report=report, reference=reference, config_text=ensemble)


def package(inputs: BuildInputs, done: Artifacts) -> Artifacts:
    """``<out>/<name>.tar.gz``, written reproducibly: one model folder (a plan's: one file per
    compute capability), or the raw-text ensemble (tokenizer, ONNX member and ensemble folders)."""
    spec = inputs.spec
    tarball = inputs.out_dir / f"{spec.name}.tar.gz"
    exported = done.need("exported", "package")
    if _is_plan(spec):
        from triton_mme_cdk.model_build.artifact.pack import package_plans

        sha256, size = package_plans(model_name=spec.name, config_text=done.need("member_config_text", "package"),
                                     plan_dir=exported.path, out_path=tarball,
                                     compresslevel=inputs.options.compresslevel)
    elif _is_text(spec):
        from triton_mme_cdk.model_build.text_ensemble.ensemble import package_text_ensemble

        sha256, size = package_text_ensemble(
            spec=spec, exported=exported, tokenizer=done.need("tokenizer", "package"), out_path=tarball,
            truncation=spec.text_inputs.truncation, compresslevel=inputs.options.compresslevel,
        )
    else:
        from triton_mme_cdk.model_build.artifact.pack import package_model

        sha256, size = package_model(
            model_name=spec.name, config_text=done.need("member_config_text", "package"),
            model_file=exported.path, format=spec.format, out_path=tarball, compresslevel=inputs.options.compresslevel,
        )
    return replace(done, tarball=tarball, sha256=sha256, size=size)


def pre_publish_gate(inputs: BuildInputs, done: Artifacts) -> Artifacts:
    """Everything Triton checks when it loads the tarball (``model_build.artifact.gate.check_repository``);
    a tarball the gate refuses is removed."""
    from triton_mme_cdk.model_build.artifact.gate import gate_tarball

    gate_tarball(done.need("tarball", "pre-publish gate"), model=inputs.spec.name)
    return done


#: Every step, in order; ``applies`` picks those an entry runs.
PIPELINE: tuple[Step, ...] = (
    Step("tokenizer files", check_tokenizer, applies=_is_text),
    Step("fetch plans (not run: no GPU)", fetch_plan_files, applies=_is_plan),
    Step("export + optimize + validate", export_optimize_validate, applies=_is_exported),
    Step("config", render_model_config),
    Step(TEXT_CHECK, check_text_ensemble, applies=_is_text),
    Step("package", package),
    Step("pre-publish gate", pre_publish_gate),
)


def steps_for(spec: ModelSpec, pipeline: tuple[Step, ...] = PIPELINE) -> list[Step]:
    """The steps ``spec`` runs, in order (what a progress bar counts)."""
    return [step for step in pipeline if step.applies(spec)]


def run_pipeline(
    inputs: BuildInputs,
    *,
    pipeline: tuple[Step, ...] = PIPELINE,
    on_step: Callable[[str], None] | None = None,
) -> Artifacts:
    """Run the steps ``inputs.spec`` applies to, in order; ``on_step`` hears each name as it starts.

    A step's error propagates unchanged (each raises a ``ModelBuildError`` naming the model and
    what is wrong); the caller owns the folders and cleans up.
    """
    done = Artifacts()
    for step in steps_for(inputs.spec, pipeline):
        if on_step:
            on_step(step.name)
        started = time.perf_counter()
        done = step.run(inputs, done)
        done = replace(done, seconds={**done.seconds, step.name: round(time.perf_counter() - started, 3)})
    return done
