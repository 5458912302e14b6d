"""Publish a release's artifacts to S3: each tarball's bytes once, every other copy server-side.

Why it is shaped this way:

- A release is immutable and addressed by its prefix (see :mod:`model_build.release`): SageMaker
  instances cache a model by its TargetModel name, so changed bytes always go under a new prefix
  and nothing here ever needs to replace a live object with different content.
- The copies of a model (``bert-0`` ... ``bert-199``) share one tarball. Uploading it 200 times is
  what made the notebooks slow; here the bytes cross the network once and S3 makes the copies
  (``CopyObject``), in parallel.
- Integrity: every upload carries a SHA-256 that S3 checks before it stores the object (a full
  object checksum for a single PUT; a per-part checksum for multipart uploads, whose object
  checksum is then composite). The full-object hex digest is also stored as user metadata
  ``sha256``, the one value that means the same for single-part, multipart and copied objects.
- Atomicity: S3 shows an object under its key only once its PUT or multipart upload completes,
  and the transfer manager aborts a multipart upload that fails. The index ``_index.json`` is
  written last, so its presence means every object of the release is in place; a failed publish
  leaves no index, and running it again uploads only what is missing (objects already present
  with the same ``sha256`` and size are skipped, so an unchanged release costs a listing and a
  few HEAD requests).
- Retries belong to botocore (see :func:`model_build.aws_clients.make_s3_client`): nothing here
  loops around an S3 call.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError
from s3transfer.manager import TransferManager

from model_build.errors import PublishError
from model_build.manifest import Manifest
from model_build.release import (
    BUILDS_DIR,
    INDEX_NAME,
    REFERENCE_DIR,
    Release,
    served_name,
    served_prefix,
    store_prefix,
)
from model_build.types import Artifact

#: Version of the index layout; a reader refuses an index of a schema it does not know.
INDEX_SCHEMA = 1
#: User-metadata key (``x-amz-meta-sha256``) holding the full-object hex SHA-256.
SHA256_METADATA = "sha256"
#: The largest object a single CopyObject can copy; larger ones are copied part by part.
COPY_OBJECT_MAX = 5 * 1024**3
_MIB = 1024**2
#: Multipart above 64 MiB in 16 MiB parts: a typical ONNX model goes up in one PUT (one request,
#: one full-object checksum), a large one in parallel parts that are retried one by one.
DEFAULT_MULTIPART_THRESHOLD = 64 * _MIB
DEFAULT_MULTIPART_CHUNKSIZE = 16 * _MIB
_READ_BLOCK = 1 * _MIB
_CONTENT_TYPES = {".gz": "application/gzip", ".json": "application/json", ".npz": "application/octet-stream"}
_RESERVED_INDEX_FIELDS = frozenset({"schema", "models", "references"})

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class PublishReport:
    """What a publish did. ``bytes_sent`` counts object bodies uploaded (tarballs, references and
    the index), not the bytes of retried requests; a publish of an unchanged release sends 0."""

    uploaded: int
    copied: int
    skipped: int
    bytes_sent: int
    seconds: float
    index_key: str
    targets: int


@dataclass(frozen=True)
class _Object:
    """One object to put under ``key``: a local file, or copied from ``source_key``."""

    key: str
    label: str  # names the object in messages: the target or the reference
    model: str
    size: int
    sha256: str | None = None  # hex; None until hashed (references are hashed in a worker)
    path: Path | None = None
    source_key: str | None = None


# ---------------------------------------------------------------------------------------------
# Publish
# ---------------------------------------------------------------------------------------------


def publish_release(
    artifacts: Sequence[Artifact],
    *,
    s3_client: Any,
    bucket: str,
    release_prefix: str,
    index_extra: Mapping[str, Any],
    concurrency: int = 16,
    progress: Progress | None = None,
    transfer_config: TransferConfig | None = None,
) -> PublishReport:
    """Publish ``artifacts`` under ``s3://<bucket>/<release_prefix>/`` and write its index last.

    Each artifact's tarball is uploaded once, to the key of its first target; its other targets
    are server-side copies of that object. References go to ``_reference/<model>.npz``. Objects
    already present with the same ``sha256`` metadata and size are skipped, so a re-run after a
    failure finishes the release and a re-run of a finished release changes nothing.

    ``progress(key, bytes_sent)`` is called in the calling thread once per object when it is done
    (``bytes_sent`` is 0 for a copy or a skip). ``transfer_config`` sets the multipart threshold
    and part size (its concurrency is replaced by ``concurrency``).

    Raises :class:`PublishError` (naming the first object that failed and the S3 error code) when
    any object cannot be written; the index is then not written.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency: got {concurrency}; expected >= 1")
    if not artifacts:
        raise ValueError("artifacts: empty; a release without models would serve nothing")
    reserved = _RESERVED_INDEX_FIELDS & set(index_extra)
    if reserved:
        raise ValueError(f"index_extra: fields {sorted(reserved)} are written by publish itself")
    prefix = _normalise_prefix(release_prefix)
    primaries, copies = _plan(artifacts, prefix)
    config = _transfer_config(transfer_config, concurrency)
    started = time.monotonic()
    existing = _list_sizes(s3_client, bucket, prefix)
    counts = {"uploaded": 0, "copied": 0, "skipped": 0, "bytes": 0}
    stop = threading.Event()
    failures: list[PublishError] = []

    def done(obj: _Object, outcome: str, sent: int) -> None:
        counts[outcome] += 1
        counts["bytes"] += sent
        if progress is not None:
            progress(obj.key, sent)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="publish") as pool, TransferManager(
        s3_client, config
    ) as transfer:
        worker = _Worker(s3_client, bucket, transfer, config, existing, stop)
        pending: dict[Future[tuple[str, int, _Object]], _Object] = {
            pool.submit(worker.put_file, obj): obj for obj in primaries
        }
        try:
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    obj = pending.pop(future)
                    error = future.exception() if not future.cancelled() else None
                    if future.cancelled() or isinstance(error, _Stopped):
                        continue
                    if error is not None:
                        failures.append(_publish_error(error, obj, bucket))
                        if not stop.is_set():
                            # Start nothing new; requests already in flight finish (or fail) on
                            # their own, so no multipart upload is left half-done by us.
                            stop.set()
                            for other in pending:
                                other.cancel()
                        continue
                    outcome, sent, result = future.result()
                    done(result, outcome, sent)
                    if not stop.is_set():
                        for copy in copies.get(obj.key, ()):
                            pending[pool.submit(worker.copy, copy)] = copy
        except BaseException:
            # KeyboardInterrupt or a failing progress callback: stop the workers; leaving the
            # TransferManager block with an exception cancels its transfers and aborts their
            # multipart uploads.
            stop.set()
            for other in pending:
                other.cancel()
            raise

    if failures:
        first = failures[0]
        more = f" ({len(failures) - 1} more objects failed)" if len(failures) > 1 else ""
        raise PublishError(f"{first}{more}; no index written, re-run to finish", model=first.model)

    index_key = f"{prefix}/{INDEX_NAME}"
    body = index_body(artifacts, prefix, index_extra, references=_reference_entries(primaries, worker))
    outcome, sent = _put_index(worker, index_key, body, bucket)
    done(_index_object(index_key, body), outcome, sent)
    return PublishReport(
        uploaded=counts["uploaded"],
        copied=counts["copied"],
        skipped=counts["skipped"],
        bytes_sent=counts["bytes"],
        seconds=time.monotonic() - started,
        index_key=index_key,
        targets=sum(len(a.targets) for a in artifacts),
    )


