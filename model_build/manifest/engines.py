"""The ``tensorrt_plan`` block of a ``format: tensorrt_plan`` entry: prebuilt TensorRT engines, one
per GPU compute capability, with the signature they declare (:class:`TensorRTPlan`).

Its own module because a plan is unlike every other source: nothing here is exported or run at
build time, so what Triton needs to serve it (the data types its TensorRT backend maps, the
``cc_model_filenames`` keys, plain file names) is checked from the manifest alone. The package
step's config checks (``model_build.artifact.triton_config``) use the same patterns.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

from pydantic import model_validator

from triton_mme_cdk.model_build.manifest.fields import StrictModel

#: Data types Triton's TensorRT backend maps to a TensorRT type (tensorrt_backend
#: ``src/tensorrt_utils.cc``, ``ConvertDatatypeToTrtType``), in config.pbtxt spelling.
TensorRTDataType = Literal[
    "TYPE_BOOL", "TYPE_UINT8", "TYPE_INT8", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_BF16"
]
TENSORRT_DATA_TYPES: tuple[str, ...] = get_args(TensorRTDataType)
#: A compute capability as Triton's ``cc_model_filenames`` keys it (``"7.5"``): Triton looks the
#: GPU's ``<major>.<minor>`` up as printed numbers, so a key with a leading zero ("08.6") never matches.
COMPUTE_CAPABILITY_PATTERN = r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$"
#: A plan's file name inside the version folder ``1/``: plain, no folder, no leading dot.
PLAN_FILE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
#: A tensor name as config.pbtxt carries it (TensorRT names such as ``input.1`` or ``onnx::Gemm_0``).
TENSOR_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}$"
#: ``major.minor.patch`` and an optional build number (``10.9.0`` or ``10.9.0.34``).
TENSORRT_VERSION_PATTERN = r"^\d+\.\d+\.\d+(\.\d+)?$"
#: TensorRT's largest tensor rank (``nvinfer1::Dims::MAX_DIMS``).
MAX_TENSOR_RANK = 8


class PlanTensor(StrictModel):
    """One input or output of a plan, spelled as in config.pbtxt; ``dims`` leave out the batch
    dimension when ``max_batch_size`` >= 1, as Triton's do. Declared, because a plan cannot be
    read without a GPU and the TensorRT it was built with."""

    name: str
    data_type: TensorRTDataType
    dims: tuple[int, ...]


class TensorRTPlan(StrictModel):
    """Prebuilt TensorRT engines, one per GPU compute capability, served by Triton's TensorRT backend.

    A plan runs only on the GPU family (compute capability) and with the TensorRT it was built
    for; the build cannot run it (no GPU), so its signature is declared here and what the build
    records says it was not verified. The checks are one model-level validator so that each
    message names its field as the manifest spells it (``cc_model_filenames: key '8' ...``).
    """

    #: The TensorRT the plans were built with (``major.minor.patch``, optionally a build number);
    #: the fleet's Triton image must have the same (checked at synth).
    tensorrt_version: str
    #: Compute capability (``"8.6"``) -> plan file in the source folder or prefix.
    cc_model_filenames: dict[str, str]
    input: tuple[PlanTensor, ...]
    output: tuple[PlanTensor, ...]

    @model_validator(mode="after")
    def _checked(self) -> TensorRTPlan:
        if not re.match(TENSORRT_VERSION_PATTERN, self.tensorrt_version):
            raise ValueError(f"tensorrt_version: got {self.tensorrt_version!r}; give the TensorRT the plans were "
                             "built with as major.minor.patch, such as '10.9.0' (trtexec prints it)")
        if not self.cc_model_filenames:
            raise ValueError("cc_model_filenames: empty; give at least one plan keyed by compute capability, "
                             "such as {'8.6': model.a10g.plan}")
        for cc, filename in self.cc_model_filenames.items():
            if not re.match(COMPUTE_CAPABILITY_PATTERN, cc):
                raise ValueError(f"cc_model_filenames: key {cc!r} is not a compute capability; use 'major.minor' "
                                 "such as '7.5' (T4) or '8.6' (A10G), quoted in YAML")
            if not re.match(PLAN_FILE_PATTERN, filename) or ".." in filename:
                raise ValueError(f"cc_model_filenames[{cc!r}]: got {filename!r}; a plan is a plain file name in the "
                                 "source folder (letters, digits, '_', '-', '.'; no '/', no '..', not starting "
                                 "with '.')")
        seen: dict[str, str] = {}
        for kind, tensors in (("input", self.input), ("output", self.output)):
            if not tensors:
                raise ValueError(f"{kind}: empty; declare every {kind} of the engine (name, data_type, dims)")
            for index, tensor in enumerate(tensors):
                where = f"{kind}[{index}]({tensor.name})"
                if not re.match(TENSOR_NAME_PATTERN, tensor.name):
                    raise ValueError(f"{kind}[{index}].name: got {tensor.name[:130]!r}; give the engine's tensor name "
                                     "(letters, digits, '_', '.', ':', '/', '-'; at most 128 characters)")
                if tensor.name in seen:
                    raise ValueError(f"{where}.name: got {tensor.name!r}, already the name of {seen[tensor.name]}; "
                                     "an engine's tensor names are unique")
                seen[tensor.name] = f"{kind}[{index}]"
                dims = list(tensor.dims)
                if not 1 <= len(dims) <= MAX_TENSOR_RANK or any(d != -1 and d < 1 for d in dims):
                    raise ValueError(f"{where}.dims: got {dims}; give 1 to {MAX_TENSOR_RANK} dimensions, each -1 "
                                     "(variable) or >= 1, without the batch dimension when max_batch_size >= 1")
        return self

    def plan_files(self) -> list[str]:
        """The distinct plan files, sorted (two capabilities may share a hardware-compatible plan)."""
        return sorted(set(self.cc_model_filenames.values()))
