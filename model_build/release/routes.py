"""The routes document: which ``TargetModel`` each logical model name is served under right now.

Why it exists: on a multi-model endpoint the model set changes without touching the fleet. The
endpoint's ``ModelDataUrl`` is one fixed prefix for the life of the stack; a model is added by
placing its tarball there, updated by placing the new build under a new name, removed by no
longer calling it. What changes per release is therefore not the fleet but this small document,
published at a fixed key outside the served prefix (``<prefix>/_routes/routes.json``, a stack
output). Smoke tests, the demo, the benchmarks and clients (``triton_mme_client``) read it to
turn a logical name (``minilm-l6``, ``bert-3``) into the current ``TargetModel``.

The format itself (:class:`Route`, :class:`Routes`, the parser and :func:`target_problem`) is
defined once, in the client distribution's :mod:`triton_mme_client.routes`, and imported here;
this module adds what only the build and the stack need.

The document also keeps, for each served object no route uses any more, when it was unrouted
(``unrouted``): such an object stays for the retention window so that a rollback can route to it
again with no upload, then the activation deletes it (:mod:`model_build.release.serving`). And it keeps
the deployed record of the last deploy (:mod:`model_build.release.deployed`), so that ``plan`` can
say whether a change replaces the fleet or puts data at risk.

This module is pure (no S3, no torch): the deployed record's check, retention, and the model plan
between two route sets.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_client import routes as routes_format
from triton_mme_client.routes import (
    MAX_ROUTES_BYTES,
    ROUTES_SCHEMA,
    SERVED_HASH_CHARS,
    Route,
    Routes,
    Unrouted,
    served_name,
    target_problem,
)
from triton_mme_client.signatures import parse_signature

#: What this module gives: the format, re-exported from the client, and its own names.
__all__ = [
    "DEFAULT_RETENTION_DAYS",
    "MAX_ROUTES_BYTES",
    "ROUTES_SCHEMA",
    "SERVED_HASH_CHARS",
    "ModelPlan",
    "Planned",
    "Route",
    "Routes",
    "RoutesError",
    "Unrouted",
    "Updated",
    "expired",
    "now_iso",
    "parse_routes",
    "parse_time",
    "plan",
    "plan_manifest",
    "routes_from_index",
    "served_name",
    "target_problem",
]

#: How long an unrouted served object is kept by default (a rollback can route to it again).
DEFAULT_RETENTION_DAYS = 7


class RoutesError(ModelBuildError):
    """A routes document that is missing where one is required, does not parse, is truncated, has
    another schema, belongs to another stack, or names an object whose bytes are not its own."""


def now_iso(clock: Callable[[], float] = time.time) -> str:
    return datetime.fromtimestamp(clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def expired(item: Unrouted, *, retention_days: float, now: str) -> bool:
    """Whether ``item`` has been unrouted for longer than the retention window."""
    return parse_time(now) - parse_time(item.since) >= timedelta(days=retention_days)


def parse_routes(body: bytes, *, where: str, stack: str = "") -> Routes:
    """The routes document in ``body`` (read from ``where``, named in every error), in the format
    :mod:`triton_mme_client.routes` owns, with its deployed record checked.

    ``stack``: the stack that reads it; a document another stack wrote is refused (two stacks
    must never route each other's models). Raises :class:`RoutesError`.
    """
    try:
        routes = routes_format.parse_routes(body, where=where, stack=stack)
    except routes_format.RoutesError as error:
        raise RoutesError(str(error)) from None
    try:
        for item in routes.unrouted.values():
            parse_time(item.since)
    except ValueError as error:
        raise RoutesError(f"routes {where}: malformed (ValueError: {error})") from None
    return dataclasses.replace(routes, deployed=_deployed(routes.deployed, where))


def _deployed(value: Any, where: str) -> dict[str, Any] | None:
    from triton_mme_cdk.model_build.release.deployed import DeployedRecordError, parse_record

    if value is None:
        return None
    try:
        return parse_record(value, where=f"in routes {where}")
    except DeployedRecordError as error:
        raise RoutesError(str(error)) from None


def routes_from_index(index: Mapping[str, Any]) -> dict[str, Route]:
    """The routes a release's index gives: each logical target to its served name."""
    return {
        str(entry["logical_name"]): Route(
            str(entry["logical_name"]), str(entry["target_model"]), str(entry["sha256"]), int(entry["size"]),
            str(entry.get("model_key") or ""), str(entry.get("source_model") or ""),
            str(entry.get("entry_sha256") or ""), str(entry.get("format") or ""),
            parse_signature(entry.get("signature")),
        )
        for entry in index.get("models") or []
    }


# ---------------------------------------------------------------------------------------------
# The plan: what a deploy changes, against the live routes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """One logical target of the manifest, as ``plan`` knows it before any build."""

    logical_name: str
    entry_sha256: str


@dataclass(frozen=True)
class Updated:
    """A routed model whose next build differs: ``route`` is what serves it now."""

    route: Route
    entry_sha256: str
    reason: str


@dataclass
class ModelPlan:
    """Models added, updated, removed and unchanged against the live routes (the fleet's verdict is
    :mod:`model_build.tools.review.plan_verdict`'s)."""

    added: list[Planned] = field(default_factory=list)
    updated: list[Updated] = field(default_factory=list)
    removed: list[Route] = field(default_factory=list)
    unchanged: list[Route] = field(default_factory=list)
    live_release: str | None = None

    @property
    def models_change(self) -> bool:
        return bool(self.added or self.updated or self.removed)

    def summary(self) -> str:
        return (f"models: {len(self.added)} added, {len(self.updated)} updated, {len(self.removed)} removed, "
                f"{len(self.unchanged)} unchanged")


def plan(wanted: list[Planned], live: Routes | None, *, model_code_sha256: str) -> ModelPlan:
    """Compare the manifest's targets with the live routes.

    An entry whose content (``entry_sha256``) and model-building code are the same as when its
    route was written is unchanged (its build, hence its served name, stays); otherwise it is
    updated and gets a new name once built."""
    result = ModelPlan(live_release=live.release_id if live else None)
    current = dict(live.routes) if live else {}
    code_changed = bool(live and live.model_code_sha256 and live.model_code_sha256 != model_code_sha256)
    for item in wanted:
        route = current.pop(item.logical_name, None)
        if route is None:
            result.added.append(item)
        elif route.entry_sha256 != item.entry_sha256:
            result.updated.append(Updated(route, item.entry_sha256, "manifest entry changed"))
        elif code_changed:
            result.updated.append(Updated(route, item.entry_sha256, "build code changed"))
        else:
            result.unchanged.append(route)
    result.removed = sorted(current.values(), key=lambda route: route.logical_name)
    return result


def plan_manifest(manifest: Any, live: Routes | None, *, base_dir: Any) -> ModelPlan:
    """:func:`plan` of every target of ``manifest`` (entry hashes of its local sources read from
    ``base_dir``) with this build code's hash."""
    from triton_mme_cdk.model_build.release.identity import entry_sha256, model_code_sha256

    wanted = [Planned(target, entry_sha256(spec, base_dir)) for spec in manifest.models for target in spec.target_names()]
    return plan(wanted, live, model_code_sha256=model_code_sha256())
