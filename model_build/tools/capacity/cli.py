"""``capacity``: will the models fit, and how many instances keep them warm.

Takes the manifest and a traffic profile (``--traffic FILE``; default: 10 requests per second
spread by Zipf's law, exponent 1.0, in manifest order), draws one seeded request stream, and
simulates it on every candidate instance type and count (:mod:`~model_build.capacity.fleet`):
each instance's GPU memory and disk as least-recently-used caches, SageMaker's routing to an
instance that has the model loaded, spilling to another under load. For each fleet it reports
the resident set, the share of requests served warm, loads per minute, the share of requests that
wait for a load and the p99 of that wait, and the cost per hour from ``--prices FILE``; it names
the cheapest fleet that meets the target (default: 99% warm with 10% of GPU memory as slack).
Output: ``--format text|json|markdown``; ``--json-file`` and ``--markdown-file`` write the others too.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.capacity.fleet import (
    DEFAULT_GPU_SLACK,
    DEFAULT_MAX_COUNT,
    DEFAULT_WARM_SHARE,
    Requests,
    Target,
    search,
)
from triton_mme_cdk.model_build.capacity.footprint import GPU_CHECK, Coefficients
from triton_mme_cdk.model_build.capacity.inputs import (
    DEFAULT_SERVICE_MS,
    TargetFootprint,
    from_footprint,
    instance_shapes,
    measured_service_ms,
    model_loads,
    read_footprints,
    recorded_footprints,
)
from triton_mme_cdk.model_build.capacity.prices import read_prices
from triton_mme_cdk.model_build.capacity.simulate import Routing
from triton_mme_cdk.model_build.capacity.traffic import draw_requests, read_profile
from triton_mme_cdk.model_build.errors import CapacityInputError

DEFAULT_SECONDS = 3600.0
DEFAULT_WARMUP_SECONDS = 300.0
DEFAULT_SPILL_AFTER_SECONDS = Routing().spill_after_seconds

ASSUMPTIONS = (
    "eviction is least recently used, in GPU memory and on the disk (the developer guide says SageMaker "
    "unloads 'unused' models; Triton's SageMaker layer and this project's local endpoint evict the least "
    "recently used)",
    "a request for a loaded model spills to another instance when every instance holding it has more than "
    "the spill threshold of work queued (the guide says only 'many invocation requests')",
    "a request for a model loaded nowhere goes to the instance with the least work queued",
    "requests arrive as a Poisson stream; one request's GPU time is its service time, with no batching",
    "a load's time does not depend on other loads running at once on the same instance",
)


def _number(text: str, option: str, *, low: float, high: float, expected: str, integer: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not low <= value <= high or (integer and value != int(value)):
        raise CapacityInputError(f"{option}: got {text!r}; expected {expected}")
    return value


def capacity_report(args: argparse.Namespace) -> Any:
    """Every input read and checked (one error line each, before anything is simulated), then the search."""
    from triton_mme_cdk.model_build.manifest import load_manifest
    from triton_mme_cdk.model_build.tools.capacity.report import CapacityReport

    seconds = _number(args.duration, "--duration", low=1.0, high=1e9, expected="seconds, a number >= 1")
    warmup = _number(args.warmup, "--warmup", low=0.0, high=seconds, expected=f"seconds in [0, {seconds:g}) "
                     "(the --duration)")
    if warmup >= seconds:
        raise CapacityInputError(f"--warmup: got {args.warmup!r}; expected seconds in [0, {seconds:g}) (the --duration)")
    seed = int(_number(args.seed, "--seed", low=0, high=2**63, expected="a whole number >= 0", integer=True))
    max_count = int(_number(args.max_count, "--max-count", low=1, high=1000, expected="a whole number in [1, 1000]",
                            integer=True))
    target = Target(
        _number(args.warm_share, "--warm-share", low=0.0, high=1.0, expected="a share in [0, 1], such as 0.99"),
        _number(args.gpu_slack, "--gpu-slack", low=0.0, high=0.9, expected="a share in [0, 0.9], such as 0.1"))
    routing = Routing(_number(args.spill_after, "--spill-after", low=0.0, high=1e6, expected="seconds, a number >= 0"))
    default_ms = _number(args.service_ms, "--service-ms", low=1e-6, high=1e6, expected="milliseconds, a number > 0")
    limit = None if args.load_gpu_limit is None else _number(
        args.load_gpu_limit, "--load-gpu-limit", low=0.01, high=1.0, expected="a share of GPU memory in (0, 1]")
    measurements = Path(args.measurements) if args.measurements else None
    coefficients = Coefficients.read(measurements)
    shapes = instance_shapes(args.instance_type, coefficients, load_gpu_limit=limit)
    prices = read_prices(Path(args.prices), known=tuple(s.instance_type for s in instance_shapes(None, coefficients))) \
        if args.prices else None

    manifest_path = Path(args.manifest)
    manifest = load_manifest(manifest_path)
    groups = {spec.name: spec.target_names() for spec in manifest.models}
    pairs = [(target_name, spec.name) for target_name, spec in manifest.targets()]
    traffic = read_profile(Path(args.traffic) if args.traffic else None, groups)
    footprints = _footprints(args, manifest, manifest_path.resolve().parent, coefficients, groups)
    measured = measured_service_ms(measurements or _checkout_gpu_check(),
                                   [(spec.name, spec.format, spec.effective_precision) for spec in manifest.models])
    service: dict[str, tuple[float, str]] = {}
    for target_name, entry in pairs:
        if target_name in traffic.service_ms:
            service[target_name] = (traffic.service_ms[target_name], "given in the traffic profile")
        elif entry in measured:
            service[target_name] = measured[entry]
        else:
            service[target_name] = (default_ms, "ASSUMED: no measurement (--service-ms)")
    loads = model_loads(pairs, footprints, service)

    times, targets = draw_requests([traffic.rates[name] for name, _ in pairs], seconds=seconds, seed=seed)
    requests = Requests(times, targets, warmup_seconds=warmup, seed=seed, seconds=seconds)
    rows, best = search(loads, shapes, requests, target=target, prices=prices, max_count=max_count, routing=routing)
    return CapacityReport(
        source=str(args.manifest), traffic=traffic.described, rates=traffic.rates, models=loads,
        footprints={name: footprints[name] for name, _ in pairs},
        service_sources={name: service[name][1] for name, _ in pairs}, target=target, routing=routing,
        seconds=seconds, warmup_seconds=warmup, seed=seed, requests=len(times), candidates=rows, cheapest=best,
        prices=prices,
        assumptions=[*ASSUMPTIONS, f"spill threshold {routing.spill_after_seconds:g} s (--spill-after)"])


def _checkout_gpu_check() -> Path:
    from triton_mme_cdk.model_build.capacity import footprint

    return Path(footprint.__file__).resolve().parents[2] / GPU_CHECK


def _footprints(args: argparse.Namespace, manifest: Any, base_dir: Path, coefficients: Coefficients,
                groups: dict[str, list[str]]) -> dict[str, TargetFootprint]:
    """Each target's footprint: synth's estimate from the sources, over it a release index's
    recorded footprint (``--release-index``), over both the user's (``--footprints``)."""
    import json as json_

    from triton_mme_cdk.model_build.capacity.sizing import synth_footprints

    found: dict[str, TargetFootprint] = {}
    why: dict[str, str] = {}
    recorded = []
    if args.release_index:
        path = Path(args.release_index)
        if not path.is_file():
            raise CapacityInputError(f"--release-index: got {str(path)!r}; no such file")
        try:
            document = json_.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise CapacityInputError(f"--release-index {path}: not JSON ({error})") from None
        recorded = recorded_footprints(document, str(path))
    for footprint in [*synth_footprints(manifest.models, base_dir, coefficients), *recorded]:
        simulated = from_footprint(footprint, coefficients)
        if simulated is not None:
            found[footprint.target] = simulated
        else:
            why.setdefault(footprint.target, footprint.gpu_memory().source)
    if args.footprints:
        found.update(read_footprints(Path(args.footprints), groups))
    for names in groups.values():
        for name in names:
            if name not in found:
                raise CapacityInputError(f"footprints: {name}: GPU memory unknown ({why.get(name, 'not sized')}); "
                                         "give it in --footprints FILE")
    return found


