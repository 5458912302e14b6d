"""The SageMaker Processing job's entry point: ``python -m model_build.handler.processing_job``.

It runs in the build Lambda's own image (the job overrides the image's entry point), so a model
built here runs the same code, with the same library versions, as one built by the Lambda, and
gets the same key. It makes no network call: SageMaker downloads its inputs and uploads its
outputs (the job runs with network isolation, like the endpoint).

- ``<root>/processing/input/request/request.json``: the request properties, the model, its key,
  the manifest (canonical JSON) and where each S3 source folder is mounted;
- ``<root>/processing/input/source/``: the model's S3 source, when it has one;
- ``<root>/processing/output/unit/``: the built unit (tarball, reference, config) and
  ``artifact.json`` describing it, which ``store_job`` stores as ``publish_unit`` does;
- on failure, ``<root>/output/message``: the build's one-line reason, which SageMaker returns
  as the job's ``ExitMessage`` and the custom resource shows.

``<root>`` is ``/opt/ml``, or ``$MODEL_BUILD_PROCESSING_ROOT`` where a test runs the entry point
on its machine.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT_ENV = "MODEL_BUILD_PROCESSING_ROOT"
#: SageMaker returns the first 1 KB of this file as the job's ExitMessage.
MESSAGE_LIMIT = 1024


class MountedSources:
    """The S3 calls a source fetch makes (a listing, ``download_file``), answered from the
    folders SageMaker downloaded: ``s3://bucket/prefix/`` -> its LocalPath. An object outside
    every mount is a 404, as S3 answers for a missing one. ``ExpectedBucketOwner`` is taken and
    not checked here: SageMaker downloaded the folders with the job's role, whose reads are
    conditioned on the same owner (``s3:ResourceAccount``)."""

    def __init__(self, mounts: Mapping[str, str], root: Path) -> None:
        self._mounts = [(uri[len("s3://"):], _local(root, path)) for uri, path in mounts.items()]

    def _find(self, bucket: str, key: str) -> Path | None:
        for mounted, folder in self._mounts:
            if f"{bucket}/{key}".startswith(mounted):
                return folder / f"{bucket}/{key}"[len(mounted):]
        return None

    def download_file(self, bucket: str, key: str, filename: str, ExtraArgs: Mapping[str, str] | None = None) -> None:
        from botocore.exceptions import ClientError

        path = self._find(bucket, key)
        if path is None or not path.is_file():
            raise ClientError({"Error": {"Code": "404", "Message": "Not Found"}}, "HeadObject")
        shutil.copyfile(path, filename)

    def get_paginator(self, operation: str) -> MountedSources:
        if operation != "list_objects_v2":
            raise NotImplementedError(operation)
        return self

    def paginate(self, *, Bucket: str, Prefix: str = "", ExpectedBucketOwner: str = "") -> Iterator[dict[str, Any]]:
        contents = []
        for mounted, folder in self._mounts:
            if not (f"{Bucket}/".startswith(mounted) or mounted.startswith(f"{Bucket}/")):
                continue
            base = mounted[len(Bucket) + 1:]
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                key = base + path.relative_to(folder).as_posix()
                if key.startswith(Prefix):
                    contents.append({"Key": key, "Size": path.stat().st_size})
        yield {"Contents": contents}


def _local(root: Path, container_path: str) -> Path:
    """A container path (``/opt/ml/...``) under ``root`` (``/opt/ml`` itself in the job)."""
    return root / Path(container_path).relative_to("/opt/ml")


def run(root: Path) -> int:
    """Build the one model of the request into the output folder; 0, or 1 with the reason in
    ``output/message``."""
    from triton_mme_cdk.model_build.errors import ModelBuildError
    from triton_mme_cdk.model_build.handler.request import HandlerError, Request, short_error
    from triton_mme_cdk.model_build.handler.units import model_key
    from triton_mme_cdk.model_build.manifest import load_manifest_bytes
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_unit

    work = root / "processing" / "work"
    out = root / "processing" / "output" / "unit"
    try:
        document = json.loads((root / "processing" / "input" / "request" / "request.json").read_text())
        request = Request({"RequestType": "Create", "ResourceProperties": document["Request"]})
        manifest = load_manifest_bytes(document["Manifest"].encode(), origin="the job's request.json")
        if manifest.content_sha256() != request.manifest_sha256:
            raise HandlerError("manifest: the job's copy does not match property ManifestSha256")
        spec = next((s for s in manifest.models if s.name == document["Model"]), None)
        if spec is None:
            raise HandlerError(f"field Model: got {document['Model']!r}; the manifest has no such model")
        key = model_key(spec)
        if key != document["Key"]:
            raise HandlerError(f"model {spec.name!r}: planned key {document['Key']!r} but this build image "
                               f"computes {key!r}; the plan and the image come from different code")
        # Scratch files go to the job's volume (the image's TMPDIR is the Lambda's /tmp).
        work.mkdir(parents=True, exist_ok=True)
        os.environ["TMPDIR"] = str(work)
        sources = MountedSources(document.get("Mounts") or {}, root)
        result, _ = build_unit(spec, key, BuildOptions(base_dir=work, s3_client=sources), store_dir=work / "store")
        artifact = result.artifact(work / "store" / key)
        out.mkdir(parents=True, exist_ok=True)
        described: dict[str, Any] = {"key": key, "name": artifact.name, "format": artifact.format,
                                     "sha256": artifact.sha256, "size": artifact.size,
                                     "targets": list(artifact.targets)}
        for field, path in (("tarball", artifact.path), ("reference", artifact.reference_path),
                            ("config", artifact.config_path)):
            if path is not None:
                shutil.copyfile(path, out / path.name)
                described[field] = path.name
        (out / "artifact.json").write_text(json.dumps(described, sort_keys=True))
        return 0
    except (HandlerError, ModelBuildError) as error:
        reason = str(short_error(error))
    except Exception as error:  # a bug or a broken input: one line for CloudFormation, the trace in the log
        import traceback

        traceback.print_exc()
        reason = f"{type(error).__name__}: {' '.join(str(error).split())}"[:400]
    print(f"error: {reason}", file=sys.stderr)
    message = root / "output" / "message"
    message.parent.mkdir(parents=True, exist_ok=True)
    message.write_bytes(reason.encode()[:MESSAGE_LIMIT])
    return 1


def main() -> int:
    return run(Path(os.environ.get(ROOT_ENV, "/opt/ml")))


if __name__ == "__main__":
    raise SystemExit(main())
