"""What the local endpoint serves, as SageMaker would find it: the stack's fixed served prefix with
the digests its routes document records (re-read when an unknown target is invoked: a model
published a moment ago), a release published there by id, or a release prefix of the earlier
layout whose index lists every target. Every index entry is checked before anything is served.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError


@dataclass
class Entry:
    """One target: its key, and the sha256 and size that the routes (or index) record, if any."""

    target: str
    key: str
    sha256: str | None
    size: int | None


@dataclass
class Release:
    """What the endpoint serves: a prefix (its ``ModelDataUrl``) and the digests it knows.

    ``model_prefix`` set: the fixed served prefix of a stack, with the routes document whose
    routed and retained objects give the digests; it is re-read when a target it does not know
    is invoked (a model published a moment ago). Unset: a release prefix of the earlier layout,
    whose index lists every target."""

    bucket: str
    prefix: str
    release_id: str
    entries: dict[str, Entry] = field(default_factory=dict)
    #: The stack's model prefix (its routes beside the served prefix); None: the earlier layout.
    model_prefix: str | None = None
    #: The logical names the routes map to targets (empty for a release of the earlier layout).
    routes: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}/" if self.prefix else f"s3://{self.bucket}/"

    def entry(self, s3_client: Any, target: str) -> Entry | None:
        """The target's entry: known, or (served prefix) looked up anew in the routes, else an
        entry with no digest for whatever object is under its key. None: not servable."""
        if target in self.entries:
            return self.entries[target]
        if self.model_prefix is None:
            return None
        if "/" in target or target in {".", ".."} or not target:
            return None
        refreshed = read_served(s3_client, self.bucket, self.model_prefix, required=False)
        self.entries = {**self.entries, **refreshed.entries}
        self.routes = refreshed.routes or self.routes
        return self.entries.get(target) or Entry(target, f"{self.prefix}/{target}", None, None)


def read_served(s3_client: Any, bucket: str, model_prefix: str, *, required: bool = True) -> Release:
    """The fixed served prefix and what its routes document says (routed and retained objects).
    A missing document is an error when ``required``, else nothing is known yet."""
    from triton_mme_cdk.model_build.release import routes_key, served_prefix
    from triton_mme_cdk.model_build.release.index import read_routes

    served = served_prefix(model_prefix)
    release = Release(bucket=bucket, prefix=served, release_id="(none routed)", model_prefix=model_prefix)
    routes = read_routes(s3_client, bucket, model_prefix)
    if routes is None:
        if not required:
            return release
        raise ModelBuildError(
            f"routes s3://{bucket}/{routes_key(model_prefix)}: missing; publish first (python -m model_build "
            "publish) or check --bucket/--prefix"
        )
    release.release_id = routes.release_id
    for route in routes.routes.values():
        release.entries[route.target_model] = Entry(route.target_model, f"{served}/{route.target_model}",
                                                    route.sha256, route.size)
        release.routes[route.logical_name] = route.target_model
    for name, item in routes.unrouted.items():
        release.entries[name] = Entry(name, f"{served}/{name}", item.sha256, item.size)
    return release


def read_release(s3_client: Any, bucket: str, model_prefix: str, release_id: str | None = None) -> Release:
    """What to serve, with the digests to check downloads against:

    - no ``release_id``: the stack's fixed served prefix, with its routes document;
    - ``release_id`` of a release published to the served prefix (its index in
      ``<prefix>/_releases/<id>/``): the served prefix, with that release's digests (routed or not);
    - ``release_id`` of the earlier per-release layout (its index in ``<prefix>/<id>/``): that prefix.

    A release with neither index is an error naming both places looked at."""
    from triton_mme_cdk.model_build.release import INDEX_NAME, served_prefix
    from triton_mme_cdk.model_build.release import Release as ReleaseId
    from triton_mme_cdk.model_build.release.index import read_index

    served = served_prefix(model_prefix)
    if not release_id:
        return read_served(s3_client, bucket, model_prefix)
    new_index_key = ReleaseId(release_id, "", "").index_key(model_prefix)
    new_index = read_index(s3_client, bucket, new_index_key)
    if new_index is not None:
        release = read_served(s3_client, bucket, model_prefix, required=False)
        release.release_id = release_id
        for number, item in enumerate(new_index.get("models") or []):
            entry = _entry(item, number, f"release {release_id}: index s3://{bucket}/{new_index_key}", served)
            release.entries[entry.target] = entry
        return release
    prefix = "/".join(part for part in (model_prefix.strip("/"), release_id) if part)
    index_key = f"{prefix}/{INDEX_NAME}"
    index = read_index(s3_client, bucket, index_key)
    if index is None:
        raise ModelBuildError(
            f"release {release_id}: no index at s3://{bucket}/{new_index_key} nor at s3://{bucket}/{index_key}; "
            "publish it first (python -m model_build publish) or check --bucket/--prefix/--release"
        )
    release = Release(bucket=bucket, prefix=prefix, release_id=str(release_id))
    models = index.get("models") or []
    if not isinstance(models, list):
        raise ModelBuildError(f"release {release_id}: index s3://{bucket}/{index_key}: 'models' is not a list")
    for number, item in enumerate(models):
        entry = _entry(item, number, f"release {release_id}: index s3://{bucket}/{index_key}", prefix)
        release.entries[entry.target] = entry
    return release


def _entry(item: Any, number: int, where: str, prefix: str) -> Entry:
    """One index entry, checked: its fields and types, and a key under the release prefix."""
    if not isinstance(item, dict):
        raise ModelBuildError(f"{where}: models[{number}] is {type(item).__name__}, expected an object")
    label = f"{where}: models[{number}] ({item.get('target_model', '?')!r})"
    missing = [name for name in ("target_model", "key", "sha256", "size") if name not in item]
    if missing:
        raise ModelBuildError(f"{label}: missing field(s) {', '.join(missing)}")
    for name in ("target_model", "key", "sha256"):
        if not isinstance(item[name], str) or not item[name]:
            raise ModelBuildError(f"{label}: field {name!r} must be a non-empty string, got {item[name]!r}")
    if not re.fullmatch(r"[0-9a-f]{64}", item["sha256"]):
        raise ModelBuildError(f"{label}: field 'sha256' must be 64 lowercase hex digits, got {item['sha256']!r}")
    if not isinstance(item["size"], int) or isinstance(item["size"], bool) or item["size"] < 0:
        raise ModelBuildError(f"{label}: field 'size' must be a non-negative integer, got {item['size']!r}")
    key = item["key"]
    parts = key.split("/")
    if not key.startswith(f"{prefix}/") or any(part in ("", ".", "..") for part in parts[len(prefix.split('/')):]):
        raise ModelBuildError(
            f"{label}: key {key!r} is not under the release prefix {prefix + '/'!r}; refusing the index"
        )
    return Entry(item["target_model"], key, item["sha256"], item["size"])
