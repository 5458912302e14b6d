"""The fleet as caches: each instance's GPU memory and disk hold models, least recently used first out.

What it follows, from the SageMaker developer guide, "How multi-model endpoints work"
(docs.aws.amazon.com/sagemaker/latest/dg/how-multi-mode-endpoints-work.html):

- a request for a model goes to an instance; if the model is not on that instance's storage
  volume it is downloaded there, then loaded into the container's memory;
- SageMaker "continues to route requests for a model to the instance where the model is already
  loaded", but when the model "receives many invocation requests, and there are additional
  instances", some requests go to another instance, which downloads and loads it too;
- when memory runs short to load another model it "unloads unused models"; unloaded models stay on
  the volume and load again without a download; when the volume fills, unused models are deleted
  from it;
- an invocation answers within 60 s; a load still running then gives ``ModelNotReadyException``
  while the load goes on (developer guide, "Invoke a multi-model endpoint").

What the guide does not say, and this simulator assumes (each is a parameter, docs/capacity.md
lists them): "unused" is least recently used (the order Triton's SageMaker layer and this project's
local endpoint evict in); "many invocation requests" is a backlog: an instance's queued work,
each request adding its service time, and a request spills when every instance holding its model
has more than :attr:`Routing.spill_after_seconds` of it queued and some other instance has less; a
request for a model loaded nowhere goes to the instance with the least queued work, ties broken
by a fixed order per model (so that cold models spread over the fleet and the run repeats).

Deterministic: no clock and no randomness here; the requests are given (``traffic`` draws them
from a seed). Standard library only, and never imported by the build: editing it changes no key.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: SageMaker's limit on one invocation (developer guide, "Invoke a multi-model endpoint").
INVOKE_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class ModelLoad:
    """One target model as the fleet sees it."""

    name: str
    #: GPU memory it holds when loaded.
    gpu_bytes: int
    #: Bytes on the instance's volume (tarball plus unpacked).
    disk_bytes: int
    #: From the volume into GPU memory.
    load_seconds: float
    #: From S3 onto the volume (download and unpack), when it is not there.
    fetch_seconds: float = 0.0
    #: GPU time one request takes (what a spill is decided on).
    service_seconds: float = 0.005


@dataclass(frozen=True)
class InstanceShape:
    """What one instance offers the models."""

    instance_type: str
    #: GPU memory models may use (after Triton's load limit and the runtime's own overhead).
    gpu_bytes: int
    #: The volume's bytes for model artifacts.
    disk_bytes: int


@dataclass(frozen=True)
class Routing:
    """The assumptions about SageMaker's routing the guide leaves open (module docstring)."""

    #: Queued work (seconds) above which a request for a loaded model goes to another instance.
    spill_after_seconds: float = 0.1
    #: A wait longer than this is a ``ModelNotReadyException`` (the request is not answered).
    invoke_timeout_seconds: float = INVOKE_TIMEOUT_SECONDS


#: The routing the module docstring describes, with its default thresholds.
DEFAULT_ROUTING = Routing()


@dataclass
class FleetResult:
    """What one simulated fleet did with the requests after the warm-up."""

    instance_type: str
    count: int
    #: Requests counted (those at or after the warm-up).
    requests: int
    #: Answered by an instance that had the model loaded.
    warm: int
    #: Loads into GPU memory (counted after the warm-up).
    loads: int
    #: Downloads onto a volume (counted after the warm-up).
    downloads: int
    #: Requests that waited for a load (theirs or one already running).
    waited: int
    #: Requests whose wait passed the invoke limit (``ModelNotReadyException``).
    not_ready: int
    #: Requests for a model larger than an instance's GPU memory (never answered).
    unfit: int
    #: Seconds counted (from the warm-up to the last request).
    seconds: float
    #: The waits for a load, in seconds (only of requests that waited).
    waits: list[float] = field(default_factory=list, repr=False)
    #: The models loaded on each instance at the end, most recently used last.
    resident: list[list[str]] = field(default_factory=list)
    #: GPU bytes loaded on each instance at the end, and the most ever loaded on any.
    resident_bytes: list[int] = field(default_factory=list)
    peak_gpu_bytes: int = 0
    #: Requests a busy instance sent to another one.
    spilled: int = 0
    #: GPU seconds of the counted requests (their service times).
    busy_seconds: float = 0.0
    #: False when the run stopped early (``stop_after_cold``): the counts cover the requests up to there.
    complete: bool = True

    @property
    def warm_share(self) -> float | None:
        return self.warm / self.requests if self.requests else None

    @property
    def waited_share(self) -> float | None:
        return self.waited / self.requests if self.requests else None

    @property
    def loads_per_minute(self) -> float | None:
        return self.loads * 60.0 / self.seconds if self.seconds > 0 else None

    @property
    def busy_share(self) -> float | None:
        """The counted requests' GPU time over the fleet's time: above 1 the queues grow without bound."""
        return self.busy_seconds / (self.seconds * self.count) if self.seconds > 0 else None

    @property
    def wait_p99_seconds(self) -> float:
        """The 99th percentile of the wait of the requests that waited (nearest rank); 0 without any."""
        return percentile(self.waits, 0.99)

    @property
    def resident_models(self) -> list[str]:
        """Every model loaded somewhere at the end, sorted."""
        return sorted({name for names in self.resident for name in names})


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class _Instance:
    __slots__ = ("busy_until", "disk", "disk_used", "gpu", "gpu_used")

    def __init__(self) -> None:
        #: model index -> the time its load ends (most recently used last).
        self.gpu: OrderedDict[int, float] = OrderedDict()
        self.gpu_used = 0
        self.disk: OrderedDict[int, None] = OrderedDict()
        self.disk_used = 0
        self.busy_until = 0.0


