"""What must hold of a bucket the endpoint serves from, written once: the fault tests check it after
every injected fault and its rerun, and ``triton-mme doctor`` checks it on a live bucket.

1. ``routed-object``: every target the routes document routes exists in the served prefix, and
   its bytes are its route's digest (size, ``sha256`` metadata and S3's own SHA-256 checksum; with
   ``read_bytes``, the bytes themselves, read and hashed);
2. ``retained-object``: nothing unrouted within the retention window is deleted: every object the
   routes list as unrouted, unrouted for less than the window, exists;
3. ``release-index``: the routes document's release matches an index that exists: the index it
   names is there, is that release's, and routes each logical name to the same target, digest and
   size (the deployed record the routes carry is checked as they are read,
   :func:`model_build.release.routes.parse_routes`);
4. ``converges``: a rerun of an interrupted step converges: the same routes as one run without a
   fault (:func:`serving_difference`), and no object written more times than that run writes it
   (:func:`repeated_writes`). This one compares two runs, so only the tests check it.

A violation says which object and which route, what is wrong, and whether the store can repair it
(:func:`store_source`): a routed or retained object whose stored build still holds its digest's
bytes is copied back (:func:`copy_from_store`, the activation's own repair); a missing index is
not repairable from the store (the release must be deployed again).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from triton_mme_cdk.model_build.errors import PublishError
from triton_mme_cdk.model_build.release.identity import served_prefix, store_prefix
from triton_mme_cdk.model_build.release.index import read_index, read_routes
from triton_mme_cdk.model_build.release.routes import (
    DEFAULT_RETENTION_DAYS,
    Routes,
    expired,
    now_iso,
    routes_from_index,
)
from triton_mme_cdk.model_build.release.transfer import error_code, head_matches, list_sizes

#: The invariants by name, as a violation names them.
INVARIANTS: dict[str, str] = {
    "routed-object": "every routed target exists in served/ and its bytes match its digest",
    "retained-object": "nothing unrouted within the retention window is deleted",
    "release-index": "the routes document's release matches an index that exists",
    "converges": "a rerun of the interrupted step converges: same routes, no object written twice",
}
#: The target name of a stored build (``<prefix>/_builds/<key>/model.tar.gz``; the store's own).
_STORE_TARBALL = "model.tar.gz"
_READ_BLOCK = 1024 * 1024


@dataclass(frozen=True)
class Violation:
    """One broken invariant: the object (an S3 key) and the route (a logical name, "" for none)."""

    invariant: str
    key: str
    route: str
    problem: str
    #: What a repair does ("" when the store cannot repair it; ``refused`` then says why).
    repair: str = ""
    refused: str = ""

    def line(self, bucket: str) -> str:
        route = f"route {self.route!r}" if self.route else "no route"
        return f"{self.invariant}: s3://{bucket}/{self.key} ({route}): {self.problem}"

    def as_json(self, bucket: str) -> dict[str, Any]:
        return {"invariant": self.invariant, "object": f"s3://{bucket}/{self.key}", "route": self.route,
                "problem": self.problem, "repair": self.repair or None, "refused": self.refused or None}


@dataclass
class BucketCheck:
    """The invariants checked on one bucket and prefix against its live routes."""

    bucket: str
    prefix: str
    routes: Routes | None
    violations: list[Violation] = field(default_factory=list)
    #: Objects whose presence and digest were checked.
    checked: int = 0

    @property
    def holds(self) -> bool:
        return not self.violations


@dataclass(frozen=True)
class Expected:
    """One object the routes say must be served: where, with which digest, and its stored build."""

    key: str
    route: str
    sha256: str
    size: int
    model_key: str


def check_bucket(s3: Any, bucket: str, prefix: str, *, routes: Routes | None = None, stack: str = "",
                 retention_days: float = DEFAULT_RETENTION_DAYS, clock: Callable[[], float] = time.time,
                 read_bytes: bool = False) -> BucketCheck:
    """Invariants 1 to 3 of the module docstring on ``s3://bucket/prefix`` (``routes``: the live
    document, read here when None; no document is no violation: nothing is routed). Reads only.
    S3 errors other than a missing object propagate (the caller says what it could not read)."""
    if routes is None:
        routes = read_routes(s3, bucket, prefix, stack=stack)
    result = BucketCheck(bucket, prefix, routes)
    if routes is None:
        return result
    served = served_prefix(prefix)
    listing = list_sizes(s3, bucket, served)
    now = now_iso(clock)
    expected = [Expected(f"{served}/{route.target_model}", name, route.sha256, route.size, route.model_key)
                for name, route in sorted(routes.routes.items())]
    retained = [Expected(f"{served}/{item.target_model}", item.logical_name, item.sha256, item.size, item.model_key)
                for item in sorted(routes.unrouted.values(), key=lambda item: item.target_model)
                if not expired(item, retention_days=retention_days, now=now)]
    for invariant, objects in (("routed-object", expected), ("retained-object", retained)):
        for obj in objects:
            result.checked += 1
            problem = object_problem(s3, bucket, obj, listing, read_bytes=read_bytes)
            if problem is not None:
                result.violations.append(_repairable(s3, bucket, prefix, invariant, obj, problem))
    result.violations += index_problems(s3, bucket, routes)
    return result


def kept_since(s3: Any, bucket: str, prefix: str, before: Routes | None, *,
               retention_days: float = DEFAULT_RETENTION_DAYS, clock: Callable[[], float] = time.time) -> list[Violation]:
    """Invariant 2 across a step: nothing that ``before`` (the routes the step started from) routed,
    or listed as unrouted within the window, is deleted by it, whatever the routes say now (a step
    that deleted an object and stopped listing it is caught here, not by :func:`check_bucket`)."""
    if before is None:
        return []
    served = served_prefix(prefix)
    listing = list_sizes(s3, bucket, served)
    now = now_iso(clock)
    objects = {route.target_model: Expected(f"{served}/{route.target_model}", name, route.sha256, route.size,
                                            route.model_key) for name, route in before.routes.items()}
    for item in before.unrouted.values():
        if item.target_model not in objects and not expired(item, retention_days=retention_days, now=now):
            objects[item.target_model] = Expected(f"{served}/{item.target_model}", item.logical_name, item.sha256,
                                                  item.size, item.model_key)
    found = []
    for name in sorted(objects):
        problem = object_problem(s3, bucket, objects[name], listing)
        if problem is not None:
            found.append(_repairable(s3, bucket, prefix, "retained-object", objects[name],
                                     f"routed or retained before the step, {problem}"))
    return found


def object_problem(s3: Any, bucket: str, obj: Expected, listing: Mapping[str, int], *,
                   read_bytes: bool = False) -> str | None:
    """What is wrong with one object that must be served (None: nothing)."""
    if obj.key not in listing:
        return f"missing; its route needs sha256 {obj.sha256[:16]}... and {obj.size} bytes"
    matches, head = head_matches(s3, bucket, obj.key, obj.size, obj.sha256, require_checksum=True)
    if head is None:
        return f"missing; its route needs sha256 {obj.sha256[:16]}... and {obj.size} bytes"
    if not matches:
        stored = (head.get("Metadata") or {}).get("sha256")
        return (f"holds other bytes: {head.get('ContentLength')} bytes, sha256 metadata {str(stored)[:16]}..., "
                f"S3 checksum {head.get('ChecksumSHA256') or 'none'}; its route needs sha256 {obj.sha256[:16]}... "
                f"and {obj.size} bytes")
    if read_bytes:
        digest = read_sha256(s3, bucket, obj.key)
        if digest != obj.sha256:
            return f"its bytes hash to sha256 {digest[:16]}...; its route needs {obj.sha256[:16]}..."
    return None


def read_sha256(s3: Any, bucket: str, key: str) -> str:
    digest = hashlib.sha256()
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    while block := body.read(_READ_BLOCK):
        digest.update(block)
    return digest.hexdigest()


def index_problems(s3: Any, bucket: str, routes: Routes) -> list[Violation]:
    """Invariant 3: the index the routes name exists, is their release's and routes the same."""
    index = read_index(s3, bucket, routes.index_key)
    if index is None:
        return [Violation("release-index", routes.index_key, "",
                          f"missing; the routes document routes release {routes.release_id} from it",
                          refused="a release index is written by the deploy that built it, not by the store: "
                                  "deploy (or publish) a release again to route one whose index exists")]
    problems = []
    if index.get("release_id") not in (None, routes.release_id):
        problems.append(Violation("release-index", routes.index_key, "",
                                  f"is release {index.get('release_id')}'s; the routes document says {routes.release_id}",
                                  refused="the routes name another release's index: route a release again"))
    wanted = routes_from_index(index)
    for name in sorted(set(wanted) | set(routes.routes)):
        mine, theirs = routes.routes.get(name), wanted.get(name)
        if mine is None or theirs is None or (mine.target_model, mine.sha256, mine.size) != (
                theirs.target_model, theirs.sha256, theirs.size):
            said = f"{theirs.target_model} ({theirs.sha256[:16]}...)" if theirs else "no such route"
            has = f"{mine.target_model} ({mine.sha256[:16]}...)" if mine else "no such route"
            problems.append(Violation("release-index", routes.index_key, name,
                                      f"the index routes it to {said}; the routes document to {has}",
                                      repair=f"route release {routes.release_id} again from its index"))
    return problems


