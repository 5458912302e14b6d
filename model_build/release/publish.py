"""Publish a release's artifacts to S3: each tarball's bytes once, every other copy server-side.

Why it is shaped this way:

- A release is immutable and addressed by its prefix (see :mod:`model_build.release.identity`): SageMaker
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

import hashlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError
from s3transfer.manager import TransferManager

from triton_mme_cdk.model_build.errors import PublishError
from triton_mme_cdk.model_build.release.identity import INDEX_NAME, REFERENCE_DIR
from triton_mme_cdk.model_build.release.index import index_body, read_index
from triton_mme_cdk.model_build.release.transfer import (
    READ_BLOCK,
    IntegrityError,
    Progress,
    S3Object,
    Stopped,
    TransferWorker,
    error_code,
    iter_objects,
    list_sizes,
    normalise_prefix,
    publish_error,
    run_all,
    threaded_config,
)
from triton_mme_cdk.model_build.types import Artifact

_RESERVED_INDEX_FIELDS = frozenset({"schema", "models", "references"})


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
    prefix = normalise_prefix(release_prefix)
    primaries, copies = _plan(artifacts, prefix)
    config = threaded_config(transfer_config, concurrency)
    started = time.monotonic()
    existing = list_sizes(s3_client, bucket, prefix)
    counts = {"uploaded": 0, "copied": 0, "skipped": 0, "bytes": 0}
    stop = threading.Event()
    failures: list[PublishError] = []

    def done(obj: S3Object, outcome: str, sent: int) -> None:
        counts[outcome] += 1
        counts["bytes"] += sent
        if progress is not None:
            progress(obj.key, sent)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="publish") as pool, TransferManager(
        s3_client, config
    ) as transfer:
        worker = TransferWorker(s3_client, bucket, transfer, config, existing, stop)
        pending: dict[Future[tuple[str, int, S3Object]], S3Object] = {
            pool.submit(worker.put_file, obj): obj for obj in primaries
        }
        try:
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    obj = pending.pop(future)
                    error = future.exception() if not future.cancelled() else None
                    if future.cancelled() or isinstance(error, Stopped):
                        continue
                    if error is not None:
                        failures.append(publish_error(error, obj, bucket))
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
    outcome, sent = put_index(worker, index_key, body, bucket)
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


def _index_object(index_key: str, body: bytes) -> S3Object:
    return S3Object(key=index_key, label=INDEX_NAME, model="", size=len(body), sha256=hashlib.sha256(body).hexdigest())


def put_index(worker: TransferWorker, index_key: str, body: bytes, bucket: str) -> tuple[str, int]:
    """Write an index (after every object it lists) with the skip rule and checksums of any other
    object; ``(outcome, bytes sent)``. A failure is a :class:`PublishError` that says to re-run."""
    index = _index_object(index_key, body)
    try:
        return worker.put_bytes(index, body)
    except Exception as error:  # one request: report it like any other object
        raise PublishError(f"{publish_error(error, index, bucket)}; re-run to finish") from None


def _plan(artifacts: Sequence[Artifact], prefix: str) -> tuple[list[S3Object], dict[str, list[S3Object]]]:
    """Objects to upload (first target of each artifact, references) and the copies of each."""
    primaries: list[S3Object] = []
    copies: dict[str, list[S3Object]] = {}
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
        first = S3Object(
            key=f"{prefix}/{artifact.targets[0]}.tar.gz",
            label=artifact.targets[0],
            model=artifact.name,
            size=artifact.size,
            sha256=artifact.sha256,
            path=Path(artifact.path),
        )
        primaries.append(first)
        copies[first.key] = [
            S3Object(
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
                S3Object(
                    key=f"{prefix}/{REFERENCE_DIR}/{artifact.name}{suffix}",
                    label=f"{REFERENCE_DIR}/{artifact.name}{suffix}",
                    model=artifact.name,
                    size=size,
                    path=path,
                )
            )
    return primaries, copies


def _reference_entries(primaries: Sequence[S3Object], worker: TransferWorker) -> list[dict[str, Any]]:
    return [
        {"source_model": obj.model, "key": obj.key, "sha256": worker.hashes[obj.key], "size": obj.size}
        for obj in primaries
        if obj.label.startswith(f"{REFERENCE_DIR}/")
    ]


# ---------------------------------------------------------------------------------------------
# Retire, delete, download
# ---------------------------------------------------------------------------------------------


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
    prefix = normalise_prefix(release_prefix)

    def tag(key: str) -> None:
        current = s3_client.get_object_tagging(Bucket=bucket, Key=key).get("TagSet", [])
        if any(t["Key"] == tag_key and t["Value"] == tag_value for t in current):
            return
        tags = [t for t in current if t["Key"] != tag_key] + [{"Key": tag_key, "Value": tag_value}]
        s3_client.put_object_tagging(Bucket=bucket, Key=key, Tagging={"TagSet": tags})

    keys = [key for key, _ in iter_objects(s3_client, bucket, prefix)]
    run_all(tag, keys, concurrency, what="tagging", bucket=bucket)
    return len(keys)


def delete_release(s3_client: Any, bucket: str, release_prefix: str) -> int:
    """Delete every object under the release prefix (every version and delete marker when the
    bucket is or was versioned); returns how many objects or versions were deleted.

    Needs ``s3:GetBucketVersioning`` and, on a versioned bucket, ``s3:ListBucketVersions`` and
    ``s3:DeleteObjectVersion`` (deleting by key alone would only add delete markers). Open
    multipart uploads are left to the bucket's AbortIncompleteMultipartUpload lifecycle rule.
    """
    prefix = normalise_prefix(release_prefix)
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
            entries = [{"Key": key} for key, _ in iter_objects(s3_client, bucket, prefix)]
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
        raise PublishError(f"deleting release s3://{bucket}/{prefix}/ failed: {error_code(error)}") from None
    return deleted


def download_release(
    s3_client: Any, bucket: str, release_prefix: str, out_dir: str | os.PathLike[str], *, concurrency: int = 8
) -> list[Path]:
    """Download a release's tarballs and references into ``out_dir``, each checked against the
    SHA-256 the index records; returns the paths (tarballs by target, then references).

    A file is written under a temporary name and renamed only once its digest matches, so a
    failed or tampered download never leaves a plausible-looking file behind.
    """
    prefix = normalise_prefix(release_prefix)
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
                for block in body.iter_chunks(READ_BLOCK):
                    digest.update(block)
                    length += len(block)
                    handle.write(block)
            if digest.hexdigest() != expected or length != size:
                raise IntegrityError(
                    f"got sha256 {digest.hexdigest()[:12]}... ({length} bytes), the index says "
                    f"{expected[:12]}... ({size} bytes)"
                )
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)

    run_all(fetch, jobs, concurrency, what="download", bucket=bucket, key=lambda job: job[0])
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
