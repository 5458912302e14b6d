"""Smoke-test a deployed multi-model endpoint against the release it serves.

The ``smoke`` sub-command of ``python -m model_build`` (:func:`add_smoke_parser`, :func:`cmd_smoke`:
the report as a table, exit status 0 when no target failed and one passed at least: a skipped target
is neither) and the same command on its own
(``python -m model_build.tools.smoke.cli``). The test itself is :mod:`model_build.tools.smoke.runner`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.tools.smoke.prepare import (
    DEFAULT_TIMEOUT_SECONDS,
    make_client,
    make_runtime_client,
)
from triton_mme_cdk.model_build.tools.smoke.runner import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    SmokeReport,
    TargetResult,
    run_smoke,
)

# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def add_smoke_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``smoke``: the sub-command that tests a deployed endpoint (add to ``python -m model_build``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "smoke",
        help="invoke every model of a deployed endpoint and check the answers against the release",
        description=(
            "Find the release an endpoint serves (DescribeEndpoint -> EndpointConfig -> Model -> "
            "ModelDataUrl), invoke each TargetModel twice (cold, warm) with the reference inputs "
            "and check outputs against the reference recorded at build time."
        ),
    )
    parser.add_argument("--endpoint", required=True, help="SageMaker endpoint name")
    parser.add_argument("--release", default=None,
                        help="check against this release id (r-...) under the same bucket/prefix "
                             "instead of the one the endpoint's model points at")
    parser.add_argument("--sample", type=int, default=None, metavar="N",
                        help="invoke N targets chosen at random (deterministic with --seed) instead of all")
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample (default: 0)")
    parser.add_argument("--region", default=None, help="AWS region (default: from the environment)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS, metavar="S",
                        help=f"seconds one invocation may take (default: {DEFAULT_TIMEOUT_SECONDS:g})")
    parser.add_argument("--atol", type=float, default=None,
                        help="absolute tolerance against the reference for every target (default: the rule of "
                             "the precision the target serves, model_build.compare.SERVED_TOLERANCE; "
                             f"{DEFAULT_ATOL:g} where it is not recorded)")
    parser.add_argument("--rtol", type=float, default=None,
                        help="relative tolerance against the reference for every target (default: as --atol; "
                             f"{DEFAULT_RTOL:g} where the precision is not recorded)")
    for service in ("sagemaker", "runtime", "s3"):
        parser.add_argument(f"--{service}-endpoint-url", default=None, metavar="URL",
                            help=f"{service} API endpoint, for testing against local endpoints (default: AWS)")
    parser.set_defaults(func=cmd_smoke)
    return parser


def _consoles() -> tuple[Any, Any]:
    from rich.console import Console

    # Wide when not a terminal, so logs keep each table row on one line (as in __main__).
    return (
        Console(width=None if sys.stdout.isatty() else 200),
        Console(stderr=True, width=None if sys.stderr.isatty() else 200),
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def smoke_table(report: SmokeReport) -> Any:
    """The report as a rich table: target, result, cold ms, warm ms, max difference, error."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        title=f"smoke test of endpoint {report.endpoint_name}: release {report.release_id} "
        f"({len(report.rows)} of {report.targets_in_release} targets)"
    )
    for column in ("target", "result", "cold ms", "warm ms", "max difference", "error"):
        table.add_column(column, justify="right" if column.endswith("ms") else "left")
    for row in report.rows:
        table.add_row(
            escape(row.target),
            "ok" if row.ok else "[yellow]skipped[/yellow]" if row.skipped else "[red]FAILED[/red]",
            _ms(row.cold_ms),
            _ms(row.warm_ms),
            "-" if row.max_diff is None else f"{row.max_diff:.2e}",
            escape(row.error or row.skipped or (f"note: {row.note}" if row.note else "")),
        )
    table.caption = report.summary()
    return table


def cmd_smoke(args: argparse.Namespace) -> int:
    """Run the smoke test for the CLI; 0 when every target passed, 1 otherwise."""
    from rich.markup import escape

    out, err = _consoles()
    sagemaker_client = make_client("sagemaker", endpoint_url=args.sagemaker_endpoint_url, region=args.region)
    runtime_client = make_runtime_client(
        endpoint_url=args.runtime_endpoint_url, region=args.region, timeout_seconds=args.timeout
    )
    s3_client = make_client("s3", endpoint_url=args.s3_endpoint_url, region=args.region)

    def progress(row: TargetResult) -> None:
        if err.is_terminal:
            err.print(f"{escape(row.target)}: {'ok' if row.ok else 'skipped' if row.skipped else 'FAILED'}",
                      highlight=False)

    report = run_smoke(
        endpoint_name=args.endpoint,
        sagemaker_client=sagemaker_client,
        runtime_client=runtime_client,
        s3_client=s3_client,
        release=args.release,
        sample=args.sample,
        timeout_seconds=args.timeout,
        tolerance_atol=args.atol,
        tolerance_rtol=args.rtol,
        seed=args.seed,
        progress=progress,
    )
    if args.release and not report.model_data_url.rstrip("/").endswith("/" + args.release):
        out.print(
            f"note: the endpoint serves {escape(report.model_data_url)}; answers were checked against "
            f"the index and references of {escape(report.release_url)}",
            highlight=False,
        )
    out.print(smoke_table(report))
    out.print(f"{report.summary()} in {report.seconds:.1f} s", highlight=False)
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m model_build.tools.smoke.cli``: the sub-command on its own, with the CLI's error handling."""
    from rich.markup import escape

    parser = argparse.ArgumentParser(prog="python -m model_build", description=__doc__.split("\n")[0])
    add_smoke_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["smoke", *(sys.argv[1:] if argv is None else argv)])
    try:
        return cmd_smoke(args)
    except ModelBuildError as error:
        _, err = _consoles()
        err.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
