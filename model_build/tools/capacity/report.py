"""The capacity plan as a person and a machine read it: text, JSON (schema ``triton-mme/capacity/1``,
documented by ``capacity.schema.json`` beside this file) and markdown.

Every cost is shown with its price table's date, source and whether it was verified; every
footprint and service time with where it comes from (given, recorded, estimated, measured or
assumed); every assumption about SageMaker's routing that the developer guide leaves open is
listed with the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from triton_mme_cdk.model_build.capacity.fleet import Candidate, Target
from triton_mme_cdk.model_build.capacity.inputs import TargetFootprint
from triton_mme_cdk.model_build.capacity.prices import PriceTable
from triton_mme_cdk.model_build.capacity.simulate import ModelLoad, Routing

CAPACITY_SCHEMA = "triton-mme/capacity/1"
MIB = 1024**2


@dataclass
class CapacityReport:
    """Everything ``capacity`` found, for every output format."""

    source: str
    traffic: str
    rates: dict[str, float]
    models: Sequence[ModelLoad]
    footprints: dict[str, TargetFootprint]
    service_sources: dict[str, str]
    target: Target
    routing: Routing
    seconds: float
    warmup_seconds: float
    seed: int
    requests: int
    candidates: list[Candidate]
    cheapest: Candidate | None
    prices: PriceTable | None
    assumptions: list[str] = field(default_factory=list)

    def verdict(self) -> str:
        met = [c for c in self.candidates if c.meets_target]
        if self.cheapest is not None:
            c = self.cheapest
            assert self.prices is not None and c.cost_per_hour is not None
            return (f"cheapest fleet that meets the target: {c.count} x {c.instance_type} at "
                    f"{c.cost_per_hour:.2f} {self.prices.label()}")
        if met and self.prices is None:
            return ("fleets that meet the target (no --prices: none is called cheapest): "
                    + ", ".join(f"{c.count} x {c.instance_type}" for c in met))
        if met:
            return ("fleets that meet the target, none of them priced in the table: "
                    + ", ".join(f"{c.count} x {c.instance_type}" for c in met))
        return "no candidate fleet meets the target; raise --max-count, or look at the reasons of each row"

    # -----------------------------------------------------------------------------------------
    # JSON
    # -----------------------------------------------------------------------------------------

    def as_json(self) -> dict[str, Any]:
        cheapest = self.cheapest
        return {
            "schema": CAPACITY_SCHEMA,
            "source": self.source,
            "traffic": {"profile": self.traffic, "total_rate": sum(self.rates.values()),
                        "seconds": self.seconds, "warmup_seconds": self.warmup_seconds, "seed": self.seed,
                        "requests": self.requests},
            "routing": {"spill_after_seconds": self.routing.spill_after_seconds,
                        "invoke_timeout_seconds": self.routing.invoke_timeout_seconds},
            "target": {"warm_share": self.target.warm_share, "gpu_slack": self.target.gpu_slack},
            "prices": self.prices.as_json() if self.prices else None,
            "models": [self._model(m) for m in self.models],
            "candidates": [c.as_json() for c in self.candidates],
            "cheapest": None if cheapest is None else {"instance_type": cheapest.instance_type,
                                                       "count": cheapest.count,
                                                       "cost_per_hour": cheapest.cost_per_hour},
            "verdict": self.verdict(),
            "assumptions": list(self.assumptions),
        }

    def _model(self, model: ModelLoad) -> dict[str, Any]:
        footprint = self.footprints[model.name]
        return {"name": model.name, "rate": self.rates.get(model.name, 0.0), "gpu_bytes": model.gpu_bytes,
                "disk_bytes": model.disk_bytes, "load_seconds": model.load_seconds,
                "fetch_seconds": model.fetch_seconds, "footprint_source": footprint.source,
                "footprint_note": footprint.note, "service_ms": model.service_seconds * 1000.0,
                "service_source": self.service_sources.get(model.name, "")}

    # -----------------------------------------------------------------------------------------
    # Text and markdown
    # -----------------------------------------------------------------------------------------

    def _head(self) -> list[str]:
        sources = sorted({f.source for f in self.footprints.values()})
        estimated = " (ESTIMATES)" if "estimated" in sources else ""
        return [
            f"capacity plan for {self.source}: {len(self.models)} target models, footprints "
            f"{', '.join(sources)}{estimated}",
            f"traffic: {self.traffic}; {self.requests} requests over {self.seconds:g} s (seed {self.seed}), "
            f"the first {self.warmup_seconds:g} s not counted",
            f"target: {self.target.text()}",
            "costs: " + (self.prices.label() if self.prices else "no price table given (--prices FILE)"),
        ]

    def _cells(self, c: Candidate) -> list[str]:
        r = c.result
        cost = f"{c.cost_per_hour:.2f}" if c.cost_per_hour is not None else "-"
        if r is None or r.requests == 0:
            return [c.instance_type, str(c.count) if c.count else "-", c.status, "-", "-", "-", "-", "-", "-", cost,
                    "; ".join(c.reasons)]
        resident = f"{len(r.resident_models)}/{len(self.models)}"
        peak = f"{r.peak_gpu_bytes / c.usable_gpu_bytes:.0%}" if c.usable_gpu_bytes else "-"
        verdict = "meets" if c.meets_target else "; ".join(c.reasons)
        return [c.instance_type, str(c.count), c.status, f"{r.warm_share:.2%}", f"{r.loads_per_minute or 0.0:.2f}",
                f"{r.waited_share:.2%}", f"{r.wait_p99_seconds:.2f}", resident, peak, cost, verdict]

    HEADERS = ("instance type", "count", "status", "warm", "loads/min", "waited", "p99 wait s", "resident",
               "peak GPU", "cost/h", "target")

    def text(self) -> str:
        rows = [list(self.HEADERS), *(self._cells(c) for c in self.candidates)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self.HEADERS) - 1)]
        lines = [*self._head(), ""]
        for row in rows:
            lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
        lines += ["", self.verdict()]
        lines += ["assumptions:", *(f"  - {a}" for a in self.assumptions)]
        return "\n".join(lines) + "\n"

    def markdown(self) -> str:
        lines = ["### Capacity plan", "", *(f"- {_md(line)}" for line in self._head()), "",
                 "| " + " | ".join(self.HEADERS) + " |", "|" + " --- |" * len(self.HEADERS)]
        lines += ["| " + " | ".join(_md(cell) for cell in self._cells(c)) + " |" for c in self.candidates]
        lines += ["", f"**{_md(self.verdict())}**", "", "<details><summary>Assumptions</summary>", "",
                  *(f"- {_md(a)}" for a in self.assumptions), "", "</details>"]
        return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
