#!/usr/bin/env python3
"""The CDK app: the one place that reads the CDK context (``cdk.json`` and ``-c mme:<field>=...``).

It builds the typed settings, reads the models manifest, composes the stack and synthesizes it
with the cdk-nag ``AwsSolutionsChecks`` as a validation plugin. No AWS call is made: the stack is
environment-agnostic unless ``mme:account``/``mme:region`` are given.

A wrong setting or manifest is an expected error: it is printed as one message on stderr, without
a traceback, and the app exits with status 1.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from triton_mme_cdk.constructs.sagemaker_limits import PropsError
from triton_mme_cdk.model_build.errors import ManifestError, ModelBuildError
from triton_mme_cdk.model_build.manifest import Manifest, load_manifest
from triton_mme_cdk.model_build.release.deployed import check_embedded
from triton_mme_cdk.model_build.release.routes import RoutesError
from triton_mme_cdk.stacks.pipeline_settings import SETTING_KEY as PIPELINE_KEY
from triton_mme_cdk.stacks.pipeline_settings import PipelineSettings, pipeline_settings
from triton_mme_cdk.stacks.pipeline_stack import TritonMmePipelineStack
from triton_mme_cdk.stacks.settings import MmeSettings, SettingsError
from triton_mme_cdk.stacks.triton_mme_stack import TritonMmeStack

ROOT = Path(__file__).resolve().parent
#: Errors a user causes with a setting or the manifest; anything else is a bug (traceback).
EXPECTED_ERRORS = (ManifestError, SettingsError, PropsError, RoutesError, ModelBuildError)
#: The CDK bootstrap qualifier of ``make bootstrap``, which bootstraps an account with this
#: project's policies (``bootstrap/``): its execution role may create a role only with the
#: boundary ``BOUNDARY_NAME`` on it (docs/pipelines.md, "Bootstrapping the accounts").
PROJECT_QUALIFIER = "tritonmme"
BOUNDARY_NAME = "triton-mme-boundary"
QUALIFIER_KEY = "@aws-cdk/core:bootstrapQualifier"
BOUNDARY_KEY = "@aws-cdk/core:permissionsBoundary"


def apply_bootstrap_boundary(app: cdk.App) -> bool:
    """Put the project's boundary on every role of every stack (the CDK's own setting) when the app
    deploys through the project's bootstrap (``QUALIFIER_KEY`` is ``PROJECT_QUALIFIER``); an explicit
    ``BOUNDARY_KEY`` is kept. Whether the account was bootstrapped so is checked at deploy time:
    the template's ``BootstrapVersion`` parameter reads ``/cdk-bootstrap/<qualifier>/version``,
    which only that bootstrap writes. True when the boundary is on."""
    if app.node.try_get_context(BOUNDARY_KEY) is not None:
        return True
    if app.node.try_get_context(QUALIFIER_KEY) != PROJECT_QUALIFIER:
        return False
    app.node.set_context(BOUNDARY_KEY, {"name": BOUNDARY_NAME})
    return True


def load_settings(context: Mapping[str, Any]) -> MmeSettings:
    return MmeSettings.from_context(context)


def load_models(settings: MmeSettings, root: Path = ROOT) -> tuple[Manifest | None, Path | None]:
    """The manifest named by ``mme:manifest_path`` (relative to ``root``), or none."""
    if not settings.manifest_path:
        return None, None
    path = Path(settings.manifest_path)
    path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise SettingsError(
            f"mme:manifest_path: got {settings.manifest_path!r}; no such file (relative paths "
            f"start at {root}); give a models manifest, or '' with mme:release_id to serve a "
            "release published out of band"
        )
    return load_manifest(path), path


def build_app(app: cdk.App) -> TritonMmeStack:
    """Compose the app from its context; raises one of ``EXPECTED_ERRORS`` on bad input.

    With ``mme:pipeline`` (docs/pipelines.md) the app also holds the delivery pipeline's stack,
    which deploys the endpoint stack to each of its stages; the endpoint stack is the same."""
    apply_bootstrap_boundary(app)
    context = dict(app.node.get_all_context())
    pipeline = context.pop(PIPELINE_KEY, None)
    settings = load_settings(context)
    manifest, manifest_path = load_models(settings)
    if pipeline is not None:
        build_pipeline(app, context, pipeline_settings(pipeline), settings, manifest, manifest_path)
    env = None
    if settings.account or settings.region:
        env = cdk.Environment(account=settings.account, region=settings.region)
    stack = TritonMmeStack(
        app,
        settings.stack_name,
        settings=settings,
        manifest=manifest,
        manifest_path=manifest_path,
        env=env,
        description="NVIDIA Triton models on an Amazon SageMaker multi-model GPU endpoint",
    )
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return stack


def build_pipeline(app: cdk.App, context: Mapping[str, Any], pipeline: PipelineSettings, settings: MmeSettings,
                   manifest: Manifest | None, manifest_path: Path | None) -> TritonMmePipelineStack:
    """The pipeline's stack: each stage's endpoint stack gets the app's settings with the stage's
    overrides (checked as ``mme:pipeline.stages[i].settings``) and the stage's account and region."""
    stage_settings: dict[str, MmeSettings] = {}
    for index, stage in enumerate(pipeline.stages):
        overrides = {f"mme:{key}": value for key, value in stage.settings.items()}
        overrides.update({"mme:account": stage.account, "mme:region": stage.region})
        try:
            stage_settings[stage.name] = load_settings({**context, **overrides})
        except SettingsError as error:
            raise SettingsError(f"mme:pipeline.stages[{index}].settings: {error}") from None
    places: dict[tuple[str, str, str], str] = {}
    for stage in pipeline.stages:
        place = (stage.account, stage.region, stage_settings[stage.name].endpoint_name)
        if place in places:
            raise SettingsError(
                f"mme:pipeline.stages: {places[place]!r} and {stage.name!r} deploy endpoint {place[2]!r} to the same "
                f"account {place[0]} and region {place[1]}; give one stage its own endpoint_name in its settings")
        places[place] = stage.name

    def endpoint(scope: Any, stage_settings: MmeSettings, stack_name: str) -> TritonMmeStack:
        return TritonMmeStack(scope, "Endpoint", stack_name=stack_name, settings=stage_settings, manifest=manifest,
                              manifest_path=manifest_path,
                              description="NVIDIA Triton models on an Amazon SageMaker multi-model GPU endpoint")

    return TritonMmePipelineStack(app, f"{settings.stack_name}Pipeline", pipeline=pipeline, settings=settings,
                                  stage_settings=stage_settings, build_endpoint=endpoint,
                                  description="Delivery pipeline of the Triton multi-model endpoint (docs/pipelines.md)")


