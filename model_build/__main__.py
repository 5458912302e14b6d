"""``python -m model_build {commands}``: build, publish and serve the models of a manifest.

The list of commands, here and in ``--help``, is filled from the parser's subcommands (``_parser``).

Expected errors (a bad manifest, a model whose export does not match PyTorch, an S3 failure)
print one message and exit 1 with no stack trace; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from triton_mme_cdk.model_build.capacity.fit import release_check
from triton_mme_cdk.model_build.errors import ModelBuildError, PublishError
from triton_mme_cdk.model_build.manifest import Manifest, load_manifest
from triton_mme_cdk.model_build.release import DEFAULT_COMPRESSLEVEL, Release, compute_release, served_prefix
from triton_mme_cdk.model_build.release.routes import DEFAULT_RETENTION_DAYS
from triton_mme_cdk.model_build.tools.app_context import DEFAULT_MODEL_PREFIX
from triton_mme_cdk.model_build.tools.build_report import build_table, human_size
from triton_mme_cdk.model_build.tools.capacity import fit_check
from triton_mme_cdk.model_build.tools.capacity.cli import add_capacity_parser
from triton_mme_cdk.model_build.tools.doctor_cli import add_doctor_parser
from triton_mme_cdk.model_build.tools.local_endpoint.server import add_endpoint_parser
from triton_mme_cdk.model_build.tools.review.plan_cli import add_plan_parsers
from triton_mme_cdk.model_build.tools.smoke.cli import add_smoke_parser

# Wide when not a terminal, so logs and CI output keep each table row and message on one line.
# Progress bars of our own only: the libraries' weight-loading bars and notices are noise here.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
out = Console(width=None if sys.stdout.isatty() else 200)

def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal and os.environ.get("MODEL_BUILD_PROGRESS") != "1",
    )


def _load(args: argparse.Namespace) -> tuple[Manifest, Release, Path]:
    manifest_path = Path(args.manifest)
    manifest = load_manifest(manifest_path)
    base_dir = manifest_path.resolve().parent
    level = getattr(args, "compresslevel", None) or DEFAULT_COMPRESSLEVEL
    return manifest, compute_release(manifest, base_dir=base_dir, compresslevel=level), base_dir


# ----------------------------------------------------------------------------------------------
# validate
# ----------------------------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    from triton_mme_cdk.model_build.manifest.build_engine import EngineSettings, place_all

    fit_check.fleet_of(args)  # a bad --instance-type is refused before the manifest is read
    manifest, release, base_dir = _load(args)
    table = Table(title=f"{args.manifest}: valid, release {release.release_id}")
    for column in ("model", "source", "task", "format", "max batch", "copies", "targets", "builds on (default settings)"):
        table.add_column(column)
    settings = EngineSettings()
    where = {p.model: p.describe(settings).removeprefix("builds on: ") for p in place_all(manifest.models, base_dir, settings)}
    for spec in manifest.models:
        targets = spec.target_names()
        shown = targets[0] if len(targets) == 1 else f"{targets[0]} .. {targets[-1]}"
        table.add_row(
            spec.name,
            spec.source.kind,
            spec.task,
            spec.format,
            str(spec.max_batch_size),
            str(spec.copies),
            shown,
            where[spec.name],
        )
    out.print(table)
    out.print(f"{manifest.target_count} target models in {len(manifest.models)} entries")
    fit_check.validate_fit(args, manifest, base_dir, out, console)
    return 0


# ----------------------------------------------------------------------------------------------
# build
# ----------------------------------------------------------------------------------------------


def _build_options(args: argparse.Namespace, base_dir: Path, s3_client: Any) -> Any:
    """The ``BuildOptions`` of a command's flags (``--jobs``, ``--compresslevel``, the S3 endpoint)."""
    from functools import partial

    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.pipeline import BuildOptions

    return BuildOptions(
        base_dir=base_dir,
        s3_client=s3_client,
        # Each build process makes its own client (a client does not cross processes).
        s3_factory=partial(make_s3_client, endpoint_url=getattr(args, "endpoint_url", None),
                           region=getattr(args, "region", None)),
        compresslevel=args.compresslevel,
        jobs=getattr(args, "jobs", 1),
    )


