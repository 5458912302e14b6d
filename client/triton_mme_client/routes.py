"""The routes document: which ``TargetModel`` each logical model name is served under right now.

On a multi-model endpoint of triton-mme-cdk every model update is placed under a new content name
(``<logical name>-<first 12 hex digits of its sha256>.tar.gz``); the endpoint's ``ModelDataUrl``
never changes. What changes per release is this small document at a fixed key,
``<prefix>/_routes/routes.json`` (the stack's ``RoutesUrl`` output). This module owns its format:
the parser, the rule that a route names only the bytes its digest names (:func:`target_problem`),
and :class:`RouteResolver`, which reads it with conditional GETs. The model build
(``triton_mme_cdk.model_build.release.routes``) imports the format from here; nothing here imports
triton_mme_cdk.

Pure but for :class:`RouteResolver`'s S3 reads (a boto3 client is passed in).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from triton_mme_client.errors import ConfigurationError, ModelNotFound, RoutesError
from triton_mme_client.signatures import Signature, parse_signature

#: The document's format; a reader refuses another.
ROUTES_SCHEMA = "triton-mme/routes/1"
#: Largest routes document read (a route is about 400 bytes, 700 with its signature).
MAX_ROUTES_BYTES = 16 * 1024 * 1024
#: Hex digits of a tarball's sha256 in its served name.
SERVED_HASH_CHARS = 12
ROUTE_FIELDS = ("target_model", "sha256", "size", "model_key", "source_model")


@dataclass(frozen=True)
class Route:
    """Where one logical model name is served: its ``TargetModel`` (relative to the served prefix),
    and its tensors where the release published them (None: unknown)."""

    logical_name: str
    target_model: str
    sha256: str
    size: int
    model_key: str
    source_model: str
    entry_sha256: str = ""
    format: str = ""
    signature: Signature | None = None

    def as_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "target_model": self.target_model, "sha256": self.sha256, "size": self.size,
            "model_key": self.model_key, "source_model": self.source_model,
            "entry_sha256": self.entry_sha256, "format": self.format,
        }
        if self.signature is not None:
            document["signature"] = self.signature.as_json()
        return document


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
    """One routes document. ``deployed`` is the deploying stack's record, kept as read (the model
    build checks it); ``legacy_fleet`` what an earlier version recorded in its place."""

    release_id: str
    model_data_url: str
    index_key: str
    routes: Mapping[str, Route]
    stack: str = ""
    updated_at: str = ""
    model_code_sha256: str = ""
    deployed: Mapping[str, Any] | None = None
    unrouted: Mapping[str, Unrouted] = field(default_factory=dict)
    legacy_fleet: Mapping[str, Any] = field(default_factory=dict)

    def routed_targets(self) -> set[str]:
        return {route.target_model for route in self.routes.values()}

    def body(self) -> bytes:
        document: dict[str, Any] = {
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


def parse_routes(body: bytes, *, where: str, stack: str = "") -> Routes:
    """The routes document in ``body`` (read from ``where``, named in every error).

    ``stack``: the stack that reads it; a document another stack wrote is refused (two stacks
    must never route each other's models). Raises :class:`RoutesError`."""
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
            if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", item.since):
                raise ValueError(f"unrouted {item.target_model!r}: since {item.since[:40]!r} is not YYYY-MM-DDTHH:MM:SSZ")
        deployed = document.get("deployed")
        if deployed is not None and not isinstance(deployed, dict):
            raise TypeError(f"deployed is {type(deployed).__name__}, expected an object")
        return Routes(
            release_id=str(document["release_id"]), model_data_url=str(document["model_data_url"]),
            index_key=str(document["index_key"]), routes=routes, stack=written_by,
            updated_at=str(document.get("updated_at") or ""),
            model_code_sha256=str(document.get("model_code_sha256") or ""),
            deployed=deployed, unrouted=unrouted, legacy_fleet=dict(document.get("fleet") or {}),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise RoutesError(f"routes {where}: malformed ({type(error).__name__}: {error})") from None


def _route(name: str, item: Any) -> Route:
    if not isinstance(item, dict):
        raise TypeError(f"route {name!r} is {type(item).__name__}, expected an object")
    missing = [f for f in ROUTE_FIELDS if f not in item]
    if missing:
        raise KeyError(f"route {name!r} lacks {', '.join(missing)}")
    try:
        signature = parse_signature(item.get("signature"))
    except ValueError as error:
        raise ValueError(f"route {name!r}: {error}") from None
    return Route(name, str(item["target_model"]), str(item["sha256"]), int(item["size"]), str(item["model_key"]),
                 str(item["source_model"]), str(item.get("entry_sha256") or ""), str(item.get("format") or ""),
                 signature)


def served_name(logical_name: str, sha256: str) -> str:
    """``<logical_name>-<sha256[:12]>.tar.gz``: the only ``TargetModel`` a route of that digest may name.

    Why a content hash in the name: an MME instance that has loaded (or cached on its volume) a
    ``TargetModel`` keeps serving those bytes, so a name must never get other bytes. A changed
    model therefore gets a new name, and an unchanged one keeps its name and its object. The
    logical name stays readable in front of the hash."""
    if len(sha256) < SERVED_HASH_CHARS:
        raise ValueError(f"sha256: got {sha256!r}; expected 64 hex digits")
    return f"{logical_name}-{sha256[:SERVED_HASH_CHARS]}.tar.gz"


def target_problem(logical_name: str, target_model: str, sha256: str) -> str | None:
    """Why a route's ``target_model`` may not be served, or None: it must be the content-named
    ``<logical_name>-<sha256[:12]>.tar.gz`` of the route's own ``sha256`` (64 lowercase hex).

    Whoever could write the routes could otherwise point a name at any object of the served
    prefix; with this rule a route names only the bytes its digest names, and placing and
    activation check that the object holds those bytes (S3's SHA-256 checksum)."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        return f"route {logical_name!r}: sha256 {sha256[:70]!r} is not 64 lowercase hex digits; refused"
    expected = served_name(logical_name, sha256)
    if target_model != expected:
        return (f"route {logical_name!r}: target_model {target_model[:200]!r} is not {expected!r}, the served name "
                f"of its sha256 {sha256[:16]}...; refused (a route names only the object its digest names)")
    return None


def split_s3_url(url: str, *, field_name: str = "routes_url") -> tuple[str, str]:
    """``("bucket", "prefix/_routes/routes.json")`` of ``s3://bucket/prefix/_routes/routes.json``."""
    match = re.fullmatch(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])/(.+)", url or "")
    if match is None or match.group(2).endswith("/"):
        raise ConfigurationError(f"{field_name} {str(url)[:200]!r}: expected s3://<bucket>/<key> of the routes "
                                 "document (the stack's RoutesUrl output, s3://<bucket>/<prefix>/_routes/routes.json)")
    return match.group(1), match.group(2)


class RouteResolver:
    """Logical model names to their current routes, cached and shared across threads.

    The document is read once, then again at most every ``refresh_seconds``, with a conditional
    GET (``IfNoneMatch`` on its ETag): an unchanged document costs a 304, a new release is seen
    within ``refresh_seconds``. A name that is not routed triggers one refresh before it is
    refused, so a model added a moment ago resolves at once; concurrent refreshes share one GET.
    A route whose target is not the content name of its own digest (:func:`target_problem`) is
    refused, never returned::

        resolver = RouteResolver.from_url(boto3.client("s3"), "s3://bucket/models/_routes/routes.json")
        runtime.invoke_endpoint(EndpointName=..., TargetModel=resolver.target_model("minilm-l6"), ...)
    """

    def __init__(self, s3_client: Any, bucket: str, key: str, *, refresh_seconds: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(refresh_seconds, bool) or not isinstance(refresh_seconds, int | float) or not refresh_seconds >= 0:
            raise ConfigurationError(f"refresh_seconds {refresh_seconds!r}: expected a number of seconds >= 0")
        self._s3, self._bucket, self._key = s3_client, bucket, key
        self._refresh, self._clock = float(refresh_seconds), clock
        self._lock = threading.Lock()
        self._routes: Routes | None = None
        self._etag: str | None = None
        self._read_at = float("-inf")
        #: GETs that returned a new document, and conditional GETs answered "not modified".
        self.reads = 0
        self.not_modified = 0

    @classmethod
    def from_url(cls, s3_client: Any, url: str, **kwargs: Any) -> RouteResolver:
        bucket, key = split_s3_url(url)
        return cls(s3_client, bucket, key, **kwargs)

    @property
    def url(self) -> str:
        return f"s3://{self._bucket}/{self._key}"

    @property
    def requests(self) -> int:
        """S3 GETs made for the document (new versions and 304s)."""
        return self.reads + self.not_modified

    @property
    def routes(self) -> Routes:
        """The document as last read, re-read first when it is older than ``refresh_seconds``."""
        with self._lock:
            if self._routes is None or self._clock() - self._read_at >= self._refresh:
                self._read()
            assert self._routes is not None
            return self._routes

    @property
    def generation(self) -> int:
        """How many reads have finished (a new document or a 304): :meth:`refresh`'s ``seen``."""
        return self.requests

    def refresh(self, *, seen: int | None = None) -> Routes:
        """Read the document now (conditionally), unless a read finished since :attr:`generation`
        was ``seen``: callers who ask at once share one GET."""
        with self._lock:
            if seen is None or self._routes is None or self.generation == seen:
                self._read()
            assert self._routes is not None
            return self._routes

    def route(self, logical_name: str) -> Route:
        """The checked route of ``logical_name``: :class:`ModelNotFound` after one refresh, or
        :class:`RoutesError` for a route whose target is not its digest's served name."""
        seen = self.generation  # before the lock: a read under way when this was asked counts
        route = self.routes.routes.get(logical_name)
        if route is None:
            route = self.refresh(seen=seen).routes.get(logical_name)
        if route is None:
            routes = self.routes
            routed = sorted(routes.routes)
            shown = ", ".join(routed[:10]) + (f" and {len(routed) - 10} more" if len(routed) > 10 else "")
            raise ModelNotFound(
                f"model {logical_name[:200]!r}: not routed in {self.url} (release {routes.release_id}); "
                f"routed: {shown or 'nothing'}", model=logical_name)
        problem = target_problem(route.logical_name, route.target_model, route.sha256)
        if problem is not None:
            raise RoutesError(f"routes {self.url}: {problem}", model=logical_name)
        return route

    def target_model(self, logical_name: str) -> str:
        """Today's ``TargetModel`` of ``logical_name``."""
        return self.route(logical_name).target_model

    def _read(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        kwargs: dict[str, Any] = {"Bucket": self._bucket, "Key": self._key}
        if self._etag and self._routes is not None:
            kwargs["IfNoneMatch"] = self._etag
        try:
            response = self._s3.get_object(**kwargs)
            body = response["Body"].read(MAX_ROUTES_BYTES + 1)
        except ClientError as error:
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = error.response.get("Error", {}).get("Code", "?")
            if status == 304 or code in ("304", "NotModified"):
                self.not_modified += 1
                self._read_at = self._clock()
                return
            if code in ("NoSuchKey", "404"):
                raise RoutesError(f"routes {self.url}: missing; nothing is routed (deploy or publish first)") from None
            raise RoutesError(f"routes {self.url}: cannot be read ({code})") from None
        except BotoCoreError as error:
            raise RoutesError(f"routes {self.url}: cannot be read ({error})") from None
        self._routes = parse_routes(body, where=self.url)
        self._etag = response.get("ETag")
        self._read_at = self._clock()
        self.reads += 1
