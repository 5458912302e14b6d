"""``plan``'s capacity line: what the change does to the resident set and the predicted warm share
at the configured fleet.

The fleet is the template's: the endpoint config's instance type and initial instance count, and
the model's ``SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT`` where set. Both model sets are simulated
under one seeded request stream (:mod:`~model_build.capacity.simulate`): the live set (unchanged,
updated and removed models) and the set the change serves (unchanged, updated and added). The
traffic is ``--traffic FILE`` (as ``capacity`` reads it) or the default profile over the union,
manifest order first, the removed models after. The footprints are synth's estimates from the
manifest, so an updated model is sized as its new entry, and a removed model cannot be sized: the
line then says the live set is unknown rather than guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.capacity.footprint import Coefficients
from triton_mme_cdk.model_build.capacity.inputs import DEFAULT_SERVICE_MS, from_footprint, instance_shapes
from triton_mme_cdk.model_build.capacity.simulate import FleetResult, ModelLoad, simulate
from triton_mme_cdk.model_build.capacity.traffic import draw_requests, read_profile
from triton_mme_cdk.model_build.errors import CapacityInputError

#: What the line simulates: an hour of traffic, the first five minutes not counted, seed 0.
SECONDS, WARMUP_SECONDS, SEED = 3600.0, 300.0, 0


@dataclass(frozen=True)
class CapacityLine:
    """The capacity line of a plan; ``before``/``after`` None where not computed (``why`` says)."""

    fleet: str
    traffic: str
    before: FleetResult | None
    after: FleetResult | None
    total_before: int
    total_after: int
    why: str = ""

    def text(self) -> str:
        return f"capacity {self.body()}"

    def body(self) -> str:
        """The line without its leading word (the markdown's label says it)."""
        if self.after is None:
            return f"not predicted ({self.why})"
        after = _state(self.after, self.total_after)
        if self.before is not None:
            before = _state(self.before, self.total_before)
        else:
            before = "nothing live" if self.total_before == 0 else f"unknown ({self.why})"
        return f"at {self.fleet} ({self.traffic}; footprints ESTIMATED from the manifest): {before} -> {after}"

    def as_json(self) -> dict[str, Any]:
        def side(result: FleetResult | None, total: int) -> dict[str, Any] | None:
            if result is None:
                return None
            return {"resident_models": len(result.resident_models), "models": total,
                    "warm_share": result.warm_share, "loads_per_minute": result.loads_per_minute}

        return {"fleet": self.fleet, "traffic": self.traffic, "text": self.text(), "why": self.why or None,
                "before": side(self.before, self.total_before), "after": side(self.after, self.total_after)}


def _state(result: FleetResult, total: int) -> str:
    share = result.warm_share
    warm = f"{share:.1%}" if share is not None else "no requests"
    return f"resident {len(result.resident_models)}/{total} models, {warm} warm"


def fleet_of(template: dict[str, Any], scope: dict[str, Any] | None = None) -> tuple[str, int, float | None] | None:
    """(instance type, initial count, load GPU limit) of the template's endpoint config; None when
    there is not exactly one (or it is not literal)."""
    resources = (scope or {}).get("resources") or template.get("Resources") or {}
    configs = [r for r in resources.values() if isinstance(r, dict) and r.get("Type") == "AWS::SageMaker::EndpointConfig"]
    if len(configs) != 1:
        return None
    variants = (configs[0].get("Properties") or {}).get("ProductionVariants") or []
    if len(variants) != 1:
        return None
    kind, count = variants[0].get("InstanceType"), variants[0].get("InitialInstanceCount", 1)
    if not isinstance(kind, str) or not isinstance(count, int):
        return None
    from triton_mme_cdk.model_build.capacity.fit import load_gpu_limit

    limit = None
    for resource in resources.values():
        if isinstance(resource, dict) and resource.get("Type") == "AWS::SageMaker::Model":
            environment = ((resource.get("Properties") or {}).get("PrimaryContainer") or {}).get("Environment") or {}
            limit = load_gpu_limit({k: str(v) for k, v in environment.items()})[0]
    return kind, count, limit


def capacity_line(manifest: Any, base_dir: Path, models: Any, template: dict[str, Any], *,
                  scope: dict[str, Any] | None = None, traffic_path: Path | None = None) -> CapacityLine:
    """The line for ``models`` (a :class:`~model_build.release.routes.ModelPlan`) of ``manifest``."""
    from triton_mme_cdk.model_build.capacity.sizing import synth_footprints

    fleet = fleet_of(template, scope)
    if fleet is None:
        return CapacityLine("", "", None, None, 0, 0, "the template has no single endpoint config with a literal "
                                                      "instance type and count")
    kind, count, limit = fleet
    shown = f"{count} x {kind}"
    coefficients = Coefficients.read()
    try:
        shape = instance_shapes([kind], coefficients, load_gpu_limit=limit)[0]
    except CapacityInputError:
        return CapacityLine(shown, "", None, None, 0, 0, f"{kind} is not in the instance table")
    removed = [route.logical_name for route in models.removed]
    after_names = [target for target, _ in manifest.targets()]
    before_names = [*(r.logical_name for r in models.unchanged), *(u.route.logical_name for u in models.updated),
                    *removed]
    groups = {spec.name: spec.target_names() for spec in manifest.models}
    union_groups = {**groups, **{name: [name] for name in removed}}
    traffic = read_profile(traffic_path, union_groups)
    loads: dict[str, ModelLoad] = {}
    for footprint in synth_footprints(manifest.models, base_dir, coefficients):
        simulated = from_footprint(footprint, coefficients)
        if simulated is not None:
            ms = traffic.service_ms.get(footprint.target, DEFAULT_SERVICE_MS)
            loads[footprint.target] = ModelLoad(footprint.target, simulated.gpu_bytes, simulated.disk_bytes,
                                                simulated.load_seconds, simulated.fetch_seconds, ms / 1000.0)
    unsized = [name for name in after_names if name not in loads]
    if unsized:
        return CapacityLine(shown, traffic.described, None, None, 0, 0,
                            f"{len(unsized)} models cannot be sized before a build ({', '.join(unsized[:3])})")
    after = _run(loads, after_names, traffic.rates, shape, count)
    missing = [name for name in before_names if name not in loads]
    before = None if missing or not before_names else _run(loads, before_names, traffic.rates, shape, count)
    why = f"{len(missing)} removed models have no footprint in the manifest ({', '.join(missing[:3])})" if missing else ""
    return CapacityLine(shown, traffic.described, before, after, len(before_names), len(after_names), why)


def _run(loads: dict[str, ModelLoad], names: list[str], rates: dict[str, float], shape: Any, count: int) -> FleetResult:
    ordered = [loads[name] for name in names]
    times, targets = draw_requests([rates.get(name, 0.0) for name in names], seconds=SECONDS, seed=SEED)
    return simulate(ordered, shape, count, times, targets, warmup_seconds=WARMUP_SECONDS)