def store_source(s3: Any, bucket: str, prefix: str, obj: Expected) -> tuple[str | None, str]:
    """The stored build an object can be copied back from, or None and why not."""
    if not obj.model_key:
        return None, "its route names no stored build (a release of an earlier layout): publish it again"
    source = f"{store_prefix(prefix, obj.model_key)}/{_STORE_TARBALL}"
    try:
        matches, head = head_matches(s3, bucket, source, obj.size, obj.sha256)
    except (ClientError, BotoCoreError) as error:
        return None, f"its stored build s3://{bucket}/{source} cannot be read ({error_code(error)})"
    if head is None:
        return None, f"its stored build s3://{bucket}/{source} is gone too: build and deploy the model again"
    if not matches:
        return None, f"its stored build s3://{bucket}/{source} holds other bytes: build and deploy the model again"
    return source, ""


def _repairable(s3: Any, bucket: str, prefix: str, invariant: str, obj: Expected, problem: str) -> Violation:
    source, why = store_source(s3, bucket, prefix, obj)
    if source is None:
        return Violation(invariant, obj.key, obj.route, problem, refused=why)
    return Violation(invariant, obj.key, obj.route, problem, repair=f"copy back from s3://{bucket}/{source}")


def copy_from_store(s3: Any, bucket: str, prefix: str, obj: Expected) -> None:
    """Put the stored build's bytes under ``obj.key`` (one server-side copy whose S3 checksum must
    be the digest; an object there with other bytes is replaced: the name is the digest's, so these
    bytes are the only ones it may hold). Raises :class:`PublishError` when the store cannot."""
    from triton_mme_cdk.model_build.release.store import copy_served, served_object

    source, why = store_source(s3, bucket, prefix, obj)
    if source is None:
        raise PublishError(f"s3://{bucket}/{obj.key}: not repaired: {why}", model=obj.route or None)
    try:
        present, _ = head_matches(s3, bucket, obj.key, obj.size, obj.sha256, require_checksum=True)
        if not present:
            s3.delete_object(Bucket=bucket, Key=obj.key)  # other bytes (or none) under the digest's name
    except (ClientError, BotoCoreError) as error:
        raise PublishError(f"s3://{bucket}/{obj.key}: not repaired ({error_code(error)})",
                           model=obj.route or None) from None
    if not present:
        copy_served(s3, bucket, [served_object(obj.key, obj.route, obj.route, obj.size, obj.sha256, source)], {}, 1)


