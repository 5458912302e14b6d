"""Raw text in: one tarball holding a whole Triton repository (ensemble + tokenizer + model).

Layout of the tarball (SageMaker unpacks it into one folder and loads it under the target's key;
Triton's SageMaker server picks the folder whose config has ``platform: "ensemble"`` as the main
model and loads the others as its members, under their own names)::

    ensemble/config.pbtxt          platform "ensemble": TEXT -> tokenizer -> model -> outputs
    ensemble/1/                    empty (an ensemble has no files, but needs a version folder)
    tokenizer/config.pbtxt         backend "python", KIND_CPU
    tokenizer/1/model.py           tokenizer_model.py, unchanged (numpy + tokenizers)
    tokenizer/1/tokenizer.json     the source's tokenizer as AutoTokenizer runs it (served_tokenizer)
    tokenizer/1/site-packages/tokenizers/...   the pinned tokenizers wheel, unpacked (serving_wheel)
    model/config.pbtxt             the exported model's config (render_config), renamed "model"
    model/1/model.onnx             the exported file, unchanged

The member names are fixed (``tokenizer``, ``model``): the server runs with
``--model-namespacing=true`` (as the SageMaker MME serve script does), so two ensembles from two
tarballs, or two copies of one tarball under two keys, each resolve their own members
(tests/test_text_ensemble.py loads two side by side and checks each answers with its own model).

Only the python backend and the model's own backend are needed: the tokenizer imports numpy (the
image's) and the tarball's own ``tokenizers``, a ``cp310-abi3`` wheel that loads on the Python of
every image version the stack accepts, so the tarball is the same for every image version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from triton_mme_cdk.model_build.artifact.pack import onnx_external_data_files, write_tarball
from triton_mme_cdk.model_build.artifact.render import render_config
from triton_mme_cdk.model_build.artifact.triton_config import check_config, default_filename
from triton_mme_cdk.model_build.compare import SERVED_PRECISION_KEY
from triton_mme_cdk.model_build.errors import PackageError
from triton_mme_cdk.model_build.manifest import PAIR_TASKS, TEXT_TASKS, ModelSpec
from triton_mme_cdk.model_build.text_ensemble import tokenizer_model
from triton_mme_cdk.model_build.text_ensemble.served_tokenizer import ServedTokenizer
from triton_mme_cdk.model_build.text_ensemble.serving_wheel import vendored_files
from triton_mme_cdk.model_build.text_ensemble.tokenizer_model import (
    KNOWN_OUTPUTS,
    PAIR_INPUT,
    TEXT_INPUT,
    TOKENIZER_FILE,
    TRUNCATION_MODES,
    VENDOR_DIR,
)
from triton_mme_cdk.model_build.types import ExportedModel

ENSEMBLE = "ensemble"
TOKENIZER = "tokenizer"
MODEL = "model"
#: Tasks whose outputs the ensemble returns with the tokenizer's attention mask (token-level
#: outputs need it to tell padding from text; pooled ones do not).
MASK_TASKS = frozenset({"feature-extraction"})


@dataclass(frozen=True)
class EnsembleConfigs:
    """The three ``config.pbtxt`` texts, by folder name."""

    ensemble: str
    tokenizer: str
    model: str

    def by_folder(self) -> dict[str, str]:
        return {ENSEMBLE: self.ensemble, TOKENIZER: self.tokenizer, MODEL: self.model}


def served_precision(spec: ModelSpec) -> str:
    """The precision the target's answers are computed at: the graph's, or a TensorRT engine's
    lower one (``tensorrt.precision_mode`` FP16/BF16 -> fp16, INT8 -> int8)."""
    mode = spec.tensorrt.precision_mode if spec.tensorrt is not None else None
    if mode == "INT8":
        return "int8"
    if mode in ("FP16", "BF16") and spec.effective_precision == "fp32":
        return "fp16"
    return spec.effective_precision


def _dims(tensor_shape: tuple[int, ...]) -> list[int]:
    return list(tensor_shape[1:])  # the batch dimension is max_batch_size's


def render_ensemble_configs(spec: ModelSpec, exported: ExportedModel, tokenizer: ServedTokenizer, *,
                            truncation: str | None = None) -> EnsembleConfigs:
    """The ensemble, tokenizer and model configs for ``spec`` and its exported model.

    The model config is :func:`render_config`'s, renamed to its folder; the ensemble's outputs are
    the model's (plus ``attention_mask`` for token-level tasks), its input ``TEXT`` (and, for tasks
    that score pairs, the optional ``TEXT_PAIR``: a request without it scores single texts). The
    tokenizer's parameters are ``tokenizer``'s (pad token, sides, lower-casing) and the entry's
    (``max_sequence_length``; ``truncation``, which defaults to the manifest's ``text.truncation``).
    """
    truncation = spec.text_inputs.truncation if truncation is None else truncation
    if spec.task not in TEXT_TASKS:
        raise PackageError(f"inputs: text: task {spec.task!r} takes no text; allowed for: "
                           + ", ".join(sorted(TEXT_TASKS)), model=spec.name)
    if truncation not in TRUNCATION_MODES:
        raise PackageError(f"truncation: got {truncation!r}; allowed: " + ", ".join(TRUNCATION_MODES), model=spec.name)
    if spec.max_batch_size < 1:
        raise PackageError(f"max_batch_size: got {spec.max_batch_size}; a raw-text ensemble needs batching "
                           "(at least 1)", model=spec.name)
    model_inputs = [tensor.name for tensor in exported.inputs]
    unknown = [name for name in model_inputs if name not in KNOWN_OUTPUTS]
    if unknown:
        raise PackageError(f"inputs: text: the exported model takes {unknown}; the tokenizer produces "
                           + ", ".join(KNOWN_OUTPUTS), model=spec.name)
    max_len = spec.text_inputs.max_sequence_length
    # ``bucket``/``longest`` padding: each request's own width (at most max_len); ``max_length``: always max_len.
    width = max_len if spec.text_padding == "max_length" else -1

    model_config = mc.ModelConfig()
    text_format.Parse(render_config(spec, exported), model_config)
    model_config.name = MODEL

    member = mc.ModelConfig(name=TOKENIZER, backend="python", max_batch_size=spec.max_batch_size)
    member.input.add(name=TEXT_INPUT, data_type=mc.TYPE_STRING, dims=[1])
    pairs = spec.task in PAIR_TASKS
    if pairs:
        member.input.add(name=PAIR_INPUT, data_type=mc.TYPE_STRING, dims=[1], optional=True)
    for name in model_inputs:
        member.output.add(name=name, data_type=mc.TYPE_INT64, dims=[width])
    if "attention_mask" not in model_inputs and spec.task in MASK_TASKS:
        member.output.add(name="attention_mask", data_type=mc.TYPE_INT64, dims=[width])
    member.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    member.parameters["max_sequence_length"].string_value = str(max_len)
    member.parameters["truncation"].string_value = truncation
    member.parameters["padding"].string_value = spec.text_padding
    member.parameters["max_text_bytes"].string_value = str(spec.text_inputs.max_text_bytes)
    for key, value in sorted(tokenizer.parameters.items()):
        member.parameters[key].string_value = value

    ensemble = mc.ModelConfig(name=ENSEMBLE, platform="ensemble", max_batch_size=spec.max_batch_size)
    # What smoke and verify compare the answers with: the tolerance rule of the precision served.
    ensemble.parameters[SERVED_PRECISION_KEY].string_value = served_precision(spec)
    ensemble.input.add(name=TEXT_INPUT, data_type=mc.TYPE_STRING, dims=[1])
    if pairs:
        ensemble.input.add(name=PAIR_INPUT, data_type=mc.TYPE_STRING, dims=[1], optional=True)
    outputs = {out.name: out for out in model_config.output}
    for out in model_config.output:
        ensemble.output.add(name=out.name, data_type=out.data_type, dims=list(out.dims))
    if spec.task in MASK_TASKS and "attention_mask" not in outputs:
        ensemble.output.add(name="attention_mask", data_type=mc.TYPE_INT64, dims=[width])
    step = ensemble.ensemble_scheduling.step.add(model_name=TOKENIZER, model_version=-1)
    step.input_map[TEXT_INPUT] = TEXT_INPUT
    if pairs:
        step.input_map[PAIR_INPUT] = PAIR_INPUT
    for out in member.output:
        step.output_map[out.name] = out.name
    step = ensemble.ensemble_scheduling.step.add(model_name=MODEL, model_version=-1)
    for name in model_inputs:
        step.input_map[name] = name
    for name in outputs:
        step.output_map[name] = name

    return EnsembleConfigs(
        ensemble=text_format.MessageToString(ensemble),
        tokenizer=text_format.MessageToString(member),
        model=text_format.MessageToString(model_config),
    )


def package_text_ensemble(
    *,
    spec: ModelSpec,
    exported: ExportedModel,
    tokenizer: ServedTokenizer,
    out_path: Path,
    truncation: str | None = None,
    compresslevel: int = 1,
) -> tuple[str, int]:
    """Write the ensemble tarball (layout in the module docstring); ``(sha256, size)``.

    Reproducible like :func:`model_build.artifact.pack.package_model`: same inputs, same bytes.
    """
    configs = render_ensemble_configs(spec, exported, tokenizer, truncation=truncation)
    model_config = check_config(configs.model, model=spec.name)
    filename = default_filename(model_config)
    files: dict[str, Path | bytes] = {
        f"{folder}/config.pbtxt": text.encode("utf-8") for folder, text in configs.by_folder().items()
    }
    files[f"{TOKENIZER}/1/model.py"] = Path(tokenizer_model.__file__)
    files[f"{TOKENIZER}/1/{TOKENIZER_FILE}"] = tokenizer.tokenizer_json.encode("utf-8")
    for name, data in vendored_files(spec.name).items():
        files[f"{TOKENIZER}/1/{VENDOR_DIR}/{name}"] = data
    files[f"{MODEL}/1/{filename}"] = exported.path
    if exported.format == "onnx":
        for location in onnx_external_data_files(exported.path):
            files[f"{MODEL}/1/{location}"] = exported.path.parent / location
    return write_tarball(files, Path(out_path), compresslevel=compresslevel, empty_dirs=(f"{ENSEMBLE}/1",))
