"""Pack a model into the ``model.tar.gz`` the SageMaker Triton container loads.

Layout (one top-level directory, which the container turns into the Triton model)::

    <model_name>/
    <model_name>/1/
    <model_name>/1/model.onnx        (or model.pt; ONNX external-data files next to it; or one
                                     TensorRT plan per compute capability: package_plans)
    <model_name>/config.pbtxt

The archive is reproducible: the same config and model bytes give the same tarball bytes,
whatever the files' mtimes, owners or umask and whoever builds it. That makes the sha256 a content
address: an unchanged model is recognised and not re-uploaded, and a changed one always gets a new
digest (the multi-model endpoint does not reload a changed object under the same key).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

from triton_mme_cdk.model_build.artifact.triton_config import (
    FORMAT_BACKEND,
    check_config,
    config_backend,
    default_filename,
)
from triton_mme_cdk.model_build.errors import PackageError, TritonConfigError

#: Fixed metadata for every entry; with sorted entries it makes the archive byte-identical.
TAR_MTIME = 0
DIR_MODE = 0o755
FILE_MODE = 0o644
TAR_FORMAT = tarfile.PAX_FORMAT
#: A Triton model directory name; it is also an S3 key part and a path inside the container.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CHUNK = 1 << 20


class _HashingWriter(io.RawIOBase):
    """Writes through to a file while hashing and counting, so the archive is read once."""

    def __init__(self, target: IO[bytes]) -> None:
        self._target = target
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._target.write(view)
        self.sha256.update(view)
        self.size += len(view)
        return len(view)


def _tarinfo(name: str, *, directory: bool, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = DIR_MODE if directory else FILE_MODE
    info.size = 0 if directory else size
    info.mtime = TAR_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _graph_tensors(graph: Any) -> Iterator[Any]:
    """Every TensorProto of a graph: initializers, sparse ones, node attributes, subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _graph_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _graph_tensors(subgraph)


def onnx_external_data_files(model_file: Path) -> list[str]:
    """Relative paths of the external-data files an ONNX model refers to (sorted, unique).

    Only the graph is parsed (``load_external_data=False``); the weights are not read. A location
    that is absolute or leaves the model's folder is refused: it could not be shipped in the
    tarball and would not be found on the endpoint.
    """
    import onnx  # lazy: packaging a TorchScript model needs no onnx

    try:
        model = onnx.load(str(model_file), load_external_data=False)
    except Exception as error:  # onnx raises DecodeError and others
        raise PackageError(
            f"model_file: {str(model_file)!r} is not a readable onnx model: {error}"
        ) from None
    locations: set[str] = set()
    for tensor in _graph_tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {entry.key: entry.value for entry in tensor.external_data}
        location = entries.get("location", "")
        path = PurePosixPath(location.replace("\\", "/"))
        if not location or path.is_absolute() or ".." in path.parts:
            raise PackageError(
                f"model_file: tensor {tensor.name!r} has external data location {location!r}; "
                "it must be a relative path inside the model's folder"
            )
        locations.add(path.as_posix())
    return sorted(locations)


def package_model(
    *,
    model_name: str,
    config_text: str,
    model_file: Path,
    format: str,
    out_path: Path,
    compresslevel: int = 1,
) -> tuple[str, int]:
    """Write ``out_path`` (``model.tar.gz``) and return ``(sha256 hex, size in bytes)``.

    The config is checked first and must match ``format``. The build then runs the pre-publish
    gate (:func:`gate_tarball`: layout, version folder, config against the graph) on the tarball. The model file is streamed, never read whole into memory; the archive is
    written to a temporary file next to ``out_path`` and moved into place, so a failed run leaves
    no half-written tarball behind.
    """
    model_file = Path(model_file)
    out_path = Path(out_path)
    _check_name_and_level(model_name, compresslevel)
    if format not in FORMAT_BACKEND:
        raise PackageError(
            f"format: got {format!r}; allowed: " + ", ".join(sorted(FORMAT_BACKEND)), model=model_name
        )
    if format == "tensorrt_plan":
        raise PackageError("format: got 'tensorrt_plan'; plans are packed by package_plans (one file per "
                           "compute capability)", model=model_name)
    if not model_file.is_file():
        raise PackageError(
            f"model_file: {str(model_file)!r} does not exist or is not a file", model=model_name
        )
    try:
        config = check_config(config_text, model=model_name)
    except TritonConfigError as error:
        raise PackageError(f"config_text: {error}", model=model_name) from None
    expected_backend = FORMAT_BACKEND[format][0]
    if config_backend(config) != expected_backend:
        raise PackageError(
            f"config_text: backend {config_backend(config)!r} does not serve format {format!r}; "
            f"expected backend {expected_backend!r}",
            model=model_name,
        )
    filename = default_filename(config)
    if "/" in filename or filename in {".", ".."}:
        raise PackageError(
            f"config_text: default_model_filename {filename!r} must be a plain file name",
            model=model_name,
        )

    # Path inside the archive -> source file on disk, or the bytes themselves.
    files: dict[str, Path | bytes] = {
        f"{model_name}/config.pbtxt": config_text.encode("utf-8"),
        f"{model_name}/1/{filename}": model_file,
    }
    if format == "onnx":
        try:
            extras = onnx_external_data_files(model_file)
        except PackageError as error:
            raise PackageError(str(error), model=model_name) from None
        for location in extras:
            external = model_file.parent / location
            if not external.is_file():
                raise PackageError(
                    f"model_file: external data file {location!r} is missing next to "
                    f"{str(model_file)!r}",
                    model=model_name,
                )
            arcname = f"{model_name}/1/{location}"
            if arcname in files:
                raise PackageError(
                    f"model_file: external data location {location!r} collides with {filename!r}",
                    model=model_name,
                )
            files[arcname] = external

    return write_tarball(files, out_path, compresslevel=compresslevel)


