"""``plan`` and ``releases``: review a change before it deploys, and clean up old prefixes.

``plan`` answers the pull-request question "what does this change do to the live fleet?": it
compares the manifest with the live routes (models added, updated, removed, unchanged) and the
template the change deploys with what is deployed (the fleet created, unchanged, updated in place
or replaced, and any data at risk), with the CDK's own diff engine. The deployed state is the
deployed template (``--deployed-template FILE``, or ``--stack-name`` to read it from CloudFormation)
or, without one, the deployed record the last deploy wrote into the routes; live routes with
neither give "fleet unknown", never "unchanged". No AWS call is made with ``--routes-file``
and without ``--stack-name``. Output: ``--format text|json|markdown``; ``--json-file`` and
``--markdown-file`` write the others too.

The template the change deploys is ``--template FILE``, or the app's own: ``plan`` runs the
command of ``./cdk.json`` (the app's folder) as ``cdk synth`` does, with the ``-c`` settings, and
takes the endpoint stack from the cloud assembly (:mod:`~triton_mme_cdk.model_build.tools.app_context`);
it never imports the app. The stack's name, the model prefix and the manifest come from that
template and the app's context (``mme:stack_name``, ``mme:model_prefix``, ``mme:manifest_path``),
each overridden by its option.

Exit codes (``--detailed-exitcode``, for a pipeline to gate on): 0 nothing changes, 3 changes that
replace nothing and widen no access (models; the fleet created or updated in place; a security
change that only narrows), 4 the fleet is replaced or unknown, data is at risk, or access widens
(or changes in a way the plan cannot classify: ``plan_access``); 1 an error (a routes document that is truncated, malformed or another stack's,
a template that does not parse, missing credentials), 2 a usage error. Without the flag a plan
that ran exits 0.

``releases`` lists the per-release prefixes (``<prefix>/r-<16 hex>/``) that stacks of earlier
versions served, and deletes them when asked (``--delete r-... | --delete-all``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.tools.app_context import (
    DEFAULT_MANIFEST_PATH,
    DEFAULT_MODEL_PREFIX,
    DEFAULT_STACK_NAME,
    MANIFEST_PATH_KEY,
    MODEL_PREFIX_KEY,
    STACK_NAME_KEY,
    STACK_NAME_PATTERN,
    AppConfig,
    Synth,
    a_string,
    matching,
    parse_overrides,
    pick_stack,
    template_model_prefix,
)
from triton_mme_cdk.model_build.tools.review.pr_comment import add_pr_comment_parser
from triton_mme_cdk.model_build.tools.review.pr_fetch import add_pr_fetch_parser
from triton_mme_cdk.model_build.tools.review.pr_gate import add_pr_gate_parser

STACK_NAME_EXPECTED = "a CloudFormation stack name: a letter, then letters, digits and '-', at most 128 characters"
#: An S3 key prefix, as the stack's settings accept it.
PREFIX_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)*"
PREFIX_EXPECTED = ("an S3 key prefix such as 'models' or 'team/models': segments of letters, digits, '_', '.' and "
                   "'-' (each starting with a letter or digit) separated by '/'")


def synthesized_template(config: AppConfig, stack_name: str | None = None) -> tuple[str, dict[str, Any]]:
    """The name and template of the endpoint stack the app in ``config`` synthesizes (its
    ``cdk.json`` command, as ``cdk synth`` runs it; no AWS call): see :func:`app_context.pick_stack`."""
    return _pick(Synth(config), config, stack_name)


def _pick(synth: Synth, config: AppConfig, hint: str | None) -> tuple[str, dict[str, Any]]:
    wanted = config.setting(STACK_NAME_KEY, None, matching(STACK_NAME_PATTERN), STACK_NAME_EXPECTED)
    stack = pick_stack(synth.stacks(), wanted, hint)
    return stack.name, stack.template


def read_template(path_text: str, option: str) -> dict[str, Any]:
    """A CloudFormation template in JSON (as ``cdk synth`` writes it, or ``aws cloudformation
    get-template --query TemplateBody``); one error line naming the file otherwise."""
    path = Path(path_text)
    if not path.is_file():
        raise ModelBuildError(f"{option}: got {path_text!r}; no such file")
    try:
        template = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as error:
        raise ModelBuildError(f"{option} {path_text}: not a CloudFormation template in JSON ({error})") from None
    if not isinstance(template, dict) or not isinstance(template.get("Resources"), dict):
        raise ModelBuildError(f"{option} {path_text}: not a CloudFormation template (no 'Resources' object)")
    return template


def stack_template(stack_name: str, region: str | None) -> dict[str, Any] | None:
    """The stack's deployed template as CloudFormation holds it (``GetTemplate``, stage Original),
    or None when the stack does not exist."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        client = boto3.client("cloudformation", region_name=region)
        body = client.get_template(StackName=stack_name, TemplateStage="Original")["TemplateBody"]
    except NoCredentialsError:
        raise ModelBuildError(f"--stack-name {stack_name}: no AWS credentials found; give credentials that may call "
                              "cloudformation:GetTemplate, or --deployed-template FILE to plan offline") from None
    except ClientError as error:
        message = error.response.get("Error", {}).get("Message", "")
        if "does not exist" in message:
            return None
        code = error.response.get("Error", {}).get("Code", "?")
        raise ModelBuildError(f"--stack-name {stack_name}: the template cannot be read ({code}: {message})") from None
    except BotoCoreError as error:
        raise ModelBuildError(f"--stack-name {stack_name}: the template cannot be read ({error})") from None
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            raise ModelBuildError(f"--stack-name {stack_name}: the deployed template is not JSON (a YAML template?); "
                                  "give --deployed-template FILE in JSON") from None
    return dict(body)