def cmd_capacity(args: argparse.Namespace) -> int:
    report = capacity_report(args)
    rendered = {"text": report.text, "json": lambda: json.dumps(report.as_json(), indent=1, sort_keys=True) + "\n",
                "markdown": report.markdown}
    if args.json_file:
        Path(args.json_file).write_text(rendered["json"](), encoding="utf-8")
    if args.markdown_file:
        Path(args.markdown_file).write_text(rendered["markdown"](), encoding="utf-8")
    sys.stdout.write(rendered[args.format]())
    return 0


def add_capacity_parser(sub: Any) -> None:
    p = sub.add_parser("capacity", help="will the models fit, and how many instances keep them warm (simulated)",
                       description=(__doc__ or "").split("\n\n")[1].replace("\n", " "))
    p.add_argument("--manifest", default="models.yaml", help="models manifest (default: models.yaml)")
    p.add_argument("--traffic", default=None, metavar="FILE",
                   help="traffic profile, YAML or JSON: per-model rates, or a total rate with a Zipf exponent "
                        "(default: 10 req/s, Zipf 1.0, in manifest order; docs/capacity.md)")
    p.add_argument("--release-index", default=None, metavar="FILE",
                   help="a release's index (_index.json): the footprints its build recorded, over synth's estimates")
    p.add_argument("--footprints", default=None, metavar="FILE",
                   help="each model's GPU and disk MiB and load seconds, over the recorded or estimated ones")
    p.add_argument("--load-gpu-limit", default=None, metavar="SHARE",
                   help="SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT of the endpoint, where set (a share of GPU memory)")
    p.add_argument("--prices", default=None, metavar="FILE",
                   help="price table, YAML or JSON, with its date and source (example: "
                        "examples/capacity/prices.example.yaml, unverified); without it no cost is shown")
    p.add_argument("--instance-type", action="append", metavar="TYPE",
                   help="a candidate instance type (repeatable; default: every type the stack accepts)")
    p.add_argument("--max-count", default=str(DEFAULT_MAX_COUNT), metavar="N",
                   help=f"most instances of a type to try (default: {DEFAULT_MAX_COUNT})")
    p.add_argument("--warm-share", default=str(DEFAULT_WARM_SHARE), metavar="SHARE",
                   help=f"target: least share of requests served warm (default: {DEFAULT_WARM_SHARE})")
    p.add_argument("--gpu-slack", default=str(DEFAULT_GPU_SLACK), metavar="SHARE",
                   help=f"target: share of usable GPU memory held back in the simulation (default: {DEFAULT_GPU_SLACK})")
    p.add_argument("--duration", default=f"{DEFAULT_SECONDS:g}", metavar="SECONDS",
                   help=f"seconds of traffic simulated (default: {DEFAULT_SECONDS:g})")
    p.add_argument("--warmup", default=f"{DEFAULT_WARMUP_SECONDS:g}", metavar="SECONDS",
                   help=f"first seconds not counted (default: {DEFAULT_WARMUP_SECONDS:g})")
    p.add_argument("--seed", default="0", metavar="N", help="seed of the request stream (default: 0)")
    p.add_argument("--spill-after", default=f"{DEFAULT_SPILL_AFTER_SECONDS:g}", metavar="SECONDS",
                   help="queued work above which a request spills to another instance (default: "
                        f"{DEFAULT_SPILL_AFTER_SECONDS:g}; an assumption, docs/capacity.md)")
    p.add_argument("--service-ms", default=f"{DEFAULT_SERVICE_MS:g}", metavar="MS",
                   help=f"GPU time per request of a model nothing measured (default: {DEFAULT_SERVICE_MS:g}, assumed)")
    p.add_argument("--measurements", default=None, metavar="FILE",
                   help=f"the GPU check's results: coefficients and service times (default: this checkout's "
                        f"{GPU_CHECK}, if present)")
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text",
                   help="what to print (default: text)")
    p.add_argument("--json-file", default=None, metavar="FILE", help="also write the JSON report here")
    p.add_argument("--markdown-file", default=None, metavar="FILE", help="also write the markdown report here")
    p.set_defaults(func=cmd_capacity)