def plan_line(stack: TritonMmeStack, template: Mapping[str, Any], root: Path = ROOT) -> str:
    """One line for the synth output: what this change does to the live fleet.

    With ``mme:plan_routes_file`` (a copy of the live routes), the plan of the synthesized
    ``template`` against it (the models and the verdict against the deployed record the routes
    carry); otherwise the model count and the command that compares with the live routes. No AWS
    call either way."""
    settings, manifest, manifest_path = stack.settings, stack.manifest, stack.manifest_path
    if manifest is None or manifest_path is None:
        return "models: served from routes published out of band (python -m model_build plan --stack-name ...)"
    if not settings.plan_routes_file:
        return (f"models: {len(manifest.models)} entries, {manifest.target_count} targets; a model change never "
                "replaces the fleet; review the change: python -m model_build plan --bucket <ModelBucketName> "
                f"--stack-name {settings.stack_name}")
    from triton_mme_cdk.model_build.release.routes import parse_routes, plan_manifest
    from triton_mme_cdk.model_build.tools.review.plan_report import PlanReport
    from triton_mme_cdk.model_build.tools.review.plan_verdict import judge

    path = Path(settings.plan_routes_file)
    path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise SettingsError(f"mme:plan_routes_file: got {settings.plan_routes_file!r}; no such file")
    live = parse_routes(path.read_bytes(), where=str(path))
    models = plan_manifest(manifest, live, base_dir=manifest_path.parent)
    verdict = judge(template, record=live.deployed, live_routes=True,
                    unknown_reason=f"the routes file {path} carries no record of the deployed fleet")
    report = PlanReport(stack=settings.stack_name, models=models, verdict=verdict, routes_where=str(path))
    return f"plan against release {live.release_id}: {report.summary()} (verdict: {report.overall})"


def cdk_json_context(root: Path = ROOT) -> dict[str, Any]:
    """The ``context`` of ``cdk.json`` (feature flags and settings).

    The CDK CLI passes it to the app already; reading it here too makes ``python app.py`` give the
    same template as ``cdk synth``. Context from the CLI (``-c``) takes precedence.
    """
    path = root / "cdk.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SettingsError(f"{path}: not valid JSON in UTF-8: {error}") from None
    context = data.get("context", {}) if isinstance(data, dict) else None
    if not isinstance(context, dict):
        raise SettingsError(f"{path}: 'context' must be a JSON object of settings")
    return dict(context)


def main(context: Mapping[str, Any] | None = None, outdir: str | None = None) -> int:
    """Synthesize; 1 with one error line for a refused input.

    ``context`` and ``outdir`` stand for what the CDK CLI passes in ``CDK_CONTEXT_JSON`` and
    ``CDK_OUTDIR``, which the app's Node.js process reads when it starts: the tests give them here to
    run several apps in one process (``tests/hostile_helpers.run_app_refusals``)."""
    try:
        app = cdk.App(context={**cdk_json_context(), **(context or {})}, outdir=outdir)
        stack = build_app(app)
        # Once the stack is composed: a refused input prints its one error line only.
        template = app.synth().get_stack_by_name(stack.stack_name).template
        check_embedded(template)  # what the deploy records for plan is this template
        print(plan_line(stack, template), file=sys.stderr)
    except EXPECTED_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
