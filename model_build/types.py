"""Plain data passed between the build steps (export -> validate -> config -> package -> publish).

No torch or ONNX imports: the CLI, the handler and the CDK app can import these cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Triton data types (``TYPE_*`` without the prefix) keyed by numpy dtype name.
NUMPY_TO_TRITON: dict[str, str] = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output as Triton sees it.

    ``shape`` is the full shape with ``-1`` for every variable dimension, batch included;
    ``dtype`` is a numpy dtype name (``float32``, ``int64``...).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def triton_dtype(self) -> str:
        return NUMPY_TO_TRITON[self.dtype]


@dataclass(frozen=True)
class ExportedModel:
    """A model file written by the export step, with the signature read back from it."""

    name: str  # the manifest entry's name
    format: str  # "onnx" or "torchscript"
    path: Path  # model.onnx or model.pt
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass
class ValidationReport:
    """What validation measured: the largest absolute difference per output, over all samples."""

    name: str
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    #: Extra check against an independent reference (sentence-transformers for MiniLM).
    reference_check: str | None = None
    reference_max_abs_diff: float | None = None
    #: Accuracy gates against PyTorch FP32 (model_build.export.validate): the precision served, the
    #: lowest cosine of any output row, and for sentence embeddings the top-k retrieval agreement
    #: on the sample sentences, each with the gate it had to meet.
    precision: str = "fp32"
    min_cosine: float | None = None
    min_cosine_gate: float | None = None
    top_k_agreement: float | None = None
    top_k_gate: float | None = None
    top_k: int | None = None
    #: What the optimize step did: fused ``com.microsoft`` ops by type, and for INT8 how many
    #: MatMuls were quantized and which were kept in FP32 (model_build.export.optimize).
    fused_ops: dict[str, int] = field(default_factory=dict)
    quantized_matmuls: int = 0
    fp32_matmuls: list[str] = field(default_factory=list)
    #: INT8: the lowest cosine on the calibration inputs the layer choice was made on (the
    #: gate itself is judged on the held-out validation inputs: ``min_cosine``).
    calibration_min_cosine: float | None = None
    #: ``text.group_by_length``: ``on: ...`` with the grouped graph's parity, ``off: <why>`` where
    #: the default did not fit, ``None`` where it was not asked for (model_build.export.length_groups).
    length_grouping: str | None = None

    @property
    def worst(self) -> float:
        return max(self.max_abs_diff.values(), default=0.0)


@dataclass(frozen=True)
class Artifact:
    """A packaged ``model.tar.gz`` and the targets (copies) that publish it."""

    name: str  # the manifest entry's name
    format: str
    path: Path
    sha256: str
    size: int
    targets: tuple[str, ...]
    #: ``reference.npz``: inputs and the outputs recorded at build time, for ``verify``.
    reference_path: Path | None = None
    #: The model's ``config.pbtxt``, published next to the reference for smoke tests, which
    #: should not have to download a whole tarball to learn a model's inputs and outputs.
    config_path: Path | None = None
    #: Its footprint as the build measured it (``Footprint.to_json`` of its first target), recorded
    #: in the release index for each target; ``None`` for a build that recorded none.
    footprint: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    #: Its inputs and outputs as its config declares them (``config_signature``), recorded in the
    #: release index and carried by each route to clients; ``None``: not recorded (unknown).
    signature: dict[str, Any] | None = field(default=None, compare=False, hash=False)
