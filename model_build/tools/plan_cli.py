"""``plan`` and ``releases``: review a model-set change before it deploys, and clean up old prefixes.

``plan`` answers the pull-request question "what does this change do to the live fleet?": it
compares the manifest (and the deployment settings) with the live routes document, or with a
routes file given, and lists models added, updated (old -> new target), removed and unchanged,
with the fleet verdict: "fleet unchanged" (only the routes change; nothing is replaced), or
"fleet replaced because <setting>: old -> new" (a setting that reaches the SageMaker Model or
EndpointConfig changed: a blue/green rollout of every instance). No model is loaded and no AWS
call is made with ``--routes-file``.

Exit codes (``--detailed-exitcode``, for a pipeline to gate on): 0 nothing changes, 3 models
change and the fleet stays, 4 the fleet is replaced; 1 an error (a routes document that is
truncated, malformed or another stack's), 2 a usage error. Without the flag a plan that ran
exits 0.

``releases`` lists the per-release prefixes (``<prefix>/r-<16 hex>/``) that stacks of earlier
versions served, and deletes them when asked (``--delete r-... | --delete-all``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from model_build.errors import ModelBuildError

#: ``--detailed-exitcode`` values.
EXIT_NO_CHANGE, EXIT_MODELS_CHANGE, EXIT_FLEET_REPLACED = 0, 3, 4


def _settings(overrides: list[str]) -> Any:
    """The app's settings: ``cdk.json``'s context with ``-c mme:key=value`` overrides (the one
    definition of each setting, its default and its checks)."""
    from model_build.tools.triton_server import app_settings

    context = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ModelBuildError(f"-c: got {item!r}; expected mme:<setting>=<value>")
        context[key] = value
    return app_settings(context)


def plan_report(args: argparse.Namespace) -> tuple[Any, Any]:
    """The plan of ``args`` and the settings it used."""
    from model_build.manifest import load_manifest
    from model_build.release.index import read_routes
    from model_build.release.routes import Routes, parse_routes, plan_manifest

    manifest_path = Path(args.manifest)
    manifest = load_manifest(manifest_path)
    settings = _settings(args.context or [])
    live: Routes | None
    prefix = args.prefix or settings.model_prefix
    if args.routes_file:
        path = Path(args.routes_file)
        if not path.is_file():
            raise ModelBuildError(f"--routes-file: got {str(path)!r}; no such file")
        live = parse_routes(path.read_bytes(), where=str(path))
    elif args.bucket:
        from model_build.aws_clients import make_s3_client

        live = read_routes(make_s3_client(endpoint_url=args.endpoint_url, region=args.region), args.bucket, prefix)
    else:
        raise ModelBuildError("plan: give --routes-file FILE (a copy of the live routes) or --bucket BUCKET")
    return plan_manifest(manifest, live, base_dir=manifest_path.parent, fleet=settings.fleet()), settings


def cmd_plan(args: argparse.Namespace) -> int:
    result, _ = plan_report(args)
    where = f"release {result.live_release}" if result.live_release else "no live routes (first deploy)"
    lines = [f"plan against {where}:"]
    lines += [f"  + {name}  (added)" for name in result.added]
    lines += [f"  ~ {name}  {old} -> new build ({why})" for name, old, why in result.updated]
    lines += [f"  - {name}  {old}  (unrouted; kept for the retention window)" for name, old in result.removed]
    if args.verbose:
        lines += [f"    {name}  {target}" for name, target in result.unchanged]
    lines.append(result.summary())
    print("\n".join(lines))
    if not args.detailed_exitcode:
        return 0
    if result.fleet_changes:
        return EXIT_FLEET_REPLACED
    return EXIT_MODELS_CHANGE if result.models_change else EXIT_NO_CHANGE


def cmd_releases(args: argparse.Namespace) -> int:
    from model_build.aws_clients import make_s3_client
    from model_build.release.serving import delete_legacy_release, legacy_releases

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
        "plan", help="list models added, updated, removed and unchanged against the live routes, and the fleet verdict",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    plan.add_argument("--manifest", default="models.yaml", help="models manifest (default: models.yaml)")
    plan.add_argument("--routes-file", default=None, help="a routes document to compare with (no AWS call)")
    plan.add_argument("--bucket", default=None, help="read the live routes from this bucket")
    plan.add_argument("--prefix", default=None, help="model prefix (default: the mme:model_prefix setting)")
    plan.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS)")
    plan.add_argument("--region", default=None, help="AWS region (default: from the environment)")
    plan.add_argument("-c", "--context", action="append", metavar="mme:KEY=VALUE",
                      help="a setting as given to cdk synth (repeatable); cdk.json gives the rest")
    plan.add_argument("--detailed-exitcode", action="store_true",
                      help="exit 0 no change, 3 models change (fleet unchanged), 4 fleet replaced")
    plan.add_argument("-v", "--verbose", action="store_true", help="list the unchanged models too")
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
