"""The S3 object transfers every publish shares: checksums, the skip rule, server-side copies.

Its public names are the layer :mod:`model_build.release.publish`, :mod:`~model_build.release.store`,
:mod:`~model_build.release.index` and :mod:`~model_build.release.serving` are built on: the object
to put (:class:`S3Object`), the per-object steps (:class:`TransferWorker`), listing a prefix
(:func:`list_sizes`, :func:`iter_objects`), running the steps in threads (:func:`run_all`) and the
one wording of a failed request (:func:`error_code`, :func:`publish_error`).

- Integrity: every upload carries a SHA-256 that S3 checks before it stores the object (a full
  object checksum for a single PUT; a per-part checksum for multipart uploads, whose object
  checksum is then composite). The full-object hex digest is also stored as user metadata
  ``sha256``, the one value that means the same for single-part, multipart and copied objects.
- The skip rule: an object already present with the same ``sha256`` and size is not sent again
  (:func:`head_matches`), so a re-run uploads only what is missing.
- Served objects are immutable: a copy onto a name that holds other bytes is refused, never
  overwritten (``TransferWorker(immutable=True)``).
- Retries belong to botocore (see :func:`model_build.aws_clients.make_s3_client`): nothing here
  loops around an S3 call.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError
from s3transfer.manager import TransferManager

from triton_mme_cdk.model_build.errors import PublishError

#: User-metadata key (``x-amz-meta-sha256``) holding the full-object hex SHA-256.
SHA256_METADATA = "sha256"
#: The largest object a single CopyObject can copy; larger ones are copied part by part.
COPY_OBJECT_MAX = 5 * 1024**3
_MIB = 1024**2
#: Multipart above 64 MiB in 16 MiB parts: a typical ONNX model goes up in one PUT (one request,
#: one full-object checksum), a large one in parallel parts that are retried one by one.
DEFAULT_MULTIPART_THRESHOLD = 64 * _MIB
DEFAULT_MULTIPART_CHUNKSIZE = 16 * _MIB
#: Bytes read at a time when a file or an object's body is hashed.
READ_BLOCK = 1 * _MIB
_CONTENT_TYPES = {".gz": "application/gzip", ".json": "application/json", ".npz": "application/octet-stream"}

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class S3Object:
    """One object to put under ``key``: a local file, or copied from ``source_key``."""

    key: str
    label: str  # names the object in messages: the target or the reference
    model: str
    size: int
    sha256: str | None = None  # hex; None until hashed (references are hashed in a worker)
    path: Path | None = None
    source_key: str | None = None


class Stopped(Exception):
    """A task that found the publish already failing and did nothing."""


class TransferWorker:
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

    def put_file(self, obj: S3Object) -> tuple[str, int, S3Object]:
        """Upload a local file unless an identical object is already there."""
        if self.stop.is_set():
            raise Stopped
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
                raise IntegrityError(
                    f"file {str(obj.path)!r} has sha256 {actual.hex()[:12]}..., the artifact says "
                    f"{obj.sha256[:12]}...; it changed after packaging"
                )
        if self.stop.is_set():
            raise Stopped
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

    def put_bytes(self, obj: S3Object, body: bytes) -> tuple[str, int]:
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

    def copy(self, obj: S3Object) -> tuple[str, int, S3Object]:
        """Make ``obj`` a server-side copy of its source (metadata included); no bytes are sent."""
        if self.stop.is_set():
            raise Stopped
        assert obj.source_key is not None and obj.sha256 is not None
        digest = bytes.fromhex(obj.sha256)
        if self._already_there(obj.key, obj.size, digest):
            return "skipped", 0, obj
        if self.immutable and self._present(obj.key):
            with self._lock:
                self.refused.add(obj.key)
            raise IntegrityError(
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
                raise IntegrityError(f"copy has sha256 {stored}, expected {_b64(digest)}")
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
            if error_code(error) in {"404", "NoSuchKey", "NotFound"}:
                return False
            raise
        return True

    def _already_there(self, key: str, size: int, digest: bytes) -> bool:
        """The skip rule: present, same size, same ``sha256`` metadata (and, when S3 holds a full-
        object SHA-256 checksum, the same checksum: that one S3 computed from the bytes)."""
        if self.existing.get(key) != size:
            return False
        return head_matches(self.client, self.bucket, key, size, digest.hex(), require_checksum=self.immutable)[0]


def head_matches(client: Any, bucket: str, key: str, size: int, sha256: str, *,
                 require_checksum: bool = False) -> tuple[bool, dict[str, Any] | None]:
    """Whether the object under ``key`` has ``size`` bytes, the ``sha256`` metadata and (when S3
    holds a full-object SHA-256 checksum, the one S3 computed from the bytes) that checksum;
    with its HEAD answer (None when there is no object).

    ``require_checksum``: an object of at most 5 GiB must have that checksum (the metadata alone is
    whatever its writer said). A served object always has one: it is placed by one ``CopyObject``
    with ``ChecksumAlgorithm: SHA256``, over the bytes copied. A larger one is copied in parts,
    whose checksum is composite: only its metadata and size are compared."""
    try:
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as error:
        if error_code(error) in {"404", "NoSuchKey", "NotFound"}:
            return False, None
        raise
    if head.get("ContentLength") != size or head.get("Metadata", {}).get(SHA256_METADATA) != sha256:
        return False, head
    stored = _full_object_sha256(head)
    if stored is None:
        return not (require_checksum and size <= COPY_OBJECT_MAX), head
    return stored == _b64(bytes.fromhex(sha256)), head


class IntegrityError(Exception):
    """Bytes that are not what the artifact or the index says: another digest or size, a served
    name that holds other bytes, or a local file that cannot be read to check it."""


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def normalise_prefix(release_prefix: str) -> str:
    """A release prefix without its outer slashes; an empty one is refused (:class:`ValueError`)."""
    prefix = release_prefix.strip("/")
    if not prefix:
        raise ValueError("release_prefix: empty; a release must live under its own prefix")
    return prefix


def threaded_config(config: TransferConfig | None, concurrency: int) -> TransferConfig:
    """The transfer manager's settings: ``config``'s multipart threshold and part size (else the
    defaults above), ``concurrency`` threads."""
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
    return list_sizes(s3_client, bucket, normalise_prefix(release_prefix))


def list_sizes(client: Any, bucket: str, prefix: str) -> dict[str, int]:
    """Sizes of the objects already under the prefix: one LIST instead of a HEAD per absent key."""
    try:
        return dict(iter_objects(client, bucket, prefix))
    except (ClientError, BotoCoreError) as error:
        raise PublishError(f"listing s3://{bucket}/{prefix}/ failed: {error_code(error)}") from None


def iter_objects(client: Any, bucket: str, prefix: str) -> Iterator[tuple[str, int]]:
    """``(key, size)`` of every object under ``<prefix>/``, page by page; S3 errors propagate."""
    # The trailing slash keeps release r-1 from matching the objects of release r-10.
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for item in page.get("Contents", []):
            yield item["Key"], item["Size"]


def run_all(
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
        detail = str(error) if isinstance(error, IntegrityError) else error_code(error)
        more = f" ({len(failures) - 1} more failed)" if len(failures) > 1 else ""
        raise PublishError(f"{what} of s3://{bucket}/{key(item)} failed: {detail}{more}")


def publish_error(error: BaseException, obj: S3Object, bucket: str) -> PublishError:
    """``error`` of the upload or copy of ``obj`` as the :class:`PublishError` naming the object
    and the S3 error code (a :class:`PublishError` as it is)."""
    if isinstance(error, PublishError):
        return error
    verb = "copy" if obj.source_key else "upload"
    detail = str(error) if isinstance(error, IntegrityError) else error_code(error)
    return PublishError(f"{verb} of {obj.label!r} to s3://{bucket}/{obj.key} failed: {detail}", model=obj.model or None)


def error_code(error: BaseException) -> str:
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
            while block := handle.read(READ_BLOCK):
                digest.update(block)
                length += len(block)
    except OSError as error:
        raise IntegrityError(f"cannot read {str(path)!r}: {error.strerror}") from None
    if length != size:
        raise IntegrityError(f"file {str(path)!r} has {length} bytes, expected {size}; it changed after packaging")
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
