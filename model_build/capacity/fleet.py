"""Which fleet to run: every candidate instance type and count simulated under one request stream,
and the cheapest that meets the target.

The target (:class:`Target`) is a warm share (default: at least 99% of requests answered by an
instance that had the model loaded) and a GPU memory slack (default 10%). An LRU cache always
fills, so slack is not "memory left free at the end": each fleet is simulated with only
``1 - slack`` of each instance's usable GPU memory, and meets the target only if it still keeps
the warm share there; the memory it really has is the margin for estimates that come out low.
An instance type whose usable GPU memory is smaller than one model's estimate is reported as not
fitting and never simulated.

The search: instance types in the order of their price (unpriced last), counts from 1 up to
``max_count``, stopping at a type's first count that meets the target; a fleet that costs at
least the cheapest one found so far is reported as skipped, not simulated. Fleets that present
the simulator the same caches (the same GPU memory, the same disk or more than the models need,
the same count) are simulated once.
"""

from __future__ import annotations

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
    #: ``simulated``, ``does-not-fit`` (a model exceeds the usable GPU memory) or ``skipped`` (costs
    #: at least the cheapest fleet found).
    status: str
    usable_gpu_bytes: int
    cost_per_hour: float | None = None
    result: FleetResult | None = None
    meets_target: bool = False
    #: Why it does not meet the target (or does not fit, or was skipped).
    reasons: list[str] = field(default_factory=list)

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
    if result.unfit:
        reasons.append(f"{result.unfit} requests for models that do not fit with {target.gpu_slack:.0%} slack")
    return reasons


def simulate_fleet(models: Sequence[ModelLoad], shape: InstanceShape, count: int, requests: Requests,
                   routing: Routing = DEFAULT_ROUTING, *, slack: float = 0.0) -> FleetResult:
    """One fleet, with ``slack`` of its GPU memory held back."""
    held = replace(shape, gpu_bytes=int(shape.gpu_bytes * (1.0 - slack)))
    return simulate(models, held, count, requests.times, requests.targets,
                    warmup_seconds=requests.warmup_seconds, routing=routing)


def search(models: Sequence[ModelLoad], shapes: Sequence[InstanceShape], requests: Requests, *,
           target: Target = Target(), prices: PriceTable | None = None, max_count: int = DEFAULT_MAX_COUNT,
           routing: Routing = DEFAULT_ROUTING) -> tuple[list[Candidate], Candidate | None]:
    """Every candidate looked at, and the cheapest that meets ``target`` (None without prices or
    when none does)."""
    price = (prices.per_hour if prices else {})
    ordered = sorted(shapes, key=lambda s: (s.instance_type not in price, price.get(s.instance_type, 0.0),
                                            s.instance_type))
    requested = sorted({m for m in requests.targets})
    disk_needed = sum(models[m].disk_bytes for m in requested)
    largest = max((models[m] for m in requested), key=lambda m: m.gpu_bytes, default=None)
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
        for count in range(1, max_count + 1):
            cost = each * count if each is not None else None
            row = Candidate(shape.instance_type, count, "simulated", shape.gpu_bytes, cost)
            if best is not None and cost is not None and best.cost_per_hour is not None \
                    and cost >= best.cost_per_hour:
                row.status = "skipped"
                row.reasons.append(f"costs at least the cheapest fleet found ({best.count} x {best.instance_type})")
                rows.append(row)
                break
            key = (int(shape.gpu_bytes * (1.0 - target.gpu_slack)), min(shape.disk_bytes, disk_needed), count)
            if key not in seen:
                seen[key] = simulate_fleet(models, shape, count, requests, routing, slack=target.gpu_slack)
            result = seen[key]
            if result.instance_type != shape.instance_type:
                result = replace(result, instance_type=shape.instance_type)
            row.result = result
            row.reasons = judge(result, target)
            row.meets_target = not row.reasons
            rows.append(row)
            if row.meets_target:
                if cost is not None and (best is None or best.cost_per_hour is None or cost < best.cost_per_hour):
                    best = row
                break
    return rows, best