def _check_name_and_level(model_name: str, compresslevel: int) -> None:
    if not _MODEL_NAME.match(model_name) or model_name in {".", ".."}:
        raise PackageError(
            f"model_name: got {model_name!r}; use letters, digits, '_', '-' and '.', starting "
            "with a letter or digit (it becomes the triton model directory)",
            model=model_name,
        )
    if not 0 <= compresslevel <= 9:
        raise PackageError(f"compresslevel: got {compresslevel}; allowed: 0 to 9", model=model_name)


def package_plans(*, model_name: str, config_text: str, plan_dir: Path, out_path: Path,
                  compresslevel: int = 1) -> tuple[str, int]:
    """Write the tarball of a prebuilt TensorRT plan: ``<name>/config.pbtxt`` and
    ``<name>/1/<file>`` for each file the config's ``cc_model_filenames`` names (taken from
    ``plan_dir``); ``(sha256 hex, size)``. Reproducible like :func:`package_model`.

    The files are the ones the config names, so the tarball and its config cannot disagree; a
    missing or empty file is refused (an engine is never empty). Their content is not read: a
    plan can only be deserialized on a GPU by the TensorRT that built it.
    """
    _check_name_and_level(model_name, compresslevel)
    try:
        config = check_config(config_text, model=model_name)
    except TritonConfigError as error:
        raise PackageError(f"config_text: {error}", model=model_name) from None
    if config_backend(config) != "tensorrt" or not config.cc_model_filenames:
        raise PackageError(f"config_text: backend {config_backend(config)!r} with "
                           f"{len(config.cc_model_filenames)} cc_model_filenames; a plan tarball needs backend "
                           "'tensorrt' and at least one plan", model=model_name)
    files: dict[str, Path | bytes] = {f"{model_name}/config.pbtxt": config_text.encode("utf-8")}
    for filename in sorted(set(config.cc_model_filenames.values())):
        plan = Path(plan_dir) / filename
        if not plan.is_file() or plan.stat().st_size == 0:
            raise PackageError(f"plan file {filename!r}: {'empty' if plan.is_file() else 'missing'} in "
                               f"{str(plan_dir)!r}; every file cc_model_filenames names must be a built engine",
                               model=model_name)
        files[f"{model_name}/1/{filename}"] = plan
    return write_tarball(files, Path(out_path), compresslevel=compresslevel)


def write_tarball(files: dict[str, Path | bytes], out_path: Path, *, compresslevel: int = 1,
                  empty_dirs: tuple[str, ...] = ()) -> tuple[str, int]:
    """Write ``files`` (archive path -> file on disk or bytes) reproducibly; ``(sha256, size)``.

    Shared by :func:`package_model` and the raw-text ensemble (several model folders in one
    tarball). Parent folders are added for every file; ``empty_dirs`` adds folders with nothing in
    them (an ensemble's ``ensemble/1/``). Written to a temporary file and moved into place.
    """
    directories: set[str] = set(empty_dirs)
    for arcname in files:
        parent = PurePosixPath(arcname).parent
        while parent != PurePosixPath("."):
            directories.add(parent.as_posix())
            parent = parent.parent
    entries = sorted([*directories, *files], key=lambda name: PurePosixPath(name).parts)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".model-", suffix=".tar.gz.tmp", dir=out_path.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            writer = _HashingWriter(raw)
            with (
                gzip.GzipFile(
                    filename="", mode="wb", fileobj=writer, compresslevel=compresslevel, mtime=0
                ) as gz,
                tarfile.open(fileobj=gz, mode="w", format=TAR_FORMAT, encoding="utf-8") as tar,
            ):
                for name in entries:
                    if name in directories:
                        tar.addfile(_tarinfo(name, directory=True))
                        continue
                    source = files[name]
                    if isinstance(source, bytes):
                        tar.addfile(_tarinfo(name, directory=False, size=len(source)), io.BytesIO(source))
                    else:
                        with source.open("rb") as handle:
                            size = os.fstat(handle.fileno()).st_size
                            tar.addfile(_tarinfo(name, directory=False, size=size), handle)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp_name, FILE_MODE)
        os.replace(tmp_name, out_path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return writer.sha256.hexdigest(), writer.size