def _build(args: argparse.Namespace, s3_client: Any = None) -> tuple[Any, Path, Release]:
    from triton_mme_cdk.model_build.pipeline import build_release

    manifest, release, base_dir = _load(args)
    with _progress() as progress:
        on_plan, on_model = _build_task(progress)
        record, release_dir = build_release(manifest, release, _build_options(args, base_dir, s3_client),
                                            out_dir=Path(args.out), on_model=on_model, on_plan=on_plan)
    return record, release_dir, release


def _build_task(progress: Any) -> tuple[Callable[[int], None], Callable[[Any, str], None]]:
    """A progress task for a build and its two callbacks: ``on_plan`` sets its total (the runner
    knows what is missing and how it will report), ``on_model`` advances it."""
    task = progress.add_task("build", total=None)

    def on_plan(ticks: int) -> None:
        progress.update(task, total=ticks)

    def on_model(spec: Any, step: str) -> None:
        progress.update(task, description=f"{spec.name}: {step}")
        progress.advance(task)

    return on_plan, on_model


def cmd_build(args: argparse.Namespace) -> int:
    fleet = fit_check.fleet_of(args)
    record, release_dir, _ = _build(args)
    out.print(build_table(record))
    if fleet is not None:  # the footprints each build measured
        fit_check.report_fit(fit_check.built_footprints(record.artifacts(release_dir)), fleet, out, console)
    reused = len(record.models) - len(record.built)
    out.print(f"built {len(record.built)} of {len(record.models)} models"
              + (f"; {reused} unchanged, reused from {Path(args.out) / '_builds'}" if reused else ""))
    out.print(f"artifacts in {release_dir}")
    return 0


# ----------------------------------------------------------------------------------------------
# publish
# ----------------------------------------------------------------------------------------------


def _s3(args: argparse.Namespace) -> Any:
    from triton_mme_cdk.model_build.aws_clients import make_s3_client

    return make_s3_client(endpoint_url=args.endpoint_url, region=args.region)


def _local_record(args: argparse.Namespace, release: Release) -> tuple[Any, Path] | None:
    """The complete local build of this release, if ``build`` or ``publish`` left one."""
    from triton_mme_cdk.model_build.pipeline import BuildRecord

    release_dir = Path(args.out) / release.release_id
    record = BuildRecord.read(release_dir)
    if record is not None and all((release_dir / m.tarball).is_file() for m in record.models):
        return record, release_dir
    return None


def _build_missing_and_publish(args: argparse.Namespace, s3_client: Any, manifest: Manifest,
                               release: Release, base_dir: Path) -> tuple[Any, list[str], int]:
    """Incremental against the bucket: list ``<prefix>/_builds/`` once, build only the keys that
    neither the bucket nor the local store (``<out>/_builds/``) holds, store those, and assemble
    the release by server-side copies. Returns the report, the models built here and how many
    models' keys the bucket already held."""

    from triton_mme_cdk.model_build.pipeline import build_missing, read_unit
    from triton_mme_cdk.model_build.release import BUILDS_DIR
    from triton_mme_cdk.model_build.release.store import (
        ReleaseTarget,
        publish_from_store,
        stored_keys,
        stored_models,
    )

    keys = dict(release.model_keys)
    store_dir = Path(args.out) / BUILDS_DIR
    present = stored_keys(s3_client, args.bucket, args.prefix)
    missing = [spec for spec in manifest.models if keys[spec.name] not in present]
    with _progress() as progress:
        on_plan, on_model = _build_task(progress)
        built = build_missing(
            [(spec, keys[spec.name]) for spec in missing], _build_options(args, base_dir, s3_client),
            store_dir=store_dir, on_model=on_model, on_plan=on_plan,
        )
    artifacts: dict[str, Any] = {}
    for spec in missing:
        result = read_unit(store_dir, keys[spec.name])
        assert result is not None, f"{spec.name}: built but not stored"
        artifacts[keys[spec.name]] = result.artifact(store_dir / keys[spec.name])
    targets = manifest.target_count
    with _progress() as progress:
        task = progress.add_task(f"publish {release.release_id}", total=targets + 1)

        def on_progress(_key: str, _bytes: int) -> None:
            progress.advance(task)

        report = publish_from_store(
            stored_models(manifest, keys),
            artifacts,
            ReleaseTarget.of(release, s3_client, args.bucket, args.prefix, concurrency=args.concurrency,
                             progress=on_progress, check=getattr(args, "fit_check", None)),
            present=present,
        )
    return report, built, len(manifest.models) - len(missing)


