"""The models manifest (``models.yaml``): a typed schema shared by the CDK app and the build.

It imports no torch, ONNX or AWS SDK, so ``cdk synth`` can validate a manifest of a thousand models
in well under a second. Everything that can be checked from the manifest alone is checked here, so
that a manifest that could never give a loadable Triton model is refused before any export work
(and before ``cdk synth`` writes a template).

Owns: what to build. ``fields`` (source kinds, Triton and ONNX Runtime settings, gates, inputs),
``engines`` (the ``tensorrt_plan`` block of prebuilt TensorRT engines),
``schema`` (``ModelSpec``, ``Manifest``), ``loading`` (YAML policy and limits, error messages,
the tokenizer files a raw-text source must hold). Callers import the names below from
``model_build.manifest``.

May import: ``shared``.
"""

from triton_mme_cdk.model_build.manifest.engines import TENSORRT_DATA_TYPES, PlanTensor, TensorRTPlan
from triton_mme_cdk.model_build.manifest.fields import (
    DEFAULT_GATES,
    TENSORRT_KEYS,
    TENSORRT_PATH_KEYS,
    AccuracyGate,
    BuildPlacement,
    DynamicBatching,
    HuggingFaceSource,
    ImageInputs,
    InstanceGroup,
    LocalSource,
    OnnxFileSource,
    OnnxRuntimeTuning,
    PackageSource,
    Precision,
    S3Source,
    Source,
    SyntheticSource,
    TensorRTAccelerator,
    TextInputs,
    Tolerance,
)
from triton_mme_cdk.model_build.manifest.loading import (
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_DEPTH,
    MAX_SCALAR_CHARS,
    SLOW_TOKENIZER_FILES,
    TOKENIZER_FILES,
    TOKENIZER_JSON,
    TOKENIZER_SOURCE_FILES,
    format_validation_error,
    load_manifest,
    load_manifest_bytes,
    parse_manifest,
)
from triton_mme_cdk.model_build.manifest.schema import (
    MAX_TARGETS,
    MODEL_NAME_MAX,
    MODEL_NAME_PATTERN,
    PAIR_TASKS,
    TEXT_TASKS,
    Manifest,
    ModelSpec,
    Task,
)

__all__ = [
    "DEFAULT_GATES",
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_DEPTH",
    "MAX_SCALAR_CHARS",
    "MAX_TARGETS",
    "MODEL_NAME_MAX",
    "MODEL_NAME_PATTERN",
    "PAIR_TASKS",
    "SLOW_TOKENIZER_FILES",
    "TENSORRT_DATA_TYPES",
    "TENSORRT_KEYS",
    "TENSORRT_PATH_KEYS",
    "TEXT_TASKS",
    "TOKENIZER_FILES",
    "TOKENIZER_JSON",
    "TOKENIZER_SOURCE_FILES",
    "AccuracyGate",
    "BuildPlacement",
    "DynamicBatching",
    "HuggingFaceSource",
    "ImageInputs",
    "InstanceGroup",
    "LocalSource",
    "Manifest",
    "ModelSpec",
    "OnnxFileSource",
    "OnnxRuntimeTuning",
    "PackageSource",
    "PlanTensor",
    "Precision",
    "S3Source",
    "Source",
    "SyntheticSource",
    "Task",
    "TensorRTAccelerator",
    "TensorRTPlan",
    "TextInputs",
    "Tolerance",
    "format_validation_error",
    "load_manifest",
    "load_manifest_bytes",
    "parse_manifest",
]
