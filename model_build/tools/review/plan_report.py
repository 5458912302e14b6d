"""The plan as a person and a machine read it: text, JSON (schema ``triton-mme/plan/2``) and markdown.

The JSON is documented by ``plan.schema.json`` beside this file (JSON Schema, draft 2020-12) and in
docs/pipelines.md; a field is never removed or retyped within a schema version. The markdown is one
pull-request comment: the verdict first, then who can do what (its headline, then one security
change per line), the counts, the findings and the model lists, each list folded in a
``<details>`` block. It always fits GitHub's 65,536-character comment limit:

    Every list is shown whole while the comment fits MARKDOWN_BUDGET characters. Otherwise each
    list keeps its first K items, K the largest number for which the comment fits (the same K for
    every list), and says how many it leaves out; the JSON plan holds every item.

Its first line is a hidden marker naming the stack (``<!-- triton-mme-plan stack=NAME -->``), so a
CI finds its one comment and updates it on every push (``python -m model_build pr-comment``).

Every output carries the plan's **digest** (:func:`plan_digest`): ``sha256:`` and the hash of the
canonical JSON of the verdict and every finding, nothing that changes with time. An approval names
it (``pr-gate``), so a push that changes the plan voids the approval and one that leaves it the
same keeps it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from triton_mme_cdk.model_build.release.routes import ModelPlan
from triton_mme_cdk.model_build.tools.review.plan_verdict import Finding, Verdict

#: plan/2 (issue 49): the verdict ``security-changed``, the ``security`` object, each finding's
#: ``access`` and ``changes``.
PLAN_SCHEMA = "triton-mme/plan/2"
#: GitHub's limit on a comment's body, and what the plan allows itself (room for a CI's own lines).
GITHUB_COMMENT_LIMIT = 65_536
MARKDOWN_BUDGET = 60_000

#: ``--detailed-exitcode`` values.
EXIT_NO_CHANGE, EXIT_CHANGES, EXIT_NEEDS_REVIEW = 0, 3, 4
#: The overall verdicts in their order of precedence (the first that holds leads; every finding is
#: listed whichever leads): data at risk, then the fleet replaced or unknown, then security
#: changed, then the fleet created or updated in place and models only, then no change. The exit
#: code of each; ``security-changed`` exits 4 when access widens or a change cannot be classified,
#: and 3 (:data:`EXIT_CHANGES`) when it only narrows.
VERDICT_EXIT: dict[str, int] = {
    "data-at-risk": EXIT_NEEDS_REVIEW,
    "fleet-unknown": EXIT_NEEDS_REVIEW,
    "fleet-replaced": EXIT_NEEDS_REVIEW,
    "security-changed": EXIT_NEEDS_REVIEW,
    "fleet-created": EXIT_CHANGES,
    "fleet-updated": EXIT_CHANGES,
    "models-only": EXIT_CHANGES,
    "no-change": EXIT_NO_CHANGE,
}


#: What :func:`plan_digest` hashes is versioned by this name (it is in the hashed text).
DIGEST_SCHEMA = "triton-mme/plan-digest/1"
DIGEST_PATTERN = r"sha256:[0-9a-f]{64}"


def plan_digest(plan: dict[str, Any]) -> str:
    """``sha256:<64 hex>`` of what an approval approves, from the plan's JSON (:meth:`PlanReport.as_json`):
    the stack, the verdict and exit code, the fleet's, data's and security's verdicts, and every
    finding (fleet, data, security and other; each in full: resource, impact, reasons, access,
    changes), in a canonical order. Canonical JSON: keys sorted, no spaces, UTF-8. Not hashed:
    the models' lists (they change no exit code), the summary and texts, the live release and the
    file names compared. Anyone can recompute it from ``plan.json``."""
    findings = [finding for part in ("fleet", "data", "security", "other") for finding in plan[part]["findings"]]
    subject = {"digest": DIGEST_SCHEMA, "stack": plan["stack"], "verdict": plan["verdict"],
               "exit_code": plan["exit_code"], "fleet": plan["fleet"]["verdict"], "data": plan["data"]["verdict"],
               "security": plan["security"]["verdict"], "findings": sorted(findings, key=_canonical)}
    return "sha256:" + hashlib.sha256(_canonical(subject).encode("utf-8")).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def marker(stack: str) -> str:
    """The hidden first line of the markdown: how a CI finds its comment again."""
    return f"<!-- triton-mme-plan stack={stack} -->"


@dataclass
class PlanReport:
    """Everything ``plan`` found, for every output format."""

    stack: str
    models: ModelPlan
    verdict: Verdict
    routes_where: str
    #: Why the models were not compared ("" when they were).
    models_note: str = ""
    #: Where each added or updated model builds, with its estimate (model name -> text).
    builds_on: dict[str, str] = field(default_factory=dict)
    #: The capacity line (:class:`~model_build.tools.review.plan_capacity.CapacityLine`); None without a manifest.
    capacity: Any = None
    #: What is served now: the live routes' objects checked in ``served/`` (one line per broken
    #: invariant, ``model_build.release.invariants``), and what was checked or why not ("": no live routes).
    served_problems: list[str] = field(default_factory=list)
    served_note: str = ""

    @property
    def overall(self) -> str:
        """The leading verdict, in the order of :data:`VERDICT_EXIT`."""
        verdict = self.verdict
        if verdict.data == "at-risk":
            return "data-at-risk"
        if verdict.fleet in ("unknown", "replaced"):
            return f"fleet-{verdict.fleet}"
        if verdict.security != "unchanged":
            return "security-changed"
        if verdict.fleet in ("created", "updated"):
            return f"fleet-{verdict.fleet}"
        return "models-only" if self.models.models_change else "no-change"

    @property
    def exit_code(self) -> int:
        if self.overall == "security-changed" and self.verdict.security == "narrows":
            return EXIT_CHANGES  # reported; nobody needs to look
        return VERDICT_EXIT[self.overall]

    def summary(self) -> str:
        """One line: the models' counts and the fleet's verdict (and the data's when at risk)."""
        line = f"{self.models.summary()}; {self.verdict.fleet_text()}"
        if self.verdict.data == "at-risk":
            line += f"; {self.verdict.data_text()}"
        if self.verdict.of("security-changed"):
            line += f"; {self.verdict.security_text()}"
        return line

    # -----------------------------------------------------------------------------------------
    # JSON
    # -----------------------------------------------------------------------------------------

    def as_json(self) -> dict[str, Any]:
        models = self.models
        verdict = self.verdict
        plan = {
            "schema": PLAN_SCHEMA,
            "stack": self.stack,
            "verdict": self.overall,
            "exit_code": self.exit_code,
            "summary": self.summary(),
            "live_release": models.live_release,
            "compared_with": {"routes": self.routes_where, "deployed": verdict.compared_with},
            "models": {
                "note": self.models_note,
                "builds_on": dict(self.builds_on),
                "counts": {"added": len(models.added), "updated": len(models.updated),
                           "removed": len(models.removed), "unchanged": len(models.unchanged)},
                "added": [{"name": item.logical_name, "entry_sha256": item.entry_sha256,
                           "target": None, "sha256": None, "size": None} for item in models.added],
                "updated": [{"name": item.route.logical_name, "entry_sha256": item.entry_sha256,
                             "reason": item.reason, "old": _route(item.route)} for item in models.updated],
                "removed": [{"name": route.logical_name, **_route(route)} for route in models.removed],
                "unchanged": [{"name": route.logical_name, **_route(route)} for route in models.unchanged],
            },
            "fleet": {"verdict": verdict.fleet, "text": verdict.fleet_text(), "rollout": verdict.rollout or None,
                      "unknown_reason": verdict.unknown_reason or None,
                      "findings": [f.as_json() for f in verdict.findings if f.kind.startswith("fleet-")]},
            "data": {"verdict": verdict.data, "text": verdict.data_text(),
                     "findings": [f.as_json() for f in verdict.of("data-at-risk")]},
            "security": {"verdict": verdict.security, "text": verdict.security_text(),
                         "compared": ("nothing" if verdict.fleet == "unknown" else "template" if verdict.others_compared
                                      else "record"),
                         "findings": [f.as_json() for f in verdict.of("security-changed")]},
            "other": {"compared": verdict.others_compared,
                      "findings": [f.as_json() for f in verdict.of("other")]},
            "capacity": self.capacity.as_json() if self.capacity is not None else None,
        }
        if self.served_note:  # the bucket's state now, not the change: outside the digest
            plan["served"] = {"note": self.served_note, "problems": list(self.served_problems)}
        plan["digest"] = plan_digest(plan)
        return plan

    @property
    def digest(self) -> str:
        """:func:`plan_digest` of this plan."""
        return str(self.as_json()["digest"])

    def _where(self, model: str) -> str:
        where = self.builds_on.get(model)
        return f"; {where}" if where else ""

    # -----------------------------------------------------------------------------------------
    # Text
    # -----------------------------------------------------------------------------------------

    def text(self, *, verbose: bool = False) -> str:
        models = self.models
        where = f"release {models.live_release}" if models.live_release else "no live routes (first deploy)"
        lines = [f"plan against {where} ({self.routes_where}); deployed state: {self.verdict.compared_with}"]
        if self.models_note:
            lines.append(f"  models: {self.models_note}")
        lines += [f"  + {item.logical_name}  (added){self._where(item.logical_name)}" for item in models.added]
        lines += [f"  ~ {item.route.logical_name}  {item.route.target_model} -> new build ({item.reason})"
                  f"{self._where(item.route.logical_name)}" for item in models.updated]
        lines += [f"  - {route.logical_name}  {route.target_model}  (unrouted; kept for the retention window)"
                  for route in models.removed]
        if verbose:
            lines += [f"    {route.logical_name}  {route.target_model}" for route in models.unchanged]
        # One security change per line (what widens first), then the other findings.
        lines += [f"  ! security-changed: {finding.name}: {change.line()}" for finding, change in
                  self.verdict.security_lines()]
        for finding in self.verdict.findings:
            if finding.kind != "security-changed" and (finding.kind != "other" or verbose):
                lines.append(f"  ! {finding.kind}: {finding.line()}")
        others = self.verdict.of("other")
        if others and not verbose:
            lines.append(f"  ({len(others)} other resources change; -v lists them)")
        lines.append(self.summary())
        if self.verdict.data != "at-risk":
            lines.append(f"data: {self.verdict.data_text()}")
        lines.append(f"security: {self.verdict.security_text()}")
        lines += [f"  ! served now: {problem}" for problem in self.served_problems]
        if self.served_note:
            lines.append(f"served: {self.served_note}")
        if self.capacity is not None:
            lines.append(self.capacity.text())
        lines.append(f"digest: {self.digest}")
        lines.append(f"verdict: {self.overall} (exit {self.exit_code} with --detailed-exitcode)")
        return "\n".join(lines)

    # -----------------------------------------------------------------------------------------
    # Markdown: one pull-request comment
    # -----------------------------------------------------------------------------------------

    def markdown(self, *, budget: int = MARKDOWN_BUDGET) -> str:
        digest = self.digest
        full = self._markdown(None, digest)
        if len(full) <= budget:
            return full
        low, high = 0, max(self._longest(), 1)
        while low < high:  # the largest K that fits
            middle = (low + high + 1) // 2
            if len(self._markdown(middle, digest)) <= budget:
                low = middle
            else:
                high = middle - 1
        return self._markdown(low, digest)

    def _longest(self) -> int:
        models = self.models
        return max(len(models.added), len(models.updated), len(models.removed), len(models.unchanged),
                   len(self.verdict.findings), len(self.verdict.security_lines()))

    def _markdown(self, keep: int | None, digest: str) -> str:
        models, verdict = self.models, self.verdict
        headline = {
            "data-at-risk": "⛔ data at risk", "fleet-unknown": "⚠️ fleet unknown", "fleet-replaced": "⚠️ fleet replaced",
            "fleet-created": "🆕 fleet created", "fleet-updated": "🔧 fleet updated in place",
            "models-only": "✅ models only", "no-change": "✅ no change",
            "security-changed": "🔐 security changed" + (" (narrows only)" if verdict.security == "narrows" else ""),
        }[self.overall]
        parts = [
            marker(self.stack),
            f"### Triton MME plan for `{self.stack}`: {headline} (exit {self.exit_code})",
            "",
        ]
        security = verdict.security_lines()
        if security:  # first, after the headline: who can do what, one change per line
            parts += [f"**Security:** {_md(verdict.security_text())}", "", *_cut(security, keep, _change)]
        else:
            parts.append(f"**Security:** {_md(verdict.security_text())}")
        parts += [
            "",
            f"**Fleet:** {_md(verdict.fleet_text())}",
            "",
            f"**Data:** {_md(verdict.data_text())}",
            "",
            *([f"**Capacity:** {_md(self.capacity.body())}", ""]
              if self.capacity is not None else []),
            *([f"**Served now:** {_md(self.served_note)}", "", *_cut(self.served_problems, keep, lambda line: f"- {_md(line)}"), ""]
              if self.served_problems else []),
            "| models | added | updated | removed | unchanged |",
            "| --- | ---: | ---: | ---: | ---: |",
            f"| {len(models.added) + len(models.updated) + len(models.removed) + len(models.unchanged)} "
            f"| {len(models.added)} | {len(models.updated)} | {len(models.removed)} | {len(models.unchanged)} |",
            "",
            f"Live release: `{models.live_release or 'none'}` ({_md(self.routes_where)}); deployed state compared: "
            f"{_md(verdict.compared_with)}." + (f" Models: {_md(self.models_note)}." if self.models_note else ""),
        ]
        findings = [f for f in verdict.findings if f.kind not in ("other", "security-changed")]
        if findings:
            parts += ["", *_listed("Resources replaced, deleted or updated", findings, keep, _finding)]
        others = verdict.of("other")
        if others:
            parts += ["", *_folded(f"Other resources that change ({len(others)})", others, keep, _finding)]
        parts += _folded(f"Added ({len(models.added)})", models.added, keep,
                         lambda item: f"- `{item.logical_name}`{_md(self._where(item.logical_name))}")
        parts += _folded(f"Updated ({len(models.updated)})", models.updated, keep,
                         lambda item: f"- `{item.route.logical_name}`: `{item.route.target_model}` -> new build "
                                      f"({item.reason}){_md(self._where(item.route.logical_name))}")
        parts += _folded(f"Removed ({len(models.removed)})", models.removed, keep,
                         lambda route: f"- `{route.logical_name}`: `{route.target_model}` (unrouted, kept for "
                                       "the retention window)")
        parts += _folded(f"Unchanged ({len(models.unchanged)})", models.unchanged, keep,
                         lambda route: f"- `{route.logical_name}`: `{route.target_model}`")
        parts += ["", f"Plan digest: `{digest}` (what an approval names: the verdict and every finding)"]
        parts += ["", "<sub>`python -m model_build plan`: exit 0 no change, 3 changes that replace nothing and "
                      "widen no access, 4 data at risk, fleet replaced or unknown, or access widened (or changed in a "
                      "way the plan cannot classify).</sub>"]
        return "\n".join(parts) + "\n"


def _route(route: Any) -> dict[str, Any]:
    return {"target": route.target_model, "sha256": route.sha256, "size": route.size}


def _finding(finding: Finding) -> str:
    access = f" ({finding.access})" if finding.access else ""
    return f"- **{finding.kind}**{access}: {_md(finding.line())}"


def _change(line: tuple[Finding, Any]) -> str:
    finding, change = line
    return f"- **{change.access}**: {_md(finding.name)}: {_md(change.path)} {_md(change.text)}"


def _md(text: str) -> str:
    """Plain text in markdown: no HTML, no table breaks."""
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def _cut(items: Sequence[Any], keep: int | None, render: Callable[[Any], str]) -> list[str]:
    shown = items if keep is None else items[:keep]
    lines = [render(item) for item in shown]
    if len(shown) < len(items):
        lines.append(f"- … and {len(items) - len(shown)} more (the JSON plan lists every one)")
    return lines


def _listed(title: str, items: Sequence[Any], keep: int | None, render: Callable[[Any], str]) -> list[str]:
    return [f"**{title}:**", "", *_cut(items, keep, render)]


def _folded(title: str, items: Sequence[Any], keep: int | None, render: Callable[[Any], str]) -> list[str]:
    if not items:
        return []
    return ["", f"<details><summary>{title}</summary>", "", *_cut(items, keep, render), "", "</details>"]