def _publish(args: argparse.Namespace, s3_client: Any, record: Any, release_dir: Path,
             release: Release) -> Any:
    from triton_mme_cdk.model_build.release.store import ReleaseTarget, publish_incremental

    targets = sum(len(m.targets) for m in record.models)
    with _progress() as progress:
        task = progress.add_task(f"publish {release.release_id}", total=targets + 1)

        def on_progress(_key: str, _bytes: int) -> None:
            progress.advance(task)

        # The same store + assembly as the Lambda's: models whose key is stored are copied.
        report = publish_incremental(
            [(model.artifact(release_dir), model.key) for model in record.models],
            ReleaseTarget.of(release, s3_client, args.bucket, args.prefix, concurrency=args.concurrency,
                             progress=on_progress, check=getattr(args, "fit_check", None)),
        )
    return report


def _publish_line(report: Any, bucket: str, prefix: str) -> str:
    return (
        f"published s3://{bucket}/{prefix}/: {report.targets} target models; objects (tarballs, "
        f"references, index): {report.uploaded} uploaded, {report.copied} copied server-side, "
        f"{report.skipped} already present; {human_size(report.bytes_sent)} sent in {report.seconds:.1f} s"
    )


def _route(args: argparse.Namespace, s3_client: Any, release: Release) -> Any:
    """Route the published release (the routes document, written last) and say what changed."""
    from triton_mme_cdk.model_build.release.serving import activate_release

    report = activate_release(s3_client, args.bucket, args.prefix, release.release_id,
                              retention_days=getattr(args, "retention_days", DEFAULT_RETENTION_DAYS),
                              concurrency=args.concurrency)
    was = f" (was {report.previous_release})" if report.previous_release else ""
    out.print(
        f"routed {report.release_id}{was}: {report.routed} routes in s3://{args.bucket}/{report.routes_key}; "
        f"{len(report.unrouted_now)} unrouted now, {len(report.deleted)} deleted after the retention window"
        + ("" if report.wrote else "; routes unchanged")
    )
    out.print(f"ModelDataUrl: s3://{args.bucket}/{served_prefix(args.prefix)}/")
    return report


def cmd_publish(args: argparse.Namespace) -> int:
    args.fit_check = release_check(fit_check.fleet_of(args))  # checked before any copy or index is written
    s3_client = _s3(args)
    manifest, release, base_dir = _load(args)
    local = _local_record(args, release)
    if local is not None:
        record, release_dir = local
        report = _publish(args, s3_client, record, release_dir, release)
        out.print(f"built 0 of {len(manifest.models)} models; the local build {release_dir} is complete")
    else:
        report, built, in_bucket = _build_missing_and_publish(args, s3_client, manifest, release, base_dir)
        out.print(f"built {len(built)} of {len(manifest.models)} models"
                  + (f" ({', '.join(built)})" if built else "")
                  + f"; {in_bucket} already stored in s3://{args.bucket}/{args.prefix}/_builds/")
    out.print(_publish_line(report, args.bucket, release.prefix(args.prefix)))
    _route(args, s3_client, release)
    return 0


# ----------------------------------------------------------------------------------------------
# verify
# ----------------------------------------------------------------------------------------------


