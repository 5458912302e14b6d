"""The build of one model, and the runners of many: the export, package and text-ensemble steps in order.

- ``steps``: the typed steps (:data:`~model_build.pipeline.steps.PIPELINE`: tokenizer, export +
  optimize + validate or, for a prebuilt TensorRT plan, its files fetched (never run), config,
  text-ensemble check, package, pre-publish gate) and the one runner
  that sequences, times and reports them;
- ``build``: a build into a folder (``build_model``), one model key into the local store
  (``build_unit``, what the Lambda runs per Map item), the keys that are missing in processes
  (``build_missing``) and the release folder (``build_release``).

Owns: the order of the steps and the local store of built units (``<out>/_builds/<key>/``). It
never publishes: :mod:`model_build.release` takes the store from there. Importing this package is
cheap (the steps import torch and onnx when they run), so callers import the names below from
``model_build.pipeline``.

May import: ``shared``, ``manifest``, ``export``, ``artifact``, ``text_ensemble``, ``release.identity``,
``capacity``.
"""

from triton_mme_cdk.model_build.pipeline.build import (
    BUILD_RECORD,
    DEFAULT_COMPRESSLEVEL,
    UNIT_RECORD,
    BuildRecord,
    ModelBuildResult,
    build_missing,
    build_model,
    build_release,
    build_unit,
    read_unit,
)
from triton_mme_cdk.model_build.pipeline.steps import (
    PIPELINE,
    TEXT_CHECK,
    Artifacts,
    BuildInputs,
    BuildOptions,
    Step,
    run_pipeline,
    steps_for,
)

__all__ = [
    "BUILD_RECORD",
    "DEFAULT_COMPRESSLEVEL",
    "PIPELINE",
    "TEXT_CHECK",
    "UNIT_RECORD",
    "Artifacts",
    "BuildInputs",
    "BuildOptions",
    "BuildRecord",
    "ModelBuildResult",
    "Step",
    "build_missing",
    "build_model",
    "build_release",
    "build_unit",
    "read_unit",
    "run_pipeline",
    "steps_for",
]
