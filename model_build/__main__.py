"""``python -m model_build {validate,build,publish,verify,demo}``.

Expected errors (a bad manifest, a model whose export does not match PyTorch, an S3 failure)
print one message and exit 1 with no stack trace; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from model_build.errors import ModelBuildError, PublishError
from model_build.manifest import Manifest, load_manifest
from model_build.release import REFERENCE_DIR, Release, compute_release
from model_build.smoke import add_smoke_parser, cmd_smoke

# Wide when not a terminal, so logs and CI output keep each table row and message on one line.
# Progress bars of our own only: the libraries' weight-loading bars and notices are noise here.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
out = Console(width=None if sys.stdout.isatty() else 200)

DEFAULT_PREFIX = "models"


def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} GB"


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
    return manifest, compute_release(manifest, base_dir=base_dir), base_dir


# ----------------------------------------------------------------------------------------------
# validate
# ----------------------------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    manifest, release, _ = _load(args)
    table = Table(title=f"{args.manifest}: valid, release {release.release_id}")
    for column in ("model", "source", "task", "format", "max batch", "copies", "targets"):
        table.add_column(column)
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
        )
    out.print(table)
    out.print(f"{manifest.target_count} target models in {len(manifest.models)} entries")
    return 0


# ----------------------------------------------------------------------------------------------
# build
# ----------------------------------------------------------------------------------------------


def _build(args: argparse.Namespace, s3_client: Any = None) -> tuple[Any, Path, Release]:
    from model_build.build import build_release

    manifest, release, base_dir = _load(args)
    with _progress() as progress:
        task = progress.add_task("build", total=len(manifest.models) * 3)

        def on_model(spec: Any, step: str) -> None:
            progress.update(task, description=f"{spec.name}: {step}")
            progress.advance(task)

        record, release_dir = build_release(
            manifest,
            release,
            base_dir=base_dir,
            out_dir=Path(args.out),
            s3_client=s3_client,
            compresslevel=args.compresslevel,
            on_model=on_model,
        )
    return record, release_dir, release


def _build_table(record: Any) -> Table:
    table = Table(title=f"release {record.release_id}")
    for column in ("model", "format", "size", "sha256", "max difference", "time"):
        table.add_column(column, justify="right" if column in {"size", "time"} else "left")
    for model in record.models:
        diff = f"{model.worst_diff:.2e}"
        if model.reference_check:
            diff += f" (incl. {model.reference_check})"
        table.add_row(
            model.name + (f" x{len(model.targets)}" if len(model.targets) > 1 else ""),
            model.format,
            _human(model.size),
            model.sha256[:16],
            diff,
            f"{model.seconds:.1f} s",
        )
    return table


def cmd_build(args: argparse.Namespace) -> int:
    record, release_dir, _ = _build(args)
    out.print(_build_table(record))
    out.print(f"artifacts in {release_dir}")
    return 0


# ----------------------------------------------------------------------------------------------
# publish
# ----------------------------------------------------------------------------------------------


def _s3(args: argparse.Namespace) -> Any:
    from model_build.local_s3 import make_s3_client

    return make_s3_client(endpoint_url=args.endpoint_url, region=args.region)


def _record_for(args: argparse.Namespace, s3_client: Any) -> tuple[Any, Path, Release]:
    """The build of this manifest: the one on disk if it matches the release, else a new one."""
    from model_build.build import BuildRecord

    _, release, _ = _load(args)
    release_dir = Path(args.out) / release.release_id
    record = BuildRecord.read(release_dir)
    if record is not None and all((release_dir / m.tarball).is_file() for m in record.models):
        return record, release_dir, release
    return _build(args, s3_client)


def _publish(args: argparse.Namespace, s3_client: Any, record: Any, release_dir: Path,
             release: Release) -> Any:
    from model_build.publish import publish_release

    targets = sum(len(m.targets) for m in record.models)
    with _progress() as progress:
        task = progress.add_task(f"publish {release.release_id}", total=targets + 1)

        def on_progress(_key: str, _bytes: int) -> None:
            progress.advance(task)

        report = publish_release(
            record.artifacts(release_dir),
            s3_client=s3_client,
            bucket=args.bucket,
            release_prefix=release.prefix(args.prefix),
            index_extra={
                "release_id": release.release_id,
                "manifest_sha256": release.manifest_sha256,
                "code_sha256": release.code_sha256,
            },
            concurrency=args.concurrency,
            progress=on_progress,
        )
    return report


def _publish_line(report: Any, bucket: str, prefix: str) -> str:
    return (
        f"published s3://{bucket}/{prefix}/: {report.targets} target models; objects (tarballs, "
        f"references, index): {report.uploaded} uploaded, {report.copied} copied server-side, "
        f"{report.skipped} already present; {_human(report.bytes_sent)} sent in {report.seconds:.1f} s"
    )


def cmd_publish(args: argparse.Namespace) -> int:
    s3_client = _s3(args)
    record, release_dir, release = _record_for(args, s3_client)
    report = _publish(args, s3_client, record, release_dir, release)
    out.print(_publish_line(report, args.bucket, release.prefix(args.prefix)))
    out.print(f"ModelDataUrl: s3://{args.bucket}/{release.prefix(args.prefix)}/")
    return 0


# ----------------------------------------------------------------------------------------------
# verify
# ----------------------------------------------------------------------------------------------


def _verify_jobs(record: Any, release_dir: Path, *, published: bool) -> list[tuple[str, str, Path, Path]]:
    """(source model, target, tarball, reference) for every model to verify.

    A local build holds one tarball per manifest entry; a downloaded release holds one per
    target (copies included), each of which is verified: each is an object a request can name.
    """
    jobs = []
    for model in record.models:
        if published:
            reference = release_dir / REFERENCE_DIR / f"{model.name}.npz"
            jobs += [(model.name, t, release_dir / f"{t}.tar.gz", reference) for t in model.targets]
        else:
            jobs.append((model.name, model.targets[0], release_dir / model.tarball, release_dir / model.reference))
    return jobs


def _verify_dir(record: Any, release_dir: Path, manifest: Manifest, *, published: bool) -> list[Any]:
    from model_build.verify import verify_artifact

    specs = {spec.name: spec for spec in manifest.models}
    jobs = _verify_jobs(record, release_dir, published=published)
    results = []
    with _progress() as progress:
        task = progress.add_task("verify", total=len(jobs))
        for name, target, tarball, reference in jobs:
            progress.update(task, description=f"verify {target}")
            results.append(
                verify_artifact(tarball, reference, tolerance=specs[name].tolerance, target_model=target)
            )
            progress.advance(task)
    return results


def _verify_table(results: Sequence[Any], title: str) -> Table:
    table = Table(title=title)
    for column in ("target", "format", "max difference", "result", "time"):
        table.add_column(column)
    for result in results:
        table.add_row(
            result.target,
            result.format,
            f"{max(result.max_abs_diff.values(), default=0.0):.2e}",
            "ok" if result.ok else "FAILED",
            f"{result.seconds:.2f} s",
        )
    return table


@contextmanager
def _downloaded(args: argparse.Namespace, release: Release) -> Iterator[Path]:
    from model_build.publish import download_release

    with tempfile.TemporaryDirectory(prefix="verify-") as tmp:
        download_release(_s3(args), args.bucket, release.prefix(args.prefix), Path(tmp))
        yield Path(tmp)


def cmd_verify(args: argparse.Namespace) -> int:
    from model_build.build import BuildRecord

    manifest, release, _ = _load(args)
    local_dir = Path(args.out) / release.release_id
    record = BuildRecord.read(local_dir)
    if record is None:
        raise ModelBuildError(
            f"verify: no build of release {release.release_id} in {local_dir}; run "
            "`python -m model_build build` first",
            step="verify",
        )
    source = _downloaded(args, release) if args.bucket else nullcontext(local_dir)
    with source as release_dir:
        results = _verify_dir(record, release_dir, manifest, published=bool(args.bucket))
    where = f"s3://{args.bucket}/{release.prefix(args.prefix)}/" if args.bucket else str(local_dir)
    out.print(_verify_table(results, f"verified {where}"))
    return 0 if all(r.ok for r in results) else 1


# ----------------------------------------------------------------------------------------------
# demo
# ----------------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    """Build, publish to S3 (a local endpoint started for the run unless --bucket), verify."""
    from model_build.local_s3 import local_s3

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
        out.print(_build_table(record))
        report = _publish(args, s3_client, record, release_dir, release)
        out.print(_publish_line(report, args.bucket, release.prefix(args.prefix)))
        again = _publish(args, s3_client, record, release_dir, release)
        out.print("second publish of the unchanged release: " + _publish_line(
            again, args.bucket, release.prefix(args.prefix)))
        if again.bytes_sent != 0:
            raise PublishError(f"re-publishing an unchanged release sent {again.bytes_sent} bytes; expected 0")
        manifest = load_manifest(args.manifest)
        with _downloaded(args, release) as downloaded:
            results = _verify_dir(record, downloaded, manifest, published=True)
        out.print(_verify_table(
            results, f"verified every model as published to s3://{args.bucket}/{release.prefix(args.prefix)}/"
        ))
    out.print(f"demo finished in {time.perf_counter() - started:.0f} s")
    return 0 if all(r.ok for r in results) else 1


# ----------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m model_build", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, *, s3: bool = False, build: bool = True) -> None:
        p.add_argument("--manifest", default="models.yaml", help="models manifest (default: models.yaml)")
        if build:
            p.add_argument("--out", default="build", help="build folder (default: build)")
            p.add_argument("--compresslevel", type=int, default=1, choices=range(1, 10), metavar="1-9",
                           help="gzip level of the tarballs (default: 1, see docs/benchmarks.md)")
        if s3:
            p.add_argument("--bucket", help="S3 bucket to publish to / verify from")
            p.add_argument("--prefix", default=DEFAULT_PREFIX,
                           help=f"key prefix above the release (default: {DEFAULT_PREFIX})")
            p.add_argument("--endpoint-url", default=None,
                           help="S3 endpoint (default: AWS; e.g. http://127.0.0.1:5000 for a local one)")
            p.add_argument("--region", default=None, help="AWS region (default: from the environment)")
            p.add_argument("--concurrency", type=int, default=16, help="parallel S3 requests (default: 16)")

    common(sub.add_parser("validate", help="check the manifest; no model is loaded"), build=False)
    common(sub.add_parser("build", help="export, validate, configure and package every model"))
    publish = sub.add_parser("publish", help="build if needed, then publish the release to S3")
    common(publish, s3=True)
    verify = sub.add_parser("verify", help="load each tarball like the container and compare outputs")
    common(verify, s3=True)
    demo = sub.add_parser("demo", help="build, publish (local S3 unless --bucket) and verify")
    common(demo, s3=True)
    add_smoke_parser(sub)
    return parser


COMMANDS = {
    "validate": cmd_validate,
    "build": cmd_build,
    "publish": cmd_publish,
    "verify": cmd_verify,
    "demo": cmd_demo,
    "smoke": cmd_smoke,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "publish" and not args.bucket:
        _parser().error("publish: --bucket is required")
    try:
        return COMMANDS[args.command](args)
    except ModelBuildError as error:
        console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
