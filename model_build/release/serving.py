"""Route a release on the live fleet: the S3 side of :mod:`model_build.release.routes`.

A release is served in two steps. :func:`model_build.release.store.assemble_release` places its
tarballs under their immutable names in the served prefix (the endpoint's fixed
``ModelDataUrl``) and writes the release's index; :func:`activate_release` then makes it the one
clients reach: it checks that every newly routed object holds the bytes its route says, copies
back from the store any object the retention window has already removed (a rollback to an old
release), deletes the served objects that have been unrouted for longer than the retention
window and that no route uses, and writes the routes document last, in one PUT. A failure at any
point leaves the previous routes document, hence the previous routes, serving.

Two writers (a stack deploy and ``python -m model_build publish`` to the same prefix, a retried
activation and a new one) may read the same version of the routes. The PUT is therefore a
compare-and-swap (:func:`model_build.release.index.write_routes`: ``If-Match`` on the ETag read,
``If-None-Match: *`` for the first document), so the second writer never overwrites what it did
not read. On a conflict it reads the routes again: if the other writer routed the release this
activation had read (a re-activation, new bookkeeping) or this very release, the activation runs
again on the new document; if it routed another release, this one fails with one line naming
that release, after listing this release's served objects as unrouted in the live document (so
none is left neither routed nor listed, and the retention window applies to them).

Why deletion happens here and not in an S3 lifecycle rule: a lifecycle expiration counts days
from an object's creation, not from the day it stopped being routed. A model routed for a year
and then unrouted would be deleted the next day, leaving no window for a rollback. The routes
document knows when each object was unrouted, so the activation deletes it once that is older
than the window (and the bucket's noncurrent-version rule then expires the bytes).

Also here: the clean-up of a stack's objects on stack deletion, and the listing and deletion of
the per-release prefixes that stacks of earlier versions served (``<prefix>/r-<16 hex>/``).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from triton_mme_cdk.model_build.errors import PublishError
from triton_mme_cdk.model_build.release.identity import (
    RELEASES_DIR,
    Release,
    routes_key,
    served_prefix,
    store_prefix,
)
from triton_mme_cdk.model_build.release.index import read_index, read_routes_tagged, write_routes
from triton_mme_cdk.model_build.release.invariants import Expected, copy_from_store, object_problem
from triton_mme_cdk.model_build.release.publish import delete_release
from triton_mme_cdk.model_build.release.routes import (
    DEFAULT_RETENTION_DAYS,
    Route,
    Routes,
    RoutesError,
    Unrouted,
    expired,
    now_iso,
    routes_from_index,
    target_problem,
)
from triton_mme_cdk.model_build.release.store import STORE_TARGET, copy_served, served_object
from triton_mme_cdk.model_build.release.transfer import SHA256_METADATA, head_matches, list_sizes

#: A release prefix of the layout before the fixed served prefix (``<prefix>/r-<16 hex>/``).
LEGACY_RELEASE = re.compile(r"^r-[0-9a-f]{16}$")
#: How many times one activation reads and writes the routes again after another writer changed them.
MAX_ROUTES_CONFLICTS = 5


@dataclass
class ActivationReport:
    """What one activation did; the counts are what tests and the handler's log assert on."""

    release_id: str
    routes_key: str
    previous_release: str | None
    routed: int
    #: Newly routed objects whose digest was checked (HEAD), and ones copied back from the store.
    verified: int = 0
    copied: int = 0
    #: Served objects deleted because they were unrouted for longer than the retention window.
    deleted: list[str] = field(default_factory=list)
    #: Objects unrouted by this activation (kept for the retention window).
    unrouted_now: list[str] = field(default_factory=list)
    #: Whether the routes document was written (False: it already said exactly this).
    wrote: bool = False
    seconds: float = 0.0
    #: Times another writer changed the routes between this activation's read and its write.
    conflicts: int = 0