def _check_stack(live: Any, stack_name: str, where: str) -> None:
    """Routes written by another stack are another stack's plan: one error, no verdict."""
    from triton_mme_cdk.model_build.release.routes import RoutesError

    writer = str(live.stack or "")
    name = writer.split(":stack/")[-1].split("/")[0] if ":stack/" in writer else writer
    if name and name != stack_name:
        raise RoutesError(f"routes {where}: written by stack {name!r}, not {stack_name!r} (mme:stack_name); "
                          "give that stack's settings, or this stack's bucket and prefix")


def plan_report(args: argparse.Namespace) -> Any:
    """The plan of ``args`` (:class:`~model_build.tools.review.plan_report.PlanReport`)."""
    from triton_mme_cdk.model_build.tools.review.plan_verdict import start_engine

    config = AppConfig.find(overrides=parse_overrides(args.context or []))
    # The slow parts start first, each in its own process: the app's synth (seconds, mostly jsii
    # starting Node.js) and the diff engine (Node.js loading its resource specification). This
    # process reads and checks every input meanwhile; a refused input stops both.
    synth = Synth(config) if args.template is None else None
    try:
        engine = start_engine(config.folder)
    except BaseException:
        if synth is not None:
            synth.close()
        raise
    try:
        return _plan_report(args, config, synth, engine)
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
        if synth is not None:
            synth.close()


def _manifest_path(config: AppConfig) -> Path | None:
    """The app's manifest (``mme:manifest_path``, relative to the app's folder); None for ``''``
    (the stack serves a release published out of band)."""
    text = config.setting(MANIFEST_PATH_KEY, DEFAULT_MANIFEST_PATH, a_string,
                          "a path to the models manifest, or '' for a release published out of band")
    if not text:
        return None
    path = config.relative(text)
    if path.is_file():
        return path
    if config.folder is None:
        raise ModelBuildError(f"plan: no cdk.json in {Path.cwd()} and no {text} there; run plan in the app's folder, "
                              "or give --manifest FILE")
    given = "" if MANIFEST_PATH_KEY in config.context else " (the default)"
    raise ModelBuildError(f"{config.where(MANIFEST_PATH_KEY)}: {MANIFEST_PATH_KEY}: got {text!r}{given}; no such file "
                          f"(relative paths start at {config.folder}); give --manifest FILE")


