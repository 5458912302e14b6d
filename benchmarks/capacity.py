"""The capacity simulator at scale (issue 50): one fleet, then the whole candidate search.

3,000 target models whose footprints are drawn from a seed (GPU memory log-uniform between 16 and
128 MiB, about 160 GB in all, so that ten instances of some types hold them; disk twice the GPU's, load time from the GPU size at the footprint module's documented
rate), a Zipf traffic profile (exponent 1.0) at 300 requests per second, and the request stream
of ``capacity`` (Poisson, seeded) cut at one million requests:

- one fleet: ``simulate`` of 4 x ml.g5.xlarge over the million requests (goal: 10 s or less);
- the whole search: every instance type the stack accepts, counts 1 to 10, priced by the example
  table, as ``python -m model_build capacity`` runs it (goal: 60 s or less);
- comparison: the search as shipped (types in price order, per type one instance and then
  bisection, counts that cost more than the cheapest found not tried, a run stopped once it has
  missed the target, fleets with the same caches simulated once) against every type and count
  simulated in full, both over a tenth of the requests (the exhaustive search at a million would
  take many minutes). Both must name the same cheapest fleet.

These use synthetic footprints: the point is the simulator's speed and the search's pruning, not a
capacity answer for real models. The last row checks the simulator's answer, not its speed
(``benchmarks/capacity_endpoint.py``): copies of ``resnet-synthetic`` of ``models.yaml`` served by
the local endpoint on the real ``tritonserver`` under a memory budget, a Zipf sequence sent one
request at a time, and the loads and warm answers the endpoint gave against the simulator's
prediction for the same budget, sizes and sequence (goal: warm share within 2 percentage points,
loads within 10%, in every mode; a tiny run uses the tiny ResNet weights and fewer requests).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._common import (
    ROOT,
    RunContext,
    comparison,
    finish_result,
    goal,
    log,
    manifest_entry,
    new_result,
    spec_from,
    stats,
    timed,
    tiny_resnet_entry,
)
from benchmarks.capacity_endpoint import LOADS_TOLERANCE, WARM_TOLERANCE

NAME = "capacity"
TITLE = ("The capacity simulator: one fleet and the candidate search at 3,000 models and a million requests, "
         "and its prediction against the local endpoint")
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"models": 60, "requests": 6000, "repeats": 1, "endpoint_copies": 2, "endpoint_room": 1.5,
             "endpoint_requests": 7},
    "quick": {"models": 3000, "requests": 1_000_000, "repeats": 3, "endpoint_copies": 4, "endpoint_room": 2.5,
              "endpoint_requests": 60},
    "full": {"models": 3000, "requests": 1_000_000, "repeats": 3, "endpoint_copies": 6, "endpoint_room": 3.5,
             "endpoint_requests": 150},
}
RATE = 300.0
FLEET = ("ml.g5.xlarge", 4)
ONE_FLEET_GOAL_S, SEARCH_GOAL_S = 10.0, 60.0
PRICES = ROOT / "examples" / "capacity" / "prices.example.yaml"
MIB = 1024**2


def _models(count: int, seed: int = 0) -> list[Any]:
    from triton_mme_cdk.model_build.capacity.footprint import DOCUMENTED, GIB
    from triton_mme_cdk.model_build.capacity.simulate import ModelLoad

    rng = random.Random(seed)
    per_gib = DOCUMENTED["gpu_load_seconds_per_gib"].value or 1.0
    download = DOCUMENTED["download_bytes_per_second"].value or 1.0
    models = []
    for index in range(count):
        gpu = int(math.exp(rng.uniform(math.log(16 * MIB), math.log(128 * MIB))))
        models.append(ModelLoad(f"model-{index:04d}", gpu, 2 * gpu, max(1.61, gpu / GIB * per_gib),
                                2 * gpu / download, 0.002))
    return models


def run(ctx: RunContext) -> dict[str, Any]:
    from triton_mme_cdk.model_build.capacity.fleet import Requests, Target, search, simulate_fleet
    from triton_mme_cdk.model_build.capacity.footprint import Coefficients
    from triton_mme_cdk.model_build.capacity.inputs import instance_shapes
    from triton_mme_cdk.model_build.capacity.prices import read_prices
    from triton_mme_cdk.model_build.capacity.traffic import draw_requests

    sizes = SIZES[ctx.mode]
    started = time.perf_counter()
    result = new_result(NAME, TITLE, ctx, {"rate_per_s": RATE, "zipf": 1.0, "fleet": f"{FLEET[1]} x {FLEET[0]}",
                                           "max_count": 10, "target": Target().text(), "prices": str(PRICES.name)})
    models = _models(sizes["models"])
    seconds = sizes["requests"] / RATE
    weights = [1.0 / k for k in range(1, len(models) + 1)]
    scale = RATE / sum(weights)
    draw_s, (times, targets) = timed(lambda: draw_requests([w * scale for w in weights], seconds=seconds, seed=0))
    requests = Requests(times, targets, warmup_seconds=seconds / 10, seed=0, seconds=seconds)
    coefficients = Coefficients()
    shapes = instance_shapes(None, coefficients)
    prices = read_prices(PRICES)
    fleet_shape = next(s for s in shapes if s.instance_type == FLEET[0])
    log(f"{NAME}: {len(times)} requests over {len(models)} models drawn in {draw_s:.1f} s")

    one: list[float] = []
    fleet_result = None
    for _ in range(sizes["repeats"]):
        elapsed, fleet_result = timed(lambda: simulate_fleet(models, fleet_shape, FLEET[1], requests))
        one.append(elapsed)
    assert fleet_result is not None
    search_s, (rows, best) = timed(lambda: search(models, shapes, requests, prices=prices))
    log(f"{NAME}: one fleet {min(one):.2f} s; search {search_s:.1f} s ({sum(r.result is not None for r in rows)} "
        "fleets simulated)")

    tenth = max(1, len(times) // 10)
    small = Requests(times[:tenth], targets[:tenth], warmup_seconds=times[tenth - 1] / 10, seed=0,
                     seconds=times[tenth - 1])
    pruned_s, (_, pruned_best) = timed(lambda: search(models, shapes, small, prices=prices))
    exhaustive_s, exhaustive = timed(lambda: _exhaustive(models, shapes, small, prices, Target()))
    same = (pruned_best is None and exhaustive is None) or (
        pruned_best is not None and exhaustive is not None
        and (pruned_best.instance_type, pruned_best.count) == exhaustive[:2])

    result["measurements"] = {
        "requests": len(times),
        "draw_s": round(draw_s, 3),
        "one_fleet_s": stats(one),
        "one_fleet": {"warm_share": fleet_result.warm_share, "loads_per_minute": fleet_result.loads_per_minute,
                      "wait_p99_seconds": fleet_result.wait_p99_seconds,
                      "resident_models": len(fleet_result.resident_models)},
        "search_s": round(search_s, 3),
        "search_simulated": sum(r.result is not None for r in rows),
        "search_rows": len(rows),
        "cheapest": None if best is None else {"instance_type": best.instance_type, "count": best.count,
                                               "cost_per_hour": best.cost_per_hour},
        "pruning": {"requests": tenth, "pruned_s": round(pruned_s, 3), "exhaustive_s": round(exhaustive_s, 3),
                    "same_cheapest": same,
                    "cheapest": None if exhaustive is None else {"instance_type": exhaustive[0],
                                                                 "count": exhaustive[1]}},
    }
    result["comparisons"] = [comparison(
        "search_pruning", what=f"candidate search over {tenth} requests", unit="s",
        baseline_label="every type and count simulated", baseline=stats([exhaustive_s]),
        candidate_label="price order, bisection, early stop, equal caches shared", candidate=stats([pruned_s]),
        lower_is_better=True)]
    at_size = sizes["models"] >= 3000 and sizes["requests"] >= 1_000_000
    not_judged = "" if at_size else f"{sizes['models']} models and {sizes['requests']} requests, not 3,000 and a million"
    result["goals"] = [
        goal("capacity_one_fleet", "one fleet simulated at 3,000 models and one million requests",
             target=f"<= {ONE_FLEET_GOAL_S:g} s", measured=f"{statistics_median(one):.2f} s",
             met=statistics_median(one) <= ONE_FLEET_GOAL_S, not_judged=not_judged,
             detail=f"{FLEET[1]} x {FLEET[0]}; median of {len(one)} (fastest {min(one):.2f} s)"),
        goal("capacity_search", "the whole candidate search at 3,000 models and one million requests",
             target=f"<= {SEARCH_GOAL_S:g} s", measured=f"{search_s:.2f} s", met=search_s <= SEARCH_GOAL_S,
             not_judged=not_judged, detail=f"{len(shapes)} instance types, counts 1 to 10; "
                                           f"{result['measurements']['search_simulated']} fleets simulated"),
    ]
    if not same:
        result["notes"].append("the pruned and the exhaustive search named different cheapest fleets")
    check = _endpoint_check(ctx, sizes)
    result["measurements"]["endpoint_check"] = check
    m, p = check["measured"], check["predicted"]
    result["goals"].append(goal(
        "capacity_matches_endpoint", "the simulator predicts the local endpoint's warm share and loads",
        target=f"warm share within {WARM_TOLERANCE * 100:g} pp, loads within {LOADS_TOLERANCE:.0%}",
        measured=f"warm {p['warm_share']:.1%} predicted / {m['warm_share']:.1%} measured; loads {p['loads']} / "
                 f"{m['loads']}",
        met=check["warm_within"] and check["loads_within"],
        detail=f"{check['workload']}, one at a time, on the real tritonserver (CPU)"))
    return finish_result(result, started)


def _endpoint_check(ctx: RunContext, sizes: dict[str, Any]) -> dict[str, Any]:
    """The point-5 comparison: the local endpoint's loads and warm answers against the simulator's."""
    from benchmarks.capacity_endpoint import Workload, check, image_request

    # The entry as the endpoint benchmark builds it (one build per run serves both); its copies are
    # targets of the one tarball, as the build publishes an entry's copies.
    entry = manifest_entry("resnet-synthetic")
    entry["copies"] = 1
    if ctx.tiny:
        entry = tiny_resnet_entry(entry, 128)
    built, release_dir = ctx.build(spec_from(entry))
    copies = sizes["endpoint_copies"]
    artifact = replace(built.artifact(release_dir), targets=tuple(f"{entry['name']}-{i}" for i in range(copies)))
    workload = Workload(copies, sizes["endpoint_room"], sizes["endpoint_requests"], seed=0)
    body, content_type = image_request("pixel_values", "logits", entry["image"]["image_size"])
    seconds, found = timed(lambda: check(artifact, workload, body, content_type))
    log(f"{NAME}: endpoint check {workload.text()}: {found['measured']['loads']} loads measured, "
        f"{found['predicted']['loads']} predicted, in {seconds:.1f} s")
    found["seconds"] = round(seconds, 3)
    return found


def statistics_median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _exhaustive(models: Any, shapes: Any, requests: Any, prices: Any, target: Any) -> tuple[str, int, float] | None:
    """Every type and count simulated; the cheapest that meets ``target`` (the baseline)."""
    from triton_mme_cdk.model_build.capacity.fleet import judge, simulate_fleet

    largest = max(m.gpu_bytes for m in models)
    best: tuple[str, int, float] | None = None
    for shape in shapes:
        if largest > shape.gpu_bytes or shape.instance_type not in prices.per_hour:
            continue
        for count in range(1, 11):
            result = simulate_fleet(models, shape, count, requests, slack=target.gpu_slack)
            cost = prices.per_hour[shape.instance_type] * count
            if not judge(result, target) and (best is None or cost < best[2]):
                best = (shape.instance_type, count, cost)
    return best


def chart(result: dict[str, Any], path: Path) -> None:
    from benchmarks._charts import BASELINE, CANDIDATE, LIMIT, annotate_bars, figure, save

    m = result["measurements"]
    fig, (left, right) = figure(2, "The capacity simulator: one fleet and the whole search")
    bars = left.bar(["one fleet", "whole search"], [m["one_fleet_s"]["median"], m["search_s"]], color=CANDIDATE)
    annotate_bars(left, bars, [f"{m['one_fleet_s']['median']:.1f} s", f"{m['search_s']:.1f} s"])
    left.axhline(ONE_FLEET_GOAL_S, color=LIMIT, linestyle="--", label="one-fleet goal")
    left.axhline(SEARCH_GOAL_S, color=LIMIT, linestyle=":", label="search goal")
    left.set_ylabel("seconds")
    left.legend(fontsize=8)
    p = m["pruning"]
    bars = right.bar(["every fleet", "pruned"], [p["exhaustive_s"], p["pruned_s"]], color=[BASELINE, CANDIDATE])
    annotate_bars(right, bars, [f"{p['exhaustive_s']:.1f} s", f"{p['pruned_s']:.1f} s"])
    right.set_title(f"search over {p['requests']} requests", fontsize=10)
    save(fig, path)


def markdown(result: dict[str, Any]) -> str:
    from benchmarks.report import table

    m = result["measurements"]
    one, p, e = m["one_fleet"], m["pruning"], m["endpoint_check"]
    cheapest = m["cheapest"]
    return "\n".join([
        f"{m['requests']} requests (Zipf 1.0 at {result['parameters']['rate_per_s']:g} req/s, drawn in "
        f"{m['draw_s']:.1f} s) over the synthetic footprints of the module docstring.",
        "",
        table(["what", "seconds", "result"], [
            [f"one fleet ({result['parameters']['fleet']})", f"{m['one_fleet_s']['median']:.2f}",
             f"{one['warm_share']:.2%} warm, {one['loads_per_minute']:.1f} loads/min, p99 wait "
             f"{one['wait_p99_seconds']:.1f} s, {one['resident_models']} resident"],
            ["whole search", f"{m['search_s']:.1f}",
             f"{m['search_simulated']} of {m['search_rows']} rows simulated; cheapest "
             + (f"{cheapest['count']} x {cheapest['instance_type']} ({cheapest['cost_per_hour']:.2f}/h, example "
                "prices, unverified)" if cheapest else "none meets the target")],
            [f"search, every fleet ({p['requests']} requests)", f"{p['exhaustive_s']:.1f}",
             f"same cheapest as the pruned search: {p['same_cheapest']}"],
            [f"search, pruned ({p['requests']} requests)", f"{p['pruned_s']:.1f}", ""],
        ]),
        "",
        "The simulator against the local endpoint (real tritonserver on CPU, LRU under a memory budget; "
        f"{e['workload']}, budget {e['budget_bytes'] / 1e6:.2f} MB, one request at a time):",
        "",
        table(["", "warm share", "loads", "resident at the end"], [
            ["predicted (simulator)", f"{e['predicted']['warm_share']:.1%}", str(e["predicted"]["loads"]),
             ", ".join(e["predicted"]["resident"])],
            ["measured (endpoint)", f"{e['measured']['warm_share']:.1%}", str(e["measured"]["loads"]),
             ", ".join(e["measured"]["resident"])],
            ["difference (tolerance)", f"{e['warm_share_diff'] * 100:.1f} pp ({WARM_TOLERANCE * 100:g} pp)",
             "n/a" if e["loads_rel_diff"] is None else f"{e['loads_rel_diff']:.0%} ({LOADS_TOLERANCE:.0%})", ""],
        ]),
        "",
        "What this cannot check: SageMaker's own eviction (the endpoint is this project's emulation of it), "
        "its routing over several instances, requests that overlap a load, and the real GPU's allocator "
        "(the budget counts unpacked bytes).",
    ])