# ---------------------------------------------------------------------------------------------
# Invariant 4: two runs compared (the tests)
# ---------------------------------------------------------------------------------------------


def serving_view(routes: Routes | None) -> dict[str, Any] | None:
    """What a routes document serves, without the times it was written at."""
    if routes is None:
        return None
    return {"release_id": routes.release_id, "index_key": routes.index_key, "stack": routes.stack,
            "model_data_url": routes.model_data_url, "deployed": routes.deployed,
            "routes": {name: (r.target_model, r.sha256, r.size) for name, r in sorted(routes.routes.items())},
            "unrouted": sorted(routes.unrouted)}


def serving_difference(expected: Routes | None, actual: Routes | None, *, key: str) -> list[Violation]:
    """Invariant 4's first half: ``actual`` (after an interrupted step and its rerun) serves what
    ``expected`` (one run without a fault) does. ``key``: the routes document's."""
    want, got = serving_view(expected), serving_view(actual)
    if want == got:
        return []
    if want is None or got is None:
        return [Violation("converges", key, "", f"routes document {'present' if got else 'missing'}; one run "
                                                f"without a fault leaves it {'present' if want else 'missing'}")]
    fields = sorted(name for name in want if want[name] != got[name])
    return [Violation("converges", key, "", f"{name}: {got[name]!r}; one run without a fault gives {want[name]!r}")
            for name in fields]


def repeated_writes(clean: Mapping[str, int], observed: Mapping[str, int]) -> list[Violation]:
    """Invariant 4's second half: no object written more often (``key -> writes``, an upload or a
    copy that landed) over an interrupted step and its rerun than over one run without a fault."""
    return [Violation("converges", key, "", f"written {count} times; one run without a fault writes it "
                                            f"{clean.get(key, 0)} times")
            for key, count in sorted(observed.items()) if count > clean.get(key, 0)]
