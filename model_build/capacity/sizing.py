"""Footprints before a build: a manifest entry's weights sized from its source, at synth.

Where the source can be sized without building it: the weight files of a local folder, an ONNX
file or an installed package (:func:`~model_build.manifest.build_engine.source_weight_bytes`); a
synthetic model's parameter count, computed from its config as transformers builds it
(:func:`synthetic_parameters`); a hub model's index or weight files in the local Hugging Face cache
(:func:`hub_weight_bytes`). Anything else (an S3 source, a hub model not in the cache) is unknown,
and the fit check warns instead of checking.

The weights are scaled to the served precision (an estimate), the working memory is left unknown
(the build measures it), so a synth footprint's GPU memory is a lower bound: a model refused on
it is refused for certain. Standard library and the manifest only: the CDK app imports it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.capacity.footprint import (
    Coefficients,
    Figure,
    Footprint,
    footprint_from_parts,
    served_weight_bytes,
    unknown,
)
from triton_mme_cdk.model_build.manifest import HuggingFaceSource, ModelSpec, SyntheticSource
from triton_mme_cdk.model_build.manifest.build_engine import source_weight_bytes, weight_bytes_of

#: Defaults of transformers' ``BertConfig`` and ``ResNetConfig`` (and ``PretrainedConfig.num_labels``),
#: for a synthetic config that leaves a key out; tests compare the count with the real model's.
BERT_DEFAULTS: dict[str, Any] = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
                                 "intermediate_size": 3072, "max_position_embeddings": 512,
                                 "type_vocab_size": 2, "num_labels": 2}
RESNET_DEFAULTS: dict[str, Any] = {"num_channels": 3, "embedding_size": 64, "hidden_sizes": [256, 512, 1024, 2048],
                                   "depths": [3, 4, 6, 3], "layer_type": "bottleneck", "num_labels": 2}


def bert_parameters(config: Mapping[str, Any], task: str) -> int:
    """Parameters of a BERT of ``config`` as the build exports it: embeddings, encoder, pooler, and
    a classifier head for ``text-classification``."""
    c = {**BERT_DEFAULTS, **config}
    h, i = int(c["hidden_size"]), int(c["intermediate_size"])
    embeddings = (int(c["vocab_size"]) + int(c["max_position_embeddings"]) + int(c["type_vocab_size"])) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    pooler = h * h + h
    head = h * int(c["num_labels"]) + int(c["num_labels"]) if task == "text-classification" else 0
    return embeddings + int(c["num_hidden_layers"]) * layer + pooler + head


def resnet_parameters(config: Mapping[str, Any]) -> int:
    """Weights of a transformers ResNet of ``config`` with its classifier, batch norms counted with
    their running statistics (4 numbers per channel), as its state dict holds them."""
    c = {**RESNET_DEFAULTS, **config}

    def conv(cin: int, cout: int, k: int) -> int:
        return cin * cout * k * k + 4 * cout  # no bias; the batch norm after it

    total = conv(int(c["num_channels"]), int(c["embedding_size"]), 7)
    cin = int(c["embedding_size"])
    for stage, (cout, depth) in enumerate(zip(c["hidden_sizes"], c["depths"], strict=False)):
        cout = int(cout)
        for index in range(int(depth)):
            first = cin if index == 0 else cout
            stride = 2 if index == 0 and (stage > 0 or c.get("downsample_in_first_stage", False)) else 1
            if first != cout or stride != 1:
                total += conv(first, cout, 1)
            if c["layer_type"] == "basic":
                total += conv(first, cout, 3) + conv(cout, cout, 3)
            else:
                reduced = cout // 4
                total += conv(first, reduced, 1) + conv(reduced, reduced, 3) + conv(reduced, cout, 1)
        cin = cout
    labels = int(c["num_labels"])
    return total + cin * labels + labels


def synthetic_parameters(source: SyntheticSource, task: str) -> int:
    """The parameter count of a synthetic model, from its config alone."""
    if source.architecture == "bert":
        return bert_parameters(source.config, task)
    return resnet_parameters(source.config)


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache, as huggingface_hub finds it (``HF_HUB_CACHE``, ``HF_HOME``/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface")
    return Path(home) / "hub"


def hub_weight_bytes(source: HuggingFaceSource, cache: Path | None = None) -> tuple[int | None, str]:
    """A hub model's weight bytes from the local cache at its pinned revision: the safetensors
    index's ``metadata.total_size``, else its weight files; ``(None, why)`` when it is not cached."""
    folder = (cache or hub_cache_dir()) / f"models--{source.model_id.replace('/', '--')}" / "snapshots" / source.revision
    if not folder.is_dir():
        return None, f"hub model {source.model_id}@{source.revision[:12]} is not in the local cache ({folder.parent})"
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text())["metadata"]["total_size"]
            if isinstance(total, int) and total > 0:
                return total, f"hub index {index.name} in the local cache (metadata.total_size)"
        except (OSError, ValueError, KeyError, TypeError):
            pass
    sizes = [(item.name, item.stat().st_size) for item in folder.iterdir() if item.is_file()]
    found = weight_bytes_of(sizes)
    if found:
        return found, "the hub model's weight files in the local cache"
    return None, f"no weight files in the local cache's {folder}"