def _index_object(index_key: str, body: bytes) -> _Object:
    return _Object(key=index_key, label=INDEX_NAME, model="", size=len(body), sha256=hashlib.sha256(body).hexdigest())


def _put_index(worker: _Worker, index_key: str, body: bytes, bucket: str) -> tuple[str, int]:
    index = _index_object(index_key, body)
    try:
        return worker.put_bytes(index, body)
    except Exception as error:  # one request: report it like any other object
        raise PublishError(f"{_publish_error(error, index, bucket)}; re-run to finish") from None


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


def _list_sizes_or_fail(s3_client: Any, bucket: str, prefix: str) -> list[tuple[str, int]]:
    try:
        return list(_iter_objects(s3_client, bucket, prefix))
    except (ClientError, BotoCoreError) as error:
        raise PublishError(f"listing s3://{bucket}/{prefix}/ failed: {_error_code(error)}") from None


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
    served prefix (:func:`model_build.release.served_name`): one already there with the same
    digest is skipped (an unchanged model costs nothing), a missing one is a server-side copy of
    the stored build. An object already under a served name with other bytes is never
    overwritten: the release fails naming the model and the key. References stay in the store
    (the index points at them), so a release copies nothing for an unchanged model.

    Each model's store index is read first; a model whose key is not stored fails the release
    (naming the model) before anything is copied, and no index is written. The index goes to the
    release's bookkeeping folder (``<prefix>/_releases/<id>/``), outside the served prefix, and
    switches nothing: :func:`model_build.serving.activate_release` routes the release.
    """
    if not models:
        raise ValueError("models: empty; a release without models would serve nothing")
    s3_client, bucket, model_prefix, concurrency = target.s3_client, target.bucket, target.model_prefix, target.concurrency
    prefix = _normalise_prefix(target.release_prefix)
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
    objects: list[_Object] = []
    references: list[dict[str, Any]] = []
    for model, store in zip(models, stores, strict=True):
        entry = store["models"][0]
        for logical in model.targets:
            name = served_name(logical, entry["sha256"])
            key = f"{served}/{name}"
            objects.append(_Object(key=key, label=logical, model=model.name, size=entry["size"],
                                   sha256=entry["sha256"], source_key=entry["key"]))
            entries.append({
                "target_model": name, "key": key, "logical_name": logical, "sha256": entry["sha256"],
                "size": entry["size"], "format": model.format or entry["format"], "source_model": model.name,
                "model_key": model.key, "entry_sha256": model.entry_sha256 or target.entry_hashes.get(model.name, ""),
            })
        references += [{"source_model": model.name, "key": ref["key"], "sha256": ref["sha256"], "size": ref["size"]}
                       for ref in store.get("references", [])]
    listing = _list_sizes(s3_client, bucket, served)
    # What the routed release serves was checked when it was routed: an object it routes under the
    # same name, listed with the same size, is skipped without a HEAD (the others are checked).
    pending = [obj for obj in objects if not (routed.get(obj.key) == obj.sha256 and listing.get(obj.key) == obj.size)]
    counts, worker = copy_served(s3_client, bucket, pending, listing, concurrency)
    counts["skipped"] += len(objects) - len(pending)
    if target.progress is not None:
        for obj in objects:
            target.progress(obj.key, 0)
    index_key = f"{prefix}/{INDEX_NAME}"
    body = served_index_body(entries, target.index_extra, served, references)
    worker.existing = {**worker.existing, **_list_sizes(s3_client, bucket, prefix)}  # an unchanged index is skipped
    outcome, sent = _put_index(worker, index_key, body, bucket)
    return PublishReport(
        uploaded=1 if outcome == "uploaded" else 0,
        copied=counts["copied"],
        skipped=counts["skipped"] + (1 if outcome == "skipped" else 0),
        bytes_sent=sent,
        seconds=time.monotonic() - started,
        index_key=index_key,
        targets=len(entries),
    )


def _routed_stores(s3_client: Any, bucket: str, model_prefix: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """``model key -> store document`` for the models of the release routed now, rebuilt from its
    index (the store is immutable per key, so its index says the same), and ``served key ->
    sha256`` of what it routes. Empty when nothing is routed or the routes cannot be read (the
    activation reports a bad routes document)."""
    from model_build.routes import RoutesError
    from model_build.serving import read_routes

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
                        "format": entry.get("format", "")}],
            "references": references.get(store, []),
        }
    return known, routed


def copy_served(s3_client: Any, bucket: str, objects: Sequence[_Object], existing: Mapping[str, int],
                concurrency: int) -> tuple[dict[str, int], _Worker]:
    """Server-side copies into the served prefix: an object already there with the same digest is
    skipped; one there with other bytes fails the whole call naming the model and the key (never
    overwritten). Returns the counts (``copied``, ``skipped``) and the worker (for its refusals)."""
    counts = {"copied": 0, "skipped": 0}
    config = _transfer_config(None, concurrency)
    with TransferManager(s3_client, config) as transfer:
        worker = _Worker(s3_client, bucket, transfer, config, existing, threading.Event(), immutable=True)

        def copy(obj: _Object) -> None:
            outcome, _, _ = worker.copy(obj)
            with worker._lock:
                counts[outcome] += 1

        try:
            _run_all(copy, objects, concurrency, what="copy", bucket=bucket, key=lambda obj: obj.key)
        except PublishError as error:
            mismatch = next((obj for obj in objects if obj.key in worker.refused), None)
            raise PublishError(str(error), model=mismatch.model if mismatch else None) from None
    return counts, worker


def served_object(key: str, label: str, model: str, size: int, sha256: str, source_key: str) -> _Object:
    """One object to copy into the served prefix (for :func:`copy_served`)."""
    return _Object(key=key, label=label, model=model, size=size, sha256=sha256, source_key=source_key)


def served_index_body(entries: Sequence[Mapping[str, Any]], index_extra: Mapping[str, Any], served: str,
                      references: Sequence[Mapping[str, Any]]) -> bytes:
    """A release's index: each logical target with its served name, digest and where it came
    from; deterministic JSON (sorted, no timestamps), so an unchanged release writes the same bytes."""
    document = {
        **index_extra,
        "schema": INDEX_SCHEMA,
        "served_prefix": served,
        "models": sorted((dict(e) for e in entries), key=lambda e: e["logical_name"]),
        "references": sorted((dict(ref) for ref in references), key=lambda ref: (ref["source_model"], ref["key"])),
    }
    return (json.dumps(document, sort_keys=True, indent=2) + "\n").encode()


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


def index_body(
    artifacts: Sequence[Artifact],
    release_prefix: str,
    index_extra: Mapping[str, Any],
    *,
    references: Sequence[Mapping[str, Any]] = (),
) -> bytes:
    """The index document: deterministic JSON (sorted keys, no timestamps) so that republishing
    an unchanged release writes byte-identical content, which the skip rule then recognises."""
    prefix = _normalise_prefix(release_prefix)
    models: list[dict[str, Any]] = [
        {
            "target_model": f"{target}.tar.gz",
            "key": f"{prefix}/{target}.tar.gz",
            "sha256": artifact.sha256,
            "size": artifact.size,
            "format": artifact.format,
            "source_model": artifact.name,
        }
        for artifact in artifacts
        for target in artifact.targets
    ]
    models.sort(key=lambda entry: entry["target_model"])
    document = {
        **index_extra,
        "schema": INDEX_SCHEMA,
        "models": models,
        "references": sorted((dict(ref) for ref in references), key=lambda ref: (ref["source_model"], ref["key"])),
    }
    return (json.dumps(document, sort_keys=True, indent=2) + "\n").encode()


def _plan(artifacts: Sequence[Artifact], prefix: str) -> tuple[list[_Object], dict[str, list[_Object]]]:
    """Objects to upload (first target of each artifact, references) and the copies of each."""
    primaries: list[_Object] = []
    copies: dict[str, list[_Object]] = {}
    seen_targets: set[str] = set()
    seen_models: set[str] = set()
    for artifact in artifacts:
        if not artifact.targets:
            raise PublishError("artifact has no targets; nothing would serve it", model=artifact.name)
        if artifact.name in seen_models:
            raise PublishError("artifact given twice", model=artifact.name)
        seen_models.add(artifact.name)
        for target in artifact.targets:
            if target in seen_targets:
                raise PublishError(f"target {target!r} is published by two artifacts", model=artifact.name)
            seen_targets.add(target)
        first = _Object(
            key=f"{prefix}/{artifact.targets[0]}.tar.gz",
            label=artifact.targets[0],
            model=artifact.name,
            size=artifact.size,
            sha256=artifact.sha256,
            path=Path(artifact.path),
        )
        primaries.append(first)
        copies[first.key] = [
            _Object(
                key=f"{prefix}/{target}.tar.gz",
                label=target,
                model=artifact.name,
                size=artifact.size,
                sha256=artifact.sha256,
                source_key=first.key,
            )
            for target in artifact.targets[1:]
        ]
        for extra_path, suffix in ((artifact.reference_path, ".npz"), (artifact.config_path, ".config.pbtxt")):
            if extra_path is None:
                continue
            path = Path(extra_path)
            try:
                size = path.stat().st_size
            except OSError as error:
                raise PublishError(f"reference {str(path)!r}: {error.strerror}", model=artifact.name) from None
            primaries.append(
                _Object(
                    key=f"{prefix}/{REFERENCE_DIR}/{artifact.name}{suffix}",
                    label=f"{REFERENCE_DIR}/{artifact.name}{suffix}",
                    model=artifact.name,
                    size=size,
                    path=path,
                )
            )
    return primaries, copies


def _reference_entries(primaries: Sequence[_Object], worker: _Worker) -> list[dict[str, Any]]:
    return [
        {"source_model": obj.model, "key": obj.key, "sha256": worker.hashes[obj.key], "size": obj.size}
        for obj in primaries
        if obj.label.startswith(f"{REFERENCE_DIR}/")
    ]


class _Stopped(Exception):
    """A task that found the publish already failing and did nothing."""


class _Worker:
    """The per-object steps, run in worker threads; one boto3 client is shared (it is thread-safe)."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        transfer: TransferManager,
        config: TransferConfig,
        existing: Mapping[str, int],
        stop: threading.Event,
        *,
        immutable: bool = False,
    ) -> None:
        self.client = client
        #: Served objects: one present with other bytes is refused, never overwritten.
        self.immutable = immutable
        #: Keys refused for that reason.
        self.refused: set[str] = set()
        self.bucket = bucket
        self.transfer = transfer
        self.config = config
        self.existing = existing
        self.stop = stop
        #: Hex SHA-256 of every uploaded file, by key (the references' go into the index).
        self.hashes: dict[str, str] = {}
        self._lock = threading.Lock()
        self._submit_lock = threading.Lock()

    def put_file(self, obj: _Object) -> tuple[str, int, _Object]:
        """Upload a local file unless an identical object is already there."""
        if self.stop.is_set():
            raise _Stopped
        assert obj.path is not None
        # A tarball's digest is known (the artifact's); a reference is hashed here (it is small).
        digest = bytes.fromhex(obj.sha256) if obj.sha256 else _file_sha256(obj.path, obj.size)
        with self._lock:
            self.hashes[obj.key] = digest.hex()
        if self._already_there(obj.key, obj.size, digest):
            return "skipped", 0, obj
        if obj.sha256:
            # Read the file only when it is sent: a re-run of a large release hashes nothing.
            actual = _file_sha256(obj.path, obj.size)
            if actual != digest:
                raise _LocalMismatch(
                    f"file {str(obj.path)!r} has sha256 {actual.hex()[:12]}..., the artifact says "
                    f"{obj.sha256[:12]}...; it changed after packaging"
                )
        if self.stop.is_set():
            raise _Stopped
        extra: dict[str, Any] = {
            "ChecksumAlgorithm": "SHA256",
            "Metadata": {SHA256_METADATA: digest.hex()},
            "ContentType": _content_type(obj.key),
        }
        if obj.size < self.config.multipart_threshold:
            # One PUT: S3 recomputes SHA-256 over the body and rejects it (BadDigest) on mismatch.
            # A multipart upload cannot take a full-object SHA-256 (S3 allows full-object
            # checksums for the CRC family only); its parts are each checked with their own.
            extra["ChecksumSHA256"] = _b64(digest)
        with self._submit_lock:  # TransferManager's submit path keeps an unlocked counter
            future = self.transfer.upload(str(obj.path), self.bucket, obj.key, extra_args=extra)
        future.result()
        return "uploaded", obj.size, obj

    def put_bytes(self, obj: _Object, body: bytes) -> tuple[str, int]:
        """Write a small in-memory object (the index) with the same skip rule and checksums."""
        digest = hashlib.sha256(body).digest()
        if self._already_there(obj.key, len(body), digest):
            return "skipped", 0
        self.client.put_object(
            Bucket=self.bucket,
            Key=obj.key,
            Body=body,
            ChecksumAlgorithm="SHA256",
            ChecksumSHA256=_b64(digest),
            Metadata={SHA256_METADATA: digest.hex()},
            ContentType=_content_type(obj.key),
        )
        return "uploaded", len(body)

    def copy(self, obj: _Object) -> tuple[str, int, _Object]:
        """Make ``obj`` a server-side copy of its source (metadata included); no bytes are sent."""
        if self.stop.is_set():
            raise _Stopped
        assert obj.source_key is not None and obj.sha256 is not None
        digest = bytes.fromhex(obj.sha256)
        if self._already_there(obj.key, obj.size, digest):
            return "skipped", 0, obj
        if self.immutable and self._present(obj.key):
            with self._lock:
                self.refused.add(obj.key)
            raise _LocalMismatch(
                f"model {obj.model!r}: served object already holds other bytes than sha256 "
                f"{obj.sha256[:16]}... (a served name never gets new bytes); nothing was overwritten"
            )
        source = {"Bucket": self.bucket, "Key": obj.source_key}
        if obj.size <= COPY_OBJECT_MAX:
            response = self.client.copy_object(
                Bucket=self.bucket,
                Key=obj.key,
                CopySource=source,
                MetadataDirective="COPY",
                ChecksumAlgorithm="SHA256",
            )
            # S3 computes the copy's SHA-256 over the bytes it copied; a full-object value must
            # then be the artifact's digest.
            stored = _full_object_sha256(response.get("CopyObjectResult", {}))
            if stored is not None and stored != _b64(digest):
                raise _LocalMismatch(f"copy has sha256 {stored}, expected {_b64(digest)}")
        else:
            # Above 5 GiB CopyObject is refused: the transfer manager copies in parts (UploadPartCopy)
            # and carries the source's metadata (sha256, content type) over itself.
            with self._submit_lock:
                future = self.transfer.copy(source, self.bucket, obj.key, extra_args={"ChecksumAlgorithm": "SHA256"})
            future.result()
        return "copied", 0, obj

    def _present(self, key: str) -> bool:
        """Whether any object is under ``key`` now (listed, or found by a HEAD)."""
        if key in self.existing:
            return True
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as error:
            if _error_code(error) in {"404", "NoSuchKey", "NotFound"}:
                return False
            raise
        return True

    def _already_there(self, key: str, size: int, digest: bytes) -> bool:
        """The skip rule: present, same size, same ``sha256`` metadata (and, when S3 holds a full-
        object SHA-256 checksum, the same checksum: that one S3 computed from the bytes)."""
        if self.existing.get(key) != size:
            return False
        return head_matches(self.client, self.bucket, key, size, digest.hex())[0]


