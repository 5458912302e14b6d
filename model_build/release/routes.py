"""The routes document: which ``TargetModel`` each logical model name is served under right now.

Why it exists: on a multi-model endpoint the model set changes without touching the fleet. The
endpoint's ``ModelDataUrl`` is one fixed prefix for the life of the stack; a model is added by
placing its tarball there, updated by placing the new build under a new name, removed by no
longer calling it. What changes per release is therefore not the fleet but this small document,
published at a fixed key outside the served prefix (``<prefix>/_routes/routes.json``, a stack
output). Smoke tests, the demo, the benchmarks and clients (:class:`RouteResolver`) read it to
turn a logical name (``minilm-l6``, ``bert-3``) into the current ``TargetModel``.

The document also keeps, for each served object no route uses any more, when it was unrouted
(``unrouted``): such an object stays for the retention window so that a rollback can route to it
again with no upload, then the activation deletes it (:mod:`model_build.release.serving`). And it keeps
the deployed record of the last deploy (:mod:`model_build.release.deployed`), so that ``plan`` can
say whether a change replaces the fleet or puts data at risk.

This module is pure (no S3, no torch): format, checks, and the model plan between two route sets.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError

#: The document's format; a reader refuses another.
ROUTES_SCHEMA = "triton-mme/routes/1"
#: Largest routes document read (a route is about 400 bytes: 20,000 models fit).
MAX_ROUTES_BYTES = 16 * 1024 * 1024
#: How long an unrouted served object is kept by default (a rollback can route to it again).
DEFAULT_RETENTION_DAYS = 7
_ROUTE_FIELDS = ("target_model", "sha256", "size", "model_key", "source_model")


class RoutesError(ModelBuildError):
    """A routes document that is missing where one is required, does not parse, is truncated, has
    another schema, belongs to another stack, or names an object whose bytes are not its own."""


@dataclass(frozen=True)
class Route:
    """Where one logical model name is served: its ``TargetModel`` (relative to the served prefix)."""

    logical_name: str
    target_model: str
    sha256: str
    size: int
    model_key: str
    source_model: str
    entry_sha256: str = ""
    format: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "target_model": self.target_model, "sha256": self.sha256, "size": self.size,
            "model_key": self.model_key, "source_model": self.source_model,
            "entry_sha256": self.entry_sha256, "format": self.format,
        }


@dataclass(frozen=True)
class Unrouted:
    """A served object no route uses since ``since`` (kept for the retention window)."""

    target_model: str
    logical_name: str
    sha256: str
    size: int
    model_key: str
    since: str

    def as_json(self) -> dict[str, Any]:
        return {"logical_name": self.logical_name, "sha256": self.sha256, "size": self.size,
                "model_key": self.model_key, "since": self.since}


@dataclass(frozen=True)
class Routes:
    """One routes document (see the module docstring)."""

    release_id: str
    model_data_url: str
    index_key: str
    routes: Mapping[str, Route]
    stack: str = ""
    updated_at: str = ""
    model_code_sha256: str = ""
    #: The deployed record of the stack that routed this release (:mod:`model_build.release.deployed`):
    #: what ``plan`` compares the next template with. None: not written (a CLI publish on an empty
    #: prefix, or an earlier version of the stack).
    deployed: Mapping[str, Any] | None = None
    unrouted: Mapping[str, Unrouted] = field(default_factory=dict)
    #: The settings an earlier version recorded instead of the deployed record (read, never written:
    #: ``plan`` reports the fleet as unknown against them).
    legacy_fleet: Mapping[str, Any] = field(default_factory=dict)

    def routed_targets(self) -> set[str]:
        return {route.target_model for route in self.routes.values()}

    def body(self) -> bytes:
        document = {
            "schema": ROUTES_SCHEMA,
            "release_id": self.release_id,
            "model_data_url": self.model_data_url,
            "index_key": self.index_key,
            "stack": self.stack,
            "updated_at": self.updated_at,
            "model_code_sha256": self.model_code_sha256,
            "routes": {name: route.as_json() for name, route in sorted(self.routes.items())},
            "unrouted": {name: item.as_json() for name, item in sorted(self.unrouted.items())},
        }
        if self.deployed is not None:
            document["deployed"] = dict(self.deployed)
        if self.legacy_fleet:
            document["fleet"] = dict(self.legacy_fleet)
        return (json.dumps(document, sort_keys=True, indent=1) + "\n").encode()

    def same_serving(self, other: Routes | None) -> bool:
        """Whether ``other`` routes the same release, names, deployed record and retained objects (a
        re-activation that would write nothing new but the time)."""
        return other is not None and (
            self.release_id, dict(self.routes), self.deployed, dict(self.unrouted), self.stack, dict(self.legacy_fleet)
        ) == (other.release_id, dict(other.routes), other.deployed, dict(other.unrouted), other.stack,
              dict(other.legacy_fleet))


def now_iso(clock: Callable[[], float] = time.time) -> str:
    return datetime.fromtimestamp(clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def expired(item: Unrouted, *, retention_days: float, now: str) -> bool:
    """Whether ``item`` has been unrouted for longer than the retention window."""
    return parse_time(now) - parse_time(item.since) >= timedelta(days=retention_days)


def parse_routes(body: bytes, *, where: str, stack: str = "") -> Routes:
    """The routes document in ``body`` (read from ``where``, named in every error).

    ``stack``: the stack that reads it; a document another stack wrote is refused (two stacks
    must never route each other's models). Raises :class:`RoutesError`.
    """
    if len(body) > MAX_ROUTES_BYTES:
        raise RoutesError(f"routes {where}: {len(body)} bytes; at most {MAX_ROUTES_BYTES} are read")
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        hint = "truncated" if body and not body.rstrip().endswith(b"}") else "not valid JSON"
        raise RoutesError(f"routes {where}: {hint} ({error}); the previous routes keep serving") from None
    if not isinstance(document, dict) or document.get("schema") != ROUTES_SCHEMA:
        found = document.get("schema") if isinstance(document, dict) else type(document).__name__
        raise RoutesError(f"routes {where}: schema {found!r}; expected {ROUTES_SCHEMA!r}")
    written_by = str(document.get("stack") or "")
    if stack and written_by and written_by != stack:
        raise RoutesError(
            f"routes {where}: written by stack {written_by!r}, not {stack!r}; two stacks must not share "
            "a model prefix (give this stack another bucket or mme:model_prefix)"
        )
    try:
        routes = {str(name): _route(str(name), item) for name, item in dict(document["routes"]).items()}
        unrouted = {str(name): Unrouted(str(name), str(item["logical_name"]), str(item["sha256"]), int(item["size"]),
                                        str(item.get("model_key", "")), str(item["since"]))
                    for name, item in dict(document.get("unrouted") or {}).items()}
        for item in unrouted.values():
            parse_time(item.since)
        return Routes(
            release_id=str(document["release_id"]), model_data_url=str(document["model_data_url"]),
            index_key=str(document["index_key"]), routes=routes, stack=written_by,
            updated_at=str(document.get("updated_at") or ""),
            model_code_sha256=str(document.get("model_code_sha256") or ""),
            deployed=_deployed(document.get("deployed"), where), unrouted=unrouted,
            legacy_fleet=dict(document.get("fleet") or {}),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise RoutesError(f"routes {where}: malformed ({type(error).__name__}: {error})") from None


def _deployed(value: Any, where: str) -> dict[str, Any] | None:
    from triton_mme_cdk.model_build.release.deployed import DeployedRecordError, parse_record

    if value is None:
        return None
    try:
        return parse_record(value, where=f"in routes {where}")
    except DeployedRecordError as error:
        raise RoutesError(str(error)) from None


def _route(name: str, item: Any) -> Route:
    if not isinstance(item, dict):
        raise TypeError(f"route {name!r} is {type(item).__name__}, expected an object")
    missing = [f for f in _ROUTE_FIELDS if f not in item]
    if missing:
        raise KeyError(f"route {name!r} lacks {', '.join(missing)}")
    return Route(name, str(item["target_model"]), str(item["sha256"]), int(item["size"]), str(item["model_key"]),
                 str(item["source_model"]), str(item.get("entry_sha256") or ""), str(item.get("format") or ""))


def target_problem(logical_name: str, target_model: str, sha256: str) -> str | None:
    """Why a route's ``target_model`` may not be served, or None: it must be the content-named
    ``<logical_name>-<sha256[:12]>.tar.gz`` of the route's own ``sha256`` (64 lowercase hex).

    Whoever could write the routes could otherwise point a name at any object of the served
    prefix; with this rule a route names only the bytes its digest names, and placing and
    activation check that the object holds those bytes (S3's SHA-256 checksum)."""
    from triton_mme_cdk.model_build.release.identity import SERVED_HASH_CHARS

    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        return f"route {logical_name!r}: sha256 {sha256[:70]!r} is not 64 lowercase hex digits; refused"
    expected = f"{logical_name}-{sha256[:SERVED_HASH_CHARS]}.tar.gz"
    if target_model != expected:
        return (f"route {logical_name!r}: target_model {target_model[:200]!r} is not {expected!r}, the served name "
                f"of its sha256 {sha256[:16]}...; refused (a route names only the object its digest names)")
    return None


def routes_from_index(index: Mapping[str, Any]) -> dict[str, Route]:
    """The routes a release's index gives: each logical target to its served name."""
    return {
        str(entry["logical_name"]): Route(
            str(entry["logical_name"]), str(entry["target_model"]), str(entry["sha256"]), int(entry["size"]),
            str(entry.get("model_key") or ""), str(entry.get("source_model") or ""),
            str(entry.get("entry_sha256") or ""), str(entry.get("format") or ""),
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
    :mod:`model_build.tools.plan_verdict`'s)."""

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


# ---------------------------------------------------------------------------------------------
# Clients: a logical name to its current TargetModel
# ---------------------------------------------------------------------------------------------


class RouteResolver:
    """Resolve logical model names to ``TargetModel`` values for ``InvokeEndpoint``, cached.

    The routes document is read once, then re-read at most every ``refresh_seconds`` with a
    conditional GET (``IfNoneMatch`` on its ETag): an unchanged document costs a 304, a new
    release is seen within ``refresh_seconds``. A name that is not routed triggers one refresh
    before it is refused, so a model added a moment ago resolves at once. A route whose target is
    not the content name of its own digest (:func:`target_problem`) is refused, never returned::

        resolver = RouteResolver(boto3.client("s3"), bucket, "models/_routes/routes.json")
        runtime.invoke_endpoint(EndpointName=..., TargetModel=resolver.target_model("minilm-l6"), ...)
    """

    def __init__(self, s3_client: Any, bucket: str, key: str, *, refresh_seconds: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._s3, self._bucket, self._key = s3_client, bucket, key
        self._refresh, self._clock = refresh_seconds, clock
        self._lock = threading.Lock()
        self._routes: Routes | None = None
        self._etag: str | None = None
        self._read_at = float("-inf")
        #: GETs that returned a new document, and conditional GETs answered "not modified".
        self.reads = 0
        self.not_modified = 0

    @property
    def routes(self) -> Routes:
        with self._lock:
            if self._routes is None or self._clock() - self._read_at >= self._refresh:
                self._read()
            assert self._routes is not None
            return self._routes

    def target_model(self, logical_name: str) -> str:
        route = self.routes.routes.get(logical_name)
        if route is None:
            with self._lock:
                self._read()
                assert self._routes is not None
                route = self._routes.routes.get(logical_name)
        if route is None:
            raise RoutesError(
                f"model {logical_name!r}: not routed in s3://{self._bucket}/{self._key} "
                f"(release {self.routes.release_id}); routed: {', '.join(sorted(self.routes.routes)[:10])}"
            )
        problem = target_problem(route.logical_name, route.target_model, route.sha256)
        if problem is not None:
            raise RoutesError(f"routes s3://{self._bucket}/{self._key}: {problem}", model=logical_name)
        return route.target_model

    def _read(self) -> None:
        from botocore.exceptions import ClientError

        where = f"s3://{self._bucket}/{self._key}"
        kwargs: dict[str, Any] = {"Bucket": self._bucket, "Key": self._key}
        if self._etag and self._routes is not None:
            kwargs["IfNoneMatch"] = self._etag
        try:
            response = self._s3.get_object(**kwargs)
        except ClientError as error:
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = error.response.get("Error", {}).get("Code", "?")
            if status == 304 or code in ("304", "NotModified"):
                self.not_modified += 1
                self._read_at = self._clock()
                return
            if code in ("NoSuchKey", "404"):
                raise RoutesError(f"routes {where}: missing; nothing is routed (deploy or publish first)") from None
            raise RoutesError(f"routes {where}: cannot be read ({code})") from None
        body = response["Body"].read(MAX_ROUTES_BYTES + 1)
        self._routes = parse_routes(body, where=where)
        self._etag = response.get("ETag")
        self._read_at = self._clock()
        self.reads += 1
