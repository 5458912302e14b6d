"""Turn a manifest source into files on disk.

Everything the export and validation steps need from a source goes through here and
:mod:`model_build.export.eager` (the eager module and its sample inputs), so that those steps
never care where a model came from. A hub source downloads only the files they read
(:func:`hub_allow_patterns`), and safetensors weights unless the entry opts out. Loading never reaches a model hub: local folders are opened
with ``local_files_only=True``, and the only step that may use the network (``huggingface``
sources) fails fast with a :class:`SourceError` where the hub is unreachable.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import os
import socket
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

from triton_mme_cdk.model_build.errors import SourceError
from triton_mme_cdk.model_build.manifest import (
    TOKENIZER_SOURCE_FILES,
    HuggingFaceSource,
    LocalSource,
    ModelSpec,
    OnnxFileSource,
    PackageSource,
    S3Source,
    SyntheticSource,
)

#: Seconds to wait for a TCP connection to the hub before calling it unreachable. huggingface_hub
#: itself retries a failed lookup five times with back-off (about 25 s) before giving up.
HUB_PROBE_TIMEOUT_S = 5.0


# --------------------------------------------------------------------------------------------
# resolve_source
# --------------------------------------------------------------------------------------------


def resolve_source(
    spec: ModelSpec, *, base_dir: Path, work_dir: Path, s3_client: Any = None
) -> Path | None:
    """Make the source loadable from disk: a ``save_pretrained`` folder, a ``.onnx`` file or None.

    ``work_dir`` is a folder this source may fill (downloads land there); ``base_dir`` is the
    manifest's folder, against which relative paths are resolved. Synthetic sources have no files.
    """
    source = spec.source
    if isinstance(source, SyntheticSource):
        return None
    if isinstance(source, LocalSource):
        return _pretrained_dir(base_dir / source.path, spec, f"source.path {source.path!r}")
    if isinstance(source, PackageSource):
        return _package_dir(source, spec)
    if isinstance(source, HuggingFaceSource):
        return _huggingface(source, spec, work_dir)
    if isinstance(source, S3Source):
        bucket, prefix = split_s3_uri(source.uri)
        _download_prefix(s3_or_default(s3_client), bucket, prefix, work_dir, spec, source.owner_args())
        return _pretrained_dir(work_dir, spec, f"source.uri {source.uri!r}")
    if isinstance(source, OnnxFileSource):
        return _onnx_file(source, spec, base_dir=base_dir, work_dir=work_dir, s3_client=s3_client)
    raise SourceError(f"source.kind: unsupported kind {source.kind!r}", model=spec.name)


def _pretrained_dir(path: Path, spec: ModelSpec, what: str) -> Path:
    # transformers reports a missing folder as a hub lookup of a repo named like the path; a
    # check here names the manifest field instead.
    if not path.is_dir():
        raise SourceError(f"{what}: folder {str(path)!r} does not exist", model=spec.name)
    if not (path / "config.json").is_file():
        raise SourceError(
            f"{what}: folder {str(path)!r} has no config.json; expected a save_pretrained folder",
            model=spec.name,
        )
    _check_weights(path, spec, what)
    return path


#: Weight files of a ``save_pretrained`` folder, and the index that names the shards of a big one.
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _check_weights(path: Path, spec: ModelSpec, what: str) -> None:
    """A folder with a config but no (or not all) weight files is a partial upload or copy.

    transformers would otherwise fail deep inside ``from_pretrained`` (or, for some classes,
    initialise random weights and build a model that means nothing), so it is named here."""
    if any((path / name).is_file() for name in _WEIGHTS):
        return
    for index_name in _INDEXES:
        index = path / index_name
        if not index.is_file():
            continue
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            shards = sorted({str(name) for name in weight_map.values()})
        except (OSError, ValueError, AttributeError) as error:
            raise SourceError(f"{what}: {index_name} cannot be read ({error}); upload it again",
                              model=spec.name) from None
        missing = [name for name in shards if not (path / name).is_file()]
        if not shards or missing:
            raise SourceError(
                f"{what}: {index_name} names {len(shards)} weight shard(s) and "
                f"{len(missing)} are missing ({', '.join(missing[:3]) or 'none listed'}); "
                "a partial upload? upload the whole save_pretrained folder",
                model=spec.name,
            )
        return
    raise SourceError(
        f"{what}: folder {str(path)!r} has config.json but no weights ({', '.join(_WEIGHTS)} or a "
        "sharded index); a partial upload? upload the whole save_pretrained folder",
        model=spec.name,
    )


def _package_dir(source: PackageSource, spec: ModelSpec) -> Path:
    try:
        found = importlib.util.find_spec(source.package)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise SourceError(
            f"source.package: {source.package!r} is not installed; install it or use another source",
            model=spec.name,
        )
    root = importlib.resources.files(source.package)
    if not isinstance(root, Path):
        # A zipped package has no folder transformers could open.
        raise SourceError(
            f"source.package: {source.package!r} is not installed as a folder (zip import); "
            "install it unzipped",
            model=spec.name,
        )
    folder = (root / source.path).resolve() if source.path else root.resolve()
    if not folder.is_relative_to(root.resolve()):
        raise SourceError(
            f"source.path: {source.path!r} leaves package {source.package!r}; use a folder inside it",
            model=spec.name,
        )
    return _pretrained_dir(folder, spec, f"source.path {source.path!r} in package {source.package!r}")


def _hub_offline() -> bool:
    # huggingface_hub reads HF_HUB_OFFLINE once at import; reading it here honours a value set
    # after that (by a test, or by the orchestrator before the first download).
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return constants.HF_HUB_OFFLINE or flag.strip().lower() in {"1", "true", "yes", "on"}


def _hub_reachable(endpoint: str, timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


#: What the export and validation read from a hub repository (:func:`hub_allow_patterns`): the
#: config, the tokenizer's files, sentence-transformers' module list and module configs
#: (``1_Pooling/config.json``), an image model's preprocessor config. Nothing else is downloaded
#: (no README, no ONNX, TensorFlow, Flax or OpenVINO copies, no scripts).
HUB_FILES = ("config.json", "generation_config.json", "preprocessor_config.json", *TOKENIZER_SOURCE_FILES,
             "modules.json", "config_sentence_transformers.json", "*/config.json")
#: The weights, by ``source.weights``: safetensors always; ``pytorch_model.bin`` (a pickle) only
#: where the entry opts out.
HUB_WEIGHTS = {
    "safetensors": ("model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors"),
    "pytorch_bin": ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin"),
}


def hub_allow_patterns(source: HuggingFaceSource) -> list[str]:
    """The ``allow_patterns`` of a hub download: :data:`HUB_FILES` and the weights it allows."""
    weights = HUB_WEIGHTS["safetensors"] + (HUB_WEIGHTS["pytorch_bin"] if source.weights == "pytorch_bin" else ())
    return sorted(set(HUB_FILES + weights))


def _huggingface(source: HuggingFaceSource, spec: ModelSpec, work_dir: Path) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"model {source.model_id!r} at revision {source.revision}"
    offline = _hub_offline()
    if not offline and not _hub_reachable(constants.ENDPOINT):
        raise SourceError(
            f"source: cannot download {what}: the hub {constants.ENDPOINT} is unreachable "
            f"(no connection within {HUB_PROBE_TIMEOUT_S:g} s); use a package, local or s3 source",
            model=spec.name,
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        folder = snapshot_download(
            source.model_id,
            revision=source.revision,
            local_dir=work_dir,
            local_files_only=offline,
            etag_timeout=HUB_PROBE_TIMEOUT_S,
            allow_patterns=hub_allow_patterns(source),
        )
    except (RepositoryNotFoundError, RevisionNotFoundError) as error:
        raise SourceError(
            f"source: {what} not found on the hub ({type(error).__name__})", model=spec.name
        ) from None
    except LocalEntryNotFoundError:
        reason = "offline mode is on (HF_HUB_OFFLINE)" if offline else "the download failed"
        raise SourceError(
            f"source: cannot download {what}: the hub is unreachable ({reason}) and the revision "
            "is not in the local cache",
            model=spec.name,
        ) from None
    except (HfHubHTTPError, OSError) as error:
        raise SourceError(
            f"source: cannot download {what}: the hub is unreachable or refused: "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__}",
            model=spec.name,
        ) from None
    folder_path = Path(folder)
    if source.weights == "safetensors" and (folder_path / "config.json").is_file() and not any(
            (folder_path / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
        raise SourceError(
            f"source.weights: 'safetensors' (the default), but {what} has no model.safetensors (nor its "
            "sharded index); a repository with pytorch_model.bin only needs source.weights: pytorch_bin "
            "(a pickle: loading it can run code; the plan names the entry)",
            model=spec.name,
        )
    return _pretrained_dir(folder_path, spec, f"source.model_id {source.model_id!r}")


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``(bucket, key or prefix)`` of ``s3://bucket/key``; the key without its leading slash."""
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