def head_matches(client: Any, bucket: str, key: str, size: int, sha256: str) -> tuple[bool, dict[str, Any] | None]:
    """Whether the object under ``key`` has ``size`` bytes, the ``sha256`` metadata and (when S3
    holds a full-object SHA-256 checksum, the one S3 computed from the bytes) that checksum;
    with its HEAD answer (None when there is no object)."""
    try:
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as error:
        if _error_code(error) in {"404", "NoSuchKey", "NotFound"}:
            return False, None
        raise
    if head.get("ContentLength") != size or head.get("Metadata", {}).get(SHA256_METADATA) != sha256:
        return False, head
    stored = _full_object_sha256(head)
    return stored is None or stored == _b64(bytes.fromhex(sha256)), head


class _LocalMismatch(Exception):
    """A digest that does not match what the artifact or the index says."""


# ---------------------------------------------------------------------------------------------
# Index, retire, delete, download
# ---------------------------------------------------------------------------------------------


def read_index(s3_client: Any, bucket: str, index_key: str) -> dict[str, Any] | None:
    """The release index, or None when it is absent (the release is missing or incomplete)."""
    try:
        response = s3_client.get_object(Bucket=bucket, Key=index_key)
        body = response["Body"].read()
    except ClientError as error:
        if _error_code(error) in {"NoSuchKey", "404", "NotFound"}:
            return None
        if _error_code(error) in {"AccessDenied", "403"} and not _listed(s3_client, bucket, index_key):
            # S3 answers 403, not 404, for a missing key unless the caller may list the bucket
            # without an s3:prefix condition; the build role may list only under its prefix.
            return None
        raise PublishError(f"reading index s3://{bucket}/{index_key} failed: {_error_code(error)}") from None
    try:
        document = json.loads(body)
    except ValueError as error:
        raise PublishError(f"index s3://{bucket}/{index_key} is not valid JSON: {error}") from None
    if not isinstance(document, dict) or document.get("schema") != INDEX_SCHEMA:
        found = document.get("schema") if isinstance(document, dict) else type(document).__name__
        raise PublishError(
            f"index s3://{bucket}/{index_key}: schema {found!r}; this build reads schema {INDEX_SCHEMA}"
        )
    return document