def _plan_report(args: argparse.Namespace, config: AppConfig, synth: Synth | None, engine: Any) -> Any:
    from triton_mme_cdk.model_build.manifest import load_manifest
    from triton_mme_cdk.model_build.release.deployed import endpoint_record
    from triton_mme_cdk.model_build.release.index import read_routes
    from triton_mme_cdk.model_build.release.routes import ModelPlan, Routes, parse_routes, plan_manifest
    from triton_mme_cdk.model_build.tools.review.plan_report import PlanReport
    from triton_mme_cdk.model_build.tools.review.plan_verdict import judge

    # Every input is read and checked before the slow parts are waited for.
    deployed = read_template(args.deployed_template, "--deployed-template") if args.deployed_template else None
    new_template = read_template(args.template, "--template") if args.template else None
    manifest_path = Path(args.manifest) if args.manifest is not None else _manifest_path(config)
    manifest = load_manifest(manifest_path) if manifest_path is not None else None
    traffic_path = Path(args.traffic) if args.traffic else None
    if traffic_path is not None:
        from triton_mme_cdk.model_build.capacity.traffic import read_profile

        if manifest is None:
            raise ModelBuildError("--traffic: given, but there is no manifest to plan the capacity of "
                                  "(mme:manifest_path is empty)")
        read_profile(traffic_path, {spec.name: spec.target_names() for spec in manifest.models})
    if not args.routes_file and not args.bucket:
        raise ModelBuildError("plan: give --routes-file FILE (a copy of the live routes) or --bucket BUCKET")
    live: Routes | None = None
    where = ""
    served_problems: list[str] = []
    served_note = ""
    if args.routes_file:
        path = Path(args.routes_file)
        if not path.is_file():
            raise ModelBuildError(f"--routes-file: got {str(path)!r}; no such file")
        live, where = parse_routes(path.read_bytes(), where=str(path)), str(path)
    deployed_where = f"the deployed template {args.deployed_template}" if deployed is not None else ""
    if deployed is None and args.stack_name:
        deployed = stack_template(args.stack_name, args.region)
        deployed_where = f"the template of stack {args.stack_name}" if deployed is not None else ""
    if new_template is None:
        assert synth is not None
        stack_name, new_template = _pick(synth, config, args.stack_name)
    else:
        stack_name = config.setting(STACK_NAME_KEY, args.stack_name or DEFAULT_STACK_NAME,
                                    matching(STACK_NAME_PATTERN), STACK_NAME_EXPECTED)
    if args.bucket and not args.routes_file:
        from triton_mme_cdk.model_build.aws_clients import make_s3_client
        from triton_mme_cdk.model_build.release import routes_key

        prefix = args.prefix or template_model_prefix(new_template) or config.setting(
            MODEL_PREFIX_KEY, DEFAULT_MODEL_PREFIX, matching(PREFIX_PATTERN), PREFIX_EXPECTED)
        where = f"s3://{args.bucket}/{routes_key(prefix)}"
        s3 = make_s3_client(endpoint_url=args.endpoint_url, region=args.region)
        live = read_routes(s3, args.bucket, prefix)
        served_problems, served_note = served_now(s3, args.bucket, prefix, live)
    elif live is not None:
        served_problems, served_note = [], "not checked: --routes-file makes no AWS call (triton-mme doctor checks it)"
    if live is not None:
        _check_stack(live, stack_name, where)
    if args.stack_name and deployed is None and live is not None:
        raise ModelBuildError(f"--stack-name {args.stack_name}: no such stack, yet routes exist at {where}; "
                              "check the stack name and region")
    if manifest is not None:
        models = plan_manifest(manifest, live, base_dir=manifest_path.parent if manifest_path else Path("."))
        note = ""
    else:
        models, note = ModelPlan(live_release=live.release_id if live else None), (
            "not compared: mme:manifest_path is empty, the stack serves a release published out of band")
    unknown = ""
    if live is not None and live.deployed is None:
        unknown = (f"the live routes ({where}, release {live.release_id}) carry "
                   + ("the settings an earlier version recorded, not the deployed template" if live.legacy_fleet
                      else "no record of the deployed fleet (routed by `python -m model_build publish`, or by an "
                           "earlier version of the stack)")
                   + "; give --deployed-template FILE or --stack-name NAME")
    # A stack of several endpoints: the plan is the planned endpoint's (its prefix), compared with its record.
    scope = endpoint_record(new_template, args.prefix or template_model_prefix(new_template))
    verdict = judge(new_template, deployed_template=deployed, deployed_where=deployed_where,
                    record=live.deployed if live is not None else None, live_routes=live is not None,
                    unknown_reason=unknown, engine=engine, scope=scope)
    builds_on = _builds_on(manifest, models, new_template, manifest_path.parent if manifest_path else Path("."))
    capacity = None
    if manifest is not None and manifest_path is not None:
        from triton_mme_cdk.model_build.tools.review.plan_capacity import capacity_line

        capacity = capacity_line(manifest, manifest_path.parent, models, new_template, scope=scope,
                                 traffic_path=traffic_path)
    return PlanReport(stack=stack_name, models=models, verdict=verdict, routes_where=where,
                      models_note=note, builds_on=builds_on, capacity=capacity,
                      served_problems=served_problems, served_note=served_note)