#: Seconds one invocation of the local endpoint may take (a cold call downloads, unpacks and loads).
CHECK_TIMEOUT_SECONDS = 300.0


def _serve_and_check(args: argparse.Namespace, s3_client: Any, release: Release) -> int:
    """Serve the published release on the real tritonserver and invoke every target through boto3.

    The answers are compared with the references recorded at build time, by the same code the
    smoke test runs against a deployed endpoint; the table shows the cold and the warm call.
    """
    from triton_mme_cdk.model_build.tools.local_endpoint.server import ENDPOINT_NAME, local_endpoint
    from triton_mme_cdk.model_build.tools.smoke.cli import smoke_table
    from triton_mme_cdk.model_build.tools.smoke.prepare import make_client, make_runtime_client
    from triton_mme_cdk.model_build.tools.smoke.runner import run_smoke

    with local_endpoint(s3_client=s3_client, bucket=args.bucket, release_id=release.release_id,
                        model_prefix=args.prefix) as endpoint:
        out.print(endpoint.ready_line())
        with _progress() as progress:
            task = progress.add_task("invoke", total=len(endpoint.release.entries))
            report = run_smoke(
                endpoint_name=ENDPOINT_NAME,
                sagemaker_client=make_client("sagemaker", endpoint_url=endpoint.url),
                runtime_client=make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=CHECK_TIMEOUT_SECONDS),
                s3_client=s3_client,
                timeout_seconds=CHECK_TIMEOUT_SECONDS,
                release=release.release_id,
                progress=lambda row: progress.advance(task),
            )
    out.print(smoke_table(report))
    return 0 if report.ok else 1


def cmd_verify(args: argparse.Namespace) -> int:
    """Serve a release on the real tritonserver and check every target's answers.

    With ``--bucket`` the published release is served from there; without, the local build is
    published to a local S3 endpoint first (moto's server, for the run).
    """
    from triton_mme_cdk.model_build.pipeline import BuildRecord
    from triton_mme_cdk.model_build.tools.local_s3 import local_s3

    _, release, _ = _load(args)
    if args.bucket:
        return _serve_and_check(args, _s3(args), release)
    local_dir = Path(args.out) / release.release_id
    record = BuildRecord.read(local_dir)
    if record is None:
        raise ModelBuildError(
            f"verify: no build of release {release.release_id} in {local_dir}; run "
            "`python -m model_build build` first",
            step="verify",
        )
    with local_s3() as endpoint_url:
        args.endpoint_url, args.bucket = endpoint_url, "triton-mme-verify"
        s3_client = _s3(args)
        s3_client.create_bucket(Bucket=args.bucket)
        _publish(args, s3_client, record, local_dir, release)
        _route(args, s3_client, release)
        return _serve_and_check(args, s3_client, release)


# ----------------------------------------------------------------------------------------------
# demo
# ----------------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    """Build, publish to S3 (local unless --bucket), serve on the real tritonserver, invoke every target."""
    from triton_mme_cdk.model_build.tools.local_s3 import local_s3

    started = time.perf_counter()
    local = args.bucket is None
    server = local_s3() if local else nullcontext(args.endpoint_url)
    with server as endpoint_url:
        if local:
            args.endpoint_url = endpoint_url
            args.bucket = "triton-mme-demo"
            console.print(f"local S3 endpoint (moto server) at {endpoint_url}, bucket {args.bucket}")
        s3_client = _s3(args)
        if local:
            s3_client.create_bucket(Bucket=args.bucket)
        record, release_dir, release = _build(args, s3_client)
        out.print(build_table(record))
        report = _publish(args, s3_client, record, release_dir, release)
        out.print(_publish_line(report, args.bucket, release.prefix(args.prefix)))
        again = _publish(args, s3_client, record, release_dir, release)
        out.print("second publish of the unchanged release: " + _publish_line(
            again, args.bucket, release.prefix(args.prefix)))
        if again.bytes_sent != 0:
            raise PublishError(f"re-publishing an unchanged release sent {again.bytes_sent} bytes; expected 0")
        _route(args, s3_client, release)
        status = _serve_and_check(args, s3_client, release)
    out.print(f"demo finished in {time.perf_counter() - started:.0f} s")
    return status


