"""What :class:`~constructs.model_build_resource.ModelBuildResource` derives at synth from its two
inputs: the manifest (which sources the build downloads from the internet, which it cannot reach,
what it reads from S3) and the build image's context (only the runtime files go into the image).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from triton_mme_cdk.model_build.errors import ManifestError
from triton_mme_cdk.model_build.manifest import LocalSource, Manifest, OnnxFileSource, S3Source
from triton_mme_cdk.model_build.release import runtime_files

#: Left out of the build image whatever the context holds: caches and byte code.
IMAGE_EXCLUDE = ["__pycache__", "**/__pycache__", ".pytest_cache", "**/*.pyc"]
#: With more distinct source prefixes than this in one bucket, the build may read the bucket.
_MAX_PREFIXES_PER_SOURCE_BUCKET = 10


def internet_sources(manifest: Manifest) -> list[str]:
    """Names of the manifest's models whose source is downloaded from the internet."""
    return [spec.name for spec in manifest.models if spec.source.kind == "huggingface"]


def refuse_local_sources(manifest: Manifest) -> None:
    """Raise :class:`ManifestError` for a source the build Lambda cannot reach (a local path)."""
    for index, spec in enumerate(manifest.models):
        source = spec.source
        if isinstance(source, (LocalSource, OnnxFileSource)) and not source.path.startswith("s3://"):
            raise ManifestError(
                f"models[{index}]({spec.name}).source: kind {source.kind!r} with path "
                f"{source.path!r} is a file on this machine, which the build Lambda cannot read; "
                "use a source it can fetch (kind 's3', 'package' or 'huggingface'; an onnx "
                "source may be an s3:// URI), or publish the release out of band with "
                "`python -m model_build publish` and deploy it by id (release_id, with an empty "
                "manifest_path)",
                model=spec.name,
            )


def s3_source_keys(manifest: Manifest) -> dict[str, list[str]]:
    """What the build reads from S3 for the manifest's sources, as key patterns by bucket.

    A folder source (kind ``s3``) gives ``<folder>/*``; an ``onnx`` file on S3 gives its exact
    key. Patterns covered by another one are dropped; a bucket with more than 10 patterns, or a
    source that is a whole bucket, gives ``*`` (so the policy stays small whatever the number of
    models). Sorted, so the template is stable.
    """
    patterns: dict[str, set[str]] = defaultdict(set)
    for spec in manifest.models:
        source = spec.source
        if isinstance(source, S3Source):
            bucket, _, key = source.uri[len("s3://"):].partition("/")
            folder = key.strip("/")
            patterns[bucket].add(f"{folder}/*" if folder else "*")
        elif isinstance(source, OnnxFileSource) and source.path.startswith("s3://"):
            bucket, _, key = source.path[len("s3://"):].partition("/")
            patterns[bucket].add(key or "*")
    result: dict[str, list[str]] = {}
    for bucket, keys in sorted(patterns.items()):
        folders = [k[:-1] for k in keys if k.endswith("*")]
        kept = sorted(
            k for k in keys if not any(k != f + "*" and k.startswith(f) for f in folders)
        )
        result[bucket] = ["*"] if "*" in kept or len(kept) > _MAX_PREFIXES_PER_SOURCE_BUCKET else kept
    return result


def runtime_only_exclude(build_context: Path) -> list[str]:
    """Docker-ignore patterns (root-anchored) that leave only the runtime in the build image.

    The runtime is :func:`model_build.release.runtime_files` of the context, the same files the
    model keys and the release id hash: a tool (the CLI front, smoke, the local endpoint) is
    neither in the image nor in any identity, so editing one changes no asset, key or release.
    Each folder without a runtime file is left out whole; elsewhere each other file is named.
    """
    keep = {path.relative_to(build_context) for path in runtime_files(build_context)}
    keep_dirs = {folder for path in keep for folder in path.parents}
    excluded = [
        relative.as_posix()
        for relative in sorted(path.relative_to(build_context) for path in build_context.rglob("*"))
        if "__pycache__" not in relative.parts
        and relative.parent in keep_dirs
        and relative not in keep
        and relative not in keep_dirs
    ]
    return [*IMAGE_EXCLUDE, *excluded]