def _listed(s3_client: Any, bucket: str, key: str) -> bool:
    """Whether ``key`` exists, by a listing (a missing key's GET may answer 403); False if the
    listing itself is refused (the caller's error stands)."""
    try:
        response = s3_client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
    except (ClientError, BotoCoreError):
        return True
    return any(item["Key"] == key for item in response.get("Contents", []))


def retire_release(
    s3_client: Any,
    bucket: str,
    release_prefix: str,
    *,
    tag_key: str = "triton-mme:release-state",
    tag_value: str = "retired",
    concurrency: int = 16,
) -> int:
    """Tag every object of a superseded release; returns how many objects carry the tag.

    A bucket lifecycle rule filtered on this tag expires the objects after some days, so the old
    release stays loadable for instances (and rollbacks) that still point at it for a while.
    Tags already on an object are kept (PutObjectTagging replaces the whole set).
    """
    prefix = _normalise_prefix(release_prefix)

    def tag(key: str) -> None:
        current = s3_client.get_object_tagging(Bucket=bucket, Key=key).get("TagSet", [])
        if any(t["Key"] == tag_key and t["Value"] == tag_value for t in current):
            return
        tags = [t for t in current if t["Key"] != tag_key] + [{"Key": tag_key, "Value": tag_value}]
        s3_client.put_object_tagging(Bucket=bucket, Key=key, Tagging={"TagSet": tags})

    keys = [key for key, _ in _iter_objects(s3_client, bucket, prefix)]
    _run_all(tag, keys, concurrency, what="tagging", bucket=bucket)
    return len(keys)