# ----------------------------------------------------------------------------------------------


def _jobs(text: str) -> int:
    """``--jobs``: a whole number of build processes, at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected a whole number >= 1")
    return value


def _parser() -> argparse.ArgumentParser:
    # Installed, the CLI is the `triton-mme` command; in a checkout, `python -m model_build`.
    installed = Path(sys.argv[0]).name == "triton-mme"
    parser = argparse.ArgumentParser(prog="triton-mme" if installed else "python -m model_build")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, func: Callable[..., int], *, s3: bool = False, build: bool = True) -> None:
        p.set_defaults(func=func)
        p.add_argument("--manifest", default="models.yaml", help="models manifest (default: models.yaml)")
        if build:
            p.add_argument("--out", default="build", help="build folder (default: build)")
            p.add_argument("--compresslevel", type=int, default=1, choices=range(1, 10), metavar="1-9",
                           help="gzip level of the tarballs (default: 1, see docs/benchmarks.md)")
            p.add_argument("--jobs", type=_jobs, default=1, metavar="N",
                           help="build models in N processes; models whose key is built are skipped "
                                "(default: 1)")
        if s3:
            p.add_argument("--bucket", help="S3 bucket to publish to / verify from")
            p.add_argument("--prefix", default=DEFAULT_MODEL_PREFIX,
                           help=f"key prefix above the release (default: {DEFAULT_MODEL_PREFIX})")
            p.add_argument("--endpoint-url", default=None,
                           help="S3 endpoint (default: AWS; e.g. http://127.0.0.1:5000 for a local one)")
            p.add_argument("--region", default=None, help="AWS region (default: from the environment)")
            p.add_argument("--concurrency", type=int, default=16, help="parallel S3 requests (default: 16)")

    validate = sub.add_parser("validate", help="check the manifest; no model is loaded")
    common(validate, cmd_validate, build=False)
    build = sub.add_parser("build", help="export, validate, configure and package every model")
    common(build, cmd_build)
    publish = sub.add_parser("publish", help="build if needed, then publish the release to S3")
    common(publish, cmd_publish, s3=True)
    for p in (validate, build, publish):
        fit_check.add_fit_arguments(p)
    verify = sub.add_parser("verify", help="serve the release on the real tritonserver and check every target")
    common(verify, cmd_verify, s3=True)
    demo = sub.add_parser("demo", help="build, publish (local S3 unless --bucket), serve on tritonserver, invoke")
    common(demo, cmd_demo, s3=True)
    for p in (publish, demo):
        p.add_argument("--retention-days", type=float, default=DEFAULT_RETENTION_DAYS, metavar="DAYS",
                       help="keep a served object this long after no route uses it, for a rollback "
                            f"(default: {DEFAULT_RETENTION_DAYS:g}; the stack's mme:unrouted_retention_days)")
    add_smoke_parser(sub)
    add_endpoint_parser(sub)
    add_plan_parsers(sub, DEFAULT_MODEL_PREFIX)
    add_doctor_parser(sub, DEFAULT_MODEL_PREFIX)
    add_capacity_parser(sub)
    # Every subcommand names what runs it (set_defaults(func=...)); the usage line lists them all.
    parser.description = _DOC_USAGE.replace("{commands}", "{" + ",".join(sub.choices) + "}")
    return parser


_DOC_USAGE = (__doc__ or "").split("\n")[0]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "publish" and not args.bucket:
        _parser().error("publish: --bucket is required")
    try:
        return int(args.func(args))
    except ModelBuildError as error:
        console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
        return 1


__doc__ = (_parser().description or "") + (__doc__ or "")[len(_DOC_USAGE):]

if __name__ == "__main__":
    sys.exit(main())
