"""The schema of a manifest: a model entry (:class:`ModelSpec`: its name, source, task, format,
precision, batching and inputs, and every rule between them) and the manifest itself
(:class:`Manifest`: unique targets, a bounded count, a stable content hash).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Literal

from pydantic import Field, model_validator

from triton_mme_cdk.model_build.manifest.engines import TensorRTPlan
from triton_mme_cdk.model_build.manifest.fields import (
    DEFAULT_GATES,
    AccuracyGate,
    BuildPlacement,
    DynamicBatching,
    ImageInputs,
    InstanceGroup,
    OnnxFileSource,
    OnnxRuntimeTuning,
    Precision,
    Source,
    StrictModel,
    SyntheticSource,
    TensorRTAccelerator,
    TextInputs,
    Tolerance,
)

#: A model name becomes the Triton model directory and, with ``copies``, the stem of each
#: ``TargetModel`` (``<name>-<i>.tar.gz``). Lowercase letters, digits, ``-`` and ``_`` are safe
#: in S3 keys, in Triton model names and in CloudWatch/SageMaker headers alike.
MODEL_NAME_PATTERN = r"^[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?$"
MODEL_NAME_MAX = 64
#: The largest number of TargetModels one manifest may publish (the index and the custom
#: resource response stay small whatever the count; this bounds the build time).
MAX_TARGETS = 10_000


# --------------------------------------------------------------------------------------------
# Models and the manifest
# --------------------------------------------------------------------------------------------

Task = Literal["sentence-embedding", "feature-extraction", "text-classification", "image-classification"]
TEXT_TASKS: frozenset[str] = frozenset({"sentence-embedding", "feature-extraction", "text-classification"})
#: Tasks whose model scores a text or a pair of texts (cross-encoders, rerankers): the graph takes
#: ``token_type_ids`` where the source's tokenizer gives them, and a raw-text target takes pairs.
PAIR_TASKS: frozenset[str] = frozenset({"text-classification"})


class ModelSpec(StrictModel):
    name: str = Field(pattern=MODEL_NAME_PATTERN, max_length=MODEL_NAME_MAX)
    source: Source
    #: What the exported graph computes. ``sentence-embedding`` puts the pooling (and the L2
    #: normalisation) inside the graph, so its single output is the sentence embedding;
    #: ``text-classification`` is a sequence-classification head (a cross-encoder or reranker
    #: scoring a text or a pair of texts): its output is the raw ``logits`` ``[batch, num_labels]``.
    task: Task
    #: ``onnx`` for Triton's ``onnxruntime`` backend, ``torchscript`` for ``pytorch_libtorch``,
    #: ``tensorrt_plan`` for prebuilt TensorRT engines (``tensorrt`` backend; see ``tensorrt_plan``).
    format: Literal["onnx", "torchscript", "tensorrt_plan"] = "onnx"
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
    #: BiasGelu). ``None``: on where verified (BERT, RoBERTa and XLM-R text models exported to ONNX).
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
    #: ``format: tensorrt_plan`` only: the TensorRT version, one plan per compute capability and
    #: the declared signature (a plan cannot be read on CPU).
    tensorrt_plan: TensorRTPlan | None = None
    #: Where this model builds (the build Lambda or a SageMaker Processing job); ``None``: the
    #: stack's settings. Not part of the model key: the engine never changes the bytes.
    build: BuildPlacement | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        # Each check names the field a user has to change.
        self._check_tensorrt_plan()
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
        if self.text is not None and self.text.group_by_length and self.length_grouping_refusal() is not None:
            raise ValueError(f"text.group_by_length: got true, but {self.length_grouping_refusal()}; "
                             "leave it unset or set it false")
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

    def _check_tensorrt_plan(self) -> None:
        """A prebuilt plan is neither exported nor run at build time: the fields that steer an
        export, a validation or a CPU instance cannot apply, and saying so beats ignoring them."""
        if self.format != "tensorrt_plan":
            if self.tensorrt_plan is not None:
                raise ValueError(f"tensorrt_plan: given for format {self.format!r}; it applies to format "
                                 "'tensorrt_plan' only: remove it, or set format: tensorrt_plan")
            return
        if self.tensorrt_plan is None:
            raise ValueError("tensorrt_plan: missing for format 'tensorrt_plan'; add the block with "
                             "tensorrt_version, cc_model_filenames, input and output (a plan cannot be read on CPU, "
                             "so its signature is declared)")
        if self.source.kind not in ("local", "s3"):
            raise ValueError(f"source.kind: got {self.source.kind!r} with format 'tensorrt_plan'; prebuilt plans come "
                             "from a 'local' folder (path) or an 's3' prefix (uri)")
        if self.instance_group.kind != "KIND_GPU":
            raise ValueError(f"instance_group.kind: got {self.instance_group.kind!r}; a TensorRT plan runs on the GPU "
                             "only: use KIND_GPU")
        if self.inputs == "text":
            raise ValueError("inputs: got 'text' with format 'tensorrt_plan'; a plan takes the tensors its "
                             "tensorrt_plan.input declares: use inputs: tokens (the default)")
        for field, why in (("fp16", "its precision was fixed when the plan was built"),
                           ("precision", "its precision was fixed when the plan was built"),
                           ("optimize", "its graph was optimized when the plan was built"),
                           ("onnxruntime", "it tunes the onnxruntime backend"),
                           ("tensorrt", "it tunes ONNX Runtime's TensorRT provider, not a prebuilt plan"),
                           ("accuracy", "a plan is not run at build time, so there is nothing to gate"),
                           ("tolerance", "a plan is not run at build time, so there is nothing to compare"),
                           ("text", "a plan's inputs are declared in tensorrt_plan.input"),
                           ("image", "a plan's inputs are declared in tensorrt_plan.input")):
            if field in self.model_fields_set:
                raise ValueError(f"{field}: given for format 'tensorrt_plan'; {why}: remove it")

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

    def length_grouping_refusal(self) -> str | None:
        """Why this entry cannot group a batch by length (``text.group_by_length``), or ``None``."""
        if self.format != "onnx":
            return f"format is {self.format!r}; length grouping rewrites ONNX graphs only"
        if self.task not in TEXT_TASKS:
            return f"task {self.task!r} has no text inputs"
        if self.task == "feature-extraction":
            return ("task 'feature-extraction' returns one vector per token; length grouping needs pooled "
                    "outputs (sentence-embedding, text-classification)")
        if self.instance_group.kind != "KIND_CPU":
            return (f"instance_group.kind is {self.instance_group.kind}; length grouping is measured and "
                    "verified on KIND_CPU only (on a GPU one launch of the whole batch is the cheaper path)")
        if self.max_batch_size < 2:
            return f"max_batch_size is {self.max_batch_size}; a batch of one row has nothing to group"
        return None

    @property
    def groups_by_length(self) -> bool:
        """``text.group_by_length`` as given; unset: on where :meth:`length_grouping_refusal` allows."""
        given = self.text_inputs.group_by_length
        return given if given is not None else self.length_grouping_refusal() is None

    @property
    def image_inputs(self) -> ImageInputs:
        return self.image or ImageInputs()

    def target_names(self) -> list[str]:
        """Triton model names this entry publishes (the ``TargetModel`` without ``.tar.gz``)."""
        if self.copies == 1:
            return [self.name]
        return [f"{self.name}-{i}" for i in range(self.copies)]


class Manifest(StrictModel):
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
        self.source_owners()
        return self

    def source_owners(self) -> dict[str, str | None]:
        """The account each S3 source bucket must belong to (``source.owner``), by bucket, sorted;
        ``None`` where no source of that bucket names one (the stack's own account then). Two
        sources of one bucket that name different owners raise ``ValueError`` naming both."""
        owners: dict[str, tuple[str, str]] = {}
        buckets: set[str] = set()
        for spec in self.models:
            source = spec.source
            uri = str(getattr(source, "uri", None) or getattr(source, "path", None) or "")
            if source.kind not in ("s3", "onnx") or not uri.startswith("s3://"):
                continue
            bucket = uri[len("s3://"):].partition("/")[0]
            buckets.add(bucket)
            given = getattr(source, "owner", None)
            if given is None:
                continue
            earlier = owners.setdefault(bucket, (given, spec.name))
            if earlier[0] != given:
                raise ValueError(f"models({spec.name}).source.owner: got {given!r} for bucket {bucket!r}, "
                                 f"which {earlier[1]!r} gives to {earlier[0]!r}; a bucket has one owner")
        return {bucket: owners[bucket][0] if bucket in owners else None for bucket in sorted(buckets)}

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
