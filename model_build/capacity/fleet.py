"""Which fleet to run: every candidate instance type and count simulated under one request stream,
and the cheapest that meets the target.

The target (:class:`Target`) is a warm share (default: at least 99% of requests answered by an
instance that had the model loaded) and a GPU memory slack (default 10%). An LRU cache always
fills, so slack is not "memory left free at the end": each fleet is simulated with only
``1 - slack`` of each instance's usable GPU memory, and meets the target only if it still keeps
the warm share there; the memory it really has is the margin for estimates that come out low.
An instance type whose usable GPU memory is smaller than one model's estimate is reported as not
fitting and never simulated.

The search: instance types in the order of their price (unpriced last); per type, the fewest
instances that meet the target: one, else by bisection over the counts 2 to ``max_count`` (or, once a
cheaper fleet is known, to the most that still cost less; a type of which one instance costs as
much is reported as skipped). A fleet's run stops as soon as more requests than the target allows
were not warm: it has missed the target, and its row says where it stopped. Fleets that present
the simulator the same caches (the same GPU memory, the same disk or more than the models need,
the same count) are simulated once.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from triton_mme_cdk.model_build.capacity.prices import PriceTable
from triton_mme_cdk.model_build.capacity.simulate import (
    DEFAULT_ROUTING,
    FleetResult,
    InstanceShape,
    ModelLoad,
    Routing,
    simulate,
)

DEFAULT_WARM_SHARE = 0.99
DEFAULT_GPU_SLACK = 0.10
DEFAULT_MAX_COUNT = 10


@dataclass(frozen=True)
class Target:
    warm_share: float = DEFAULT_WARM_SHARE
    gpu_slack: float = DEFAULT_GPU_SLACK

    def text(self) -> str:
        return f">= {self.warm_share:.1%} of requests warm with {self.gpu_slack:.0%} of GPU memory kept as slack"


#: The default target (a module-level value: a default argument is built once).
DEFAULT_TARGET = Target()


@dataclass(frozen=True)
class Requests:
    """The request stream every candidate is simulated under."""

    times: Sequence[float]
    targets: Sequence[int]
    warmup_seconds: float
    seed: int
    seconds: float


@dataclass
class Candidate:
    """One instance type and count, and what the simulation said of it."""

    instance_type: str
    count: int
    status: str  # simulated | does-not-fit (a model exceeds the usable memory) | skipped (costs more)
    usable_gpu_bytes: int
    cost_per_hour: float | None = None
    result: FleetResult | None = None
    meets_target: bool = False
    reasons: list[str] = field(default_factory=list)  # why it misses the target, does not fit or was skipped

    def as_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "instance_type": self.instance_type,
            "count": self.count,
            "status": self.status,
            "usable_gpu_bytes": self.usable_gpu_bytes,
            "cost_per_hour": self.cost_per_hour,
            "meets_target": self.meets_target,
            "reasons": list(self.reasons),
            "requests": r.requests if r else None,
            "warm_share": r.warm_share if r else None,
            "loads_per_minute": r.loads_per_minute if r else None,
            "waited_share": r.waited_share if r else None,
            "wait_p99_seconds": r.wait_p99_seconds if r else None,
            "not_ready_share": (r.not_ready / r.requests if r.requests else None) if r else None,
            "spilled": r.spilled if r else None,
            "gpu_busy_share": r.busy_share if r else None,
            "complete": r.complete if r else None,
            "peak_gpu_share": (r.peak_gpu_bytes / self.usable_gpu_bytes if self.usable_gpu_bytes else None) if r
            else None,
            "resident_models": r.resident_models if r else None,
        }


def judge(result: FleetResult, target: Target) -> list[str]:
    """Why ``result`` misses ``target`` (empty: it meets it)."""
    reasons = []
    share = result.warm_share
    if share is None:
        reasons.append("no request was counted (the warm-up covers the whole run)")
    elif share < target.warm_share:
        reasons.append(f"{share:.2%} warm < {target.warm_share:.1%}")
    busy = result.busy_share
    if busy is not None and busy >= 1.0:
        reasons.append(f"the GPUs would be busy {busy:.0%} of the time: requests queue without bound")
    if not result.complete:
        reasons.append(f"stopped after {result.requests} counted requests (more than {1 - target.warm_share:.1%} "
                       "of the run's already cold): its figures cover those")
    if result.unfit:
        reasons.append(f"{result.unfit} requests for models that do not fit with {target.gpu_slack:.0%} slack")
    return reasons


def simulate_fleet(models: Sequence[ModelLoad], shape: InstanceShape, count: int, requests: Requests,
                   routing: Routing = DEFAULT_ROUTING, *, slack: float = 0.0,
                   stop_after_cold: int | None = None) -> FleetResult:
    """One fleet, with ``slack`` of its GPU memory held back."""
    held = replace(shape, gpu_bytes=int(shape.gpu_bytes * (1.0 - slack)))
    return simulate(models, held, count, requests.times, requests.targets,
                    warmup_seconds=requests.warmup_seconds, routing=routing, stop_after_cold=stop_after_cold)


def search(models: Sequence[ModelLoad], shapes: Sequence[InstanceShape], requests: Requests, *,
           target: Target = DEFAULT_TARGET, prices: PriceTable | None = None, max_count: int = DEFAULT_MAX_COUNT,
           routing: Routing = DEFAULT_ROUTING) -> tuple[list[Candidate], Candidate | None]:
    """Every candidate looked at, and the cheapest that meets ``target`` (None without prices or
    when none does). Per type, the fewest instances that meet the target are one, else found by
    bisection over the counts (assuming that more instances of a type never keep fewer requests
    warm); a run stops as soon as it has missed the target (:attr:`FleetResult.complete`)."""
    price = (prices.per_hour if prices else {})
    ordered = sorted(shapes, key=lambda s: (s.instance_type not in price, price.get(s.instance_type, 0.0),
                                            s.instance_type))
    requested = sorted(set(requests.targets))
    disk_needed = sum(models[m].disk_bytes for m in requested)
    largest = max((models[m] for m in requested), key=lambda m: m.gpu_bytes, default=None)
    counted = len(requests.times) - bisect.bisect_left(requests.times, requests.warmup_seconds)
    cold_limit = math.floor(counted * (1.0 - target.warm_share) + 1e-9)
    seen: dict[tuple[int, int, int], FleetResult] = {}
    rows: list[Candidate] = []
    best: Candidate | None = None
    for shape in ordered:
        each = price.get(shape.instance_type)
        if largest is not None and largest.gpu_bytes > shape.gpu_bytes:
            rows.append(Candidate(shape.instance_type, 0, "does-not-fit", shape.gpu_bytes, reasons=[
                f"{largest.name} needs {largest.gpu_bytes} bytes of GPU memory; {shape.instance_type} has "
                f"{shape.gpu_bytes} usable"]))
            continue
        high = max_count
        if best is not None and best.cost_per_hour is not None and each is not None:
            high = min(max_count, math.ceil(best.cost_per_hour / each - 1e-9) - 1) if each > 0 else max_count
            if high < 1:
                rows.append(Candidate(shape.instance_type, 1, "skipped", shape.gpu_bytes, each, reasons=[
                    f"costs at least the cheapest fleet found ({best.count} x {best.instance_type})"]))
                continue
        tried: dict[int, Candidate] = {}

        def attempt(count: int, shape: InstanceShape = shape, each: float | None = each,
                    tried: dict[int, Candidate] = tried) -> Candidate:
            key = (int(shape.gpu_bytes * (1.0 - target.gpu_slack)), min(shape.disk_bytes, disk_needed), count)
            if key not in seen:
                seen[key] = simulate_fleet(models, shape, count, requests, routing, slack=target.gpu_slack,
                                           stop_after_cold=cold_limit)
            result = seen[key]
            if result.instance_type != shape.instance_type:
                result = replace(result, instance_type=shape.instance_type)
            row = Candidate(shape.instance_type, count, "simulated", shape.gpu_bytes,
                            each * count if each is not None else None, result)
            row.reasons = judge(result, target)
            row.meets_target = not row.reasons
            tried[count] = row
            return row

        low = 2
        if attempt(1).meets_target:
            high = 1
        elif high == 1 or not attempt(high).meets_target:
            high = 0
        while low < high:  # the fewest that meet it, in [low, high]
            middle = (low + high) // 2
            if attempt(middle).meets_target:
                high = middle
            else:
                low = middle + 1
        if high:
            found = tried[high]
            if found.cost_per_hour is not None and (best is None or best.cost_per_hour is None
                                                    or found.cost_per_hour < best.cost_per_hour):
                best = found
        rows += [tried[count] for count in sorted(tried)]
    return rows, best