def served_now(s3: Any, bucket: str, prefix: str, live: Any) -> tuple[list[str], str]:
    """The routed objects of the live routes checked in ``served/`` as ``doctor`` checks them,
    without reading their bytes: one line per object missing or holding other bytes, and what was
    checked. The rest of ``doctor``'s invariants (the retained objects, whose window is the stack's,
    and the release indexes) are left to it. A read that S3 refuses is "not checked", never
    "holds": the pipeline's plan role may read the routes document only."""
    from botocore.exceptions import BotoCoreError, ClientError

    from triton_mme_cdk.model_build.release import served_prefix
    from triton_mme_cdk.model_build.release.invariants import check_bucket

    if live is None:
        return [], ""
    served = f"s3://{bucket}/{served_prefix(prefix)}/"
    try:
        check = check_bucket(s3, bucket, prefix, routes=live)
    except (ClientError, BotoCoreError) as error:
        code = getattr(error, "response", {}).get("Error", {}).get("Code", type(error).__name__)
        return [], f"not checked: S3 refused reading {served} ({code}); smoke and triton-mme doctor check it"
    problems = [violation.line(bucket) for violation in check.violations if violation.invariant == "routed-object"]
    note = f"{len(live.routes)} routed objects checked in {served}: " + (
        f"{len(problems)} broken; the next deploy's activation copies a routed object back from the store, or now: "
        f"triton-mme doctor --bucket {bucket} --prefix {prefix} --repair" if problems else "every one holds its route's bytes")
    return problems, note


def _builds_on(manifest: Any, models: Any, template: dict[str, Any], base_dir: Path) -> dict[str, str]:
    """Where each added or updated model builds, placed with the settings the synthesized
    template gives the build (its custom resource's ``BuildEngine``)."""
    from triton_mme_cdk.model_build.manifest.build_engine import (
        EngineSettings,
        estimate,
        place,
        source_weight_bytes,
    )

    engine = next((resource.get("Properties", {}).get("BuildEngine") for resource in
                   template.get("Resources", {}).values() if resource.get("Type") == "Custom::TritonModelRelease"), None)
    if manifest is None or engine is None:
        return {}
    settings = EngineSettings.from_properties(engine)
    wanted = {item.logical_name for item in models.added} | {item.route.logical_name for item in models.updated}
    labels = {}
    for target, spec in manifest.targets():
        if target in wanted:
            weights, why = source_weight_bytes(spec, base_dir)
            labels[target] = place(spec, estimate(spec, weights, why), settings).describe(settings)
            if getattr(spec.source, "weights", None) == "pytorch_bin":  # a hub source's opt-out of safetensors
                labels[target] += "; loads pytorch_model.bin, a pickle (source.weights: pytorch_bin)"
    return labels


def cmd_plan(args: argparse.Namespace) -> int:
    report = plan_report(args)
    rendered = {"text": lambda: report.text(verbose=args.verbose),
                "json": lambda: json.dumps(report.as_json(), indent=1, sort_keys=True),
                "markdown": report.markdown}
    if args.json_file:
        Path(args.json_file).write_text(rendered["json"]() + "\n", encoding="utf-8")
    if args.markdown_file:
        Path(args.markdown_file).write_text(rendered["markdown"](), encoding="utf-8")
    sys.stdout.write(rendered[args.format]().rstrip("\n") + "\n")
    return report.exit_code if args.detailed_exitcode else 0


