"""The documents a bucket holds about its releases: each release's index (``_index.json``: its
targets, their digests and where they came from) and the routes document (which target each
logical model is served under now, :mod:`model_build.release.routes`).

One writer of each index format (deterministic JSON: an unchanged release writes the same bytes)
and one reader of each, which refuses a schema it does not know.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from triton_mme_cdk.model_build.errors import PublishError
from triton_mme_cdk.model_build.release.documents import schema_document
from triton_mme_cdk.model_build.release.identity import routes_key
from triton_mme_cdk.model_build.release.routes import MAX_ROUTES_BYTES, Routes, RoutesError, parse_routes
from triton_mme_cdk.model_build.release.transfer import error_code, normalise_prefix
from triton_mme_cdk.model_build.types import Artifact

#: Version of the index layout; a reader refuses an index of a schema it does not know.
INDEX_SCHEMA = 1


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


def index_body(
    artifacts: Sequence[Artifact],
    release_prefix: str,
    index_extra: Mapping[str, Any],
    *,
    references: Sequence[Mapping[str, Any]] = (),
) -> bytes:
    """The index document: deterministic JSON (sorted keys, no timestamps) so that republishing
    an unchanged release writes byte-identical content, which the skip rule then recognises."""
    prefix = normalise_prefix(release_prefix)
    models: list[dict[str, Any]] = [
        {
            "target_model": f"{target}.tar.gz",
            "key": f"{prefix}/{target}.tar.gz",
            "sha256": artifact.sha256,
            "size": artifact.size,
            "format": artifact.format,
            "source_model": artifact.name,
            **target_footprint(artifact.footprint, target),
            **({"signature": dict(artifact.signature)} if artifact.signature else {}),
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


def target_footprint(footprint: Mapping[str, Any] | None, target: str) -> dict[str, Any]:
    """``{"footprint": ...}`` of one target (the model's footprint, named after the target), or
    ``{}`` where the build recorded none: an index without it reads as unknown
    (``model_build.capacity.footprint.index_footprints``)."""
    return {"footprint": {**footprint, "target": target}} if footprint else {}


# ---------------------------------------------------------------------------------------------
# Reading an index
# ---------------------------------------------------------------------------------------------


def read_index(s3_client: Any, bucket: str, index_key: str) -> dict[str, Any] | None:
    """The release index, or None when it is absent (the release is missing or incomplete)."""
    try:
        response = s3_client.get_object(Bucket=bucket, Key=index_key)
        body = response["Body"].read()
    except ClientError as error:
        if error_code(error) in {"NoSuchKey", "404", "NotFound"}:
            return None
        if error_code(error) in {"AccessDenied", "403"} and not _listed(s3_client, bucket, index_key):
            # S3 answers 403, not 404, for a missing key unless the caller may list the bucket
            # without an s3:prefix condition; the build role may list only under its prefix.
            return None
        raise PublishError(f"reading index s3://{bucket}/{index_key} failed: {error_code(error)}") from None
    return schema_document(body, schema=INDEX_SCHEMA, where=f"index s3://{bucket}/{index_key}", error=PublishError)


def _listed(s3_client: Any, bucket: str, key: str) -> bool:
    """Whether ``key`` exists, by a listing (a missing key's GET may answer 403); False if the
    listing itself is refused (the caller's error stands)."""
    try:
        response = s3_client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
    except (ClientError, BotoCoreError):
        return True
    return any(item["Key"] == key for item in response.get("Contents", []))


def read_routes(s3_client: Any, bucket: str, model_prefix: str, *, stack: str = "") -> Routes | None:
    """The live routes document, or None when there is none yet (the first deploy).

    Raises :class:`RoutesError` for one that is truncated, malformed, of another schema or written
    by another stack, or that cannot be read."""
    return read_routes_tagged(s3_client, bucket, model_prefix, stack=stack)[0]


def read_routes_tagged(s3_client: Any, bucket: str, model_prefix: str, *,
                       stack: str = "") -> tuple[Routes | None, str | None]:
    """:func:`read_routes` and the ETag of the version read (None with no document), which
    :func:`write_routes` needs to replace exactly that version."""
    key = routes_key(model_prefix)
    where = f"s3://{bucket}/{key}"
    try:
        response = s3_client.get_object(Bucket=bucket, Key=key)
        body = response["Body"].read(MAX_ROUTES_BYTES + 1)
    except ClientError as error:
        if error_code(error) in {"NoSuchKey", "404", "NotFound"}:
            return None, None
        raise RoutesError(f"routes {where}: cannot be read ({error_code(error)})") from None
    except BotoCoreError as error:
        raise RoutesError(f"routes {where}: cannot be read ({error})") from None
    return parse_routes(body, where=where, stack=stack), str(response["ETag"])


#: What S3 answers a conditional PUT whose condition no longer holds: 412 (the ETag is not the one
#: read, or a document now exists), 409 (another conditional write of the key is in flight), 404
#: (If-Match on a key deleted since).
_CONFLICT_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404"})


def write_routes(s3_client: Any, bucket: str, model_prefix: str, routes: Routes, etag: str | None) -> bool:
    """Write ``routes`` only over the version read (compare-and-swap): ``If-Match`` on its ETag, or
    ``If-None-Match: *`` where there was none. False when another writer changed the document in
    between (nothing written); raises :class:`RoutesError` when the PUT fails otherwise."""
    key = routes_key(model_prefix)
    condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
    try:
        s3_client.put_object(Bucket=bucket, Key=key, Body=routes.body(), ContentType="application/json", **condition)
    except ClientError as error:
        if error_code(error) in _CONFLICT_CODES:
            return False
        raise RoutesError(f"routes s3://{bucket}/{key}: cannot be written ({error_code(error)})") from None
    except BotoCoreError as error:
        raise RoutesError(f"routes s3://{bucket}/{key}: cannot be written ({error})") from None
    return True