def s3_or_default(client: Any) -> Any:
    """``client`` where the caller gave one, else boto3's default S3 client (the build's own)."""
    if client is not None:
        return client
    import boto3

    return boto3.client("s3")


def _safe_target(root: Path, relative: str, spec: ModelSpec, uri: str) -> Path:
    # An S3 key is any string: "../" in a key must not write outside the work folder.
    parts = PurePosixPath(relative).parts
    if not parts or any(part in ("..", "") for part in parts) or relative.startswith("/"):
        raise SourceError(f"source: object {uri!r} has an unsafe key; refusing to download it",
                          model=spec.name)
    return root.joinpath(*parts)


def _download_prefix(client: Any, bucket: str, prefix: str, work_dir: Path, spec: ModelSpec,
                     owner: dict[str, str] | None = None) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    # A trailing "/" keeps "models/bert" from also matching "models/bert-large/...".
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    uri = f"s3://{bucket}/{prefix}"
    count = 0
    try:
        # The whole listing is checked before the first download: an empty or partial prefix
        # (no config.json, no weights) fails in one request, not after gigabytes.
        keys = [item["Key"]
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix,
                                                                             **(owner or {}))
                for item in page.get("Contents", []) if not item["Key"].endswith("/")]  # "/": console folder marker
        names = {key[len(prefix):] for key in keys}
        if keys and "config.json" not in names:
            raise SourceError(
                f"source.uri: {uri!r} holds {len(keys)} object(s) but no config.json; a partial upload? "
                "expected a whole save_pretrained folder",
                model=spec.name,
            )
        if keys and not names & set(_WEIGHTS + _INDEXES):
            raise SourceError(
                f"source.uri: {uri!r} holds config.json but no weights ({', '.join(_WEIGHTS)} or a sharded "
                "index); a partial upload? expected a whole save_pretrained folder",
                model=spec.name,
            )
        for key in keys:
            target = _safe_target(work_dir, key[len(prefix):], spec, f"s3://{bucket}/{key}")
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, key, str(target), ExtraArgs=owner or {})
            count += 1
    except (ClientError, BotoCoreError) as error:
        raise SourceError(f"source.uri: cannot download {uri!r}: {error}", model=spec.name) from None
    if count == 0:
        raise SourceError(
            f"source.uri: no objects under {uri!r}; expected a save_pretrained folder (config.json "
            "and weights) there: check the URI, or wait until the upload has finished",
            model=spec.name,
        )