def activate_release(
    s3_client: Any,
    bucket: str,
    model_prefix: str,
    release_id: str,
    *,
    stack: str = "",
    deployed: Mapping[str, Any] | None = None,
    retention_days: float = DEFAULT_RETENTION_DAYS,
    clock: Callable[[], float] = time.time,
    concurrency: int = 16,
    _conflicts: int = 0,
) -> ActivationReport:
    """Route the release ``release_id`` (its index must exist): see the module docstring.

    ``stack`` names the writer (the CloudFormation stack id, or "" for the CLI); a routes
    document written by another stack is refused. ``deployed``: the stack's deployed record, written for
    ``plan`` (None keeps the live document's: a CLI publish does not change the fleet).
    ``_conflicts``: how many times the routes changed under this activation already (its re-runs)."""
    started = time.monotonic()
    release = Release(release_id, "", "")
    index_key = release.index_key(model_prefix)
    key = routes_key(model_prefix)
    index = read_index(s3_client, bucket, index_key)
    if index is None:
        raise RoutesError(f"release {release_id}: no index at s3://{bucket}/{index_key}; publish it before routing it")
    wanted = routes_from_index(index)
    if not wanted:
        raise RoutesError(f"release {release_id}: index s3://{bucket}/{index_key} routes no model")
    for route in wanted.values():
        problem = target_problem(route.logical_name, route.target_model, route.sha256)
        if problem is not None:
            raise RoutesError(f"release {release_id}: index s3://{bucket}/{index_key}: {problem}; nothing was "
                              "routed, the previous routes keep serving", model=route.logical_name)
    live, etag = read_routes_tagged(s3_client, bucket, model_prefix, stack=stack)
    served = served_prefix(model_prefix)
    now = now_iso(clock)
    report = ActivationReport(release_id, key, live.release_id if live else None, len(wanted), conflicts=_conflicts)

    # 1. Every newly routed object holds its route's bytes (copied back from the store if gone). A
    # re-activation of the routed release checks every one of them: an object deleted or overwritten
    # while routed is put back from the store (the way to repair it, with no rebuild).
    listing = list_sizes(s3_client, bucket, served)
    already = live.routed_targets() if live else set()
    reactivating = live is not None and live.release_id == release_id
    to_copy, to_check = [], []
    for route in wanted.values():
        object_key = f"{served}/{route.target_model}"
        if route.target_model in already and listing.get(object_key) == route.size and not reactivating:
            continue
        if object_key in listing:
            to_check.append(route)
        else:
            source = f"{store_prefix(model_prefix, route.model_key)}/{STORE_TARGET}.tar.gz"
            to_copy.append(served_object(object_key, route.logical_name, route.source_model, route.size,
                                         route.sha256, source))
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(to_check))), thread_name_prefix="verify") as pool:
        repaired = sum(pool.map(lambda route: _verify_or_repair(s3_client, bucket, model_prefix, route,
                                                                route.target_model in already), to_check))
    report.verified += len(to_check)
    if to_copy:
        counts, _ = copy_served(s3_client, bucket, to_copy, listing, concurrency)
        report.copied = counts["copied"]
    report.copied += repaired

    # 2. Bookkeeping of unrouted objects; the expired ones are deleted before the routes change.
    targets = {route.target_model for route in wanted.values()}
    unrouted = {name: item for name, item in (live.unrouted if live else {}).items() if name not in targets}
    for route in (live.routes.values() if live else ()):
        if route.target_model not in targets and route.target_model not in unrouted:
            unrouted[route.target_model] = Unrouted(route.target_model, route.logical_name, route.sha256,
                                                    route.size, route.model_key, now)
            report.unrouted_now.append(route.target_model)
    gone = sorted(name for name, item in unrouted.items()
                  if expired(item, retention_days=retention_days, now=now) and name not in targets)
    if gone:
        _delete_keys(s3_client, bucket, [f"{served}/{name}" for name in gone])
        report.deleted = gone
        unrouted = {name: item for name, item in unrouted.items() if name not in gone}

    # 3. The routes document, last and in one PUT, over the version read and no other.
    document = Routes(
        release_id=release_id, model_data_url=f"s3://{bucket}/{served}/", index_key=index_key, routes=wanted,
        stack=stack or (live.stack if live else ""), updated_at=now,
        model_code_sha256=str(index.get("model_code_sha256") or ""),
        deployed=dict(deployed) if deployed is not None else (live.deployed if live else None), unrouted=unrouted,
        legacy_fleet=live.legacy_fleet if live and deployed is None else {},
    )
    if not document.same_serving(live):
        if not write_routes(s3_client, bucket, model_prefix, document, etag):
            _still_applies(s3_client, bucket, model_prefix, stack, live, release_id, wanted, report, now,
                           concurrency)
            again = activate_release(s3_client, bucket, model_prefix, release_id, stack=stack, deployed=deployed,
                                     retention_days=retention_days, clock=clock, concurrency=concurrency,
                                     _conflicts=_conflicts + 1)
            again.verified, again.copied = again.verified + report.verified, again.copied + report.copied
            again.deleted = sorted({*report.deleted, *again.deleted})
            again.seconds = time.monotonic() - started
            return again
        report.wrote = True
    report.seconds = time.monotonic() - started
    return report