def delete_release(s3_client: Any, bucket: str, release_prefix: str) -> int:
    """Delete every object under the release prefix (every version and delete marker when the
    bucket is or was versioned); returns how many objects or versions were deleted.

    Needs ``s3:GetBucketVersioning`` and, on a versioned bucket, ``s3:ListBucketVersions`` and
    ``s3:DeleteObjectVersion`` (deleting by key alone would only add delete markers). Open
    multipart uploads are left to the bucket's AbortIncompleteMultipartUpload lifecycle rule.
    """
    prefix = _normalise_prefix(release_prefix)
    try:
        versioned = "Status" in s3_client.get_bucket_versioning(Bucket=bucket)
        if versioned:
            entries: list[dict[str, str]] = []
            for page in s3_client.get_paginator("list_object_versions").paginate(
                Bucket=bucket, Prefix=f"{prefix}/"
            ):
                for item in page.get("Versions", []) + page.get("DeleteMarkers", []):
                    entries.append({"Key": item["Key"], "VersionId": item["VersionId"]})
        else:
            entries = [{"Key": key} for key, _ in _iter_objects(s3_client, bucket, prefix)]
        deleted = 0
        for start in range(0, len(entries), 1000):  # DeleteObjects takes at most 1000 keys
            response = s3_client.delete_objects(
                Bucket=bucket, Delete={"Objects": entries[start : start + 1000], "Quiet": True}
            )
            errors = response.get("Errors", [])
            if errors:
                first = errors[0]
                raise PublishError(
                    f"deleting s3://{bucket}/{first['Key']} failed: {first.get('Code', 'unknown')}"
                    + (f" ({len(errors) - 1} more)" if len(errors) > 1 else "")
                )
            deleted += len(entries[start : start + 1000])
    except (ClientError, BotoCoreError) as error:
        raise PublishError(f"deleting release s3://{bucket}/{prefix}/ failed: {_error_code(error)}") from None
    return deleted