def s3_tokenizer_files(spec: ModelSpec, source: S3Source, folder: Path, s3_client: Any) -> Path:
    """Download the tokenizer files of an S3 source (those present) into ``folder``, alone.

    A raw-text target checks them before the export downloads the weights, so a prefix without
    them is refused in a few requests. A missing file is left to the caller's check; any other
    S3 error is a :class:`SourceError` naming the object.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split_s3_uri(source.uri)
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    folder.mkdir(parents=True, exist_ok=True)
    client = s3_or_default(s3_client)
    for name in TOKENIZER_SOURCE_FILES:
        try:
            client.download_file(bucket, prefix + name, str(folder / name), ExtraArgs=source.owner_args())
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in {"404", "NoSuchKey", "NotFound"}:
                raise SourceError(f"source.uri: cannot read s3://{bucket}/{prefix}{name}: {error}",
                                  model=spec.name) from None
        except BotoCoreError as error:
            raise SourceError(f"source.uri: cannot read s3://{bucket}/{prefix}{name}: {error}",
                              model=spec.name) from None
    return folder


def _onnx_file(
    source: OnnxFileSource, spec: ModelSpec, *, base_dir: Path, work_dir: Path, s3_client: Any
) -> Path:
    if source.path.startswith("s3://"):
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = split_s3_uri(source.path)
        if not key or key.endswith("/"):
            raise SourceError(f"source.path: {source.path!r} names no object; expected s3://bucket/key",
                              model=spec.name)
        work_dir.mkdir(parents=True, exist_ok=True)
        target = work_dir / PurePosixPath(key).name
        try:
            s3_or_default(s3_client).download_file(bucket, key, str(target), ExtraArgs=source.owner_args())
        except (ClientError, BotoCoreError) as error:
            raise SourceError(f"source.path: cannot download {source.path!r}: {error}",
                              model=spec.name) from None
        _check_onnx_file(target, source.path, spec)
        return target
    path = base_dir / source.path
    if not path.is_file():
        raise SourceError(f"source.path: file {str(path)!r} does not exist", model=spec.name)
    _check_onnx_file(path, source.path, spec)
    return path


def _check_onnx_file(path: Path, given: str, spec: ModelSpec) -> None:
    """Refuse, by its first bytes, a file that cannot be an ONNX model, before onnx parses it.

    A serialized ``ModelProto`` starts with its ``ir_version`` field (tag byte 0x08). Protobuf
    parses many arbitrary byte strings without complaint, so this check, not a parse error, is
    what names the common mistakes: an empty file, a Git LFS pointer, an HTML error page."""
    with path.open("rb") as handle:
        head = handle.read(64)
    if not head:
        raise SourceError(f"source.path: {given!r} is an empty file; expected an ONNX model", model=spec.name)
    if head.startswith(b"version https://git-lfs"):
        raise SourceError(f"source.path: {given!r} is a Git LFS pointer, not the model; run `git lfs pull`",
                          model=spec.name)
    if head[0] != 0x08:
        raise SourceError(
            f"source.path: {given!r} is not an ONNX model (its first bytes are {head[:8]!r}; a "
            "serialized ONNX ModelProto starts with byte 0x08)",
            model=spec.name,
        )