def _still_applies(s3_client: Any, bucket: str, model_prefix: str, stack: str, read: Routes | None,
                   release_id: str, wanted: Mapping[str, Route], report: ActivationReport, now: str,
                   concurrency: int) -> None:
    """After a conflicting write: return when the activation may run again on the new routes (the
    other writer routed the release this one had read, or this release); otherwise list this
    release's objects as unrouted in the live routes and raise :class:`RoutesError` naming the
    release the other writer routed."""
    where = f"s3://{bucket}/{routes_key(model_prefix)}"
    other, _ = read_routes_tagged(s3_client, bucket, model_prefix, stack=stack)
    other_id = other.release_id if other else None
    read_id = read.release_id if read else None
    if other_id in {read_id, release_id} and report.conflicts < MAX_ROUTES_CONFLICTS:
        return
    _keep_listed(s3_client, bucket, model_prefix, stack, wanted, report.deleted, now, concurrency)
    if report.conflicts >= MAX_ROUTES_CONFLICTS:
        reason = f"changed by other writers {report.conflicts + 1} times while release {release_id} was being routed"
    elif other is None:
        reason = f"deleted by another writer while release {release_id} was being routed"
    else:
        writer = f"stack {other.stack}" if other.stack else "the CLI"
        reason = (f"another writer ({writer}, {other.updated_at}) routed release {other_id} while release "
                  f"{release_id} was being routed over {read_id or 'no routes'}")
    raise RoutesError(
        f"routes {where}: {reason}; {release_id} is not routed, "
        f"{f'{other_id} keeps serving' if other_id else 'nothing is served'} and the objects of {release_id} "
        f"are kept as unrouted; route {release_id} again to serve it"
    )


def _keep_listed(s3_client: Any, bucket: str, model_prefix: str, stack: str, wanted: Mapping[str, Route],
                 deleted: list[str], now: str, concurrency: int) -> None:
    """A release that lost the race leaves no served object unlisted: each of its objects the live
    routes neither route nor list is added to their unrouted objects (the retention window applies),
    and an object this activation deleted that the live routes do route is copied back from the store."""
    served = served_prefix(model_prefix)
    for _ in range(MAX_ROUTES_CONFLICTS):
        live, etag = read_routes_tagged(s3_client, bucket, model_prefix, stack=stack)
        if live is None:
            return
        routed = {route.target_model: route for route in live.routes.values()}
        back = [routed[name] for name in deleted if name in routed]
        if back:
            copy_served(s3_client, bucket, [
                served_object(f"{served}/{r.target_model}", r.logical_name, r.source_model, r.size, r.sha256,
                              f"{store_prefix(model_prefix, r.model_key)}/{STORE_TARGET}.tar.gz") for r in back
            ], list_sizes(s3_client, bucket, served), concurrency)
        unrouted = dict(live.unrouted)
        for route in wanted.values():
            if route.target_model not in routed and route.target_model not in unrouted:
                unrouted[route.target_model] = Unrouted(route.target_model, route.logical_name, route.sha256,
                                                        route.size, route.model_key, now)
        if len(unrouted) == len(live.unrouted) or write_routes(
                s3_client, bucket, model_prefix, dataclasses.replace(live, unrouted=unrouted), etag):
            return