def download_release(
    s3_client: Any, bucket: str, release_prefix: str, out_dir: str | os.PathLike[str], *, concurrency: int = 8
) -> list[Path]:
    """Download a release's tarballs and references into ``out_dir``, each checked against the
    SHA-256 the index records; returns the paths (tarballs by target, then references).

    A file is written under a temporary name and renamed only once its digest matches, so a
    failed or tampered download never leaves a plausible-looking file behind.
    """
    prefix = _normalise_prefix(release_prefix)
    index_key = f"{prefix}/{INDEX_NAME}"
    index = read_index(s3_client, bucket, index_key)
    if index is None:
        raise PublishError(f"release s3://{bucket}/{prefix}/ has no index; it is incomplete or absent")
    out = Path(out_dir)
    jobs: list[tuple[str, str, int, Path]] = [
        (entry["key"], entry["sha256"], entry["size"], out / entry["target_model"]) for entry in index["models"]
    ]
    jobs += [
        (ref["key"], ref["sha256"], ref["size"], out / REFERENCE_DIR / ref["key"].rsplit("/", 1)[-1])
        for ref in index.get("references", [])
    ]
    for _, _, _, path in jobs:
        path.parent.mkdir(parents=True, exist_ok=True)

    def fetch(job: tuple[str, str, int, Path]) -> None:
        key, expected, size, path = job
        partial = path.with_name(f".{path.name}.partial")
        digest = hashlib.sha256()
        length = 0
        try:
            body = s3_client.get_object(Bucket=bucket, Key=key)["Body"]
            with partial.open("wb") as handle:
                for block in body.iter_chunks(_READ_BLOCK):
                    digest.update(block)
                    length += len(block)
                    handle.write(block)
            if digest.hexdigest() != expected or length != size:
                raise _LocalMismatch(
                    f"got sha256 {digest.hexdigest()[:12]}... ({length} bytes), the index says "
                    f"{expected[:12]}... ({size} bytes)"
                )
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)

    _run_all(fetch, jobs, concurrency, what="download", bucket=bucket, key=lambda job: job[0])
    return [path for _, _, _, path in jobs]


