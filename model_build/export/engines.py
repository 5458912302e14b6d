"""Prebuilt TensorRT plans (``format: tensorrt_plan``): the declared plan files on disk, and the
request a smoke test sends them.

A plan is not exported and cannot be validated here: deserializing an engine needs a GPU of its
compute capability and the TensorRT that built it. This module therefore only fetches the files
the manifest declares (a local folder, or those keys alone under an S3 prefix) and refuses what
cannot be an engine (missing, empty, a path leaving the folder); the build records that the plan
was not run (:data:`NOT_VERIFIED`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from triton_mme_cdk.model_build.errors import SourceError
from triton_mme_cdk.model_build.manifest import LocalSource, ModelSpec, S3Source, TensorRTPlan
from triton_mme_cdk.model_build.types import ExportedModel, TensorSpec

#: What a plan's build record says about verification, instead of a measured difference.
NOT_VERIFIED = ("not verified: a TensorRT plan cannot run on CPU; its files and declared signature were "
                "checked, its outputs were never computed")
#: config.pbtxt data type -> numpy dtype name (BF16 has no numpy type: such an input gets no sample).
_NUMPY = {"TYPE_BOOL": "bool", "TYPE_UINT8": "uint8", "TYPE_INT8": "int8", "TYPE_INT32": "int32",
          "TYPE_INT64": "int64", "TYPE_FP16": "float16", "TYPE_FP32": "float32"}


def _plan(spec: ModelSpec) -> TensorRTPlan:
    if spec.tensorrt_plan is None:
        raise SourceError(f"format: got {spec.format!r}; plan files are fetched for format 'tensorrt_plan' only",
                          model=spec.name)
    return spec.tensorrt_plan


def fetch_plans(spec: ModelSpec, *, base_dir: Path, work_dir: Path, s3_client: Any = None) -> Path:
    """The folder holding every plan file ``tensorrt_plan.cc_model_filenames`` names.

    ``local``: the source folder itself (relative to the manifest); a file that is missing, empty,
    not a regular file or (through a link) outside the folder is refused. ``s3``: the declared keys
    alone are downloaded into ``work_dir`` (other objects under the prefix are never read).
    """
    plan = _plan(spec)
    source = spec.source
    if isinstance(source, LocalSource):
        folder = (base_dir / source.path).resolve()
        if not folder.is_dir():
            raise SourceError(f"source.path: {source.path!r}: folder {str(folder)!r} does not exist; it must "
                              "hold the plan files tensorrt_plan.cc_model_filenames names", model=spec.name)
        for name in plan.plan_files():
            file = folder / name
            if file.is_symlink() and not file.resolve().is_relative_to(folder):
                raise SourceError(f"tensorrt_plan.cc_model_filenames: {name!r} in {source.path!r} links outside "
                                  "the source folder; copy the plan into the folder", model=spec.name)
            _check_plan_file(file, name, f"source.path {source.path!r}", spec)
        return folder
    if isinstance(source, S3Source):
        return _download_plans(spec, plan, source, work_dir, s3_client)
    raise SourceError(f"source.kind: got {source.kind!r} with format 'tensorrt_plan'; plans come from a 'local' "
                      "folder or an 's3' prefix", model=spec.name)


def _check_plan_file(file: Path, name: str, where: str, spec: ModelSpec) -> None:
    if not file.is_file():
        raise SourceError(f"tensorrt_plan.cc_model_filenames: {name!r} is missing in {where}; build the plan "
                          "there or fix its file name", model=spec.name)
    if file.stat().st_size == 0:
        raise SourceError(f"tensorrt_plan.cc_model_filenames: {name!r} in {where} is an empty file; an engine is "
                          "never empty: write it again with trtexec --saveEngine", model=spec.name)


def _download_plans(spec: ModelSpec, plan: TensorRTPlan, source: S3Source, work_dir: Path, s3_client: Any) -> Path:
    from botocore.exceptions import BotoCoreError, ClientError

    from triton_mme_cdk.model_build.export.sources import s3_or_default, split_s3_uri

    bucket, prefix = split_s3_uri(source.uri)
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    client = s3_or_default(s3_client)
    work_dir.mkdir(parents=True, exist_ok=True)
    for name in plan.plan_files():
        uri = f"s3://{bucket}/{prefix}{name}"
        try:
            client.download_file(bucket, prefix + name, str(work_dir / name), ExtraArgs=source.owner_args())
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code")
            if code in {"404", "NoSuchKey", "NotFound"}:
                raise SourceError(f"tensorrt_plan.cc_model_filenames: {name!r} is missing: no object {uri}; upload "
                                  "the plan there or fix its file name", model=spec.name) from None
            raise SourceError(f"source.uri: cannot download {uri}: {error}", model=spec.name) from None
        except BotoCoreError as error:
            raise SourceError(f"source.uri: cannot download {uri}: {error}", model=spec.name) from None
        _check_plan_file(work_dir / name, name, f"source.uri {source.uri!r}", spec)
    return work_dir


def plan_model(spec: ModelSpec, folder: Path) -> ExportedModel:
    """The plan as the later steps see an exported model: its folder and the declared signature
    (full shapes, ``-1`` for the batch where ``max_batch_size`` >= 1). BF16 tensors, which numpy
    cannot hold, are described as float32 here; the config keeps their declared type."""
    plan = _plan(spec)

    def tensors(declared: Any) -> tuple[TensorSpec, ...]:
        batch = (-1,) if spec.max_batch_size >= 1 else ()
        return tuple(TensorSpec(t.name, _NUMPY.get(t.data_type, "float32"), (*batch, *t.dims)) for t in declared)

    return ExportedModel(name=spec.name, format=spec.format, path=folder, inputs=tensors(plan.input),
                         outputs=tensors(plan.output))


def plan_sample_inputs(spec: ModelSpec) -> dict[str, np.ndarray]:
    """Zeros of each declared input's shape (batch 1 where batching is on; a variable dimension as
    1): what a smoke test sends a plan to check the names, types and shapes of its answer. Its
    values are never compared, since no reference outputs exist. An input type numpy has no
    dtype for (BF16) gets no sample, and the smoke test then reports the reference as unusable.
    """
    plan = _plan(spec)
    batch = [1] if spec.max_batch_size >= 1 else []
    return {t.name: np.zeros([*batch, *(1 if d == -1 else d for d in t.dims)], dtype=_NUMPY[t.data_type])
            for t in plan.input if t.data_type in _NUMPY}