def cmd_releases(args: argparse.Namespace) -> int:
    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.release.serving import delete_legacy_release, legacy_releases

    s3 = make_s3_client(endpoint_url=args.endpoint_url, region=args.region)
    found = legacy_releases(s3, args.bucket, args.prefix)
    doomed = sorted(found) if args.delete_all else list(args.delete or [])
    for release_id in doomed:
        if release_id not in found:
            raise ModelBuildError(f"--delete: got {release_id!r}; no such release prefix under "
                                  f"s3://{args.bucket}/{args.prefix}/ (found: {', '.join(found) or 'none'})")
    for release_id, (count, size) in found.items():
        print(f"{release_id}  {count} objects  {size} bytes  s3://{args.bucket}/{args.prefix}/{release_id}/")
    for release_id in doomed:
        deleted = delete_legacy_release(s3, args.bucket, args.prefix, release_id)
        print(f"deleted {release_id}: {deleted} objects and versions")
    if not found:
        print(f"no per-release prefixes under s3://{args.bucket}/{args.prefix}/")
    return 0


def add_plan_parsers(sub: Any, default_prefix: str) -> None:
    plan = sub.add_parser(
        "plan", help="what a deploy would do: models added, updated, removed; the fleet and the data's verdict",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    plan.add_argument("--manifest", default=None,
                      help="models manifest (default: the mme:manifest_path setting, relative to cdk.json's folder)")
    live = plan.add_argument_group("the live routes (one of)")
    live.add_argument("--routes-file", default=None, help="a copy of the live routes document (no AWS call)")
    live.add_argument("--bucket", default=None, help="read the live routes from this bucket")
    plan.add_argument("--prefix", default=None,
                      help="model prefix (default: the ModelPrefix of the template's model build, else the "
                           "mme:model_prefix setting)")
    plan.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS)")
    plan.add_argument("--region", default=None, help="AWS region (default: from the environment)")
    state = plan.add_argument_group("the deployed state (default: the record in the live routes)")
    state.add_argument("--deployed-template", default=None, metavar="FILE",
                       help="the deployed template in JSON (aws cloudformation get-template, or the base branch's "
                            "cdk synth)")
    state.add_argument("--stack-name", default=None,
                       help="read the deployed template from CloudFormation (cloudformation:GetTemplate); without "
                            "mme:stack_name it also names the stack planned")
    plan.add_argument("--template", default=None, metavar="FILE",
                      help="the template the change deploys (cdk.out/<stack>.template.json); default: run the "
                           "app of ./cdk.json as cdk synth does, with the -c settings")
    plan.add_argument("-c", "--context", action="append", metavar="mme:KEY=VALUE",
                      help="a setting as given to cdk synth (repeatable); ./cdk.json gives the rest")
    plan.add_argument("--traffic", default=None, metavar="FILE",
                      help="traffic profile for the capacity line, as `capacity` reads it (default: 10 req/s, "
                           "Zipf 1.0, in manifest order)")
    plan.add_argument("--format", choices=("text", "json", "markdown"), default="text",
                      help="what to print (default: text)")
    plan.add_argument("--json-file", default=None, metavar="FILE", help="also write the JSON plan here")
    plan.add_argument("--markdown-file", default=None, metavar="FILE", help="also write the markdown comment here")
    plan.add_argument("--detailed-exitcode", action="store_true",
                      help="exit 0 no change, 3 changes that replace nothing and widen no access, 4 fleet "
                           "replaced or unknown, data at risk, or access widened (or unclassifiable)")
    plan.add_argument("-v", "--verbose", action="store_true",
                      help="list the unchanged models and the other resources that change")
    plan.set_defaults(func=cmd_plan)

    releases = sub.add_parser("releases", help="list (and delete) the per-release prefixes of the earlier layout")
    releases.add_argument("--bucket", required=True, help="the model bucket")
    releases.add_argument("--prefix", default=default_prefix, help=f"model prefix (default: {default_prefix})")
    releases.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS)")
    releases.add_argument("--region", default=None, help="AWS region (default: from the environment)")
    group = releases.add_mutually_exclusive_group()
    group.add_argument("--delete", action="append", metavar="RELEASE", help="delete this release prefix (repeatable)")
    group.add_argument("--delete-all", action="store_true", help="delete every listed release prefix")
    releases.set_defaults(func=cmd_releases)
    add_pr_comment_parser(sub)
    add_pr_fetch_parser(sub)
    add_pr_gate_parser(sub)