# ---------------------------------------------------------------------------------------------
# The baseline
# ---------------------------------------------------------------------------------------------


def publish_naive(paths_by_key: Mapping[str, Path], *, s3_client: Any, bucket: str) -> int:
    """The baseline the benchmark compares against: one ``put_object`` after another, every copy
    re-uploaded, no checksum beyond the SDK default, no skip, no index (what the notebooks do).
    Returns the bytes sent."""
    sent = 0
    for key, path in paths_by_key.items():
        with open(path, "rb") as body:
            s3_client.put_object(Bucket=bucket, Key=key, Body=body)
        sent += Path(path).stat().st_size
    return sent


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _normalise_prefix(release_prefix: str) -> str:
    prefix = release_prefix.strip("/")
    if not prefix:
        raise ValueError("release_prefix: empty; a release must live under its own prefix")
    return prefix


def _transfer_config(config: TransferConfig | None, concurrency: int) -> TransferConfig:
    base = config or TransferConfig(
        multipart_threshold=DEFAULT_MULTIPART_THRESHOLD, multipart_chunksize=DEFAULT_MULTIPART_CHUNKSIZE
    )
    return TransferConfig(
        multipart_threshold=base.multipart_threshold,
        multipart_chunksize=base.multipart_chunksize,
        max_concurrency=concurrency,
        use_threads=True,
    )