def source_weights(spec: ModelSpec, base_dir: Path) -> Figure:
    """The source's weight bytes (as stored, FP32 unless the files say otherwise), or unknown with why."""
    source = spec.source
    if isinstance(source, SyntheticSource):
        try:
            count = synthetic_parameters(source, spec.task)
        except (TypeError, ValueError, KeyError, AttributeError) as error:  # the build reports the config
            return unknown(f"the synthetic config could not be counted ({type(error).__name__}: {error})")
        return Figure(count * 4.0, f"{count:,} parameters of the synthetic {source.architecture} config x 4 bytes "
                                   "(FP32, as built)", True)
    if isinstance(source, HuggingFaceSource):
        size, why = hub_weight_bytes(source)
        return Figure(float(size), why, False) if size is not None else unknown(why)
    size, missing = source_weight_bytes(spec, base_dir)
    if size is None:
        return unknown(missing or "not sized")
    return Figure(float(size), "the source's weight files", False)


def python_instances(spec: ModelSpec) -> int:
    """Python-backend instances a target of ``spec`` loads: the tokenizer step of a raw-text model
    (one ``KIND_CPU`` instance: model_build/text_ensemble/ensemble.py)."""
    return 1 if spec.inputs == "text" else 0


def largest_shape(spec: ModelSpec) -> tuple[int, int]:
    """(largest batch, largest sequence) a target of ``spec`` runs at: ``max_batch_size`` (1 when it
    is 0) and the text's ``max_sequence_length`` (0 for images)."""
    batch = max(1, spec.max_batch_size)
    sequence = spec.text_inputs.max_sequence_length if spec.task != "image-classification" else 0
    return batch, sequence


def synth_footprints(specs: Sequence[ModelSpec], base_dir: Path, coefficients: Coefficients | None = None, *,
                     shm_default_byte_size: int | None = None) -> list[Footprint]:
    """One footprint per target of ``specs``, from the sources (see the module docstring)."""
    coefficients = coefficients or Coefficients()
    out: list[Footprint] = []
    for spec in specs:
        source = source_weights(spec, base_dir)
        weights = source if not source.known else served_weight_bytes(
            int(source.value or 0), "fp32", spec.effective_precision)
        if source.known:
            weights = Figure(weights.value, f"{weights.source}; {source.source}", True)
        batch, sequence = largest_shape(spec)
        # Float weights barely compress: the tarball and its unpacked files are each about the weights.
        disk = unknown(f"known once built; {weights.source}") if not weights.known else Figure(
            weights.value, "estimate before the build: about the weights (float weights barely compress)", True)
        for target in spec.target_names():
            out.append(footprint_from_parts(
                target=target, model=spec.name, stage="synth", precision=spec.effective_precision,
                instance_kind=spec.instance_group.kind, instance_count=spec.instance_group.count,
                python_instances=python_instances(spec), weight_bytes=weights,
                working_bytes=unknown("measured at build (an ONNX Runtime CPU session at the largest batch "
                                      "and sequence)"),
                tarball_bytes=disk, unpacked_bytes=disk,
                build_load_seconds=unknown("measured at build"), coefficients=coefficients,
                largest_batch=batch, largest_sequence=sequence, backend=_backend(spec), shm_default_byte_size=shm_default_byte_size))
    return out


def _backend(spec: ModelSpec) -> str:
    return {"onnx": "onnxruntime", "torchscript": "pytorch", "tensorrt_plan": "tensorrt"}[spec.format]