def _verify_or_repair(s3_client: Any, bucket: str, model_prefix: str, route: Route, routed: bool) -> int:
    """Check one served object's digest; one the live routes already route that holds other bytes
    (overwritten while routed) is copied back from the store (returns 1). A newly routed one with
    other bytes is refused: nobody routed that name yet, so its writer is unknown."""
    key = f"{served_prefix(model_prefix)}/{route.target_model}"
    if not routed:
        _check_digest(s3_client, bucket, key, route.sha256, route.size, route.logical_name)
        return 0
    obj = Expected(key, route.logical_name, route.sha256, route.size, route.model_key)
    if object_problem(s3_client, bucket, obj, {key: route.size}) is None:
        return 0
    copy_from_store(s3_client, bucket, model_prefix, obj)
    _check_digest(s3_client, bucket, key, route.sha256, route.size, route.logical_name)
    return 1


def _check_digest(s3_client: Any, bucket: str, key: str, sha256: str, size: int, model: str) -> None:
    """A served object must hold the bytes its route names (the ``sha256`` metadata the publish
    stored, and S3's own full-object checksum where it has one)."""
    matches, head = head_matches(s3_client, bucket, key, size, sha256, require_checksum=True)
    if not matches:
        head = head or {}
        stored = head.get("Metadata", {}).get(SHA256_METADATA)
        checksum = head.get("ChecksumSHA256") or "none"
        raise RoutesError(
            f"model {model!r}: served object s3://{bucket}/{key} has sha256 {str(stored)[:16]}..., S3 checksum "
            f"{checksum} and {head.get('ContentLength')} bytes; its route says {sha256[:16]}... and {size} bytes; "
            "nothing was routed, the previous routes keep serving", model=model,
        )


def _delete_keys(s3_client: Any, bucket: str, keys: list[str]) -> None:
    for start in range(0, len(keys), 1000):
        response = s3_client.delete_objects(
            Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[start:start + 1000]], "Quiet": True})
        errors = response.get("Errors", [])
        if errors:
            raise PublishError(f"deleting s3://{bucket}/{errors[0]['Key']} failed: {errors[0].get('Code', '?')}")


def destroy_served(s3_client: Any, bucket: str, model_prefix: str) -> int:
    """Stack deletion with ``OnDelete: destroy``: every served object, release index and the
    routes document (every version). The store of builds is left (another stack may share it)."""
    base = model_prefix.strip("/")
    count = 0
    for folder in (served_prefix(model_prefix), f"{base}/{RELEASES_DIR}" if base else RELEASES_DIR,
                   routes_key(model_prefix).rsplit("/", 1)[0]):
        count += delete_release(s3_client, bucket, folder)
    return count


def legacy_releases(s3_client: Any, bucket: str, model_prefix: str) -> dict[str, tuple[int, int]]:
    """Per-release prefixes of the earlier layout under ``model_prefix``: ``{release_id:
    (objects, bytes)}``. Stacks of earlier versions served ``<prefix>/<release_id>/``; after the
    move to the fixed served prefix they are left for rollback until deleted on request."""
    base = model_prefix.strip("/")
    found: dict[str, tuple[int, int]] = {}
    paginator = s3_client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=f"{base}/" if base else "", Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            name = common["Prefix"].rstrip("/").rpartition("/")[2]
            if LEGACY_RELEASE.match(name):
                sizes = list_sizes(s3_client, bucket, common["Prefix"].rstrip("/"))
                found[name] = (len(sizes), sum(sizes.values()))
    return dict(sorted(found.items()))


def delete_legacy_release(s3_client: Any, bucket: str, model_prefix: str, release_id: str) -> int:
    """Delete one release prefix of the earlier layout (every version); returns objects deleted."""
    if not LEGACY_RELEASE.match(release_id):
        raise RoutesError(f"release: got {release_id!r}; expected r- and 16 hex digits")
    base = model_prefix.strip("/")
    return delete_release(s3_client, bucket, f"{base}/{release_id}" if base else release_id)