def list_release(s3_client: Any, bucket: str, release_prefix: str) -> dict[str, int]:
    """Size of every object under a release prefix, by key (one paginated LIST)."""
    return _list_sizes(s3_client, bucket, _normalise_prefix(release_prefix))


def _list_sizes(client: Any, bucket: str, prefix: str) -> dict[str, int]:
    """Sizes of the objects already under the prefix: one LIST instead of a HEAD per absent key."""
    try:
        return dict(_iter_objects(client, bucket, prefix))
    except (ClientError, BotoCoreError) as error:
        raise PublishError(f"listing s3://{bucket}/{prefix}/ failed: {_error_code(error)}") from None


def _iter_objects(client: Any, bucket: str, prefix: str) -> Iterator[tuple[str, int]]:
    # The trailing slash keeps release r-1 from matching the objects of release r-10.
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for item in page.get("Contents", []):
            yield item["Key"], item["Size"]


def _run_all(
    func: Callable[[Any], None],
    items: Sequence[Any],
    concurrency: int,
    *,
    what: str,
    bucket: str,
    key: Callable[[Any], str] = str,
) -> None:
    """Run ``func`` over ``items`` in threads; the first failure becomes a PublishError."""
    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix=what) as pool:
        futures = {pool.submit(func, item): item for item in items}
        failures = [(futures[f], error) for f in futures if (error := f.exception()) is not None]
    if failures:
        item, error = failures[0]
        detail = str(error) if isinstance(error, _LocalMismatch) else _error_code(error)
        more = f" ({len(failures) - 1} more failed)" if len(failures) > 1 else ""
        raise PublishError(f"{what} of s3://{bucket}/{key(item)} failed: {detail}{more}")


def _publish_error(error: BaseException, obj: _Object, bucket: str) -> PublishError:
    if isinstance(error, PublishError):
        return error
    verb = "copy" if obj.source_key else "upload"
    detail = str(error) if isinstance(error, _LocalMismatch) else _error_code(error)
    return PublishError(f"{verb} of {obj.label!r} to s3://{bucket}/{obj.key} failed: {detail}", model=obj.model or None)


def _error_code(error: BaseException) -> str:
    """The S3 error code (``SlowDown``, ``InternalError``, ``AccessDenied``...) or the exception's
    class name for errors without one (timeouts, dropped connections)."""
    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Code") or "unknown")
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _file_sha256(path: Path, size: int) -> bytes:
    digest = hashlib.sha256()
    length = 0
    try:
        with path.open("rb") as handle:
            while block := handle.read(_READ_BLOCK):
                digest.update(block)
                length += len(block)
    except OSError as error:
        raise _LocalMismatch(f"cannot read {str(path)!r}: {error.strerror}") from None
    if length != size:
        raise _LocalMismatch(f"file {str(path)!r} has {length} bytes, expected {size}; it changed after packaging")
    return digest.digest()


def _full_object_sha256(response: Mapping[str, Any]) -> str | None:
    """The SHA-256 checksum S3 reports when it is over the whole object, else None.

    A multipart object's SHA-256 is composite (a digest of the parts' digests) and is not
    comparable with the file's digest. It is recognised by ``ChecksumType: COMPOSITE``, by a
    ``-<parts>`` suffix on the value, or by a multipart ETag (``"...-3"``): moto's HeadObject,
    for one, reports a composite value with neither a type nor a suffix.
    """
    stored = response.get("ChecksumSHA256")
    kind = response.get("ChecksumType")
    if not stored or kind == "COMPOSITE":
        return None
    if kind == "FULL_OBJECT":
        return str(stored)
    multipart = "-" in stored or "-" in str(response.get("ETag", "")).strip('"')
    return None if multipart else str(stored)


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def _content_type(key: str) -> str:
    return _CONTENT_TYPES.get(Path(key).suffix, "application/octet-stream")
