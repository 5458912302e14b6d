"""The content-addressed store of built models and the releases assembled from it.

A built model is stored once per model key under ``<prefix>/_builds/<key>/`` (:func:`publish_unit`,
its own index written last); a release is assembled from the store (:func:`assemble_release`):
every logical target gets its immutable served name ``<target>-<sha12>.tar.gz`` by a server-side
copy (skipped when already there), and the release's index is written last, outside the served
prefix. Nothing here routes a release: :func:`model_build.release.serving.activate_release` does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from s3transfer.manager import TransferManager

from triton_mme_cdk.model_build.errors import PublishError
from triton_mme_cdk.model_build.manifest import Manifest
from triton_mme_cdk.model_build.release.identity import (
    BUILDS_DIR,
    INDEX_NAME,
    REFERENCE_DIR,
    Release,
    served_prefix,
    store_prefix,
)
from triton_mme_cdk.model_build.release.index import (
    read_index,
    read_routes,
    served_index_body,
    target_footprint,
)
from triton_mme_cdk.model_build.release.publish import PublishReport, publish_release, put_index
from triton_mme_cdk.model_build.release.routes import RoutesError, served_name
from triton_mme_cdk.model_build.release.transfer import (
    Progress,
    S3Object,
    TransferWorker,
    error_code,
    iter_objects,
    list_sizes,
    normalise_prefix,
    run_all,
    threaded_config,
)
from triton_mme_cdk.model_build.types import Artifact

# ---------------------------------------------------------------------------------------------
# The content-addressed store and releases assembled from it
# ---------------------------------------------------------------------------------------------

#: The target name of a stored build: ``<prefix>/_builds/<key>/model.tar.gz``.
STORE_TARGET = "model"


@dataclass(frozen=True)
class StoredModel:
    """One model of a release, by the key its build is stored under."""

    name: str
    key: str
    targets: tuple[str, ...]
    format: str = ""
    #: :func:`model_build.release.entry_sha256` of the manifest entry ("" when unknown).
    entry_sha256: str = ""


def stored_models(manifest: Manifest, keys: Mapping[str, str]) -> list[StoredModel]:
    """The models of a release, in manifest order, each by its key (``keys``: name -> key); their
    entry hashes come with the release (``ReleaseTarget.entry_hashes``)."""
    return [StoredModel(spec.name, keys[spec.name], tuple(spec.target_names()), spec.format) for spec in manifest.models]


@dataclass(frozen=True)
class ReleaseTarget:
    """Where a release is assembled, shared by the CLI, the Lambda and the benchmarks.

    ``model_prefix`` holds the store (``<prefix>/_builds/``), ``release_prefix`` the release
    itself; ``index_extra`` is what its index records beside the models; ``concurrency`` bounds
    the server-side copies (stored uploads use at most 4) and ``progress`` hears each object."""

    s3_client: Any
    bucket: str
    model_prefix: str
    release_prefix: str
    index_extra: Mapping[str, Any] = field(default_factory=dict)
    concurrency: int = 16
    progress: Progress | None = None
    #: ``model name -> entry_sha256`` for models that do not carry their own.
    entry_hashes: Mapping[str, str] = field(default_factory=dict)
    #: Called with the release's index entries before anything is copied or written: a check that
    #: raises (the fit of the footprints on the fleet) stops the release with nothing published.
    check: Callable[[Sequence[Mapping[str, Any]]], None] | None = None
    #: Called with the objects a release is about to copy into the served prefix (those not there
    #: already), before any is copied: a check that raises (the placing step's own hash and the
    #: pre-publish gate on each stored tarball) stops the release with nothing copied.
    admit: Callable[[Sequence[S3Object]], None] | None = None

    @classmethod
    def of(cls, release: Release, s3_client: Any, bucket: str, model_prefix: str, **options: Any) -> ReleaseTarget:
        """The target of ``release`` under ``model_prefix``: its prefix, and its ids in the index."""
        return cls(s3_client, bucket, model_prefix, release.prefix(model_prefix), release.index_fields(),
                   entry_hashes=release.entry_hashes, **options)


def stored_keys(s3_client: Any, bucket: str, model_prefix: str) -> set[str]:
    """Keys whose build is complete in the store (its index exists): one paginated LIST."""
    base = f"{model_prefix.strip('/')}/{BUILDS_DIR}" if model_prefix.strip("/") else BUILDS_DIR
    suffix = f"/{INDEX_NAME}"
    return {
        key[len(base) + 1 : -len(suffix)]
        for key, _ in _list_sizes_or_fail(s3_client, bucket, base)
        if key.endswith(suffix) and key.count("/", len(base) + 1) == 1
    }


def is_stored(s3_client: Any, bucket: str, model_prefix: str, key: str) -> bool:
    """Whether ``key``'s build is complete in the store (its index exists): one LIST whose prefix
    is that index alone, so a Map item's check costs one request however large the store grows
    (:func:`stored_keys` lists it all). Not a HEAD: for a role whose ``s3:ListBucket`` is
    conditioned on ``s3:prefix`` (the build role's), S3 answers a HEAD of a missing object with
    403, not 404."""
    index = f"{store_prefix(model_prefix, key)}/{INDEX_NAME}"
    try:
        response = s3_client.list_objects_v2(Bucket=bucket, Prefix=index, MaxKeys=1)
    except (ClientError, BotoCoreError) as error:
        raise PublishError(f"listing s3://{bucket}/{index} failed: {error_code(error)}") from None
    return any(item["Key"] == index for item in response.get("Contents", []))


def _list_sizes_or_fail(s3_client: Any, bucket: str, prefix: str) -> list[tuple[str, int]]:
    try:
        return list(iter_objects(s3_client, bucket, prefix))
    except (ClientError, BotoCoreError) as error:
        raise PublishError(f"listing s3://{bucket}/{prefix}/ failed: {error_code(error)}") from None


def publish_unit(
    artifact: Artifact,
    key: str,
    *,
    s3_client: Any,
    bucket: str,
    model_prefix: str,
    concurrency: int = 4,
    progress: Progress | None = None,
) -> PublishReport:
    """Store one built model under ``<prefix>/_builds/<key>/`` (tarball, reference, config,
    then the store's own index, written last: its presence means the build is stored whole).

    The same publish as a release's (checksums, skip rule, atomic index), with one target."""
    return publish_release(
        [replace(artifact, targets=(STORE_TARGET,))],
        s3_client=s3_client,
        bucket=bucket,
        release_prefix=store_prefix(model_prefix, key),
        index_extra={"model_key": key},
        concurrency=concurrency,
        progress=progress,
    )


def assemble_release(models: Sequence[StoredModel], target: ReleaseTarget) -> PublishReport:
    """Put a release's models where the endpoint serves them, then write the release's index.

    Every logical target gets the immutable served name ``<target>-<sha12>.tar.gz`` under the
    served prefix (:func:`triton_mme_client.routes.served_name`): one already there with the same
    digest is skipped (an unchanged model costs nothing), a missing one is a server-side copy of
    the stored build. An object already under a served name with other bytes is never
    overwritten: the release fails naming the model and the key. References stay in the store
    (the index points at them), so a release copies nothing for an unchanged model.

    Each model's store index is read first; a model whose key is not stored fails the release
    (naming the model) before anything is copied, and no index is written. The index goes to the
    release's bookkeeping folder (``<prefix>/_releases/<id>/``), outside the served prefix, and
    switches nothing: :func:`model_build.release.serving.activate_release` routes the release.
    """
    if not models:
        raise ValueError("models: empty; a release without models would serve nothing")
    s3_client, bucket, model_prefix, concurrency = target.s3_client, target.bucket, target.model_prefix, target.concurrency
    prefix = normalise_prefix(target.release_prefix)
    served = served_prefix(model_prefix)
    started = time.monotonic()

    def read_store(model: StoredModel) -> dict[str, Any]:
        store_index = f"{store_prefix(model_prefix, model.key)}/{INDEX_NAME}"
        document = read_index(s3_client, bucket, store_index)
        if document is None or len(document["models"]) != 1:
            raise PublishError(
                f"no stored build for key {model.key} (s3://{bucket}/{store_index} is missing); "
                "build the model first, then assemble the release",
                model=model.name,
            )
        return document

    # The routed release's index already says what the store holds for its keys: one GET in place
    # of one per unchanged model (a one-model change at 3000 models reads 1 store index, not 3000).
    known, routed = _routed_stores(s3_client, bucket, model_prefix)
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="store-index") as pool:
        stores = list(pool.map(lambda m: known.get(m.key) or read_store(m), models))
    entries: list[dict[str, Any]] = []
    objects: list[S3Object] = []
    references: list[dict[str, Any]] = []
    for model, store in zip(models, stores, strict=True):
        entry = stored_entry(model_prefix, model, store)
        for logical in model.targets:
            name = served_name(logical, entry["sha256"])
            key = f"{served}/{name}"
            objects.append(S3Object(key=key, label=logical, model=model.name, size=entry["size"],
                                   sha256=entry["sha256"], source_key=entry["key"]))
            entries.append({
                "target_model": name, "key": key, "logical_name": logical, "sha256": entry["sha256"],
                "size": entry["size"], "format": model.format or entry["format"], "source_model": model.name,
                "model_key": model.key, "entry_sha256": model.entry_sha256 or target.entry_hashes.get(model.name, ""),
                **target_footprint(entry.get("footprint"), logical),
                **({"signature": entry["signature"]} if entry.get("signature") else {}),
            })
        references += [{"source_model": model.name, "key": ref["key"], "sha256": ref["sha256"], "size": ref["size"]}
                       for ref in store.get("references", [])]
    if target.check is not None:
        target.check(entries)
    listing = list_sizes(s3_client, bucket, served)
    # What the routed release serves was checked when it was routed: an object it routes under the
    # same name, listed with the same size, is skipped without a HEAD (the others are checked).
    pending = [obj for obj in objects if not (routed.get(obj.key) == obj.sha256 and listing.get(obj.key) == obj.size)]
    if target.admit is not None:
        target.admit([obj for obj in pending if listing.get(obj.key) is None])
    counts, worker = copy_served(s3_client, bucket, pending, listing, concurrency)
    counts["skipped"] += len(objects) - len(pending)
    if target.progress is not None:
        for obj in objects:
            target.progress(obj.key, 0)
    index_key = f"{prefix}/{INDEX_NAME}"
    body = served_index_body(entries, target.index_extra, served, references)
    worker.existing = {**worker.existing, **list_sizes(s3_client, bucket, prefix)}  # an unchanged index is skipped
    outcome, sent = put_index(worker, index_key, body, bucket)
    return PublishReport(
        uploaded=1 if outcome == "uploaded" else 0,
        copied=counts["copied"],
        skipped=counts["skipped"] + (1 if outcome == "skipped" else 0),
        bytes_sent=sent,
        seconds=time.monotonic() - started,
        index_key=index_key,
        targets=len(entries),
    )


def stored_entry(model_prefix: str, model: StoredModel, document: Mapping[str, Any]) -> dict[str, Any]:
    """The one model entry of a store index, which may name only its own key's tarball: the
    store's index is the build's word, and what it names is placed only from the key's folder."""
    entry = dict(document["models"][0])
    stored_at = f"{store_prefix(model_prefix, model.key)}/{STORE_TARGET}.tar.gz"
    if entry.get("key") != stored_at:
        raise PublishError(f"the stored build of key {model.key} names {str(entry.get('key'))[:200]!r}; a "
                           f"stored tarball is {stored_at!r}, nothing else is placed", model=model.name)
    return entry


def place_stored(s3_client: Any, bucket: str, model_prefix: str, model: StoredModel, *,
                 admit: Callable[[Sequence[S3Object]], None] | None = None, concurrency: int = 4) -> int:
    """Put one stored model under its served names (``<target>-<sha12>.tar.gz``), as
    :func:`assemble_release` puts a release's: ``admit`` first checks those not served yet; one
    already there with the same digest is skipped, one with other bytes is refused. Returns how
    many were copied. Writes no index: the release's is :func:`assemble_release`'s."""
    store_index = f"{store_prefix(model_prefix, model.key)}/{INDEX_NAME}"
    document = read_index(s3_client, bucket, store_index)
    if document is None or len(document["models"]) != 1:
        raise PublishError(f"no stored build for key {model.key} (s3://{bucket}/{store_index} is missing)",
                           model=model.name)
    entry = stored_entry(model_prefix, model, document)
    served = served_prefix(model_prefix)
    objects = [S3Object(key=f"{served}/{served_name(logical, entry['sha256'])}", label=logical, model=model.name,
                        size=entry["size"], sha256=entry["sha256"], source_key=entry["key"])
               for logical in dict.fromkeys(model.targets)]
    existing: dict[str, int] = {}
    for obj in objects:  # one LIST of each name (the served prefix may hold thousands)
        try:
            listed = s3_client.list_objects_v2(Bucket=bucket, Prefix=obj.key, MaxKeys=1).get("Contents", [])
        except (ClientError, BotoCoreError) as error:
            raise PublishError(f"listing s3://{bucket}/{obj.key} failed: {error_code(error)}", model=model.name) from None
        existing.update((item["Key"], int(item["Size"])) for item in listed if item["Key"] == obj.key)
    if admit is not None:
        admit([obj for obj in objects if obj.key not in existing])
    counts, _ = copy_served(s3_client, bucket, objects, existing, concurrency)
    return counts["copied"]


def _routed_stores(s3_client: Any, bucket: str, model_prefix: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """``model key -> store document`` for the models of the release routed now, rebuilt from its
    index (the store is immutable per key, so its index says the same), and ``served key ->
    sha256`` of what it routes. Empty when nothing is routed or the routes cannot be read (the
    activation reports a bad routes document)."""
    try:
        live = read_routes(s3_client, bucket, model_prefix)
        index = read_index(s3_client, bucket, live.index_key) if live is not None else None
    except (RoutesError, PublishError):
        return {}, {}
    known: dict[str, dict[str, Any]] = {}
    routed = {str(entry["key"]): str(entry["sha256"]) for entry in (index or {}).get("models") or []}
    references: dict[str, list[dict[str, Any]]] = {}
    for ref in (index or {}).get("references") or []:
        references.setdefault(str(ref["key"]).partition(f"/{REFERENCE_DIR}/")[0], []).append(ref)
    for entry in (index or {}).get("models") or []:
        model_key = entry.get("model_key")
        if not model_key or model_key in known:
            continue
        store = store_prefix(model_prefix, model_key)
        known[model_key] = {
            "models": [{"key": f"{store}/{STORE_TARGET}.tar.gz", "sha256": entry["sha256"], "size": entry["size"],
                        "format": entry.get("format", ""), **target_footprint(entry.get("footprint"), STORE_TARGET),
                        **({"signature": entry["signature"]} if entry.get("signature") else {})}],
            "references": references.get(store, []),
        }
    return known, routed


def copy_served(s3_client: Any, bucket: str, objects: Sequence[S3Object], existing: Mapping[str, int],
                concurrency: int) -> tuple[dict[str, int], TransferWorker]:
    """Server-side copies into the served prefix: an object already there with the same digest is
    skipped; one there with other bytes fails the whole call naming the model and the key (never
    overwritten). Returns the counts (``copied``, ``skipped``) and the worker (for its refusals)."""
    counts = {"copied": 0, "skipped": 0}
    counting = threading.Lock()
    config = threaded_config(None, concurrency)
    with TransferManager(s3_client, config) as transfer:
        worker = TransferWorker(s3_client, bucket, transfer, config, existing, threading.Event(), immutable=True)

        def copy(obj: S3Object) -> None:
            outcome, _, _ = worker.copy(obj)
            with counting:
                counts[outcome] += 1

        try:
            run_all(copy, objects, concurrency, what="copy", bucket=bucket, key=lambda obj: obj.key)
        except PublishError as error:
            mismatch = next((obj for obj in objects if obj.key in worker.refused), None)
            raise PublishError(str(error), model=mismatch.model if mismatch else None) from None
    return counts, worker


def served_object(key: str, label: str, model: str, size: int, sha256: str, source_key: str) -> S3Object:
    """One object to copy into the served prefix (for :func:`copy_served`)."""
    return S3Object(key=key, label=label, model=model, size=size, sha256=sha256, source_key=source_key)


def publish_incremental(units: Sequence[tuple[Artifact, str]], target: ReleaseTarget) -> PublishReport:
    """Publish a locally built release the way the Lambda does: store each ``(artifact, key)``
    whose key is not stored yet (:func:`publish_unit`), then :func:`assemble_release`.

    A release where one model changed uploads that model's bytes once and copies the rest.
    The report adds up both: ``uploaded`` counts stored objects and the index, ``copied`` the
    release's server-side copies."""
    return publish_from_store(
        [StoredModel(a.name, key, tuple(a.targets), a.format) for a, key in units],
        {key: artifact for artifact, key in units},
        target,
    )


def publish_from_store(
    models: Sequence[StoredModel],
    artifacts: Mapping[str, Artifact],
    target: ReleaseTarget,
    *,
    present: set[str] | None = None,
) -> PublishReport:
    """Store the built ``artifacts`` (by key) whose key the bucket's store lacks, then assemble
    the release of ``models`` from the store. A model whose key is neither stored nor among
    ``artifacts`` fails the assembly, naming it. ``present``: the stored keys, if already listed."""
    started = time.monotonic()
    if present is None:
        present = stored_keys(target.s3_client, target.bucket, target.model_prefix)
    uploaded = skipped = sent = 0
    for key in dict.fromkeys(model.key for model in models):
        if key in present or key not in artifacts:
            continue
        report = publish_unit(artifacts[key], key, s3_client=target.s3_client, bucket=target.bucket,
                              model_prefix=target.model_prefix, concurrency=min(4, target.concurrency),
                              progress=target.progress)
        uploaded, skipped, sent = uploaded + report.uploaded, skipped + report.skipped, sent + report.bytes_sent
    release = assemble_release(models, target)
    return PublishReport(
        uploaded=uploaded + release.uploaded,
        copied=release.copied,
        skipped=skipped + release.skipped,
        bytes_sent=sent + release.bytes_sent,
        seconds=time.monotonic() - started,
        index_key=release.index_key,
        targets=release.targets,
    )