def simulate(models: Sequence[ModelLoad], shape: InstanceShape, count: int, times: Sequence[float],
             targets: Sequence[int], *, warmup_seconds: float = 0.0, routing: Routing = DEFAULT_ROUTING,
             stop_after_cold: int | None = None) -> FleetResult:
    """Run the requests (``times[i]``: seconds, ascending; ``targets[i]``: an index of ``models``)
    through ``count`` instances of ``shape``; the counts start at ``warmup_seconds``. With
    ``stop_after_cold``, the run stops once more counted requests than that were not warm (a search
    that knows the target is missed needs no more; :attr:`FleetResult.complete` is then False)."""
    if count < 1:
        raise ValueError(f"count: got {count}; expected a whole number >= 1")
    if len(times) != len(targets):
        raise ValueError(f"times and targets: {len(times)} and {len(targets)} items; expected as many")
    fleet = [_Instance() for _ in range(count)]
    holders: list[set[int]] = [set() for _ in models]
    gpu_bytes = [m.gpu_bytes for m in models]
    disk_bytes = [m.disk_bytes for m in models]
    load_s = [m.load_seconds for m in models]
    fetch_s = [m.fetch_seconds for m in models]
    service_s = [m.service_seconds for m in models]
    fits = [m.gpu_bytes <= shape.gpu_bytes for m in models]
    gpu_cap, disk_cap = shape.gpu_bytes, shape.disk_bytes
    spill_after, timeout = routing.spill_after_seconds, routing.invoke_timeout_seconds
    result = FleetResult(shape.instance_type, count, 0, 0, 0, 0, 0, 0, 0, 0.0)
    waits = result.waits
    peak = 0
    first_counted: float | None = None
    last = 0.0
    cold_limit = len(times) + 1 if stop_after_cold is None else stop_after_cold
    for t, m in zip(times, targets, strict=True):
        counted = t >= warmup_seconds
        if counted:
            if first_counted is None:
                first_counted = t
            last = t
            result.requests += 1
        if not fits[m]:
            if counted:
                result.unfit += 1
                if result.requests - result.warm > cold_limit:
                    result.complete = False
                    break
            continue
        hold = holders[m]
        if hold:
            index = min(hold, key=lambda i: (max(fleet[i].busy_until, t), i)) if len(hold) > 1 else next(iter(hold))
            if fleet[index].busy_until - t > spill_after and len(hold) < count:
                other = _least_busy(fleet, m, hold, t)
                if fleet[other].busy_until < fleet[index].busy_until:
                    index = other
                    if counted:
                        result.spilled += 1
        else:
            index = 0 if count == 1 else _least_busy(fleet, m, hold, t)
        node = fleet[index]
        ready = node.gpu.get(m)
        if ready is not None:
            node.gpu.move_to_end(m)
        else:
            for victim in _make_room(node.gpu, gpu_bytes, gpu_cap - gpu_bytes[m], node, on_disk=False):
                holders[victim].discard(index)
            wait = load_s[m]
            if m in node.disk:
                node.disk.move_to_end(m)
            else:
                wait += fetch_s[m]
                _make_room(node.disk, disk_bytes, disk_cap - disk_bytes[m], node, on_disk=True)
                node.disk[m] = None
                node.disk_used += disk_bytes[m]
                if counted:
                    result.downloads += 1
            ready = t + wait
            node.gpu[m] = ready
            node.gpu_used += gpu_bytes[m]
            if node.gpu_used > peak:
                peak = node.gpu_used
            hold.add(index)
            if counted:
                result.loads += 1
        node.busy_until = (node.busy_until if node.busy_until > t else t) + service_s[m]
        if not counted:
            continue
        result.busy_seconds += service_s[m]
        if ready > t:
            result.waited += 1
            waits.append(ready - t)
            if ready - t > timeout:
                result.not_ready += 1
            if result.requests - result.warm > cold_limit:
                result.complete = False
                break
        else:
            result.warm += 1
    result.seconds = last - first_counted if first_counted is not None else 0.0
    result.resident = [[models[m].name for m in node.gpu] for node in fleet]
    result.resident_bytes = [node.gpu_used for node in fleet]
    result.peak_gpu_bytes = peak
    return result


def _least_busy(fleet: list[_Instance], model: int, skip: set[int], now: float) -> int:
    """The instance with the least work queued at ``now`` not in ``skip``; ties (idle instances
    among them) go to the first in the model's own order (instance ``model mod count`` first), so
    that cold models spread over the fleet."""
    count = len(fleet)
    best, best_busy = -1, math.inf
    for step in range(count):
        index = (model + step) % count
        if index in skip:
            continue
        busy = max(fleet[index].busy_until, now)
        if busy < best_busy:
            best, best_busy = index, busy
    return best


def _make_room(cache: OrderedDict[int, Any], sizes: list[int], room: int, node: _Instance, *,
               on_disk: bool) -> list[int]:
    """Evict least recently used entries until the cache's bytes are at most ``room``; a model
    loaded in GPU memory is in use and stays on the disk. Returns the evicted."""
    used = node.disk_used if on_disk else node.gpu_used
    evicted: list[int] = []
    if used <= room:
        return evicted
    for victim in cache:
        if used <= room:
            break
        if on_disk and victim in node.gpu:
            continue
        used -= sizes[victim]
        evicted.append(victim)
    for victim in evicted:
        del cache[victim]
    if on_disk:
        node.disk_used = used
    else:
        node.gpu_used = used
    return evicted
